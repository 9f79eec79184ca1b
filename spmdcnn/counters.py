"""Counter-based random numbers: a value for element ``i`` of a stream is a hash of (stream key, i).

Nothing is drawn in sequence, so any part of a tensor (a tile on one rank) gets exactly the values the whole
tensor has there, whatever the plan and the number of ranks. The hash is SplitMix64's finaliser, on NumPy or
CuPy uint64 arrays.
"""

import zlib

GOLDEN = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1


def mix_int(z):
    """SplitMix64 of a Python integer."""
    z = (z + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def mix_array(xp, z):
    """SplitMix64 of every element of a uint64 array (wrapping arithmetic)."""
    z = z + xp.uint64(GOLDEN)
    z ^= z >> xp.uint64(30)
    z *= xp.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> xp.uint64(27)
    z *= xp.uint64(0x94D049BB133111EB)
    z ^= z >> xp.uint64(31)
    return z


def stream_key(*parts):
    """A 64-bit key from integers and strings (strings enter through their CRC-32)."""
    key = 0
    for part in parts:
        value = zlib.crc32(part.encode()) if isinstance(part, str) else int(part) & MASK64
        key = mix_int(key ^ value)
    return key


def global_indices(xp, shape, start=None, global_shape=None, rows=None):
    """Row-major index in ``global_shape`` of every element of the box ``start + [0, shape)``.

    ``rows`` (optional) lists the global indices along the first axis instead of a contiguous range.
    """
    start = (0,) * len(shape) if start is None else start
    global_shape = shape if global_shape is None else global_shape
    index = xp.zeros((1,) * len(shape), dtype=xp.uint64)
    for axis, (extent, offset, total) in enumerate(zip(shape, start, global_shape)):
        view = [1] * len(shape)
        view[axis] = extent
        if axis == 0 and rows is not None:
            along = xp.asarray(rows, dtype=xp.uint64)
        else:
            along = xp.arange(offset, offset + extent, dtype=xp.uint64)
        index = index * xp.uint64(total) + along.reshape(view)
    return index


def uniform(xp, key, index):
    """Uniform numbers in [0, 1) (53 bits) for the uint64 element indices ``index`` of stream ``key``."""
    bits = mix_array(xp, index ^ xp.uint64(key))
    return (bits >> xp.uint64(11)).astype(xp.float64) * (1.0 / (1 << 53))


def bits53(xp, key, index):
    """The top 53 bits of the hash, as uint64 (for exact comparisons against a probability * 2**53)."""
    return mix_array(xp, index ^ xp.uint64(key)) >> xp.uint64(11)
