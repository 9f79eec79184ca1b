"""Small decoders for the tests: every transposed convolution, upsampling and group or instance normalisation case a
tile split can meet, in 1, 2 and 3 spatial axes, with grouped and depthwise convolutions, ceil-mode pooling, today's activations (silu, gelu, hard swish and sigmoid,
sigmoid, relu6), layer norm over channels, a layer scale, stochastic depth and a squeeze-and-excitation gate
between them, and segmenters ending in a loss per pixel or voxel (shared by the
plan equivalence, profiler and PyTorch tests), and random answers for any model."""

import numpy as np


def answers(graph, rng, count):
    """Random answers for ``count`` samples: labels of the graph's classes, masks of them with about a tenth of
    the positions the loss's ignore_index, or targets in [-1, 1] for a regression loss."""
    if graph.answers == "targets":
        return rng.uniform(-1, 1, (count, graph.num_outputs)).astype(np.float32)
    labels = rng.integers(0, graph.num_classes, (count,) + graph.answer_shape)
    if graph.dense_labels:
        labels[rng.random(labels.shape) < 0.1] = graph.loss.attrs["ignore_index"]
    return labels


# decoders: transposed convolutions (DeepCAM's kernel 3, stride 2, padding 1, output padding 1; U-Net's kernel 2,
# stride 2; dilated, per-side padding, an output padding past the full extent) and a skip connection, split over
# samples and space
DECODER = {"name": "decoder", "input": [3, 9, 10], "layers": [
    {"name": "c1", "op": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1},
    {"name": "dw", "op": "conv2d", "out_channels": 8, "kernel": 3, "padding": 1, "groups": 4},    # depthwise, x2
    {"name": "pw", "op": "conv2d", "out_channels": 4, "kernel": 1, "groups": 2},     # grouped pointwise
    {"name": "down", "op": "conv2d", "out_channels": 5, "kernel": 3, "stride": 2, "padding": 1, "bias": False},
    {"name": "bn", "op": "batchnorm2d"}, {"name": "act", "op": "relu"},
    {"name": "up", "op": "conv_transpose2d", "out_channels": 4, "kernel": 3, "stride": 2, "padding": 1,
     "output_padding": [0, 1]},
    {"name": "gn", "op": "groupnorm", "groups": 2}, {"name": "gelu", "op": "gelu"},
    {"name": "ln", "op": "layernorm", "affine": False},
    {"name": "skip", "op": "concat", "inputs": ["ln", "c1"]},
    {"name": "up2", "op": "conv_transpose2d", "out_channels": 3, "kernel": 2, "stride": 2, "bias": False},
    {"name": "odd", "op": "conv_transpose2d", "out_channels": 2, "kernel": [3, 2], "stride": [1, 3],
     "dilation": [2, 1], "padding": [[1, 2], [0, 1]], "output_padding": [1, 2], "inputs": ["skip"]},
    {"name": "hsig", "op": "hardsigmoid"},
    {"name": "squeeze", "op": "avgpool2d", "kernel": 5, "inputs": ["act"]},      # squeeze-and-excitation
    {"name": "excite", "op": "conv2d", "out_channels": 5, "kernel": 1}, {"name": "gate", "op": "sigmoid"},
    {"name": "se", "op": "mul", "inputs": ["act", "gate"]},
    {"name": "near", "op": "upsample", "scale": [3, 2], "inputs": ["se"]}, {"name": "hs", "op": "hardswish"},
    {"name": "bilinear", "op": "upsample", "scale": 2, "mode": "linear", "inputs": ["act"]},
    {"name": "sig", "op": "sigmoid"},
    {"name": "corners", "op": "upsample", "scale": [3, 2], "mode": "linear", "align_corners": True,
     "inputs": ["act"]}, {"name": "sl", "op": "silu"},
    {"name": "ups", "op": "concat", "inputs": ["hs", "sl"]},
    {"name": "f_ups", "op": "flatten", "inputs": ["ups"]}, {"name": "l_ups", "op": "linear", "out_features": 3},
    {"name": "f_bil", "op": "flatten", "inputs": ["sig"]}, {"name": "l_bil", "op": "linear", "out_features": 3},
    {"name": "r6", "op": "relu6", "inputs": ["up2"]},
    {"name": "f_up2", "op": "flatten", "inputs": ["r6"]}, {"name": "l_up2", "op": "linear", "out_features": 3},
    {"name": "f_odd", "op": "flatten", "inputs": ["hsig"]}, {"name": "l_odd", "op": "linear", "out_features": 3},
    {"name": "cmax", "op": "maxpool2d", "kernel": 3, "stride": 2, "ceil_mode": True, "inputs": ["c1"]},   # 4x5
    {"name": "cavg", "op": "avgpool2d", "kernel": 3, "stride": 2, "padding": 1, "ceil_mode": True},      # 3x3
    {"name": "f_pool", "op": "flatten"}, {"name": "l_pool", "op": "linear", "out_features": 3},
    {"name": "gup", "op": "conv_transpose2d", "out_channels": 4, "kernel": 2, "stride": 2, "groups": 2,
     "inputs": ["pw"]},                                                    # grouped transposed: c is not split
    {"name": "f_gup", "op": "flatten"}, {"name": "l_gup", "op": "linear", "out_features": 3},
    {"name": "sum", "op": "add", "inputs": ["l_up2", "l_odd", "l_ups", "l_bil", "l_pool", "l_gup"]},
    {"name": "loss", "op": "softmax_cross_entropy"}]}

