"""What group, instance and layer normalisation share (``ops/groupnorm.py``, ``ops/layernorm.py``): normalise a
tile by statistics summed over some of its axes and over the tiles that share them, then scale and shift per
channel, forward and backward:

    mean = S(x) / M,  var = S((x - mean)^2) / M,  xhat = (x - mean) / sqrt(var + eps),  y = gamma * xhat + beta
    gx = (gxhat - S(gxhat) / M - xhat * S(gxhat * xhat) / M) / sqrt(var + eps),   gxhat = gy * gamma

``S`` (``sums``) adds up the elements of each statistic (a group's channels and positions; a position's channels)
over the tile and over the tiles that share it, in float64, of one array or of several stacked; ``spread`` puts
each statistic's value back on its elements. ``ggamma`` and ``gbeta`` are over the tile's own box. bfloat16
computes in float32.
"""

from typing import NamedTuple

from .. import backend


class NormSaved(NamedTuple):
    xhat: object            # the tile normalised, in the computing type
    inv_std: object         # 1 / sqrt(var + eps), spread on the elements (broadcastable)
    gamma: object           # the tile's channels', or None
    sums: object            # S: sums(a, stacked) over the statistics' elements and the tiles sharing them
    spread: object          # spread(values, work, ndim): each statistic's value on its elements
    count: int              # M: elements per statistic over the whole tensor
    dtype: object           # the activations' type


def normalise_forward(x, gamma, beta, eps, count, sums, spread):
    """``y, saved`` of the tile ``x`` (N, C, S...)."""
    xp = backend.array_module(x)
    dtype = x.dtype
    work = xp.float32 if dtype.name == "bfloat16" else dtype
    x = x.astype(work, copy=False)
    centred = x - spread(sums(x, False) / count, work, x.ndim)
    var = sums(centred * centred, False) / count
    inv_std = spread(1.0 / xp.sqrt(var + eps), work, x.ndim)
    xhat = centred
    xhat *= inv_std
    if gamma is not None:
        channel = (1, -1) + (1,) * (x.ndim - 2)
        y = xhat * gamma.astype(work).reshape(channel) + beta.astype(work).reshape(channel)
    else:
        y = xhat.copy()
    return y.astype(dtype, copy=False), NormSaved(xhat, inv_std, gamma, sums, spread, count, dtype)


def normalise_backward(gy, saved):
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
    means = saved.sums(xp.stack([gxhat, gxhat * xhat]), True) / saved.count
    gx = gxhat - saved.spread(means[0], work, gy.ndim)
    gx -= xhat * saved.spread(means[1], work, gy.ndim)
    gx *= saved.inv_std
    return gx.astype(saved.dtype, copy=False), ggamma, gbeta
