"""Every bad model is one clear error naming the file and the layer."""

import textwrap

import pytest

from spmdcnn.graph import load_model
from spmdcnn.io.yamlfile import FormatError

GOOD_LAYERS = """\
  - {name: conv1, op: conv2d, out_channels: 4, kernel: 3}
  - {name: relu1, op: relu}
  - {name: flat, op: flatten}
  - {name: fc, op: linear, out_features: 3}
  - {name: loss, op: softmax_cross_entropy}
"""


def write(tmp_path, layers, input_shape="[3, 8, 8]", extra=""):
    path = tmp_path / "bad.yaml"
    path.write_text(f"name: bad\ninput: {input_shape}\n{extra}layers:\n" + textwrap.dedent(layers))
    return str(path)


def expect_error(path, *fragments):
    with pytest.raises(FormatError) as info:
        load_model(path)
    message = str(info.value)
    assert path in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_the_good_model_loads(tmp_path):
    graph = load_model(write(tmp_path, GOOD_LAYERS))
    assert graph.by_name["fc"].out_shape == (3,)


def test_unknown_op(tmp_path):
    path = write(tmp_path, GOOD_LAYERS.replace("op: relu", "op: softplus"))
    expect_error(path, "relu1", "unknown op", "softplus")


def test_unknown_key(tmp_path):
    path = write(tmp_path, GOOD_LAYERS.replace("kernel: 3}", "kernel: 3, strides: 2}"))
    expect_error(path, "conv1", "strides")


def test_missing_key(tmp_path):
    path = write(tmp_path, GOOD_LAYERS.replace("out_features: 3", "bias: true"))
    expect_error(path, "fc", "out_features")


def test_wrong_type(tmp_path):
    path = write(tmp_path, GOOD_LAYERS.replace("out_channels: 4", "out_channels: four"))
    expect_error(path, "conv1", "out_channels")


def test_shape_that_becomes_zero(tmp_path):
    path = write(tmp_path, GOOD_LAYERS.replace("kernel: 3}", "kernel: 9}"))
    expect_error(path, "conv1", "empty output")


def test_negative_output_size_from_pooling(tmp_path):
    layers = GOOD_LAYERS.replace("  - {name: relu1, op: relu}\n",
                                 "  - {name: relu1, op: relu}\n  - {name: pool, op: maxpool2d, kernel: 7}\n")
    expect_error(write(tmp_path, layers), "pool", "empty output")


def test_non_positive_input_shape(tmp_path):
    expect_error(write(tmp_path, GOOD_LAYERS, input_shape="[3, 0, 8]"), "input")


def test_unknown_input_name(tmp_path):
    path = write(tmp_path, GOOD_LAYERS.replace("{name: relu1, op: relu}", "{name: relu1, op: relu, inputs: [conv9]}"))
    expect_error(path, "relu1", "unknown input", "conv9")


def test_cycle(tmp_path):
    layers = GOOD_LAYERS.replace("{name: conv1, op: conv2d, out_channels: 4, kernel: 3}",
                                 "{name: conv1, op: conv2d, out_channels: 4, kernel: 3, inputs: [relu1]}")
    expect_error(write(tmp_path, layers), "cycle", "conv1", "relu1")


def test_duplicate_name(tmp_path):
    path = write(tmp_path, GOOD_LAYERS.replace("{name: relu1, op: relu}", "{name: conv1, op: relu}"))
    expect_error(path, "conv1", "twice")


def test_loss_must_be_last(tmp_path):
    layers = GOOD_LAYERS.replace("  - {name: loss, op: softmax_cross_entropy}\n", "") + \
        "  - {name: relu9, op: relu}\n"
    expect_error(write(tmp_path, layers), "exactly one loss layer", "softmax_cross_entropy, dice_loss or mse_loss")


def test_dangling_layer(tmp_path):
    layers = GOOD_LAYERS + ""
    layers = layers.replace("  - {name: flat, op: flatten}\n",
                            "  - {name: side, op: relu, inputs: [conv1]}\n  - {name: flat, op: flatten, inputs: [relu1]}\n")
    expect_error(write(tmp_path, layers), "side", "used by no layer")


