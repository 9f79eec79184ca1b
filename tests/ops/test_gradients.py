"""Every op's analytic backward against central finite differences, in float64.

The objective is ``L = sum(y * R)`` with a fixed random ``R``, so ``gy = R`` and the backward of an op must give
``dL/dx`` (and the parameter gradients). Each gradient is checked on a set of single coordinates (all of them for
small tensors, a random subset otherwise) and along random directions, which catch an error in any coordinate.
Inputs avoid non-differentiable points: relu inputs stay away from 0, max-pool inputs have well separated values.
"""

import numpy as np
import pytest

from spmdcnn.ops import im2col
from spmdcnn.ops.add import add_backward, add_forward
from spmdcnn.ops.batchnorm import batchnorm_backward, batchnorm_forward
from spmdcnn.ops.concat import concat_backward, concat_forward
from spmdcnn.ops.conv import ConvGeometry, conv_backward, conv_forward
from spmdcnn.ops.dropout import dropout_backward, dropout_forward, stream_key
from spmdcnn.ops.flatten import flatten_backward, flatten_forward
from spmdcnn.ops.linear import linear_backward, linear_forward
from spmdcnn.ops.loss import softmax_cross_entropy_backward, softmax_cross_entropy_forward
from spmdcnn.ops.pool import (PoolGeometry, avgpool_backward, avgpool_forward, global_avgpool_backward,
                              global_avgpool_forward, maxpool_backward, maxpool_forward)
from spmdcnn.ops.relu import relu_backward, relu_forward
from op_cases import CONV_CASES, POOL_CASES

STEP = 1e-6          # central differences: truncation ~STEP**2, rounding ~1e-16 * |L| / STEP
RTOL = 1e-6
COORDINATES = 40     # coordinates checked one by one in a tensor larger than this
DIRECTIONS = 2


def _coordinates(size, rng):
    if size <= COORDINATES:
        return np.arange(size)
    chosen = rng.choice(size, COORDINATES - 2, replace=False)
    return np.unique(np.concatenate([[0, size - 1], chosen]))  # corners touch the padding


def _difference(objective, array, direction):
    saved = array.copy()
    array += STEP * direction
    plus = objective()
    array[...] = saved - STEP * direction
    minus = objective()
    array[...] = saved
    return (plus - minus) / (2 * STEP)


def check_weighted(objective, rng, bias, *pairs):
    """The input, weight and bias gradients (each ``(array, gradient)``) of a conv or linear layer; without a
    bias the layer must return no bias gradient."""
    for name, (array, analytic) in zip("xwb", pairs):
        if name == "b" and not bias:
            assert analytic is None
        else:
            check_gradient(objective, array, analytic, rng, name)


def check_gradient(objective, array, analytic, rng, name="x"):
    """Compare ``analytic`` with central differences of ``objective()`` wrt ``array`` (perturbed in place)."""
    assert analytic is not None, f"{name}: no gradient returned"
    assert analytic.shape == array.shape, f"{name}: gradient shape {analytic.shape} != {array.shape}"
    scale = max(np.abs(analytic).max(), 1e-3)
    numeric, expected = [], []
    for flat in _coordinates(array.size, rng):
        direction = np.zeros_like(array)
        direction.flat[flat] = 1.0
        numeric.append(_difference(objective, array, direction))
        expected.append(analytic.flat[flat])
    np.testing.assert_allclose(expected, numeric, rtol=RTOL, atol=RTOL * scale, err_msg=f"d/d{name} coordinates")
    for _ in range(DIRECTIONS):
        direction = rng.standard_normal(array.shape)
        numeric = _difference(objective, array, direction)
        np.testing.assert_allclose(np.sum(analytic * direction), numeric, rtol=RTOL,
                                   atol=RTOL * scale * np.sqrt(array.size), err_msg=f"d/d{name} direction")


def away_from_zero(rng, shape, gap=0.1):
    x = rng.standard_normal(shape)
    return np.where(x >= 0, x + gap, x - gap)


def distinct(rng, shape, spacing=1e-2):
    """Values that differ pairwise by at least ``spacing`` (no max-pool ties, even after a small step)."""
    size = int(np.prod(shape))
    return (rng.permutation(size) * spacing - size * spacing / 2).reshape(shape).astype(np.float64)


# ------------------------------------------------------------------------------------------------- conv2d



