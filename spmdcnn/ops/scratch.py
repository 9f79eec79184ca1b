"""Reusable scratch buffers for the large temporaries of one op call (im2col columns, GEMM products).

A fresh 48 MB NumPy array costs thousands of page faults every time it is allocated; keeping one buffer per
purpose avoids them. A scratch array is valid until the next request for the same slot in the same thread, so
an op must not return one or keep it past its own call. Buffers are per thread, so ops running in different
threads never share one. CuPy has its own memory pool, so on a GPU this is a plain allocation.
"""

import threading

import numpy as np

_local = threading.local()


def scratch(xp, slot, shape, dtype):
    """An uninitialised array of ``shape`` for ``slot``, reusing the slot's memory when it is large enough."""
    if xp is not np:
        return xp.empty(shape, dtype=dtype)
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    dtype = np.dtype(dtype)
    size = 1
    for extent in shape:
        size *= int(extent)
    key = (slot, dtype.str)
    buffer = buffers.get(key)
    if buffer is None or buffer.size < size:
        buffer = buffers[key] = np.empty(size, dtype=dtype)
    return buffer[:size].reshape(shape)

