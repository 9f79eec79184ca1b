"""Rectified linear unit: ``y = max(x, 0)``; ``gx = gy * (x > 0)``."""

from .. import backend
from .cuda import kernels as cuda


def relu_forward(x, inplace=False):
    """``inplace=True`` writes ``y`` over ``x`` (the caller guarantees nothing else reads ``x``)."""
    if backend.on_device(x):
        return cuda.relu_forward(x, inplace)
    xp = backend.array_module(x)
    y = xp.maximum(x, 0, out=x if inplace else None)
    return y, y > 0


def relu_backward(gy, positive):
    if backend.on_device(gy):
        return cuda.relu_backward(gy, positive)
    return gy * positive
