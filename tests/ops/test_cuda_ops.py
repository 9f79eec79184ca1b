"""Every op on CuPy arrays (cuDNN convolutions, the fused kernels of ops/cuda) against the NumPy op in float64,
which the other op tests hold to PyTorch: forward, and backward for a random output gradient. float64 on the GPU
agrees to rounding; float32 (and TF32) to their precision. Needs CuPy and a GPU: benchmarks/gpu_check.sh runs
these on the GPU machine."""

import os

import numpy as np
import pytest

from op_cases import CONV_CASES, GROUPED_CASES, POOL_CASES, TRANSPOSE_CASES
from spmdcnn.backend import gpus
from spmdcnn.counters import stream_key
from spmdcnn.ops import (activations, batchnorm, bias, channels, conv, conv_transpose, dice, dropout, groupnorm,
                         layer_scale, linear, loss, pad, pool, prelu, relu, softmax, upsample)
from spmdcnn.runtime.optimizer import SGD


_cupy, _count = gpus()
cp = _cupy if _count else None
# benchmarks/gpu_check.sh sets SPMDCNN_REQUIRE_GPU: there a missing GPU fails instead of skipping
pytestmark = pytest.mark.skipif(cp is None and not os.environ.get("SPMDCNN_REQUIRE_GPU"),
                                reason="needs CuPy and a GPU (run by benchmarks/gpu_check.sh)")
TOLERANCE = {"float64": 1e-10, "float32": 1e-4}
DTYPES = ["float64", "float32"]


