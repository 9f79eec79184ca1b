"""``CostModel.node_costs``: every configuration of a layer at once, equal to ``node`` and to the cost model worked
out tile by tile (every tile's time, every replica group's ring), on the models, on hand-made layers with awkward
reads, with devices in any order, on machines whose nodes cut configurations anywhere, with and without a
profile."""

import math
import os
import random
from math import prod

import numpy as np
import pytest

from spmdcnn.cost.compute import ComputeModel, Profile, update_key, work
from spmdcnn.cost.tiles import clear_caches, tile_shape
from spmdcnn.cost.machine import parse_machine_text
from spmdcnn.cost.model import CostModel
from spmdcnn.graph import load_model
from spmdcnn.graph.graph import parse_model
from spmdcnn.planner.configs import configurations
from spmdcnn.tiling.config import ParallelConfig, output_shape
from spmdcnn.tiling.fields import needs

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")


def machine(per_node):
    return parse_machine_text(f"""
format: spmdcnn-machine/1
nodes: 8
devices_per_node: {per_node}
intra_node: {{bandwidth: 1.0e+10, latency: 1.0e-5}}
inter_node: {{bandwidth: 1.0e+9, latency: 1.0e-4}}
device: {{name: test, flops: 1.0e+11, memory_bandwidth: 1.0e+10, overhead: 1.0e-6}}
""")


AWKWARD = {"name": "awkward", "input": [5, 13, 11], "layers": [
    {"name": "s2", "op": "conv2d", "out_channels": 6, "kernel": 1, "stride": 2, "padding": 1},   # strided reads
    {"name": "bn", "op": "batchnorm2d"},
    {"name": "wide", "op": "conv2d", "out_channels": 4, "kernel": 3, "padding": 3},    # border tiles: padding
    {"name": "pad_only", "op": "conv2d", "out_channels": 3, "kernel": 1, "padding": 2},
    {"name": "one", "op": "conv2d", "out_channels": 1, "kernel": 1, "inputs": ["pad_only"]},
    {"name": "four", "op": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1, "inputs": ["pad_only"]},
    {"name": "two", "op": "conv2d", "out_channels": 2, "kernel": 1, "inputs": ["pad_only"]},
    {"name": "cat", "op": "concat", "inputs": ["one", "four", "two"]},    # channel parts missing some inputs
    {"name": "mix", "op": "add", "inputs": ["cat", "cat"]},
    {"name": "s3", "op": "conv2d", "out_channels": 7, "kernel": 1, "stride": [3, 2], "padding": [2, 0]},
    {"name": "avg", "op": "avgpool2d", "kernel": 3, "stride": 2, "padding": 1},
    {"name": "drop", "op": "dropout", "p": 0.25},
    {"name": "gap", "op": "global_avgpool"},
    {"name": "flat", "op": "flatten"},
    {"name": "fc", "op": "linear", "out_features": 3},
    {"name": "loss", "op": "softmax_cross_entropy"}]}


def tile_by_tile(cost, layer, config):
    """``t_c + t_s`` from every tile's shape and every replica group's ring (docs/architecture.md#the-cost-model-and-the-planner)."""
    compute, machine, batch, itemsize = cost.compute, cost.machine, cost.batch, cost.itemsize
    in_shapes = [(batch,) + tuple(s) for s in layer.in_shapes]
    out = output_shape(layer, batch)
    shapes = {tile_shape(layer, box, needs(layer, box, in_shapes))
              for box in (config.box(out, index) for index in config.indices())}
    factor = compute.profile.factor if compute.profile is not None else 1.0
    t_c = factor * max(compute.tile_seconds(s) + compute.update_seconds(sum(prod(p) for _, p in s.params))
                       for s in shapes)
    if not layer.params and not layer.buffers:
        return t_c
    seconds, points = 0.0, 0
    c_degree = config.degrees[1] if len(config.degrees) > 1 else 1
    for index, group in config.replicas().items():
        rows = (index + 1) * layer.out_shape[0] // c_degree - index * layer.out_shape[0] // c_degree
        p = len(group)
        if p > 1:
            links = [machine.link(a, b) for a, b in zip(group, group[1:] + group[:1])]
            bandwidth, latency = min(l.bandwidth for l in links), max(l.latency for l in links)
            steps = math.ceil(math.log2(p))

            def allreduce(nbytes):      # the faster of recursive doubling and a ring (no allreduce key here)
                return min(steps * (nbytes / bandwidth + latency), 2 * (p - 1) * (nbytes / p / bandwidth + latency))

            def allgather(nbytes):
                return min(steps * latency + (p - 1) * nbytes / bandwidth, (p - 1) * (nbytes / bandwidth + latency))
            if layer.op == "batchnorm2d":    # count, mean, M2 gathered forward; two sums backward; float64
                seconds = max(seconds, allgather(3 * rows * 8) + allreduce(2 * rows * 8))
            else:
                seconds = max(seconds, allreduce(sum(rows * prod(s[1:]) for s in layer.params.values()) * itemsize))
            points = 2 if layer.op == "batchnorm2d" else 1
    return t_c + seconds + points * compute.wait


def shuffled(configs, devices, seed=0):
    """The configurations on their devices in a random order, and moved to the last devices."""
    rng = random.Random(seed)
    result = []
    for config in configs:
        order = list(config.devices)
        rng.shuffle(order)
        result.append(ParallelConfig(config.degrees, tuple(order)))
        result.append(ParallelConfig(config.degrees, tuple(d + devices - config.size for d in config.devices)))
    return result


