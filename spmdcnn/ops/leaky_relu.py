"""Leaky rectified linear unit, as ``torch.nn.functional.leaky_relu``: ``y = x`` where ``x > 0``, else
``negative_slope * x``; ``gx = gy`` where ``x > 0``, else ``negative_slope * gy`` (PyTorch's gradient at 0 is the
slope's). Forward keeps the one-byte mask ``x > 0``.

On the host, ``y = max(x, slope * x)`` for a slope up to 1 (``min`` above it: either picks ``x`` for ``x > 0`` and
``slope * x`` otherwise; ``x`` times the mask for a slope of 0), each direction one pass over cache-sized chunks
split between threads."""

from .. import backend
from .cuda import kernels as cuda
from .relu import masked, with_mask


def leaky_relu_forward(x, negative_slope=0.01, inplace=False):
    """``inplace=True`` writes ``y`` over ``x`` (the caller guarantees nothing else reads ``x``)."""
    if backend.on_device(x):
        return cuda.leaky_relu_forward(x, negative_slope, inplace)
    xp = backend.array_module(x)
    slope = x.dtype.type(negative_slope)
    pick = xp.maximum if negative_slope <= 1 else xp.minimum

    def sloped(chunk, positive, out):
        pick(chunk, chunk * slope, out=out)

    def flat(chunk, positive, out):     # x times the mask: +inf stays inf (max(inf, 0 * inf) would be NaN)
        with xp.errstate(invalid="ignore"):             # -inf * 0 is NaN, as PyTorch's, without a warning
            xp.multiply(chunk, positive, out=out)
    return with_mask(x, inplace, sloped if slope else flat)


def leaky_relu_backward(gy, positive, negative_slope=0.01):
    if backend.on_device(gy):
        return cuda.leaky_relu_backward(gy, positive, negative_slope)
    return masked(gy, positive, negative_slope)
