"""What the profiler times is what each rank runs, under random plans: every tile a rank computes has the shape
the cost model gives it (``cost.tiles.tile_shape`` of its box and reads, one of ``tile_shapes`` of its layer's
configuration), and the profiler's kernel for that shape makes the same kernel calls (output, input gradients,
padded input and stride of a window) as the rank's."""

import os

import numpy as np
import pytest

from conftest import agree
from kernel_calls import recording
from plans import answers, random_plan
from spmdcnn.cost.tiles import tile_shape, tile_shapes
from spmdcnn.graph import load_model, parse_model
from spmdcnn.runtime.executor import Executor
from spmdcnn.runtime.profile import tile_step
from decoder_models import DECODER, DECODER_VOLUME
from test_equivalence import STRIDED

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
BATCH = 5
POOL_FIRST = {"name": "pool_first", "input": [3, 12, 10], "layers": [
    {"name": "pool", "op": "avgpool2d", "kernel": 3, "stride": 1, "padding": 1}, {"name": "relu0", "op": "relu"},
    {"name": "conv1", "op": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1, "stride": 2},
    {"name": "bn1", "op": "batchnorm2d"}, {"name": "relu1", "op": "relu"},
    {"name": "conv2", "op": "conv2d", "out_channels": 4, "kernel": 1, "stride": 2},
    {"name": "gap", "op": "global_avgpool"}, {"name": "flat", "op": "flatten"},
    {"name": "drop", "op": "dropout", "p": 0.5},
    {"name": "fc", "op": "linear", "out_features": 3}, {"name": "loss", "op": "softmax_cross_entropy"}]}
INLINE = {"pool_first": POOL_FIRST, "strided": STRIDED, "decoder": DECODER, "decoder_volume": DECODER_VOLUME}


def _model(name):
    if name in INLINE:
        return parse_model(INLINE[name])
    return load_model(os.path.join(MODELS, f"{name}.yaml"))


def _by_layer(executor, calls):
    """Run one training step, recording each layer's kernel calls."""
    rng = np.random.default_rng(0)
    graph = executor.graph
    images = rng.standard_normal((BATCH,) + graph.input_shape)
    labels = answers(graph, rng, BATCH)
    found = {}
    for site in executor.program.sites.values():
        if site.kernel is not None:
            forward, backward = site.kernel.forward, site.kernel.backward

            def run_forward(xs, run, _forward=forward, _name=site.layer.name):
                start = len(calls)
                result = _forward(xs, run)
                found.setdefault(_name, []).extend(calls[start:])
                return result

            def run_backward(gy, saved, _backward=backward, _name=site.layer.name):
                start = len(calls)
                result = _backward(gy, saved)
                found.setdefault(_name, []).extend(calls[start:])
                return result
            site.kernel.forward, site.kernel.backward = run_forward, run_backward
    executor.forward(images, labels, step=1)
    executor.backward()
    return found


@pytest.mark.parametrize("name", ["strided", "small_inception", "small_resnet", "pool_first", "tiny_volume",
                                  "decoder", "decoder_volume"])
def test_the_profiler_runs_each_ranks_tiles_as_the_rank_does(world, monkeypatch, name):
    graph = _model(name)
    calls = recording(monkeypatch)
    problems = []
    for seed in range(2):
        plan = random_plan(graph, BATCH, world.size, seed=700 + seed)
        executor = Executor(graph, np, np.float64, seed=1, plan=plan, world=world)
        ran = _by_layer(executor, calls)
        for site in executor.program.sites.values():
            if site.kernel is None:
                continue
            layer = site.layer
            shape = tile_shape(layer, site.box, site.needs)
            if shape not in tile_shapes(layer, plan[layer.name], BATCH):
                problems.append(f"{plan.source}: {layer.name}: tile {site.box} is not among the cost model's shapes")
            run = tile_step(shape, np, np.float64)
            start = len(calls)
            run()
            if calls[start:] != ran.get(layer.name):
                problems.append(f"{plan.source}: {layer.name}: the profiler ran {calls[start:]}, the rank "
                                f"{ran.get(layer.name)}")
    agree(world, problems)
