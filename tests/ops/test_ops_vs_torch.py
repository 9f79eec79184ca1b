"""Every op's forward and backward against ``torch.nn.functional`` on the same inputs, float64 and float32.

PyTorch gets ``y`` and, through autograd on ``sum(y * R)``, the gradients that spmdcnn's backward must return for
``gy = R``. Per-side padding, which PyTorch's ops do not take, goes through ``F.pad`` first.

The BLAS ops (conv2d's forward, data and weight gradients, linear) in float32 are held to the worst-case bound of
a sum, which no summation order (no BLAS kernel, blocking or thread split) can break: against PyTorch in float64
on the same float32 inputs, every element within ``gamma_K * M`` (tests/float32_bounds.py), K the number of
terms of its sum, M the sum of their absolute values. The other ops in float32 (NumPy's own loops) are compared
with PyTorch's float32 within ``TOLERANCE``.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from float32_bounds import conv_lengths, gamma, linear_lengths
from spmdcnn.ops import im2col
from spmdcnn.ops.add import add_backward, add_forward
from spmdcnn.ops.batchnorm import batchnorm_backward, batchnorm_forward
from spmdcnn.ops.concat import concat_backward, concat_forward
from spmdcnn.ops.conv import ConvGeometry, conv_backward, conv_forward
from spmdcnn.ops.flatten import flatten_backward, flatten_forward
from spmdcnn.ops.linear import linear_backward, linear_forward
from spmdcnn.ops.loss import scores, softmax_cross_entropy_backward, softmax_cross_entropy_forward
from spmdcnn.ops.pool import (PoolGeometry, avgpool_backward, avgpool_forward, global_avgpool_backward,
                              global_avgpool_forward, maxpool_backward, maxpool_forward)
from spmdcnn.ops.leaky_relu import leaky_relu_backward, leaky_relu_forward
from spmdcnn.ops.mse import absolute_errors, mse_loss_backward, mse_loss_forward
from spmdcnn.ops.relu import relu_backward, relu_forward
from spmdcnn.ops.scale import scale_backward, scale_forward
from spmdcnn.ops.tanh import tanh_backward, tanh_forward
from spmdcnn.ops.window import sides
from op_cases import CONV_CASES, POOL_CASES

TOLERANCE = {np.float64: 1e-10, np.float32: 1e-5}
DTYPES = [np.float64, np.float32]


def assert_close(actual, expected, dtype, what="value"):
    """Equal up to ``TOLERANCE[dtype]`` relative to the element and to the largest magnitude of ``expected``."""
    expected = np.asarray(expected)
    assert actual is not None, f"{what}: missing"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == np.dtype(dtype), f"{what}: dtype {actual.dtype}, expected {np.dtype(dtype)}"
    tol = TOLERANCE[dtype]
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale, err_msg=what)


def torch_run(function, inputs, R):
    """``y = function(*inputs)`` in PyTorch and the gradient of ``sum(y * R)`` wrt every input."""
    tensors = [torch.tensor(a, requires_grad=True) for a in inputs]
    y = function(*tensors)
    (y * torch.from_numpy(R)).sum().backward()
    return y.detach().numpy(), [t.grad.numpy() for t in tensors]


# ------------------------------------------------------------- float32 BLAS ops: the worst-case rounding bound

# Terms beyond those of the sum, in the worst-case bound ``gamma_(K + 1) * M``: the float64 reference's own
# error, at most gamma_K(2**-53) * M, is below u * M (one float32 rounding) for any K < 2**29.
REFERENCE_ROUNDING = 1


def assert_within_rounding(actual, exact, magnitude, terms, what):
    """float32 ``actual`` within ``gamma_(terms + REFERENCE_ROUNDING) * magnitude`` of ``exact``, element-wise:
    the worst case of a sum of ``terms`` float32 roundings, in any order (an element of magnitude 0 is exact)."""
    assert actual is not None, f"{what}: missing"
    assert actual.shape == exact.shape, f"{what}: shape {actual.shape} != {exact.shape}"
    assert actual.dtype == np.float32, f"{what}: dtype {actual.dtype}, expected float32"
    bound = gamma(terms + REFERENCE_ROUNDING) * magnitude
    error = np.abs(actual.astype(np.float64) - exact)
    beyond = error > bound
    if beyond.any():
        i = np.unravel_index(np.argmax(np.where(beyond, error - bound, -np.inf)), error.shape)
        ratio = error[i] / bound[i] if bound[i] else np.inf
        raise AssertionError(f"{what}: {int(beyond.sum())} elements beyond gamma_{terms + REFERENCE_ROUNDING} * M; "
                             f"at {tuple(map(int, i))}: error {error[i]:.3e} > bound {bound[i]:.3e} "
                             f"(ratio {ratio:.2f})")


def exact_and_magnitude(function, inputs, R):
    """``torch_run`` in float64 on the given (float32) values: ``(y, grads)`` exact up to float64 rounding; and
    the same on ``|inputs|`` and ``|R|``: ``(M_y, M_grads)``, the sum of ``|terms|`` behind every element (the BLAS
    ops are sums of products, linear in each input: their value on absolute values adds the terms' magnitudes)."""
    as64 = [np.asarray(a, dtype=np.float64) for a in inputs]
    exact = torch_run(function, as64, R.astype(np.float64))
    magnitude = torch_run(function, [np.abs(a) for a in as64], np.abs(R).astype(np.float64))
    return exact, magnitude


def blas_reference(function, inputs, R, dtype, terms):
    """``{result: (expected, magnitude, terms)}`` for ``y`` and the gradients ``gx, gw[, gb]`` of a BLAS op
    (inputs ``x, w[, b]``); ``terms`` maps each result to the number of terms of its sums.

    float64: PyTorch's float64 (``magnitude`` None: ``TOLERANCE`` applies). float32: PyTorch's float64 on the same
    float32 values and the magnitudes of the worst-case rounding bound."""
    names = ("y", "gx", "gw", "gb")[:len(inputs) + 1]
    if dtype == np.float64:
        y, grads = torch_run(function, inputs, R)
        return {name: (value, None, None) for name, value in zip(names, [y] + grads)}
    (y, grads), (M_y, M_grads) = exact_and_magnitude(function, inputs, R)
    return {name: (value, magnitude, terms[name])
            for name, value, magnitude in zip(names, [y] + grads, [M_y] + M_grads)}


def assert_expected(actual, expected, dtype, what):
    """``actual`` against an entry of :func:`blas_reference`."""
    value, magnitude, terms = expected
    if magnitude is None:
        assert_close(actual, value, dtype, what)
    else:
        assert_within_rounding(actual, value, magnitude, terms, what)


def random(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def torch_pad(x, padding, value=0.0):
    """``x`` padded per side along its spatial axes (F.pad lists the last axis first)."""
    pads = sides(padding, x.dim() - 2)
    return F.pad(x, tuple(p for pair in reversed(pads) for p in pair), value=value)


def torch_op(name, rank):
    """PyTorch's ``<name><rank>d`` function (conv2d, max_pool3d, ...)."""
    return getattr(F, f"{name}{rank}d")


# ------------------------------------------------------------------------------------------------- conv2d



def torch_conv(stride, padding, dilation):
    def run(x, w, b=None):
        return torch_op("conv", x.dim() - 2)(torch_pad(x, padding), w, b, stride=stride, dilation=dilation)
    return run


def conv_inputs(case, dtype, seed=0):
    """``x, w, b, geometry, R`` for one case."""
    x_shape, w_shape, stride, padding, dilation, bias = CONV_CASES[case]
    rng = np.random.default_rng(seed)
    x, w = random(rng, x_shape, dtype), random(rng, w_shape, dtype)
    b = random(rng, w_shape[0], dtype) if bias else None
    geometry = ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2)
    out = geometry.output_shape(x_shape[2:], w_shape[2:])
    R = random(rng, (x_shape[0], w_shape[0]) + out, dtype)
    return x, w, b, geometry, R


def conv_reference(case, dtype, seed=0):
    """Inputs, ``R`` and PyTorch's ``y, [gx, gw, gb]`` for one case, in ``dtype``."""
    x, w, b, geometry, R = conv_inputs(case, dtype, seed)
    inputs = [x, w] + ([b] if b is not None else [])
    y, grads = torch_run(torch_conv(geometry.stride, CONV_CASES[case][3], geometry.dilation), inputs, R)
    return (x, w, b, geometry, R), y, grads + ([] if b is not None else [None])


def check_conv(case, dtype, need_input_grad=True, gw_out=None, seed=0):
    x, w, b, geometry, R = conv_inputs(case, dtype, seed)
    terms = conv_lengths(x.shape, w.shape, R.shape)
    terms["y"] += b is not None                              # the bias is one more term of each output
    expected = blas_reference(torch_conv(geometry.stride, CONV_CASES[case][3], geometry.dilation),
                              [x, w] + ([b] if b is not None else []), R, dtype, terms)
    x_copy, w_copy = x.copy(), w.copy()
    y, saved = conv_forward(x, w, b, geometry, need_input_grad=need_input_grad)
    assert_expected(y, expected["y"], dtype, "y")
    gx, gw, gb = conv_backward(R, saved, gw_out=gw_out)
    if need_input_grad:
        assert_expected(gx, expected["gx"], dtype, "gx")
    else:
        assert gx is None
    assert_expected(gw, expected["gw"], dtype, "gw")
    if b is None:
        assert gb is None
    else:
        assert_expected(gb, expected["gb"], dtype, "gb")
    np.testing.assert_array_equal(x, x_copy, err_msg="conv2d changed its input")
    np.testing.assert_array_equal(w, w_copy, err_msg="conv2d changed its weight")
    return gw


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv(case, dtype):
    check_conv(case, dtype)


@pytest.mark.parametrize("case", ["pointwise", "stride1_dilated_per_side", "strided_rect", "volume_strided_odd"])
def test_conv_without_input_gradient(case):
    check_conv(case, np.float64, need_input_grad=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["pointwise", "stride1_3x3_pad1", "strided_dilated_per_side", "volume_3x3x3_pad1"])
def test_conv_writes_weight_gradient_into_gw_out(case, dtype):
    w_shape = CONV_CASES[case][1]
    gw_out = np.full(w_shape, np.nan, dtype=dtype)   # stale content must be overwritten, not added to
    gw = check_conv(case, dtype, gw_out=gw_out)
    assert np.shares_memory(gw, gw_out)
    np.testing.assert_array_equal(gw_out, gw)


def set_block(monkeypatch, case, block, dtype):
    """Make the column buffer hold ``block`` samples; the case's batch is padded to 5 samples."""
    x_shape, w_shape, stride, padding, dilation, _ = CONV_CASES[case]
    geometry = ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2)
    itemsize = np.dtype(dtype).itemsize
    layout = im2col.Layout((5,) + x_shape[1:], w_shape[2:], geometry, itemsize)
    per_sample = x_shape[1] * int(np.prod(w_shape[2:])) * layout.P * itemsize
    monkeypatch.setattr(im2col, "COLUMN_BYTES", block * per_sample)
    assert im2col.Layout((5,) + x_shape[1:], w_shape[2:], geometry, itemsize).block == block


