"""Element-wise sum of inputs of the same shape; each input receives the whole output gradient."""

from .. import backend
from .cuda import kernels as cuda


def add_forward(xs, inplace=None):
    """``inplace=i`` accumulates into ``xs[i]`` (the caller guarantees nothing else reads it)."""
    device = backend.on_device(xs[0])
    if inplace is None:
        y = cuda.add(xs[0], xs[1]) if device else xs[0] + xs[1]
        rest = xs[2:]
    else:
        y = xs[inplace]
        rest = xs[:inplace] + xs[inplace + 1:]
    for x in rest:
        if device:
            cuda.add_into(y, x)
        else:
            y += x
    return y, len(xs)


def add_backward(gy, count):
    return [gy] * count
