"""Dropout with a counter-based mask: whether element ``i`` survives is a hash of (seed, step, layer, i).

``i`` is the element's index in the *global* tensor, so a tile computes exactly the mask entries that the
whole tensor would have there, whatever the plan. The hash is SplitMix64's finaliser; element ``i`` is kept
when its top 53 bits, read as a fraction of 2**53, are at least ``p``. Kept values are scaled by 1 / (1 - p).
"""

import zlib

from .. import backend

_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def _mix_int(z):
    z = (z + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _mix_array(xp, z):
    z = z + xp.uint64(_GOLDEN)
    z ^= z >> xp.uint64(30)
    z *= xp.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> xp.uint64(27)
    z *= xp.uint64(0x94D049BB133111EB)
    z ^= z >> xp.uint64(31)
    return z


def stream_key(seed, step, layer):
    """The 64-bit key of one layer's mask at one step."""
    key = _mix_int(int(seed) & _MASK64)
    key = _mix_int(key ^ (int(step) & _MASK64))
    return _mix_int(key ^ zlib.crc32(layer.encode()))


def global_indices(xp, shape, start=None, global_shape=None):
    """Row-major index in ``global_shape`` of every element of the box ``start + [0, shape)``."""
    start = (0,) * len(shape) if start is None else start
    global_shape = shape if global_shape is None else global_shape
    index = xp.zeros((1,) * len(shape), dtype=xp.uint64)
    for axis, (extent, offset, total) in enumerate(zip(shape, start, global_shape)):
        view = [1] * len(shape)
        view[axis] = extent
        index = index * xp.uint64(total) + xp.arange(offset, offset + extent, dtype=xp.uint64).reshape(view)
    return index


def dropout_mask(xp, shape, p, key, start=None, global_shape=None):
    """Boolean mask of kept elements for the box ``start + [0, shape)`` of a tensor of ``global_shape``."""
    bits = _mix_array(xp, global_indices(xp, shape, start, global_shape) ^ xp.uint64(key))
    return (bits >> xp.uint64(11)) >= xp.uint64(int(round(p * (1 << 53))))


def dropout_forward(x, p, key, start=None, global_shape=None):
    xp = backend.array_module(x)
    if p == 0.0:
        return x, None
    keep = dropout_mask(xp, x.shape, p, key, start, global_shape)
    scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
    y = x * keep
    y *= scale
    return y, (keep, scale)


def dropout_backward(gy, saved):
    if saved is None:
        return gy
    keep, scale = saved
    gx = gy * keep
    gx *= scale
    return gx
