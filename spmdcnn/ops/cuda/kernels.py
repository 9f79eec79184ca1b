"""Fused CuPy kernels for the ops whose NumPy versions are chains of array expressions: pooling, batchnorm,
dropout, the element-wise activations and the SGD update. Each computes exactly what its NumPy counterpart
computes (same formula, same tie rules, same counter-based dropout mask), in one or two launches instead of one per
expression or per sample.

Kernels are compiled on first use (CuPy caches them on disk); this module imports without CuPy. Every kernel is
generic over the array type ``T``; bfloat16 (ml_dtypes' type in CuPy) computes and accumulates in float32 (``A``),
float32 and float64 in their own type.
"""

import functools

import numpy

from ...backend import master_dtype
from ..saved import DropoutSaved, PoolSaved

# ---------------------------------------------------------------------------------------------------------------
# pooling: one thread per output element (forward) or per input element (backward: it gathers from the windows
# that contain it, in a fixed order, so results are deterministic and need no atomics)

def _accumulator(dtype):
    """The C type a kernel computes in for arrays of ``dtype`` (a name): float for bfloat16, else the type."""
    return {"float64": "double", "float32": "float", "bfloat16": "float", "float16": "float"}[dtype]


_WINDOW_PARAMS = ("int32 D, int32 H, int32 W, int32 oD, int32 oH, int32 oW, int32 kD, int32 kH, int32 kW, "
                  "int32 sd, int32 sh, int32 sw, int32 front, int32 top, int32 left")

# Every window is three-dimensional (D, H, W): an image is a volume of depth 1, a sequence one of depth and
# height 1, so one kernel serves every spatial rank.
_OUTPUT_POSITION = """
    const int ow = i % oW; long long t = i / oW; const int oh = t % oH; t /= oH; const int od = t % oD;
    const long long nc = t / oD;
    const int d0 = od * sd - front, h0 = oh * sh - top, w0 = ow * sw - left;
    const long long base = nc * (long long)D * H * W;
"""

_INPUT_POSITION = """
    const int w = i % W; long long t = i / W; const int h = t % H; t /= H; const int d = t % D;
    const long long nc = t / D;
    const long long obase = nc * (long long)oD * oH * oW;
    const int dp = d + front, hp = h + top, wp = w + left;     // position in the padded input
    const int od_lo = dp >= kD ? (dp - kD) / sd + 1 : 0, od_hi = min(dp / sd, oD - 1);
    const int oh_lo = hp >= kH ? (hp - kH) / sh + 1 : 0, oh_hi = min(hp / sh, oH - 1);
    const int ow_lo = wp >= kW ? (wp - kW) / sw + 1 : 0, ow_hi = min(wp / sw, oW - 1);
"""


# kernel bodies: ``A`` is the type they compute in (the builder typedefs it per dtype)
_MAXPOOL_FORWARD = """
    const A minus_inf = (A)__int_as_float(0xff800000);
    A best = minus_inf; int winner = 0;              // padding is -inf: it never wins
    bool nan = false;
    for (int p = 0; p < kD; ++p) {
        const int dd = d0 + p;
        for (int q = 0; q < kH; ++q) {
            const int h = h0 + q;
            for (int r = 0; r < kW; ++r) {
                const int w = w0 + r;
                const A v = (dd >= 0 && dd < D && h >= 0 && h < H && w >= 0 && w < W)
                    ? (A)x[base + ((long long)dd * H + h) * W + w] : minus_inf;
                if (v > best) { best = v; winner = (p * kH + q) * kW + r; }   // strictly: the first maximum wins
                nan |= v != v;
            }
        }
    }
    y = nan ? (T)(A)__int_as_float(0x7fc00000) : (T)best;          // NaN propagates, as in NumPy
    arg = winner;
"""

