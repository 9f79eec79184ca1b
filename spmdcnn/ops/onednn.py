"""Convolutions on oneDNN, the library PyTorch's CPU convolutions run on (the ``onednn`` extra: ``pip install
"spmdcnn[onednn]"``, Intel's ``onednn-cpu-gomp`` wheel; or a site's own oneDNN 3.x, found as ``libdnnl.so.3`` on the
library path), through its C API with ctypes: forward, the input's gradient and the weight's and bias's, float32 on
the host, for every spatial rank (1D to 3D), stride, dilation, per-side padding and group count.

Why: the GEMM formulations of ``ops/conv.py`` (im2col's, the implicit one's) reach 57-79 % of this project's VM's
2048^2 SGEMM rate on ResNet-50's 3x3 layers, oneDNN's direct convolutions 79-119 %: its micro-kernels read the
input where it lies in a blocked layout (16 channels innermost on AVX-512) instead of having a BLAS pack it once per
product (``benchmarks/README.md``, "CPU: oneDNN's convolutions"). No hand-written kernel here could match them.

How (the C API's binding: ``ops/dnnl.py``): a convolution's shapes and geometry get, once, oneDNN's primitives for the three directions with the layouts
oneDNN picks for them (``format_tag_any``), and reorders between those layouts and NumPy's contiguous ones; a call
reorders its operands into per-thread scratch buffers (``ops/scratch.py``), runs the primitive and reorders its
result out, as PyTorch does for a contiguous NCHW tensor. An operand whose chosen layout is NumPy's own (a
3-channel input) is read in place. The primitives are kept per shape (the last :data:`CACHED` shapes). Before each
call, the OpenMP runtime oneDNN runs on is given this process's thread count (``parallel.num_threads``), so a rank
uses the threads it was given and no more.

Where it does not run, NumPy's paths do (``ops/conv.py``): no library found, ``SPMDCNN_ONEDNN=off``, an array not
float32 (float64 and bfloat16 keep them, so every plan's float64 equivalence is theirs), a case oneDNN declines
(the first one warns with oneDNN's status), and the gradients of a convolution whose weight gradient oneDNN would
run on its GEMM fallback (:func:`conv_backward`). Both keep the float32 error bounds the tests derive.
"""

import os
import threading
import warnings
from collections import OrderedDict

import numpy as np

from . import dnnl
from .dnnl import (ANY, BIAS, DIFF_BIAS, DIFF_DST, DIFF_SRC, DIFF_WEIGHTS, DIRECT, DST, FORWARD_TRAINING, ISAS, SRC,
                   WEIGHTS, Dims, Operand, Owned, Rejected, library)
from .saved import ConvSaved

SWITCHED_OFF = os.environ.get("SPMDCNN_ONEDNN", "").lower() in ("off", "0", "no", "false")
ENABLED = not SWITCHED_OFF              # tests switch it off to run NumPy's paths
CACHED = 256                            # convolution shapes whose primitives are kept


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
        return f"NumPy's (oneDNN not usable: {dnnl.FAILED}; pip install \"spmdcnn[onednn]\")"
    isa = found.dll.dnnl_get_effective_cpu_isa()
    return f"oneDNN {'.'.join(map(str, found.version))} ({found.runtime}, {ISAS.get(isa, hex(isa))})"


