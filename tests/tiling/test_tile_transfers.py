"""Transfers between producer tiles and consumer needs: for any plan, every element of every needed input box
arrives exactly once, cut from the one producer tile that holds it, and nothing else moves."""

import numpy as np
import pytest

from tiling_cases import SMALL_MODELS, handmade, inside, model, random_plan
from spmdcnn.graph.blocks import DATA
from spmdcnn.tiling.boxes import is_empty, packed, shape_of, volume
from spmdcnn.tiling.config import output_shape
from spmdcnn.tiling.plan import from_mapping
from spmdcnn.tiling.transfers import input_shapes, layer_transfers, tile_needs

BATCH = 4


def check_layer(plan, layer):
    """Exact-once coverage of every need box of ``layer`` by its transfers, and nothing outside it."""
    transfers = layer_transfers(plan, layer)
    assert transfers == sorted(transfers, key=lambda t: (t.slot, t.dst, t.src))
    needs = tile_needs(plan, layer)
    assert set(needs) == set(plan[layer.name].devices)
    received = {}
    for t in transfers:
        ref = layer.inputs[t.slot]
        assert ref != DATA
        need = needs[t.dst][t.slot]
        assert t.dst_box == need.box
        assert plan[ref].tile_of(t.src, plan.shape(ref)) == t.src_box
        assert not is_empty(t.box)
        assert inside(t.box, need.box) and inside(t.box, t.src_box)
        assert t.steps == need.steps
        steps = need.steps or (1,) * len(need.box)
        # a strided need's transfers start and end on its progression: count them in the compact array it fills
        assert all((lo - n0) % step == 0 and (hi - 1 - n0) % step == 0
                   for (lo, hi), (n0, _), step in zip(t.box, need.box, steps))
        count = received.setdefault((t.dst, t.slot), np.zeros(shape_of(need.box, need.steps), dtype=np.int32))
        count[packed(t.box, need.box, need.steps)] += 1
    for device, need_list in needs.items():
        for slot, (ref, need) in enumerate(zip(layer.inputs, need_list)):
            if ref == DATA:
                assert (device, slot) not in received
                continue
            assert inside(need.box, tuple((0, e) for e in plan.shape(ref)))
            if volume(need.box) == 0:
                assert (device, slot) not in received
            else:
                assert (received[(device, slot)] == 1).all(), (layer.name, device, slot)
    return transfers


@pytest.mark.parametrize("model_name", SMALL_MODELS)
@pytest.mark.parametrize("devices", [1, 3, 4, 6])
@pytest.mark.parametrize("seed", range(3))
def test_random_plans_cover_every_need_exactly_once(model_name, devices, seed):
    graph = model(model_name)
    plan = random_plan(seed * 100 + devices, graph, BATCH, devices)
    for layer in graph.layers:
        check_layer(plan, layer)


@pytest.mark.parametrize("model_name", SMALL_MODELS)
def test_same_configuration_moves_only_halos_and_nothing_for_pointwise_layers(model_name):
    # every layer split the same way over n and h: element-wise layers receive only their own tile, a 1x1 conv
    # nothing from other devices
    graph = model(model_name)
    layers = {}
    for layer in graph.layers:
        if len(layer.out_shape) != 3 or layer.op == "flatten" or layer.out_shape[1] < 2:
            layers[layer.name] = {"n": 2}
        else:
            layers[layer.name] = {"n": 2, "h": 2}
    plan = from_mapping({"format": "spmdcnn-plan/1", "devices": 4, "layers": layers}, graph, BATCH, 4, "halo")
    for layer in graph.layers:
        transfers = check_layer(plan, layer)
        if layer.op in ("relu", "batchnorm2d", "dropout", "add", "concat"):
            assert all(t.src == t.dst and t.box == t.src_box for t in transfers), layer.name


def test_halo_exchange_of_a_3x3_conv_split_over_height():
    graph = model("cifar_cnn")
    layer = graph.by_name["conv2.conv"]                      # 3x3, padding 1, 32 rows
    layers = {"conv1.relu": {"h": 2}, "conv2.conv": {"h": 2}}
    plan = from_mapping({"format": "spmdcnn-plan/1", "devices": 2, "layers": layers}, graph, BATCH, 2, "h")
    transfers = layer_transfers(plan, layer)
    moved = {(t.src, t.dst): t.box[2] for t in transfers}
    assert moved == {(0, 0): (0, 16), (1, 0): (16, 17), (0, 1): (15, 16), (1, 1): (16, 32)}