def conv_gradient_check(x_shape, w_shape, stride, padding, dilation, bias, seed):
    rng = np.random.default_rng(seed)
    geometry = ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2)
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal(w_shape)
    b = rng.standard_normal(w_shape[0]) if bias else None
    y, saved = conv_forward(x, w, b, geometry)
    R = rng.standard_normal(y.shape)
    gx, gw, gb = conv_backward(R, saved)

    def objective():
        return float(np.sum(conv_forward(x, w, b, geometry)[0] * R))

    check_weighted(objective, rng, bias, (x, gx), (w, gw), (b, gb))


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_gradients(case):
    conv_gradient_check(*CONV_CASES[case], seed=len(case))


@pytest.mark.parametrize("case", ["stride1_3x3_pad1", "strided_dilated_per_side", "volume_per_side_dilated"])
@pytest.mark.parametrize("block", [1, 2])
def test_conv_gradients_in_sample_blocks(monkeypatch, case, block):
    x_shape, w_shape, stride, padding, dilation, bias = CONV_CASES[case]
    x_shape = (5,) + x_shape[1:]   # 5 samples: blocks of 2 leave a partial last block
    layout = im2col.Layout(x_shape, w_shape[2:], ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2), 8)
    per_sample = x_shape[1] * int(np.prod(w_shape[2:])) * layout.P * 8    # float64
    monkeypatch.setattr(im2col, "COLUMN_BYTES", block * per_sample)
    assert im2col.Layout(x_shape, w_shape[2:], ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2), 8).block == block
    conv_gradient_check(x_shape, w_shape, stride, padding, dilation, bias, seed=7)


# ------------------------------------------------------------------------------------------------ pooling



@pytest.mark.parametrize("case", list(POOL_CASES))
def test_maxpool_gradients(case):
    x_shape, kernel, stride, padding = POOL_CASES[case]
    rng = np.random.default_rng(11)
    geometry = PoolGeometry(kernel, stride, padding, rank=len(x_shape) - 2)
    x = distinct(rng, x_shape)
    y, saved = maxpool_forward(x, geometry)
    R = rng.standard_normal(y.shape)
    gx = maxpool_backward(R, saved)
    check_gradient(lambda: float(np.sum(maxpool_forward(x, geometry)[0] * R)), x, gx, rng)


@pytest.mark.parametrize("case", list(POOL_CASES))
def test_avgpool_gradients(case):
    x_shape, kernel, stride, padding = POOL_CASES[case]
    rng = np.random.default_rng(12)
    geometry = PoolGeometry(kernel, stride, padding, rank=len(x_shape) - 2)
    x = rng.standard_normal(x_shape)
    y, saved = avgpool_forward(x, geometry)
    R = rng.standard_normal(y.shape)
    gx = avgpool_backward(R, saved)
    check_gradient(lambda: float(np.sum(avgpool_forward(x, geometry)[0] * R)), x, gx, rng)


@pytest.mark.parametrize("x_shape", [(2, 3, 5, 7), (3, 1, 1, 1), (1, 4, 6, 1), (2, 2, 3, 4, 5)])
def test_global_avgpool_gradients(x_shape):
    rng = np.random.default_rng(13)
    x = rng.standard_normal(x_shape)
    y, saved = global_avgpool_forward(x)
    assert y.shape == x_shape[:2] + (1,) * (len(x_shape) - 2)
    R = rng.standard_normal(y.shape)
    gx = global_avgpool_backward(R, saved)
    check_gradient(lambda: float(np.sum(global_avgpool_forward(x)[0] * R)), x, gx, rng)


# ------------------------------------------------------------------------------------- element-wise, shape

@pytest.mark.parametrize("x_shape", [(2, 3, 5, 7), (7, 5)])
def test_relu_gradients(x_shape):
    rng = np.random.default_rng(14)
    x = away_from_zero(rng, x_shape)
    y, saved = relu_forward(x)
    R = rng.standard_normal(y.shape)
    gx = relu_backward(R, saved)
    check_gradient(lambda: float(np.sum(relu_forward(x)[0] * R)), x, gx, rng)


def test_flatten_gradients():
    rng = np.random.default_rng(15)
    x = rng.standard_normal((3, 2, 5, 3))
    y, saved = flatten_forward(x)
    assert y.shape == (3, 30)
    R = rng.standard_normal(y.shape)
    gx = flatten_backward(R, saved)
    check_gradient(lambda: float(np.sum(flatten_forward(x)[0] * R)), x, gx, rng)


def test_concat_gradients():
    rng = np.random.default_rng(16)
    xs = [rng.standard_normal((2, c, 3, 5)) for c in (1, 3, 2)]
    y, saved = concat_forward(xs)
    R = rng.standard_normal(y.shape)
    grads = concat_backward(R, saved)
    assert len(grads) == len(xs)
    for i, (x, gx) in enumerate(zip(xs, grads)):
        check_gradient(lambda: float(np.sum(concat_forward(xs)[0] * R)), x, gx, rng, f"x{i}")