BLOCK_CASES = ["stride1_3x3_pad1", "stride1_dilated_per_side", "strided_2_pad1_odd", "strided_dilated_per_side",
               "volume_per_side_dilated", "volume_strided_rect_dilated"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [1, 2, 3])
@pytest.mark.parametrize("case", BLOCK_CASES)
def test_conv_in_sample_blocks(monkeypatch, case, block, dtype):
    x_shape = CONV_CASES[case][0]
    monkeypatch.setitem(CONV_CASES, case, ((5,) + x_shape[1:],) + CONV_CASES[case][1:])
    set_block(monkeypatch, case, block, dtype)
    check_conv(case, dtype, seed=3)
    w_shape = CONV_CASES[case][1]
    gw_out = np.full(w_shape, np.nan, dtype=dtype)
    gw = check_conv(case, dtype, need_input_grad=False, gw_out=gw_out, seed=4)
    assert np.shares_memory(gw, gw_out)


@pytest.mark.parametrize("case", BLOCK_CASES)
def test_conv_blocks_do_not_change_results(monkeypatch, case):
    x_shape, w_shape, stride, padding, dilation, bias = CONV_CASES[case]
    rng = np.random.default_rng(5)
    x, w, b = rng.standard_normal((5,) + x_shape[1:]), rng.standard_normal(w_shape), rng.standard_normal(w_shape[0])
    geometry = ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2)
    y_whole, saved = conv_forward(x, w, b, geometry)
    R = rng.standard_normal(y_whole.shape)
    whole = conv_backward(R, saved)
    set_block(monkeypatch, case, 2, np.float64)
    y_blocks, saved = conv_forward(x, w, b, geometry)
    np.testing.assert_allclose(y_blocks, y_whole, rtol=1e-13, atol=1e-13)
    for got, expected in zip(conv_backward(R, saved), whole):
        np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-13)


# ------------------------------------------------------------------------------------------------ pooling



def torch_pool(name, geometry, padding, pad_value, **options):
    def run(x):
        return torch_op(name, x.dim() - 2)(torch_pad(x, padding, pad_value), geometry.kernel, geometry.stride,
                                           **options)
    return run


def check_pool(case, dtype, x, forward, backward, name, pad_value, **options):
    shape, kernel, stride, padding = POOL_CASES[case]
    geometry = PoolGeometry(kernel, stride, padding, rank=len(shape) - 2)
    x_copy = x.copy()
    y, saved = forward(x, geometry)
    R = random(np.random.default_rng(1), y.shape, dtype)
    y_ref, (gx_ref,) = torch_run(torch_pool(name, geometry, padding, pad_value, **options), [x], R)
    assert_close(y, y_ref, dtype, "y")
    assert_close(backward(R, saved), gx_ref, dtype, "gx")
    np.testing.assert_array_equal(x, x_copy, err_msg="pooling changed its input")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(POOL_CASES))
@pytest.mark.usefixtures("host_kernels")
def test_maxpool(case, dtype):
    x = random(np.random.default_rng(6), POOL_CASES[case][0], dtype)
    check_pool(case, dtype, x, maxpool_forward, maxpool_backward, "max_pool", -np.inf)


@pytest.mark.parametrize("values", ["all_equal", "integers", "negative_integers"])
@pytest.mark.parametrize("case", list(POOL_CASES))
@pytest.mark.usefixtures("host_kernels")
def test_maxpool_ties_go_to_first_maximum(case, values):
    """PyTorch's CPU kernel keeps the first maximum of a window in row-major order; so must spmdcnn."""
    shape = POOL_CASES[case][0]
    rng = np.random.default_rng(7)
    if values == "all_equal":
        x = np.full(shape, 0.5)
    elif values == "integers":
        x = rng.integers(0, 3, shape).astype(np.float64)
    else:
        x = -rng.integers(1, 3, shape).astype(np.float64)   # below zero: padding must still never win
    check_pool(case, np.float64, x, maxpool_forward, maxpool_backward, "max_pool", -np.inf)


def test_maxpool2d_tie_winner_is_explicitly_the_first():
    x = np.array([[[[1.0, 3.0, 3.0], [3.0, 2.0, 3.0]]]])
    y, saved = maxpool_forward(x, PoolGeometry([2, 3], 1))
    assert y.shape == (1, 1, 1, 1) and y[0, 0, 0, 0] == 3.0
    gx = maxpool_backward(np.ones_like(y), saved)
    np.testing.assert_array_equal(gx, [[[[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]]])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(POOL_CASES))
def test_avgpool(case, dtype):
    x = random(np.random.default_rng(8), POOL_CASES[case][0], dtype)
    check_pool(case, dtype, x, avgpool_forward, avgpool_backward, "avg_pool", 0.0, count_include_pad=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("kernel,stride,padding", [(3, 2, 1), ([3, 2], [1, 2], [1, 1]), (2, None, [1, 0])])
@pytest.mark.usefixtures("host_kernels")
def test_pool_symmetric_padding_like_torch_padding_argument(kernel, stride, padding, kind, dtype):
    """``padding: p`` / ``[ph, pw]`` is PyTorch's own padding argument, with no F.pad in between."""
    x = random(np.random.default_rng(9), (2, 3, 7, 8), dtype)
    geometry = PoolGeometry(kernel, stride, padding)
    forward, backward = (maxpool_forward, maxpool_backward) if kind == "max" else \
        (avgpool_forward, avgpool_backward)
    y, saved = forward(x, geometry)
    R = random(np.random.default_rng(10), y.shape, dtype)
    if kind == "max":
        def function(t):
            return F.max_pool2d(t, geometry.kernel, geometry.stride, [p[0] for p in geometry.padding])
    else:
        def function(t):
            return F.avg_pool2d(t, geometry.kernel, geometry.stride, [p[0] for p in geometry.padding],
                                count_include_pad=True)
    y_ref, (gx_ref,) = torch_run(function, [x], R)
    assert_close(y, y_ref, dtype, "y")
    assert_close(backward(R, saved), gx_ref, dtype, "gx")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (3, 2, 1, 1), (1, 4, 6, 1), (2, 3, 4, 5, 3), (3, 2, 7)])
