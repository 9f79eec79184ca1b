"""Screening the configurations before the exact tables (planner.screen): the same optima as without it, for
every objective the planner searches and within a memory limit; the plans it leads to; what it reports. And the
bound a search that is not proven optimal prints, and the progress a long search shows on a terminal."""

import io
import math
import os

import numpy as np
import pytest

from spmdcnn import planner
from spmdcnn.cost.compute import ComputeModel
from spmdcnn.cost.machine import load_machine, parse_machine_text
from spmdcnn.cost.memory import plan_memory
from spmdcnn.cost.model import CostModel
from spmdcnn.graph import load_model
from spmdcnn.planner import SYNC_WEIGHTS, Problem, make_plan, screen, search
from spmdcnn.planning_progress import SearchProgress
from spmdcnn.tiling.config import Devices

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
PAPER = load_machine(os.path.join(ROOT, "jobs", "machines", "paper-p100-4x4.yaml"))
LEVELS = parse_machine_text("""
format: spmdcnn-machine/1
name: three-levels
nodes: 16
devices_per_node: 2
intra_node: {bandwidth: 1.0e+11, latency: 1.0e-6}
inter_node: {bandwidth: 2.0e+10, latency: 3.0e-6}
switches:
  - {name: leaf, nodes: 4}
  - {name: spine, nodes: 16, oversubscription: 2, latency: 6.0e-6}
device: {name: test, flops: 1.0e+13, memory_bandwidth: 5.0e+11}
""")
CASES = [("alexnet", 16, PAPER), ("small_resnet", 16, LEVELS), ("small_inception", 32, LEVELS),
         ("cifar_cnn", 32, PAPER)]


def cost_of(name, devices, machine, per_device=8):
    graph = load_model(os.path.join(ROOT, "models", f"{name}.yaml"))
    return graph, CostModel(graph, per_device * devices, machine, ComputeModel(machine.device))


@pytest.mark.parametrize("stages", ["one", "two"])
@pytest.mark.parametrize("name,devices,machine", CASES, ids=[f"{n}-{d}" for n, d, _ in CASES])
def test_the_screen_keeps_every_optimum(name, devices, machine, stages, monkeypatch):
    """With one stage, and with the second always run (over lists that edges sharing a table keep differently:
    Inception's and ResNet's 1x1 convolutions of one input)."""
    monkeypatch.setattr(screen, "EXACT_WORK", 0 if stages == "two" else math.inf)
    graph, cost = cost_of(name, devices, machine)
    whole = Problem(graph, devices, cost, screen=False)
    screened = Problem(graph, devices, cost, screen=True)
    assert screened.screening.after <= screened.screening.before == whole.considered
    assert screened.screening.after == sum(map(len, screened.choices))
    assert len(screened.screening.stages) == (2 if stages == "two" else 1)
    if machine is PAPER:        # compute-bound layers: the bounds keep few (on LEVELS, transfers dominate)
        assert screened.screening.after < screened.screening.before / 2
    for weight in SYNC_WEIGHTS:
        best = search.optimize([len(c) for c in whole.choices], whole.weighted(weight), whole.edges)
        kept = search.optimize([len(c) for c in screened.choices], screened.weighted(weight), screened.edges)
        assert kept.cost == pytest.approx(best.cost, rel=1e-12)
        # the upper bound the screen pruned with is at least the optimum: a real assignment's cost
        upper = dict(screened.screening.bounds)[f"gradient sync weighted {weight:g}"]
        assert upper >= best.cost * (1 - 1e-12)


@pytest.mark.parametrize("name,devices,machine", CASES[:2], ids=[f"{n}-{d}" for n, d, _ in CASES[:2]])
def test_screened_plans_are_the_plans(name, devices, machine, monkeypatch):
    graph, cost = cost_of(name, devices, machine)
    monkeypatch.setattr(planner, "SCREEN_WORK", math.inf)
    plain = make_plan(graph, devices, cost)
    monkeypatch.setattr(planner, "SCREEN_WORK", 0)
    graph, cost = cost_of(name, devices, machine)
    screened = make_plan(graph, devices, cost)
    assert screened.screening is not None and plain.screening is None
    assert screened.prediction.iteration_s == pytest.approx(plain.prediction.iteration_s, rel=1e-12)
    assert screened.plan.text == plain.plan.text


