"""Grouped and depthwise convolutions (PyTorch's ``groups``) against PyTorch, in float64 and within float32's
rounding bound: every path (pointwise, strided kernel 1, shifted rows, strided columns, the host's depthwise taps),
1 to 3 spatial axes, in sample and channel blocks, and a tile of some of the output channels (whole groups) reading
only its groups' input channels."""

import numpy as np
import pytest

from float32_bounds import conv_lengths
from op_cases import GROUPED_CASES
from spmdcnn.ops import depthwise, im2col
from spmdcnn.ops.conv import ConvGeometry, conv_backward, conv_forward, conv_input_gradient, group_inputs
from test_ops_vs_torch import DTYPES, assert_expected, blas_reference, random, torch_op, torch_pad


def torch_grouped(stride, padding, dilation, groups):
    def run(x, w, b=None):
        return torch_op("conv", x.dim() - 2)(torch_pad(x, padding), w, b, stride=stride, dilation=dilation,
                                             groups=groups)
    return run


def inputs(case, dtype, seed=0, batch=None):
    x_shape, w_shape, stride, padding, dilation, bias, groups = GROUPED_CASES[case]
    if batch is not None:
        x_shape = (batch,) + x_shape[1:]
    rng = np.random.default_rng(seed)
    x, w = random(rng, x_shape, dtype), random(rng, w_shape, dtype)
    b = random(rng, w_shape[0], dtype) if bias else None
    geometry = ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2, groups=groups)
    R = random(rng, (x_shape[0], w_shape[0]) + geometry.output_shape(x_shape[2:], w_shape[2:]), dtype)
    return x, w, b, geometry, R


def check(case, dtype, seed=0, batch=None, need_input_grad=True):
    x, w, b, geometry, R = inputs(case, dtype, seed, batch)
    padding = GROUPED_CASES[case][3]
    expected = blas_reference(torch_grouped(geometry.stride, padding, geometry.dilation, geometry.groups),
                              [x, w] + ([b] if b is not None else []), R, dtype,
                              {**conv_lengths(x.shape, w.shape, R.shape), "y": w[0].size + (b is not None)})
    gw_out = np.full(w.shape, np.nan, dtype=dtype)          # stale content must be overwritten
    y, saved = conv_forward(x, w, b, geometry, need_input_grad=need_input_grad)
    assert_expected(y, expected["y"], dtype, f"{case} y")
    gx, gw, gb = conv_backward(R, saved, gw_out=gw_out)
    assert np.shares_memory(gw, gw_out)
    assert_expected(gw, expected["gw"], dtype, f"{case} gw")
    if need_input_grad:
        assert_expected(gx, expected["gx"], dtype, f"{case} gx")
        assert_expected(conv_input_gradient(R, w, x.shape, geometry), expected["gx"], dtype, f"{case} input grad")
    else:
        assert gx is None
    if b is not None:
        assert_expected(gb, expected["gb"], dtype, f"{case} gb")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(GROUPED_CASES))
def test_grouped_convolution_against_pytorch(case, dtype):
    check(case, dtype)


@pytest.mark.parametrize("case", sorted(GROUPED_CASES))
def test_grouped_convolution_without_input_gradient(case):
    check(case, np.float64, need_input_grad=False)


@pytest.mark.parametrize("case", ["depthwise_3x3", "grouped_strided_rect", "volume_grouped_strided",
                                  "grouped_pointwise"])
def test_grouped_convolution_in_sample_blocks(monkeypatch, case):
    """A column buffer of one sample: the blocks' weight gradients add up per group."""
    monkeypatch.setattr(im2col, "COLUMN_BYTES", 1)
    check(case, np.float64, seed=2, batch=5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["depthwise_3x3", "depthwise_x2_strided", "volume_depthwise"])
def test_depthwise_convolution_in_channel_blocks(monkeypatch, case, dtype):
    """The host's depthwise path over blocks of one channel (each a thread's part where that pays) and of all."""
    for block in (1, 1 << 20):
        monkeypatch.setattr(depthwise, "BLOCK", block)
        check(case, dtype, seed=5, batch=3)


@pytest.mark.parametrize("case", ["depthwise_x2_strided", "grouped_dilated_per_side", "volume_depthwise",
                                  "sequence_grouped", "grouped_strided_1x1"])