def test_global_avgpool(shape, dtype):
    rng = np.random.default_rng(11)
    x = random(rng, shape, dtype)
    y, saved = global_avgpool_forward(x)
    R = random(rng, y.shape, dtype)
    y_ref, (gx_ref,) = torch_run(lambda t: getattr(F, f"adaptive_avg_pool{len(shape) - 2}d")(t, 1), [x], R)
    assert_close(y, y_ref, dtype, "y")
    assert_close(global_avgpool_backward(R, saved), gx_ref, dtype, "gx")


# ------------------------------------------------------------------------------------- element-wise, shape

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("slope", [0.01, 0.3, -0.5])
@pytest.mark.parametrize("inplace", [False, True])
def test_leaky_relu(slope, inplace, dtype):
    rng = np.random.default_rng(31)
    x = random(rng, (2, 3, 4, 5, 3), dtype)
    x.flat[::5] = 0.0   # PyTorch's gradient at 0 is the slope's
    y_ref, (gx_ref,) = torch_run(lambda t: F.leaky_relu(t, slope), [x.copy()], R := random(rng, x.shape, dtype))
    y, saved = leaky_relu_forward(x, slope, inplace=inplace)
    assert np.shares_memory(y, x) == inplace
    assert_close(y, y_ref, dtype, "y")
    assert_close(leaky_relu_backward(R, saved, slope), gx_ref, dtype, "gx")


@pytest.mark.parametrize("slope", [0.0, 0.3, -0.5, 1.5])
def test_leaky_relu_of_infinities_and_nan_is_pytorchs(slope):
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 2.0, -3.0], dtype=np.float32)
    y, positive = leaky_relu_forward(x.copy(), slope)
    np.testing.assert_array_equal(y, F.leaky_relu(torch.from_numpy(x), slope).numpy())
    gy = np.ones_like(x)
    np.testing.assert_array_equal(leaky_relu_backward(gy, positive, slope), np.where(x > 0, 1, np.float32(slope)))


def test_max_pooling_to_an_empty_output():
    x = np.ones((2, 3, 1, 4), np.float32)
    y, saved = maxpool_forward(x, PoolGeometry(2))
    assert y.shape == (2, 3, 0, 2)
    gx = maxpool_backward(y, saved)
    assert gx.shape == x.shape and not gx.any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inplace", [False, True])
def test_tanh(inplace, dtype):
    rng = np.random.default_rng(32)
    x = 2 * random(rng, (3, 2, 5, 4), dtype)
    y_ref, (gx_ref,) = torch_run(torch.tanh, [x.copy()], R := random(rng, x.shape, dtype))
    y, saved = tanh_forward(x, inplace=inplace)
    assert np.shares_memory(y, x) == inplace
    assert_close(y, y_ref, dtype, "y")
    assert_close(tanh_backward(R, saved), gx_ref, dtype, "gx")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("factor, shift", [(1.2, 0.0), (-0.5, 0.0), (1.0, 0.25), (-1.0, 3.0)])
def test_scale(factor, shift, dtype):
    rng = np.random.default_rng(33)
    x = random(rng, (4, 6), dtype)
    y_ref, (gx_ref,) = torch_run(lambda t: t * factor + shift, [x], R := random(rng, x.shape, dtype))
    y, saved = scale_forward(x, factor, shift)
    assert_close(y, y_ref, dtype, "y")
    assert_close(scale_backward(R, None, factor, shift), gx_ref, dtype, "gx")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("total", [None, 28])
def test_mse_loss(total, dtype):
    """The mean over the batch and the targets, as F.mse_loss; with ``total`` the values of the global batch a
    tile of it returns its share, and its gradient is that of the global mean."""
    rng = np.random.default_rng(34)
    y, t = random(rng, (5, 4), dtype), rng.uniform(-1, 1, (5, 4)).astype(np.float32)
    loss, saved = mse_loss_forward(y, t, total=total)
    assert saved.counted == 20
    scale = 20 / (total or 20)
    y_ref = torch.tensor(y.astype(np.float64), requires_grad=True)
    expected = F.mse_loss(y_ref, torch.tensor(t.astype(np.float64))) * scale
    expected.backward()
    assert abs(loss - expected.item()) <= TOLERANCE[dtype] * abs(expected.item())
    assert_close(mse_loss_backward(1.0, saved), y_ref.grad.numpy().astype(dtype), dtype, "gy")


def test_mse_loss_leaves_padding_rows_out():
    """A NaN target row is a padding sample (evaluation's last batch): no loss, no gradient, no error, not
    counted in the mean."""
    rng = np.random.default_rng(35)
    y, t = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    padded = t.copy()
    padded[[1, 3]] = np.nan
    loss, saved = mse_loss_forward(y, padded)
    np.testing.assert_allclose(loss, ((y[[0, 2]] - t[[0, 2]]) ** 2).sum() / 6, rtol=1e-14)
    gy = mse_loss_backward(1.0, saved)
    np.testing.assert_array_equal(gy[[1, 3]], 0)
    np.testing.assert_allclose(gy[[0, 2]], 2 * (y[[0, 2]] - t[[0, 2]]) / 6, rtol=1e-14)
    np.testing.assert_allclose(absolute_errors(y, padded), np.abs(y[[0, 2]] - t[[0, 2]]).sum(), rtol=1e-14)


def test_mse_loss_rejects_targets_of_another_shape():
    with pytest.raises(ValueError, match="targets of shape"):
        mse_loss_forward(np.zeros((2, 3)), np.zeros((2, 4)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (7, 5)])
def test_relu(shape, dtype):
    rng = np.random.default_rng(12)
    x = random(rng, shape, dtype)
    x.flat[::7] = 0.0   # PyTorch's gradient at 0 is 0
    y, saved = relu_forward(x)
    R = random(rng, y.shape, dtype)
    y_ref, (gx_ref,) = torch_run(F.relu, [x], R)
    assert_close(y, y_ref, dtype, "y")
    assert_close(relu_backward(R, saved), gx_ref, dtype, "gx")


@pytest.mark.parametrize("dtype", DTYPES)
def test_flatten(dtype):
    rng = np.random.default_rng(13)
    x = random(rng, (3, 4, 5, 2), dtype)
    y, saved = flatten_forward(x)
    R = random(rng, y.shape, dtype)
    y_ref, (gx_ref,) = torch_run(lambda t: torch.flatten(t, 1), [x], R)
    assert_close(y, y_ref, dtype, "y")
    assert_close(flatten_backward(R, saved), gx_ref, dtype, "gx")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels", [(3, 1, 2), (2, 5)])
