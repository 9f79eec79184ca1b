"""``EdgeTraffic.table``: every pair of configurations at once, equal to ``forward`` pair by pair, on the edges of
the real models, on hand-made layers with the awkward reads (strided 1x1 windows, windows over padding only,
concat inputs a tile takes nothing from), on one node and on two-level machines whose nodes cut configurations
anywhere."""

import os
from dataclasses import replace

import numpy as np
import pytest

from spmdcnn.cost import transfer
from spmdcnn.cost.compute import ComputeModel
from spmdcnn.cost.machine import parse_machine_text
from spmdcnn.cost.model import CostModel
from spmdcnn.cost.layout import tile_boxes
from spmdcnn.cost.transfer import EdgeTraffic
from spmdcnn.graph import load_model
from spmdcnn.graph.blocks import DATA
from spmdcnn.graph.graph import parse_model
from spmdcnn.planner import Problem
from spmdcnn.planner.configs import configurations
from spmdcnn.tiling.config import ParallelConfig
from spmdcnn.tiling.fields import needs

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
PAIRS = 60         # pairs of configurations checked per edge (all of them when there are fewer)


def machine(per_node, intra=(2.0e10, 5.0e-6), inter=(2.0e9, 3.0e-5)):
    return parse_machine_text(f"""
format: spmdcnn-machine/1
name: test-{per_node}
nodes: 8
devices_per_node: {per_node}
intra_node: {{bandwidth: {intra[0]:e}, latency: {intra[1]:e}}}
inter_node: {{bandwidth: {inter[0]:e}, latency: {inter[1]:e}}}
""")


MACHINES = {"one-node": machine(8), "one-per-node": machine(1), "two-per-node": machine(2),
            "three-per-node": machine(3)}
# device counts with the machines that split them into nodes differently (one node holds up to 8 devices)
SPLITS = [(1, "one-node"), (2, "one-node"), (2, "one-per-node"), (3, "one-node"), (3, "two-per-node"),
          (4, "one-node"), (4, "two-per-node"), (4, "three-per-node"), (8, "one-node"), (8, "two-per-node"),
          (8, "three-per-node")]


@pytest.fixture(autouse=True)
def vectorized(request, monkeypatch):
    """Every table here takes the vectorized path, but in the tests meant to go pair by pair."""
    if "pair_by_pair" not in request.node.name:
        def refuse(*args):
            raise AssertionError("EdgeTraffic.table went pair by pair")
        monkeypatch.setattr(EdgeTraffic, "_table_by_pairs", refuse)


def check_table(traffic, producers, consumers, seed=0, limit=PAIRS):
    """``table`` against ``forward`` on every pair, or on ``limit`` random ones."""
    seconds, nbytes = traffic.table(producers, consumers)
    assert seconds.shape == nbytes.shape == (len(producers), len(consumers))
    pairs = np.argwhere(np.ones(seconds.shape, dtype=bool))
    if len(pairs) > limit:
        pairs = pairs[np.random.default_rng(seed).choice(len(pairs), limit, replace=False)]
    expected = [traffic.forward(producers[a], consumers[b]) for a, b in pairs]
    for name, got, want in [("seconds", seconds[tuple(pairs.T)], [t.seconds for t in expected]),
                            ("bytes", nbytes[tuple(pairs.T)], [t.bytes for t in expected])]:
        wrong = np.flatnonzero(np.abs(got - want) > 1e-12 * np.abs(want))
        assert not len(wrong), "\n".join(
            f"{name} {producers[a].describe()} -> {consumers[b].describe()}: {got[i]!r}, forward {want[i]!r}"
            for i, (a, b) in zip(wrong, pairs[wrong]))
    return seconds, nbytes


def check_graph(graph, devices, batch, machine, limit=PAIRS):
    """Every edge of ``graph`` with the planner's configurations on ``devices`` devices."""
    cost = CostModel(graph, batch, machine, ComputeModel(machine.device))
    lists = {}

    def choices(layer):
        if layer.name not in lists:
            lists[layer.name] = configurations(layer, batch, devices)
        return lists[layer.name]
    for layer in graph.layers:
        for slot, ref in enumerate(layer.inputs):
            if ref != DATA:
                check_table(cost.edge(layer, slot), choices(graph.by_name[ref]), choices(layer), limit=limit)


@pytest.mark.parametrize("devices,machine_name", SPLITS)
@pytest.mark.parametrize("name", ["tiny_cnn", "cifar_cnn", "small_inception", "small_resnet", "alexnet"])
def test_the_table_of_every_edge_of_the_models_is_forward(name, devices, machine_name):
    graph = load_model(os.path.join(MODELS, f"{name}.yaml"))
    check_graph(graph, devices, 2 * devices + 1, MACHINES[machine_name], limit=PAIRS if devices > 2 else 10 ** 6)


