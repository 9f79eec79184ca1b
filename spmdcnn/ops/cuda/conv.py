"""Convolution on the GPU as cuDNN graphs (``nvidia-cudnn-frontend``; CuPy 14 has no cuDNN of its own).

Forward (``conv_fprop``), data gradient (``conv_dgrad``) and weight gradient (``conv_wgrad``) are each one graph,
built once per (shapes, geometry, data type, TF32 choice, device) and cached; executing a built graph with new
arrays costs one launch. Any spatial rank: images (NCHW) and volumes (NCDHW) alike. Tensors keep spmdcnn's
channels-first layout and the graphs are told so; a case no engine runs channels first (bfloat16 often wants
channels last) is run on channels-last copies (NHWC or NDHWC, weights KRSC) before falling back.
``paths`` counts the calls per (graph, layout), im2col included: the GPU benchmark reports it.

- Per-side padding: a tile's padding is often one-sided, which many cuDNN engines refuse; the input is then
  padded explicitly up to the symmetric part (forward and weight gradient read the padded copy; the data
  gradient is computed for it and cropped). A transposed convolution's forward is the data gradient alone
  (:func:`input_gradient`).
- The bias is added and its gradient summed by CuPy (fused conv+bias graphs want channels-last layouts).
- float32 convolutions use full float32 arithmetic unless TF32 is allowed (:func:`spmdcnn.backend.tf32_allowed`,
  the job's ``tf32``): without it, engines that round inputs (the TENSOR_CORE and DOWN_CONVERT_INPUTS numerical
  notes) are excluded.
- bfloat16 (ml_dtypes' dtype on CuPy) runs bfloat16 in and out with float32 accumulation; float32 weights (the
  master copy) are rounded to bfloat16 for the call and the weight gradient is returned in float32.
- When cuDNN is missing or no engine supports a case (float64 on some GPUs), the functions here return None
  (once logged) and ``ops.conv`` takes the im2col + cuBLAS path that NumPy uses.
"""

import collections
import functools
import logging
import threading

import numpy

from ...backend import bfloat16, tf32_allowed
from ..saved import ConvSaved
from ..window import output_extent, pad_spatial

log = logging.getLogger("spmdcnn")
_state = threading.local()
_unsupported = set()          # cache keys no cuDNN engine runs: im2col takes them
LAYOUTS = ("nchw", "nhwc")
paths = collections.Counter()  # (fprop | dgrad | wgrad | forward | backward, nchw | nhwc | im2col) -> calls


def _strides(shape, layout):
    """Element strides of a tensor with logical dims ``shape`` (N, C, S... or K, C, k...) stored packed in
    ``layout``: ``nchw`` channels first, ``nhwc`` channels last (N, S..., C), whatever the spatial rank."""
    if layout == "nchw":
        return _packed(shape)
    last = _packed((shape[0],) + tuple(shape[2:]) + (shape[1],))
    return [last[0], 1] + last[1:-1]


def _to(array, layout):
    """A contiguous array holding ``array`` (logical channels first) in ``layout``."""
    import cupy
    return array if layout == "nchw" else cupy.ascontiguousarray(array.transpose((0,) + tuple(range(2, array.ndim))
                                                                                 + (1,)))


def _empty(shape, dtype, layout):
    import cupy
    return cupy.empty(shape if layout == "nchw" else (shape[0],) + tuple(shape[2:]) + (shape[1],), dtype=dtype)


def _back(array, layout):
    """The logical channels-first contiguous array of a result stored in ``layout``."""
    import cupy
    return array if layout == "nchw" else cupy.ascontiguousarray(array.transpose((0, array.ndim - 1)
                                                                                 + tuple(range(1, array.ndim - 1))))


@functools.cache
def _cudnn():
    """The cuDNN frontend module, or None (looked for once)."""
    try:
        import cudnn
    except (ImportError, OSError, RuntimeError):
        return None
    return cudnn


def available():
    """Whether cuDNN's frontend imports (the library itself is loaded on first use)."""
    return _cudnn() is not None