def _close(actual, expected, dtype, what, scale=None):
    actual = cp.asnumpy(actual).astype(np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, what
    scale = max(float(np.max(np.abs(expected))) if expected.size else 0.0, 1e-3) if scale is None else scale
    error = float(np.max(np.abs(actual - expected))) if expected.size else 0.0
    assert error <= TOLERANCE[dtype] * scale, f"{what}: max error {error:.3g} (scale {scale:.3g})"


def _rng(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv2d_on_cudnn(case, dtype):
    x_shape, w_shape, stride, padding, dilation, bias = CONV_CASES[case]
    rng = _rng(1)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    b = rng.standard_normal(w_shape[0]) if bias else None
    geometry = conv.ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2)
    y, saved = conv.conv_forward(x, w, b, geometry)
    gy = rng.standard_normal(y.shape)
    gx, gw, gb = conv.conv_backward(gy, saved)
    on = [None if a is None else cp.asarray(a.astype(dtype)) for a in (x, w, b)]
    gw_out = cp.empty(w_shape, dtype=dtype)
    y2, saved2 = conv.conv_forward(*on, geometry)
    assert saved2[0] == "cudnn" or dtype == "float64"       # float64: cuDNN where an engine runs it
    gx2, gw2, gb2 = conv.conv_backward(cp.asarray(gy.astype(dtype)), saved2, gw_out=gw_out)
    assert gw2 is gw_out
    for what, a, e in (("y", y2, y), ("gx", gx2, gx), ("gw", gw2, gw)) + ((("gb", gb2, gb),) if bias else ()):
        _close(a, e, dtype, f"{case} {what}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(GROUPED_CASES))
def test_grouped_conv_on_the_gpu(case, dtype):
    """Grouped and depthwise convolutions on CuPy (cuDNN reads the groups from the weight's channels; im2col's
    per-group products where no engine runs a case) against NumPy, and the input gradient alone."""
    x_shape, w_shape, stride, padding, dilation, bias, groups = GROUPED_CASES[case]
    rng = _rng(7)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    b = rng.standard_normal(w_shape[0]) if bias else None
    geometry = conv.ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2, groups=groups)
    y, saved = conv.conv_forward(x, w, b, geometry)
    gy = rng.standard_normal(y.shape)
    gx, gw, gb = conv.conv_backward(gy, saved)
    on = [None if a is None else cp.asarray(a.astype(dtype)) for a in (x, w, b)]
    y2, saved2 = conv.conv_forward(*on, geometry)
    gx2, gw2, gb2 = conv.conv_backward(cp.asarray(gy.astype(dtype)), saved2, gw_out=cp.empty(w_shape, dtype=dtype))
    gi2 = conv.conv_input_gradient(cp.asarray(gy.astype(dtype)), on[1], x_shape, geometry)
    for what, a, e in (("y", y2, y), ("gx", gx2, gx), ("gw", gw2, gw), ("input gradient", gi2, gx)) + \
            ((("gb", gb2, gb),) if bias else ()):
        _close(a, e, dtype, f"{case} {what}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_conv_transpose_on_the_gpu(dtype):
    """A grouped transposed convolution on CuPy (cuDNN's data gradient reads the groups from the weight) against
    NumPy."""
    rng = _rng(8)
    x, w, b = rng.standard_normal((2, 4, 5, 6)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(6)
    geometry = conv_transpose.geometry(x.shape[2:], w.shape[2:], 2, 1, 1, rank=2, groups=2)
    y, saved = conv_transpose.conv_transpose_forward(x, w, b, geometry)
    gy = rng.standard_normal(y.shape)
    gx, gw, gb = conv_transpose.conv_transpose_backward(gy, saved)
    on = [cp.asarray(a.astype(dtype)) for a in (x, w, b)]
    y2, saved2 = conv_transpose.conv_transpose_forward(*on, geometry)
    gx2, gw2, gb2 = conv_transpose.conv_transpose_backward(cp.asarray(gy.astype(dtype)), saved2)
    for what, a, e in (("y", y2, y), ("gx", gx2, gx), ("gw", gw2, gw), ("gb", gb2, gb)):
        _close(a, e, dtype, f"grouped transposed {what}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(TRANSPOSE_CASES))
def test_conv_transpose_on_the_gpu(case, dtype):
    """The transposed convolution on CuPy (its backward's convolution on cuDNN) against NumPy, the whole tensor
    and a tile that crops past both ends of the full extent."""
    x_shape, w_shape, stride, padding, output_padding, dilation, bias = TRANSPOSE_CASES[case]
    rng = _rng(4)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    b = rng.standard_normal(w_shape[1]) if bias else None
    whole = conv_transpose.geometry(x_shape[2:], w_shape[2:], stride, padding, output_padding, dilation,
                                    rank=len(x_shape) - 2)
    edge = conv_transpose.TransposeGeometry(whole.stride, whole.dilation,
                                            tuple((-1, stop + 1) for _, stop in whole.crop))
    for geometry in (whole, edge):
        y, saved = conv_transpose.conv_transpose_forward(x, w, b, geometry)
        gy = rng.standard_normal(y.shape)
        gx, gw, gb = conv_transpose.conv_transpose_backward(gy, saved)
        on = [None if a is None else cp.asarray(a.astype(dtype)) for a in (x, w, b)]
        y2, saved2 = conv_transpose.conv_transpose_forward(*on, geometry)
        gw_out = cp.empty(w_shape, dtype=dtype)
        gx2, gw2, gb2 = conv_transpose.conv_transpose_backward(cp.asarray(gy.astype(dtype)), saved2, gw_out=gw_out)
        for what, a, e in (("y", y2, y), ("gx", gx2, gx), ("gw", gw2, gw)) + ((("gb", gb2, gb),) if bias else ()):
            _close(a, e, dtype, f"{case} {geometry.crop} {what}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode, align_corners", [("nearest", False), ("linear", False), ("linear", True)])
def test_upsample_on_the_gpu(mode, align_corners, dtype):
    x = _rng(5).standard_normal((2, 3, 4, 5, 3))
    scale = (2, 3, 1)

    def axes(xp, array):
        return [upsample.axis_taps(xp, 2 + a, mode, scale[a], align_corners, x.shape[2 + a], x.shape[2 + a] * scale[a],
                                   (0, x.shape[2 + a] * scale[a]), 0, x.shape[2 + a], array.dtype) for a in range(3)]
    y, saved = upsample.upsample_forward(x, axes(np, x))
    gy = _rng(6).standard_normal(y.shape)
    gx = upsample.upsample_backward(gy, saved)
    on = cp.asarray(x.astype(dtype))
    y2, saved2 = upsample.upsample_forward(on, axes(cp, on))
    gx2 = upsample.upsample_backward(cp.asarray(gy.astype(dtype)), saved2)
    _close(y2, y, dtype, "y")
    _close(gx2, gx, dtype, "gx")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("groups, affine", [(2, True), (4, False)])
def test_groupnorm_on_the_gpu(groups, affine, dtype):
    """A tile of channels 1..3 (cutting a group of 2), its sums per group the whole tensor's, as on the host."""
    rng = _rng(7)
    x = rng.standard_normal((2, 3, 3, 5, 4)) * 2 + 1
    gamma, beta = (rng.standard_normal(3), rng.standard_normal(3)) if affine else (None, None)
    per = 4 // groups
    g0, g1 = 1 // per, -(-4 // per)

    def run(xp, arrays):
        members = groupnorm.group_members(xp, 1, 4, per, g0, g1 - g0)
        return groupnorm.groupnorm_forward(*arrays, members, per * 60)
    y, saved = run(np, (x, gamma, beta))
    gy = rng.standard_normal(y.shape)
    gx, gg, gb = groupnorm.groupnorm_backward(gy, saved)
    y2, saved2 = run(cp, [None if a is None else cp.asarray(a.astype(dtype)) for a in (x, gamma, beta)])
    gx2, gg2, gb2 = groupnorm.groupnorm_backward(cp.asarray(gy.astype(dtype)), saved2)
    for what, a, e in (("y", y2, y), ("gx", gx2, gx)) + ((("ggamma", gg2, gg), ("gbeta", gb2, gb)) if affine else ()):
        _close(a, e, dtype, what)


# ceil mode: the pooling kernels over the extra padding, average pooling's last windows rescaled by CuPy
CEIL_CASE = ((2, 3, 4, 8), (3, 3), (2, 2), ((1, 2), (0, 1)), ((3, 3, 2), (3, 3, 3, 2)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(POOL_CASES) + ["ceil_mode"])
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pooling_kernels(case, kind, dtype):
    x_shape, kernel, stride, padding, counts = POOL_CASES[case] + (None,) if case in POOL_CASES else CEIL_CASE
    x = _rng(2).standard_normal(x_shape)
    if kind == "max":                         # ties: the first maximum of a window wins, on both
        x = np.round(x * 2) / 2
    geometry = pool.PoolGeometry(kernel, stride, padding, rank=len(x_shape) - 2, counts=counts)
    forward, backward = (pool.maxpool_forward, pool.maxpool_backward) if kind == "max" else \
        (pool.avgpool_forward, pool.avgpool_backward)
    y, saved = forward(x, geometry)
    gy = _rng(3).standard_normal(y.shape)
    gx = backward(gy, saved)
    y2, saved2 = forward(cp.asarray(x.astype(dtype)), geometry)
    gx2 = backward(cp.asarray(gy.astype(dtype)), saved2)
    _close(y2, y, dtype, "y")
    _close(gx2, gx, dtype, "gx")
    if kind == "max":
        assert np.array_equal(cp.asnumpy(saved2.argmax), saved.argmax)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("training", [True, False])
def test_batchnorm_kernels(training, dtype):
    rng = _rng(4)
    x = rng.standard_normal((4, 5, 6, 7)) * 3 + 10          # a large mean: the two-pass variance matters
    gamma, beta = rng.standard_normal(5), rng.standard_normal(5)
    stats = rng.random(5), rng.random(5) + 0.5
    means, variances = stats[0].copy(), stats[1].copy()
    y, saved = batchnorm.batchnorm_forward(x, gamma, beta, means, variances, training=training)
    gy = rng.standard_normal(x.shape)
    gx, ggamma, gbeta = batchnorm.batchnorm_backward(gy, saved)
    on = lambda a: cp.asarray(a.astype(dtype))       # noqa: E731
    means2, variances2 = on(stats[0]), on(stats[1])
    y2, saved2 = batchnorm.batchnorm_forward(on(x), on(gamma), on(beta), means2, variances2, training=training)
    gx2, ggamma2, gbeta2 = batchnorm.batchnorm_backward(on(gy), saved2)
    _close(y2, y, dtype, "y")
    _close(gx2, gx, dtype, "gx")
    _close(means2, means, dtype, "running mean")
    _close(variances2, variances, dtype, "running var")
    if training:
        _close(ggamma2, ggamma, dtype, "ggamma")
        _close(gbeta2, gbeta, dtype, "gbeta")


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_kernel_draws_the_host_mask(p):
    """The mask of a tile (start offsets in a larger global tensor) is bit for bit the NumPy one."""
    x = _rng(5).standard_normal((3, 4, 5, 6))
    key = stream_key(7, 3, "drop")
    start, global_shape = (2, 1, 3, 0), (8, 6, 9, 6)
    y, (keep, scale) = dropout.dropout_forward(x, p, key, start, global_shape)
    y2, (keep2, scale2) = dropout.dropout_forward(cp.asarray(x), p, key, start, global_shape)
    assert np.array_equal(cp.asnumpy(keep2), keep) and scale2 == scale
    _close(y2, y, "float64", "y")
    gy = _rng(7).standard_normal(x.shape)
    _close(dropout.dropout_backward(cp.asarray(gy), (keep2, scale2)), dropout.dropout_backward(gy, (keep, scale)),
           "float64", "gx")
    flat = _rng(6).standard_normal((5, 7))                 # linear layers' inputs are 2-D
    keep = dropout.dropout_forward(flat, p, key, (3, 0), (10, 7))[1][0]
    assert np.array_equal(cp.asnumpy(dropout.dropout_forward(cp.asarray(flat), p, key, (3, 0), (10, 7))[1][0]), keep)


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("momentum,decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 1e-3), (0.0, 1e-3)])
def test_sgd_kernel(momentum, decay, nesterov):
    if nesterov and not momentum:
        return
    rng = _rng(8)
    shapes = {"a.weight": (70, 3), "b.bias": (7,)}
    size = 217
    w, g = rng.standard_normal(size), rng.standard_normal(size)
    host = SGD(shapes, np.float64, np, lr=0.1, momentum=momentum, weight_decay=decay, nesterov=nesterov)
    device = SGD(shapes, np.float64, cp, lr=0.1, momentum=momentum, weight_decay=decay, nesterov=nesterov)
    w2, g2 = cp.asarray(w), cp.asarray(g)
    for _ in range(3):
        host.step(w, g)
        device.step(w2, g2)
    _close(w2, w, "float64", "weights")
    if momentum:
        _close(device.velocity.flat, host.velocity.flat, "float64", "momentum")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_per_pixel_on_the_gpu(dtype):
    """The cross-entropy per position, with an ignore_index, and its per-class scores, as on the host."""
    rng = _rng(10)
    logits, labels = rng.standard_normal((2, 4, 5, 3)), rng.integers(0, 4, (2, 5, 3))
    labels[0, 0] = 255
    value, saved = loss.softmax_cross_entropy_forward(logits.astype(dtype), labels, ignore_index=255)
    value2, saved2 = loss.softmax_cross_entropy_forward(cp.asarray(logits.astype(dtype)), cp.asarray(labels),
                                                        ignore_index=255)
    assert abs(value2 - value) <= TOLERANCE[dtype] * 10 and saved2.counted == saved.counted
    _close(loss.softmax_cross_entropy_backward(1.0, saved2), loss.softmax_cross_entropy_backward(1.0, saved), dtype,
           "loss gradient per pixel")
    correct, table = loss.scores(logits, labels, 255, classes=True)
    correct2, table2 = loss.scores(cp.asarray(logits), cp.asarray(labels), 255, classes=True)
    assert correct2 == correct
    np.testing.assert_array_equal(cp.asnumpy(table2), table)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op, attrs", [("sigmoid", ()), ("silu", ()), ("gelu", ("none",)), ("gelu", ("tanh",)),
                                       ("hardswish", ()), ("hardsigmoid", ()), ("relu6", ()),
                                       ("hardtanh", (-2.0, 3.0)), ("elu", (0.7, 1.05, 1.0)), ("mish", ()),
                                       ("clamp", (-2.0, 3.0)), ("clamp", (None, 3.0))])
def test_activations_on_the_gpu(op, attrs, dtype):
    """Each activation forward and backward as on the host (exact GELU: CuPy's erf against Cody's)."""
    rng = _rng(12)
    x, gy = rng.uniform(-8, 9, (2, 3, 40)), rng.standard_normal((2, 3, 40))
    forward, backward = getattr(activations, f"{op}_forward"), getattr(activations, f"{op}_backward")
    y, saved = forward(x.astype(dtype), *attrs)
    y2, saved2 = forward(cp.asarray(x.astype(dtype)), *attrs)
    _close(y2, y, dtype, f"{op} y")
    _close(backward(cp.asarray(gy.astype(dtype)), saved2, *attrs), backward(gy.astype(dtype), saved, *attrs), dtype,
           f"{op} gx")


@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_on_the_gpu(dtype):
    from spmdcnn.ops import layernorm
    rng = _rng(15)
    x, gy = rng.standard_normal((2, 5, 3, 4)) * 2 + 1, rng.standard_normal((2, 5, 3, 4))
    gamma, beta = rng.standard_normal(5), rng.standard_normal(5)
    y, saved = layernorm.layernorm_forward(x, gamma, beta, 5)
    gx, gg, gb = layernorm.layernorm_backward(gy, saved)
    on = [cp.asarray(a.astype(dtype)) for a in (x, gamma, beta)]
    y2, saved2 = layernorm.layernorm_forward(*on, 5)
    gx2, gg2, gb2 = layernorm.layernorm_backward(cp.asarray(gy.astype(dtype)), saved2)
    for what, a, e in (("y", y2, y), ("gx", gx2, gx), ("ggamma", gg2, gg), ("gbeta", gb2, gb)):
        _close(a, e, dtype, what)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mul_on_the_gpu(dtype):
    from spmdcnn.ops import mul
    rng = _rng(14)
    a, b, gy = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 1, 1)), rng.standard_normal((2, 3, 4, 5))
    y, saved = mul.mul_forward(a.astype(dtype), b.astype(dtype))
    y2, saved2 = mul.mul_forward(cp.asarray(a.astype(dtype)), cp.asarray(b.astype(dtype)))
    _close(y2, y, dtype, "y")
    for what, got, want in zip(("ga", "gb"), mul.mul_backward(cp.asarray(gy.astype(dtype)), saved2),
                               mul.mul_backward(gy.astype(dtype), saved)):
        _close(got, want, dtype, what)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_scale_and_stochastic_depth_on_the_gpu(dtype):
    rng = _rng(13)
    x, gy, gamma = rng.standard_normal((6, 3, 4, 5)), rng.standard_normal((6, 3, 4, 5)), rng.standard_normal(3)
    on = lambda a: cp.asarray(a.astype(dtype))       # noqa: E731
    y, saved = layer_scale.layer_scale_forward(x.astype(dtype), gamma.astype(dtype))
    y2, saved2 = layer_scale.layer_scale_forward(on(x), on(gamma))
    _close(y2, y, dtype, "layer scale y")
    for what, a, e in zip(("gx", "ggamma"), layer_scale.layer_scale_backward(on(gy), saved2, on(gamma)),
                          layer_scale.layer_scale_backward(gy.astype(dtype), saved, gamma.astype(dtype))):
        _close(a, e, dtype, f"layer scale {what}")
    key = dropout.stream_key(3, 1, "sd")
    y, saved = dropout.stochastic_depth_forward(x.astype(dtype), 0.4, key, (2, 0, 0, 0), (10, 3, 4, 5))
    y2, saved2 = dropout.stochastic_depth_forward(on(x), 0.4, key, (2, 0, 0, 0), (10, 3, 4, 5))
    _close(y2, y, dtype, "stochastic depth y")
    _close(dropout.stochastic_depth_backward(on(gy), saved2), dropout.stochastic_depth_backward(gy.astype(dtype),
                                                                                                saved), dtype,
           "stochastic depth gx")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, padding", [((2, 4, 5, 6), ((1, 2), (0, 3))), ((1, 6, 3, 4, 5), ((2, 0), (1, 1),
                                                                                             (0, 2)))])