def test_linear_needs_flat_input(tmp_path):
    path = write(tmp_path, GOOD_LAYERS.replace("  - {name: flat, op: flatten}\n", ""))
    expect_error(path, "fc", "flatten")


def test_add_needs_matching_shapes(tmp_path):
    layers = GOOD_LAYERS.replace("  - {name: relu1, op: relu}\n",
                                 "  - {name: relu1, op: relu}\n  - {name: pool, op: maxpool2d, kernel: 2}\n"
                                 "  - {name: sum, op: add, inputs: [relu1, pool]}\n")
    expect_error(write(tmp_path, layers), "sum", "same shape")


def test_concat_needs_matching_spatial_size(tmp_path):
    layers = GOOD_LAYERS.replace("  - {name: relu1, op: relu}\n",
                                 "  - {name: relu1, op: relu}\n  - {name: pool, op: maxpool2d, kernel: 2}\n"
                                 "  - {name: cat, op: concat, inputs: [relu1, pool]}\n")
    expect_error(write(tmp_path, layers), "cat", "every spatial extent", "(4, 6, 6), (4, 3, 3)")


def test_dropout_probability_range(tmp_path):
    layers = GOOD_LAYERS.replace("{name: relu1, op: relu}", "{name: relu1, op: dropout, p: 1.5}")
    expect_error(write(tmp_path, layers), "relu1", "[0, 1]")


def test_pool_padding_at_most_half_the_kernel(tmp_path):
    layers = GOOD_LAYERS.replace("  - {name: relu1, op: relu}\n",
                                 "  - {name: relu1, op: relu}\n  - {name: pool, op: maxpool2d, kernel: 2, padding: 2}\n")
    expect_error(write(tmp_path, layers), "pool", "half the kernel")


def test_missing_top_level_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nlayers:\n" + GOOD_LAYERS)
    expect_error(str(path), "input")


def test_unknown_top_level_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\ninput: [3, 8, 8]\nlayer: []\nlayers:\n" + GOOD_LAYERS)
    expect_error(str(path), "'layer'")