def test_concat(channels, dtype):
    rng = np.random.default_rng(14)
    xs = [random(rng, (2, c, 3, 5), dtype) for c in channels]
    y, saved = concat_forward(xs)
    R = random(rng, y.shape, dtype)
    y_ref, grads_ref = torch_run(lambda *ts: torch.cat(ts, dim=1), xs, R)
    assert_close(y, y_ref, dtype, "y")
    grads = concat_backward(R, saved)
    assert len(grads) == len(xs)
    for i, (g, g_ref) in enumerate(zip(grads, grads_ref)):
        assert_close(np.asarray(g), g_ref, dtype, f"gx{i}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [2, 3, 4])
def test_add(count, dtype):
    rng = np.random.default_rng(15)
    xs = [random(rng, (2, 3, 4, 5), dtype) for _ in range(count)]
    copies = [x.copy() for x in xs]
    y, saved = add_forward(xs)
    R = random(rng, y.shape, dtype)
    y_ref, grads_ref = torch_run(lambda *ts: sum(ts[1:], ts[0]), xs, R)
    assert_close(y, y_ref, dtype, "y")
    for x, x_copy in zip(xs, copies):
        np.testing.assert_array_equal(x, x_copy, err_msg="add changed an input")
    grads = add_backward(R, saved)
    assert len(grads) == count
    for i, (g, g_ref) in enumerate(zip(grads, grads_ref)):
        assert_close(g, g_ref, dtype, f"gx{i}")


# ----------------------------------------------------------------------------------------------- linear

def linear_terms(x, w, bias):
    """Terms of the sums behind y, gx, gw, gb (the bias is one more term of each output)."""
    terms = linear_lengths(x.shape, w.shape)
    terms["y"] += bias
    return terms


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,bias", [((5, 7, 3), True), ((1, 4, 6), True), ((4, 9, 2), False)])
def test_linear(shape, bias, dtype):
    N, F_in, F_out = shape
    rng = np.random.default_rng(16)
    x, w = random(rng, (N, F_in), dtype), random(rng, (F_out, F_in), dtype)
    b = random(rng, F_out, dtype) if bias else None
    y, saved = linear_forward(x, w, b)
    R = random(rng, y.shape, dtype)
    expected = blas_reference(F.linear, [x, w] + ([b] if bias else []), R, dtype, linear_terms(x, w, bias))
    assert_expected(y, expected["y"], dtype, "y")
    gx, gw, gb = linear_backward(R, saved)
    assert_expected(gx, expected["gx"], dtype, "gx")
    assert_expected(gw, expected["gw"], dtype, "gw")
    if bias:
        assert_expected(gb, expected["gb"], dtype, "gb")
    else:
        assert gb is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_without_input_gradient_into_gw_out(dtype):
    rng = np.random.default_rng(17)
    x, w, b = random(rng, (6, 5), dtype), random(rng, (4, 5), dtype), random(rng, 4, dtype)
    y, saved = linear_forward(x, w, b, need_input_grad=False)
    R = random(rng, y.shape, dtype)
    expected = blas_reference(F.linear, [x, w, b], R, dtype, linear_terms(x, w, True))
    gw_out = np.full(w.shape, np.nan, dtype=dtype)
    gx, gw, gb = linear_backward(R, saved, gw_out=gw_out)
    assert gx is None
    assert np.shares_memory(gw, gw_out)
    assert_expected(gw_out, expected["gw"], dtype, "gw_out")
    assert_expected(gb, expected["gb"], dtype, "gb")


# -------------------------------------------------------------------------------------------- batchnorm

def bn_inputs(rng, shape, dtype):
    C = shape[1]
    x = (3.0 * rng.standard_normal(shape) + 1.5).astype(dtype)
    gamma, beta = random(rng, C, dtype), random(rng, C, dtype)
    running_mean, running_var = random(rng, C, dtype), rng.uniform(0.5, 2.0, C).astype(dtype)
    return x, gamma, beta, running_mean, running_var


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,eps,momentum", [((4, 3, 5, 7), 1e-5, 0.1), ((2, 5, 1, 1), 1e-3, 0.3),
                                                ((1, 2, 3, 4), 1e-5, 1.0), ((2, 3, 3, 4, 5), 1e-5, 0.1),
                                                ((3, 2, 7), 1e-4, 0.2)])
@pytest.mark.usefixtures("host_kernels")
def test_batchnorm_training(shape, eps, momentum, dtype):
    rng = np.random.default_rng(18)
    x, gamma, beta, running_mean, running_var = bn_inputs(rng, shape, dtype)
    torch_mean, torch_var = torch.tensor(running_mean), torch.tensor(running_var)
    x_copy = x.copy()
    y, saved = batchnorm_forward(x, gamma, beta, running_mean, running_var, eps=eps, momentum=momentum,
                                   training=True)
    R = random(rng, y.shape, dtype)

    def function(t, g, b):
        return F.batch_norm(t, torch_mean, torch_var, g, b, training=True, momentum=momentum, eps=eps)
    y_ref, (gx_ref, ggamma_ref, gbeta_ref) = torch_run(function, [x, gamma, beta], R)
    assert_close(y, y_ref, dtype, "y")
    # running statistics are updated in place; the variance estimate is unbiased, as PyTorch's
    assert_close(running_mean, torch_mean.numpy(), dtype, "running_mean")
    assert_close(running_var, torch_var.numpy(), dtype, "running_var")
    np.testing.assert_array_equal(x, x_copy, err_msg="batchnorm changed its input")
    gx, ggamma, gbeta = batchnorm_backward(R, saved)
    assert_close(gx, gx_ref, dtype, "gx")
    assert_close(ggamma, ggamma_ref, dtype, "ggamma")
    assert_close(gbeta, gbeta_ref, dtype, "gbeta")


@pytest.mark.usefixtures("host_kernels")
def test_batchnorm2d_combines_tiles_far_from_zero_as_accurately_as_one_pass_over_all():
    """Two tiles of very different means around 1e4 (unit spread): the combined variance is what a two-pass
    float64 computation over the whole batch gives, to float64 rounding (sums of squares would lose it all)."""
    from spmdcnn.ops.batchnorm import combine_moments
    rng = np.random.default_rng(3)
    parts = [1e4 + rng.standard_normal((5, 3)) * 0.01, 1e4 + 3.0 + rng.standard_normal((7, 3))]
    stats = np.stack([np.stack([np.full(3, len(p)), p.mean(axis=0), ((p - p.mean(axis=0)) ** 2).sum(axis=0)])
                      for p in parts])
    mean, m2 = combine_moments(stats)
    whole = np.concatenate(parts)
    np.testing.assert_allclose(mean, whole.mean(axis=0), rtol=1e-15)
    np.testing.assert_allclose(m2, ((whole - whole.mean(axis=0)) ** 2).sum(axis=0), rtol=1e-9)


@pytest.mark.usefixtures("host_kernels")
@pytest.mark.parametrize("dtype", DTYPES)
def test_batchnorm2d_tile_with_reduce_and_global_count(dtype):
    """A tile whose ``gather`` stacks the statistics of two identical tiles and whose ``reduce`` adds their
    partial sums, with ``count`` the global M, computes what one device computes on the global batch
    ``concat([x, x])``."""
    rng = np.random.default_rng(19)
    x, gamma, beta, running_mean, running_var = bn_inputs(rng, (3, 2, 4, 5), dtype)
    mean_tile, var_tile = running_mean.copy(), running_var.copy()
    y, saved = batchnorm_forward(x, gamma, beta, mean_tile, var_tile, training=True,
                                   reduce=lambda partial: 2 * partial, gather=lambda stats: np.stack([stats, stats]),
                                   count=2 * 3 * 4 * 5)
    y_whole, saved_whole = batchnorm_forward(np.concatenate([x, x]), gamma, beta, running_mean, running_var,
                                               training=True)
    assert_close(y, y_whole[:3], dtype, "y")
    assert_close(mean_tile, running_mean, dtype, "running_mean")
    assert_close(var_tile, running_var, dtype, "running_var")   # unbiased with the global M
    R = random(rng, y.shape, dtype)
    gx, ggamma, gbeta = batchnorm_backward(R, saved)
    gx_whole, ggamma_whole, gbeta_whole = batchnorm_backward(np.concatenate([R, R]), saved_whole)
    assert_close(gx, gx_whole[:3], dtype, "gx")
    assert_close(ggamma, ggamma_whole, dtype, "ggamma")
    assert_close(gbeta, gbeta_whole, dtype, "gbeta")


@pytest.mark.parametrize("dtype", DTYPES)
def test_batchnorm2d_eval(dtype):
    rng = np.random.default_rng(20)
    x, gamma, beta, running_mean, running_var = bn_inputs(rng, (3, 4, 5, 3), dtype)
    mean_copy, var_copy = running_mean.copy(), running_var.copy()
    y, saved = batchnorm_forward(x, gamma, beta, running_mean, running_var, eps=1e-3, momentum=0.1,
                                   training=False)
    R = random(rng, y.shape, dtype)

    def function(t):
        return F.batch_norm(t, torch.tensor(mean_copy), torch.tensor(var_copy), torch.tensor(gamma),
                            torch.tensor(beta), training=False, momentum=0.1, eps=1e-3)
    y_ref, (gx_ref,) = torch_run(function, [x], R)
    assert_close(y, y_ref, dtype, "y")
    assert_close(batchnorm_backward(R, saved)[0], gx_ref, dtype, "gx")
    np.testing.assert_array_equal(running_mean, mean_copy, err_msg="eval mode changed running_mean")
    np.testing.assert_array_equal(running_var, var_copy, err_msg="eval mode changed running_var")


