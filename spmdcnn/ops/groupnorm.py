"""Group normalisation (PyTorch's ``F.group_norm``) and instance normalisation (``F.instance_norm``, one group per
channel, no running statistics) over 1, 2 or 3 spatial axes, forward and backward, one implementation.

Per sample ``n`` and group ``g`` (``C / G`` consecutive channels), over the group's channels and every position:

    mean = sum(x) / M,  var = sum((x - mean)^2) / M,  xhat = (x - mean) / sqrt(var + eps),  y = gamma * xhat + beta
    gx = (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)) / sqrt(var + eps),   gxhat = gy * gamma

(``M`` = channels per group x positions of the whole tensor; ``gamma``, ``beta`` per channel, when affine). A tile
holds some samples, channels and positions, its own box. It sums its part of each (sample, group) per channel, then
into the columns of a table of the groups it shares (``members``: a 0/1 matrix from its channels to those
columns), and ``reduce`` adds the tables of the tiles that share those groups (``tiling/statistics.py``): two
sums forward (the means, then the centred squares: two passes, as one process computes them) and one backward
(``gxhat`` and ``gxhat * xhat`` together). ``ggamma`` and ``gbeta`` are over the tile's own box, summed over the
tiles that hold the same channels like any parameter gradient.
"""

from typing import NamedTuple

from .. import backend


class GroupSaved(NamedTuple):
    xhat: object            # the tile normalised, in the computing type
    inv_std: object         # (N, C, 1, ...): each channel's group's 1 / sqrt(var + eps)
    gamma: object           # the tile's channels', or None
    members: object         # (C, width) float64: which column of the statistics each channel adds to
    count: int              # values per sample and group over the whole tensor (M)
    reduce: object          # the sum over the tiles sharing the groups (None: this tile alone)
    dtype: object           # the activations' type


def group_members(xp, c0, c1, per, g0, width):
    """(c1 - c0, width) float64: channel ``c`` of ``[c0, c1)`` adds to column ``c // per - g0``."""
    members = xp.zeros((c1 - c0, width))
    members[xp.arange(c1 - c0), xp.arange(c0, c1) // per - g0] = 1.0
    return members


def _per_group(a, members, reduce, lead=2):
    """The sums of ``a`` (N, C, S...), or of ``lead - 2`` such stacked, over the positions, added per group
    (..., N, width) and over the tiles sharing the groups (float64)."""
    xp = backend.array_module(a)
    sums = a.reshape(a.shape[:lead] + (-1,)).sum(axis=-1, dtype=xp.float64)
    sums = xp.ascontiguousarray(sums @ members)
    return sums if reduce is None else reduce(sums)


def _per_channel(values, members, work, ndim):
    """Per-group ``values`` (N, width) as per-channel (N, C, 1, ...) in ``work``."""
    per_channel = (values @ members.T).astype(work)
    return per_channel.reshape(per_channel.shape + (1,) * (ndim - 2))


def groupnorm_forward(x, gamma, beta, members, count, eps=1e-5, reduce=None):
    """``y, saved`` of the tile ``x`` (N, C, S...); ``members`` (C, width) maps its channels to the columns of the
    groups it shares, ``count`` the values per sample and group of the whole tensor, ``reduce`` the sum over the
    tiles sharing them (None: ``x`` holds whole groups); ``gamma`` and ``beta`` its channels' (None: not affine).
    bfloat16 computes in float32."""
    xp = backend.array_module(x)
    dtype = x.dtype
    work = xp.float32 if dtype.name == "bfloat16" else dtype
    x = x.astype(work, copy=False)
    mean = _per_group(x, members, reduce) / count
    centred = x - _per_channel(mean, members, work, x.ndim)
    var = _per_group(centred * centred, members, reduce) / count
    inv_std = _per_channel(1.0 / xp.sqrt(var + eps), members, work, x.ndim)
    xhat = centred
    xhat *= inv_std
    if gamma is not None:
        channel = (1, -1) + (1,) * (x.ndim - 2)
        y = xhat * gamma.astype(work).reshape(channel) + beta.astype(work).reshape(channel)
    else:
        y = xhat.copy()
    return y.astype(dtype, copy=False), GroupSaved(xhat, inv_std, gamma, members, count, reduce, dtype)


def groupnorm_backward(gy, saved):
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
    means = _per_group(xp.stack([gxhat, gxhat * xhat]), saved.members, saved.reduce, 3) / saved.count
    gx = gxhat - _per_channel(means[0], saved.members, work, gy.ndim)
    gx -= xhat * _per_channel(means[1], saved.members, work, gy.ndim)
    gx *= saved.inv_std
    return gx.astype(saved.dtype, copy=False), ggamma, gbeta