def test_invalid_yaml_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\ninput: [3, 8, 8\nlayers: []\n")
    expect_error(str(path), "line")


def test_missing_file(tmp_path):
    expect_error(str(tmp_path / "nope.yaml"), "not found")


BLOCKS = """\
blocks:
  unit:
    args: {out: null, kernel: 3}
    layers:
      - {name: conv, op: conv2d, out_channels: $out, kernel: $kernel, padding: 1}
      - {name: relu, op: relu}
"""


def test_blocks_expand_with_nested_names(tmp_path):
    layers = "  - {name: b1, block: unit, args: {out: 5}}\n" + GOOD_LAYERS.split("\n", 2)[2]
    graph = load_model(write(tmp_path, layers, extra=BLOCKS))
    assert [l.name for l in graph.layers][:2] == ["b1.conv", "b1.relu"]
    assert graph.by_name["b1.conv"].out_shape == (5, 8, 8)
    assert graph.by_name["flat"].inputs == ["b1.relu"]


def test_block_errors(tmp_path):
    rest = GOOD_LAYERS.split("\n", 2)[2]
    expect_error(write(tmp_path, "  - {name: b1, block: nope}\n" + rest, extra=BLOCKS), "b1", "unknown block")
    expect_error(write(tmp_path, "  - {name: b1, block: unit}\n" + rest, extra=BLOCKS), "b1", "'out'")
    expect_error(write(tmp_path, "  - {name: b1, block: unit, args: {out: 2, size: 1}}\n" + rest, extra=BLOCKS),
                 "b1", "size")
    bad_ref = BLOCKS.replace("$kernel", "$kernal")
    expect_error(write(tmp_path, "  - {name: b1, block: unit, args: {out: 2}}\n" + rest, extra=bad_ref),
                 "b1", "$kernal")
    recursive = BLOCKS + "      - {name: again, block: unit, args: {out: 1}}\n"
    expect_error(write(tmp_path, "  - {name: b1, block: unit, args: {out: 2}}\n" + rest, extra=recursive),
                 "contains itself")


def test_op_of_the_wrong_type(tmp_path):
    expect_error(write(tmp_path, GOOD_LAYERS.replace("op: relu", "op: [relu]")), "relu1", "unknown op")


def test_layer_name_with_a_slash(tmp_path):
    path = write(tmp_path, GOOD_LAYERS.replace("{name: relu1,", "{name: relu/1,").replace("]", "]"))
    expect_error(path, "relu/1", "'/'")


def test_malformed_block_definitions(tmp_path):
    rest = GOOD_LAYERS.split("\n", 2)[2]
    instance = "  - {name: b1, block: unit, args: {out: 2}}\n" + rest
    expect_error(write(tmp_path, instance, extra=BLOCKS.replace("args: {out: null, kernel: 3}", "args: [1]")),
                 "block 'unit'", "'args'")
    expect_error(write(tmp_path, instance, extra=BLOCKS.replace("    args:", "    inputs: 5\n    args:")),
                 "block 'unit'", "'inputs'")
    expect_error(write(tmp_path, instance, extra=BLOCKS.replace("    args:", "    output: [relu]\n    args:")),
                 "block 'unit'", "'output'")


def test_a_long_model_listed_backwards_is_ordered_without_recursion_limits(tmp_path):
    count = 1500
    entries = [f"  - {{name: r{i}, op: relu, inputs: [{f'r{i - 1}' if i else 'data'}]}}" for i in range(count)]
    entries += [f"  - {{name: flat, op: flatten, inputs: [r{count - 1}]}}",
                "  - {name: fc, op: linear, out_features: 2, inputs: [flat]}",
                "  - {name: loss, op: softmax_cross_entropy, inputs: [fc]}"]
    path = tmp_path / "deep.yaml"
    path.write_text("name: deep\ninput: [1, 4, 4]\nlayers:\n" + "\n".join(reversed(entries)) + "\n")
    graph = load_model(str(path))
    assert [layer.name for layer in graph.layers[:2]] == ["r0", "r1"] and graph.loss.name == "loss"


@pytest.mark.parametrize("names, fragment", [
    ("{relu1: features.1}", "'relu1' is not a layer with parameters"),
    ("{conv9: features.0}", "'conv9' is not a layer with parameters"),
    ("{conv1: fc}", "two layers would share a PyTorch name"),
    ("[conv1, features.0]", "must map layer names to PyTorch module names"),
    ("{conv1: 3}", "must map layer names to PyTorch module names"),
])
def test_bad_torch_names(tmp_path, names, fragment):
    expect_error(write(tmp_path, GOOD_LAYERS, extra=f"torch_names: {names}\n"), "torch_names", fragment)


def test_torch_names_are_kept(tmp_path):
    graph = load_model(write(tmp_path, GOOD_LAYERS, extra="torch_names: {conv1: features.0, fc: classifier}\n"))
    assert graph.torch_names == {"conv1": "features.0", "fc": "classifier"}


# ------------------------------------------------------------------------------ volumes and spatial ranks

VOLUME_LAYERS = """\
  - {name: conv1, op: conv3d, out_channels: 4, kernel: 2, padding: same}
  - {name: act, op: leaky_relu, negative_slope: 0.3}
  - {name: pool, op: maxpool3d, kernel: 2}
  - {name: flat, op: flatten}
  - {name: fc, op: linear, out_features: 3}
  - {name: loss, op: mse_loss}
"""


def test_a_volume_model_loads(tmp_path):
    graph = load_model(write(tmp_path, VOLUME_LAYERS, input_shape="[4, 8, 7, 6]"))
    assert graph.by_name["conv1"].out_shape == (4, 8, 7, 6)     # 'same': the even kernel's extra row after
    assert graph.by_name["conv1"].window.padding == ((0, 1), (0, 1), (0, 1))
    assert graph.by_name["pool"].out_shape == (4, 4, 3, 3)
    assert graph.spatial_rank == 3 and graph.answers == "targets" and graph.num_outputs == 3


@pytest.mark.parametrize("op,given", [("conv2d", "out_channels: 4, kernel: 3"), ("maxpool2d", "kernel: 2"),
                                      ("batchnorm2d", "eps: 0.001")])
def test_a_2d_op_on_a_volume(tmp_path, op, given):
    layers = VOLUME_LAYERS.replace("{name: act, op: leaky_relu, negative_slope: 0.3}", f"{{name: act, op: {op}, {given}}}")
    family = op[:-2]
    expect_error(write(tmp_path, layers, input_shape="[4, 8, 7, 6]"), "layer 'act'", f"op '{op}' needs an image",
                 "a volume (C, D, H, W) (4, 8, 7, 6)", f"use {family}3d")


def test_a_3d_op_on_an_image(tmp_path):
    layers = GOOD_LAYERS.replace("op: conv2d", "op: conv3d")
    expect_error(write(tmp_path, layers), "layer 'conv1'", "op 'conv3d' needs a volume", "use conv2d")


@pytest.mark.parametrize("value,fragment", [("[3, 3]", "[d, h, w]"), ("[[1, 0], [1, 1]]", "3 [before, after]"),
                                            ("[[1, 0, 2], [1, 1], [0, 0]]", "[before, after]"),
                                            ("valid", "'same'"), ("[-1, 0, 0]", "non-negative")])
def test_padding_of_a_volume(tmp_path, value, fragment):
    layers = VOLUME_LAYERS.replace("padding: same", f"padding: {value}")
    if value == "[3, 3]":
        layers = VOLUME_LAYERS.replace("kernel: 2, padding: same", "kernel: [3, 3]")
    expect_error(write(tmp_path, layers, input_shape="[4, 8, 7, 6]"), "conv1", fragment)


def test_same_padding_needs_stride_1(tmp_path):
    layers = VOLUME_LAYERS.replace("padding: same", "padding: same, stride: 2")
    expect_error(write(tmp_path, layers, input_shape="[4, 8, 7, 6]"), "conv1", "'same' needs stride 1")


def test_pooling_takes_no_same_padding(tmp_path):
    layers = VOLUME_LAYERS.replace("kernel: 2}", "kernel: 2, padding: same}")
    expect_error(write(tmp_path, layers, input_shape="[4, 8, 7, 6]"), "pool", "padding")


@pytest.mark.parametrize("shape", ["[3]", "[1, 2, 3, 4, 5]", "[3, 8, 0, 8]"])
def test_input_of_one_to_three_spatial_axes(tmp_path, shape):
    expect_error(write(tmp_path, GOOD_LAYERS, input_shape=shape), "'input'", "[C, D, H, W]")


def test_a_loss_needs_flat_predictions(tmp_path):
    layers = VOLUME_LAYERS.replace("  - {name: flat, op: flatten}\n  - {name: fc, op: linear, out_features: 3}\n", "")
    expect_error(write(tmp_path, layers, input_shape="[4, 8, 7, 6]"), "loss", "mse_loss needs predictions (F,)")


@pytest.mark.parametrize("key,value", [("negative_slope", "high"), ("factor", ".nan")])
def test_numbers_of_the_new_ops(tmp_path, key, value):
    op = "leaky_relu" if key == "negative_slope" else "scale"
    layers = VOLUME_LAYERS.replace("{name: act, op: leaky_relu, negative_slope: 0.3}",
                                   f"{{name: act, op: {op}, {key}: {value}}}")
    expect_error(write(tmp_path, layers, input_shape="[4, 8, 7, 6]"), "act", f"'{key}' must be a finite number")


def test_scale_needs_a_factor(tmp_path):
    layers = VOLUME_LAYERS.replace("{name: act, op: leaky_relu, negative_slope: 0.3}", "{name: act, op: scale}")
    expect_error(write(tmp_path, layers, input_shape="[4, 8, 7, 6]"), "act", "needs the key 'factor'")


@pytest.mark.parametrize("layer, fragments", [
    ("{name: up, op: conv_transpose2d, out_channels: 2, kernel: 3, stride: 2, output_padding: 2}",
     ["layer 'up'", "output_padding 2 along spatial axis 0 must be smaller than the stride (2) or the dilation (1)"]),
    ("{name: up, op: conv_transpose2d, out_channels: 2, kernel: 3, output_padding: [0, 1]}",
     ["output_padding 1 along spatial axis 1 must be smaller than the stride (1) or the dilation (1)"]),
    ("{name: up, op: conv_transpose2d, out_channels: 2, kernel: 3, padding: same}", ["'padding' must be an int"]),
    ("{name: up, op: conv_transpose2d, out_channels: 2, kernel: 2, padding: 5}", ["gives an empty output"]),
    ("{name: up, op: conv_transpose3d, out_channels: 2, kernel: 2}", ["needs a volume", "use conv_transpose2d"]),
    ("{name: up, op: upsample, scale: 2, mode: bicubic}", ["'mode' must be one of nearest, linear", "got 'bicubic'"]),
    ("{name: up, op: upsample, scale: 2, align_corners: true}", ["'align_corners' applies to mode linear only"]),
    ("{name: up, op: upsample, scale: [2, 0]}", ["'scale' must be a positive integer, got 0"]),
    ("{name: up, op: upsample, scale: [2, 2, 2]}", ["'scale' must be an int or [h, w]"]),
    ("{name: up, op: upsample}", ["op 'upsample' needs the key 'scale'"]),
    ("{name: gn, op: groupnorm, groups: 2}", ["'groups' 2 must divide the 3 channels of its input"]),
    ("{name: gn, op: groupnorm}", ["op 'groupnorm' needs the key 'groups'"]),
    ("{name: gn, op: groupnorm, groups: 3, affine: 1}", ["'affine' must be true or false"]),
    ("{name: inorm, op: instancenorm, eps: 0}", ["'eps' must be a positive number"]),
    ("{name: inorm, op: instancenorm, groups: 3}", ["unknown key 'groups' for op 'instancenorm'"]),
    ("{name: g, op: conv2d, out_channels: 4, kernel: 3, groups: 2}",
     ["layer 'g'", "'groups' 2 must divide its 3 input channels (as in PyTorch)"]),
    ("{name: g, op: conv2d, out_channels: 4, kernel: 3, groups: 3}", ["'groups' 3 must divide its 4 out_channels"]),
    ("{name: g, op: conv2d, out_channels: 3, kernel: 3, groups: 0}", ["'groups' must be a positive integer"]),
    ("{name: p, op: maxpool2d, kernel: 3, ceil_mode: yes please}", ["'ceil_mode' must be true or false"]),
    ("{name: up, op: conv_transpose2d, out_channels: 4, kernel: 2, groups: 3}",
     ["layer 'up'", "'groups' 3 must divide its 4 out_channels (as in PyTorch)"]),
    ("{name: s, op: slice, start: 2, stop: 5}",
     ["layer 's'", "slice [2, 5) must hold at least one of the 3 channels of its input"]),
    ("{name: s, op: slice, start: 2, stop: 2}", ["slice [2, 2) must hold at least one"]),
    ("{name: s, op: slice, start: -1, stop: 2}", ["'start' must be a non-negative integer, got -1"]),
    ("{name: s, op: slice, stop: 2}", ["op 'slice' needs the key 'start'"]),
    ("{name: shuffle, op: channel_shuffle, groups: 2}", ["'groups' 2 must divide the 3 channels of its input"]),
    ("{name: p, op: pad, padding: [[-8, 0], [0, 0]]}", ["padding [[-8, 0], [0, 0]] crops all of input 8x8"]),
    ("{name: p, op: pad, padding: -1}", ["'padding' must be a non-negative integer, got -1"]),
    ("{name: p, op: pad, padding: 1, value: .nan}", ["'value' must be a number, got nan"]),
    ("{name: p, op: avgpool2d, kernel: 3, padding: 1, count_include_pad: 0}",
     ["'count_include_pad' must be true or false"]),
    ("{name: h, op: hardtanh, min_val: 2, max_val: 2}", ["'min_val' 2.0 must be below 'max_val' 2.0"]),
    ("{name: e, op: elu, gain: x}", ["'gain' must be a finite number, got 'x'"]),
    ("{name: c, op: clamp, min: 2, max: 1}", ["'min' 2.0 must not exceed 'max' 1.0"]),
    ("{name: c, op: clamp, min: .inf}", ["'min' must be a finite number or null (unbounded), got inf"]),
])
def test_bad_decoder_layers_name_the_layer_and_the_rule(tmp_path, layer, fragments):
    layers = f"  - {layer}\n  - {{name: flat, op: flatten}}\n  - {{name: fc, op: linear, out_features: 3}}\n" \
             "  - {name: loss, op: softmax_cross_entropy}\n"
    expect_error(write(tmp_path, layers), *fragments)


@pytest.mark.parametrize("value,fragment", [("x", "'ignore_index' must be an integer"),
                                            ("true", "'ignore_index' must be an integer")])
def test_a_loss_per_pixel_takes_an_integer_ignore_index(tmp_path, value, fragment):
    layers = """
      - {name: conv, op: conv2d, out_channels: 3, kernel: 3, padding: 1}
      - {name: loss, op: softmax_cross_entropy, ignore_index: %s}
    """ % value
    expect_error(write(tmp_path, layers), "loss", fragment)


def test_mul_takes_inputs_that_broadcast(tmp_path):
    layers = """
      - {name: conv, op: conv2d, out_channels: 3, kernel: 3, padding: 1}
      - {name: pool, op: avgpool2d, kernel: 2}
      - {name: gate, op: mul, inputs: [conv, pool]}
      - {name: loss, op: softmax_cross_entropy}
    """
    expect_error(write(tmp_path, layers), "gate", "mul takes two inputs of one rank whose extents agree or are 1",
                 "(3, 8, 8), (3, 4, 4)")


def test_gelu_takes_pytorchs_approximations_only(tmp_path):
    layers = """
      - {name: conv, op: conv2d, out_channels: 3, kernel: 3, padding: 1}
      - {name: act, op: gelu, approximate: erf}
      - {name: loss, op: softmax_cross_entropy}
    """
    expect_error(write(tmp_path, layers), "act", "'approximate' must be none or tanh (as in PyTorch), got 'erf'")


@pytest.mark.parametrize("keys,classes,fragment", [
    ("dice: -1", 3, "'dice' must not be negative"),
    ("cross_entropy: .nan", 3, "'cross_entropy' must be a finite number"),
    ("smooth: -0.1", 3, "'smooth' must not be negative"),
    ("dice: 0, cross_entropy: 0", 3, "'dice' and 'cross_entropy' (the weights of the two terms) are both 0"),
    ("include_background: 0", 3, "'include_background' must be true or false"),
    ("batch: yes please", 3, "'batch' must be true or false"),
    ("include_background: false", 1, "include_background false leaves no class of the 1 to score"),
    ("squared: true", 3, "unknown key 'squared' for op 'dice_loss'"),
])
def test_bad_dice_losses_name_the_key(tmp_path, keys, classes, fragment):
    layers = """
      - {name: conv, op: conv2d, out_channels: %d, kernel: 3, padding: 1}
      - {name: loss, op: dice_loss, %s}
    """ % (classes, keys)
    expect_error(write(tmp_path, layers), "loss", fragment)


def test_a_loss_of_logits_without_classes_first_is_refused(tmp_path):
    """Logits per position need the classes as channels: (K, S...); a flat (F,) or a loss over targets per
    position is not what the loss takes."""
    layers = """
      - {name: conv, op: conv2d, out_channels: 3, kernel: 3, padding: 1}
      - {name: loss, op: mse_loss}
    """
    expect_error(write(tmp_path, layers), "loss", "mse_loss needs predictions (F,)")


@pytest.mark.parametrize("keys,fragment", [
    ("output_size: 0", "'output_size' must be a positive integer"),
    ("output_size: [2, 2, 2]", "'output_size' must be an int or"),
    ("{}", "takes one key, 'output_size'"),
    ("output_size: 1, kernel: 2", "got 'kernel'"),
])
def test_adaptive_avgpool_takes_one_positive_output_size_per_axis(tmp_path, keys, fragment):
    keys = "" if keys == "{}" else ", " + keys
    layers = """
      - {name: conv, op: conv2d, out_channels: 3, kernel: 3, padding: 1}
      - {name: pool, op: adaptive_avgpool2d%s}
      - {name: flat, op: flatten}
      - {name: loss, op: softmax_cross_entropy}
    """ % keys
    expect_error(write(tmp_path, layers), "pool", fragment)
