"""Upsampling against PyTorch's ``F.interpolate`` (``scale_factor``) in float64, forward and backward, nearest and
linear with ``align_corners`` both ways, over 1, 2 and 3 spatial axes; and a split output: tiles that read the
inputs their outputs interpolate between give the whole op's values and, added at their inputs, its gradient."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from spmdcnn.ops import upsample as up

SHAPES = {1: (2, 3, 7), 2: (2, 2, 5, 4), 3: (1, 2, 3, 4, 3)}
SCALES = {1: (3,), 2: (2, 3), 3: (2, 1, 3)}
MODES = [("nearest", False), ("linear", False), ("linear", True)]


def _axes(x_shape, scale, mode, align_corners, boxes=None, starts=None, extents=None):
    rank = len(x_shape) - 2
    out = [x_shape[2 + a] * scale[a] for a in range(rank)]
    boxes = boxes or [(0, o) for o in out]
    starts = starts or [0] * rank
    extents = extents or list(x_shape[2:])
    return [up.axis_taps(np, 2 + a, mode, scale[a], align_corners, x_shape[2 + a], out[a], boxes[a], starts[a],
                         extents[a], np.float64) for a in range(rank)]


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("mode, align_corners", MODES)
def test_upsample_equals_pytorch(rank, mode, align_corners):
    rng = np.random.default_rng(rank)
    x = rng.standard_normal(SHAPES[rank])
    y, saved = up.upsample_forward(x, _axes(x.shape, SCALES[rank], mode, align_corners))
    torch_mode = "nearest" if mode == "nearest" else {1: "linear", 2: "bilinear", 3: "trilinear"}[rank]
    tx = torch.tensor(x, requires_grad=True)
    ty = F.interpolate(tx, scale_factor=[float(s) for s in SCALES[rank]], mode=torch_mode,
                       align_corners=align_corners if mode == "linear" else None)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-13, atol=1e-13)
    gy = rng.standard_normal(y.shape)
    ty.backward(torch.tensor(gy))
    np.testing.assert_allclose(up.upsample_backward(gy, saved), tx.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode, align_corners", MODES)
@pytest.mark.parametrize("parts", [2, 3, 5])
def test_tiles_read_what_their_outputs_interpolate(mode, align_corners, parts):
    """The last axis's output split ``parts`` ways (parts of one size read differing inputs: alignment, edges)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 4, 7))
    scale = (2, 3)
    y, saved = up.upsample_forward(x, _axes(x.shape, scale, mode, align_corners))
    gy = rng.standard_normal(y.shape)
    gx = up.upsample_backward(gy, saved)
    out = y.shape[-1]
    total = np.zeros_like(gx)
    for index in range(parts):
        o0, o1 = out * index // parts, out * (index + 1) // parts
        i0, i1 = up.source_range(mode, scale[1], align_corners, x.shape[-1], out, o0, o1)
        axes = _axes(x.shape, scale, mode, align_corners, boxes=[(0, y.shape[2]), (o0, o1)], starts=[0, i0],
                     extents=[x.shape[2], i1 - i0])
        ty, tsaved = up.upsample_forward(x[..., i0:i1], axes)
        np.testing.assert_allclose(ty, y[..., o0:o1], rtol=1e-14, atol=1e-14)
        total[..., i0:i1] += up.upsample_backward(gy[..., o0:o1], tsaved)
    np.testing.assert_allclose(total, gx, rtol=1e-13, atol=1e-13)


def test_float32_stays_float32():
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 3)).astype(np.float32)
    y, saved = up.upsample_forward(x, [up.axis_taps(np, 2 + a, "linear", 2, False, 3, 6, (0, 6), 0, 3, np.float32)
                                       for a in range(2)])
    assert y.dtype == np.float32 and up.upsample_backward(y, saved).dtype == np.float32
