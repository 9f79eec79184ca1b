"""The implicit-GEMM convolution (ops/implicit.py: a GEMM per kernel position on shifted rows, through the BLAS
NumPy loaded, ops/blas.py) against PyTorch and against the im2col path, float64 and float32."""

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from spmdcnn.ops import blas, implicit, im2col
from spmdcnn.ops.conv import ConvGeometry, conv_backward, conv_forward, conv_input_gradient

from test_conv_paths import LAYOUT_CASES, reference

pytestmark = [pytest.mark.usefixtures("numpy_convolutions"),              # float32 too: not oneDNN's
              pytest.mark.skipif(blas.gemm(np.float64) is None, reason="no CBLAS GEMM in the BLAS NumPy loaded: "
                                 "the convolutions keep im2col (test_a_missing_blas_keeps_im2col)")]


@pytest.fixture
def everywhere(monkeypatch):
    """The implicit path wherever rows are shifted, in blocks of 5 positions and runs of one padded sample."""
    monkeypatch.setattr(implicit, "MIN_CHANNELS", 1)
    monkeypatch.setattr(implicit, "MIN_POSITIONS", 1)
    monkeypatch.setattr(im2col, "SHIFTED_WASTE", float("inf"))
    monkeypatch.setattr(implicit, "BLOCK_BYTES", 1)             # blocks of 256 positions
    monkeypatch.setattr(implicit, "PAD_BYTES", 1)               # one sample a run
    return monkeypatch


def _ran_implicit(x_shape, w_shape, geometry, x):
    layout = im2col.Layout(x_shape, w_shape[2:], geometry, x.itemsize)
    return implicit.applies(layout, x, geometry.groups)


@pytest.mark.parametrize("chunk", [1, 1 << 30])                  # an output plane a chunk / a sample a chunk
@pytest.mark.parametrize("block", [1, 1 << 30])                  # many blocks of positions / one a chunk
@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_every_kernel_stride_dilation_and_padding_matches_pytorch(everywhere, case, block, chunk):
    everywhere.setattr(implicit, "BLOCK_BYTES", block)
    everywhere.setattr(im2col, "COLUMN_BYTES", chunk)
    x_shape, w_shape, stride, padding, dilation = LAYOUT_CASES[case]
    geometry = ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2)
    rng = np.random.default_rng(5)
    x, w, b = rng.standard_normal(x_shape), rng.standard_normal(w_shape), rng.standard_normal(w_shape[0])
    assert _ran_implicit(x_shape, w_shape, geometry, x)
    y, saved = conv_forward(x, w, b, geometry)
    gy = rng.standard_normal(y.shape)
    gw_out = np.full(w.shape, np.nan)
    gx, gw, gb = conv_backward(gy, saved, gw_out=gw_out)
    ry, rgx, rgw, rgb = reference(x, w, b, geometry.stride, geometry.padding, geometry.dilation, gy)
    assert gw is gw_out
    for got, expected in ((y, ry), (gx, rgx), (gw, rgw), (gb, rgb),
                          (conv_input_gradient(gy, w, x_shape, geometry), rgx)):
        np.testing.assert_allclose(got, expected, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("shape,kernel,stride,padding,dilation,groups", [
    ((3, 32, 30, 26), 3, 1, 1, 1, 1),               # ResNet's 3x3, above the thresholds as it stands
    ((2, 32, 41, 43), 3, 2, 1, 1, 2),               # strided, two groups of 16
    ((1, 16, 12, 32, 32), 2, 1, 0, 1, 1),           # CosmoFlow's 2x2x2
    ((2, 24, 600), 5, 1, 4, 2, 1),                  # a sequence, dilated
])
def test_the_default_thresholds_take_it_and_agree_in_float32(shape, kernel, stride, padding, dilation, groups):
    rank = len(shape) - 2
    K = 2 * groups * 4
    geometry = ConvGeometry(stride, padding, dilation, rank=rank, groups=groups)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((K, shape[1] // groups) + (kernel,) * rank).astype(np.float32)
    assert _ran_implicit(shape, w.shape, geometry, x)
    y, saved = conv_forward(x, w, None, geometry, need_input_grad=False)
    gy = rng.standard_normal(y.shape).astype(np.float32)
    gx, gw, _ = conv_backward(gy, saved)
    assert gx is None and y.dtype == gw.dtype == np.float32
    tx, tw = torch.tensor(x.astype(np.float64), requires_grad=True), torch.tensor(w.astype(np.float64), requires_grad=True)
    ty = getattr(F, f"conv{rank}d")(tx, tw, stride=stride, padding=padding, dilation=dilation, groups=groups)
    ty.backward(torch.tensor(gy.astype(np.float64)))
    eps = np.finfo(np.float32).eps        # float32 sums of n terms: within 8 eps sqrt(n) of the largest magnitude
    terms = {"y": shape[1] // groups * kernel ** rank, "gw": y[0, 0].size * shape[0]}
    for got, expected, n in ((y, ty, terms["y"]), (gw, tw.grad, terms["gw"])):
        expected = expected.detach().numpy()
        assert np.abs(got - expected).max() <= 8 * eps * np.sqrt(n) * np.abs(expected).max()


def test_below_the_thresholds_im2col_runs(monkeypatch):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 8, 30, 30)).astype(np.float32)                 # 8 channels: too few
    layout = im2col.Layout(x.shape, (3, 3), ConvGeometry(1, 1, rank=2), 4)
    assert layout.shifted and not implicit.applies(layout, x, 1)
    x = rng.standard_normal((2, 32, 6, 6)).astype(np.float32)                  # 48 positions: too few
    assert not implicit.applies(im2col.Layout(x.shape, (3, 3), ConvGeometry(1, 1, rank=2), 4), x, 1)


def test_a_missing_blas_keeps_im2col(monkeypatch):
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 32, 20, 20)), rng.standard_normal((8, 32, 3, 3))
    geometry = ConvGeometry(1, 1, rank=2)
    y, saved = conv_forward(x, w, None, geometry)
    gy = rng.standard_normal(y.shape)
    gx, gw, _ = conv_backward(gy, saved)
    monkeypatch.setattr(blas, "_found", {})                 # as where no CBLAS GEMM is found
    assert blas.gemm(np.float64) is None and not _ran_implicit(x.shape, w.shape, geometry, x)
    y2, saved2 = conv_forward(x, w, None, geometry)
    gx2, gw2, _ = conv_backward(gy, saved2)
    for a, b in ((y, y2), (gx, gx2), (gw, gw2)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_the_binding_is_checked_and_can_be_switched_off():
    function = blas.gemm(np.float32)
    assert blas._agrees(function, np.float32) and blas._agrees(blas.gemm(np.float64), np.float64)
    assert not blas._agrees(lambda *args: None, np.float32)          # a GEMM that writes nothing is refused
    assert "off" not in blas.describe()
    code = ("import numpy as np; from spmdcnn.ops import blas; "
            "print(blas.gemm(np.float32) is None, blas.describe())")
    switched = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                              env={**__import__("os").environ, "SPMDCNN_IMPLICIT_GEMM": "off"})
    assert switched.stdout.strip() == "True off (SPMDCNN_IMPLICIT_GEMM=off)", switched.stderr


