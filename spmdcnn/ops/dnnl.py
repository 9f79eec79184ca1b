"""oneDNN's C API through ctypes (the library ``ops/onednn.py`` runs the host's float32 convolutions on): the
library found and loaded (the ``onednn-cpu-gomp`` wheel's, or a site's ``libdnnl.so.3``), the functions spmdcnn calls
typed against oneDNN 3.x's headers (``oneapi/dnnl/dnnl.h``, ``dnnl_types.h``), one CPU engine and stream, the thread
count of the OpenMP runtime it runs on, and the objects that own its handles (:class:`Owned`) and move an operand
between NumPy's layout and the one a primitive runs on (:class:`Operand`).
"""

import ctypes
import ctypes.util
import os
import site
import sys
import threading

import numpy as np

from .parallel import num_threads
from .scratch import scratch

FAILED = None                           # why the library could not be used, if it could not

# oneDNN's C API (oneapi/dnnl/dnnl_types.h, dnnl_common_types.h, 3.x)
_F32, ANY, _PLAIN = 3, 1, 2            # dnnl_f32; format tags: any, then dnnl_a, dnnl_ab, ... by rank
_CPU, _IN_ORDER = 1, 1
FORWARD_TRAINING, DIRECT = 64, 1
SRC, DST, WEIGHTS, BIAS = 1, 17, 33, 41
DIFF_SRC, DIFF_DST, DIFF_WEIGHTS, DIFF_BIAS = 129, 145, 161, 169
_QUERY_MD = {SRC: 129, DIFF_SRC: 130, WEIGHTS: 131, DIFF_WEIGHTS: 132, DST: 133, DIFF_DST: 134}
_QUERY_IMPLEMENTATION = 8
_RUNTIMES = {1: "sequential", 2: "OpenMP", 4: "TBB", 8: "threadpool"}
ISAS = {0x1: "sse41", 0x3: "avx", 0x7: "avx2", 0xf: "avx2_vnni", 0x1f: "avx2_vnni_2", 0x27: "avx512_core",
         0x67: "avx512_core_vnni", 0xe7: "avx512_core_bf16", 0x1ef: "avx512_core_fp16", 0xfef: "avx512_core_amx",
         0x1fef: "avx512_core_amx_fp16"}
Dims = ctypes.c_int64 * 12             # dnnl_dims_t
_void = ctypes.c_void_p


