"""Reusable scratch buffers for the large temporaries of one op call (im2col columns, GEMM products).

A fresh 48 MB NumPy array costs thousands of page faults every time it is allocated; keeping one buffer per
purpose avoids them. A scratch array is valid until the next request for the same slot, so an op must not
return one or keep it past its own call. CuPy has its own memory pool, so on a GPU this is a plain allocation.
"""

import numpy as np

_buffers = {}


def scratch(xp, slot, shape, dtype):
    """An uninitialised array of ``shape`` for ``slot``, reusing the slot's memory when it is large enough."""
    if xp is not np:
        return xp.empty(shape, dtype=dtype)
    dtype = np.dtype(dtype)
    size = 1
    for extent in shape:
        size *= int(extent)
    key = (slot, dtype.str)
    buffer = _buffers.get(key)
    if buffer is None or buffer.size < size:
        buffer = _buffers[key] = np.empty(size, dtype=dtype)
    return buffer[:size].reshape(shape)


def release():
    """Drop every scratch buffer (for a process that is done with training)."""
    _buffers.clear()