@pytest.mark.parametrize("count", [2, 3])
def test_add_gradients(count):
    rng = np.random.default_rng(17)
    xs = [rng.standard_normal((2, 3, 4, 5)) for _ in range(count)]
    y, saved = add_forward(xs)
    R = rng.standard_normal(y.shape)
    grads = add_backward(R, saved)
    assert len(grads) == count
    for i, (x, gx) in enumerate(zip(xs, grads)):
        check_gradient(lambda: float(np.sum(add_forward(xs)[0] * R)), x, gx, rng, f"x{i}")


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_dropout_gradients(p):
    rng = np.random.default_rng(18)
    x = rng.standard_normal((3, 4, 5, 3))
    key = stream_key(5, 2, "drop")
    y, saved = dropout_forward(x, p, key)
    R = rng.standard_normal(y.shape)
    gx = dropout_backward(R, saved)
    check_gradient(lambda: float(np.sum(dropout_forward(x, p, key)[0] * R)), x, gx, rng)


# ----------------------------------------------------------------------------------------------- linear

@pytest.mark.parametrize("shape,bias", [((5, 7, 3), True), ((1, 4, 6), True), ((4, 9, 2), False)])
def test_linear_gradients(shape, bias):
    N, F_in, F_out = shape
    rng = np.random.default_rng(19)
    x = rng.standard_normal((N, F_in))
    w = rng.standard_normal((F_out, F_in))
    b = rng.standard_normal(F_out) if bias else None
    y, saved = linear_forward(x, w, b)
    R = rng.standard_normal(y.shape)
    gx, gw, gb = linear_backward(R, saved)

    def objective():
        return float(np.sum(linear_forward(x, w, b)[0] * R))

    check_weighted(objective, rng, bias, (x, gx), (w, gw), (b, gb))


# -------------------------------------------------------------------------------------------- batchnorm

@pytest.mark.usefixtures("host_kernels")
@pytest.mark.parametrize("x_shape", [(3, 4, 5, 3), (2, 3, 1, 1), (1, 2, 3, 5)])
def test_batchnorm2d_training_gradients(x_shape):
    rng = np.random.default_rng(20)
    C = x_shape[1]
    x = 2.0 * rng.standard_normal(x_shape) + 0.5
    gamma = rng.standard_normal(C)
    beta = rng.standard_normal(C)
    running_mean, running_var = rng.standard_normal(C), rng.uniform(0.5, 2.0, C)

    def forward():
        # running statistics are updated in place on every forward: give each call its own copies
        return batchnorm_forward(x, gamma, beta, running_mean.copy(), running_var.copy(), eps=1e-5,
                                   momentum=0.1, training=True)

    y, saved = forward()
    R = rng.standard_normal(y.shape)
    gx, ggamma, gbeta = batchnorm_backward(R, saved)

    def objective():
        return float(np.sum(forward()[0] * R))

    check_gradient(objective, x, gx, rng, "x")
    check_gradient(objective, gamma, ggamma, rng, "gamma")
    check_gradient(objective, beta, gbeta, rng, "beta")


def test_batchnorm2d_eval_gradient():
    rng = np.random.default_rng(21)
    x = rng.standard_normal((3, 4, 3, 5))
    gamma, beta = rng.standard_normal(4), rng.standard_normal(4)
    running_mean, running_var = rng.standard_normal(4), rng.uniform(0.5, 2.0, 4)

    def forward():
        return batchnorm_forward(x, gamma, beta, running_mean, running_var, eps=1e-3, momentum=0.1,
                                   training=False)

    y, saved = forward()
    R = rng.standard_normal(y.shape)
    gx = batchnorm_backward(R, saved)[0]
    check_gradient(lambda: float(np.sum(forward()[0] * R)), x, gx, rng)


# ------------------------------------------------------------------------------------------------- loss

@pytest.mark.parametrize("N,F,total", [(5, 7, None), (5, 7, 12), (1, 3, None), (4, 10, 9)])
def test_softmax_cross_entropy_gradients(N, F, total):
    rng = np.random.default_rng(22)
    logits = 3.0 * rng.standard_normal((N, F))
    labels = rng.integers(0, F, N)
    gloss = 1.7

    def objective():
        return gloss * softmax_cross_entropy_forward(logits, labels, total)[0]

    _, saved = softmax_cross_entropy_forward(logits, labels, total)
    glogits = softmax_cross_entropy_backward(gloss, saved)
    check_gradient(objective, logits, glogits, rng, "logits")
