"""The cost model describes what the runtime does, message for message: for random plans (permuted and partial
device lists, uneven splits, strided windows, concat, add) the bytes it predicts moving between layers and
summing in allreduces are exactly the bytes the ranks count in one training iteration."""

import math
import os

import numpy as np
import pytest

from conftest import agree
from decoder_models import DECODER, DECODER_VOLUME, SEGMENTER_VOLUME
from plans import answers, random_plan
from spmdcnn.cost.compute import ComputeModel
from spmdcnn.cost.machine import default_machine
from spmdcnn.cost.model import CostModel
from spmdcnn.graph import load_model, parse_model
from spmdcnn.runtime.executor import Executor
from spmdcnn.tiling.plan import named

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
BATCH = 5
# parameterless layers on the data: no gradient flows back into them, so their edges run no adjoint exchange
POOL_FIRST = {"name": "pool_first", "input": [3, 12, 10], "layers": [
    {"name": "pool", "op": "maxpool2d", "kernel": 2, "stride": 1}, {"name": "relu0", "op": "relu"},
    {"name": "conv1", "op": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1},
    {"name": "bn1", "op": "batchnorm2d"},
    {"name": "relu1", "op": "relu"}, {"name": "cat", "op": "concat", "inputs": ["relu1", "pool"]},
    {"name": "conv2", "op": "conv2d", "out_channels": 5, "kernel": 3, "stride": 2},
    {"name": "gap", "op": "global_avgpool"}, {"name": "flat", "op": "flatten"},
    {"name": "fc", "op": "linear", "out_features": 3}, {"name": "loss", "op": "softmax_cross_entropy"}]}


INLINE = {"pool_first": POOL_FIRST, "decoder": DECODER, "decoder_volume": DECODER_VOLUME,
          "segmenter_volume": SEGMENTER_VOLUME}


def _model(name):
    return parse_model(INLINE[name]) if name in INLINE else load_model(os.path.join(MODELS, f"{name}.yaml"))


def counted(world, graph, plan, batchnorm=None):
    """Bytes all ranks sent between layers and contributed to allreduces in one forward and backward."""
    executor = Executor(graph, np, np.float64, seed=0, plan=plan, world=world, batchnorm=batchnorm)
    rng = np.random.default_rng(0)
    images = rng.standard_normal((plan.batch,) + graph.input_shape)
    labels = answers(graph, rng, plan.batch)
    world.reset()
    executor.forward(images, labels, step=0)
    executor.backward()
    counters = world.allgather((world.counters.bytes_transferred, world.counters.bytes_synced))
    return sum(c[0] for c in counters), sum(c[1] for c in counters)


@pytest.mark.parametrize("model_name", ["tiny_cnn", "small_inception", "small_resnet", "cifar_cnn", "pool_first",
                                        "tiny_volume", "decoder", "decoder_volume", "segmenter_volume"])
@pytest.mark.parametrize("seed", range(3))
def test_predicted_bytes_are_the_bytes_the_ranks_move(world, model_name, seed):
    graph = _model(model_name)
    plans = [random_plan(graph, BATCH, world.size, seed)]
    if seed == 0:
        plans += [named(s, graph, BATCH, world.size) for s in ("data", "model", "owt")]
    cost = CostModel(graph, BATCH, default_machine(), ComputeModel(default_machine().device), itemsize=8)
    problems = []
    for plan in plans:
        moved, synced = counted(world, graph, plan)
        predicted = cost.simulate(plan).summary()
        # the loss, its count, the score (and a Dice loss's table): one allreduce of float64 over all ranks
        overhead = 8 * cost.loss_values * world.size if world.size > 1 else 0
        if predicted["bytes_transferred"] != moved:
            problems.append(f"{plan.source}: predicted {predicted['bytes_transferred']} bytes moved, "
                            f"ranks moved {moved}")
        if predicted["bytes_synced"] + overhead != synced:
            problems.append(f"{plan.source}: predicted {predicted['bytes_synced']} + {overhead} bytes allreduced, "
                            f"ranks allreduced {synced}")
    agree(world, problems)


@pytest.mark.parametrize("model_name", ["small_resnet", "pool_first", "tiny_volume"])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_predicted_bytes_under_ghost_batch_norm(world, model_name, group):
    """Ghost batch norm: the components' statistics, gamma's and beta's gradients in the buckets and the running
    statistics of a replica group split into components, as the model counts them."""
    graph = _model(model_name)
    batch = 4
    plans = [random_plan(graph, batch, world.size, 40 + seed) for seed in range(3)]
    plans += [named(s, graph, batch, world.size) for s in ("data", "owt")]
    cost = CostModel(graph, batch, default_machine(), ComputeModel(default_machine().device), itemsize=8,
                     batchnorm={"group": group})
    overhead = 8 * cost.loss_values * world.size if world.size > 1 else 0
    problems = []
    for plan in plans:
        _, synced = counted(world, graph, plan, {"group": group})
        predicted = cost.simulate(plan).summary()["bytes_synced"]
        if predicted + overhead != synced:
            problems.append(f"{plan.source} G={group}: predicted {predicted} + {overhead} bytes, counted {synced}")
    agree(world, problems)


def test_the_wait_per_synchronization_is_measured_on_a_data_parallel_run(world):
    """``spmdcnn profile``'s latency per point and drift: finite, non-negative, in the cost model's units, the
    same on every rank, from a real data-parallel run of as many points as the model walks; the run leaves the
    counters clean. How large they are is the machine's business (a busy machine's ranks drift apart by many
    times their compute): tests/runtime/test_trial_choice.py holds the fit to known waits."""
    from spmdcnn.planner.service import cost_model
    from spmdcnn.runtime.insitu import synchronization
    graph = load_model(os.path.join(MODELS, "tiny_cnn.yaml"))
    cost = cost_model(graph, 2 * world.size, world.size)
    found = synchronization(graph, 2 * world.size, world, np, np.float32, cost, steps=2)
    every = world.allgather(tuple(found))
    problems = [f"latency {found.latency!r} s"] if not 0.0 <= found.latency < math.inf else []
    problems += [f"drift {found.drift!r}"] if not 0.0 <= found.drift < math.inf else []
    problems += [f"measured {found.measured!r} s"] if not 0.0 < found.measured < math.inf else []
    problems += [f"{found.points} points"] if found.points < 2 and world.size > 1 else []
    problems += [f"ranks disagree: {every}"] if len(set(every)) != 1 else []
    problems += ["counters left"] if world.counters.sync_s or world.counters.bytes_synced else []
    agree(world, problems)