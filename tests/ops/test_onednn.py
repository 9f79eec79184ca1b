"""Convolutions on oneDNN (ops/onednn.py, the ``onednn`` extra; the test extra installs it) against PyTorch in
float64, to float32's error bounds: every kernel, stride, dilation, per-side padding, group count and spatial rank
of the shared cases; and where it does not run, NumPy's paths."""

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from op_cases import CONV_CASES
from spmdcnn.ops import dnnl, onednn
from spmdcnn.ops.conv import ConvGeometry, conv_backward, conv_forward, conv_input_gradient, workspace_elements

pytestmark = pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is not installed ({dnnl.FAILED}; "
                                "pip install -e '.[test]' installs it)")
EPS = np.finfo(np.float32).eps


@pytest.fixture(autouse=True)
def enabled(monkeypatch):
    monkeypatch.setattr(onednn, "ENABLED", True)


def _within_float32(got, expected, terms):
    """A float32 sum of ``terms`` products: within 8 eps sqrt(terms) of the largest magnitude (as the implicit
    GEMM's and im2col's tests)."""
    expected = expected.detach().numpy() if isinstance(expected, torch.Tensor) else expected
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.abs(got - expected).max() <= 8 * EPS * np.sqrt(terms) * max(np.abs(expected).max(), 1e-30)


def _reference(x, w, b, geometry, gy):
    pads = tuple(p for pair in reversed(geometry.padding) for p in pair)        # F.pad lists the last axis first
    tx, tw = (torch.tensor(a.astype(np.float64), requires_grad=True) for a in (x, w))
    tb = None if b is None else torch.tensor(b.astype(np.float64), requires_grad=True)
    y = getattr(F, f"conv{x.ndim - 2}d")(F.pad(tx, pads), tw, tb, stride=geometry.stride,
                                         dilation=geometry.dilation, groups=geometry.groups)
    y.backward(torch.tensor(gy.astype(np.float64)))
    return y, tx.grad, tw.grad, None if tb is None else tb.grad


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_every_shared_case_matches_pytorch_to_float32(case, groups):
    x_shape, w_shape, stride, padding, dilation, bias = CONV_CASES[case]
    x_shape = (x_shape[0], x_shape[1] * groups) + x_shape[2:]              # groups of the case's channels
    w_shape = (w_shape[0] * groups,) + w_shape[1:]
    geometry = ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2, groups=groups)
    rng = np.random.default_rng(len(case) + groups)
    x, w = rng.standard_normal(x_shape).astype(np.float32), rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32) if bias else None
    y, saved = conv_forward(x, w, b, geometry)
    assert saved.kind == "onednn"
    gy = rng.standard_normal(y.shape).astype(np.float32)
    gw_out = np.full(w.shape, np.nan, np.float32)
    gx, gw, gb = conv_backward(gy, saved, gw_out=gw_out)
    ry, rgx, rgw, rgb = _reference(x, w, b, geometry, gy)
    taps = int(np.prod(w_shape[1:]))
    assert gw is gw_out
    _within_float32(y, ry, taps)
    _within_float32(gx, rgx, w_shape[0] * int(np.prod(w_shape[2:])))
    _within_float32(gw, rgw, y[0, 0].size * x_shape[0])
    _within_float32(conv_input_gradient(gy, w, x_shape, geometry), rgx, w_shape[0] * int(np.prod(w_shape[2:])))
    if bias:
        _within_float32(gb, rgb, y[0, 0].size * x_shape[0])
    else:
        assert gb is None


def test_a_first_layer_skips_its_input_gradient_and_takes_strided_arrays():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, 20, 18)).astype(np.float32)[::2]        # not contiguous
    w = rng.standard_normal((16, 3, 5, 5)).astype(np.float32)
    geometry = ConvGeometry(2, 2, rank=2)
    y, saved = conv_forward(x, w, None, geometry, need_input_grad=False)
    gy = rng.standard_normal(y.shape).astype(np.float32)
    gw_out = np.full((5, 5, 3, 16), np.nan, np.float32).transpose(3, 2, 1, 0)    # a view: copied into
    gx, gw, gb = conv_backward(gy[:, :, :, :], saved, gw_out=gw_out)
    ry, _, rgw, _ = _reference(x, w, None, geometry, gy)
    assert gx is None and gb is None and gw is gw_out
    _within_float32(y, ry, 75)
    _within_float32(gw, rgw, y[0, 0].size * 2)


