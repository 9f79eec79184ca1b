"""Convolutions on oneDNN, the library PyTorch's CPU convolutions run on (the ``onednn`` extra: ``pip install
"spmdcnn[onednn]"``, Intel's ``onednn-cpu-gomp`` wheel; or a site's own oneDNN 3.x, found as ``libdnnl.so.3`` on the
library path), through its C API with ctypes: forward, the input's gradient and the weight's and bias's, float32 on
the host, for every spatial rank (1D to 3D), stride, dilation, per-side padding and group count.

Why: the GEMM formulations of ``ops/conv.py`` (im2col's, the implicit one's) reach 57-79 % of this project's VM's
2048^2 SGEMM rate on ResNet-50's 3x3 layers, oneDNN's direct convolutions 79-119 %: its micro-kernels read the
input where it lies in a blocked layout (16 channels innermost on AVX-512) instead of having a BLAS pack it once per
product (``benchmarks/README.md``, "CPU: oneDNN's convolutions"). No hand-written kernel here could match them.

How: a convolution's shapes and geometry get, once, oneDNN's primitives for the three directions with the layouts
oneDNN picks for them (``format_tag_any``), and reorders between those layouts and NumPy's contiguous ones; a call
reorders its operands into per-thread scratch buffers (``ops/scratch.py``), runs the primitive and reorders its
result out, as PyTorch does for a contiguous NCHW tensor. An operand whose chosen layout is NumPy's own (a
3-channel input) is read in place. The primitives are kept per shape (the last :data:`CACHED` shapes). Before each
call, the OpenMP runtime oneDNN runs on is given this process's thread count (``parallel.num_threads``), so a rank
uses the threads it was given and no more.

Where it does not run, NumPy's paths do (``ops/conv.py``): no library found, ``SPMDCNN_ONEDNN=off``, an array not
float32 (float64 and bfloat16 keep them, so every plan's float64 equivalence is theirs), or a case oneDNN rejects
(the first rejection warns with oneDNN's status). Both keep the float32 error bounds the tests derive.
"""

import ctypes
import ctypes.util
import os
import site
import sys
import threading
import warnings
from collections import OrderedDict

import numpy as np

from .parallel import num_threads
from .saved import ConvSaved
from .scratch import scratch

SWITCHED_OFF = os.environ.get("SPMDCNN_ONEDNN", "").lower() in ("off", "0", "no", "false")
ENABLED = not SWITCHED_OFF              # tests switch it off to run NumPy's paths
CACHED = 256                            # convolution shapes whose primitives are kept
FAILED = None                           # why the library could not be used, if it could not

# oneDNN's C API (oneapi/dnnl/dnnl_types.h, dnnl_common_types.h, 3.x)
_F32, _ANY, _PLAIN = 3, 1, 2            # dnnl_f32; format tags: any, then dnnl_a, dnnl_ab, ... by rank
_CPU, _IN_ORDER = 1, 1
_FORWARD_TRAINING, _DIRECT = 64, 1
SRC, DST, WEIGHTS, BIAS = 1, 17, 33, 41
DIFF_SRC, DIFF_DST, DIFF_WEIGHTS, DIFF_BIAS = 129, 145, 161, 169
_QUERY_MD = {SRC: 129, DIFF_SRC: 130, WEIGHTS: 131, DIFF_WEIGHTS: 132, DST: 133, DIFF_DST: 134}
_QUERY_IMPLEMENTATION = 8
_RUNTIMES = {1: "sequential", 2: "OpenMP", 4: "TBB", 8: "threadpool"}
_ISAS = {0x1: "sse41", 0x3: "avx", 0x7: "avx2", 0xf: "avx2_vnni", 0x1f: "avx2_vnni_2", 0x27: "avx512_core",
         0x67: "avx512_core_vnni", 0xe7: "avx512_core_bf16", 0x1ef: "avx512_core_fp16", 0xfef: "avx512_core_amx",
         0x1fef: "avx512_core_amx_fp16"}
