"""The memory model and the planner's per-device memory limit."""

import os
import re
from itertools import product as tiles_of

import numpy as np
import pytest

from spmdcnn.cost import memory
from spmdcnn.cost.compute import ComputeModel
from spmdcnn.cost.machine import load_machine
from spmdcnn.cost.memory import kept_memory, layer_memory, layer_transient, plan_memory
from spmdcnn.sizes import parse_size
from spmdcnn.cost.model import CostModel
from spmdcnn.graph import load_model
from spmdcnn.planner import Problem, make_plan
from spmdcnn.planner import memory as memory_search
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
    modelled = kept_memory(graph, named("data", graph, batch, 1)) - tensors
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
    lightest = memory_search.lightest(problem.memory(4), problem.transients(4))
    used = plan_memory(graph, free.plan, im2col=False)
    assert lightest < used
    limit = (lightest + used) / 2
    limited = make_plan(graph, 4, cost, memory=limit)
    assert plan_memory(graph, limited.plan, im2col=False) <= limit
    assert limited.plan.text != free.plan.text and limited.solution.exact      # branch and bound proved it
    assert limited.prediction.iteration_s >= free.prediction.iteration_s
    sizes = [len(c) for c in problem.choices]
    index = {name: i for i, name in enumerate(problem.nodes)}
    choices = [problem.choices[i].index(limited.plan[name]) for name, i in index.items()]
    assert evaluate(sizes, problem.node_costs, problem.edges, choices) == pytest.approx(limited.solution.cost)
    for strategy in ("data", "owt", "model"):      # no fixed strategy that fits is faster
        plan = named(strategy, graph, 64, 4)
        if plan_memory(graph, plan, im2col=False) <= limit:
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
    """A small search problem with random costs, transfer tables, kept bytes and transients per configuration
    (``transients`` False: none, the sum of kept bytes alone)."""

    def __init__(self, seed, nodes=6, transients=True):
        rng = np.random.default_rng(seed)
        self.sizes = [int(rng.integers(2, 5)) for _ in range(nodes)]
        self.node_costs = [rng.random(s) for s in self.sizes]
        pairs = [(v - 1, v) for v in range(1, nodes)] + [(0, nodes - 1), (1, nodes - 2)]   # a chain with shortcuts
        self.edges = [(u, v, rng.random((self.sizes[u], self.sizes[v])) * 0.5) for u, v in pairs]
        self._bytes = [rng.integers(1, 100, s).astype(float) for s in self.sizes]
        self._transients = [rng.integers(1, 150, s).astype(float) if transients else np.zeros(s) for s in self.sizes]

    def memory(self, itemsize):
        return self._bytes

    def transients(self, itemsize):
        return self._transients


@pytest.mark.parametrize("transients", [True, False], ids=["kept and peak", "kept alone"])
@pytest.mark.parametrize("seed", range(12))
def test_the_memory_limited_search_is_exact(seed, transients):
    """Against every assignment: the limited search returns the fastest plan that fits (its kept bytes summed
    and its largest transient), proven so."""
    import itertools
    from spmdcnn.planner.memory import plan_bytes, within_memory
    from spmdcnn.planner.search import evaluate as objective
    problem = _RandomProblem(seed, transients=transients)
    sizes, kept, peaks = problem.sizes, problem.memory(4), problem.transients(4)
    every = [(objective(sizes, problem.node_costs, problem.edges, list(c)), plan_bytes(kept, peaks, c))
             for c in itertools.product(*(range(s) for s in sizes))]
    lightest, unlimited = min(m for _, m in every), min(every)[1]
    assert memory_search.lightest(kept, peaks) == lightest
    for share in (0.05, 0.3, 0.6, 0.9):
        limit = lightest + share * (unlimited - lightest)
        expected = min(f for f, m in every if m <= limit)
        solution = within_memory(problem, sizes, limit, 4)
        assert plan_bytes(kept, peaks, solution.choices) <= limit
        assert solution.cost == pytest.approx(expected, rel=1e-9) and solution.exact, (share, solution.method)
    with pytest.raises(ValueError, match="no plan fits"):
        within_memory(problem, sizes, lightest * 0.99, 4)


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_a_search_out_of_budget_says_how_far_from_optimal_it_may_be(seed):
    from spmdcnn.planner.memory import within_memory
    problem = _RandomProblem(seed, nodes=8, transients=False)
    sizes, bytes_ = problem.sizes, problem.memory(4)
    lightest = sum(b.min() for b in bytes_)
    heaviest = sum(b.max() for b in bytes_)
    limit = lightest + 0.2 * (heaviest - lightest)
    solution = within_memory(problem, sizes, limit, 4, nodes=1)
    exact = within_memory(problem, sizes, limit, 4)
    assert exact.exact and exact.cost <= solution.cost
    assert not solution.exact               # one search cannot close these gaps
    if not solution.exact:                 # the proven distance holds the true optimum
        gap = float(re.search(r"within ([0-9.e+-]+) % of optimal", solution.method).group(1)) / 100
        assert solution.cost * (1 - gap) <= exact.cost * (1 + 1e-6)


# --- transients: what a layer holds while it runs, and volumes that only spatial splits fit -------------------------