class _Argument(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", _void)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint), ("gpu_runtime", ctypes.c_uint)]


class Rejected(RuntimeError):
    """oneDNN declined a case (its status in the message): NumPy's paths run it."""


def _candidates():
    """Where ``libdnnl.so.3`` may be: the ``onednn-cpu-gomp`` wheel puts it in the environment's ``lib`` (or the
    user's, for ``pip install --user``); else the system's library path (a site module, ``LD_LIBRARY_PATH``)."""
    prefixes = [sys.prefix, getattr(site, "USER_BASE", None) or ""]
    found = [path for path in (os.path.join(p, "lib", "libdnnl.so.3") for p in prefixes if p) if os.path.exists(path)]
    return found or [ctypes.util.find_library("dnnl") or "libdnnl.so.3"]      # find_library runs ldconfig: last


class Library:
    """The loaded library: its functions typed, one CPU engine and stream, and the OpenMP runtime's thread
    setting."""

    def __init__(self):
        # OpenMP's threads spin after each parallel region before they sleep (GNU's: up to 300,000 spins), taking
        # the cores spmdcnn's own threads need for the passes between convolutions (pooling, activations, batch
        # norm), as OpenBLAS's did (``spmdcnn/__init__.py``). Passive, they sleep at once: CosmoFlow 64^3's steps
        # 20 % faster, AlexNet's and ResNet-50's 0-4 % (``spmdcnn bench``, three and two alternating pairs). Read
        # when the runtime loads, so set here, before the library loads it, and only where the user has not.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        errors = []
        for path in _candidates():
            try:
                self.dll = ctypes.CDLL(path)
                self.path = path
                break
            except OSError as error:
                errors.append(str(error))
        else:
            raise OSError("; ".join(errors) or "libdnnl.so.3 not found")
        dll = self.dll
        dll.dnnl_version.restype = ctypes.POINTER(_Version)
        version = dll.dnnl_version().contents
        self.version = (version.major, version.minor, version.patch)
        self.runtime = _RUNTIMES.get(version.cpu_runtime, str(version.cpu_runtime))
        if version.major < 3:
            raise OSError(f"oneDNN {'.'.join(map(str, self.version))} at {path}: spmdcnn needs 3.x")
        if self.runtime not in ("OpenMP", "sequential"):
            raise OSError(f"oneDNN at {path} runs on {self.runtime}, whose threads spmdcnn cannot set; "
                          "install the onednn-cpu-gomp wheel")
        for name, restype, argtypes in (
                ("dnnl_primitive_desc_query_md", _void, [_void, ctypes.c_int, ctypes.c_int]),
                ("dnnl_primitive_desc_query", ctypes.c_int, [_void, ctypes.c_int, ctypes.c_int, _void]),
                ("dnnl_memory_desc_get_size", ctypes.c_size_t, [_void]),
                ("dnnl_memory_desc_equal", ctypes.c_int, [_void, _void]),
                ("dnnl_memory_desc_create_with_tag", ctypes.c_int,
                 [ctypes.POINTER(_void), ctypes.c_int, Dims, ctypes.c_int, ctypes.c_int]),
                ("dnnl_memory_create", ctypes.c_int, [ctypes.POINTER(_void), _void, _void, _void]),
                ("dnnl_memory_set_data_handle", ctypes.c_int, [_void, _void]),
                ("dnnl_primitive_create", ctypes.c_int, [ctypes.POINTER(_void), _void]),
                ("dnnl_primitive_execute", ctypes.c_int, [_void, _void, ctypes.c_int, ctypes.POINTER(_Argument)]),
                ("dnnl_reorder_primitive_desc_create", ctypes.c_int,
                 [ctypes.POINTER(_void), _void, _void, _void, _void, _void]),
                ("dnnl_convolution_forward_primitive_desc_create", ctypes.c_int,
                 [ctypes.POINTER(_void), _void, ctypes.c_int, ctypes.c_int, _void, _void, _void, _void,
                  Dims, Dims, Dims, Dims, _void]),
                ("dnnl_convolution_backward_data_primitive_desc_create", ctypes.c_int,
                 [ctypes.POINTER(_void), _void, ctypes.c_int, _void, _void, _void,
                  Dims, Dims, Dims, Dims, _void, _void]),
                ("dnnl_convolution_backward_weights_primitive_desc_create", ctypes.c_int,
                 [ctypes.POINTER(_void), _void, ctypes.c_int, _void, _void, _void, _void,
                  Dims, Dims, Dims, Dims, _void, _void]),
                ("dnnl_stream_wait", ctypes.c_int, [_void]),
                ("dnnl_primitive_destroy", ctypes.c_int, [_void]),
                ("dnnl_primitive_desc_destroy", ctypes.c_int, [_void]),
                ("dnnl_memory_destroy", ctypes.c_int, [_void]),
                ("dnnl_memory_desc_destroy", ctypes.c_int, [_void]),
                ("dnnl_get_effective_cpu_isa", ctypes.c_int, [])):
            function = getattr(dll, name)
            function.restype, function.argtypes = restype, argtypes
        self.engine, self.stream = _void(), _void()
        self.check("engine", dll.dnnl_engine_create(ctypes.byref(self.engine), _CPU, ctypes.c_size_t(0)))
        self.check("stream", dll.dnnl_stream_create(ctypes.byref(self.stream), self.engine, ctypes.c_uint(_IN_ORDER)))
        self.set_threads = _openmp_thread_setter() if self.runtime == "OpenMP" else (lambda count: None)
        self.threads = num_threads()            # the process's thread count, as its pool's (read once)

    @staticmethod
    def check(what, status):
        if status != 0:
            raise Rejected(f"oneDNN's {what}: status {status}")

    def created(self, what, function, *arguments):
        """A handle that ``function`` creates (its first argument), or :class:`Rejected`."""
        handle = _void()
        self.check(what, function(ctypes.byref(handle), *arguments))
        return handle

    def desc(self, shape, layout):
        """A float32 memory descriptor of ``shape``: NumPy's contiguous layout, or oneDNN's choice (``ANY``)."""
        tag = ANY if layout == ANY else _PLAIN + len(shape) - 1
        return self.created("memory descriptor", self.dll.dnnl_memory_desc_create_with_tag, len(shape),
                            Dims(*shape), _F32, tag)

    def query(self, descriptor, argument):
        return _void(self.dll.dnnl_primitive_desc_query_md(descriptor, _QUERY_MD[argument], 0))

    def primitive(self, descriptor):
        return self.created("primitive", self.dll.dnnl_primitive_create, descriptor)

    def memory(self, descriptor):
        return self.created("memory", self.dll.dnnl_memory_create, descriptor, self.engine, None)

    def implementation(self, descriptor):
        name = ctypes.c_char_p()
        self.dll.dnnl_primitive_desc_query(descriptor, _QUERY_IMPLEMENTATION, 0, ctypes.byref(name))
        return (name.value or b"?").decode()

    def execute(self, primitive, arguments):
        """Run ``primitive`` on ``arguments`` ((argument, memory) pairs) with this process's threads (set in the
        calling thread: OpenMP's count is a per-thread setting)."""
        self.set_threads(self.threads)
        pairs = (_Argument * len(arguments))(*(_Argument(a, m) for a, m in arguments))
        self.check("execution", self.dll.dnnl_primitive_execute(primitive, self.stream, len(arguments), pairs))
        self.check("execution", self.dll.dnnl_stream_wait(self.stream))


def _openmp_thread_setter():
    """``omp_set_num_threads`` of the OpenMP runtime the library loaded (GNU's or Intel's), found by its soname."""
    for name in ("libgomp.so.1", "libiomp5.so", "libomp.so"):
        try:
            return ctypes.CDLL(name, mode=os.RTLD_NOLOAD).omp_set_num_threads
        except (OSError, AttributeError):
            continue
    return lambda count: None


_library = None
_loading = threading.Lock()


def library():
    """The loaded library, or None (and :data:`FAILED` says why) where it is not installed or not usable."""
    global _library, FAILED
    if _library is None and FAILED is None:
        with _loading:
            if _library is None and FAILED is None:
                try:
                    _library = Library()
                except (OSError, AttributeError, Rejected) as error:
                    FAILED = str(error)
    return _library


class Owned:
    """Keeps the library's handles an object created and destroys them with it (primitives and their JIT code,
    descriptors, memory objects: an evicted shape's are freed once nothing uses it)."""

    def own(self, kind, handle):
        self.__dict__.setdefault("handles", []).append((kind, handle))
        return handle

    def __del__(self):
        try:
            for kind, handle in reversed(self.__dict__.get("handles", ())):
                getattr(self.api.dll, f"dnnl_{kind}_destroy")(handle)
        except Exception:                       # noqa: BLE001 (the interpreter is shutting down)
            pass


class Operand(Owned):
    """One argument of a primitive: NumPy's contiguous layout, the one the primitive runs on, and the reorder
    between them (none where they are the same). ``buffer``: the scratch array the reordered values are in, held
    until :meth:`release` (an array above the scratch buffers' cap is not kept by them, so this is what keeps it
    alive while oneDNN works on it)."""

    def __init__(self, api, plain, chosen, into):
        self.api, self.buffer = api, None
        self.same = bool(api.dll.dnnl_memory_desc_equal(plain, chosen))
        self.plain = self.own("memory", api.memory(plain))
        self.elements = api.dll.dnnl_memory_desc_get_size(chosen) // 4
        self.layout = chosen                    # owned by the primitive's descriptor
        self.chosen = self.plain if self.same else self.own("memory", api.memory(chosen))
        self.reorder = None
        if not self.same:
            source, target = (plain, chosen) if into else (chosen, plain)
            descriptor = self.own("primitive_desc", api.created(
                "reorder", api.dll.dnnl_reorder_primitive_desc_create, source, api.engine, target, api.engine, None))
            self.reorder = self.own("primitive", api.primitive(descriptor))

    def _point(self, array, slot):
        self.api.check("memory handle", self.api.dll.dnnl_memory_set_data_handle(self.plain, array.ctypes.data))
        if not self.same:
            self.buffer = scratch(np, slot, (self.elements,), np.float32)
            self.api.check("memory handle", self.api.dll.dnnl_memory_set_data_handle(self.chosen,
                                                                                      self.buffer.ctypes.data))

    def read(self, array, slot):
        """The memory the primitive reads ``array`` from (reordered into the scratch ``slot``)."""
        self._point(array, slot)
        if not self.same:
            self.api.execute(self.reorder, [(SRC, self.plain), (DST, self.chosen)])
        return self.chosen

    def write(self, array, slot):
        """The memory the primitive writes ``array``'s values to; :meth:`finish` moves them into ``array``."""
        self._point(array, slot)
        return self.chosen

    def agrees(self, other):
        """Whether ``other`` reorders into the same layout (then what this one read serves it too)."""
        return not (self.same or other.same) and bool(self.api.dll.dnnl_memory_desc_equal(self.layout, other.layout))

    def finish(self):
        if not self.same:
            self.api.execute(self.reorder, [(SRC, self.chosen), (DST, self.plain)])

    def release(self):
        self.buffer = None