def test_depthwise_and_volumes_and_sequences():
    rng = np.random.default_rng(4)
    for x_shape, w_shape, geometry in (
            ((2, 32, 14, 14), (32, 1, 3, 3), ConvGeometry(1, 1, rank=2, groups=32)),
            ((1, 16, 10, 12, 8), (32, 16, 2, 2, 2), ConvGeometry(2, 0, rank=3)),
            ((2, 24, 300), (16, 24, 5), ConvGeometry(1, 4, 2, rank=1))):
        x, w = rng.standard_normal(x_shape).astype(np.float32), rng.standard_normal(w_shape).astype(np.float32)
        y, saved = conv_forward(x, w, None, geometry)
        gy = rng.standard_normal(y.shape).astype(np.float32)
        gx, gw, _ = conv_backward(gy, saved)
        ry, rgx, rgw, _ = _reference(x, w, None, geometry, gy)
        assert saved.kind == "onednn"
        _within_float32(y, ry, int(np.prod(w_shape[1:])))
        _within_float32(gx, rgx, int(np.prod(w_shape[::2])))
        _within_float32(gw, rgw, y[0, 0].size * x_shape[0])


def test_primitives_are_kept_per_shape():
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((2, 16, 9, 9)).astype(np.float32), rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    geometry = ConvGeometry(1, 1, rank=2)
    first = onednn.convolution(x.shape, w.shape, geometry, False)
    y1, _ = conv_forward(x, w, None, geometry)
    assert onednn.convolution(x.shape, w.shape, geometry, False) is first
    assert onednn.convolution((3,) + x.shape[1:], w.shape, geometry, False) is not first
    y2, _ = conv_forward(x, w, None, geometry)
    np.testing.assert_array_equal(y1, y2)                                   # the same primitive: the same sums
    assert first.implementations() and all(isinstance(name, str) for name in first.implementations())


def test_other_types_and_a_rejected_case_run_on_numpy(monkeypatch):
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((2, 4, 8, 8)), rng.standard_normal((4, 4, 3, 3))
    geometry = ConvGeometry(1, 1, rank=2)
    assert conv_forward(x, w, None, geometry)[1].kind == "direct"          # float64: NumPy's, plans' equivalence

    def rejects(*args):
        raise dnnl.Rejected("oneDNN's convolution forward: status 3")
    monkeypatch.setattr(onednn, "_Convolution", rejects)
    monkeypatch.setattr(onednn, "_cache", type(onednn._cache)())
    monkeypatch.setattr(onednn, "_warned", False)
    x32, w32 = x.astype(np.float32), w.astype(np.float32)
    with pytest.warns(RuntimeWarning, match="oneDNN declined a convolution"):
        y, saved = conv_forward(x32, w32, None, geometry)
    assert saved.kind == "direct"
    gy = rng.standard_normal(y.shape).astype(np.float32)
    ry, rgx, rgw, _ = _reference(x32, w32, None, geometry, gy)
    gx, gw, _ = conv_backward(gy, saved)
    _within_float32(y, ry, 36)
    _within_float32(gx, rgx, 36)


def test_a_float64_gradient_of_a_float32_forward_runs_on_numpy():
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((2, 16, 8, 8)).astype(np.float32), rng.standard_normal((8, 16, 3, 3)).astype(np.float32)
    geometry = ConvGeometry(1, 1, rank=2)
    y, saved = conv_forward(x, w, None, geometry)
    gy = rng.standard_normal(y.shape)
    gx, gw, _ = conv_backward(gy, saved)
    _, rgx, rgw, _ = _reference(x, w, None, geometry, gy)
    np.testing.assert_allclose(gw, rgw.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gx, rgx.numpy(), rtol=1e-4, atol=1e-4)


def test_the_workspace_counts_blocked_copies():
    geometry = ConvGeometry(1, 1, rank=2)
    elements = workspace_elements((16, 64, 56, 56), (3, 3), 64, geometry, 4)
    assert elements == 2 * 16 * 64 * 56 * 56 + 2 * 16 * 64 * 56 * 56 + 2 * 64 * 64 * 9     # x, y and w, each twice
    assert workspace_elements((1, 3, 10, 10), (3, 3), 8, geometry, 4) == 2 * 16 * 100 + 2 * 16 * 100 + 2 * 16 * 16 * 9


@pytest.mark.parametrize("setting,expected", [("off", "float32 convolutions NumPy's (oneDNN switched off"),
                                              ("", "float32 convolutions oneDNN 3.")])
