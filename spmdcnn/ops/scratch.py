"""Reusable scratch buffers for the large temporaries of one op call (im2col columns, GEMM products).

A fresh 48 MB NumPy array costs thousands of page faults every time it is allocated; keeping one buffer per
purpose avoids them. A scratch array is valid until the next request for the same slot in the same thread, so
an op must not return one or keep it past its own call. Buffers are per thread, so ops running in different
threads never share one. CuPy has its own memory pool, so on a GPU this is a plain allocation. :func:`release`
frees every thread's buffers (between jobs in one process; the memory model's benchmark).

A request above ``KEPT_BYTES`` gets a fresh array that is not kept: the columns of one sample of a volume can
take gigabytes, which would otherwise stay allocated through every later layer, and the memory model
(``cost/memory.py``) counts a kernel's workspace only while its layer runs. The page faults of so large an array
cost little next to the work it holds.
"""

import threading

import numpy as np

KEPT_BYTES = 256 << 20     # the largest buffer a slot keeps between calls (VGG-16's first columns: 116 MB)
_local = threading.local()
_every = []                 # every thread's buffers, for release()
_every_lock = threading.Lock()


def release():
    """Drop every thread's scratch buffers (arrays still in use by a caller stay valid: they are only no longer
    reused)."""
    with _every_lock:
        for buffers in _every:
            buffers.clear()


def scratch(xp, slot, shape, dtype):
    """An uninitialised array of ``shape`` for ``slot``, reusing the slot's memory when it is large enough."""
    if xp is not np:
        return xp.empty(shape, dtype=dtype)
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
        with _every_lock:
            _every.append(buffers)
    dtype = np.dtype(dtype)
    size = 1
    for extent in shape:
        size *= int(extent)
    if size * dtype.itemsize > KEPT_BYTES:
        return np.empty(shape, dtype=dtype)
    key = (slot, dtype.str)
    buffer = buffers.get(key)
    if buffer is None or buffer.size < size:
        buffer = buffers[key] = np.empty(size, dtype=dtype)
    return buffer[:size].reshape(shape)

