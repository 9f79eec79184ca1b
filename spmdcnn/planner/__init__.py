"""The planner: the best plan for a model, a batch and a machine under the cost model
(docs/architecture.md#the-cost-model-and-the-planner).

Every searched layer is a node with one cost per configuration (``t_c + t_s``, with the relu and dropout layers
that take its configuration); every input of a layer is an edge with one cost per pair of configurations
(``t_x``). ``optimal`` runs OptCNN's Algorithm 1 (:mod:`.search`), ``exhaustive`` the depth-first baseline on the
same tables, and ``data``, ``model`` and ``owt`` are the fixed strategies of ``tiling.plan``.

The tables are the cost model's additive surrogate, in which a layer's gradient allreduce sits on the critical
path; the runtime overlaps it with backward, so ``optimal`` searches the surrogate with the gradient sync weighted
by each of :data:`SYNC_WEIGHTS`, scores those optima and the fixed strategies on the timeline
(:meth:`~spmdcnn.cost.model.CostModel.simulate`), and returns the fastest there.
"""

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..graph.blocks import DATA
from ..tiling.config import dims_of, output_shape
from ..tiling.plan import NAMED, Plan, named

from .configs import configurations, searched
from .memory import within_memory

STRATEGIES = ("optimal",) + NAMED + ("exhaustive",)
SCREEN_WORK = 5e6       # table entries times devices above which the configurations are screened first (measured)
SYNC_WEIGHTS = (1.0, 0.5, 0.25, 0.0)      # of the surrogate's gradient allreduce, in the candidates searched


@dataclass
class Ties:
    """How a tie was broken: plans predicted within ``band`` (a fraction) of the ``fastest_s`` are taken as equal,
    and the one with the fewest exchanges chosen (``exchanges``, against the fastest plan's ``fastest_exchanges``)
    among ``candidates`` plans."""
    band: float
    fastest_s: float
    chosen_s: float
    exchanges: int
    fastest_exchanges: int
    candidates: int
    source: str = "the profile's spread"      # where the band came from

    @property
    def changed(self):
        return self.exchanges < self.fastest_exchanges

    def describe(self):
        """One line for the log: what was taken as a tie and what was chosen."""
        band = f"plans within {100 * self.band:.1f} % of the fastest ({self.fastest_s * 1e3:.1f} ms; {self.source}) " \
               "are ties, and the one with the fewest exchanges wins"
        if not self.changed:
            return f"{band}: the fastest, with {self.exchanges} exchanges, has the fewest"
        return (f"{band}: chose {self.exchanges} exchanges instead of {self.fastest_exchanges}, predicted "
                f"{self.chosen_s * 1e3:.1f} ms")


@dataclass
class Result:
    plan: Plan
    prediction: object
    strategy: str
    search_s: float = 0.0
    solution: object = None
    nodes: int = 0
    configurations: int = 0
    ties: Ties = None
    candidates: list = None     # (label, timeline seconds) of every plan ``optimal`` scored, the chosen first
    searched: Plan = None       # the surrogate's optimum at weight 1 (the plan ``solution`` describes)
    screening: object = None    # what screening the configurations did (:class:`.screen.Screening`), if it ran
    phases: dict = None         # seconds of each stage: costs, bounds, screen, tables, search, scoring
    scored: list = None         # (label, plan, timeline seconds) of every plan ``optimal`` scored, fastest first


class _Phases:
    """The planner's ``progress``: passes each call on to ``report`` (if any) and keeps when each stage began."""

    NAMES = {"configurations": "costs"}     # the others keep their names; every "bounds over ..." is "bounds"

    def __init__(self, report=None):
        self.report, self.marks = report, []

    def __call__(self, stage, done=None, total=None):
        name = "bounds" if stage.startswith("bounds") else self.NAMES.get(stage, stage)
        if not self.marks or self.marks[-1][0] != name:
            self.marks.append((name, time.perf_counter()))
        if self.report:
            self.report(stage, done, total)

    def seconds(self):
        """``{stage: seconds}`` from the stages' beginnings to now (a stage entered twice counts both times)."""
        found, ends = {}, [mark for _, mark in self.marks[1:]] + [time.perf_counter()]
        for (name, begun), end in zip(self.marks, ends):
            found[name] = found.get(name, 0.0) + end - begun
        return found


