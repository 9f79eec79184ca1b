"""Multiplication by a constant ``factor`` (CosmoFlow's output scaling): ``y = factor * x``, ``gx = factor * gy``.
Forward keeps nothing."""

from .. import backend
from .cuda import kernels as cuda


def scale_forward(x, factor, inplace=False):
    """``inplace=True`` writes ``y`` over ``x`` (the caller guarantees nothing else reads ``x``)."""
    if backend.on_device(x):
        return cuda.scale(x, factor, inplace), None
    xp = backend.array_module(x)
    return xp.multiply(x, x.dtype.type(factor), out=x if inplace else None), None


def scale_backward(gy, saved, factor):
    """``factor * gy`` (``saved``: forward's None, as every op's backward takes it)."""
    if backend.on_device(gy):
        return cuda.scale(gy, factor, False)
    return gy * gy.dtype.type(factor)