DECODER_VOLUME = {"name": "decoder_volume", "input": [2, 5, 6, 4], "layers": [
    {"name": "down", "op": "conv3d", "out_channels": 3, "kernel": 2, "stride": 2},
    {"name": "dw", "op": "conv3d", "out_channels": 3, "kernel": 3, "padding": 1, "groups": 3, "bias": False},
    {"name": "up", "op": "conv_transpose3d", "out_channels": 2, "kernel": 2, "stride": 2, "bias": False},
    {"name": "up3", "op": "conv_transpose3d", "out_channels": 2, "kernel": 3, "stride": [2, 1, 2], "padding": 1,
     "output_padding": [1, 0, 1], "inputs": ["down"]},
    {"name": "whole", "op": "groupnorm", "groups": 1, "eps": 1e-3, "inputs": ["down"]},
    {"name": "tri", "op": "upsample", "scale": [2, 1, 3], "mode": "linear"},
    {"name": "ls", "op": "layer_scale", "init": 0.5}, {"name": "sd", "op": "stochastic_depth", "p": 0.25},
    {"name": "inorm", "op": "instancenorm", "inputs": ["up"]},
    {"name": "f_up", "op": "flatten", "inputs": ["inorm"]}, {"name": "l_up", "op": "linear", "out_features": 2},
    {"name": "f_up3", "op": "flatten", "inputs": ["up3"]}, {"name": "l_up3", "op": "linear", "out_features": 2},
    {"name": "f_tri", "op": "flatten", "inputs": ["sd"]}, {"name": "l_tri", "op": "linear", "out_features": 2},
    {"name": "cpool", "op": "avgpool3d", "kernel": 2, "ceil_mode": True, "inputs": ["dw"]},     # 2x3x2 -> 1x2x1
    {"name": "f_pool", "op": "flatten"}, {"name": "l_pool", "op": "linear", "out_features": 2},
    {"name": "sum", "op": "add", "inputs": ["l_up", "l_up3", "l_tri", "l_pool"]},
    {"name": "loss", "op": "mse_loss"}]}

