"""The memory model and the planner's per-device memory limit."""

import os
import re
from itertools import product as tiles_of

import numpy as np
import pytest

from spmdcnn.cost import memory
from spmdcnn.cost.compute import ComputeModel
from spmdcnn.cost.machine import load_machine
from spmdcnn.cost.memory import layer_memory, parse_size, plan_memory
from spmdcnn.cost.model import CostModel
from spmdcnn.graph import load_model
from spmdcnn.planner import Problem, make_plan
from spmdcnn.planner.search import evaluate
from spmdcnn.runtime.executor import Executor
from spmdcnn.tiling.config import ParallelConfig
from spmdcnn.tiling.plan import named

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
MACHINE = load_machine(os.path.join(MODELS, "..", "jobs", "machines", "paper-p100-4x4.yaml"))


def _saved_bytes(executor):
    """Bytes of the arrays the kernels saved for backward, each once, the parameters' own left out."""
    found, stack = {}, [executor._saved]
    while stack:
        item = stack.pop()
        if isinstance(item, np.ndarray):
            if item.size > 1 and not np.shares_memory(item, executor.params.flat):
                found[id(item.base if item.base is not None else item)] = item.nbytes
        elif isinstance(item, (tuple, list)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return sum(found.values())


@pytest.mark.parametrize("name,batch,chain", [("tiny_cnn", 6, True), ("alexnet", 2, True),
                                              ("small_inception", 5, False), ("small_resnet", 4, False)])
def test_the_model_counts_what_the_kernels_keep_for_backward(name, batch, chain):
    """On one device: what the runtime holds from forward to backward (its kernels' saved arrays) against the
    model, parameters (three times) and buffers apart. Where several layers read one tensor (Inception's
    branches, a residual block) the runtime may keep one array for all of them and the model counts each: an
    upper bound there."""
    graph = load_model(os.path.join(MODELS, f"{name}.yaml"))
    executor = Executor(graph, dtype=np.float32)
    shape = (batch,) + tuple(graph.input_shape)
    executor.forward(np.random.default_rng(0).standard_normal(shape).astype(np.float32),
                     np.arange(batch) % graph.num_classes)
    tensors = 4 * (3 * executor.params.flat.size + executor.buffers.flat.size)
    modelled = plan_memory(graph, named("data", graph, batch, 1)) - tensors
    measured = _saved_bytes(executor)
    if chain:
        assert modelled == pytest.approx(measured, rel=0.02), (modelled, measured)
    else:
        assert measured <= 1.02 * modelled and modelled <= 1.5 * measured, (modelled, measured)


def test_splitting_channels_shares_the_parameters_but_keeps_the_whole_input():
    graph = load_model(os.path.join(MODELS, "alexnet.yaml"))
    fc6 = graph.by_name["fc6"]
    params = 4096 * 9216 + 4096
    assert layer_memory(fc6, (1, 4), 64) == 4 * (64 * 9216 + 3 * params / 4)      # every sample, every feature
    assert layer_memory(fc6, (4, 1), 64) == 4 * (16 * 9216 + 3 * params)         # a quarter of the samples
    relu = graph.by_name["relu1"]
    assert layer_memory(relu, (2, 1, 1, 1), 64) == 32 * 64 * 55 * 55                 # a one-byte mask


@pytest.mark.parametrize("text, value", [("12GiB", 12 * 2 ** 30), ("800 MB", 8e8), ("1.5e9", 1.5e9), ("64kib", 65536)])
def test_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["twelve", "12XB", "-3GB", "0", "nan", "inf"])
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
    assert limited.plan.text != free.plan.text and limited.solution.exact      # branch and bound proved it
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


def test_the_plan_command_keeps_to_a_memory_limit_and_says_where_it_does_not_apply(capsys):
    from spmdcnn.cli import main
    model = os.path.join(MODELS, "tiny_cnn.yaml")
    assert main(["plan", model, "--devices", "2", "--batch", "8", "--memory", "1GiB"]) == 0
    assert "memory: " in capsys.readouterr().out
    assert main(["plan", model, "--devices", "2", "--batch", "8", "--strategy", "data", "--memory", "1GiB"]) == 2
    assert "--memory applies to the optimal search" in capsys.readouterr().err
    assert main(["plan", model, "--devices", "2", "--batch", "8", "--memory", "1KiB"]) == 2
    assert "no plan fits in 1.0 KiB per device (--memory): the lightest needs" in capsys.readouterr().err