_MAXPOOL_BACKWARD = """
    A sum = 0;
    for (int od = od_lo; od <= od_hi; ++od)
        for (int oh = oh_lo; oh <= oh_hi; ++oh)
            for (int ow = ow_lo; ow <= ow_hi; ++ow) {
                const long long o = obase + ((long long)od * oH + oh) * oW + ow;
                if ((int)arg[o] == ((dp - od * sd) * kH + (hp - oh * sh)) * kW + (wp - ow * sw)) sum += (A)gy[o];
            }
    gx = (T)sum;
"""

_AVGPOOL_FORWARD = """
    A sum = 0;                                       // the padding counts as zeros
    for (int p = 0; p < kD; ++p) {
        const int dd = d0 + p;
        if (dd < 0 || dd >= D) continue;
        for (int q = 0; q < kH; ++q) {
            const int h = h0 + q;
            if (h < 0 || h >= H) continue;
            for (int r = 0; r < kW; ++r) {
                const int w = w0 + r;
                if (w >= 0 && w < W) sum += (A)x[base + ((long long)dd * H + h) * W + w];
            }
        }
    }
    y = (T)(sum * (A)(1.0 / (kD * kH * kW)));
"""

_AVGPOOL_BACKWARD = """
    A sum = 0;
    for (int od = od_lo; od <= od_hi; ++od)
        for (int oh = oh_lo; oh <= oh_hi; ++oh)
            for (int ow = ow_lo; ow <= ow_hi; ++ow) sum += (A)gy[obase + ((long long)od * oH + oh) * oW + ow];
    gx = (T)(sum * (A)(1.0 / (kD * kH * kW)));
"""


@functools.cache
def _pooling(kind, dtype, index_type=None):
    """The pooling kernel ``kind`` (maxpool_forward, maxpool_backward, avgpool_forward, avgpool_backward) for
    arrays of ``dtype``; max pooling's winners are ``index_type``."""
    import cupy
    inputs, outputs, position, body = {
        "maxpool_forward": ("raw T x", f"T y, {index_type} arg", _OUTPUT_POSITION, _MAXPOOL_FORWARD),
        "maxpool_backward": (f"raw T gy, raw {index_type} arg", "T gx", _INPUT_POSITION, _MAXPOOL_BACKWARD),
        "avgpool_forward": ("raw T x", "T y", _OUTPUT_POSITION, _AVGPOOL_FORWARD),
        "avgpool_backward": ("raw T gy", "T gx", _INPUT_POSITION, _AVGPOOL_BACKWARD)}[kind]
    return cupy.ElementwiseKernel(f"{inputs}, {_WINDOW_PARAMS}", outputs, position + body,
                                  f"spmdcnn_{kind}_{index_type or ''}_{dtype}",
                                  preamble=f"typedef {_accumulator(dtype)} A;")


def _as_volume(values, fill):
    """One value per spatial axis, as three (depth, height, width): ``fill`` for the axes the tensor lacks."""
    return (fill,) * (3 - len(values)) + tuple(values)


def _window_args(geometry, spatial, out):
    """The kernels' arguments for a window over input extents ``spatial`` giving ``out``, as a volume's."""
    befores = tuple(before for before, _ in geometry.padding)
    return (_as_volume(spatial, 1) + _as_volume(out, 1) + _as_volume(geometry.kernel, 1)
            + _as_volume(geometry.stride, 1) + _as_volume(befores, 0))


def maxpool_forward(x, geometry):
    import cupy
    out = geometry.output_shape(x.shape[2:])
    index_type = "uint8" if geometry.positions <= 256 else "uint32"
    y = cupy.empty(x.shape[:2] + out, dtype=x.dtype)
    arg = cupy.empty(x.shape[:2] + out, dtype=index_type)
    kernel = _pooling("maxpool_forward", x.dtype.name, index_type)
    kernel(cupy.ascontiguousarray(x), *_window_args(geometry, x.shape[2:], out), y, arg)
    return y, PoolSaved(x.shape, geometry, arg)


def maxpool_backward(gy, saved):
    import cupy
    x_shape, arg, geometry = saved.x_shape, saved.argmax, saved.geometry
    gx = cupy.empty(x_shape, dtype=gy.dtype)
    kernel = _pooling("maxpool_backward", gy.dtype.name, arg.dtype.name)
    kernel(cupy.ascontiguousarray(gy), arg, *_window_args(geometry, x_shape[2:], gy.shape[2:]), gx)
    return gx