DECODER_SEQUENCE = {"name": "decoder_sequence", "input": [3, 13], "layers": [
    {"name": "down", "op": "conv1d", "out_channels": 4, "kernel": 3, "stride": 2},
    {"name": "grouped", "op": "conv1d", "out_channels": 4, "kernel": 3, "stride": 2, "padding": 1, "groups": 2},
    {"name": "inorm", "op": "instancenorm", "affine": True}, {"name": "gt", "op": "gelu", "approximate": "tanh"},
    {"name": "lnorm", "op": "layernorm", "eps": 1e-6},
    {"name": "up", "op": "conv_transpose1d", "out_channels": 3, "kernel": 5, "stride": 3, "padding": 2,
     "output_padding": 2},
    {"name": "lin", "op": "upsample", "scale": 3, "mode": "linear", "align_corners": True},
    {"name": "flat", "op": "flatten"}, {"name": "fc", "op": "linear", "out_features": 3},
    {"name": "loss", "op": "softmax_cross_entropy"}]}

# segmenters: a U-Net's shape (down, up, a skip) ending in a cross-entropy per pixel with an ignore_index other than
# -1, or in MLPerf's 3D U-Net loss (Dice and cross-entropy per voxel, half each, the background left out of Dice)
SEGMENTER = {"name": "segmenter", "input": [3, 10, 8], "layers": [
    {"name": "c1", "op": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1},
    {"name": "gn", "op": "groupnorm", "groups": 2}, {"name": "a1", "op": "relu"},
    {"name": "down", "op": "maxpool2d", "kernel": 2},
    {"name": "c2", "op": "conv2d", "out_channels": 6, "kernel": 3, "padding": 1},
    {"name": "bn", "op": "batchnorm2d"}, {"name": "a2", "op": "relu"},
    {"name": "up", "op": "conv_transpose2d", "out_channels": 4, "kernel": 3, "stride": 2, "padding": 1,
     "output_padding": 1},
    {"name": "skip", "op": "concat", "inputs": ["up", "a1"]},
    {"name": "head", "op": "conv2d", "out_channels": 3, "kernel": 1},
    {"name": "loss", "op": "softmax_cross_entropy", "ignore_index": 7}]}

SEGMENTER_VOLUME = {"name": "segmenter_volume", "input": [2, 6, 5, 4], "layers": [
    {"name": "c1", "op": "conv3d", "out_channels": 3, "kernel": 3, "padding": 1},
    {"name": "in", "op": "instancenorm", "affine": True}, {"name": "a1", "op": "leaky_relu"},
    {"name": "down", "op": "conv3d", "out_channels": 4, "kernel": 2, "stride": 2},
    {"name": "up", "op": "conv_transpose3d", "out_channels": 3, "kernel": 2, "stride": 2, "output_padding": [0, 1, 0]},
    {"name": "skip", "op": "add", "inputs": ["up", "a1"]},
    {"name": "head", "op": "conv3d", "out_channels": 4, "kernel": 1},
    {"name": "loss", "op": "dice_loss", "dice": 0.5, "cross_entropy": 0.5, "include_background": False}]}


