"""Dropout with a counter-based mask: whether element ``i`` survives is a hash of (seed, step, layer, i).

``i`` is the element's index in the *global* tensor, so a tile computes exactly the mask entries that the
whole tensor would have there, whatever the plan. The hash is SplitMix64's finaliser; element ``i`` is kept
when its top 53 bits, read as a fraction of 2**53, are at least ``p``. Kept values are scaled by 1 / (1 - p).

Stochastic depth (torchvision's ``StochasticDepth(p, mode="row")``) drops whole samples the same way: sample
``n`` of the global batch survives when the hash of (seed, step, layer, n) does, and then is scaled by
1 / (1 - p); a tile of any part of the sample's channels and positions computes the same decision.
"""

from .. import backend
from ..counters import bits53, global_indices, stream_key as _key
from .cuda import kernels as cuda
from .saved import DropoutSaved


def stream_key(seed, step, layer):
    """The 64-bit key of one layer's mask at one step."""
    return _key(seed, step, layer)


def dropout_mask(xp, shape, p, key, start=None, global_shape=None):
    """Boolean mask of kept elements for the box ``start + [0, shape)`` of a tensor of ``global_shape``."""
    return bits53(xp, key, global_indices(xp, shape, start, global_shape)) >= xp.uint64(int(round(p * (1 << 53))))


def dropout_forward(x, p, key, start=None, global_shape=None, inplace=False):
    """``inplace=True`` writes ``y`` over ``x`` (the caller guarantees nothing else reads ``x``)."""
    xp = backend.array_module(x)
    if p == 0.0:
        return x, None
    if backend.on_device(x):
        return cuda.dropout_forward(x, p, key, start, global_shape, inplace)
    return _kept(x, dropout_mask(xp, x.shape, p, key, start, global_shape), p, inplace)


def _kept(x, keep, p, inplace):
    """``x`` times the mask ``keep`` (broadcast) and 1 / (1 - p), and what backward needs."""
    scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
    y = backend.array_module(x).multiply(x, keep, out=x if inplace else None)
    y *= scale
    return y, DropoutSaved(keep, scale)


def dropout_backward(gy, saved):
    if saved is None:
        return gy
    if backend.on_device(gy) and saved.keep.shape == gy.shape:
        return cuda.dropout_backward(gy, saved.keep, saved.scale)
    gx = gy * saved.keep
    gx *= saved.scale
    return gx


def stochastic_depth_forward(x, p, key, start=None, global_shape=None, inplace=False):
    """``(y, saved)`` of the tile ``x`` at ``start`` (its first element's place) in the global tensor of
    ``global_shape``: only the samples' (the first axis's) count."""
    xp = backend.array_module(x)
    if p == 0.0:
        return x, None
    first, batch = (0 if start is None else start[0]), (len(x) if global_shape is None else global_shape[0])
    keep = dropout_mask(xp, x.shape[:1], p, key, (first,), (batch,)).reshape((-1,) + (1,) * (x.ndim - 1))
    return _kept(x, keep, p, inplace)


stochastic_depth_backward = dropout_backward        # the mask (one per sample) broadcast over the sample
