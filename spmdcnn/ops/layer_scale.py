"""A learned factor per channel, ConvNeXt's layer scale (torchvision's ``CNBlock.layer_scale``, a (C, 1, 1)
parameter): ``y = gamma[c] * x``, ``gx = gamma[c] * gy``, ``ggamma[c] = sum over samples and positions of
gy * x``. Forward keeps its input; a tile holds its channels' factors, whose gradients are summed over the tiles
that hold the same channels like any parameter's."""

from .. import backend


def _per_channel(gamma, x):
    return gamma.astype(x.dtype, copy=False).reshape((1, -1) + (1,) * (x.ndim - 2))


def layer_scale_forward(x, gamma):
    """``(y, x)``."""
    return x * _per_channel(gamma, x), x


def layer_scale_backward(gy, x, gamma):
    """``(gx, ggamma)``, ``ggamma`` in float64 sums cast to the factor's type."""
    xp = backend.array_module(gy)
    over = (0,) + tuple(range(2, gy.ndim))
    ggamma = (gy * x).sum(axis=over, dtype=xp.float64 if gy.dtype == xp.float64 else xp.float32)
    return gy * _per_channel(gamma, gy), ggamma.astype(gamma.dtype, copy=False)