# the idioms of today's imported CNNs: a constant pad (per side, a value other than 0, cropping a side), average pooling that leaves
# the padding out of its divisors (with ceil mode), channel slices (Res2Net's and CSPNet's splits, ReXNet's partial
# residual: a slice added to a slice), ShuffleNet's channel shuffle, adaptive average pooling to sizes that do not
# divide (uneven windows), batch norm of features, a factor and a shift shared by every channel and a shift per
# channel, space to depth in both orders, a softmax across channel groups, layer norms without a bias, with the unbiased variance, without
# centring (timm's SimpleNorm), SELU, Mish and a hard tanh, over images and volumes
IDIOMS = {"name": "idioms", "input": [3, 9, 8], "layers": [
    {"name": "c1", "op": "conv2d", "out_channels": 6, "kernel": 3, "padding": 1},
    {"name": "ln", "op": "layernorm", "bias": False, "correction": 1},
    {"name": "padded", "op": "pad", "padding": [[1, 2], [-1, 1]], "value": 0.25},
    {"name": "avg", "op": "avgpool2d", "kernel": 3, "stride": 2, "padding": 1, "count_include_pad": False,
     "ceil_mode": True},
    {"name": "first", "op": "slice", "start": 0, "stop": 2},
    {"name": "rest", "op": "slice", "start": 2, "stop": 6, "inputs": ["avg"]},
    {"name": "c2", "op": "conv2d", "out_channels": 2, "kernel": 3, "padding": 1},
    {"name": "joined", "op": "concat", "inputs": ["first", "c2", "rest"]},
    {"name": "shuffled", "op": "channel_shuffle", "groups": 4},
    {"name": "weights", "op": "group_softmax", "groups": 2, "inputs": ["joined"]},     # SKNet's split attention
    {"name": "attended", "op": "mul", "inputs": ["shuffled", "weights"]},
    {"name": "a", "op": "slice", "start": 1, "stop": 4, "inputs": ["attended"]},
    {"name": "b", "op": "slice", "start": 5, "stop": 8, "inputs": ["attended"]},
    {"name": "partial", "op": "add", "inputs": ["a", "b"]},
    {"name": "factor", "op": "layer_scale", "shared": True, "init": 0.5},      # HGNetV2's learnable affine
    {"name": "shift", "op": "bias", "shared": True},
    {"name": "channel_shift", "op": "bias"},
    {"name": "act", "op": "relu"},
    {"name": "adaptive", "op": "adaptive_avgpool2d", "output_size": [3, 4]},      # 7x5 to 3x4: uneven windows
    {"name": "s2d", "op": "space_to_depth", "size": 2, "order": "blocks", "inputs": ["padded"]},  # TResNet's stem
    {"name": "unshuffled", "op": "space_to_depth", "size": 2, "inputs": ["padded"]},       # PixelUnshuffle(2)
    {"name": "c3", "op": "conv2d", "out_channels": 3, "kernel": 3, "padding": 1, "bias": False, "inputs": ["s2d"]},
    {"name": "c4", "op": "conv2d", "out_channels": 3, "kernel": [3, 1], "padding": [1, 0], "bias": False,
     "inputs": ["unshuffled"]},
    {"name": "both", "op": "add", "inputs": ["c3", "c4"]},
    {"name": "pooled", "op": "adaptive_avgpool2d", "output_size": [3, 4]},
    {"name": "joined_paths", "op": "add", "inputs": ["adaptive", "pooled"]},
    {"name": "flat", "op": "flatten"},
    {"name": "features_bn", "op": "batchnorm1d"},           # of features (N, F): RepViT's head
    {"name": "fc", "op": "linear", "out_features": 3},
    {"name": "loss", "op": "softmax_cross_entropy"}]}

IDIOMS_VOLUME = {"name": "idioms_volume", "input": [4, 5, 6, 4], "layers": [
    {"name": "padded", "op": "pad", "padding": [[0, 1], [2, -1], [1, 1]]},
    {"name": "shifted", "op": "pad", "padding": [[-1, 1], [0, 0], [0, 0]]},      # NASNet's shift
    {"name": "avg", "op": "avgpool3d", "kernel": [3, 2, 3], "stride": [2, 1, 2], "padding": [1, 1, 1],
     "count_include_pad": False},
    {"name": "c1", "op": "conv3d", "out_channels": 6, "kernel": 1},
    {"name": "shuffled", "op": "channel_shuffle", "groups": 3},
    {"name": "part", "op": "slice", "start": 1, "stop": 5},
    {"name": "simple", "op": "layernorm", "center": False, "correction": 1, "bias": False},     # timm's SimpleNorm2d
    {"name": "selu", "op": "elu", "alpha": 1.6732632423543772, "gain": 1.0507009873554805},
    {"name": "mish", "op": "mish"}, {"name": "clamped", "op": "hardtanh", "min_val": -0.5, "max_val": 1.5},
    {"name": "floored", "op": "clamp", "min": -0.25},
    {"name": "adaptive", "op": "adaptive_avgpool3d", "output_size": [2, 5, 3]},    # uneven along d and h
    {"name": "head", "op": "conv3d", "out_channels": 3, "kernel": 3, "padding": 1},
    {"name": "loss", "op": "softmax_cross_entropy"}]}