def avgpool_forward(x, geometry):
    import cupy
    out = geometry.output_shape(x.shape[2:])
    y = cupy.empty(x.shape[:2] + out, dtype=x.dtype)
    _pooling("avgpool_forward", x.dtype.name)(cupy.ascontiguousarray(x), *_window_args(geometry, x.shape[2:], out),
                                              y)
    return y, PoolSaved(x.shape, geometry)


def avgpool_backward(gy, saved):
    import cupy
    x_shape, geometry = saved.x_shape, saved.geometry
    gx = cupy.empty(x_shape, dtype=gy.dtype)
    kernel = _pooling("avgpool_backward", gy.dtype.name)
    kernel(cupy.ascontiguousarray(gy), *_window_args(geometry, x_shape[2:], gy.shape[2:]), gx)
    return gx


# ---------------------------------------------------------------------------------------------------------------
# batchnorm (ops/batchnorm.py does the rest): per-channel sums in float64 by reduction kernels over (N, S), the
# normalisation and its gradient element-wise


@functools.cache
def _bn_kernels(dtype):
    import cupy
    x = "(double)(float)" if dtype == "bfloat16" else "(double)"        # bfloat16 converts through float
    sums = cupy.ReductionKernel("T x", "float64 s", f"{x}x", "a + b", "s = a", "0", f"spmdcnn_bn_sum_{dtype}")
    centred_dot = cupy.ReductionKernel(
        "T g, T x, float64 mean", "float64 s", f"{x}g * ({x}x - mean)", "a + b", "s = a", "0",
        f"spmdcnn_bn_centred_dot_{dtype}")
    centred_square = cupy.ReductionKernel(
        "T x, float64 mean", "float64 s", f"({x}x - mean) * ({x}x - mean)", "a + b", "s = a", "0",
        f"spmdcnn_bn_centred_square_{dtype}")
    affine = cupy.ElementwiseKernel("T x, A scale, A shift", "T y", "y = (T)((A)x * scale + shift)",
                                    f"spmdcnn_bn_affine_{dtype}")
    backward = cupy.ElementwiseKernel(
        "T gy, T x, A mean, A k1, A k2, A k3", "T gx", "gx = (T)((A)gy * k1 - ((A)x - mean) * k2 - k3)",
        f"spmdcnn_bn_backward_{dtype}")
    return sums, centred_dot, centred_square, affine, backward


def _channel(v, dtype):
    """A per-channel vector as (1, C, 1) in the accumulation type of arrays of ``dtype``."""
    return v.astype(master_dtype(dtype)).reshape(1, -1, 1)


def bn_sums(x3):
    """Per-channel float64 sums of a (N, C, S) array."""
    return _bn_kernels(x3.dtype.name)[0](x3, axis=(0, 2))


def bn_centred_dot(a3, x3, mean):
    """Per-channel float64 ``sum(a * (x - mean))`` over (N, S)."""
    kernel = _bn_kernels(x3.dtype.name)[1 if a3 is not x3 else 2]
    mean = mean.reshape(1, -1, 1)
    return kernel(a3, x3, mean, axis=(0, 2)) if a3 is not x3 else kernel(x3, mean, axis=(0, 2))


def bn_affine(x3, scale, shift):
    """``x * scale + shift`` per channel, computed in the accumulation type."""
    return _bn_kernels(x3.dtype.name)[3](x3, _channel(scale, x3.dtype), _channel(shift, x3.dtype))


def bn_backward(gy3, x3, mean, k1, k2, k3):
    """``gy * k1 - (x - mean) * k2 - k3`` per channel."""
    return _bn_kernels(gy3.dtype.name)[4](gy3, x3, *(_channel(v, gy3.dtype) for v in (mean, k1, k2, k3)))


# ---------------------------------------------------------------------------------------------------------------
# dropout: the counter-based mask (spmdcnn.counters) computed in the kernel from each element's global index