# ------------------------------------------------------------------------------------------------- loss

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,F_,total", [(6, 5, None), (6, 5, 16), (1, 3, None), (8, 10, 9)])
def test_softmax_cross_entropy(N, F_, total, dtype):
    rng = np.random.default_rng(21)
    logits = (4.0 * rng.standard_normal((N, F_))).astype(dtype)
    logits[0, 0] = 60.0   # large logits must not overflow
    labels = rng.integers(0, F_, N)
    logits_copy = logits.copy()
    loss, saved = softmax_cross_entropy_forward(logits, labels, total)
    gloss = 0.75
    divisor = N if total is None else total

    def function(t):
        return F.cross_entropy(t, torch.from_numpy(labels), reduction="sum") / divisor
    t = torch.tensor(logits, requires_grad=True)
    loss_ref = function(t)
    (gloss * loss_ref).backward()
    if total is None:
        torch.testing.assert_close(loss_ref, F.cross_entropy(t, torch.from_numpy(labels)))  # the mean
    assert isinstance(loss, float)
    np.testing.assert_allclose(loss, loss_ref.item(), rtol=TOLERANCE[dtype])
    assert_close(softmax_cross_entropy_backward(gloss, saved), t.grad.numpy(), dtype, "glogits")
    np.testing.assert_array_equal(logits, logits_copy, err_msg="the loss changed its logits")


def test_softmax_cross_entropy_shares_sum_to_the_global_mean():
    """Tiles holding some samples each return their share; the shares add up to the global mean."""
    rng = np.random.default_rng(22)
    logits = rng.standard_normal((7, 4))
    labels = rng.integers(0, 4, 7)
    whole, saved = softmax_cross_entropy_forward(logits, labels)
    parts = [softmax_cross_entropy_forward(logits[a:b], labels[a:b], total=7) for a, b in ((0, 3), (3, 7))]
    np.testing.assert_allclose(sum(loss for loss, _ in parts), whole, rtol=1e-14)
    grads = [softmax_cross_entropy_backward(1.0, s) for _, s in parts]
    np.testing.assert_allclose(np.concatenate(grads), softmax_cross_entropy_backward(1.0, saved), rtol=1e-14)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,ignore_index", [((2, 4, 5, 3), -1), ((3, 3, 7), 7), ((2, 5, 3, 4, 2), 255),
                                                ((1, 2, 1, 1), -1)])
def test_softmax_cross_entropy_per_position(shape, ignore_index, dtype):
    """Logits (N, K, S...) against labels (N, S...), as F.cross_entropy with ignore_index: the mean over the
    labelled positions; a class absent from the labels, and ignored positions, count for nothing."""
    rng = np.random.default_rng(26)
    N, K, *spatial = shape
    logits = (3.0 * rng.standard_normal(shape)).astype(dtype)
    labels = rng.integers(1, K, (N, *spatial))             # class 0 absent
    labels.reshape(-1)[::3] = ignore_index
    labels.reshape(-1)[0] = 1                              # at least one labelled position
    loss, saved = softmax_cross_entropy_forward(logits, labels, ignore_index=ignore_index)
    assert saved.counted == int((labels != ignore_index).sum())
    t = torch.tensor(logits.astype(np.float64), requires_grad=True)
    expected = F.cross_entropy(t, torch.from_numpy(labels), ignore_index=ignore_index)
    (0.5 * expected).backward()
    np.testing.assert_allclose(loss, expected.item(), rtol=TOLERANCE[dtype])
    assert_close(softmax_cross_entropy_backward(0.5, saved), t.grad.numpy().astype(dtype), dtype, "glogits")


def test_softmax_cross_entropy_sums_of_tiles_give_the_mean():
    """Tiles over samples and positions return their sums (total=1) and counts: their sums over the count of all
    are the global mean and its gradient, as the executor adds them up."""
    rng = np.random.default_rng(27)
    logits, labels = rng.standard_normal((3, 4, 6, 5)), rng.integers(-1, 4, (3, 6, 5))
    whole, saved = softmax_cross_entropy_forward(logits, labels)
    tiles = [(slice(0, 2), slice(0, 4)), (slice(0, 2), slice(4, 6)), (slice(2, 3), slice(0, 6))]
    parts = [softmax_cross_entropy_forward(logits[n, :, h], labels[n, h], total=1) for n, h in tiles]
    counted = sum(part.counted for _, part in parts)
    assert counted == saved.counted == int((labels >= 0).sum())
    np.testing.assert_allclose(sum(share for share, _ in parts) / counted, whole, rtol=1e-14)
    gradient = softmax_cross_entropy_backward(1.0, saved)
    for (n, h), (_, part) in zip(tiles, parts):
        np.testing.assert_allclose(softmax_cross_entropy_backward(1 / counted, part), gradient[n, :, h], rtol=1e-14)


def test_softmax_cross_entropy_of_nothing_labelled_is_zero():
    """A batch with every position ignored: loss 0 and gradient 0 (PyTorch's mean is 0/0)."""
    loss, saved = softmax_cross_entropy_forward(np.ones((2, 3, 4)), np.full((2, 4), -1))
    assert loss == 0.0 and saved.counted == 0
    assert not softmax_cross_entropy_backward(1.0, saved).any()


def test_scores_count_per_class():
    """Right predictions of labelled positions, and per class the right, predicted and labelled counts."""
    logits = np.zeros((1, 3, 2, 3))
    predicted = np.array([[0, 1, 2], [2, 2, 1]])
    np.put_along_axis(logits, predicted[None, None], 1.0, axis=1)
    labels = np.array([[[0, 2, 2], [2, -1, 1]]])
    correct, table = scores(logits, labels, classes=True)
    assert correct == 4
    np.testing.assert_array_equal(table, [[1, 1, 2],       # right: 0 at (0,0), 1 at (1,2), 2 at (0,2) and (1,0)
                                          [1, 2, 2],       # predicted, of the labelled positions
                                          [1, 1, 3]])      # labelled


# ------------------------------------------------------------------------------------- non-contiguous views

@pytest.mark.parametrize("case", ["pointwise", "stride1_dilated_per_side", "strided_2_pad1_odd", "strided_1x1"])
def test_conv2d_accepts_non_contiguous_views(case):
    """The runtime hands over views: ``gy`` split off by concat's backward, inputs sliced from a larger array."""
    (x, w, b, geometry, R), y_ref, grads_ref = conv_reference(case, np.float64, seed=23)
    wide_x = np.zeros((x.shape[0], x.shape[1] + 2) + x.shape[2:])
    wide_x[:, 1:-1] = x
    y, saved = conv_forward(wide_x[:, 1:-1], w, b, geometry)
    assert_close(y, y_ref, np.float64, "y")
    gy = concat_backward(concat_forward([R, np.zeros_like(R)])[0], [R.shape[1], R.shape[1]])[0]
    assert not gy.flags.c_contiguous
    for got, expected, name in zip(conv_backward(gy, saved), grads_ref, ("gx", "gw", "gb")):
        if expected is None:
            assert got is None
        else:
            assert_close(got, expected, np.float64, name)


@pytest.mark.usefixtures("host_kernels")
def test_pool_batchnorm_relu_accept_non_contiguous_gradients():
    rng = np.random.default_rng(24)
    x = rng.standard_normal((2, 3, 6, 7))

    def strided_like(shape):
        gy = rng.standard_normal((shape[0], 2 * shape[1]) + shape[2:])[:, ::2]
        assert not gy.flags.c_contiguous
        return gy, np.ascontiguousarray(gy)

    geometry = PoolGeometry(3, 2, 1)
    for forward, backward in ((maxpool_forward, maxpool_backward), (avgpool_forward, avgpool_backward)):
        y, saved = forward(x, geometry)
        gy, dense = strided_like(y.shape)
        np.testing.assert_array_equal(backward(gy, saved), backward(dense, saved))
    gy, dense = strided_like(x.shape)
    _, saved = batchnorm_forward(x, np.ones(3), np.zeros(3), np.zeros(3), np.ones(3), training=True)
    for a, b in zip(batchnorm_backward(gy, saved), batchnorm_backward(dense, saved)):
        np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-14)
    _, saved = relu_forward(x)
    np.testing.assert_array_equal(relu_backward(gy, saved), relu_backward(dense, saved))


# --------------------------------------------------------------------------------------------------- errors

def test_conv2d_rejects_channel_mismatch():
    with pytest.raises(ValueError, match="3 channels.*expects 2"):
        conv_forward(np.zeros((1, 3, 4, 4)), np.zeros((2, 2, 3, 3)), None, ConvGeometry())


@pytest.mark.parametrize("labels,fragment", [([0, 3], r"\[0, 3\)"), ([-2, 0], r"\[0, 3\)"), ([0], "labels of shape"),
                                             ([[0, 1]], "labels of shape")])
def test_softmax_cross_entropy_rejects_bad_labels(labels, fragment):
    with pytest.raises(ValueError, match=fragment):
        softmax_cross_entropy_forward(np.zeros((2, 3)), np.array(labels))


