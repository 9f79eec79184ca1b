"""Transposed convolution against PyTorch in float64, forward and backward, over 1, 2 and 3 spatial axes; and a
split output: tiles that read the inputs reaching their part and crop it give the whole tensor's values and,
summed, its gradients."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from op_cases import TRANSPOSE_CASES as CASES
from spmdcnn.ops import conv_transpose as ct

TORCH = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _arrays(case, seed=0):
    x_shape, w_shape, *_, bias = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal(w_shape)
    b = rng.standard_normal(w_shape[1]) if bias else None
    return x, w, b


def _geometry(case):
    x_shape, w_shape, stride, padding, output_padding, dilation, _ = case
    return ct.geometry(x_shape[2:], w_shape[2:], stride, padding, output_padding, dilation, rank=len(x_shape) - 2)


@pytest.mark.parametrize("name", CASES)
def test_conv_transpose_equals_pytorch(name):
    case = CASES[name]
    x, w, b = _arrays(case)
    _, _, stride, padding, output_padding, dilation, _ = case
    rank = x.ndim - 2
    y, saved = ct.conv_transpose_forward(x, w, b, _geometry(case))
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    tb = None if b is None else torch.tensor(b, requires_grad=True)
    ty = TORCH[rank](tx, tw, tb, stride=stride, padding=padding, output_padding=output_padding, dilation=dilation)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    gy = np.random.default_rng(1).standard_normal(y.shape)
    ty.backward(torch.tensor(gy))
    gw_out = np.full(w.shape, np.nan)
    gx, gw, gb = ct.conv_transpose_backward(gy, saved, gw_out=gw_out)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gw_out, tw.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert gw is gw_out
    if b is not None:
        np.testing.assert_allclose(gb, tb.grad.numpy(), rtol=1e-12, atol=1e-12)


def _reach(o0, o1, k, s, p, d, extent):
    """The inputs whose contributions reach outputs [o0, o1) of one axis (clipped to the tensor)."""
    lo = max(0, -(-(o0 + p - d * (k - 1)) // s))
    hi = min(extent, (o1 - 1 + p) // s + 1)
    return lo, max(lo, hi)


@pytest.mark.parametrize("name", ["k3_s2_p1_op1_deepcam", "k4_s2_p1", "strided_dilated", "padding_beyond_kernel",
                                  "volume_k3_s2_p1_op1", "sequence_k5_s3_p2_op2"])
@pytest.mark.parametrize("parts", [2, 3])
def test_tiles_crop_their_part_of_the_output(name, parts):
    """Split the output of the last spatial axis: each tile reads the inputs reaching its part, computes them
    with the crop ``[o0 - (i0*s - p), o1 - (i0*s - p))`` and gives the whole op's values there; the input
    gradients of the tiles, added at their inputs, give the whole op's, and their weight gradients sum to it."""
    case = CASES[name]
    x, w, b = _arrays(case)
    whole = _geometry(case)
    y, saved = ct.conv_transpose_forward(x, w, b, whole)
    gy = np.random.default_rng(2).standard_normal(y.shape)
    gx, gw, gb = ct.conv_transpose_backward(gy, saved)
    k, s, d = w.shape[-1], whole.stride[-1], whole.dilation[-1]
    p = whole.crop[-1][0]
    extent, out = x.shape[-1], y.shape[-1]
    gx_sum, gw_sum = np.zeros_like(gx), np.zeros_like(gw)
    for index in range(parts):
        o0, o1 = out * index // parts, out * (index + 1) // parts
        i0, i1 = _reach(o0, o1, k, s, p, d, extent)
        crop = whole.crop[:-1] + ((o0 - (i0 * s - p), o1 - (i0 * s - p)),)
        tile = ct.TransposeGeometry(whole.stride, whole.dilation, crop)
        ty, tsaved = ct.conv_transpose_forward(x[..., i0:i1], w, b, tile)
        np.testing.assert_allclose(ty, y[..., o0:o1], rtol=1e-12, atol=1e-12)
        tgx, tgw, _ = ct.conv_transpose_backward(gy[..., o0:o1], tsaved)
        gx_sum[..., i0:i1] += tgx
        gw_sum += tgw
    np.testing.assert_allclose(gx_sum, gx, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(gw_sum, gw, rtol=1e-11, atol=1e-11)


def test_output_padding_must_be_smaller_than_stride_or_dilation():
    with pytest.raises(ValueError, match="output_padding 2 along spatial axis 1 must be smaller than the stride"):
        ct.geometry((4, 4), (3, 3), stride=2, padding=1, output_padding=[1, 2])
    ct.geometry((4, 4), (3, 3), stride=1, padding=1, output_padding=1, dilation=2)      # below the dilation


def test_float32_is_close_to_float64():
    case = CASES["k3_s2_p1_op1_deepcam"]
    x, w, b = _arrays(case)
    y64, _ = ct.conv_transpose_forward(x, w, b, _geometry(case))
    y32, _ = ct.conv_transpose_forward(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32),
                                       _geometry(case))
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, y64, rtol=1e-4, atol=1e-4)