AWKWARD = {"name": "awkward", "input": [5, 13, 11], "layers": [
    # a strided 1x1 window with padding: subsampled reads, border outputs reading only padding
    {"name": "s2", "op": "conv2d", "out_channels": 6, "kernel": 1, "stride": 2, "padding": 1},
    # padding wider than the kernel: tiles at the borders read nothing but padding
    {"name": "wide", "op": "conv2d", "out_channels": 4, "kernel": 3, "padding": 3},
    {"name": "pad_only", "op": "conv2d", "out_channels": 3, "kernel": 1, "padding": 2},
    # concat of inputs of 1, 4 and 2 channels: a tile's channel range misses some inputs entirely
    {"name": "one", "op": "conv2d", "out_channels": 1, "kernel": 1, "inputs": ["pad_only"]},
    {"name": "four", "op": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1, "inputs": ["pad_only"]},
    {"name": "two", "op": "conv2d", "out_channels": 2, "kernel": 1, "inputs": ["pad_only"]},
    {"name": "cat", "op": "concat", "inputs": ["one", "four", "two"]},
    {"name": "mix", "op": "add", "inputs": ["cat", "cat"]},
    # strides differing by dimension on odd sizes
    {"name": "s3", "op": "conv2d", "out_channels": 7, "kernel": 1, "stride": [3, 2], "padding": [2, 0]},
    {"name": "avg", "op": "avgpool2d", "kernel": 3, "stride": 2, "padding": 1},
    {"name": "gap", "op": "global_avgpool"},
    {"name": "flat", "op": "flatten"},
    {"name": "fc", "op": "linear", "out_features": 3},
    {"name": "loss", "op": "softmax_cross_entropy"}]}


def tile_reads(layer, slot, config, batch):
    """``(start, stop, step)`` arrays ``(ndim, Q)``: what each consumer tile reads, straight from ``tiling.fields``
    (the reference the shortcut in ``EdgeTraffic.ranges`` must equal)."""
    in_shapes = [(batch,) + tuple(s) for s in layer.in_shapes]
    out_shape = (batch,) + tuple(layer.out_shape)
    reads = []
    for index in config.indices():
        need = needs(layer, config.box(out_shape, index), in_shapes)[slot]
        steps = need.steps or (1,) * len(need.box)
        reads.append([(lo, max(hi, lo), step) for (lo, hi), step in zip(need.box, steps)])
    return tuple(np.array(reads).transpose(2, 1, 0))


@pytest.mark.parametrize("name", ["tiny_cnn", "small_inception", "small_resnet", "cifar_cnn", "awkward"])
def test_the_ranges_of_every_tile_are_its_reads(name):
    """Every degree from 1 to one past the extent along each dimension, and mixed splits: the per-part shortcut of
    ``ranges`` equals each tile's own reads (so ``forward``, the reference of the tables, stays independent)."""
    graph = parse_model(AWKWARD, "awkward") if name == "awkward" else load_model(os.path.join(MODELS, f"{name}.yaml"))
    batch, rng = 5, np.random.default_rng(0)
    cost = CostModel(graph, batch, MACHINES["one-node"], ComputeModel(MACHINES["one-node"].device))
    for layer in graph.layers:
        out_shape = (batch,) + tuple(layer.out_shape)
        splits = [tuple(d if k == axis else 1 for k in range(len(out_shape)))
                  for axis, extent in enumerate(out_shape) for d in range(1, min(extent + 1, 9) + 1)]
        splits += [tuple(int(rng.integers(1, 4)) for _ in out_shape) for _ in range(6)]
        for slot, ref in enumerate(layer.inputs):
            if ref == DATA:
                continue
            traffic = cost.edge(layer, slot)
            for degrees in splits:
                config = ParallelConfig(degrees, tuple(range(int(np.prod(degrees)))))
                for got, want in zip(traffic.ranges(config), tile_reads(layer, slot, config, batch)):
                    np.testing.assert_array_equal(got, want, err_msg=f"{layer.name} slot {slot} {degrees}")


@pytest.mark.parametrize("machine_name", ["one-node", "two-per-node", "three-per-node"])
@pytest.mark.parametrize("devices,batch", [(4, 3), (6, 5), (8, 2)])
def test_strided_padding_only_and_empty_concat_reads(devices, batch, machine_name):
    check_graph(parse_model(AWKWARD, "awkward"), devices, batch, MACHINES[machine_name], limit=400)


def test_the_hand_made_layers_do_read_strided_padding_only_and_nothing():
    """The cases above are there: strided needs, tiles reading only padding, tiles taking nothing from an
    input."""
    graph = parse_model(AWKWARD, "awkward")
    cost = CostModel(graph, 3, MACHINES["one-node"], ComputeModel(MACHINES["one-node"].device))
    def ranges(name, degrees):
        return cost.edge(graph.by_name[name], 0).ranges(ParallelConfig(degrees, tuple(range(np.prod(degrees)))))
    start, stop, step = ranges("s3", (1, 1, 2, 2))
    assert (step > 1).any()
    start, stop, step = ranges("pad_only", (1, 1, 6, 1))
    assert (stop[2] == start[2]).any()
    start, stop, step = ranges("cat", (1, 4, 1, 1))
    assert (stop[1] == start[1]).any()


