"""What the profiler times is what training runs: the same bound kernels, called the same way, kernel call for
kernel call, on models whose first layers have no parameters (so no gradient reaches the data side of them)."""

import numpy as np
import pytest

from kernel_calls import recording

from spmdcnn.cost.compute import work
from spmdcnn.cost.tiles import tile_shapes
from spmdcnn.graph.graph import parse_model
from spmdcnn.runtime.executor import Executor
from spmdcnn.runtime.profile import tile_step
from spmdcnn.tiling.config import ParallelConfig, output_shape

POOL_FIRST = [{"name": "pool", "op": "maxpool2d", "kernel": 2},
              {"name": "conv", "op": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1},
              {"name": "relu", "op": "relu"},
              {"name": "flat", "op": "flatten"},
              {"name": "fc", "op": "linear", "out_features": 3},
              {"name": "loss", "op": "softmax_cross_entropy"}]


def _random_layers(seed, rank=2):
    """A few parameterless layers on the data, then a small network with parameters, over ``rank`` spatial axes
    (a volume network for 3: leaky relu, tanh, scale and a regression loss)."""
    rng = np.random.default_rng(seed)
    d = f"{rank}d"
    choices = [{"op": f"maxpool{d}", "kernel": 2, "stride": 1}, {"op": f"avgpool{d}", "kernel": 3, "stride": 1,
                                                                  "padding": 1},
               {"op": "relu"}, {"op": "dropout", "p": 0.25}]
    if rank == 3:
        choices += [{"op": "leaky_relu", "negative_slope": 0.3}, {"op": "scale", "factor": 0.5}]
    layers = [dict(choices[i], name=f"free{j}") for j, i in enumerate(rng.integers(0, len(choices), 3))]
    layers += [{"name": "conv1", "op": f"conv{d}", "out_channels": 3, "kernel": 3, "padding": 1},
               {"name": "bn1", "op": f"batchnorm{d}"}, {"name": "relu1", "op": "relu" if rank == 2 else "tanh"},
               {"name": "conv2", "op": f"conv{d}", "out_channels": 3, "kernel": 1, "inputs": ["relu1"]},
               {"name": "sum", "op": "add", "inputs": ["conv2", "relu1"]},
               {"name": "gap", "op": "global_avgpool"}, {"name": "flat", "op": "flatten"},
               {"name": "fc", "op": "linear", "out_features": 4},
               {"name": "loss", "op": "softmax_cross_entropy" if rank == 2 else "mse_loss"}]
    return layers


def _executor_calls(graph, batch, calls):
    executor = Executor(graph, np, np.float64, seed=3)
    rng = np.random.default_rng(0)
    images = rng.standard_normal((batch,) + graph.input_shape)
    labels = rng.integers(0, graph.num_classes, batch) if graph.answers == "labels" else \
        rng.uniform(-1, 1, (batch, graph.num_outputs))
    calls.clear()
    executor.forward(images, labels)
    executor.backward()
    return sorted(calls, key=repr)


def _profiler_calls(graph, batch, calls):
    found = []
    for layer in graph.layers:
        whole = ParallelConfig((1,) * len(output_shape(layer, batch)), (0,))
        shape, = tile_shapes(layer, whole, batch)
        run = tile_step(shape, np, np.float64)
        calls.clear()
        run()
        found += calls
    return sorted(found, key=repr)


@pytest.mark.parametrize("layers", [POOL_FIRST] + [_random_layers(seed) for seed in range(4)]
                         + [_random_layers(seed, rank=3) for seed in range(3)],
                         ids=["pool-first"] + [f"random{seed}" for seed in range(4)]
                         + [f"volume{seed}" for seed in range(3)])
def test_the_profiler_runs_the_kernel_calls_training_runs(monkeypatch, layers):
    shape = [2, 5, 8, 6] if layers[-1]["op"] == "mse_loss" else [2, 8, 6]
    graph = parse_model({"name": "m", "input": shape, "layers": layers})
    calls = recording(monkeypatch)
    assert _profiler_calls(graph, 4, calls) == _executor_calls(graph, 4, calls)


def test_a_convolution_reached_only_through_a_pooling_of_the_data_computes_no_data_gradient(monkeypatch):
    graph = parse_model({"name": "m", "input": [2, 8, 6], "layers": POOL_FIRST})
    pool, conv = graph.by_name["pool"], graph.by_name["conv"]
    assert not pool.needs_grad and not conv.input_grad and graph.by_name["fc"].input_grad
    shapes = {layer.name: tile_shapes(layer, ParallelConfig((1,) * len(output_shape(layer, 4)), (0,)), 4)[0]
              for layer in (pool, conv)}
    assert not shapes["conv"].input_grad and not shapes["pool"].backward
    # the cost model charges a convolution without its data gradient two GEMM passes, not three
    with_dx = work(type(shapes["conv"])(**{**shapes["conv"].__dict__, "input_grad": True}))
    assert work(shapes["conv"])[1] * 3 == with_dx[1] * 2
    calls = recording(monkeypatch)
    ran = _executor_calls(graph, 4, calls)
    assert ("conv2d", "backward", (False,)) in ran
    assert not any(op == "maxpool2d" and phase == "backward" for op, phase, *_ in ran)
