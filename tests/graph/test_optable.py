"""The op table is the one place per-op facts live: every op has a row, and every part reads its row."""

import numpy as np
import pytest

from spmdcnn.cost.compute import WORK
from spmdcnn.graph import opkeys, opspec
from spmdcnn.graph.graph import parse_model
from spmdcnn.graph.optable import (ANSWERS_LABELS, ANSWERS_TARGETS, FAMILIES, KEEPS_INDICES, KEEPS_INPUT,
                                   KEEPS_MASK, KEEPS_NOTHING, KEEPS_OUTPUT, OPS, READS_BOX, READS_BROADCAST,
                                   READS_CHANNEL_PARTS, READS_CHANNEL_SLICE, READS_CHANNEL_WINDOW, READS_INTERPOLATED, READS_PLANE,
                                   READS_POSITIONS, READS_SAMPLE, READS_TRANSPOSED, READS_WINDOW, needs_gradient)
from spmdcnn.runtime import kernels
from spmdcnn.tiling.config import NAMES, dims_of, names_of

EVERY_OP = [{"name": "conv", "op": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1},
            {"name": "bn", "op": "batchnorm2d"}, {"name": "gn", "op": "groupnorm", "groups": 2},
            {"name": "inorm", "op": "instancenorm", "affine": True}, {"name": "relu", "op": "relu"},
            {"name": "max", "op": "maxpool2d", "kernel": 2, "stride": 1},
            {"name": "avg", "op": "avgpool2d", "kernel": 3, "stride": 1, "padding": 1, "inputs": ["relu"]},
            {"name": "cat", "op": "concat", "inputs": ["max", "max"]},
            {"name": "sum", "op": "add", "inputs": ["cat", "cat"]},
            {"name": "padded", "op": "pad", "padding": [[1, 0], [0, 2]], "value": -0.5, "inputs": ["avg"]},
            {"name": "part", "op": "slice", "start": 1, "stop": 3},
            {"name": "shuffled", "op": "channel_shuffle", "groups": 2},
            {"name": "softened", "op": "group_softmax", "groups": 2},
            {"name": "adapt", "op": "adaptive_avgpool2d", "output_size": [3, 2]},
            {"name": "drop", "op": "dropout", "p": 0.5},
            {"name": "up", "op": "conv_transpose2d", "out_channels": 3, "kernel": 3, "stride": 2, "padding": 1,
             "output_padding": 1, "inputs": ["sum"]},
            {"name": "larger", "op": "upsample", "scale": [2, 1], "mode": "linear", "align_corners": True},
            {"name": "gap", "op": "global_avgpool"},
            {"name": "flat", "op": "flatten"}, {"name": "fc", "op": "linear", "out_features": 3},
            {"name": "flat_drop", "op": "flatten", "inputs": ["drop"]},
            {"name": "fc2", "op": "linear", "out_features": 3},
            {"name": "both", "op": "add", "inputs": ["fc", "fc2"]},
            {"name": "loss", "op": "softmax_cross_entropy"}]


EVERY_VOLUME_OP = [
    {"name": "conv", "op": "conv3d", "out_channels": 4, "kernel": 2, "padding": "same"},
    {"name": "bn", "op": "batchnorm3d"}, {"name": "leaky", "op": "leaky_relu", "negative_slope": 0.3},
    {"name": "max", "op": "maxpool3d", "kernel": 2, "stride": 1},
    {"name": "avg", "op": "avgpool3d", "kernel": 3, "stride": 1, "padding": 1, "inputs": ["leaky"]},
    {"name": "tanh", "op": "tanh"}, {"name": "up", "op": "conv_transpose3d", "out_channels": 2, "kernel": 2,
                                     "stride": 2},
    {"name": "gap", "op": "global_avgpool"}, {"name": "flat", "op": "flatten"},
    {"name": "fc", "op": "linear", "out_features": 3}, {"name": "scaled", "op": "scale", "factor": 1.2},
    {"name": "skip", "op": "adaptive_avgpool3d", "output_size": [3, 2, 2], "inputs": ["max"]},
    {"name": "flat2", "op": "flatten"},
    {"name": "fc2", "op": "linear", "out_features": 3}, {"name": "both", "op": "add", "inputs": ["scaled", "fc2"]},
    {"name": "loss", "op": "mse_loss"}]

EVERY_SEQUENCE_OP = [
    {"name": "conv", "op": "conv1d", "out_channels": 4, "kernel": 3, "padding": 1},
    {"name": "bn", "op": "batchnorm1d"}, {"name": "max", "op": "maxpool1d", "kernel": 2},
    {"name": "s2d", "op": "space_to_depth", "size": 2},
    {"name": "adapt", "op": "adaptive_avgpool1d", "output_size": 3},
    {"name": "avg", "op": "avgpool1d", "kernel": 2},
    {"name": "up", "op": "conv_transpose1d", "out_channels": 2, "kernel": 3, "stride": 2, "dilation": 2},
    {"name": "flat", "op": "flatten"},
    {"name": "fc", "op": "linear", "out_features": 3}, {"name": "loss", "op": "softmax_cross_entropy"}]