class Problem:
    """The node and edge cost tables of ``graph`` on ``devices`` devices under ``cost`` (a CostModel).

    Edges whose tables are equal (the same producer list, consumers that read alike) share one, and the distinct
    tables are built on every core this process may run on (:func:`workers`): NumPy releases the interpreter lock
    inside the large array operations that building a table is made of.

    On many devices the tables would take long to build (more than ``SCREEN_WORK`` entries times devices), so the
    configurations are screened first (:mod:`.screen`): those that no optimum under any of the candidates'
    objectives can use are dropped, proven by lower bounds, and the tables are built over the rest. ``screen``:
    True or False forces it; ``memory`` (bytes) keeps the screen exact for the search within that memory, and
    ``tie`` (a fraction) for the plans with fewer exchanges that the tie band looks for (:func:`_fewest_exchanges`).
    ``screening`` describes what the screen did (None: it did not run)."""

    def __init__(self, graph, devices, cost, screen=None, memory=None, progress=None, tie=0.0):
        self.graph, self.devices, self.cost = graph, devices, cost
        self.progress = progress or (lambda stage, done=None, total=None: None)
        batch = cost.batch
        self.root = searched(graph)
        self.nodes = [layer.name for layer in graph.layers if self.root[layer.name] == layer.name]
        self.index = {name: i for i, name in enumerate(self.nodes)}
        lists = {}
        self.choices = []
        self.progress("configurations")
        for name in self.nodes:
            layer = graph.by_name[name]
            key = (dims_of(layer), output_shape(layer, batch))
            if key not in lists:
                lists[key] = configurations(layer, batch, devices)
            self.choices.append(lists[key])
        self.considered = sum(len(c) for c in self.choices)
        self.critical = [np.zeros(len(c)) for c in self.choices]       # t_c and batchnorm's sums
        self.gradient = [np.zeros(len(c)) for c in self.choices]       # the surrogate's gradient allreduces
        for number, layer in enumerate(graph.layers):
            self.progress("configurations", number, len(graph.layers))
            i = self.index[self.root[layer.name]]
            critical, gradient = cost.node_split(layer, self.choices[i])
            self.critical[i] += critical
            self.gradient[i] += gradient
        self.screening = None
        jobs, edges = self.jobs()
        if screen is None:
            screen = sum(len(job[1]) * len(job[2]) for job in jobs.values()) * devices > SCREEN_WORK
        if screen:
            from .screen import screen as run_screen
            self.screening = run_screen(self, jobs, edges, memory, tie)
            self._restrict(self.screening.keep)
            jobs, edges = self.jobs()
        self.node_costs = self.weighted(1.0)
        self.progress("tables", 0, len(jobs))
        done = iter(range(1, len(jobs) + 1))

        def build(job):
            table = cost.exchange_seconds(*job[0].table(job[1], job[2]), backward=job[3])
            self.progress("tables", next(done), len(jobs))
            return table
        with ThreadPoolExecutor(workers()) as pool:
            tables = dict(zip(jobs, pool.map(build, jobs.values())))
        self.edges = [(u, v, tables[key]) for u, v, key in edges]

    def jobs(self):
        """``(jobs, edges)``: the distinct edge tables to build, ``{key: (EdgeTraffic, producer configurations,
        consumer configurations, backward)}``, and every edge as ``(u, v, key)``."""
        jobs, edges = {}, []
        for layer in self.graph.layers:
            v = self.index[self.root[layer.name]]
            for slot, ref in enumerate(layer.inputs):
                if ref == DATA or self.root[layer.name] != layer.name:     # relu, dropout: inside a node
                    continue
                u = self.index[self.root[ref]]
                traffic = self.cost.edge(layer, slot)
                reads = traffic.reads_key(self.choices[v])      # consumers that read alike share a table
                backward = layer.input_grads[slot]              # its adjoint exchange runs
                key = (id(self.choices[u]), backward) + \
                    ((id(traffic), id(self.choices[v])) if reads is None else (reads,))
                jobs.setdefault(key, (traffic, self.choices[u], self.choices[v], backward))
                edges.append((u, v, key))
        return jobs, edges

    def _restrict(self, keep):
        """Keep the configurations ``keep[v]`` (indices) of each node; nodes that shared a list share the new one
        (their kept indices are the same: :mod:`.screen` keeps a union per list)."""
        made, old = {}, list(self.choices)      # the old lists stay alive: their ids stay theirs
        for v, indices in enumerate(keep):
            key = (id(old[v]), indices.tobytes())
            if key not in made:
                made[key] = [old[v][i] for i in indices]
            self.choices[v] = made[key]
            self.critical[v] = self.critical[v][indices]
            self.gradient[v] = self.gradient[v][indices]

    def weighted(self, weight):
        """The node costs with the gradient allreduces weighted by ``weight`` (1: the surrogate itself)."""
        return [critical + weight * gradient for critical, gradient in zip(self.critical, self.gradient)]

    def memory(self, itemsize):
        """Per node, the bytes each configuration keeps on the device that holds the most
        (:func:`spmdcnn.cost.memory.layer_memory`; a node's relu and dropout layers included: their sum)."""
        from ..cost.memory import layer_memory
        return self._per_node(lambda layer, degrees: layer_memory(layer, degrees, self.cost.batch, itemsize), np.add)

    def transients(self, itemsize):
        """Per node, the most bytes each configuration holds while one of its layers runs, on the device that
        holds the most (:func:`spmdcnn.cost.memory.layer_transient`: the most over the node's layers)."""
        from ..cost.memory import layer_transient
        im2col = self.cost.machine.device.im2col
        return self._per_node(lambda layer, degrees: layer_transient(layer, degrees, self.cost.batch, itemsize,
                                                                     im2col), np.maximum)

    def _per_node(self, measure, fold):
        """Per node, ``measure(layer, degrees)`` of each configuration folded over the node's layers by ``fold``."""
        found = [np.zeros(len(c)) for c in self.choices]
        for layer in self.graph.layers:
            i = self.index[self.root[layer.name]]
            found[i] = fold(found[i], [measure(layer, config.degrees) for config in self.choices[i]])
        return found

    def plan(self, choices, batch, source):
        configs = {name: self.choices[self.index[self.root[name]]][choices[self.index[self.root[name]]]]
                   for name in (layer.name for layer in self.graph.layers)}
        return Plan(self.graph, batch, self.devices, configs, source)


