"""What group, instance and layer normalisation share (``ops/groupnorm.py``, ``ops/layernorm.py``): normalise a
tile by statistics summed over some of its axes and over the tiles that share them, then scale and shift per
channel, forward and backward:

    mean = S(x) / M,  var = S((x - mean)^2) / D,  xhat = (x - mean) / sqrt(var + eps),  y = gamma * xhat + beta
    gx = (gxhat - S(gxhat) / M - xhat * S(gxhat * xhat) / D) / sqrt(var + eps),   gxhat = gy * gamma

with ``D = M - correction`` (0: the biased variance, PyTorch's norms'; 1: ``torch.var``'s). Without centring (timm's
``SimpleNorm``: ``y = gamma * z``, ``z = x / sqrt(var + eps)``, the variance still the centred one):

    gx = (gz - xhat * S(gz * z) / D) / sqrt(var + eps),   gz = gy * gamma

``S`` (``sums``) adds up the elements of each statistic (a group's channels and positions; a position's channels)
over the tile and over the tiles that share it, in float64, of one array or of several stacked; ``spread`` puts
each statistic's value back on its elements. ``ggamma`` and ``gbeta`` are over the tile's own box. bfloat16
computes in float32.
"""

from typing import NamedTuple

from .. import backend


class NormSaved(NamedTuple):
    xhat: object            # the tile normalised (centred), in the computing type
    inv_std: object         # 1 / sqrt(var + eps), spread on the elements (broadcastable)
    gamma: object           # the tile's channels', or None
    sums: object            # S: sums(a, stacked) over the statistics' elements and the tiles sharing them
    spread: object          # spread(values, work, ndim): each statistic's value on its elements
    count: int              # M: elements per statistic over the whole tensor
    dtype: object           # the activations' type
    divisor: int = None     # D: the variance's divisor, M - correction (None: M)
    scaled: object = None   # without centring: z = x / sqrt(var + eps), what gamma scales (None: xhat)


def normalise_forward(x, gamma, beta, eps, count, sums, spread, center=True, correction=0):
    """``y, saved`` of the tile ``x`` (N, C, S...); ``beta`` may be None (no shift), ``center`` false scales
    ``x`` itself, ``correction`` 1 divides the variance by ``M - 1``."""
    xp = backend.array_module(x)
    dtype = x.dtype
    work = xp.float32 if dtype.name == "bfloat16" else dtype
    x = x.astype(work, copy=False)
    divisor = count - correction
    centred = x - spread(sums(x, False) / count, work, x.ndim)
    var = sums(centred * centred, False) / divisor
    inv_std = spread(1.0 / xp.sqrt(var + eps), work, x.ndim)
    xhat = centred
    xhat *= inv_std
    scaled = None if center else x * inv_std
    normed = xhat if center else scaled
    if gamma is not None:
        channel = (1, -1) + (1,) * (x.ndim - 2)
        y = normed * gamma.astype(work).reshape(channel)
        if beta is not None:
            y += beta.astype(work).reshape(channel)
    else:
        y = normed.copy()
    return y.astype(dtype, copy=False), NormSaved(xhat, inv_std, gamma, sums, spread, count, dtype, divisor, scaled)


def normalise_backward(gy, saved):
    """``gx`` of the tile, and ``ggamma``, ``gbeta`` of its channels (None when not affine)."""
    xp = backend.array_module(gy)
    xhat, gamma = saved.xhat, saved.gamma
    work = xhat.dtype
    gy = gy.astype(work, copy=False)
    over = (0,) + tuple(range(2, gy.ndim))
    normed = xhat if saved.scaled is None else saved.scaled
    divisor = saved.divisor or saved.count
    ggamma = gbeta = None
    if gamma is not None:
        ggamma = (gy * normed).sum(axis=over)
        gbeta = gy.sum(axis=over)
        gxhat = gy * gamma.astype(work).reshape((1, -1) + (1,) * (gy.ndim - 2))
    else:
        gxhat = gy
    if saved.scaled is not None:            # not centred: z's gradient, through the variance alone
        product = saved.sums(gxhat * normed, False) / divisor
        gx = gxhat - xhat * saved.spread(product, work, gy.ndim)
    else:
        sums = saved.sums(xp.stack([gxhat, gxhat * xhat]), True)
        gx = gxhat - saved.spread(sums[0] / saved.count, work, gy.ndim)
        gx -= xhat * saved.spread(sums[1] / divisor, work, gy.ndim)
    gx *= saved.inv_std
    return gx.astype(saved.dtype, copy=False), ggamma, gbeta
