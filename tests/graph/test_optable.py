"""The op table is the one place per-op facts live: every op has a row, and every part reads its row."""

import numpy as np
import pytest

from spmdcnn.cost.compute import WORK
from spmdcnn.graph import opspec
from spmdcnn.graph.graph import parse_model
from spmdcnn.graph.optable import (KEEPS_INDICES, KEEPS_INPUT, KEEPS_MASK, KEEPS_NOTHING, OPS, READS_BOX,
                                   READS_CHANNEL_PARTS, READS_CHANNEL_WINDOW, READS_PLANE, READS_SAMPLE, READS_WINDOW,
                                   needs_gradient)
from spmdcnn.runtime import kernels
from spmdcnn.tiling.config import NAMES, dims_of

EVERY_OP = [{"name": "conv", "op": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1},
            {"name": "bn", "op": "batchnorm2d"}, {"name": "relu", "op": "relu"},
            {"name": "max", "op": "maxpool2d", "kernel": 2, "stride": 1},
            {"name": "avg", "op": "avgpool2d", "kernel": 3, "stride": 1, "padding": 1, "inputs": ["relu"]},
            {"name": "cat", "op": "concat", "inputs": ["max", "max"]},
            {"name": "sum", "op": "add", "inputs": ["cat", "cat"]},
            {"name": "drop", "op": "dropout", "p": 0.5, "inputs": ["avg"]},
            {"name": "gap", "op": "global_avgpool", "inputs": ["sum"]},
            {"name": "flat", "op": "flatten"}, {"name": "fc", "op": "linear", "out_features": 3},
            {"name": "flat_drop", "op": "flatten", "inputs": ["drop"]},
            {"name": "fc2", "op": "linear", "out_features": 3},
            {"name": "both", "op": "add", "inputs": ["fc", "fc2"]},
            {"name": "loss", "op": "softmax_cross_entropy"}]


def test_every_op_has_one_row_and_every_part_knows_it():
    assert set(OPS) == set(opspec.KEYS) == set(opspec.INFER) == set(kernels.BIND) == set(WORK)
    graph = parse_model({"name": "every", "input": [2, 6, 5], "layers": EVERY_OP})
    assert {layer.op for layer in graph.layers} == set(OPS)


def test_the_rows_are_consistent():
    assert [name for name, spec in OPS.items() if spec.loss] == ["softmax_cross_entropy"]
    for name, spec in OPS.items():
        assert spec.reads in (READS_WINDOW, READS_CHANNEL_WINDOW, READS_PLANE, READS_SAMPLE, READS_CHANNEL_PARTS,
                              READS_BOX), name
        assert spec.keeps in (KEEPS_INPUT, KEEPS_MASK, KEEPS_INDICES, KEEPS_NOTHING), name
        assert spec.splits is None or set(spec.splits) <= set(NAMES), name
        assert spec.window == (spec.reads in (READS_WINDOW, READS_CHANNEL_WINDOW)), name
        assert not spec.inherits or (spec.reads == READS_BOX and not spec.multi_input), name
        assert set(spec.tile_attrs) <= set(opspec.KEYS[name]), name


@pytest.mark.parametrize("op", sorted(OPS))
def test_tiling_splits_what_the_table_says(op):
    graph = parse_model({"name": "every", "input": [2, 6, 5], "layers": EVERY_OP})
    layer = next(layer for layer in graph.layers if layer.op == op)
    expected = OPS[op].splits or NAMES[:1 + len(layer.out_shape)]
    assert dims_of(layer) == tuple(expected)


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
