"""Group normalisation (PyTorch's ``F.group_norm``) and instance normalisation (``F.instance_norm``, one group per
channel, no running statistics) over 1, 2 or 3 spatial axes, forward and backward, one implementation.

Per sample ``n`` and group ``g`` (``C / G`` consecutive channels), over the group's channels and every position:

    mean = sum(x) / M,  var = sum((x - mean)^2) / M,  xhat = (x - mean) / sqrt(var + eps),  y = gamma * xhat + beta
    gx = (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)) / sqrt(var + eps),   gxhat = gy * gamma

(``M`` = channels per group x positions; ``gamma``, ``beta`` per channel, when affine). A tile of the output reads
the whole of its samples' groups that its channels belong to (every position: ``tiling/fields.py``), computes their
statistics exactly, and writes its own box (``box``: where its output lies inside what it read). Backward sets the
tile's output gradient into that block (zero elsewhere: the other positions are other tiles'), so the input
gradient it returns is this tile's part of the whole's, which the exchange sums back over the tiles that read the
same positions; ``ggamma`` and ``gbeta`` are over the tile's own box, summed over the tiles that hold the same
channels like any parameter gradient.
"""

from typing import NamedTuple

from .. import backend


class GroupSaved(NamedTuple):
    xhat: object            # the block read, normalised, in the computing type
    inv_std: object         # (N, G, 1, ...)
    gamma: object           # the output's channels', or None
    box: tuple              # the output's slices of the block (channels, then each spatial axis)
    groups: int             # groups in the block
    dtype: object           # the activations' type


def _grouped(a, groups):
    """``a`` (N, C, S...) as (N, G, C/G * prod(S))."""
    return a.reshape(a.shape[0], groups, -1)


def groupnorm_forward(x, gamma, beta, groups, eps=1e-5, box=None):
    """``y, saved`` of the block ``x`` (N, C_block, S...): ``groups`` whole groups of its samples (every position),
    ``box`` the slices of the block the output holds (None: all of it), ``gamma`` and ``beta`` its channels' (None:
    not affine). bfloat16 computes in float32."""
    xp = backend.array_module(x)
    dtype = x.dtype
    work = xp.float32 if dtype.name == "bfloat16" else dtype
    x = x.astype(work, copy=False)
    N, C = x.shape[:2]
    if C % groups:
        raise ValueError(f"groupnorm: {C} channels do not split into {groups} groups")
    g = _grouped(x, groups)
    mean = g.mean(axis=2, keepdims=True, dtype=xp.float64)
    centred = g - mean.astype(work)
    var = (centred.astype(xp.float64, copy=False) ** 2).mean(axis=2, keepdims=True)
    inv_std = (1.0 / xp.sqrt(var + eps)).astype(work)
    xhat = (centred * inv_std).reshape(x.shape)
    box = box or (slice(None),) * (x.ndim - 1)
    y = xhat[(slice(None),) + box]
    channel = (1, -1) + (1,) * (x.ndim - 2)
    if gamma is not None:
        y = y * gamma.astype(work).reshape(channel) + beta.astype(work).reshape(channel)
    else:
        y = y.copy()
    return y.astype(dtype, copy=False), GroupSaved(xhat, inv_std, gamma, box, groups, dtype)


def groupnorm_backward(gy, saved):
    """``gx`` of the whole block read, and ``ggamma``, ``gbeta`` of the output's channels (None when not
    affine)."""
    xp = backend.array_module(gy)
    xhat, inv_std, gamma, box, groups = saved.xhat, saved.inv_std, saved.gamma, saved.box, saved.groups
    work = xhat.dtype
    gy = gy.astype(work, copy=False)
    where = (slice(None),) + box
    over = (0,) + tuple(range(2, gy.ndim))
    ggamma = gbeta = None
    gxhat = xp.zeros(xhat.shape, dtype=work)
    if gamma is not None:
        ggamma = (gy * xhat[where]).sum(axis=over)
        gbeta = gy.sum(axis=over)
        gxhat[where] = gy * gamma.astype(work).reshape((1, -1) + (1,) * (gy.ndim - 2))
    else:
        gxhat[where] = gy
    g, h = _grouped(gxhat, groups), _grouped(xhat, groups)
    gx = (g - g.mean(axis=2, keepdims=True) - h * (g * h).mean(axis=2, keepdims=True)) * inv_std
    return gx.reshape(xhat.shape).astype(saved.dtype, copy=False), ggamma, gbeta
