"""Hyperbolic tangent, as ``torch.tanh``: ``y = tanh(x)``, ``gx = gy * (1 - y^2)``.

Forward keeps its output (the op table's ``keeps``: no later layer may write over it, ``runtime.executor``)."""

from .. import backend
from .cuda import kernels as cuda


def tanh_forward(x, inplace=False):
    """``inplace=True`` writes ``y`` over ``x`` (the caller guarantees nothing else reads ``x``)."""
    if backend.on_device(x):
        return cuda.tanh_forward(x, inplace)
    xp = backend.array_module(x)
    y = xp.tanh(x, out=x if inplace else None)
    return y, y


def tanh_backward(gy, y):
    if backend.on_device(gy):
        return cuda.tanh_backward(gy, y)
    gx = y * y
    xp = backend.array_module(gy)
    xp.subtract(1, gx, out=gx)
    gx *= gy
    return gx