class _Convolution(Owned):
    """oneDNN's primitives for one convolution: forward at once, each backward one on its first call (None where
    oneDNN declines it, and then NumPy's paths run that direction)."""

    def __init__(self, api, x_shape, w_shape, geometry, has_bias):
        self.api, self.lock = api, threading.Lock()
        N, C, K, G = x_shape[0], x_shape[1], w_shape[0], geometry.groups
        kernel = tuple(w_shape[2:])
        self.y_shape = (N, K) + tuple(geometry.output_shape(x_shape[2:], kernel))
        weight = w_shape if G == 1 else (G, K // G, C // G) + kernel          # oneDNN's grouped weight, same memory
        shapes = {SRC: x_shape, WEIGHTS: weight, DST: self.y_shape}
        self.plain = {a: self.own("memory_desc", api.desc(shape, None)) for a, shape in shapes.items()}
        self.chosen = {a: self.own("memory_desc", api.desc(shape, ANY)) for a, shape in shapes.items()}
        self.bias = self.own("memory_desc", api.desc((K,), None)) if has_bias else None
        self.bias_memory = self.own("memory", api.memory(self.bias)) if has_bias else None   # the bias, or its gradient
        self.x_shape, self.w_shape, self.geometry = tuple(x_shape), tuple(w_shape), geometry
        self.dims = tuple(Dims(*v) for v in (                              # strides, dilations - 1, paddings
            geometry.stride, [d - 1 for d in geometry.dilation],
            [p[0] for p in geometry.padding], [p[1] for p in geometry.padding]))
        self.forward_descriptor = self.own("primitive_desc", api.created(
            "convolution forward", api.dll.dnnl_convolution_forward_primitive_desc_create, api.engine,
            FORWARD_TRAINING, DIRECT, self.chosen[SRC], self.chosen[WEIGHTS], self.bias, self.chosen[DST],
            *self.dims, None))
        self.forward = self._primitive(self.forward_descriptor, {SRC: True, WEIGHTS: True, DST: False})
        self.data = self.weights = None         # built on first use; False where oneDNN declined

    def _primitive(self, descriptor, operands):
        """The primitive of ``descriptor``, its implementation's name and its operands (argument: read or
        written)."""
        plain = {DIFF_SRC: SRC, DIFF_DST: DST, DIFF_WEIGHTS: WEIGHTS}
        return (self.own("primitive", self.api.primitive(descriptor)), self.api.implementation(descriptor),
                {a: Operand(self.api, self.plain[plain.get(a, a)], self.api.query(descriptor, a), into)
                 for a, into in operands.items()})

    def _backward(self, which):
        """The backward-data (``data``) or backward-weights (``weights``) step, built on first use; None where
        oneDNN declines it (warned once)."""
        if getattr(self, which) is None:
            api, chosen = self.api, self.chosen
            try:
                if which == "data":
                    descriptor = self.own("primitive_desc", api.created(
                        "convolution backward data", api.dll.dnnl_convolution_backward_data_primitive_desc_create,
                        api.engine, DIRECT, chosen[SRC], chosen[WEIGHTS], chosen[DST], *self.dims,
                        self.forward_descriptor, None))
                    step = self._primitive(descriptor, {DIFF_DST: True, WEIGHTS: True, DIFF_SRC: False})
                else:
                    descriptor = self.own("primitive_desc", api.created(
                        "convolution backward weights",
                        api.dll.dnnl_convolution_backward_weights_primitive_desc_create, api.engine, DIRECT,
                        chosen[SRC], chosen[WEIGHTS], self.bias, chosen[DST], *self.dims,
                        self.forward_descriptor, None))
                    step = self._primitive(descriptor, {SRC: True, DIFF_DST: True, DIFF_WEIGHTS: False})
            except Rejected as error:
                _declined(error, self.x_shape, self.w_shape, self.geometry)
                step = False
            setattr(self, which, step)
        return getattr(self, which) or None

    def _run(self, step, reads, writes, extra=(), ready=()):
        """Run ``step`` (a primitive and its operands) on ``reads`` and ``writes`` ({argument: array}); ``extra``:
        (argument, array) pairs passed in NumPy's layout (the bias and its gradient); ``ready``: (argument, memory)
        pairs already in the primitive's layout."""
        primitive, _, operands = step
        arguments = list(ready) + [(a, operands[a].read(array, f"onednn.{a}")) for a, array in reads.items()]
        arguments += [(a, operands[a].write(array, f"onednn.{a}")) for a, array in writes.items()]
        for argument, array in extra:
            self.api.check("memory handle", self.api.dll.dnnl_memory_set_data_handle(self.bias_memory,
                                                                                      array.ctypes.data))
            arguments.append((argument, self.bias_memory))
        self.api.execute(primitive, arguments)
        for argument in writes:
            operands[argument].finish()

    def _released(self, *steps):
        for step in steps:
            for operand in step[2].values():
                operand.release()

    def run_forward(self, x, w, b):
        y = np.empty(self.y_shape, np.float32)
        with self.lock:
            try:
                self._run(self.forward, {SRC: x, WEIGHTS: w}, {DST: y}, () if b is None else ((BIAS, b),))
            finally:
                self._released(self.forward)
        return y

    def runs_backward(self, need_input_grad):
        """Whether both gradients run here: oneDNN builds them, and its weight gradient is a direct kernel."""
        with self.lock:
            weights = self._backward("weights")
            data = self._backward("data") if need_input_grad else True
        return bool(weights and data) and "gemm" not in weights[1]

    def run_backward(self, x, w, gy, need_input_grad, gw, gb):
        """The input's gradient (None when not asked for) into a new array, the weight's into ``gw`` and the
        bias's into ``gb`` (when not None); both steps built (:meth:`runs_backward`)."""
        with self.lock:
            gx, data, weights = None, self.data, self.weights
            reads, ready = {SRC: x, DIFF_DST: gy}, ()
            try:
                if need_input_grad:
                    gx = np.empty(x.shape, np.float32)
                    self._run(data, {DIFF_DST: gy, WEIGHTS: w}, {DIFF_SRC: gx})
                    if data[2][DIFF_DST].agrees(weights[2][DIFF_DST]):    # the output gradient reordered once
                        del reads[DIFF_DST]
                        ready = ((DIFF_DST, data[2][DIFF_DST].chosen),)
                self._run(weights, reads, {DIFF_WEIGHTS: gw}, () if gb is None else ((DIFF_BIAS, gb),), ready)
            finally:
                self._released(weights, *([data] if need_input_grad else []))
        return gx

    def run_input_gradient(self, gy, w, x_shape):
        """The input's gradient alone, or None where oneDNN declines its primitive."""
        if gy.shape != self.y_shape or tuple(x_shape) != self.x_shape:
            raise ValueError(f"oneDNN: output gradient {gy.shape} for an input of {tuple(x_shape)}; expected "
                             f"{self.y_shape} for {self.x_shape}")
        with self.lock:
            data = self._backward("data")
            if data is None:
                return None
            gx = np.empty(x_shape, np.float32)
            try:
                self._run(data, {DIFF_DST: gy, WEIGHTS: w}, {DIFF_SRC: gx})
            finally:
                self._released(data)
        return gx

    def implementations(self):
        """The names of the implementations oneDNN chose (forward, and backward ones built so far)."""
        return [step[1] for step in (self.forward, self.data, self.weights) if step]


_cache = OrderedDict()
_cache_lock = threading.Lock()
_warned = False


def _declined(error, x_shape, w_shape, geometry):
    """Warn, once a process, that oneDNN declined a case NumPy's paths run instead."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"spmdcnn: oneDNN declined a convolution ({error}: input {tuple(x_shape)}, weight "
                      f"{tuple(w_shape)}, {geometry}); NumPy's paths run it and any others it declines",
                      RuntimeWarning, stacklevel=4)


def convolution(x_shape, w_shape, geometry, has_bias):
    """The cached primitives of a convolution of these shapes, or None where oneDNN declined its forward."""
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
        _declined(error, x_shape, w_shape, geometry)
    with _cache_lock:
        _cache[key] = found
        while len(_cache) > CACHED:
            _cache.popitem(last=False)          # its handles are destroyed with it once no call holds it
    return found


def _contiguous(array):
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def conv_forward(x, w, b, geometry, need_input_grad):
    """``y, saved`` of ``ops.conv.conv_forward`` on oneDNN, or None where it declines the case."""
    x, w = _contiguous(x), _contiguous(w)
    found = convolution(x.shape, w.shape, geometry, b is not None)
    if found is None:
        return None
    y = found.run_forward(x, w, None if b is None else _contiguous(b))
    return y, ConvSaved("onednn", geometry, x=x, w=w, has_bias=b is not None, need_input_grad=need_input_grad)


def conv_backward(gy, saved, gw_out=None):
    """``gx, gw, gb`` of a forward that ran here (the weight's gradient in ``gw_out`` when given), or None where
    they do not run here: a ``gy`` not float32, backward primitives oneDNN declines, or a weight gradient it would
    run on its GEMM fallback (``gemm`` in the implementation's name) rather than a direct kernel, which NumPy's
    paths beat: CosmoFlow's 4-channel 2x2x2 first layer at 128^3 took 213 ms there against NumPy's 103 (AlexNet's
    11x11/4 and ResNet-50's 7x7/2 first layers, which it runs directly, 48 against 69 and 48 against 57)."""
    if not applies(gy):
        return None
    found = convolution(saved.x.shape, saved.w.shape, saved.geometry, saved.has_bias)
    if found is None or not found.runs_backward(saved.need_input_grad):
        return None
    direct = gw_out is not None and gw_out.flags.c_contiguous and gw_out.dtype == np.float32
    gw = gw_out if direct else np.empty(saved.w.shape, np.float32)
    gb = np.empty(saved.w.shape[0], np.float32) if saved.has_bias else None
    gx = found.run_backward(saved.x, saved.w, _contiguous(gy), saved.need_input_grad, gw, gb)
    if gw_out is not None and not direct:
        gw_out[...] = gw
        gw = gw_out
    return gx, gw, gb


def input_gradient(gy, w, x_shape, geometry):
    """The input's gradient alone (``ops.conv.conv_input_gradient``), or None where oneDNN declines the case."""
    found = convolution(x_shape, w.shape, geometry, False)
    return None if found is None else found.run_input_gradient(_contiguous(gy), _contiguous(w), tuple(x_shape))


def workspace_elements(x_shape, w_shape, y_shape):
    """Elements of the scratch buffers a convolution's calls hold at most (the memory model's workspace): the
    input, the output and the weight, and backward's gradients of each, in blocked layouts whose channels are
    rounded up to 16 (a weight's input and output channels both; AVX-512's blocks, AVX2's are 8). An upper bound:
    an operand oneDNN reads in NumPy's layout (a 3-channel input) has no copy."""
    def blocked(shape, rows):
        return rows * -(-shape[1] // 16) * 16 * int(np.prod(shape[2:], dtype=np.int64))
    weight = blocked(w_shape, -(-w_shape[0] // 16) * 16)
    return 2 * blocked(x_shape, x_shape[0]) + 2 * blocked(y_shape, y_shape[0]) + 2 * weight