_SPLITMIX = """
__device__ unsigned long long spmdcnn_mix(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
"""


@functools.cache
def _dropout_forward(ndim):
    import cupy
    decompose = "\n".join(
        f"        {{ const long long c = rest % shape{a}; rest /= shape{a}; g += (c + start{a}) * stride{a}; }}"
        for a in reversed(range(ndim)))
    params = ", ".join(f"int64 shape{a}, int64 start{a}, uint64 stride{a}" for a in range(ndim))
    return cupy.ElementwiseKernel(
        f"T x, uint64 key, uint64 threshold, A scale, {params}", "T y, bool keep",
        f"""
        long long rest = i; unsigned long long g = 0;
{decompose}
        keep = (spmdcnn_mix(g ^ key) >> 11) >= threshold;
        y = keep ? (T)((A)x * scale) : (T)0;
        """, f"spmdcnn_dropout_forward_{ndim}", preamble=_SPLITMIX)


def dropout_forward(x, p, key, start, global_shape, inplace):
    """As :func:`spmdcnn.ops.dropout.dropout_forward` for ``0 < p``: one launch computes mask and output."""
    import cupy
    x = cupy.ascontiguousarray(x)
    start = (0,) * x.ndim if start is None else start
    global_shape = x.shape if global_shape is None else global_shape
    strides, total = [], 1
    for extent in reversed(global_shape):
        strides.insert(0, total)
        total *= int(extent)
    args = [a for axis in range(x.ndim) for a in (x.shape[axis], start[axis], strides[axis])]
    scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
    y = x if inplace else cupy.empty_like(x)
    keep = cupy.empty(x.shape, dtype=bool)
    _dropout_forward(x.ndim)(x, numpy.uint64(key), numpy.uint64(round(p * (1 << 53))),
                             master_dtype(x.dtype).type(scale), *args, y, keep)
    return y, DropoutSaved(keep, scale)


@functools.cache
def _dropout_backward():
    import cupy
    return cupy.ElementwiseKernel("T gy, bool keep, A scale", "T gx", "gx = keep ? (T)((A)gy * scale) : (T)0",
                                  "spmdcnn_dropout_backward")


def dropout_backward(gy, keep, scale):
    return _dropout_backward()(gy, keep, master_dtype(gy.dtype).type(scale))


# ---------------------------------------------------------------------------------------------------------------
# SGD: the whole flat parameter array in one launch


@functools.cache
def _sgd(momentum, nesterov, decay):
    import cupy
    g = "grad + wd * w" if decay else "grad"
    if not momentum:
        code = f"const T g = {g}; w -= lr * g;"
        return cupy.ElementwiseKernel("T grad, T lr, T wd, T mu", "T w", code, "spmdcnn_sgd_plain")
    step = "g + mu * v" if nesterov else "v"
    code = f"const T g = {g}; v = mu * v + g; w -= lr * ({step});"
    return cupy.ElementwiseKernel("T grad, T lr, T wd, T mu", "T w, T v", code,
                                  f"spmdcnn_sgd_{'nesterov' if nesterov else 'momentum'}")


def sgd_update(weights, grads, velocity, lr, momentum, weight_decay, nesterov):
    """``weights`` (and ``velocity``) updated in place from ``grads``: PyTorch's SGD, as runtime.optimizer."""
    kernel = _sgd(bool(momentum), bool(nesterov), bool(weight_decay))
    t = weights.dtype.type
    if momentum:
        kernel(grads, t(lr), t(weight_decay), t(momentum), weights, velocity)
    else:
        kernel(grads, t(lr), t(weight_decay), t(momentum), weights)


# ---------------------------------------------------------------------------------------------------------------
# relu: output and mask in one launch (NumPy's maximum and comparison are two); the gradient in one


@functools.cache
def _relu():
    import cupy
    forward = cupy.ElementwiseKernel(       # NaN stays NaN (NumPy's maximum), so a diverging loss shows
        "T x", "T y, bool positive", "positive = x > (T)0; y = (positive || x != x) ? x : (T)0",
        "spmdcnn_relu_forward")
    backward = cupy.ElementwiseKernel("T gy, bool positive", "T gx", "gx = positive ? gy : (T)0",
                                      "spmdcnn_relu_backward")
    return forward, backward


