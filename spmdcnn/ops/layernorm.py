"""Layer normalisation over the channels at each position, ConvNeXt's ``LayerNorm2d`` (PyTorch's ``F.layer_norm``
over the channel axis moved last), on features (N, F) or any spatial rank, forward and backward (and timm's
``SimpleNorm``, which scales ``x`` by the same statistics without centring it and divides the variance by C - 1:
``ops/normalization.py``):

    mean = sum_c(x) / C,  var = sum_c((x - mean)^2) / C,  xhat = (x - mean) / sqrt(var + eps),  y = gamma * xhat + beta
    gx = (gxhat - mean_c(gxhat) - xhat * mean_c(gxhat * xhat)) / sqrt(var + eps),   gxhat = gy * gamma

per sample and position (``C`` the channels of the whole tensor; ``gamma``, ``beta`` per channel, when affine). A
tile holding some of the channels sums its part of each position's sums and ``reduce`` adds them over the tiles
of the same samples and positions (``tiling/statistics.py``): two sums forward, one backward, as group norm's
(``ops/groupnorm.py``; the arithmetic ``ops/normalization.py``'s). ``ggamma`` and ``gbeta`` are over the tile's own
box.
"""

from .. import backend
from .normalization import normalise_backward, normalise_forward


def _channel_sum(a, reduce, axis=1):
    """``a`` summed over the channels (float64, kept), and over the tiles sharing its positions."""
    xp = backend.array_module(a)
    sums = xp.ascontiguousarray(a.sum(axis=axis, keepdims=True, dtype=xp.float64))
    return sums if reduce is None else reduce(sums)


def layernorm_forward(x, gamma, beta, count, eps=1e-5, reduce=None, center=True, correction=0):
    """``y, saved`` of the tile ``x`` (N, C_tile, S...), ``count`` the channels of the whole tensor, ``reduce``
    the sum over the tiles of the same samples and positions (None: ``x`` holds every channel); ``center`` false
    and ``correction`` 1: timm's ``SimpleNorm`` (``ops/normalization.py``)."""
    return normalise_forward(x, gamma, beta, eps, count,
                             lambda a, stacked: _channel_sum(a, reduce, 2 if stacked else 1),
                             lambda values, work, ndim: values.astype(work), center, correction)


def layernorm_backward(gy, saved):
    """``gx`` of the tile, and ``ggamma``, ``gbeta`` of its channels (None when not affine)."""
    return normalise_backward(gy, saved)