def _handle():
    """This thread's cuDNN handle on the current device, set to the current stream."""
    import cupy
    cudnn = _cudnn()
    device = cupy.cuda.Device().id
    handles = getattr(_state, "handles", None)
    if handles is None:
        handles = _state.handles = {}
    if device not in handles:
        handles[device] = cudnn.create_handle()
    handle = handles[device]
    cudnn.set_stream(handle, cupy.cuda.get_current_stream().ptr)
    return handle


def _cudnn_type(dtype):
    cudnn = _cudnn()
    name = dtype if isinstance(dtype, str) else numpy.dtype(dtype).name
    return {"float32": cudnn.data_type.FLOAT, "float64": cudnn.data_type.DOUBLE,
            "bfloat16": cudnn.data_type.BFLOAT16, "float16": cudnn.data_type.HALF}[name]


def _packed(shape):
    strides, step = [], 1
    for extent in reversed(shape):
        strides.insert(0, step)
        step *= int(extent)
    return strides


class _Graph:
    """One built cuDNN graph, its tensors by role, and the data type of its output."""

    def __init__(self, graph, tensors, out_type, key):
        out_dtype = bfloat16() if out_type == "bfloat16" else numpy.dtype(out_type)
        self.graph, self.tensors, self.out_dtype, self.key = graph, tensors, out_dtype, key
        self.workspace = max(graph.get_workspace_size(), 1)
        self.proven = False           # it ran once: from then on an error is an error, not an unsupported case

    def __call__(self, **arrays):
        """Run on ``arrays`` (by role; contiguous, 16-byte aligned); False when the graph's first run fails
        (the case is then taken by im2col from now on)."""
        import cupy
        workspace = cupy.empty(self.workspace, dtype=cupy.uint8)
        try:
            self.graph.execute({self.tensors[role]: array.data.ptr for role, array in arrays.items()},
                               workspace.data.ptr, handle=_handle())
        except Exception as error:
            if self.proven:
                raise
            _unsupported.add(self.key)
            log.warning("cuDNN failed to run %s (%s)", self.key[:4] + self.key[9:10], error)
            return False
        self.proven = True
        return True


def aligned_contiguous(array):
    """``array`` contiguous and 16-byte aligned (itself where it is already): cuDNN's engines assume both, and a
    parameter's view into the flat parameter array, or a tile's view into a larger one, may be neither."""
    import cupy
    array = cupy.ascontiguousarray(array)
    return array if array.data.ptr % 16 == 0 else array.copy()


def describe(kind, io_type, out_type, x_shape, w_shape, y_shape, padding, stride, dilation, layout="nchw",
             handle=None):
    """The (unbuilt) cuDNN graph of ``kind`` (fprop, dgrad, wgrad) for arrays packed in ``layout`` (nchw, or
    nhwc with KRSC weights), and its tensors by role (x, w, gy, out). Building it needs the GPU; describing it
    does not."""
    cudnn = _cudnn()
    io, out, f32 = _cudnn_type(io_type), _cudnn_type(out_type), _cudnn_type("float32")
    compute = _cudnn_type("float64") if io_type == "float64" else f32
    graph = cudnn.pygraph(handle=handle, name=f"spmdcnn_{kind}", io_data_type=io,
                          intermediate_data_type=compute, compute_data_type=compute)
    attrs = dict(padding=list(padding), stride=list(stride), dilation=list(dilation), compute_data_type=compute)

    def tensor(name, shape):
        return graph.tensor(name=name, dim=list(shape), stride=_strides(shape, layout), data_type=io)
    if kind == "fprop":
        inputs = {"x": tensor("x", x_shape), "w": tensor("w", w_shape)}
        result, shape = graph.conv_fprop(image=inputs["x"], weight=inputs["w"], name="fprop", **attrs), y_shape
    elif kind == "dgrad":
        inputs = {"gy": tensor("gy", y_shape), "w": tensor("w", w_shape)}
        result, shape = graph.conv_dgrad(loss=inputs["gy"], filter=inputs["w"], name="dgrad", **attrs), x_shape
    else:
        inputs = {"x": tensor("x", x_shape), "gy": tensor("gy", y_shape)}
        result, shape = graph.conv_wgrad(image=inputs["x"], loss=inputs["gy"], name="wgrad", **attrs), w_shape
    result.set_output(True).set_data_type(out).set_dim(list(shape)).set_stride(_strides(shape, layout))
    return graph, {**inputs, "out": result}