def test_the_screen_keeps_the_optimum_within_memory(monkeypatch):
    graph, cost = cost_of("alexnet", 16, PAPER)
    free = make_plan(graph, 16, cost)
    limit = 0.8 * plan_memory(graph, free.plan, cost.itemsize, im2col=False)
    monkeypatch.setattr(planner, "SCREEN_WORK", math.inf)
    plain = make_plan(graph, 16, cost, memory=limit)
    monkeypatch.setattr(planner, "SCREEN_WORK", 0)
    graph, cost = cost_of("alexnet", 16, PAPER)
    screened = make_plan(graph, 16, cost, memory=limit)
    assert screened.screening is not None
    assert "within the memory limit" in dict(screened.screening.bounds)
    assert plan_memory(graph, screened.plan, cost.itemsize, im2col=False) <= limit
    assert screened.solution.cost == pytest.approx(plain.solution.cost, rel=1e-12)


def test_the_samples_are_devices_of_the_job():
    for devices in (1, 2, 3, 16, 1024):
        for count in (1, 2, 16):
            sample = screen.sample_devices(devices, 4, count)
            assert sample[0] == 0 and list(sample) == sorted(set(sample))
            assert all(0 <= d < devices for d in sample) and len(sample) <= max(1, count)
    assert len(screen.sample_devices(1024, 4, 16)) == 16


def test_a_search_not_proven_optimal_bounds_its_distance():
    rng = np.random.default_rng(1)
    n = 6
    sizes, costs = [5] * n, [rng.random(5) for _ in range(n)]
    edges = [(u, v, rng.random((5, 5))) for u in range(n) for v in range(u + 1, n)]
    found = search.optimize(sizes, costs, edges, limit=10)      # a core too big for the limit: local search
    best = search.exhaustive(sizes, costs, edges)
    assert not found.exact and found.lower is not None
    assert found.lower <= best.cost <= found.cost
    exact = search.optimize(sizes, costs, edges)
    assert exact.exact and exact.lower is None


def test_device_tuples_hash_as_tuples():
    devices = Devices(range(6))
    assert devices == tuple(range(6)) and hash(devices) == hash(tuple(range(6))) == hash(devices)
    assert {tuple(range(6)): 1}[devices] == 1


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_progress_shows_on_a_terminal_after_a_second_and_is_erased():
    clock, stream = Clock(), io.StringIO()
    progress = SearchProgress(stream, setting=True, clock=clock)
    progress("configurations", 0, 10)
    clock.now = 0.5
    progress("bounds over 2 devices", 3, 39)
    assert stream.getvalue() == ""                      # the first second: nothing
    clock.now = 1.5
    progress("bounds over 2 devices", 10, 39)
    assert "plan: lower bounds over 2 devices [#####...............] 10/39 tables  2 s" in stream.getvalue()
    clock.now = 1.55
    progress("bounds over 2 devices", 11, 39)           # within the interval: not redrawn
    assert "11/39" not in stream.getvalue()
    progress("screen")                                  # a new stage: drawn at once
    assert stream.getvalue().endswith("plan: screening the configurations  2 s")
    progress.close()
    assert stream.getvalue().endswith("\r\x1b[K")
    progress("search")
    assert "searching" not in stream.getvalue()         # closed: nothing more


def test_the_progress_stays_off_a_pipe():
    clock, stream = Clock(), io.StringIO()             # StringIO is no terminal
    progress = SearchProgress(stream, clock=clock)
    clock.now = 5.0
    progress("tables", 1, 2)
    progress.close()
    assert stream.getvalue() == ""


@pytest.mark.parametrize("name,devices,machine,tie", [("alexnet", 8, PAPER, 0.1), ("alexnet", 8, PAPER, 0.3),
                                                      ("small_resnet", 12, LEVELS, 0.3)])
def test_the_screen_keeps_the_plans_the_tie_band_looks_for(name, devices, machine, tie, monkeypatch):
    """With a tie band the planner also scores optima of the cost plus a price per exchange, which cost more than
    the optimum: the screen keeps what they use (their plans differ from the optimum's here)."""
    results = []
    for work in (math.inf, 0):
        monkeypatch.setattr(planner, "SCREEN_WORK", work)
        graph, cost = cost_of(name, devices, machine)
        results.append(make_plan(graph, devices, cost, tie=tie))
    plain, screened = results
    assert screened.screening is not None and plain.screening is None
    assert screened.plan.text == plain.plan.text
    assert screened.prediction.iteration_s == pytest.approx(plain.prediction.iteration_s, rel=1e-12)