def test_a_tile_of_whole_groups_is_the_convolution_of_its_groups(case):
    """Output channels [k0, k1) of whole groups read input channels group_inputs(...) alone and give the whole
    convolution's channels, their weight and bias gradients, and the input gradient those outputs send."""
    x, w, b, geometry, R = inputs(case, np.float64, seed=3)
    K, groups = w.shape[0], geometry.groups
    per_group = K // groups
    y, saved = conv_forward(x, w, b, geometry)
    for g0, g1 in [(0, 1), (1, groups), (groups - 1, groups)]:
        k0, k1 = g0 * per_group, g1 * per_group
        c0, c1 = group_inputs(k0, k1, K, x.shape[1], groups)
        assert (c0, c1) == (g0 * x.shape[1] // groups, g1 * x.shape[1] // groups)
        tile = ConvGeometry(geometry.stride, geometry.padding, geometry.dilation, geometry.rank, groups=g1 - g0)
        y_tile, saved_tile = conv_forward(x[:, c0:c1], w[k0:k1], None if b is None else b[k0:k1], tile)
        np.testing.assert_allclose(y_tile, y[:, k0:k1], rtol=1e-12, atol=1e-12)
        masked = np.zeros_like(R)
        masked[:, k0:k1] = R[:, k0:k1]
        gx, gw, gb = conv_backward(masked, saved)
        gx_tile, gw_tile, gb_tile = conv_backward(R[:, k0:k1], saved_tile)
        np.testing.assert_allclose(gw_tile, gw[k0:k1], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(gx_tile, gx[:, c0:c1], rtol=1e-12, atol=1e-12)
        assert not np.any(np.delete(gx, np.s_[c0:c1], axis=1)), "outputs of other groups' channels read nothing"
        if b is not None:
            np.testing.assert_allclose(gb_tile, gb[k0:k1], rtol=1e-12, atol=1e-12)


def test_group_inputs_of_channels_inside_groups():
    # 12 outputs in 3 groups of 4, 6 inputs in 3 groups of 2
    assert group_inputs(0, 12, 12, 6, 3) == (0, 6)
    assert group_inputs(4, 8, 12, 6, 3) == (2, 4)
    assert group_inputs(5, 9, 12, 6, 3) == (2, 6)       # inside groups 1 and 2
    assert group_inputs(3, 3, 12, 6, 3) == (0, 0)       # no channels: nothing


def test_a_weight_that_does_not_fit_the_groups_is_refused():
    x = np.zeros((1, 4, 5, 5))
    with pytest.raises(ValueError, match="weight expects 4 in each of 2 groups"):
        conv_forward(x, np.zeros((4, 4, 3, 3)), None, ConvGeometry(groups=2))
    with pytest.raises(ValueError, match="5 output channels do not fall evenly in 2 groups"):
        conv_forward(x, np.zeros((5, 2, 3, 3)), None, ConvGeometry(groups=2))


@pytest.mark.parametrize("c_in, c_out, groups, kernel, stride, padding, output_padding, rank", [
    (4, 6, 2, 3, 2, 1, 1, 2), (6, 6, 6, 2, 2, 0, 0, 2), (4, 8, 4, 3, 1, 1, 0, 3), (6, 3, 3, 5, 3, 2, 2, 1)])
def test_grouped_transposed_convolution_against_pytorch(c_in, c_out, groups, kernel, stride, padding,
                                                        output_padding, rank):
    """PyTorch's ConvTranspose with groups: the adjoint of the grouped convolution, weight (C_in, C_out/groups, k...)."""
    import torch
    from spmdcnn.ops import conv_transpose
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal((2, c_in) + (5,) * rank), rng.standard_normal((c_in, c_out // groups) + (kernel,) * rank)
    b = rng.standard_normal(c_out)
    geometry = conv_transpose.geometry(x.shape[2:], w.shape[2:], stride, padding, output_padding, rank=rank,
                                       groups=groups)
    y, saved = conv_transpose.conv_transpose_forward(x, w, b, geometry)
    tensors = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    ty = getattr(torch.nn.functional, f"conv_transpose{rank}d")(*tensors, stride=stride, padding=padding,
                                                                output_padding=output_padding, groups=groups)
    gy = rng.standard_normal(tuple(ty.shape))
    ty.backward(torch.from_numpy(gy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    for ours, theirs in zip(conv_transpose.conv_transpose_backward(gy, saved), tensors):
        np.testing.assert_allclose(ours, theirs.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer", [
    {"name": "g", "op": "conv2d", "out_channels": 12, "kernel": 3, "padding": 1, "groups": 3},         # 4 a group
    {"name": "g", "op": "conv2d", "out_channels": 12, "kernel": 3, "stride": 2, "groups": 6},          # 2 a group
    {"name": "g", "op": "conv2d", "out_channels": 12, "kernel": 5, "padding": 2, "groups": 6, "bias": False},
])
def test_every_split_of_c_the_planner_may_choose(layer):
    """For every configuration of a grouped convolution's channels the planner considers (its degrees keep groups
    whole), each tile's convolution over what tiling/fields.py says it reads, with its groups as the runtime binds
    them, gives the whole convolution's channels."""
    from spmdcnn.graph.graph import parse_model
    from spmdcnn.graph.optable import tile_groups
    from spmdcnn.planner.configs import configurations
    from spmdcnn.tiling.fields import needs
    graph = parse_model({"name": "m", "input": [6, 7, 7], "layers": [
        layer, {"name": "f", "op": "flatten"}, {"name": "fc", "op": "linear", "out_features": 2},
        {"name": "loss", "op": "softmax_cross_entropy"}]})
    conv_layer = graph.by_name["g"]
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 6, 7, 7))
    w = rng.standard_normal((12,) + conv_layer.params["weight"][1:])
    geometry = conv_layer.window
    whole, _ = conv_forward(x, w, None, ConvGeometry(geometry.stride, geometry.padding, geometry.dilation,
                                                     groups=layer["groups"]))
    degrees = sorted({config.degrees[1] for config in configurations(conv_layer, 2, 12)})
    assert len(degrees) >= 2 and 1 in degrees       # groups of 4: c in 1 or 3; groups of 2: 1, 2, 3 or 6
    for degree in degrees:
        for index in range(degree):
            k0, k1 = index * 12 // degree, (index + 1) * 12 // degree
            box = ((0, 2), (k0, k1), (0, whole.shape[2]), (0, whole.shape[3]))
            need = needs(conv_layer, box, [(2, 6, 7, 7)])[0]
            (c0, c1) = need.box[1]
            tile = ConvGeometry(geometry.stride, geometry.padding, geometry.dilation,
                                groups=tile_groups(conv_layer, (k0, k1)))
            y, _ = conv_forward(x[:, c0:c1], w[k0:k1], None, tile)
            np.testing.assert_allclose(y, whole[:, k0:k1], rtol=1e-12, atol=1e-12, err_msg=f"c={degree} #{index}")
