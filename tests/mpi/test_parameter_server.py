"""``sync: parameter-server`` on real ranks: each layer's replica groups push its gradients to their server right
after its backward and pull the sum back before its update (comm/server.py), and training under random plans still
equals one process, within one node and over a layout of several nodes; the ranks move what the cost model
charges."""

import os

import numpy as np
import pytest

from conftest import agree
from plans import random_plan
from stepping import train
from spmdcnn.cost.buckets import SyncOptions
from spmdcnn.cost.compute import ComputeModel
from spmdcnn.cost.machine import Link, Machine
from spmdcnn.cost.model import CostModel
from spmdcnn.cost.timeline import device_buckets
from spmdcnn.graph import load_model
from spmdcnn.runtime.executor import Executor
from spmdcnn.tiling.plan import named

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
SERVED = SyncOptions(mode="parameter-server")
BATCH = 4


@pytest.fixture(params=["one node", "nodes of two"])
def layout(request, world, monkeypatch):
    """The ranks on one node, as here, or as if on nodes of two ranks (the servers' sums then cross nodes)."""
    if request.param == "nodes of two":
        monkeypatch.setattr(world, "_node_ids", [rank - rank % 2 for rank in range(world.size)], raising=False)
    return request.param


@pytest.mark.parametrize("name", ["small_resnet", "small_inception"])
def test_training_through_servers_equals_one_process(world, layout, name):
    graph = load_model(os.path.join(MODELS, f"{name}.yaml"))
    reference, _ = train(graph, None, None, SyncOptions())
    problems = []
    for seed in range(2):
        plan = random_plan(graph, BATCH, world.size, 170 + seed)
        executor, calls = train(graph, plan, world, SERVED)
        program = executor.program
        layers = [b.ready for b in program.buckets]
        if len(set(zip(layers, (b.ranks for b in program.buckets)))) != len(program.buckets):
            problems.append(f"seed {seed}: a layer has two buckets for one group: {layers}")
        expected = program.local + [(b.start, b.stop) for b in program.buckets]
        if calls != expected:
            problems.append(f"seed {seed}: updated {calls}, expected the local slices then the buckets {expected}")
        for tensor, index in executor.shards.items():
            if tensor not in executor.params:
                continue
            want = reference.params[tensor][index]
            error = np.max(np.abs(executor.params[tensor] - want))
            if error > 1e-10 * max(np.max(np.abs(want)), 1e-6):
                problems.append(f"{layout}, seed {seed}: {tensor} off one process by {error:.3g}")
    agree(world, problems)


def test_the_ranks_count_what_the_model_charges(world):
    """Bytes summed per iteration are the model's (each member's gradients pushed and the sum pulled), the ranks
    wait for no more than the servers' sums took, and the model's pulls are the runtime's buckets: one per layer
    and replica group, of the same bytes, in the same order."""
    graph = load_model(os.path.join(MODELS, "small_resnet.yaml"))
    machine = Machine("served", 1, 16, Link(1e10, 1e-6), Link(1e10, 1e-6), sync="parameter-server")
    cost = CostModel(graph, BATCH, machine, ComputeModel(machine.device), itemsize=8, sync=SERVED)
    problems = []
    for plan in [random_plan(graph, BATCH, world.size, 180), named("data", graph, BATCH, world.size)]:
        executor = Executor(graph, np, np.float64, seed=0, plan=plan, world=world, sync=SERVED)
        rng = np.random.default_rng(0)
        world.reset()
        executor.forward(rng.standard_normal((BATCH,) + graph.input_shape),
                         rng.integers(0, graph.num_classes, BATCH), step=0)
        executor.backward()
        counters = world.counters
        if counters.sync_exposed_s > counters.sync_s + 1e-9:
            problems.append(f"{plan.source}: {counters.sync_exposed_s} s exposed, more than the {counters.sync_s} s "
                            "of sync")
        synced = sum(world.allgather(counters.bytes_synced))
        overhead = 8 * cost.loss_values * world.size if world.size > 1 else 0
        predicted = cost.simulate(plan)
        if predicted.summary()["bytes_synced"] + overhead != synced:
            problems.append(f"{plan.source}: predicted {predicted.summary()['bytes_synced']} + {overhead} bytes "
                            f"summed, the ranks {synced}")
        ran = [(b.ranks, (b.stop - b.start) * 8, b.ready) for b in executor.program.buckets]
        charged = [(b.ranks, b.nbytes, b.ready) for b in device_buckets(graph, plan, world.rank, SERVED, 8, machine)]
        if ran != charged:
            problems.append(f"{plan.source}: the runtime pulls {ran}, the model charges {charged}")
    agree(world, problems)