def test_latency_alone_and_bandwidth_alone():
    """Messages counted once each, bytes alone: machines where one of the two costs nothing."""
    graph = load_model(os.path.join(MODELS, "small_inception.yaml"))
    check_graph(graph, 4, 6, machine(2, intra=(1e30, 1e-6), inter=(1e30, 7e-6)), limit=60)
    check_graph(graph, 4, 6, machine(2, intra=(3e9, 0.0), inter=(1e9, 0.0)), limit=60)


def test_configurations_on_other_devices_go_pair_by_pair():
    graph = load_model(os.path.join(MODELS, "tiny_cnn.yaml"))
    cost = CostModel(graph, 5, MACHINES["two-per-node"], ComputeModel(MACHINES["one-node"].device))
    layer = graph.by_name["conv2"]
    producers = configurations(graph.by_name["pool1"], 5, 4)
    consumers = configurations(layer, 5, 4)
    moved = [ParallelConfig(c.degrees, tuple(reversed(range(1, c.size + 1)))) for c in consumers]
    check_table(cost.edge(layer, 0), producers, moved + consumers, limit=10 ** 6)


def test_lists_of_one_configuration_and_of_whole_tile_counts():
    """Lists with no configuration of fewer tiles than the largest (no padded tiles), single ones."""
    graph = load_model(os.path.join(MODELS, "tiny_cnn.yaml"))
    cost = CostModel(graph, 6, MACHINES["two-per-node"], ComputeModel(MACHINES["one-node"].device))
    layer = graph.by_name["conv2"]
    producers = [c for c in configurations(graph.by_name["pool1"], 6, 6) if c.size == 6]
    consumers = [c for c in configurations(layer, 6, 6) if c.size == 6]
    check_table(cost.edge(layer, 0), producers, consumers, limit=10 ** 6)
    for p in producers[::3]:
        for q in consumers[::3]:
            check_table(cost.edge(layer, 0), [p], [q])


def test_reads_that_mix_dimensions_go_pair_by_pair(monkeypatch):
    """A consumer whose rows read depend on its columns' part: ``table`` sees it and goes pair by pair."""
    def mixed(layer, box, in_shapes):
        found = needs(layer, box, in_shapes)
        if layer.op != "conv2d":
            return found
        (h0, h1), shift = found[0].box[2], int(box[3][0] > 0)
        return [replace(found[0], box=found[0].box[:2] + ((min(h0 + shift, h1), h1),) + found[0].box[3:])]
    monkeypatch.setattr(transfer, "tile_needs", mixed)
    graph = load_model(os.path.join(MODELS, "tiny_cnn.yaml"))
    cost = CostModel(graph, 5, MACHINES["two-per-node"], ComputeModel(MACHINES["one-node"].device))
    layer = graph.by_name["conv2"]
    traffic = cost.edge(layer, 0)
    assert not traffic._separable()
    check_table(traffic, configurations(graph.by_name["pool1"], 5, 4), configurations(layer, 5, 4), limit=10 ** 6)


@pytest.mark.parametrize("name", ["tiny_cnn", "small_inception"])
def test_the_planner_tables_are_twice_the_forward_time(name):
    """Every edge's table, including those shared by consumers that read alike (Inception's 1x1 branches)."""
    graph = load_model(os.path.join(MODELS, f"{name}.yaml"))
    cost = CostModel(graph, 7, MACHINES["three-per-node"], ComputeModel(MACHINES["one-node"].device))
    problem = Problem(graph, 6, cost)
    readers = {}
    for u, v, table in problem.edges:
        readers.setdefault(id(table), set()).add(graph.by_name[problem.nodes[v]].signature)
    if name == "small_inception":       # layers that differ (their channels) but read alike share a table
        assert any(len(signatures) > 1 for signatures in readers.values())
    for u, v, table in problem.edges:
        consumer = next(layer for layer in graph.layers if layer.name == problem.nodes[v])
        slot = [problem.root[ref] if ref != DATA else ref for ref in consumer.inputs].index(problem.nodes[u])
        traffic = cost.edge(consumer, slot)
        expected = [[2 * traffic.forward(p, q).seconds for q in problem.choices[v]] for p in problem.choices[u]]
        np.testing.assert_allclose(table, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("degrees", [(3,), (2, 3), (4, 1, 3), (2, 3, 2, 5), (1, 1, 2, 1)])
def test_boxes_cover_a_range_of_tiles_exactly(degrees):
    count = int(np.prod(degrees))
    tiles = np.arange(count).reshape(degrees)
    for start in range(count + 1):
        for stop in range(start, count + 1):
            boxes = tile_boxes(degrees, start, stop)
            assert len(boxes) <= 2 * len(degrees) - 1
            covered = [tiles[tuple(slice(lo, hi) for lo, hi in box)].ravel() for box in boxes]
            assert sorted(np.concatenate(covered or [[]]).tolist()) == list(range(start, stop))