def test_the_start_up_line_says_what_runs_the_convolutions(setting, expected):
    code = ("from spmdcnn.runtime.bench import describe_host; import numpy as np; "
            "from spmdcnn.ops.conv import ConvGeometry, conv_forward; "
            "x = np.ones((1, 8, 6, 6), np.float32); w = np.ones((8, 8, 3, 3), np.float32); "
            "print(describe_host()); print(conv_forward(x, w, None, ConvGeometry(1, 1, rank=2))[1].kind)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "SPMDCNN_ONEDNN": setting})
    assert run.returncode == 0, run.stderr
    line, kind = run.stdout.strip().splitlines()
    assert expected in line
    assert kind == ("direct" if setting == "off" else "onednn")


def test_a_missing_library_is_said(monkeypatch):
    monkeypatch.setattr(dnnl, "_candidates", lambda: ["/nonexistent/libdnnl.so.3"])
    monkeypatch.setattr(dnnl, "_library", None)
    monkeypatch.setattr(dnnl, "FAILED", None)
    assert not onednn.available() and "nonexistent" in dnnl.FAILED
    assert "oneDNN not usable: " in onednn.describe() and "nonexistent" in onednn.describe()
    x = np.ones((1, 4, 5, 5), np.float32)
    assert conv_forward(x, np.ones((4, 4, 3, 3), np.float32), None, ConvGeometry(1, 1, rank=2))[1].kind == "direct"


def test_the_memory_model_counts_the_blocked_copies_as_the_layers_workspace():
    import os
    from spmdcnn.cost.memory import layer_transient
    from spmdcnn.graph import load_model
    graph = load_model(os.path.join(os.path.dirname(__file__), "..", "..", "models", "cosmoflow.yaml"))
    conv = graph.by_name["conv2.conv"]                                     # 32 x 64^3 -> 64, 2x2x2, padded
    x_shape, out = (1, 32, 64, 64, 64), (1, 64, 64, 64, 64)
    boxes = layer_transient(conv, (1, 1, 1, 1, 1), 1, im2col=False)
    blocked = 2 * 32 * 64 ** 3 + 2 * 64 * 64 ** 3 + 2 * 64 * 32 * 8
    assert layer_transient(conv, (1, 1, 1, 1, 1), 1) - boxes == 4 * blocked
    assert boxes >= 4 * (np.prod(x_shape) + np.prod(out))


def test_an_empty_batch_gives_zero_gradients():
    x, w, b = np.zeros((0, 8, 24, 24), np.float32), np.ones((8, 8, 3, 3), np.float32), np.ones(8, np.float32)
    y, saved = conv_forward(x, w, b, ConvGeometry(1, 0, rank=2))
    assert saved.kind == "onednn" and y.shape == (0, 8, 22, 22)
    gx, gw, gb = conv_backward(np.zeros(y.shape, np.float32), saved, gw_out=np.full(w.shape, np.nan, np.float32))
    assert gx.shape == x.shape and (gw == 0).all() and (gb == 0).all()


def test_a_declined_backward_runs_on_numpy(monkeypatch):
    """oneDNN builds a forward but declines its backward primitives: NumPy's paths give both gradients, and the
    transposed convolution's input gradient too."""
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((2, 16, 9, 9)).astype(np.float32), rng.standard_normal((8, 16, 3, 3)).astype(np.float32)
    geometry = ConvGeometry(1, 1, rank=2)
    monkeypatch.setattr(onednn, "_cache", type(onednn._cache)())
    monkeypatch.setattr(onednn, "_warned", False)
    created = dnnl.Library.created

    def declining(self, what, *arguments):
        if what.startswith("convolution backward"):
            raise dnnl.Rejected(f"oneDNN's {what}: status 3")
        return created(self, what, *arguments)
    monkeypatch.setattr(dnnl.Library, "created", declining)
    y, saved = conv_forward(x, w, None, geometry)
    assert saved.kind == "onednn"
    gy = rng.standard_normal(y.shape).astype(np.float32)
    with pytest.warns(RuntimeWarning, match="declined"):
        assert onednn.conv_backward(gy, saved) is None
    gx, gw, _ = conv_backward(gy, saved)
    _, rgx, rgw, _ = _reference(x, w, None, geometry, gy)
    _within_float32(gx, rgx, 72)
    _within_float32(gw, rgw, 162)
    _within_float32(conv_input_gradient(gy, w, x.shape, geometry), rgx, 72)


def test_operands_above_the_scratch_cap_live_through_the_call(monkeypatch):
    """Scratch arrays above ``KEPT_BYTES`` are not kept by the scratch buffers: the operand holds them while oneDNN
    reorders into and works on them (here every one of them is such an array)."""
    from spmdcnn.ops import scratch
    monkeypatch.setattr(scratch, "KEPT_BYTES", 0)
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal((4, 32, 40, 40)).astype(np.float32), rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    geometry = ConvGeometry(1, 1, rank=2)
    y, saved = conv_forward(x, w, b, geometry)
    gy = rng.standard_normal(y.shape).astype(np.float32)
    gx, gw, gb = conv_backward(gy, saved)
    ry, rgx, rgw, rgb = _reference(x, w, b, geometry, gy)
    _within_float32(y, ry, 288)
    _within_float32(gx, rgx, 288)
    _within_float32(gw, rgw, 6400)
    found = onednn.convolution(x.shape, w.shape, geometry, True)
    assert all(operand.buffer is None for step in (found.forward, found.data, found.weights)
               for operand in step[2].values())                                 # released after the call
