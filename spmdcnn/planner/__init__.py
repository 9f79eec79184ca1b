"""The planner: the best plan for a model, a batch and a machine under the cost model (DESIGN.md §4).

Every searched layer is a node with one cost per configuration (``t_c + t_s``, with the relu and dropout layers
that take its configuration); every input of a layer is an edge with one cost per pair of configurations
(``t_x``). ``optimal`` runs OptCNN's Algorithm 1 (:mod:`.search`), ``exhaustive`` the depth-first baseline on the
same tables, and ``data``, ``model`` and ``owt`` are the fixed strategies of ``tiling.plan``.
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

STRATEGIES = ("optimal",) + NAMED + ("exhaustive",)


@dataclass
class Result:
    plan: Plan
    prediction: object
    strategy: str
    search_s: float = 0.0
    solution: object = None
    nodes: int = 0
    configurations: int = 0


class Problem:
    """The node and edge cost tables of ``graph`` on ``devices`` devices under ``cost`` (a CostModel).

    Edges whose tables are equal (the same producer list, consumers that read alike) share one, and the distinct
    tables are built on every core this process may run on (:func:`workers`): NumPy releases the interpreter lock
    inside the large array operations that building a table is made of."""

    def __init__(self, graph, devices, cost):
        self.graph, self.devices, self.cost = graph, devices, cost
        batch = cost.batch
        self.root = searched(graph)
        self.nodes = [layer.name for layer in graph.layers if self.root[layer.name] == layer.name]
        self.index = {name: i for i, name in enumerate(self.nodes)}
        lists = {}
        self.choices = []
        for name in self.nodes:
            layer = graph.by_name[name]
            key = (dims_of(layer), output_shape(layer, batch))
            if key not in lists:
                lists[key] = configurations(layer, batch, devices)
            self.choices.append(lists[key])
        self.considered = sum(len(c) for c in self.choices)
        self.node_costs = [np.zeros(len(c)) for c in self.choices]
        for layer in graph.layers:
            i = self.index[self.root[layer.name]]
            self.node_costs[i] += cost.node_costs(layer, self.choices[i])
        jobs, edges = {}, []
        for layer in graph.layers:
            v = self.index[self.root[layer.name]]
            for slot, ref in enumerate(layer.inputs):
                if ref == DATA or self.root[layer.name] != layer.name:     # relu, dropout: inside a node
                    continue
                u = self.index[self.root[ref]]
                traffic = cost.edge(layer, slot)
                reads = traffic.reads_key(self.choices[v])      # consumers that read alike share a table
                key = (id(self.choices[u]),) + ((id(traffic), id(self.choices[v])) if reads is None else (reads,))
                jobs.setdefault(key, (traffic, self.choices[u], self.choices[v]))
                edges.append((u, v, key))
        with ThreadPoolExecutor(workers()) as pool:
            tables = dict(zip(jobs, pool.map(lambda job: cost.exchange_seconds(*job[0].table(job[1], job[2])),
                                             jobs.values())))
        self.edges = [(u, v, tables[key]) for u, v, key in edges]

    def plan(self, choices, batch, source):
        configs = {name: self.choices[self.index[self.root[name]]][choices[self.index[self.root[name]]]]
                   for name in (layer.name for layer in self.graph.layers)}
        return Plan(self.graph, batch, self.devices, configs, source)


def make_plan(graph, devices, cost, strategy="optimal", limit=None):
    """The :class:`Result` of ``strategy`` for ``graph`` on ``devices`` devices under ``cost``."""
    start = time.perf_counter()
    if strategy in NAMED:
        plan = named(strategy, graph, cost.batch, devices)
        return Result(plan, cost.simulate(plan), strategy, time.perf_counter() - start)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
    from . import search
    problem = Problem(graph, devices, cost)
    sizes = [len(c) for c in problem.choices]
    if strategy == "optimal":
        solution = search.optimize(sizes, problem.node_costs, problem.edges)
    else:
        solution = search.exhaustive(sizes, problem.node_costs, problem.edges, limit=limit)
    plan = problem.plan(solution.choices, cost.batch, f"plan {strategy}")
    elapsed = time.perf_counter() - start
    return Result(plan, cost.simulate(plan), strategy, elapsed, solution, len(sizes), problem.considered)


def workers():
    """The cores this process may run on (its affinity where the system tells it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
