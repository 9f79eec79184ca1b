"""A learned factor per channel, ConvNeXt's layer scale (torchvision's ``CNBlock.layer_scale``, a (C, 1, 1)
parameter), or one shared by every channel (HGNetV2's ``LearnableAffineBlock``): ``y = gamma[c] * x``,
``gx = gamma[c] * gy``, ``ggamma[c] = sum over samples and positions of gy * x`` (over every channel for a shared
one). Forward keeps its input; a tile holds its channels' factors, whose gradients are summed over the tiles
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
    over = (0,) + tuple(range(2, gy.ndim)) if gamma.size > 1 else None
    ggamma = (gy * x).sum(axis=over, dtype=xp.float64 if gy.dtype == xp.float64 else xp.float32)
    return gy * _per_channel(gamma, gy), xp.reshape(ggamma, gamma.shape).astype(gamma.dtype, copy=False)