@functools.lru_cache(maxsize=8192)
def _build(kind, io_type, out_type, x_shape, w_shape, y_shape, padding, stride, dilation, layout, tf32, device):
    """The built graph (cached); raises when no engine runs it."""
    cudnn = _cudnn()
    graph, tensors = describe(kind, io_type, out_type, x_shape, w_shape, y_shape, padding, stride, dilation,
                              layout, handle=_handle())
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    if io_type == "float32" and not tf32:
        graph.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE, cudnn.numerical_note.DOWN_CONVERT_INPUTS])
    graph.check_support()
    graph.build_plans()
    return _Graph(graph, tensors, out_type, (kind, io_type, out_type, x_shape, w_shape, y_shape, padding, stride,
                                             dilation, layout, tf32, device))


def _graph(kind, io_type, out_type, x_shape, w_shape, y_shape, padding, stride, dilation, layout="nchw",
           quiet=False):
    """The cached graph, or None when cuDNN is missing or runs no engine for it (logged once per case, unless
    ``quiet``: a first choice with a second one to try)."""
    import cupy
    if not available():
        return None
    key = (kind, io_type, out_type, tuple(x_shape), tuple(w_shape), tuple(y_shape), padding, stride, dilation,
           layout, tf32_allowed() and io_type == "float32", cupy.cuda.Device().id)
    if key in _unsupported:
        return None
    try:
        return _build(*key)
    except Exception as error:          # cudnnGraphNotSupportedError, or an engine that failed to build
        _unsupported.add(key)
        if not quiet:
            log.warning("cuDNN runs no engine for %s %s x %s (%s, %s): %s", kind, x_shape, w_shape, io_type,
                        layout, error)
        return None


def _symmetric(geometry, kernel):
    """``(extra padding to apply by hand, symmetric padding for cuDNN)``: cuDNN gets the padding both sides
    share, or none where it would be as wide as the (dilated) kernel, which engines refuse."""
    extra, symmetric = [], []
    for (before, after), k, d in zip(geometry.padding, kernel, geometry.dilation):
        shared = min(before, after)
        if shared >= (k - 1) * d + 1:
            shared = 0
        extra.append((before - shared, after - shared))
        symmetric.append(shared)
    return tuple(extra), tuple(symmetric)


def conv_forward(x, w, b, geometry, need_input_grad):
    """``(y, saved)`` through cuDNN (channels first, else channels last), or None when no engine runs it; any
    spatial rank (cuDNN's N-d descriptors)."""
    K, kernel = w.shape[0], w.shape[2:]
    extra, padding = _symmetric(geometry, kernel)
    io_type = x.dtype.name
    xpad = aligned_contiguous(pad_spatial(x, extra))
    wio = aligned_contiguous(w.astype(x.dtype, copy=False))         # bfloat16: round the master weights
    y_shape = xpad.shape[:1] + (K,) + tuple(output_extent(size, k, s, p, p, d) for size, k, s, p, d in
                                            zip(xpad.shape[2:], kernel, geometry.stride, padding, geometry.dilation))
    for layout in LAYOUTS:
        graph = _graph("fprop", io_type, io_type, xpad.shape, w.shape, y_shape, padding, geometry.stride,
                       geometry.dilation, layout, quiet=layout != LAYOUTS[-1])
        y = _empty(y_shape, x.dtype, layout)
        if graph is not None and graph(x=_to(xpad, layout), w=_to(wio, layout), out=y):
            paths["fprop", layout] += 1
            y = _back(y, layout)
            break
    else:
        paths["forward", "im2col"] += 1
        return None
    if b is not None:
        y += b.astype(y.dtype, copy=False).reshape((1, K) + (1,) * len(kernel))
    return y, ConvSaved("cudnn", geometry, x=xpad, w=w, has_bias=b is not None, need_input_grad=need_input_grad,
                        x_shape=x.shape, wio=wio, padding=padding)


