"""The memory model and the planner's per-device memory limit."""

import os

import numpy as np
import pytest

from spmdcnn.cost.compute import ComputeModel
from spmdcnn.cost.machine import parse_machine_text
from spmdcnn.cost.memory import layer_memory, parse_size, plan_memory
from spmdcnn.cost.model import CostModel
from spmdcnn.graph import load_model
from spmdcnn.planner import Problem, make_plan
from spmdcnn.planner.search import evaluate
from spmdcnn.runtime.executor import Executor
from spmdcnn.tiling.plan import named

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
MACHINE = parse_machine_text("""
format: spmdcnn-machine/1
name: two-level
nodes: 2
devices_per_node: 2
intra_node: {bandwidth: 2.0e+10, latency: 5.0e-6}
inter_node: {bandwidth: 2.0e+9, latency: 3.0e-5}
""")


def test_one_device_holds_every_tensor_three_times_and_every_output():
    graph = load_model(os.path.join(MODELS, "tiny_cnn.yaml"))
    plan = named("data", graph, 6, 1)
    executor = Executor(graph, dtype=np.float32)
    outputs = sum(int(np.prod((6,) + tuple(layer.out_shape))) for layer in graph.layers)
    expected = 4 * (outputs + 3 * executor.params.flat.size + executor.buffers.flat.size)
    assert plan_memory(graph, plan) == expected


def test_splitting_channels_shares_the_parameters_and_samples_the_outputs():
    graph = load_model(os.path.join(MODELS, "alexnet.yaml"))
    fc6 = graph.by_name["fc6"]
    whole = layer_memory(fc6, (1, 1), 64)
    assert layer_memory(fc6, (1, 4), 64) == pytest.approx(4 * (64 * 1024 + 3 * (4096 * 9216 + 4096) / 4))
    assert layer_memory(fc6, (4, 1), 64) < whole and layer_memory(fc6, (1, 4), 64) < whole / 3


@pytest.mark.parametrize("text, value", [("12GiB", 12 * 2 ** 30), ("800 MB", 8e8), ("1.5e9", 1.5e9), ("64kib", 65536)])
def test_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["twelve", "12XB", "-3GB", "0"])
def test_bad_sizes(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_a_memory_limit_changes_the_plan_and_is_kept():
    graph = load_model(os.path.join(MODELS, "alexnet.yaml"))
    cost = CostModel(graph, 64, MACHINE, ComputeModel(MACHINE.device))
    free = make_plan(graph, 4, cost)
    problem = Problem(graph, 4, cost)
    lightest = sum(m.min() for m in problem.memory(4))
    used = plan_memory(graph, free.plan)
    assert lightest < used
    limit = (lightest + used) / 2
    limited = make_plan(graph, 4, cost, memory=limit)
    assert plan_memory(graph, limited.plan) <= limit
    assert limited.plan.text != free.plan.text and not limited.solution.exact
    assert limited.prediction.iteration_s >= free.prediction.iteration_s
    sizes = [len(c) for c in problem.choices]
    index = {name: i for i, name in enumerate(problem.nodes)}
    choices = [problem.choices[i].index(limited.plan[name]) for name, i in index.items()]
    assert evaluate(sizes, problem.node_costs, problem.edges, choices) == pytest.approx(limited.solution.cost)
    for strategy in ("data", "owt", "model"):      # no fixed strategy that fits is faster
        plan = named(strategy, graph, 64, 4)
        if plan_memory(graph, plan) <= limit:
            assert cost.simulate(plan).iteration_s >= limited.prediction.iteration_s * (1 - 1e-9)
    roomy = make_plan(graph, 4, cost, memory=used * 2)
    assert roomy.plan.text == free.plan.text and roomy.solution.exact
    with pytest.raises(ValueError, match="no plan fits .* the lightest needs"):
        make_plan(graph, 4, cost, memory=lightest * 0.9)
