"""Layer normalisation over the channels at each position, ConvNeXt's ``LayerNorm2d`` (PyTorch's ``F.layer_norm``
over the channel axis moved last), on features (N, F) or any spatial rank, forward and backward:

    mean = sum_c(x) / C,  var = sum_c((x - mean)^2) / C,  xhat = (x - mean) / sqrt(var + eps),  y = gamma * xhat + beta
    gx = (gxhat - mean_c(gxhat) - xhat * mean_c(gxhat * xhat)) / sqrt(var + eps),   gxhat = gy * gamma

per sample and position (``C`` the channels of the whole tensor; ``gamma``, ``beta`` per channel, when affine). A
tile holding some of the channels sums its part of each position's sums and ``reduce`` adds them over the tiles
of the same samples and positions (``tiling/statistics.py``): two sums forward, one backward, as group norm's
(``ops/groupnorm.py``). ``ggamma`` and ``gbeta`` are over the tile's own box.
"""

from typing import NamedTuple

from .. import backend


class LayerNormSaved(NamedTuple):
    xhat: object
    inv_std: object         # (N, 1, S...)
    gamma: object
    count: int
    reduce: object
    dtype: object


def _channel_sum(a, reduce, axis=1):
    """``a`` summed over the channels (float64, kept), and over the tiles sharing its positions."""
    xp = backend.array_module(a)
    sums = xp.ascontiguousarray(a.sum(axis=axis, keepdims=True, dtype=xp.float64))
    return sums if reduce is None else reduce(sums)


def layernorm_forward(x, gamma, beta, count, eps=1e-5, reduce=None):
    """``y, saved`` of the tile ``x`` (N, C_tile, S...), ``count`` the channels of the whole tensor, ``reduce``
    the sum over the tiles of the same samples and positions (None: ``x`` holds every channel)."""
    xp = backend.array_module(x)
    dtype = x.dtype
    work = xp.float32 if dtype.name == "bfloat16" else dtype
    x = x.astype(work, copy=False)
    mean = (_channel_sum(x, reduce) / count).astype(work)
    centred = x - mean
    var = _channel_sum(centred * centred, reduce) / count
    inv_std = (1.0 / xp.sqrt(var + eps)).astype(work)
    xhat = centred
    xhat *= inv_std
    if gamma is not None:
        channel = (1, -1) + (1,) * (x.ndim - 2)
        y = xhat * gamma.astype(work).reshape(channel) + beta.astype(work).reshape(channel)
    else:
        y = xhat.copy()
    return y.astype(dtype, copy=False), LayerNormSaved(xhat, inv_std, gamma, count, reduce, dtype)


def layernorm_backward(gy, saved):
    """``gx`` of the tile, and ``ggamma``, ``gbeta`` of its channels (None when not affine)."""
    xp = backend.array_module(gy)
    xhat, gamma = saved.xhat, saved.gamma
    work = xhat.dtype
    gy = gy.astype(work, copy=False)
    over = (0,) + tuple(range(2, gy.ndim))
    ggamma = gbeta = None
    if gamma is not None:
        ggamma = (gy * xhat).sum(axis=over)
        gbeta = gy.sum(axis=over)
        gxhat = gy * gamma.astype(work).reshape((1, -1) + (1,) * (gy.ndim - 2))
    else:
        gxhat = gy
    means = _channel_sum(xp.stack([gxhat, gxhat * xhat]), saved.reduce, axis=2) / saved.count
    gx = gxhat - means[0].astype(work)
    gx -= xhat * means[1].astype(work)
    gx *= saved.inv_std
    return gx.astype(saved.dtype, copy=False), ggamma, gbeta