_Dims = ctypes.c_int64 * 12             # dnnl_dims_t
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
    found = [os.path.join(p, "lib", "libdnnl.so.3") for p in prefixes if p]
    return [p for p in found if os.path.exists(p)] + [ctypes.util.find_library("dnnl") or "libdnnl.so.3"]


class _Library:
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
                 [ctypes.POINTER(_void), ctypes.c_int, _Dims, ctypes.c_int, ctypes.c_int]),
                ("dnnl_memory_create", ctypes.c_int, [ctypes.POINTER(_void), _void, _void, _void]),
                ("dnnl_memory_set_data_handle", ctypes.c_int, [_void, _void]),
                ("dnnl_primitive_create", ctypes.c_int, [ctypes.POINTER(_void), _void]),
                ("dnnl_primitive_execute", ctypes.c_int, [_void, _void, ctypes.c_int, ctypes.POINTER(_Argument)]),
                ("dnnl_reorder_primitive_desc_create", ctypes.c_int,
                 [ctypes.POINTER(_void), _void, _void, _void, _void, _void]),
                ("dnnl_convolution_forward_primitive_desc_create", ctypes.c_int,
                 [ctypes.POINTER(_void), _void, ctypes.c_int, ctypes.c_int, _void, _void, _void, _void,
                  _Dims, _Dims, _Dims, _Dims, _void]),
                ("dnnl_convolution_backward_data_primitive_desc_create", ctypes.c_int,
                 [ctypes.POINTER(_void), _void, ctypes.c_int, _void, _void, _void,
                  _Dims, _Dims, _Dims, _Dims, _void, _void]),
                ("dnnl_convolution_backward_weights_primitive_desc_create", ctypes.c_int,
                 [ctypes.POINTER(_void), _void, ctypes.c_int, _void, _void, _void, _void,
                  _Dims, _Dims, _Dims, _Dims, _void, _void]),
                ("dnnl_stream_wait", ctypes.c_int, [_void]),
                ("dnnl_get_effective_cpu_isa", ctypes.c_int, [])):
            function = getattr(dll, name)
            function.restype, function.argtypes = restype, argtypes
        self.engine, self.stream = _void(), _void()
        self.check("engine", dll.dnnl_engine_create(ctypes.byref(self.engine), _CPU, ctypes.c_size_t(0)))
        self.check("stream", dll.dnnl_stream_create(ctypes.byref(self.stream), self.engine, ctypes.c_uint(_IN_ORDER)))
        self.set_threads = _openmp_thread_setter() if self.runtime == "OpenMP" else (lambda count: None)

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
        """A float32 memory descriptor of ``shape``: NumPy's contiguous layout, or oneDNN's choice (``_ANY``)."""
        tag = _ANY if layout == _ANY else _PLAIN + len(shape) - 1
        return self.created("memory descriptor", self.dll.dnnl_memory_desc_create_with_tag, len(shape),
                            _Dims(*shape), _F32, tag)

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
        """Run ``primitive`` on ``arguments`` ((argument, memory) pairs) with this process's threads."""
        self.set_threads(num_threads())
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
                    _library = _Library()
                except (OSError, AttributeError, Rejected) as error:
                    FAILED = str(error)
    return _library


def available():
    return ENABLED and library() is not None


def applies(*arrays):
    """Whether oneDNN runs a convolution of these operands: host float32 arrays, the library loaded."""
    return (all(a is None or (type(a) is np.ndarray and a.dtype == np.float32) for a in arrays)
            and available())


def describe():
    """What runs the host's float32 convolutions, in words (the start-up line of every rank)."""
    if not ENABLED:
        return "NumPy's (oneDNN switched off: SPMDCNN_ONEDNN=off)"
    found = library()
    if found is None:
        return "NumPy's (oneDNN not found: pip install \"spmdcnn[onednn]\")"
    isa = found.dll.dnnl_get_effective_cpu_isa()
    return f"oneDNN {'.'.join(map(str, found.version))} ({found.runtime}, {_ISAS.get(isa, hex(isa))})"