def input_gradient(gy, w, x_shape, geometry):
    """The gradient of a convolution's input of ``x_shape`` from ``gy`` alone (a transposed convolution's forward,
    ``ops/conv.conv_input_gradient``) through cuDNN's data gradient, computed for the input padded by the
    padding's one-sided part and cropped; None when no engine runs it."""
    kernel = w.shape[2:]
    extra, padding = _symmetric(geometry, kernel)
    xpad_shape = tuple(x_shape[:2]) + tuple(size + before + after for size, (before, after) in
                                            zip(x_shape[2:], extra))
    gy = aligned_contiguous(gy)
    wio = aligned_contiguous(w.astype(gy.dtype, copy=False))
    io_type = gy.dtype.name
    for layout in LAYOUTS:
        graph = _graph("dgrad", io_type, io_type, xpad_shape, w.shape, gy.shape, padding, geometry.stride,
                       geometry.dilation, layout, quiet=layout != LAYOUTS[-1])
        gxpad = _empty(xpad_shape, gy.dtype, layout)
        if graph is not None and graph(gy=_to(gy, layout), w=_to(wio, layout), out=gxpad):
            paths["dgrad", layout] += 1
            gxpad = _back(gxpad, layout)
            crop = tuple(slice(before, before + size) for size, (before, _) in zip(x_shape[2:], extra))
            return gxpad[(slice(None), slice(None)) + crop]
    paths["dgrad", "im2col"] += 1
    return None


def conv_backward(gy, saved, gw_out):
    """``(gradient of the padded input saved.x or None, gw, gb)`` of a forward that ran on cuDNN, ``gw`` and ``gb``
    in the master weights' type (``gw`` possibly written straight into ``gw_out``); None when no engine runs
    them. ``gy`` is contiguous and aligned (:func:`aligned_contiguous`)."""
    master = saved.w.dtype
    for layout in LAYOUTS:
        gradients = _cudnn_backward(gy, saved.x, saved.wio, master, saved.padding, saved.geometry,
                                    saved.need_input_grad, gw_out, layout)
        if gradients is not None:
            gxpad, gw = gradients
            gb = gy.sum(axis=(0,) + tuple(range(2, gy.ndim)), dtype=master) if saved.has_bias else None
            return gxpad, gw, gb
    paths["backward", "im2col"] += 1
    return None


def _cudnn_backward(gy, xpad, wio, master, padding, geometry, need_input_grad, gw_out, layout):
    """``(gx of the padded input or None, gw in the master type)`` through cuDNN graphs in ``layout``, or None
    when an engine is missing for either."""
    io_type = gy.dtype.name
    args = (xpad.shape, wio.shape, gy.shape, padding, geometry.stride, geometry.dilation, layout)
    quiet = layout != LAYOUTS[-1]
    # the weight gradient straight in the master weights' type where an engine does that, else in the io type
    wgrad = _graph("wgrad", io_type, master.name, *args, quiet=quiet or master.name != io_type) or \
        _graph("wgrad", io_type, io_type, *args, quiet=quiet)
    dgrad = _graph("dgrad", io_type, io_type, *args, quiet=quiet) if need_input_grad else None
    if wgrad is None or (need_input_grad and dgrad is None):
        return None
    gy_in = _to(gy, layout)
    direct = layout == "nchw" and gw_out is not None and gw_out.flags.c_contiguous and \
        gw_out.dtype == wgrad.out_dtype and gw_out.data.ptr % 16 == 0
    gw = gw_out if direct else _empty(wio.shape, wgrad.out_dtype, layout)
    if not wgrad(x=_to(xpad, layout), gy=gy_in, out=gw):
        return None
    gxpad = None
    if need_input_grad:
        gxpad = _empty(xpad.shape, gy.dtype, layout)
        if not dgrad(gy=gy_in, w=_to(wio, layout), out=gxpad):
            return None
        gxpad = _back(gxpad, layout)
        paths["dgrad", layout] += 1
    paths["wgrad", layout] += 1
    return gxpad, _back(gw, layout).astype(master, copy=False)
