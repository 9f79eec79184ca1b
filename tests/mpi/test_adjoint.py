"""Every communication pattern against its adjoint: ``<F x, y> == <x, F* y>`` summed over all ranks (DistDL's
adjoint test), for the redistribution of every layer of random plans and for the replica-group allreduce; and
the forward redistribution delivers exactly the global tensor's needed boxes."""

import os

import numpy as np
import pytest

from conftest import agree
from plans import random_plan
from spmdcnn.comm import ReplicaGroups
from spmdcnn.graph import load_model
from spmdcnn.graph.blocks import DATA
from spmdcnn.runtime.program import Program
from spmdcnn.tiling.boxes import relative
from spmdcnn.tiling.transfers import input_shapes

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")


def _slices(box):
    return tuple(slice(lo, hi) for lo, hi in box)


def _global(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.parametrize("name", ["tiny_cnn", "small_inception", "small_resnet", "tiny_volume"])
def test_redistribution_is_adjoint_to_its_scatter_add(world, name):
    graph = load_model(os.path.join(MODELS, f"{name}.yaml"))
    problems = []
    for seed in range(3):
        plan = random_plan(graph, 5, world.size, seed=500 + seed)
        program = Program(graph, plan, world, np.float64, np)
        for index, layer in enumerate(graph.layers):
            site = program.sites[layer.name]
            if site.exchange is None:
                continue
            shapes = input_shapes(plan, layer)
            xs = {slot: _global(shape, 100 * index + slot) for slot, shape in enumerate(shapes)}
            tiles = site.input_tiles
            sources = {slot: xs[slot][_slices(box)] for slot, box in tiles.items()}
            needs = {} if site.box is None else {slot: need for slot, (ref, need)
                                                 in enumerate(zip(layer.inputs, site.needs)) if ref != DATA}
            ys = site.exchange.forward(sources, needs)
            for slot, need in needs.items():
                whole = tuple((0, extent) for extent in shapes[slot])
                if not np.array_equal(ys[slot], xs[slot][relative(need.box, whole, need.steps)]):
                    problems.append(f"{plan.source}: {layer.name} input {slot}: wrong box delivered")
            rng = np.random.default_rng([world.rank, index])
            gys = {slot: rng.standard_normal(y.shape) for slot, y in ys.items()}
            slots = {slot for slot, ref in enumerate(layer.inputs) if ref != DATA}
            gxs = site.exchange.adjoint(gys, tiles, slots)
            forward_dot = sum(float(np.vdot(ys[s], gys[s])) for s in ys)
            adjoint_dot = sum(float(np.vdot(sources[s], gxs[s])) for s in gxs)
            total_forward, total_adjoint = world.sum_scalars(forward_dot, adjoint_dot)
            if abs(total_forward - total_adjoint) > 1e-12 * max(abs(total_forward), 1.0):
                problems.append(f"{plan.source}: {layer.name}: <F x, y> = {total_forward!r} but "
                                f"<x, F* y> = {total_adjoint!r}")
    agree(world, problems)


def test_replica_allreduce_is_self_adjoint(world):
    """The gradient allreduce within a group, A x_i = sum_j x_j, satisfies <A x, y> = <x, A y>."""
    ranks = list(range(world.size))
    sets = [tuple(ranks), tuple(ranks[::2]), tuple(ranks[1:]), (ranks[-1],)]
    groups = ReplicaGroups(world, sets)
    rng = np.random.default_rng(world.rank)
    problems = []
    for members in sets:
        inside = world.rank in members
        x, y = rng.standard_normal(7), rng.standard_normal(7)
        ax = groups.allreduce(members, x.copy()) if inside else x
        ay = groups.allreduce(members, y.copy()) if inside else y
        left, right = world.sum_scalars(float(np.vdot(ax, y)) if inside else 0.0,
                                        float(np.vdot(x, ay)) if inside else 0.0)
        if abs(left - right) > 1e-12 * max(abs(left), 1.0):
            problems.append(f"group {members}: <A x, y> = {left!r} but <x, A y> = {right!r}")
        if inside:
            expected = world.allgather(x)
            total = sum(expected[r] for r in members)
            if not np.allclose(ax, total, rtol=1e-14, atol=0):
                problems.append(f"group {members}: the allreduce is not the group's sum")
        else:
            world.allgather(x)
    agree(world, problems)


def test_a_halo_exchange_moves_only_the_halo_rows(world):
    """Two 3x3 convolutions split over h on every rank: between them, each boundary moves one row each way."""
    from spmdcnn.graph.graph import parse_model
    from spmdcnn.tiling.plan import from_mapping
    N, C, H, W = 2, 3, 12, 5
    graph = parse_model({"name": "halo", "input": [C, H, W], "layers": [
        {"name": "a", "op": "conv2d", "out_channels": C, "kernel": 3, "padding": 1},
        {"name": "b", "op": "conv2d", "out_channels": C, "kernel": 3, "padding": 1},
        {"name": "flat", "op": "flatten"}, {"name": "fc", "op": "linear", "out_features": 2},
        {"name": "loss", "op": "softmax_cross_entropy"}]})
    split = {"h": world.size, "devices": list(range(world.size))}
    plan = from_mapping({"format": "spmdcnn-plan/1", "devices": world.size, "layers": {"a": split, "b": split}},
                        graph, N, world.size, "halo plan")
    program = Program(graph, plan, world, np.float64, np)
    tile = program.sites["a"].box
    world.reset()
    program.sites["b"].exchange.forward({0: np.ones([hi - lo for lo, hi in tile])},
                                        {0: program.sites["b"].needs[0]})
    moved = world.sum_scalars(world.counters.bytes_transferred)[0]
    expected = (world.size - 1) * 2 * N * C * W * 8
    agree(world, [] if moved == expected else [f"moved {moved} bytes, expected {expected}"])