def relu_forward(x, inplace):
    import cupy
    positive = cupy.empty(x.shape, dtype=bool)
    y = x if inplace else cupy.empty_like(x)
    _relu()[0](x, y, positive)
    return y, positive


def relu_backward(gy, positive):
    return _relu()[1](gy, positive)


# ---------------------------------------------------------------------------------------------------------------
# sums of tensors (add layers, gradients summed back into producer tiles), in the accumulation type


@functools.cache
def _add(dtype):
    import cupy
    A = _accumulator(dtype)
    return cupy.ElementwiseKernel("T x", "T y", f"y = (T)(({A})y + ({A})x)", f"spmdcnn_add_into_{dtype}")


@functools.cache
def _add2(dtype):
    import cupy
    A = _accumulator(dtype)
    return cupy.ElementwiseKernel("T a, T b", "T y", f"y = (T)(({A})a + ({A})b)", f"spmdcnn_add_{dtype}")


def add_into(target, source):
    """``target += source`` (``target`` may be a strided view)."""
    _add(target.dtype.name)(source.astype(target.dtype, copy=False), target)
    return target


def add(a, b):
    return _add2(a.dtype.name)(a, b)


# ---------------------------------------------------------------------------------------------------------------
# leaky relu, tanh and scale: one launch each way, computed in the accumulation type


def _elementwise(inputs, outputs, body, name, dtype):
    """An element-wise kernel over arrays of ``dtype`` computing in ``A`` (its accumulation type, also the type of
    the scalar parameters named ``A``)."""
    import cupy
    scalar = master_dtype(dtype).name
    return cupy.ElementwiseKernel(inputs.replace("A ", f"{scalar} "), outputs, body, f"spmdcnn_{name}_{dtype}",
                                  preamble=f"typedef {_accumulator(dtype)} A;")


@functools.cache
def _leaky_relu(dtype):
    forward = _elementwise("T x, A slope", "T y, bool positive",
                           "positive = (A)x > (A)0; y = positive ? x : (T)((A)x * slope)", "leaky_relu_forward", dtype)
    backward = _elementwise("T gy, bool positive, A slope", "T gx", "gx = positive ? gy : (T)((A)gy * slope)",
                            "leaky_relu_backward", dtype)
    return forward, backward


def leaky_relu_forward(x, negative_slope, inplace):
    import cupy
    positive = cupy.empty(x.shape, dtype=bool)
    y = x if inplace else cupy.empty_like(x)
    _leaky_relu(x.dtype.name)[0](x, master_dtype(x.dtype).type(negative_slope), y, positive)
    return y, positive


def leaky_relu_backward(gy, positive, negative_slope):
    return _leaky_relu(gy.dtype.name)[1](gy, positive, master_dtype(gy.dtype).type(negative_slope))


@functools.cache
def _tanh(dtype):
    forward = _elementwise("T x", "T y", "y = (T)tanh((A)x)", "tanh_forward", dtype)
    backward = _elementwise("T gy, T y", "T gx", "const A v = (A)y; gx = (T)((A)gy * ((A)1 - v * v))",
                            "tanh_backward", dtype)
    return forward, backward


def tanh_forward(x, inplace):
    import cupy
    y = x if inplace else cupy.empty_like(x)
    _tanh(x.dtype.name)[0](x, y)
    return y, y


def tanh_backward(gy, y):
    return _tanh(gy.dtype.name)[1](gy, y)


@functools.cache
def _scale(dtype):
    return _elementwise("T x, A factor", "T y", "y = (T)((A)x * factor)", "scale", dtype)


def scale(x, factor, inplace):
    """``factor * x``, over ``x`` when ``inplace``."""
    import cupy
    y = x if inplace else cupy.empty_like(x)
    _scale(x.dtype.name)(x, master_dtype(x.dtype).type(factor), y)
    return y