class _Operand:
    """One argument of a primitive: NumPy's contiguous layout, the one the primitive runs on, and the reorder
    between them (none where they are the same)."""

    def __init__(self, api, plain, chosen, into):
        self.api = api
        self.same = bool(api.dll.dnnl_memory_desc_equal(plain, chosen))
        self.plain = api.memory(plain)
        self.elements = api.dll.dnnl_memory_desc_get_size(chosen) // 4
        self.layout = chosen
        self.chosen = self.plain if self.same else api.memory(chosen)
        self.reorder = None
        if not self.same:
            source, target = (plain, chosen) if into else (chosen, plain)
            self.reorder = api.primitive(api.created("reorder", api.dll.dnnl_reorder_primitive_desc_create,
                                                     source, api.engine, target, api.engine, None))

    def read(self, array, slot):
        """The memory the primitive reads ``array`` from (reordered into the scratch ``slot``)."""
        self.api.dll.dnnl_memory_set_data_handle(self.plain, array.ctypes.data)
        if not self.same:
            self.api.dll.dnnl_memory_set_data_handle(self.chosen, scratch(np, slot, (self.elements,), np.float32)
                                                     .ctypes.data)
            self.api.execute(self.reorder, [(SRC, self.plain), (DST, self.chosen)])
        return self.chosen

    def write(self, array, slot):
        """The memory the primitive writes ``array``'s values to; :meth:`finish` moves them into ``array``."""
        self.api.dll.dnnl_memory_set_data_handle(self.plain, array.ctypes.data)
        if not self.same:
            self.api.dll.dnnl_memory_set_data_handle(self.chosen, scratch(np, slot, (self.elements,), np.float32)
                                                     .ctypes.data)
        return self.chosen

    def agrees(self, other):
        """Whether ``other`` reorders into the same layout (then what this one read serves it too)."""
        return not (self.same or other.same) and bool(self.api.dll.dnnl_memory_desc_equal(self.layout, other.layout))

    def finish(self):
        if not self.same:
            self.api.execute(self.reorder, [(SRC, self.chosen), (DST, self.plain)])