EVERY_PER_PIXEL_OP = [{"name": "head", "op": "conv2d", "out_channels": 3, "kernel": 1},
                      {"name": "a1", "op": "silu"}, {"name": "a2", "op": "gelu", "approximate": "tanh"},
                      {"name": "a3", "op": "hardswish"}, {"name": "a4", "op": "hardsigmoid"},
                      {"name": "a5", "op": "relu6"}, {"name": "a6", "op": "sigmoid"},
                      {"name": "a7", "op": "hardtanh", "min_val": -0.5, "max_val": 2.0},
                      {"name": "a8", "op": "elu", "alpha": 1.6732632423543772, "gain": 1.0507009873554805},
                      {"name": "a9", "op": "mish"}, {"name": "a10", "op": "clamp", "min": -1, "max": 1.5},
                      {"name": "ls", "op": "layer_scale"}, {"name": "pr", "op": "prelu"},
                      {"name": "shift", "op": "bias"}, {"name": "shared_shift", "op": "bias", "shared": True},
                      {"name": "pr2", "op": "prelu", "shared": False, "init": 0.1},
                      {"name": "sd", "op": "stochastic_depth", "p": 0.1},
                      {"name": "pool", "op": "avgpool2d", "kernel": [4, 3]},
                      {"name": "se", "op": "mul", "inputs": ["sd", "pool"]}, {"name": "ln", "op": "layernorm"},
                      {"name": "loss", "op": "dice_loss"}]

EVERY_MODEL = [([2, 6, 5], EVERY_OP), ([2, 5, 6, 4], EVERY_VOLUME_OP), ([2, 9], EVERY_SEQUENCE_OP),
               ([2, 4, 3], EVERY_PER_PIXEL_OP)]


def test_every_op_has_one_row_and_every_part_knows_it():
    assert set(FAMILIES) == set(opkeys.KEYS) == set(opspec.INFER) == set(kernels.BIND) == set(WORK)
    assert {spec.family for spec in OPS.values()} == set(FAMILIES)
    ops = set()
    for shape, layers in EVERY_MODEL:
        ops |= {layer.op for layer in parse_model({"name": "every", "input": shape, "layers": layers}).layers}
    assert ops == set(OPS)


def test_a_family_is_one_op_for_every_spatial_rank():
    for family in ("conv", "conv_transpose", "maxpool", "avgpool", "batchnorm"):
        rows = [OPS[f"{family}{rank}d"] for rank in (1, 2, 3)]
        assert [row.spatial for row in rows] == [1, 2, 3] and {row.family for row in rows} == {family}
        assert len({row._replace(name="", spatial=0) if hasattr(row, "_replace") else
                    (row.reads, row.keeps, row.splits, row.inplace, row.reduced_in_layer, row.tile_attrs)
                    for row in rows}) == 1


def test_the_rows_are_consistent():
    assert [name for name, spec in OPS.items() if spec.loss] == ["softmax_cross_entropy", "dice_loss", "mse_loss"]
    assert all(not spec.class_sums or spec.answers == ANSWERS_LABELS for spec in OPS.values())
    assert all((spec.answers in (ANSWERS_LABELS, ANSWERS_TARGETS)) == spec.loss for spec in OPS.values())
    for name, spec in OPS.items():
        assert spec.reads in (READS_WINDOW, READS_CHANNEL_WINDOW, READS_TRANSPOSED, READS_INTERPOLATED,
                              READS_PLANE, READS_POSITIONS, READS_SAMPLE, READS_CHANNEL_PARTS, READS_CHANNEL_SLICE,
                              READS_BOX, READS_BROADCAST), name
        assert spec.keeps in (KEEPS_INPUT, KEEPS_MASK, KEEPS_INDICES, KEEPS_OUTPUT, KEEPS_NOTHING), name
        assert spec.splits is None or set(spec.splits) <= set(NAMES), name
        assert spec.window == (spec.reads in (READS_WINDOW, READS_CHANNEL_WINDOW, READS_TRANSPOSED)), name
        assert not spec.inherits or (spec.reads == READS_BOX and not spec.multi_input), name
        assert set(spec.tile_attrs) <= set(opkeys.KEYS[spec.family]), name


@pytest.mark.parametrize("op", sorted(OPS))
def test_tiling_splits_what_the_table_says(op):
    shape, layers = next((shape, layers) for shape, layers in EVERY_MODEL if any(l["op"] == op for l in layers))
    graph = parse_model({"name": "every", "input": shape, "layers": layers})
    layer = next(layer for layer in graph.layers if layer.op == op)
    expected = [name for name in names_of(1 + len(layer.out_shape)) if name in (OPS[op].splits or NAMES)]
    assert dims_of(layer) == tuple(expected)
    assert set(expected) <= set(NAMES)


def test_the_gradient_rule_is_the_graphs():
    assert not needs_gradient({}, (False,)) and needs_gradient({"weight": (1,)}, (False,))
    assert needs_gradient({}, (False, True))
    graph = parse_model({"name": "m", "input": [2, 6, 5], "layers": [
        {"name": "pool", "op": "maxpool2d", "kernel": 2}, {"name": "relu", "op": "relu"},
        {"name": "conv", "op": "conv2d", "out_channels": 2, "kernel": 1},
        {"name": "cat", "op": "concat", "inputs": ["conv", "relu"]},
        {"name": "flat", "op": "flatten"}, {"name": "fc", "op": "linear", "out_features": 2},
        {"name": "loss", "op": "softmax_cross_entropy"}]})
    flags = {layer.name: (layer.input_grads, layer.needs_grad) for layer in graph.layers}
    assert flags["pool"] == ((False,), False) and flags["relu"] == ((False,), False)
    assert flags["conv"] == ((False,), True) and flags["cat"] == ((True, False), True)
    assert flags["fc"] == ((True,), True)
    assert graph.by_name["cat"].input_grad and not graph.by_name["conv"].input_grad
    assert np.all([layer.needs_grad for layer in graph.layers[2:]])
