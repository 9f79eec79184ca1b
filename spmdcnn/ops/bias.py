"""A learned shift per channel, or one shared by every channel (HGNetV2's ``LearnableAffineBlock``, ``x + bias``
with a bias of one element): ``y = x + bias[c]``, ``gx = gy``, ``gbias[c] = sum over samples and positions of gy``
(over every channel for a shared one). It keeps nothing; written once for every array module (NumPy and CuPy
alike) and every spatial rank."""

from .. import backend


def _per_channel(bias, x):
    return bias.astype(x.dtype, copy=False).reshape((1, -1) + (1,) * (x.ndim - 2))


def bias_forward(x, bias):
    """``(y, None)``."""
    return x + _per_channel(bias, x), None


def bias_backward(gy, saved, bias):
    """``(gx, gbias)``, ``gbias`` in float64 sums (float32 for float32 and narrower) cast to the bias's type."""
    xp = backend.array_module(gy)
    over = (0,) + tuple(range(2, gy.ndim)) if bias.size > 1 else None
    gbias = gy.sum(axis=over, dtype=xp.float64 if gy.dtype == xp.float64 else xp.float32)
    return gy, xp.reshape(gbias, bias.shape).astype(bias.dtype, copy=False)