def test_pad_channel_shuffle_space_to_depth_and_group_softmax_on_the_gpu(dtype, shape, padding):
    rng = _rng(19)
    x = rng.standard_normal(shape).astype(dtype)
    y, spatial = pad.pad_forward(x, padding, -0.5)
    y2, spatial2 = pad.pad_forward(cp.asarray(x), padding, -0.5)
    _close(y2, y, dtype, "pad y")
    gy = rng.standard_normal(y.shape).astype(dtype)
    _close(pad.pad_backward(cp.asarray(gy), spatial2, padding), pad.pad_backward(gy, spatial, padding), dtype,
           "pad gx")
    for order in ("channels", "blocks"):
        y, saved = channels.space_to_depth_forward(x[..., :4, :4] if x.ndim == 4 else x[..., :2, :2, :4], 2, order)
        y2, saved2 = channels.space_to_depth_forward(cp.asarray(x[..., :4, :4] if x.ndim == 4 else
                                                                x[..., :2, :2, :4]), 2, order)
        _close(y2, y, dtype, "space to depth y")
        _close(channels.space_to_depth_backward(cp.asarray(y), saved2), channels.space_to_depth_backward(y, saved),
               dtype, "space to depth gx")
    y, saved = softmax.group_softmax_forward(x, 2)
    y2, saved2 = softmax.group_softmax_forward(cp.asarray(x), 2)
    _close(y2, y, dtype, "group softmax y")
    _close(softmax.group_softmax_backward(cp.asarray(x), saved2), softmax.group_softmax_backward(x, saved),
           dtype, "group softmax gx")
    y, saved = channels.channel_shuffle_forward(x, 2)
    y2, saved2 = channels.channel_shuffle_forward(cp.asarray(x), 2)
    _close(y2, y, dtype, "channel shuffle y")
    _close(channels.channel_shuffle_backward(cp.asarray(x), saved2), channels.channel_shuffle_backward(x, saved),
           dtype, "channel shuffle gx")