def make_plan(graph, devices, cost, strategy="optimal", limit=None, memory=None, tie=0.0,
              tie_source="the profile's spread", progress=None):
    """The :class:`Result` of ``strategy`` for ``graph`` on ``devices`` devices under ``cost``; with ``memory``
    (bytes), the optimum among the plans that hold at most that much on every device (:mod:`.memory`).
    ``optimal`` returns the fastest on the timeline of the candidates it scores (:func:`_candidates`). With
    ``tie`` (a fraction: the profile's spread), it takes candidates predicted within that much of the fastest as
    equal, adds the surrogate's optima with fewer exchanges (:func:`_fewest_exchanges`), and returns the one with
    the fewest exchanges among those; ``tie_source`` says where the band came from, for the log. ``progress``:
    called as ``progress(stage, done, total)`` while it works (:class:`Problem`; ``"search"``, ``"scoring"``)."""
    start = time.perf_counter()
    progress = _Phases(progress)
    if strategy in NAMED:
        plan = named(strategy, graph, cost.batch, devices)
        return Result(plan, cost.simulate(plan), strategy, time.perf_counter() - start)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
    from . import search
    problem = Problem(graph, devices, cost, screen=False if strategy == "exhaustive" else None,
                      memory=memory if strategy == "optimal" else None, progress=progress,
                      tie=tie if strategy == "optimal" and memory is None else 0.0)
    sizes = [len(c) for c in problem.choices]
    progress("search")
    if strategy == "optimal" and memory is not None:
        solution = within_memory(problem, sizes, memory, cost.itemsize)
    elif strategy == "optimal":
        solution = search.optimize(sizes, problem.node_costs, problem.edges)
    else:
        solution = search.exhaustive(sizes, problem.node_costs, problem.edges, limit=limit)
    searched_plan = problem.plan(solution.choices, cost.batch, f"plan {strategy}")
    if strategy != "optimal":
        elapsed = time.perf_counter() - start
        return Result(searched_plan, cost.simulate(searched_plan), strategy, elapsed, solution, len(sizes),
                      problem.considered, None, None, searched_plan, problem.screening, progress.seconds())
    plans = _candidates(problem, sizes, searched_plan, memory)
    scored = _scored(cost, plans, progress)
    _, best, best_prediction = scored[0]
    chosen, prediction, ties = best, best_prediction, None
    if tie > 0 and memory is None:
        extra = [("fewer exchanges, within the tie band", problem.plan(c, cost.batch, "plan optimal"))
                 for c in _fewest_exchanges(problem, sizes, solution, tie, cost.overhead(devices))]
        pool = scored + _scored(cost, extra)
        band = tie * best_prediction.iteration_s
        within = [(exchanges(cost, plan), p.iteration_s, plan, p) for _, plan, p in pool
                  if p.iteration_s <= best_prediction.iteration_s + band]
        count, chosen_s, chosen, prediction = min(within, key=lambda c: (c[0], c[1]))
        ties = Ties(tie, best_prediction.iteration_s, chosen_s, count, exchanges(cost, best), len(within),
                    tie_source)
        scored = sorted(pool, key=lambda entry: entry[2].iteration_s)
    elapsed = time.perf_counter() - start
    candidates = [(label, p.iteration_s) for label, _, p in scored]
    return Result(_relabelled(chosen, "plan optimal"), prediction, strategy, elapsed, solution, len(sizes),
                  problem.considered, ties, candidates, searched_plan, problem.screening, progress.seconds(),
                  [(label, plan, p.iteration_s) for label, plan, p in scored])