def test_mixed_types_keep_im2col():
    """The GEMM is chosen by the input's type: a weight or gradient of another type takes im2col, which casts."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 32, 24, 24)).astype(np.float32)
    layout = im2col.Layout(x.shape, (3, 3), ConvGeometry(1, 1, rank=2), 4)
    w32 = rng.standard_normal((8, 32, 3, 3)).astype(np.float32)
    assert implicit.applies(layout, x, 1, w32) and not implicit.applies(layout, x, 1, w32.astype(np.float64))
    assert not implicit.applies(layout, x, 1, w32, np.zeros(3))
    geometry = ConvGeometry(1, 1, rank=2)
    for w in (w32.astype(np.float64), w32):
        y, saved = conv_forward(x.astype(w.dtype), w, None, geometry)
        gy = rng.standard_normal(y.shape)                              # float64 against a float32 forward
        gx, gw, _ = conv_backward(gy, saved)
        assert np.isfinite(gx).all() and np.isfinite(gw).all()


@pytest.mark.parametrize("channels", [32, 3])                   # the implicit path / im2col
@pytest.mark.parametrize("given", [True, False])
def test_an_empty_batch_gives_a_zero_weight_gradient(channels, given):
    x, w = np.zeros((0, channels, 24, 24)), np.ones((8, channels, 3, 3))
    geometry = ConvGeometry(1, 1, rank=2)
    assert _ran_implicit(x.shape, w.shape, geometry, x) == (channels == 32)
    y, saved = conv_forward(x, w, None, geometry)
    gx, gw, _ = conv_backward(np.zeros(y.shape), saved, gw_out=np.full(w.shape, np.nan) if given else None)
    assert y.shape == (0, 8, 24, 24) and gx.shape == x.shape and gw.shape == w.shape and (gw == 0).all()


def test_a_volumes_product_is_chunked_within_the_column_cap():
    layout = im2col.Layout((1, 32, 200, 200, 200), (3, 3, 3), ConvGeometry(1, 1, rank=3), 4)
    assert implicit.takes(layout, 1, np.float32)
    rows = implicit.planes(layout, 64, 4)
    assert rows < layout.out[0] and 64 * rows * layout.plane * 4 <= im2col.COLUMN_BYTES
    from spmdcnn.ops.conv import workspace_elements
    elements = workspace_elements((1, 32, 200, 200, 200), (3, 3, 3), 64, ConvGeometry(1, 1, rank=3), 4)
    padded = 32 * layout.phase_size
    assert elements * 4 <= 2 * padded * 4 + 2 * im2col.COLUMN_BYTES + 2 * 64 * 32 * 27 * 4
