"""Optional compiled host kernels (numba, the ``numba`` extra: ``pip install "spmdcnn[numba]"``) for passes that
NumPy needs several calls for: batch norm's statistics, its affine pass and its input gradient, each one pass over
memory, and max pooling's backward (3 NumPy calls per kernel position and output; here one add per output). Without
numba, with ``SPMDCNN_COMPILED=off``, or where numba fails to load them (a warning says why), NumPy's kernels run
(``ops/batchnorm.py``, ``ops/pool.py``); both keep the float32 error bounds the tests derive, and agree to the
type's rounding (their sums are grouped differently), so a plan whose tiles fall below :data:`MIN_ELEMENTS` where
one process's whole tensors do not still equals one process to rounding.

Measured (``benchmarks/kernels_vs_torch.py models/resnet50.yaml --batch 16``, 2 threads): NumPy's blocked passes
take 6-8 calls per element backward and 5 forward, and ResNet-50's batch norms took 351 ms a step against
PyTorch's 196; one loop per element, vectorised by LLVM (``fastmath``: sums reassociated, in float64
accumulators), takes 180 ms. (``fastmath`` is only reassociation and contraction: NaN and infinities propagate as
in NumPy, for the trainer's check that the loss is finite.) Max pooling's forward stays NumPy's: its blocked passes beat a compiled loop over the
windows (numba 0.68: 90 against 35 ms for 32 x 128^3; LLVM does not vectorise the running maximum and its index).

Each kernel works on rows of a (rows, positions) array, row ``r`` of channel ``r % C``, ``rows [r0, r1)`` of the
work at a time, so that :func:`~spmdcnn.ops.parallel.parallel_for` shares rows out between threads (the kernels
release the GIL) and every row's sums come out the same whatever the split. float32 and float64 arrays of
:data:`MIN_ELEMENTS` or more only; other types (bfloat16, float16) and smaller arrays take NumPy's path.
"""

import importlib.metadata
import importlib.util
import os
import threading
import warnings

import numpy as np

from .parallel import parallel_for

INSTALLED = importlib.util.find_spec("numba") is not None
SWITCHED_OFF = os.environ.get("SPMDCNN_COMPILED", "").lower() in ("off", "0", "no", "false")
ENABLED = INSTALLED and not SWITCHED_OFF        # tests switch it off to run NumPy's kernels
TYPES = (np.float32, np.float64)
# Smaller arrays take NumPy's kernels: their passes stay in cache anyway, and a process whose arrays are all small
# (a test, a small model) never loads numba, which costs about 0.5 s a process (import and cached code).
MIN_ELEMENTS = 1 << 18
_loops = None
FAILED = None           # why numba's kernels failed to load, if they did
_loading = threading.Lock()


def _kernels():
    """The numba loops (``ops/numba_loops.py``), imported, and their compiled code loaded, on the first call; None,
    and the compiled kernels off for the rest of the process with a warning, where numba fails to load them (a
    release that does not support this NumPy, no writable cache)."""
    global _loops, ENABLED, FAILED
    if _loops is not None:                      # loaded: no lock on every call
        return _loops
    with _loading:
        if _loops is None and FAILED is None:
            try:
                from . import numba_loops
                _loops = numba_loops
            except Exception as error:          # noqa: BLE001 (any failure: NumPy's kernels run instead)
                FAILED, ENABLED = f"{type(error).__name__}: {error}", False
                warnings.warn(f"spmdcnn: numba's kernels failed to load ({FAILED}); NumPy's run instead",
                              RuntimeWarning, stacklevel=3)
    return _loops


def available(*arrays):
    """Whether the compiled kernels run on these (host) arrays: float32 or float64, the first of
    :data:`MIN_ELEMENTS` or more."""
    return (ENABLED and arrays[0].size >= MIN_ELEMENTS
            and all(isinstance(a, np.ndarray) and a.dtype.type in TYPES for a in arrays) and _kernels() is not None)


def describe():
    """``"numba 0.68.1"``, or why the host kernels are NumPy's."""
    if not INSTALLED:
        return "off (numba not installed)"
    if SWITCHED_OFF:
        return "off (SPMDCNN_COMPILED=off)"
    if FAILED:
        return f"off (numba failed to load them: {FAILED})"
    return f"numba {importlib.metadata.version('numba')}" if ENABLED else "off"


def _volumes(array, rows):
    """(N, C, S...) as (rows, D, H, W): a sequence's or an image's missing axes of extent 1 in front."""
    return array.reshape((rows,) + (1,) * (5 - array.ndim) + array.shape[2:])


def _three(values, fill):
    return (fill,) * (3 - len(values)) + tuple(values)


def maxpool_backward(gy, argmax, geometry, padded_shape):
    """The zero-padded input's gradient (``padded_shape``) of max pooling (any spatial rank) whose windows' winners
    are ``argmax``."""
    N, C = gy.shape[:2]
    gx = np.zeros(padded_shape, dtype=gy.dtype)
    rows = _volumes(gx, N * C)
    g = _volumes(np.ascontiguousarray(gy), N * C)
    parallel_for(lambda r0, r1: _kernels().maxpool_backward(g, _volumes(argmax, N * C), _three(geometry.kernel, 1),
                                                  _three(geometry.stride, 1), rows, r0, r1),
                 N * C, gy.size * geometry.positions)
    return gx


def _rows(array3):
    """A contiguous (N, C, S) array as (N*C, S) rows."""
    N, C, S = array3.shape
    return np.ascontiguousarray(array3).reshape(N * C, S)


def _per_row(kernel, rows, *arguments):
    parallel_for(lambda r0, r1: kernel(*arguments, r0, r1), rows.shape[0], rows.size)


def centred_dots(a, x, mean):
    """Per-channel ``sum(a * (x - mean))`` of (N, C, S) arrays, float64: rows' sums added over the samples."""
    N, C, _ = x.shape
    rows = _rows(x)
    out = np.empty(N * C)
    _per_row(_kernels().centred_dots, rows, _rows(a), rows, mean.astype(x.dtype), out)
    return out.reshape(N, C).sum(axis=0)


def gradient_sums(gy, x, mean):
    """Backward's per-channel ``sum(gy)`` and ``sum(gy * (x - mean))`` as (2, C) float64, in one pass."""
    N, C, _ = x.shape
    rows = _rows(x)
    sums, dots = np.empty(N * C), np.empty(N * C)
    _per_row(_kernels().gradient_sums, rows, _rows(gy), rows, mean.astype(x.dtype), sums, dots)
    return np.stack([sums.reshape(N, C).sum(axis=0), dots.reshape(N, C).sum(axis=0)])


def affine(x, scale, shift):
    """``x * scale + shift`` per channel of a (N, C, S) array."""
    rows = _rows(x)
    y = np.empty_like(rows)
    _per_row(_kernels().affine, rows, rows, scale.astype(x.dtype), shift.astype(x.dtype), y)
    return y.reshape(x.shape)


def input_gradient(gy, x, mean, k1, k2, k3):
    """``gy * k1 - (x - mean) * k2 - k3`` per channel of (N, C, S) arrays."""
    rows = _rows(x)
    gx = np.empty_like(rows)
    dtype = x.dtype
    _per_row(_kernels().input_gradient, rows, _rows(gy).astype(dtype, copy=False), rows, mean.astype(dtype),
             k1.astype(dtype), k2.astype(dtype), k3.astype(dtype), gx)
    return gx.reshape(x.shape)