def test_softmax_cross_entropy_takes_its_ignore_index_only():
    """255 is a label to ignore where it is the ignore_index, and a class out of range where it is not."""
    logits, labels = np.zeros((1, 3, 2)), np.array([[255, 1]])
    assert softmax_cross_entropy_forward(logits, labels, ignore_index=255)[1].counted == 1
    with pytest.raises(ValueError, match=r"\[0, 3\).*got 255"):
        softmax_cross_entropy_forward(logits, labels)


@pytest.mark.parametrize("make", [lambda: ConvGeometry(stride=[1, 2], padding=[1, 2, 3]),
                                  lambda: PoolGeometry([2, 2], [1, 1, 1]),
                                  lambda: ConvGeometry(padding=[1, 2, 3], rank=2),
                                  lambda: ConvGeometry(dilation=(1,), rank=3)])
def test_geometry_rejects_values_for_another_number_of_axes(make):
    with pytest.raises(ValueError, match="one per spatial axis"):
        make()


def test_conv_rejects_a_geometry_of_another_rank():
    with pytest.raises(ValueError, match="spatial rank"):
        conv_forward(np.zeros((1, 2, 4, 4, 4)), np.zeros((2, 2, 3, 3, 3)), None, ConvGeometry())


# ------------------------------------------------------------------------------------- Dice (and cross-entropy)

def _dice_layer(**attrs):
    from spmdcnn.graph.graph import parse_model
    graph = parse_model({"name": "d", "input": [3, 4, 4], "layers": [
        {"name": "loss", "op": "dice_loss", **attrs}]})
    return graph.loss


def _dice_tiles(layer, logits, labels, tiles):
    """What the executor does with the loss tiles ``tiles`` (index tuples over (N, S...)): each tile's forward, the
    tables summed, the finish, each tile's backward; returns the loss and the whole gradient."""
    from spmdcnn.ops import dice
    from spmdcnn.runtime.kernels import finish_loss
    total = counted = 0.0
    table = np.zeros((3,) + logits.shape[:2])
    saved = []
    for index in tiles:
        share, kept = softmax_cross_entropy_forward(logits[index[:1] + (slice(None),) + index[1:]], labels[index],
                                                    total=1, ignore_index=layer.attrs["ignore_index"])
        table[:, index[0]] += dice.dice_partials(kept)
        total, counted = total + share, counted + kept.counted
        saved.append(kept)
    loss, seed = finish_loss(layer, total, counted, table)
    gradient = np.zeros_like(logits)
    for index, kept in zip(tiles, saved):
        rows = index[0]
        gradient[index[:1] + (slice(None),) + index[1:]] = dice.dice_backward(seed.rows(rows.start, rows.stop), kept)
    return loss, gradient


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attrs", [{}, {"dice": 0.5, "cross_entropy": 0.5, "include_background": False},
                                   {"batch": True, "cross_entropy": 1.0, "smooth": 0.0},
                                   {"ignore_index": 255, "dice": 2.0, "include_background": False, "batch": True}])
@pytest.mark.parametrize("shape", [(3, 4, 5, 6), (2, 3, 4, 3, 5), (2, 2, 9)])
def test_dice_loss(shape, attrs, dtype):
    """Dice and cross-entropy per position against MONAI's DiceCELoss written in PyTorch
    (tests/torch_reference.dice_ce): per sample or over the batch, the background in or out, an ignore label, a
    class absent from a sample, a padding sample (every label -1) that counts in neither term."""
    from torch_reference import dice_ce
    layer = _dice_layer(**attrs)
    rng = np.random.default_rng(31)
    N, K, *spatial = shape
    logits = (2.0 * rng.standard_normal(shape)).astype(dtype)
    labels = rng.integers(0, K - 1, (N, *spatial))          # the last class is absent
    labels.reshape(N, -1)[:, ::4] = layer.attrs["ignore_index"]
    labels[-1] = -1                                          # evaluation's padding
    whole = (slice(None),) * (1 + len(spatial))
    loss, gradient = _dice_tiles(layer, logits, labels, [whole])
    t = torch.tensor(logits.astype(np.float64), requires_grad=True)
    expected = dice_ce(t, torch.from_numpy(labels), **layer.attrs)
    expected.backward()
    np.testing.assert_allclose(loss, expected.item(), rtol=TOLERANCE[dtype])
    assert_close(gradient, t.grad.numpy().astype(dtype), dtype, "glogits")


def test_dice_loss_is_mlperfs_unet3d_loss():
    """At dice 0.5, cross_entropy 0.5, background left out and smoothing 1e-6 it is MLPerf HPC's 3D U-Net loss
    (mlcommons/training image_segmentation: DiceCELoss = (mean(1 - dice per sample and foreground class) + CE) / 2),
    written here as the reference writes it."""
    layer = _dice_layer(dice=0.5, cross_entropy=0.5, include_background=False, smooth=1e-6)
    rng = np.random.default_rng(32)
    logits, labels = rng.standard_normal((2, 3, 4, 5, 3)), rng.integers(0, 3, (2, 4, 5, 3))
    loss, gradient = _dice_tiles(layer, logits, labels, [(slice(None),) * 4])
    t = torch.tensor(logits, requires_grad=True)
    target = F.one_hot(torch.from_numpy(labels), 3).permute(0, 4, 1, 2, 3).double()[:, 1:]
    prediction = torch.softmax(t, dim=1)[:, 1:]
    axes = (2, 3, 4)
    score = (2.0 * (target * prediction).sum(axes) + 1e-6) / (target.sum(axes) + prediction.sum(axes) + 1e-6)
    expected = (torch.mean(1.0 - score) + F.cross_entropy(t, torch.from_numpy(labels))) / 2
    expected.backward()
    np.testing.assert_allclose(loss, expected.item(), rtol=1e-12)
    np.testing.assert_allclose(gradient, t.grad.numpy(), rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("batch", [False, True])
def test_dice_loss_of_tiles_is_the_whole(batch):
    """Tiles over samples and positions add their sums into the table at their samples' rows: the loss and every
    tile's gradient are the whole batch's."""
    layer = _dice_layer(cross_entropy=0.3, batch=batch)
    rng = np.random.default_rng(33)
    logits, labels = rng.standard_normal((3, 4, 6, 5)), rng.integers(-1, 4, (3, 6, 5))
    whole_loss, whole = _dice_tiles(layer, logits, labels, [(slice(None),) * 3])
    tiles = [(slice(0, 2), slice(0, 4), slice(None)), (slice(0, 2), slice(4, 6), slice(None)),
             (slice(2, 3), slice(0, 6), slice(0, 2)), (slice(2, 3), slice(0, 6), slice(2, 5))]
    loss, gradient = _dice_tiles(layer, logits, labels, tiles)
    np.testing.assert_allclose(loss, whole_loss, rtol=1e-13)
    np.testing.assert_allclose(gradient, whole, rtol=1e-10, atol=1e-16)


def test_dice_loss_of_nothing_labelled_is_zero():
    layer = _dice_layer(cross_entropy=1.0)
    loss, gradient = _dice_tiles(layer, np.ones((2, 3, 4)), np.full((2, 4), -1), [(slice(None),) * 2])
    assert loss == 0.0 and not gradient.any()


# ------------------------------------------------------------------------------------- activations

ACTIVATIONS = {     # op: (PyTorch's function, spmdcnn's forward and backward, the op's attributes)
    "sigmoid": (torch.sigmoid, {}),
    "silu": (F.silu, {}),
    "gelu": (F.gelu, {}),
    "gelu_tanh": (lambda t: F.gelu(t, approximate="tanh"), {"approximate": "tanh"}),
    "hardswish": (F.hardswish, {}),
    "hardsigmoid": (F.hardsigmoid, {}),
    "relu6": (F.relu6, {}),
    "hardtanh": (lambda t: F.hardtanh(t, -2.0, 3.0), {"min_val": -2.0, "max_val": 3.0}),
    "elu": (lambda t: F.elu(t, 0.7), {"alpha": 0.7, "gain": 1.0, "input_scale": 1.0}),
    "elu_selu": (F.selu, {"alpha": 1.6732632423543772, "gain": 1.0507009873554805, "input_scale": 1.0}),
    "mish": (F.mish, {}),
    "clamp": (lambda t: torch.clamp(t, -3.0, 6.0), {"min": -3.0, "max": 6.0}),
    "clamp_below": (lambda t: torch.clamp(t, min=0.0), {"min": 0.0, "max": None}),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations(name, inplace, dtype):
    """Forward and backward of each activation against PyTorch, over values that cross every kink (-3, 0, 3, 6)
    and reach the tails; ``inplace`` where the op table lets it write over its input."""
    from spmdcnn.graph.optable import OPS
    from spmdcnn.ops import activations
    reference, attrs = ACTIVATIONS[name]
    op = name.split("_")[0]
    rng = np.random.default_rng(41)
    x = np.concatenate([rng.uniform(-8, 9, 500), [-3.0, 0.0, 3.0, 6.0, -40.0, 40.0, 1e-9]]).astype(dtype)
    x = x.reshape(1, 1, -1)
    gy = rng.standard_normal(x.shape).astype(dtype)
    forward, backward = getattr(activations, f"{op}_forward"), getattr(activations, f"{op}_backward")
    given = x.copy()
    y, saved = forward(given, *attrs.values(), inplace=inplace and OPS[op].inplace)
    gx = backward(gy, saved, *attrs.values())
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    ty = reference(t)
    ty.backward(torch.from_numpy(gy.astype(np.float64)))
    expected = t.grad.numpy()
    if op == "hardsigmoid":         # PyTorch's CPU kernel multiplies by float(1/6) even in float64; we by 1/6
        expected = expected / float(np.float32(1 / 6)) / 6
    assert_close(y, ty.detach().numpy().astype(dtype), dtype, f"{name} y")
    assert_close(gx, expected.astype(dtype), dtype, f"{name} gx")
    if not (inplace and OPS[op].inplace):
        np.testing.assert_array_equal(given, x)            # not written over


def test_erf_is_accurate_to_its_type():
    """float64: Cody's rational approximation against math.erf over all three of its intervals and both signs, to
    2 ulp; float32: Eigen's and XLA's approximation within 4.5e-7 (a few float32 ulp; 1 beyond 4)."""
    import math
    from spmdcnn.ops.activations import erf
    x = np.concatenate([np.linspace(-7, 7, 20001), [0.0, 0.46875, -0.46875, 4.0, -4.0, 1e-300, 30.0]])
    expected = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(erf(x), expected, rtol=1e-15, atol=1e-300)      # 2 ulp
    single = x.astype(np.float32)
    got = erf(single)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, [math.erf(float(v)) for v in single], rtol=0, atol=4.5e-7)


def test_exact_gelu_in_chunks_equals_it_whole(monkeypatch):
    """The host's GELU over cache-sized chunks (and threads) gives what one pass over the whole array gives."""
    from spmdcnn.ops import activations
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 5, 7, 11))
    gy = rng.standard_normal(x.shape)
    whole = activations._gelu(x.copy()), activations._gelu_gradient(x.copy(), gy)
    monkeypatch.setattr(activations, "CHUNK", 37)              # chunks that do not divide the array
    y, saved = activations.gelu_forward(x)
    np.testing.assert_array_equal(y, whole[0])
    np.testing.assert_array_equal(activations.gelu_backward(gy, saved), whole[1])


