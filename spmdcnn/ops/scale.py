"""Multiplication by a constant ``factor`` (CosmoFlow's output scaling) and addition of a constant ``shift``:
``y = factor * x + shift``, ``gx = factor * gy``. Forward keeps nothing."""

from .. import backend
from .cuda import kernels as cuda


def scale_forward(x, factor, shift=0.0, inplace=False):
    """``inplace=True`` writes ``y`` over ``x`` (the caller guarantees nothing else reads ``x``)."""
    if backend.on_device(x):
        y = cuda.scale(x, factor, inplace)
    else:
        y = backend.array_module(x).multiply(x, x.dtype.type(factor), out=x if inplace else None)
    if shift:
        y += y.dtype.type(shift)
    return y, None


def scale_backward(gy, saved, factor, shift=0.0):
    """``factor * gy`` (``saved``: forward's None, as every op's backward takes it)."""
    if backend.on_device(gy):
        return cuda.scale(gy, factor, False)
    return gy * gy.dtype.type(factor)
