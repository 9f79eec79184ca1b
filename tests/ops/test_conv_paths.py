"""Each convolution path (columns, pointwise, subsampled 1x1) against PyTorch, float64."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from op_cases import CONV_CASES as SHARED_CASES
from spmdcnn.ops.conv import ConvGeometry, conv_backward, conv_forward

pytestmark = pytest.mark.usefixtures("numpy_convolutions")     # NumPy's paths in float32 too, not oneDNN's

# x shape, w shape, stride, padding ((top, bottom), (left, right)), dilation, expected path
CASES = {
    "alexnet_conv1": ((2, 3, 27, 27), (4, 3, 11, 11), 4, ((2, 2), (2, 2)), 1, "direct"),
    "resnet_conv1": ((2, 3, 17, 15), (4, 3, 7, 7), 2, ((3, 3), (3, 3)), 1, "direct"),
    "even_kernel_odd_input": ((2, 2, 13, 11), (3, 2, 8, 6), 2, ((1, 2), (3, 0)), 1, "direct"),
    "uneven_strides": ((1, 2, 14, 19), (3, 2, 6, 9), (2, 3), ((0, 1), (2, 2)), 1, "direct"),
    "stride_2_3x3": ((2, 3, 9, 10), (4, 3, 3, 3), 2, ((1, 1), (1, 1)), 1, "direct"),
    "subsample_1x1": ((2, 5, 9, 8), (6, 5, 1, 1), 2, ((0, 0), (0, 0)), 1, "subsample"),
    "subsample_1x1_uneven": ((2, 5, 9, 8), (6, 5, 1, 1), (3, 2), ((0, 0), (0, 0)), 1, "subsample"),
    "pointwise": ((2, 5, 4, 3), (6, 5, 1, 1), 1, ((0, 0), (0, 0)), 1, "direct"),
    "dilated_strided": ((2, 2, 15, 15), (3, 2, 5, 5), 2, ((2, 2), (1, 3)), 2, "direct"),
}


def reference(x, w, b, stride, padding, dilation, gy):
    pads = tuple(p for pair in reversed(padding) for p in pair)        # F.pad lists the last axis first
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    y = getattr(F, f"conv{x.ndim - 2}d")(F.pad(tx, pads), tw, tb, stride=stride, dilation=dilation)
    y.backward(torch.tensor(gy))
    return y.detach().numpy(), tx.grad.numpy(), tw.grad.numpy(), tb.grad.numpy()


@pytest.mark.parametrize("need_input_grad", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_path_matches_pytorch(case, need_input_grad):
    x_shape, w_shape, stride, padding, dilation, path = CASES[case]
    rng = np.random.default_rng(len(case))
    x, w, b = rng.standard_normal(x_shape), rng.standard_normal(w_shape), rng.standard_normal(w_shape[0])
    geometry = ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2)
    y, saved = conv_forward(x, w, b, geometry, need_input_grad=need_input_grad)
    assert saved[0] == path
    gy = rng.standard_normal(y.shape)
    gw_out = np.full(w.shape, np.nan)
    gx, gw, gb = conv_backward(gy, saved, gw_out=gw_out)
    ry, rgx, rgw, rgb = reference(x, w, b, geometry.stride, padding, geometry.dilation, gy)
    np.testing.assert_allclose(y, ry, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(gw, rgw, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(gw_out, rgw, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(gb, rgb, rtol=1e-11, atol=1e-11)
    if need_input_grad:
        np.testing.assert_allclose(gx, rgx, rtol=1e-11, atol=1e-11)
        assert gx.shape == x.shape
    else:
        assert gx is None


@pytest.mark.parametrize("case", ["pointwise", "stride_2_3x3", "subsample_1x1"])
def test_a_non_contiguous_gw_out_receives_the_gradient(case):
    x_shape, w_shape, stride, padding, dilation, _ = CASES[case]
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    y, saved = conv_forward(x, w, None, ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2))
    gy = rng.standard_normal(y.shape)
    _, expected, _ = conv_backward(gy, saved)
    holder = np.zeros(w_shape[:3] + (w_shape[3] + 2,))
    gw_out = holder[..., 1:1 + w_shape[3]]                 # a strided view, not reshapeable in place
    _, gw, _ = conv_backward(gy, saved, gw_out=gw_out)
    assert gw is gw_out
    np.testing.assert_array_equal(gw_out, expected)


def test_pointwise_weight_gradient_in_sample_blocks(monkeypatch):
    from spmdcnn.ops import im2col
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((7, 5, 4, 3)), rng.standard_normal((6, 5, 1, 1))
    y, saved = conv_forward(x, w, None, ConvGeometry())
    gy = rng.standard_normal(y.shape)
    _, whole, _ = conv_backward(gy, saved)
    monkeypatch.setattr(im2col, "COLUMN_BYTES", 2 * (5 + 6) * 12 * 8)      # two samples per block
    _, blocked, _ = conv_backward(gy, saved)
    np.testing.assert_allclose(blocked, whole, rtol=1e-12)
    _, _, rgw, _ = reference(x, w, np.zeros(6), (1, 1), ((0, 0), (0, 0)), (1, 1), gy)
    np.testing.assert_allclose(blocked, rgw, rtol=1e-11)


LAYOUT_CASES = {name: c[:5] for name, c in SHARED_CASES.items() if max(c[1][2:]) > 1}
LAYOUT_CASES.update({name: c[:5] for name, c in CASES.items() if c[5] == "direct" and max(c[1][2:]) > 1})


@pytest.mark.parametrize("chunks", ["whole", "planes", "plane"])    # one chunk / two or one output planes a chunk
@pytest.mark.parametrize("waste", [0.0, float("inf")])          # strided copies / shifted rows (phases), forced
@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_both_layouts_match_pytorch(monkeypatch, case, waste, chunks):
    """Shifted rows (over the stride's phases where strided) and strided windows give PyTorch's gradients, for
    every kernel, stride, dilation and padding, in one chunk or in chunks of one sample's output planes (the
    columns of a sample larger than the cap)."""
    from spmdcnn.ops import im2col
    monkeypatch.setattr(im2col, "SHIFTED_WASTE", waste)
    x_shape, w_shape, stride, padding, dilation = LAYOUT_CASES[case]
    geometry = ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2)
    layout = im2col.Layout(x_shape, w_shape[2:], geometry, 8)
    if chunks != "whole":
        plane_bytes = x_shape[1] * int(np.prod(w_shape[2:])) * layout.plane * 8
        monkeypatch.setattr(im2col, "COLUMN_BYTES", plane_bytes * (2 if chunks == "planes" else 1))
        layout = im2col.Layout(x_shape, w_shape[2:], geometry, 8)
        rows = 2 if chunks == "planes" else 1
        if layout.out[0] > rows:
            assert (layout.block, layout.rows) == (1, rows)
            assert layout.chunks(x_shape[0]) == [(n, 1, o, min(o + rows, layout.out[0])) for n in range(x_shape[0])
                                                 for o in range(0, layout.out[0], rows)]
        else:                   # a sample's columns fit: blocks of whole samples
            assert layout.rows == layout.out[0] and layout.block == min(x_shape[0], rows // layout.out[0])
    else:
        assert layout.block == x_shape[0] and layout.chunks(x_shape[0]) == [(0, x_shape[0], 0, layout.out[0])]
    assert layout.shifted == (waste > 0 or layout.extents[1:] == layout.out[1:])      # (a sequence's always)
    assert layout.phases == (int(np.prod(geometry.stride)) if layout.shifted else 1)
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal(x_shape), rng.standard_normal(w_shape), rng.standard_normal(w_shape[0])
    y, saved = conv_forward(x, w, b, geometry)
    gy = rng.standard_normal(y.shape)
    gx, gw, gb = conv_backward(gy, saved)
    ry, rgx, rgw, rgb = reference(x, w, b, geometry.stride, geometry.padding, geometry.dilation, gy)
    for got, expected in ((y, ry), (gx, rgx), (gw, rgw), (gb, rgb)):
        np.testing.assert_allclose(got, expected, rtol=1e-11, atol=1e-11)
    if waste == 0.0 and chunks != "whole":          # the transposed convolution's forward: the same chunks
        from spmdcnn.ops.conv import conv_input_gradient
        np.testing.assert_allclose(conv_input_gradient(gy, w, x_shape, geometry), rgx, rtol=1e-11, atol=1e-11)


def test_nested_parallel_for_runs_inline():
    from spmdcnn.ops.parallel import parallel_for
    seen = []

    def outer(start, stop):
        parallel_for(lambda a, b: seen.append((a, b)), 4, 1 << 30)
    parallel_for(outer, 4, 1 << 30)
    assert sorted(seen) == [(0, 4)] * len(seen) and len(seen) >= 1


def test_loops_split_only_where_each_thread_gets_a_grain(monkeypatch):
    from spmdcnn.ops import parallel
    monkeypatch.setenv("SPMDCNN_NUM_THREADS", "2")
    parts = []
    parallel.parallel_for(lambda a, b: parts.append((a, b)), 8, 2 * parallel.GRAIN - 1)
    assert parts == [(0, 8)]
    parts.clear()
    parallel.parallel_for(lambda a, b: parts.append((a, b)), 8, 2 * parallel.GRAIN)
    assert sorted(parts) == [(0, 4), (4, 8)]


@pytest.mark.usefixtures("host_kernels")
def test_split_loops_give_the_bits_of_one_thread(monkeypatch):
    """Every loop shared out between threads (batch norm, pooling, im2col and col2im, the element-wise chunks,
    the SGD update), forced to split at any size and in small blocks, gives exactly what one thread gives."""
    from spmdcnn.ops import batchnorm, leaky_relu, parallel, pool, relu
    from spmdcnn.runtime.optimizer import SGD
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 3, 9, 9)).astype(np.float32)
    volume = rng.integers(-2, 3, (2, 3, 9, 8, 7)).astype(np.float32)     # ties: the first maximum wins
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    gamma, beta = np.ones(3, np.float32), np.zeros(3, np.float32)

    def run():
        y, saved = conv_forward(x, w, None, ConvGeometry(1, 1, 1, rank=2))
        gx, gw, _ = conv_backward(y, saved)
        z, bsaved = batchnorm.batchnorm_forward(x, gamma, beta, np.zeros(3), np.ones(3))
        gz = batchnorm.batchnorm_backward(z * z, bsaved)[0]
        p, psaved = pool.maxpool_forward(x, pool.PoolGeometry(3, 2, 1))
        gp = pool.maxpool_backward(p, psaved)
        volumes = []
        for geometry in (pool.PoolGeometry(2, rank=3), pool.PoolGeometry(3, 2, 1, rank=3)):   # slabs; rows only
            v, vsaved = pool.maxpool_forward(volume, geometry)
            volumes += [v, vsaved.argmax, pool.maxpool_backward(v * v, vsaved)]
        r, rsaved = relu.relu_forward(x)
        lr, lsaved = leaky_relu.leaky_relu_forward(x, 0.3)
        activations = [r, relu.relu_backward(x, rsaved), lr, leaky_relu.leaky_relu_backward(x, lsaved, 0.3)]
        weights, grads = x.ravel().copy(), np.resize(w.ravel(), x.size)
        sgd = SGD({"w": weights.shape}, np.float32, np, lr=0.1, momentum=0.9, weight_decay=1e-4)
        for _ in range(2):
            sgd.step(weights, grads)
        return y, gx, gw, z, gz, p, gp, weights, *volumes, *activations

    monkeypatch.setattr(batchnorm, "ROW_ELEMENTS", 2 * 3 * 9 * 9)      # two samples a call: three blocks
    monkeypatch.setenv("SPMDCNN_NUM_THREADS", "1")
    alone = run()
    monkeypatch.setenv("SPMDCNN_NUM_THREADS", "3")
    monkeypatch.setattr(parallel, "GRAIN", 1)
    monkeypatch.setattr(parallel, "CHUNK", 37)              # element-wise chunks of 37, the last one shorter
    monkeypatch.setattr(pool, "CHUNK", 4)                   # pooling blocks of one output plane or row
    monkeypatch.setattr("spmdcnn.runtime.optimizer.BLOCK", 16)
    split = run()
    for a, b in zip(alone, split):
        np.testing.assert_array_equal(a, b)
