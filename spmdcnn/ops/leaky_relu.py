"""Leaky rectified linear unit, as ``torch.nn.functional.leaky_relu``: ``y = x`` where ``x > 0``, else
``negative_slope * x``; ``gx = gy`` where ``x > 0``, else ``negative_slope * gy`` (PyTorch's gradient at 0 is the
slope's). Forward keeps the one-byte mask ``x > 0``."""

from .. import backend
from .cuda import kernels as cuda


def leaky_relu_forward(x, negative_slope=0.01, inplace=False):
    """``inplace=True`` writes ``y`` over ``x`` (the caller guarantees nothing else reads ``x``)."""
    if backend.on_device(x):
        return cuda.leaky_relu_forward(x, negative_slope, inplace)
    xp = backend.array_module(x)
    positive = x > 0
    y = x if inplace else x.copy()
    xp.multiply(y, x.dtype.type(negative_slope), out=y, where=~positive)
    return y, positive


def leaky_relu_backward(gy, positive, negative_slope=0.01):
    if backend.on_device(gy):
        return cuda.leaky_relu_backward(gy, positive, negative_slope)
    xp = backend.array_module(gy)
    gx = gy.copy()
    xp.multiply(gx, gy.dtype.type(negative_slope), out=gx, where=~positive)
    return gx