class _Convolution:
    """oneDNN's primitives for one convolution: forward at once, the two backward ones on their first call."""

    def __init__(self, api, x_shape, w_shape, geometry, has_bias):
        N, C, K, G = x_shape[0], x_shape[1], w_shape[0], geometry.groups
        kernel = tuple(w_shape[2:])
        self.api, self.lock = api, threading.Lock()
        self.y_shape = (N, K) + tuple(geometry.output_shape(x_shape[2:], kernel))
        weight = w_shape if G == 1 else (G, K // G, C // G) + kernel          # oneDNN's grouped weight, same memory
        self.plain = {SRC: api.desc(x_shape, None), WEIGHTS: api.desc(weight, None), DST: api.desc(self.y_shape, None)}
        self.bias = api.desc((K,), None) if has_bias else None
        self.bias_memory = api.memory(self.bias) if has_bias else None      # the bias, or its gradient
        chosen = {a: api.desc(d, _ANY) for a, d in ((SRC, x_shape), (WEIGHTS, weight), (DST, self.y_shape))}
        self.geometry = tuple(_Dims(*v) for v in (
            geometry.stride, [d - 1 for d in geometry.dilation],
            [p[0] for p in geometry.padding], [p[1] for p in geometry.padding]))
        self.chosen = chosen
        self.forward_descriptor = api.created(
            "convolution forward", api.dll.dnnl_convolution_forward_primitive_desc_create, api.engine,
            _FORWARD_TRAINING, _DIRECT, chosen[SRC], chosen[WEIGHTS], self.bias, chosen[DST], *self.geometry, None)
        self.forward = self._primitive(self.forward_descriptor, {SRC: True, WEIGHTS: True, DST: False})
        self.data = self.weights = None

    def _primitive(self, descriptor, operands):
        """The primitive of ``descriptor`` and its operands (argument: read or written)."""
        plain = {DIFF_SRC: SRC, DIFF_DST: DST, DIFF_WEIGHTS: WEIGHTS}
        return (self.api.primitive(descriptor), self.api.implementation(descriptor),
                {a: _Operand(self.api, self.plain[plain.get(a, a)], self.api.query(descriptor, a), into)
                 for a, into in operands.items()})

    def _backward_data(self):
        if self.data is None:
            descriptor = self.api.created(
                "convolution backward data", self.api.dll.dnnl_convolution_backward_data_primitive_desc_create,
                self.api.engine, _DIRECT, self.chosen[SRC], self.chosen[WEIGHTS], self.chosen[DST], *self.geometry,
                self.forward_descriptor, None)
            self.data = self._primitive(descriptor, {DIFF_DST: True, WEIGHTS: True, DIFF_SRC: False})
        return self.data

    def _backward_weights(self):
        if self.weights is None:
            descriptor = self.api.created(
                "convolution backward weights", self.api.dll.dnnl_convolution_backward_weights_primitive_desc_create,
                self.api.engine, _DIRECT, self.chosen[SRC], self.chosen[WEIGHTS], self.bias, self.chosen[DST],
                *self.geometry, self.forward_descriptor, None)
            self.weights = self._primitive(descriptor, {SRC: True, DIFF_DST: True, DIFF_WEIGHTS: False})
        return self.weights

    def _run(self, step, reads, writes, extra=(), ready=()):
        """Run ``step`` (a primitive and its operands) on ``reads`` and ``writes`` ({argument: array}); ``extra``:
        (argument, array) pairs passed in NumPy's layout (the bias and its gradient); ``ready``: (argument, memory)
        pairs already in the primitive's layout."""
        primitive, _, operands = step
        arguments = list(ready) + [(a, operands[a].read(array, f"onednn.{a}")) for a, array in reads.items()]
        arguments += [(a, operands[a].write(array, f"onednn.{a}")) for a, array in writes.items()]
        for argument, array in extra:
            self.api.dll.dnnl_memory_set_data_handle(self.bias_memory, array.ctypes.data)
            arguments.append((argument, self.bias_memory))
        self.api.execute(primitive, arguments)
        for argument in writes:
            operands[argument].finish()

    def run_forward(self, x, w, b):
        y = np.empty(self.y_shape, np.float32)
        with self.lock:
            self._run(self.forward, {SRC: x, WEIGHTS: w}, {DST: y}, () if b is None else ((BIAS, b),))
        return y

    def run_backward(self, x, w, gy, need_input_grad, gw, gb):
        """The input's gradient (None when not asked for) into a new array, the weight's into ``gw`` and the
        bias's into ``gb`` (when not None)."""
        with self.lock:
            gx, weights = None, self._backward_weights()
            reads, ready = {SRC: x, DIFF_DST: gy}, ()
            if need_input_grad:
                data = self._backward_data()
                gx = np.empty(x.shape, np.float32)
                self._run(data, {DIFF_DST: gy, WEIGHTS: w}, {DIFF_SRC: gx})
                if data[2][DIFF_DST].agrees(weights[2][DIFF_DST]):        # the output gradient reordered once
                    del reads[DIFF_DST]
                    ready = ((DIFF_DST, data[2][DIFF_DST].chosen),)
            self._run(weights, reads, {DIFF_WEIGHTS: gw}, () if gb is None else ((DIFF_BIAS, gb),), ready)
        return gx

    def run_input_gradient(self, gy, w, x_shape):
        gx = np.empty(x_shape, np.float32)
        with self.lock:
            self._run(self._backward_data(), {DIFF_DST: gy, WEIGHTS: w}, {DIFF_SRC: gx})
        return gx

    def implementations(self):
        """The names of the implementations oneDNN chose (forward, and backward ones built so far)."""
        return [step[1] for step in (self.forward, self.data, self.weights) if step is not None]


_cache = OrderedDict()
_cache_lock = threading.Lock()
_warned = False


def convolution(x_shape, w_shape, geometry, has_bias):
    """The cached primitives of a convolution of these shapes, or None where oneDNN rejected it."""
    global _warned
    key = (tuple(x_shape), tuple(w_shape), geometry.stride, geometry.padding, geometry.dilation, geometry.groups,
           has_bias)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    try:
        found = _Convolution(library(), x_shape, w_shape, geometry, has_bias)
    except Rejected as error:
        found = None
        if not _warned:
            _warned = True
            warnings.warn(f"spmdcnn: oneDNN rejected a convolution ({error}: input {tuple(x_shape)}, weight "
                          f"{tuple(w_shape)}, {geometry}); NumPy's paths run it and any others it rejects",
                          RuntimeWarning, stacklevel=3)
    with _cache_lock:
        _cache[key] = found
        while len(_cache) > CACHED:
            _cache.popitem(last=False)          # its handles stay allocated: a few kilobytes
    return found


def _contiguous(array):
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def conv_forward(x, w, b, geometry, need_input_grad):
    """``y, saved`` of ``ops.conv.conv_forward`` on oneDNN, or None where it rejects the case."""
    x, w = _contiguous(x), _contiguous(w)
    found = convolution(x.shape, w.shape, geometry, b is not None)
    if found is None:
        return None
    y = found.run_forward(x, w, None if b is None else _contiguous(b))
    return y, ConvSaved("onednn", geometry, x=x, w=w, has_bias=b is not None, need_input_grad=need_input_grad)


def runs_backward(gy, saved):
    """Whether the gradients of a forward that ran here run here too: a float32 ``gy``, and a weight gradient that
    oneDNN runs with a direct kernel. Where it has none for a case it falls back to its own GEMM-based one
    (``gemm`` in the implementation's name), which NumPy's paths beat: CosmoFlow's 4-channel 2x2x2 first layer at
    128^3 took 213 ms against NumPy's 103 (AlexNet's 11x11/4 and ResNet-50's 7x7/2 first layers, which it runs
    directly, 48 against 69 and 48 against 57)."""
    if not applies(gy):
        return False
    found = convolution(saved.x.shape, saved.w.shape, saved.geometry, saved.has_bias)
    if found is None:
        return False
    with found.lock:
        return "gemm" not in found._backward_weights()[1]


def conv_backward(gy, saved, gw_out=None):
    """``gx, gw, gb`` of a forward that ran here (the weight's gradient in ``gw_out`` when given)."""
    found = convolution(saved.x.shape, saved.w.shape, saved.geometry, saved.has_bias)
    direct = gw_out is not None and gw_out.flags.c_contiguous and gw_out.dtype == np.float32
    gw = gw_out if direct else np.empty(saved.w.shape, np.float32)
    gb = np.empty(saved.w.shape[0], np.float32) if saved.has_bias else None
    gx = found.run_backward(saved.x, saved.w, _contiguous(gy), saved.need_input_grad, gw, gb)
    if gw_out is not None and not direct:
        gw_out[...] = gw
        gw = gw_out
    return gx, gw, gb


def input_gradient(gy, w, x_shape, geometry):
    """The input's gradient alone (``ops.conv.conv_input_gradient``), or None where oneDNN rejects the case."""
    found = convolution(x_shape, w.shape, geometry, False)
    return None if found is None else found.run_input_gradient(_contiguous(gy), _contiguous(w), tuple(x_shape))


def workspace_elements(x_shape, w_shape, y_shape):
    """Elements of the scratch buffers a call holds at most (the memory model's workspace): the input, the output
    and the weight, and backward's gradients of the input and the weight, each in a blocked layout whose channels
    are rounded up to 16 (a weight's input and output channels both)."""
    def blocked(shape, rows):
        return rows * -(-shape[1] // 16) * 16 * int(np.prod(shape[2:], dtype=np.int64))
    weight = blocked(w_shape, -(-w_shape[0] // 16) * 16)
    return 2 * blocked(x_shape, x_shape[0]) + blocked(y_shape, y_shape[0]) + 2 * weight