@pytest.mark.parametrize("layer_name,degrees", [("conv1_2.conv", (1, 1, 4, 1)), ("conv1_2.conv", (2, 2, 3, 3)),
                                                ("pool1", (1, 1, 5, 2)), ("conv1_2.relu", (1, 1, 7, 1)),
                                                ("fc6", (3, 5))])
def test_the_heaviest_tile_is_the_most_any_device_keeps(layer_name, degrees):
    """Every tile counted one by one: interior tiles of a window read a halo on both sides, uneven splits have
    larger parts; the model's tile is the heaviest."""
    graph = load_model(os.path.join(MODELS, "vgg16.yaml"))
    layer, batch = graph.by_name[layer_name], 8
    config = ParallelConfig(degrees, tuple(range(int(np.prod(degrees)))))
    shape = (batch,) + tuple(layer.out_shape)
    heaviest = max(memory._saved(layer, config.box(shape, index), batch, 4)
                   for index in tiles_of(*(range(d) for d in degrees)))
    split = degrees[1] if len(degrees) > 1 else 1
    params = sum(int(np.ceil(s[0] / split)) * int(np.prod(s[1:])) for s in layer.params.values())
    assert layer_memory(layer, degrees, batch) == heaviest + 4 * 3 * params


class _RandomProblem:
    """A small search problem with random costs, transfer tables and memory per configuration."""

    def __init__(self, seed, nodes=6):
        rng = np.random.default_rng(seed)
        self.sizes = [int(rng.integers(2, 5)) for _ in range(nodes)]
        self.node_costs = [rng.random(s) for s in self.sizes]
        pairs = [(v - 1, v) for v in range(1, nodes)] + [(0, nodes - 1), (1, nodes - 2)]   # a chain with shortcuts
        self.edges = [(u, v, rng.random((self.sizes[u], self.sizes[v])) * 0.5) for u, v in pairs]
        self._bytes = [rng.integers(1, 100, s).astype(float) for s in self.sizes]

    def memory(self, itemsize):
        return self._bytes


@pytest.mark.parametrize("seed", range(12))
def test_the_memory_limited_search_is_exact(seed):
    """Against every assignment: the limited search returns the fastest plan that fits, proven so."""
    import itertools
    from spmdcnn.planner import _within_memory
    from spmdcnn.planner.search import evaluate as objective
    problem = _RandomProblem(seed)
    sizes, bytes_ = problem.sizes, problem.memory(4)
    every = [(objective(sizes, problem.node_costs, problem.edges, list(c)),
              sum(b[i] for b, i in zip(bytes_, c))) for c in itertools.product(*(range(s) for s in sizes))]
    lightest, unlimited = min(m for _, m in every), min(every)[1]
    for share in (0.05, 0.3, 0.6, 0.9):
        limit = lightest + share * (unlimited - lightest)
        expected = min(f for f, m in every if m <= limit)
        solution = _within_memory(problem, sizes, limit, 4)
        assert sum(b[i] for b, i in zip(bytes_, solution.choices)) <= limit
        assert solution.cost == pytest.approx(expected, rel=1e-9) and solution.exact, (share, solution.method)


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_a_search_out_of_budget_says_how_far_from_optimal_it_may_be(seed):
    from spmdcnn.planner import _within_memory
    problem = _RandomProblem(seed, nodes=8)
    sizes, bytes_ = problem.sizes, problem.memory(4)
    lightest = sum(b.min() for b in bytes_)
    heaviest = sum(b.max() for b in bytes_)
    limit = lightest + 0.2 * (heaviest - lightest)
    solution = _within_memory(problem, sizes, limit, 4, nodes=1)
    exact = _within_memory(problem, sizes, limit, 4)
    assert exact.exact and exact.cost <= solution.cost
    assert not solution.exact               # one search cannot close these gaps
    if not solution.exact:                 # the proven distance holds the true optimum
        gap = float(re.search(r"within ([0-9.e+-]+) % of optimal", solution.method).group(1)) / 100
        assert solution.cost * (1 - gap) <= exact.cost * (1 + 1e-6)
