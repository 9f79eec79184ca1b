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
(``gxhat`` and ``gxhat * xhat`` together), the arithmetic ``ops/normalization.py``'s. ``ggamma`` and ``gbeta`` are over the tile's own box, summed over the
tiles that hold the same channels like any parameter gradient.
"""

from .. import backend
from .normalization import normalise_backward, normalise_forward


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
    tiles sharing them (None: ``x`` holds whole groups); ``gamma`` and ``beta`` its channels' (None: not affine)."""
    return normalise_forward(x, gamma, beta, eps, count,
                             lambda a, stacked: _per_group(a, members, reduce, 3 if stacked else 2),
                             lambda values, work, ndim: _per_channel(values, members, work, ndim))


def groupnorm_backward(gy, saved):
    """``gx`` of the tile, and ``ggamma``, ``gbeta`` of its channels (None when not affine)."""
    return normalise_backward(gy, saved)