@pytest.mark.parametrize("dtype", DTYPES)
def test_average_pooling_leaving_the_padding_out_on_the_gpu(dtype):
    """Windows divided by the positions they hold inside the input (``count_include_pad: false``): the counts
    rescale the CUDA kernel's outputs and gradients as they do NumPy's."""
    rng = _rng(23)
    x = rng.standard_normal((2, 3, 7, 6)).astype(dtype)
    counts = tuple(pool.window_counts(0, out, 3, 2, 1, 1 + size) for out, size in ((4, 7), (3, 6)))
    geometry = pool.PoolGeometry((3, 3), (2, 2), 1, counts=counts)
    y, saved = pool.avgpool_forward(x, geometry)
    y2, saved2 = pool.avgpool_forward(cp.asarray(x), pool.PoolGeometry((3, 3), (2, 2), 1, counts=counts))
    _close(y2, y, dtype, "avgpool y")
    gy = rng.standard_normal(y.shape).astype(dtype)
    _close(pool.avgpool_backward(cp.asarray(gy), saved2), pool.avgpool_backward(gy, saved), dtype, "avgpool gx")


@pytest.mark.parametrize("dtype", DTYPES)
def test_adaptive_average_pooling_of_uneven_windows_on_the_gpu(dtype):
    rng = _rng(29)
    x = rng.standard_normal((2, 3, 7, 5, 4)).astype(dtype)
    y, saved = pool.adaptive_avgpool_forward(x, (3, 4, 3))
    y2, saved2 = pool.adaptive_avgpool_forward(cp.asarray(x), (3, 4, 3))
    _close(y2, y, dtype, "adaptive avgpool y")
    gy = rng.standard_normal(y.shape).astype(dtype)
    _close(pool.adaptive_avgpool_backward(cp.asarray(gy), saved2), pool.adaptive_avgpool_backward(gy, saved), dtype,
           "adaptive avgpool gx")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [1, 3])