def test_first_layer_reads_the_data_and_gets_no_transfers():
    graph = model("tiny_cnn")
    plan = random_plan(7, graph, BATCH, 4)
    assert layer_transfers(plan, graph.layers[0]) == []


def test_a_device_without_a_tile_neither_needs_nor_receives():
    graph = model("tiny_cnn")
    layers = {"conv1": {"n": 4}, "bn1": {"c": 2, "devices": [3, 1]}}
    plan = from_mapping({"format": "spmdcnn-plan/1", "devices": 4, "layers": layers}, graph, BATCH, 4, "p")
    layer = graph.by_name["bn1"]
    assert plan["bn1"].tile_of(0, plan.shape("bn1")) is None
    assert plan["bn1"].tile_of(2, plan.shape("bn1")) is None
    assert plan["bn1"].tile_of(3, plan.shape("bn1")) == ((0, 4), (0, 4), (0, 15), (0, 13))
    assert plan["bn1"].tile_of(1, plan.shape("bn1")) == ((0, 4), (4, 8), (0, 15), (0, 13))
    assert set(tile_needs(plan, layer)) == {1, 3}
    transfers = check_layer(plan, layer)
    assert {t.dst for t in transfers} == {1, 3}
    assert {t.src for t in transfers} == {0, 1, 2, 3}                   # conv1 lives on all four


def test_concat_consumer_tile_touching_some_inputs_gets_transfers_only_from_those():
    graph = model("small_inception")
    layer = graph.by_name["mixed1.concat"]                               # 5 + 5 + 4 + 3 channels
    plan = from_mapping({"format": "spmdcnn-plan/1", "devices": 3, "default": {"n": 1},
                         "layers": {"mixed1.concat": {"c": 3}}}, graph, BATCH, 3, "concat")
    # c parts of 17 in 3: [0, 5), [5, 11), [11, 17)
    needs = tile_needs(plan, layer)
    assert [need.box[1] for need in needs[0]] == [(0, 5), (0, 0), (0, 0), (0, 0)]
    assert [need.box[1] for need in needs[1]] == [(5, 5), (0, 5), (0, 1), (0, 0)]
    assert [need.box[1] for need in needs[2]] == [(5, 5), (5, 5), (1, 4), (0, 3)]
    transfers = check_layer(plan, layer)
    assert sorted((t.dst, t.slot) for t in transfers) == [(0, 0), (1, 1), (1, 2), (2, 2), (2, 3)]


def test_linear_after_channel_split_flatten_input_gathers_all_features():
    graph = model("cifar_cnn")
    plan = from_mapping({"format": "spmdcnn-plan/1", "devices": 4,
                         "layers": {"pool3": {"c": 4}, "flat": {"n": 2}, "fc1": {"c": 4}}},
                        graph, BATCH, 4, "p")
    flat = check_layer(plan, graph.by_name["flat"])
    # each flatten tile (half the batch, every feature) takes its samples from all four channel parts of pool3
    assert sorted((t.src, t.dst) for t in flat) == [(s, d) for s in range(4) for d in range(2)]
    fc1 = check_layer(plan, graph.by_name["fc1"])
    # each of the four fc1 tiles (all samples, a quarter of the outputs) takes every feature of every sample
    assert sorted((t.src, t.dst) for t in fc1) == [(s, d) for s in range(2) for d in range(4)]
    assert all(t.box == (t.src_box[0], (0, 2048)) and t.dst_box == ((0, BATCH), (0, 2048)) for t in fc1)


def test_padding_only_tiles_receive_nothing():
    graph = handmade([{"name": "pre", "op": "relu"},
                      {"name": "conv", "op": "conv2d", "out_channels": 2, "kernel": 1, "padding": 2}],
                     input_shape=(3, 4, 5))
    plan = from_mapping({"format": "spmdcnn-plan/1", "devices": 4,
                         "layers": {"pre": {"h": 2}, "conv": {"h": 4}}}, graph, BATCH, 4, "p")
    layer = graph.by_name["conv"]
    needs = tile_needs(plan, layer)
    assert needs[0][0].box[2] == (0, 0) and needs[3][0].box[2] == (4, 4)     # rows [0, 2) and [6, 8) of 8
    transfers = check_layer(plan, layer)
    assert {t.dst for t in transfers} == {1, 2}


def test_input_shapes_put_the_batch_first():
    graph = model("small_resnet")
    plan = random_plan(1, graph, BATCH, 2)
    assert input_shapes(plan, graph.by_name["layer2.0.add"]) == [(BATCH, 12, 8, 8), (BATCH, 12, 8, 8)]
    assert output_shape(graph.loss, BATCH) == (BATCH,)
