"""Leaky rectified linear unit, as ``torch.nn.functional.leaky_relu``: ``y = x`` where ``x > 0``, else
``negative_slope * x``; ``gx = gy`` where ``x > 0``, else ``negative_slope * gy`` (PyTorch's gradient at 0 is the
slope's). Forward keeps the one-byte mask ``x > 0``.

On the host, ``y = max(x, slope * x)`` for a slope up to 1 (``min`` above it: either picks ``x`` for ``x > 0`` and
``slope * x`` otherwise; ``x`` times the mask for a slope of 0), each direction one pass over cache-sized chunks
split between threads."""

from .. import backend
from .cuda import kernels as cuda
from .parallel import over_chunks
from .relu import masked


def leaky_relu_forward(x, negative_slope=0.01, inplace=False):
    """``inplace=True`` writes ``y`` over ``x`` (the caller guarantees nothing else reads ``x``)."""
    if backend.on_device(x):
        return cuda.leaky_relu_forward(x, negative_slope, inplace)
    xp = backend.array_module(x)
    x = xp.ascontiguousarray(x)
    y = x if inplace else xp.empty_like(x)
    positive = xp.empty(x.shape, dtype=bool)
    xs, ys, ps = x.reshape(-1), y.reshape(-1), positive.reshape(-1)
    slope = x.dtype.type(negative_slope)
    pick = xp.maximum if negative_slope <= 1 else xp.minimum

    def run(part):
        chunk = xs[part]
        xp.greater(chunk, 0, out=ps[part])
        if slope:
            pick(chunk, chunk * slope, out=ys[part])
        else:           # x times the mask: +inf stays inf (max(inf, 0 * inf) would be NaN); -inf * 0 is NaN
            with xp.errstate(invalid="ignore"):         # as PyTorch's, without a warning
                xp.multiply(chunk, ps[part], out=ys[part])
    over_chunks(run, x.size)
    return y, positive


def leaky_relu_backward(gy, positive, negative_slope=0.01):
    if backend.on_device(gy):
        return cuda.leaky_relu_backward(gy, positive, negative_slope)
    return masked(gy, positive, negative_slope)