def test_ops_of_one_weight_per_channel_or_shared_on_the_gpu(dtype, count):
    rng = _rng(31)
    x, gy, weight = rng.standard_normal((4, 3, 5, 6)), rng.standard_normal((4, 3, 5, 6)), rng.uniform(-1, 1, count)
    on = lambda a: cp.asarray(a.astype(dtype))       # noqa: E731
    for op, forward, backward in (("bias", bias.bias_forward, bias.bias_backward),
                                  ("layer scale", layer_scale.layer_scale_forward, layer_scale.layer_scale_backward),
                                  ("prelu", prelu.prelu_forward, prelu.prelu_backward)):
        y, saved = forward(x.astype(dtype), weight.astype(dtype))
        y2, saved2 = forward(on(x), on(weight))
        _close(y2, y, dtype, f"{op} y")
        for what, a, e in zip(("gx", "gweight"), backward(on(gy), saved2, on(weight)),
                              backward(gy.astype(dtype), saved, weight.astype(dtype))):
            _close(a, e, dtype, f"{op} {what}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_dice_loss_on_the_gpu(dtype):
    """Dice's sums per sample and class, and the gradient from a seed, as on the host (ops/dice.py)."""
    rng = _rng(11)
    logits, labels = rng.standard_normal((2, 3, 4, 3, 2)), rng.integers(0, 3, (2, 4, 3, 2))
    labels[1, 0] = -1
    _, saved = loss.softmax_cross_entropy_forward(logits.astype(dtype), labels, total=1)
    _, saved2 = loss.softmax_cross_entropy_forward(cp.asarray(logits.astype(dtype)), cp.asarray(labels), total=1)
    table, table2 = dice.dice_partials(saved), dice.dice_partials(saved2)
    _close(table2, table, dtype, "Dice's sums")
    _, a, b = dice.dice_finish(table, 0.5, include_background=False)
    seed = dice.DiceSeed(0.5 / saved.counted, a, b)
    _close(dice.dice_backward(seed, saved2), dice.dice_backward(seed, saved), dtype, "Dice's gradient")


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_relu_and_loss(dtype):
    rng = _rng(9)
    x, w, b = rng.standard_normal((6, 11)), rng.standard_normal((4, 11)), rng.standard_normal(4)
    labels = np.array([0, 3, 1, -1, 2, 3])                 # -1: a padding sample the loss ignores
    on = lambda a: cp.asarray(a.astype(dtype))       # noqa: E731
    h, saved_h = linear.linear_forward(x, w, b)
    r, saved_r = relu.relu_forward(h)
    value, saved_l = loss.softmax_cross_entropy_forward(r, labels, total=5)
    h2, saved_h2 = linear.linear_forward(on(x), on(w), on(b))
    r2, saved_r2 = relu.relu_forward(h2)
    value2, saved_l2 = loss.softmax_cross_entropy_forward(r2, cp.asarray(labels), total=5)
    assert abs(value2 - value) <= TOLERANCE[dtype] * 10
    gr = loss.softmax_cross_entropy_backward(1.0, saved_l)
    gr2 = loss.softmax_cross_entropy_backward(1.0, saved_l2)
    _close(gr2, gr, dtype, "loss gradient")
    gh, gh2 = relu.relu_backward(gr, saved_r), relu.relu_backward(gr2, saved_r2)
    gx, gw, gb = linear.linear_backward(gh, saved_h)
    gx2, gw2, gb2 = linear.linear_backward(gh2, saved_h2)
    for what, a, e in (("gx", gx2, gx), ("gw", gw2, gw), ("gb", gb2, gb)):
        _close(a, e, dtype, what)


@pytest.mark.parametrize("dtype", DTYPES)
def test_leaky_relu_tanh_scale_and_mse_on_the_gpu(dtype):
    """The element-wise ops of volumes networks and the regression loss, on a volume-shaped array."""
    from spmdcnn.ops import leaky_relu, mse, scale, tanh
    rng = _rng(21)
    x = rng.standard_normal((2, 3, 4, 5, 3))
    gy = rng.standard_normal(x.shape)
    on = lambda a: cp.asarray(a.astype(dtype))       # noqa: E731
    y, mask = leaky_relu.leaky_relu_forward(x, 0.3)
    y2, mask2 = leaky_relu.leaky_relu_forward(on(x), 0.3)
    _close(y2, y, dtype, "leaky relu")
    assert np.array_equal(cp.asnumpy(mask2), mask)
    _close(leaky_relu.leaky_relu_backward(on(gy), mask2, 0.3), leaky_relu.leaky_relu_backward(gy, mask, 0.3), dtype,
           "leaky relu gradient")
    t, saved = tanh.tanh_forward(x)
    t2, saved2 = tanh.tanh_forward(on(x))
    _close(t2, t, dtype, "tanh")
    _close(tanh.tanh_backward(on(gy), saved2), tanh.tanh_backward(gy, saved), dtype, "tanh gradient")
    _close(scale.scale_forward(on(x), 1.2)[0], scale.scale_forward(x, 1.2)[0], dtype, "scale")
    _close(scale.scale_forward(on(x), 1.2, -0.5)[0], scale.scale_forward(x, 1.2, -0.5)[0], dtype, "scale and shift")
    _close(scale.scale_backward(on(gy), None, 1.2), scale.scale_backward(gy, None, 1.2), dtype, "scale gradient")
    p, targets = rng.standard_normal((6, 4)), rng.uniform(-1, 1, (6, 4)).astype(np.float32)
    targets[5] = np.nan                                      # a padding row
    value, saved = mse.mse_loss_forward(p, targets, total=20)
    value2, saved2 = mse.mse_loss_forward(on(p), cp.asarray(targets), total=20)
    assert abs(value2 - value) <= TOLERANCE[dtype] * 10
    _close(mse.mse_loss_backward(1.0, saved2), mse.mse_loss_backward(1.0, saved), dtype, "mse gradient")