def test_a_transient_is_the_tiles_boxes_its_output_and_its_kernels_workspace(numpy_convolutions):
    graph = load_model(os.path.join(MODELS, "cosmoflow.yaml"))
    conv, act = graph.by_name["conv1.conv"], graph.by_name["conv1.act"]
    x, y = 4 * 128 ** 3, 32 * 128 ** 3                  # one sample's input and output elements
    assert layer_transient(act, (1, 1, 1, 1, 1), 1) == 4 * 2 * y           # leaky relu: input and output
    assert layer_transient(conv, (1, 1, 1, 1, 1), 1, im2col=False) == 4 * (x + y)     # cuDNN: no columns
    with_columns = layer_transient(conv, (1, 1, 1, 1, 1), 1)
    # the im2col workspace: a chunk of output planes' columns (4 channels x 8 taps over the padded rows), capped
    # near COLUMN_BYTES however large the sample (its whole columns: 4 x 8 x 128 x 129 x 129 elements, 272 MB),
    # their product with the weight and the padded sample (with the 130 elements its last windows run past it)
    from spmdcnn.ops.im2col import COLUMN_BYTES
    workspace = with_columns - 4 * (x + y)
    columns = 4 * 8 * 4 * (COLUMN_BYTES // (4 * 8 * 129 * 129 * 4)) * 129 * 129
    assert columns <= COLUMN_BYTES
    assert workspace == columns + 32 * columns // (4 * 8) + 4 * 4 * (129 ** 3 + 130)
    # a depth split halves a tile's volume: its boxes and output (the halo adds a plane); the columns stay capped
    halved = layer_transient(conv, (1, 1, 2, 1, 1), 1, im2col=False)
    assert 0.5 * 4 * (x + y) < halved < 0.52 * 4 * (x + y)
    assert layer_transient(conv, (1, 1, 2, 1, 1), 1) - halved <= workspace


def test_a_plans_memory_is_what_it_keeps_and_its_largest_transient():
    from spmdcnn.cost.memory import peak_transient
    graph = load_model(os.path.join(MODELS, "tiny_volume.yaml"))
    plan = named("data", graph, 4, 2)
    transient, layer = peak_transient(graph, plan)
    assert layer == "conv1" and plan_memory(graph, plan) == kept_memory(graph, plan) + transient
    assert transient == max(layer_transient(l, plan[l.name].degrees, 4) for l in graph.layers)


def test_cosmoflow_512_fits_a_40_gb_device_only_split_over_space():
    """On the cluster's A100s (40 GB, the machine file's device memory): one 512^3 sample needs 42.8 GiB, so data
    parallelism fits no device; the planner splits each sample and fits."""
    from spmdcnn.planner.service import cost_model
    graph = load_model(os.path.join(MODELS, "cosmoflow_512.yaml"))
    machine = os.path.join(MODELS, "..", "jobs", "machines", "cluster-4x256-fat-tree.yaml")
    cost = cost_model(graph, 8, 16, machine, nodes=4)
    limit = cost.machine.device.memory
    assert limit == 4.0e10 and not cost.machine.device.im2col
    data = plan_memory(graph, named("data", graph, 8, 16), 4, im2col=False)
    assert data > limit
    best = make_plan(graph, 16, cost, memory=limit)
    assert plan_memory(graph, best.plan, 4, im2col=False) <= limit and best.solution.exact
    first = best.plan["conv1.conv"]
    assert first.size == 16 and any(k > 1 for k in first.degrees[2:])       # a sample over several devices
    with pytest.raises(ValueError, match="no plan fits in 37.3 GiB per device .* the lightest needs 42.7 GiB"):
        make_plan(graph, 16, cost_model(graph, 16, 16, machine, nodes=4), memory=limit)


def test_the_plan_command_says_which_strategies_do_not_fit(capsys):
    from spmdcnn.cli import main
    machine = os.path.join(MODELS, "..", "jobs", "machines", "cluster-4x256-fat-tree.yaml")
    assert main(["plan", os.path.join(MODELS, "cosmoflow_512.yaml"), "--devices", "16", "--batch", "8", "--machine",
                 machine, "--nodes", "4", "--compare"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"memory: \d+\.\d GiB on the busiest device \(.* kept for backward \+ .* while \S+ runs; limit "
                     r"37\.3 GiB\)", out), out
    data_row = next(line for line in out.splitlines() if line.startswith("data "))
    assert "does not fit (5.5 GiB over)" in data_row and "optimal " in out and "  fits" in out


def test_a_jobs_memory_key_is_a_size_for_plan_auto():
    from spmdcnn.io.job import parse_job
    from spmdcnn.io.yamlfile import FormatError
    base = {"model": "m.yaml", "batch_size": 2, "steps": 1}
    assert parse_job({**base, "memory": "16GiB"})["memory"] == "16GiB"
    with pytest.raises(FormatError, match="'memory': not a size: 'lots'"):
        parse_job({**base, "memory": "lots"})
    with pytest.raises(FormatError, match="'memory' is the limit plan: auto keeps to; plan data is not searched"):
        parse_job({**base, "memory": "1GB", "plan": "data"})


def test_a_machine_files_device_memory_and_im2col():
    import yaml
    from spmdcnn.cost.machine import MachineError, from_mapping

    def parse(text):
        return from_mapping(yaml.safe_load(text))
    text = ("format: spmdcnn-machine/1\nname: m\nnodes: 1\ndevices_per_node: 2\n"
            "intra_node: {bandwidth: 1.0e+10, latency: 1.0e-6}\n")
    device = parse(text + "device: {name: g, im2col: false, memory: 8.0e+10}\n").device
    assert device.memory == 8.0e10 and not device.im2col
    assert parse(parse(text + "device: {name: g, im2col: false, memory: 8.0e+10}\n").to_yaml()).device == device
    with pytest.raises(MachineError, match="'im2col' must be true"):
        parse(text + "device: {name: g, im2col: maybe}\n")
    with pytest.raises(MachineError, match="memory"):
        parse(text + "device: {name: g, memory: -1}\n")
