"""The GEMM of the BLAS NumPy itself loaded, called with leading dimensions and ``beta`` (``C = alpha A B + beta C``
on strided windows of arrays), which ``numpy.matmul`` does not offer: what the implicit-GEMM convolution
(``ops/implicit.py``) accumulates kernel position by kernel position.

The library is found among the shared objects this process has loaded (``/proc/self/maps``), its CBLAS GEMM by
name: NumPy's wheels bundle OpenBLAS as ``scipy_openblas64_`` with 64-bit integers (``scipy_cblas_sgemm64_``);
other builds link a system OpenBLAS, BLIS or MKL with ``cblas_sgemm`` (32-bit integers; ``cblas_sgemm64_``: 64-bit).
Each binding is checked against ``numpy.matmul`` on a small product before it is used; a library whose name or
``MKL_INTERFACE_LAYER`` says ILP64 is never called through unsuffixed names with 32-bit integers. Where none is found (no
``/proc``, a BLAS without CBLAS symbols) or ``SPMDCNN_IMPLICIT_GEMM=off``, :func:`gemm` is None and the
convolutions keep their im2col path. No new dependency: ``ctypes`` and the library NumPy already runs its products
on (one thread pool, the threads it was given).
"""

import ctypes
import os
import re
import threading

import numpy as np

SWITCHED_OFF = os.environ.get("SPMDCNN_IMPLICIT_GEMM", "").lower() in ("off", "0", "no", "false")
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
# (symbol prefix, symbol suffix, integer type), tried in this order in each loaded BLAS
SYMBOLS = (("scipy_cblas_", "gemm64_", ctypes.c_int64), ("cblas_", "gemm64_", ctypes.c_int64),
           ("cblas_", "gemm", ctypes.c_int32))
NAMES = ("openblas", "blis", "mkl_rt", "libcblas", "libblas", "flexiblas")

_found = None           # {dtype: function} once looked for
_library = None         # the path of the library they are from
_lock = threading.Lock()


def _loaded_libraries():
    """Paths of the shared objects this process has mapped that look like a BLAS, NumPy's own first."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = dict.fromkeys(line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6)
    except OSError:
        return []
    blas = [p for p in paths if any(name in os.path.basename(p).lower() for name in NAMES)]
    return sorted(blas, key=lambda p: "numpy" not in p)


def _stem(path):
    """A library's name without its directory, a wheel's hash or build tag, and the suffix."""
    return re.split(r"-[0-9a-f]{6,}|-r\d|\.so|\.dylib", os.path.basename(path))[0]


def _ilp64_without_suffix(path):
    """Whether a library's unsuffixed CBLAS names may take 64-bit integers (an ILP64 build, or MKL told to use its
    ILP64 layer): then only suffixed ``...64_`` names are called, never with 32-bit integers."""
    return "64" in _stem(path).lower() or "ilp64" in os.environ.get("MKL_INTERFACE_LAYER", "").lower()


def _bind(library, dtype, path=""):
    """The GEMM of ``library`` (a ctypes CDLL at ``path``) for ``dtype`` as a Python function of the CBLAS
    arguments, with its integer type's largest value as ``function.largest``, or None."""
    real = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    letter = "s" if dtype == np.float32 else "d"
    for prefix, suffix, integer in SYMBOLS:
        if integer is ctypes.c_int32 and _ilp64_without_suffix(path):
            continue
        function = getattr(library, f"{prefix}{letter}{suffix}", None)
        if function is None:
            continue
        function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, integer, integer, integer, real,
                             ctypes.c_void_p, integer, ctypes.c_void_p, integer, real, ctypes.c_void_p, integer]
        function.restype = None
        if _agrees(function, dtype):
            function.largest = 2 ** (8 * ctypes.sizeof(integer) - 1) - 1
            return function
    return None


def _agrees(function, dtype):
    """Whether ``function`` computes a small product with ``beta`` and leading dimensions as NumPy does."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 14)).astype(dtype), rng.standard_normal((3, 9)).astype(dtype)
    c = np.ones((5, 8), dtype)
    # C[:, :6] = 2 * A[:, :3] @ B[:, 1:7] + 0.5 * C[:, :6], A's rows 14 apart, B's 9, C's 8
    function(ROW_MAJOR, NO_TRANS, NO_TRANS, 5, 6, 3, 2.0, a.ctypes.data, 14, b.ctypes.data + b.itemsize, 9, 0.5,
             c.ctypes.data, 8)
    expected = 2 * a[:, :3] @ b[:, 1:7] + 0.5
    return np.allclose(c[:, :6], expected, rtol=1e-5, atol=1e-5) and np.all(c[:, 6:] == 1)


def _find():
    global _found, _library
    if _found is not None:                      # looked for: no lock on every convolution
        return _found
    with _lock:
        if _found is not None:
            return _found
        found = {}
        if not SWITCHED_OFF:
            for path in _loaded_libraries():
                try:
                    library = ctypes.CDLL(path)
                except OSError:
                    continue
                bound = {dtype: _bind(library, dtype, path) for dtype in (np.float32, np.float64)}
                if all(bound.values()):
                    found, _library = bound, path
                    break
        _found = found
        return _found


def gemm(dtype):
    """The CBLAS GEMM for arrays of ``dtype`` (float32 or float64), ``f(order, trans_a, trans_b, M, N, K, alpha,
    A, lda, B, ldb, beta, C, ldc)`` on addresses, or None where there is none (:mod:`this module <spmdcnn.ops.blas>`)."""
    return _find().get(np.dtype(dtype).type)


def largest(dtype):
    """The largest dimension or stride :func:`gemm`'s integers hold (0 where there is no GEMM)."""
    function = gemm(dtype)
    return function.largest if function is not None else 0


def describe():
    """Which library's GEMM the implicit convolutions call, or why none."""
    if SWITCHED_OFF:
        return "off (SPMDCNN_IMPLICIT_GEMM=off)"
    if not _find():
        return "off (no CBLAS GEMM found in the BLAS NumPy loaded)"
    return _stem(_library)