def _candidates(problem, sizes, searched, memory):
    """``(label, plan)`` of the plans ``optimal`` scores: the surrogate's optimum (within ``memory``, when
    given), its optima with the gradient sync weighted less (:data:`SYNC_WEIGHTS`) and the fixed strategies,
    those that fit ``memory`` when given."""
    from ..cost.memory import plan_memory
    from . import search
    cost, graph = problem.cost, problem.graph
    plans = [("the surrogate's optimum", searched)]
    if memory is not None:
        found = search.optimize(sizes, problem.node_costs, problem.edges)
        plans.append(("the surrogate's optimum without the memory limit",
                      problem.plan(found.choices, cost.batch, "plan optimal")))
    for weight in SYNC_WEIGHTS[1:]:
        found = search.optimize(sizes, problem.weighted(weight), problem.edges)
        plans.append((f"gradient sync weighted {weight:g}", problem.plan(found.choices, cost.batch, "plan optimal")))
    plans += [(name, named(name, graph, cost.batch, problem.devices)) for name in NAMED]
    if memory is not None:
        plans = plans[:1] + [(label, plan) for label, plan in plans[1:]
                             if plan_memory(graph, plan, cost.itemsize, cost.machine.device.im2col) <= memory]
    return plans


def _scored(cost, plans, progress=None):
    """``(label, plan, prediction)`` of each ``(label, plan)`` on the timeline, fastest first (stable)."""
    if progress:
        progress("scoring", 0, len(plans))
    found = []
    for label, plan in plans:
        if progress:
            progress("scoring", len(found), len(plans))
        found.append((label, plan, cost.simulate(plan)))
    return sorted(found, key=lambda entry: entry[2].iteration_s)


def _relabelled(plan, source):
    return Plan(plan.graph, plan.batch, plan.devices, plan.configs, source)


def exchanges(cost, plan):
    """The inputs of layers that move data between devices under ``plan``."""
    return sum(cost.edge(layer, slot).forward(plan[ref], plan[layer.name]).bytes > 0
               for layer in cost.graph.layers for slot, ref in enumerate(layer.inputs) if ref != DATA)


PRICES = tuple(2.0 ** k for k in range(-3, 4))   # the prices per exchange tried, in units of band / exchanges


def _fewest_exchanges(problem, sizes, fastest, tie, overhead):
    """Choices of plans with fewer exchanges (edges that move data between devices) than the surrogate's optimum
    ``fastest`` and a surrogate cost within ``tie`` (a fraction) of it, for the planner to score.

    They are the optima of the cost plus a price per exchange, at prices of ``PRICES`` times the band divided
    by the fastest plan's exchanges (a plan with fewer exchanges that costs less than the band more wins at the
    higher prices)."""
    from . import search
    costs, edges = problem.node_costs, problem.edges

    def count(choices):
        return sum(int(table[choices[u], choices[v]] > 0) for u, v, table in edges)
    moves = {}
    for _, _, table in edges:
        moves.setdefault(id(table), (table, table > 0))
    band = tie * (fastest.cost + overhead)
    most = count(fastest.choices)
    found_choices = []
    for price in PRICES:
        charge = price * band / max(most, 1)
        priced = {key: table + charge * moved for key, (table, moved) in moves.items()}
        found = search.optimize(sizes, costs, [(u, v, priced[id(table)]) for u, v, table in edges])
        value = search.evaluate(sizes, costs, edges, found.choices)
        if value <= fastest.cost + band and count(found.choices) < most:
            found_choices.append(found.choices)
    return found_choices


def workers():
    """The cores this process may run on (its affinity where the system tells it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