# ------------------------------------------------------------------------------------- layer scale, stochastic depth

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 4, 5, 2), (2, 3, 4, 2, 3), (4, 6)])
def test_layer_scale(shape, dtype):
    from spmdcnn.ops.layer_scale import layer_scale_backward, layer_scale_forward
    rng = np.random.default_rng(51)
    x, gy = rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)
    gamma = rng.standard_normal(shape[1]).astype(dtype)
    y, saved = layer_scale_forward(x, gamma)
    gx, ggamma = layer_scale_backward(gy, saved, gamma)
    t, tg = torch.tensor(x.astype(np.float64), requires_grad=True), torch.tensor(gamma.astype(np.float64),
                                                                                  requires_grad=True)
    ty = t * tg.reshape((1, -1) + (1,) * (len(shape) - 2))      # torchvision's CNBlock: layer_scale * x
    ty.backward(torch.from_numpy(gy.astype(np.float64)))
    assert_close(y, ty.detach().numpy().astype(dtype), dtype, "y")
    assert_close(gx, t.grad.numpy().astype(dtype), dtype, "gx")
    assert_close(ggamma, tg.grad.numpy().astype(dtype), dtype, "ggamma")


@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_stochastic_depth_drops_whole_samples_by_global_index(p):
    """As torchvision's StochasticDepth(p, "row"): a sample kept whole and scaled by 1 / (1 - p), or dropped; the
    decision is the sample's in the global batch, so tiles of any split agree with the whole."""
    from spmdcnn.ops.dropout import stochastic_depth_backward, stochastic_depth_forward, stream_key
    rng = np.random.default_rng(52)
    x = rng.standard_normal((40, 3, 4, 2))
    key = stream_key(7, 3, "drop_path")
    y, saved = stochastic_depth_forward(x.copy(), p, key, (0, 0, 0, 0), x.shape)
    kept = [n for n in range(40) if y[n].any()]
    for n in range(40):
        np.testing.assert_allclose(y[n], x[n] / (1 - p) if n in kept else 0 * x[n], rtol=1e-15)
    if 0 < p < 1:
        assert 0 < len(kept) < 40
    part, _ = stochastic_depth_forward(x[10:25, 1:], p, key, (10, 1, 0, 0), x.shape)   # samples 10-24, channels 1-2
    np.testing.assert_array_equal(part, y[10:25, 1:])
    gy = rng.standard_normal(x.shape)
    gx = stochastic_depth_backward(gy, saved)
    np.testing.assert_allclose(gx, np.where(np.isin(np.arange(40), kept)[:, None, None, None],
                                            gy / (1 - p) if p < 1 else 0 * gy, 0), rtol=1e-15)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", [((3, 4, 5, 2), (3, 4, 1, 1)), ((3, 4, 1, 1), (3, 4, 5, 2)),
                                    ((2, 3, 1, 4), (2, 1, 5, 1)), ((2, 3, 4), (2, 3, 4))])
def test_mul_broadcasts_size_one_axes(shapes, dtype):
    from spmdcnn.ops.mul import mul_backward, mul_forward
    rng = np.random.default_rng(53)
    a, b = (rng.standard_normal(s).astype(dtype) for s in shapes)
    y, saved = mul_forward(a, b)
    gy = rng.standard_normal(y.shape).astype(dtype)
    ga, gb = mul_backward(gy, saved)
    ta, tb = (torch.tensor(v.astype(np.float64), requires_grad=True) for v in (a, b))
    ty = ta * tb
    ty.backward(torch.from_numpy(gy.astype(np.float64)))
    assert_close(y, ty.detach().numpy().astype(dtype), dtype, "y")
    assert_close(ga, ta.grad.numpy().astype(dtype), dtype, "ga")
    assert_close(gb, tb.grad.numpy().astype(dtype), dtype, "gb")
    assert mul_backward(gy, saved, (False, True))[0] is None


@pytest.mark.parametrize("input_shape,output_size", [((3, 8, 6), 1), ((3, 8, 6), [4, 2]), ((2, 4, 6, 2), [2, 3, 1]),
                                                     ((3, 10), 5)])
def test_adaptive_avgpool_is_pytorchs_where_the_output_divides(input_shape, output_size):
    """adaptive_avgpool{1,2,3}d {output_size} is average pooling of kernel = stride = input / output: PyTorch's
    AdaptiveAvgPool forward and backward, in a model."""
    from spmdcnn.graph.graph import parse_model
    from spmdcnn.runtime.executor import Executor
    rank = len(input_shape) - 1
    graph = parse_model({"name": "a", "input": list(input_shape), "layers": [
        {"name": "pool", "op": f"adaptive_avgpool{rank}d", "output_size": output_size},
        {"name": "flat", "op": "flatten"}, {"name": "fc", "op": "linear", "out_features": 2},
        {"name": "loss", "op": "softmax_cross_entropy"}]})
    assert graph.by_name["pool"].op == f"avgpool{rank}d"
    executor = Executor(graph, np, np.float64, seed=1)
    rng = np.random.default_rng(54)
    x = rng.standard_normal((2,) + input_shape)
    _, _, kept = executor.forward(x, np.array([0, 1]), keep=("pool",))
    t = torch.tensor(x)
    expected = getattr(F, f"adaptive_avg_pool{rank}d")(t, output_size)
    np.testing.assert_allclose(kept["pool"], expected.numpy(), rtol=1e-13)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, padding, value", [((2, 3, 5, 4), ((1, 2), (0, 3)), 0.0),
                                                   ((1, 2, 3, 4, 5), ((2, 0), (-1, 1), (0, 2)), -0.75),
                                                   ((3, 2, 6), ((-2, 1),), 1.5)])