def check(graph, devices, batch, cost_model):
    """``node_costs`` of every layer against ``node`` one configuration at a time, in a cost model of its own
    (exactly), and against :func:`tile_by_tile`."""
    cost, alone = cost_model(), cost_model()
    for layer in graph.layers:
        configs = configurations(layer, batch, devices)
        configs += shuffled(configs, devices)
        costs = cost.node_costs(layer, configs)
        assert costs.dtype == np.float64 and costs.shape == (len(configs),)
        assert list(costs) == [sum(alone.node(layer, c)[:2]) for c in configs], layer.name
        assert list(cost.node_costs(layer, list(configs))) == list(costs)
        expected = [tile_by_tile(cost, layer, c) for c in configs]
        wrong = [(c.describe(), got, want) for c, got, want in zip(configs, costs, expected)
                 if abs(got - want) > 1e-12 * want]
        assert not wrong, (layer.name, wrong[:5])


# (model, devices, batch, devices per node): uneven splits, groups within and across nodes
CASES = [("tiny_cnn", 3, 5, 2), ("tiny_cnn", 8, 9, 3), ("small_inception", 4, 3, 3), ("small_inception", 6, 7, 1),
         ("small_resnet", 3, 5, 2), ("small_resnet", 8, 9, 3), ("alexnet", 4, 3, 1), ("alexnet", 6, 7, 2),
         ("awkward", 3, 5, 1), ("awkward", 4, 3, 2), ("awkward", 6, 7, 3), ("awkward", 8, 9, 2)]


@pytest.mark.parametrize("name,devices,batch,per_node", CASES)
def test_node_costs_are_the_cost_of_every_tile_and_replica_group(name, devices, batch, per_node):
    clear_caches()
    graph = parse_model(AWKWARD, "awkward") if name == "awkward" else load_model(os.path.join(MODELS,
                                                                                              f"{name}.yaml"))
    machine_ = machine(per_node)
    check(graph, devices, batch, lambda: CostModel(graph, batch, machine_, ComputeModel(machine_.device)))


@pytest.mark.parametrize("name", ["small_inception", "awkward"])
def test_node_costs_with_a_profile_time_measured_tiles_and_updates(name):
    """Some tiles and parameter updates measured (at random), the rest modelled and scaled, every tile scaled
    by the reference iterations and every synchronization charged."""
    graph = parse_model(AWKWARD, "awkward") if name == "awkward" else load_model(os.path.join(MODELS,
                                                                                              f"{name}.yaml"))
    devices, batch, machine_ = 4, 5, machine(2)
    rng = random.Random(1)
    store = Profile("test", in_situ={"x": {"measured": 1.5, "isolated": 1.0, "wait": 2e-5}})
    model = ComputeModel(machine_.device)
    for layer in graph.layers:
        in_shapes = [(batch,) + tuple(s) for s in layer.in_shapes]
        out = output_shape(layer, batch)
        for config in configurations(layer, batch, devices):
            for box in (config.box(out, index) for index in config.indices()):
                shape = tile_shape(layer, box, needs(layer, box, in_shapes))
                if rng.random() < 0.3:
                    store.add(shape, rng.uniform(0.2, 5) * model.analytic(*work(shape)))
                count = sum(prod(p) for _, p in shape.params)
                if count and rng.random() < 0.3:
                    store.entries[update_key(count)] = rng.uniform(1e-6, 1e-3)
    clear_caches()
    check(graph, devices, batch, lambda: CostModel(graph, batch, machine_, ComputeModel(machine_.device, store)))


def test_the_planner_lists_of_large_models_cost_as_node_says():
    """Inception-v3 on 16 devices of the paper's machine, repeated layers asking the same list."""
    from spmdcnn.planner.configs import searched
    from spmdcnn.planner.service import cost_model
    paper = os.path.join(MODELS, "..", "jobs", "machines", "paper-p100-4x4.yaml")
    graph = load_model(os.path.join(MODELS, "inception_v3.yaml"))
    clear_caches()
    cost, alone = (cost_model(graph, 32 * 16, 16, paper) for _ in range(2))
    root = searched(graph)
    lists = {}
    for layer in graph.layers:
        owner = graph.by_name[root[layer.name]]
        if owner.name not in lists:
            lists[owner.name] = configurations(owner, cost.batch, 16)
        costs = cost.node_costs(layer, lists[owner.name])
        assert list(costs) == [sum(alone.node(layer, c)[:2]) for c in lists[owner.name]], layer.name


def test_a_tile_time_that_depends_on_the_stride_too(monkeypatch):
    """Tiles left with one row or column of a strided read apply the stride themselves: their own attributes,
    not the whole tile's, count (were the analytic model to read them)."""
    from spmdcnn.cost import compute

    def strided_work(shape, itemsize=4):
        calls, flops, nbytes = work(shape, itemsize)
        rows, cols = dict(shape.attrs).get("stride", (1, 1))
        return calls, flops * rows * cols, nbytes
    monkeypatch.setattr(compute, "work", strided_work)
    clear_caches()
    graph, machine_ = parse_model(AWKWARD, "awkward"), machine(2)
    check(graph, 8, 9, lambda: CostModel(graph, 9, machine_, ComputeModel(machine_.device)))


def test_node_costs_take_any_iterable_of_configurations():
    graph = load_model(os.path.join(MODELS, "tiny_cnn.yaml"))
    machine_ = machine(2)
    cost = CostModel(graph, 4, machine_, ComputeModel(machine_.device))
    layer = graph.layers[0]
    configs = configurations(layer, 4, 4)
    assert list(cost.node_costs(layer, (c for c in configs))) == [sum(cost.node(layer, c)[:2]) for c in configs]