def test_pad_is_pytorchs(shape, padding, value, dtype):
    """A constant pad over the spatial axes (a negative side crops) as ``F.pad``, forward and backward, on the
    whole tensor (a tile's padding is never negative: its need moves instead, tiling/fields.py)."""
    from spmdcnn.ops.pad import pad_backward, pad_forward
    rng = np.random.default_rng(59)
    x = rng.standard_normal(shape).astype(dtype)
    crop = tuple(slice(-min(before, 0), size + min(after, 0)) for (before, after), size in zip(padding, shape[2:]))
    inside = tuple((max(before, 0), max(after, 0)) for before, after in padding)
    y, spatial = pad_forward(x[(slice(None), slice(None)) + crop], inside, value)
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    ty = F.pad(t, [side for pair in reversed(padding) for side in pair], value=value)
    gy = rng.standard_normal(tuple(ty.shape)).astype(dtype)
    ty.backward(torch.from_numpy(gy.astype(np.float64)))
    assert_close(y, ty.detach().numpy().astype(dtype), dtype, "y")
    gx = np.zeros_like(x)
    gx[(slice(None), slice(None)) + crop] = pad_backward(gy, spatial, inside)
    assert_close(gx, t.grad.numpy().astype(dtype), dtype, "gx")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, groups", [((2, 6, 3, 4), 2), ((2, 6, 3, 4), 3), ((1, 8, 2, 3, 2), 4), ((3, 4, 5), 4)])
def test_channel_shuffle_is_shufflenets(shape, groups, dtype):
    from spmdcnn.ops.channels import channel_shuffle_backward, channel_shuffle_forward
    rng = np.random.default_rng(61)
    x, gy = rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)
    y, saved = channel_shuffle_forward(x, groups)
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    n, c = shape[:2]
    ty = t.view((n, groups, c // groups) + shape[2:]).transpose(1, 2).contiguous().view(shape)
    ty.backward(torch.from_numpy(gy.astype(np.float64)))
    assert_close(y, ty.detach().numpy().astype(dtype), dtype, "y")
    assert_close(channel_shuffle_backward(gy, saved), t.grad.numpy().astype(dtype), dtype, "gx")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, output_size", [((2, 3, 2, 2), (7, 7)), ((1, 2, 7, 5), (3, 4)),
                                                ((2, 2, 5, 6, 7), (3, 4, 2)), ((3, 2, 10), (4,)), ((1, 1, 13, 3), (5, 3))])
def test_adaptive_avgpool_of_uneven_windows_is_pytorchs(shape, output_size, dtype):
    """Output sizes that do not divide the input's: PyTorch's uneven (overlapping, or repeating when it grows)
    windows, forward and backward; a model with such an output size takes the op itself."""
    from spmdcnn.graph.graph import parse_model
    from spmdcnn.ops.pool import adaptive_avgpool_backward, adaptive_avgpool_forward
    rng = np.random.default_rng(67)
    x = rng.standard_normal(shape).astype(dtype)
    y, saved = adaptive_avgpool_forward(x, output_size)
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    ty = getattr(F, f"adaptive_avg_pool{len(shape) - 2}d")(t, output_size)
    gy = rng.standard_normal(tuple(ty.shape)).astype(dtype)
    ty.backward(torch.from_numpy(gy.astype(np.float64)))
    assert_close(y, ty.detach().numpy().astype(dtype), dtype, "y")
    assert_close(adaptive_avgpool_backward(gy, saved), t.grad.numpy().astype(dtype), dtype, "gx")
    rank = len(shape) - 2
    graph = parse_model({"name": "a", "input": list(shape[1:]), "layers": [
        {"name": "pool", "op": f"adaptive_avgpool{rank}d", "output_size": list(output_size)},
        {"name": "flat", "op": "flatten"}, {"name": "fc", "op": "linear", "out_features": 2},
        {"name": "loss", "op": "softmax_cross_entropy"}]})
    assert graph.by_name["pool"].op == f"adaptive_avgpool{rank}d"
    assert graph.by_name["pool"].out_shape == (shape[1],) + tuple(output_size)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, shared", [((3, 4, 5, 2), True), ((2, 3, 4, 2, 3), False), ((4, 6), False),
                                           ((2, 3, 7), True)])
def test_ops_of_one_weight_per_channel_or_shared(shape, shared, dtype):
    """A learned shift (bias), factor (layer scale) and PReLU slope, per channel or one for every channel, against
    PyTorch's broadcast and F.prelu (x = 0 on the slope's side, as PyTorch's rule)."""
    from spmdcnn.ops.bias import bias_backward, bias_forward
    from spmdcnn.ops.layer_scale import layer_scale_backward, layer_scale_forward
    from spmdcnn.ops.prelu import prelu_backward, prelu_forward
    rng = np.random.default_rng(71)
    x, gy = rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)
    x.flat[::7] = 0
    count = 1 if shared else shape[1]
    along = (1, -1) + (1,) * (len(shape) - 2)
    for forward, backward, reference in ((bias_forward, bias_backward, lambda t, w: t + w.reshape(along)),
                                         (layer_scale_forward, layer_scale_backward, lambda t, w: t * w.reshape(along)),
                                         (prelu_forward, prelu_backward, F.prelu)):
        weight = rng.uniform(-1, 1, count).astype(dtype)
        y, saved = forward(x, weight)
        gx, gweight = backward(gy, saved, weight)
        t, tw = (torch.tensor(a.astype(np.float64), requires_grad=True) for a in (x, weight))
        ty = reference(t, tw)
        ty.backward(torch.from_numpy(gy.astype(np.float64)))
        assert gweight.shape == weight.shape
        assert_close(y, ty.detach().numpy().astype(dtype), dtype, "y")
        assert_close(gx, t.grad.numpy().astype(dtype), dtype, "gx")
        assert_close(gweight, tw.grad.numpy().astype(dtype), dtype, "gweight")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, size, order", [((2, 3, 4, 6), 2, "channels"), ((2, 3, 4, 6), 2, "blocks"),
                                                ((1, 2, 6, 3, 9), 3, "channels"), ((2, 2, 4, 2, 6), 2, "blocks"),
                                                ((3, 2, 8), 4, "channels")])
def test_space_to_depth_is_pixel_unshuffle_or_timms(shape, size, order, dtype):
    """``channels``: F.pixel_unshuffle (images); ``blocks``: timm's SpaceToDepth (a view, a permute, a view);
    volumes and sequences the same views over their axes; forward and backward."""
    from spmdcnn.ops.channels import space_to_depth_backward, space_to_depth_forward
    rng = np.random.default_rng(73)
    x = rng.standard_normal(shape).astype(dtype)
    y, saved = space_to_depth_forward(x, size, order)
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    n, c, *spatial = shape
    if order == "channels" and len(spatial) == 2:
        ty = F.pixel_unshuffle(t, size)
    else:
        split = t.reshape([n, c] + [v for extent in spatial for v in (extent // size, size)])
        inner, outer = [3 + 2 * k for k in range(len(spatial))], [2 + 2 * k for k in range(len(spatial))]
        axes = [0] + ([1] + inner if order == "channels" else inner + [1]) + outer
        ty = split.permute(axes).reshape([n, c * size ** len(spatial)] + [extent // size for extent in spatial])
    gy = rng.standard_normal(tuple(ty.shape)).astype(dtype)
    ty.backward(torch.from_numpy(gy.astype(np.float64)))
    assert_close(y, ty.detach().numpy().astype(dtype), dtype, "y")
    assert_close(space_to_depth_backward(gy, saved), t.grad.numpy().astype(dtype), dtype, "gx")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, groups", [((2, 6, 3, 4), 2), ((2, 6, 1, 1), 3), ((1, 8, 2, 3, 2), 4), ((3, 4, 5), 4)])
def test_group_softmax_is_a_softmax_across_the_groups(shape, groups, dtype):
    from spmdcnn.ops.softmax import group_softmax_backward, group_softmax_forward
    rng = np.random.default_rng(79)
    x, gy = 3 * rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)
    y, saved = group_softmax_forward(x, groups)
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    n, c = shape[:2]
    ty = t.view((n, groups, c // groups) + shape[2:]).softmax(1).reshape(shape)
    ty.backward(torch.from_numpy(gy.astype(np.float64)))
    assert_close(y, ty.detach().numpy().astype(dtype), dtype, "y")
    assert_close(group_softmax_backward(gy, saved), t.grad.numpy().astype(dtype), dtype, "gx")
