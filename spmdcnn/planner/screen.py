"""Screening the configurations before the exact tables are built, on many devices.

An edge's exact table looks at every device for every pair of configurations: ``P x Q x devices`` lookups, too
many at hundreds of devices. The exchange lasts as long as its busiest device, so the same table over a few of
the devices (``EdgeTraffic.table``'s ``sample``) is at most the exact one, entry by entry: a **lower bound**
table. Stage by stage, over such tables:

1. for each objective the planner searches (the gradient sync weighted by each of ``SYNC_WEIGHTS``; with a
   memory limit, the search within it), the min-marginals of the spanning-forest relaxation (:mod:`.bounds`)
   bound every assignment that uses a configuration;
2. Algorithm 1 over each node's ``CANDIDATES`` configurations of lowest bound gives an assignment; costed
   exactly (its own edges on every device), the least over the objectives' assignments (those that fit, for the
   memory limit) is an **upper bound** ``U`` of each objective's optimum;
3. a configuration whose bound exceeds ``U`` is in no optimum of that objective, and is dropped; rounds repeat
   over what is left while a round drops enough (row minima over fewer columns are higher). What any objective
   keeps is kept, a union per list of configurations so that edges still share tables.

The first stage looks at ``SAMPLES[0]`` devices over every configuration; while the exact tables over what is
left would still take more than ``EXACT_WORK`` lookups, the next stage looks at more devices over what is left
(tighter bounds, few configurations). No optimum loses a configuration, so the search over what is left finds
the same optimum as over everything: the screen is exact. A margin of ``MARGIN`` times ``U`` covers rounding.
"""

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .bounds import relaxed_bounds
from .memory import plan_bytes

MARGIN = 1e-9
SHRINK = 0.8            # rounds stop after one that keeps more than this fraction
CANDIDATES = 8          # configurations per node (lowest bounds first) searched for an assignment
SAMPLES = (2, 16)       # devices looked at, stage by stage
MEMORY = "within the memory limit"     # the label of the memory-limited search's objective
EXACT_WORK = 2e6        # table entries times devices below which the exact tables are built (measured)


@dataclass
class Screening:
    """What the screen did: configurations ``before`` and ``after``, the devices each stage looked at (``stages``:
    ``(devices, configurations left)``), its seconds, and per objective (``label``) the upper bound it pruned
    with. ``keep``: per node, the indices kept."""
    before: int
    after: int
    stages: list
    seconds: float
    bounds: list            # (label, upper)
    keep: list = None

    def to_json(self):
        return {"before": self.before, "after": self.after, "stages": [list(stage) for stage in self.stages],
                "seconds": self.seconds, "bounds": [list(bound) for bound in self.bounds]}

    def describe(self):
        looked = " then ".join(f"{devices} device{'s' * (devices != 1)} ({left} left)" for devices, left in self.stages)
        return (f"screened {self.before} configurations to {self.after} by lower bounds looking at {looked}, "
                f"in {self.seconds:.2f} s (exact: no optimum, nor a plan the tie band looks for, loses a "
                "configuration)")


def sample_devices(devices, per_node, count):
    """``count`` devices (fewer if the job has fewer) for the lower-bound tables: the first, and then devices
    spread over the job and away from node boundaries, whose tiles are inside the tensor along the usual
    power-of-two splits (a tile at a tensor's edge reads fewer halo rows)."""
    picked = {0}
    for k in range(1, count):       # the middles of count - 1 equal stretches, a little past a node's start
        picked.add(min(devices - 1, devices * (2 * k - 1) // (2 * count - 2) + per_node // 2 + 1))
    return tuple(sorted(picked))


def screen(problem, jobs, edges, memory=None, tie=0.0):
    """The :class:`Screening` of ``problem`` (its node costs; ``jobs`` and ``edges`` as :meth:`Problem.jobs`),
    exact for the search within ``memory`` (bytes) too when given, and with ``tie`` (a fraction) for the plans with
    fewer exchanges the tie band takes: those cost at most ``max(PRICES) * tie * (optimum + overhead)`` more than
    the optimum at weight 1 (:func:`~spmdcnn.planner._fewest_exchanges`), so that objective's cut is raised so
    much."""
    from . import PRICES, SYNC_WEIGHTS
    start = time.perf_counter()
    overhead = problem.cost.overhead(problem.devices)
    slack = {f"gradient sync weighted {SYNC_WEIGHTS[0]:g}":
             (lambda upper: max(PRICES) * tie * (upper + overhead)) if tie > 0 else (lambda upper: 0.0)}
    objectives = [(f"gradient sync weighted {w:g}", problem.weighted(w)) for w in SYNC_WEIGHTS]
    used = (problem.memory(problem.cost.itemsize), problem.transients(problem.cost.itemsize)) \
        if memory is not None else None
    exact = _Exact(problem, jobs, edges)
    keep = [np.arange(len(c)) for c in problem.choices]
    before, stages, uppers = sum(map(len, keep)), [], {}
    for number, count in enumerate(SAMPLES):
        sample = sample_devices(problem.devices, problem.cost.machine.devices_per_node, count)
        work = _work(problem, edges, keep)
        if number > 0 and work <= EXACT_WORK:
            break
        keep = _stage(problem, jobs, edges, keep, sample, objectives, exact, uppers, used, memory, slack)
        stages.append((len(sample), sum(map(len, keep))))
    bounds = [(label, uppers[label]) for label in uppers]
    return Screening(before, sum(map(len, keep)), stages, time.perf_counter() - start, bounds, keep)


def _work(problem, edges, keep):
    """Entries times devices of the exact tables over ``keep``: one table per job, over what its edges keep."""
    rows, cols = {}, {}
    for u, v, key in edges:
        rows.setdefault(key, set()).update(keep[u].tolist())
        cols.setdefault(key, set()).update(keep[v].tolist())
    return sum(len(rows[key]) * len(cols[key]) for key in rows) * problem.devices


def _lower_tables(problem, jobs, edges, keep, sample):
    """``{(u, v): table}``: the lower-bound tables over ``keep`` looking at ``sample``, parallel edges summed.

    Edges share a job when their tables are equal over the whole lists: the same producer list, and consumer lists
    (perhaps of other layers) whose configurations read alike, index by index. Each job's table covers the union
    of what its edges' lists keep, and each edge takes its own rows and columns from it."""
    from . import workers
    progress, cost = problem.progress, problem.cost
    lists = {}                  # per list of configurations (by id), the indices kept: the union of its nodes'
    for v, c in enumerate(problem.choices):
        lists[id(c)] = np.union1d(lists.get(id(c), keep[v]), keep[v])
    rows_of, cols_of = {}, {}
    for u, v, key in edges:
        rows_of[key] = np.union1d(rows_of.get(key, lists[id(problem.choices[u])]), lists[id(problem.choices[u])])
        cols_of[key] = np.union1d(cols_of.get(key, lists[id(problem.choices[v])]), lists[id(problem.choices[v])])
    stage = f"bounds over {len(sample)} devices"
    progress(stage, 0, len(jobs))
    done = iter(range(1, len(jobs) + 1))

    def bound_table(key):
        traffic, producers, consumers, backward = jobs[key]
        table = cost.exchange_seconds(*traffic.table([producers[i] for i in rows_of[key]],
                                                     [consumers[i] for i in cols_of[key]], sample),
                                      backward=backward)
        progress(stage, next(done), len(jobs))
        return table
    with ThreadPoolExecutor(workers()) as pool:
        lows = dict(zip(rows_of, pool.map(bound_table, rows_of)))
    tables, taken = {}, {}      # taken: each job's table over a pair of kept lists, once (edges share them)
    for u, v, key in edges:
        rows, cols = np.searchsorted(rows_of[key], keep[u]), np.searchsorted(cols_of[key], keep[v])
        pair = (key, rows.tobytes(), cols.tobytes())
        if pair not in taken:
            low = lows[key]
            whole = len(rows) == low.shape[0] and len(cols) == low.shape[1]     # kept: all, in order
            taken[pair] = low if whole else low[rows[:, None], cols]
        table = taken[pair]
        tables[(u, v)] = tables[(u, v)] + table if (u, v) in tables else table
    return tables


def _stage(problem, jobs, edges, keep, sample, objectives, exact, uppers, used, memory, slack):
    """One stage: the lower-bound tables over ``keep`` looking at ``sample``, and what each objective keeps."""
    from . import search
    tables = _lower_tables(problem, jobs, edges, keep, sample)
    costs = [[c[k] for c, k in zip(weighted, keep)] for _, weighted in objectives]
    splits, found, bounds = {}, [], []
    problem.progress("screen")
    for weighted in costs:      # an assignment per objective, over its candidates of lowest bound
        bounds.append(relaxed_bounds(weighted, tables, splits))
        candidates = [np.argsort(b, kind="stable")[:CANDIDATES] for b in bounds[-1]]
        restricted = [(u, v, t[candidates[u][:, None], candidates[v]]) for (u, v), t in tables.items()]
        picked = search.optimize([len(c) for c in candidates], [w[c] for w, c in zip(weighted, candidates)],
                                 restricted).choices
        found.append([int(k[c[p]]) for k, c, p in zip(keep, candidates, picked)])
    if memory is not None:
        from .memory import within_memory
        from types import SimpleNamespace
        kept, transients = used
        lower = SimpleNamespace(node_costs=costs[0], edges=[(u, v, t) for (u, v), t in tables.items()],
                                memory=lambda itemsize: [b[k] for b, k in zip(kept, keep)],
                                transients=lambda itemsize: [t[k] for t, k in zip(transients, keep)])
        fitting = within_memory(lower, [len(k) for k in keep], memory, problem.cost.itemsize, nodes=0).choices
        found.append([int(k[c]) for k, c in zip(keep, fitting)])
        objectives = objectives + [(MEMORY, objectives[0][1])]     # any fitting plan bounds its optimum
        costs.append(costs[0])
        bounds.append(bounds[0])
    kept = [np.zeros(len(k), dtype=bool) for k in keep]
    for (label, weighted), local, bound in zip(objectives, costs, bounds):
        candidates = found[:len(objectives) - (memory is not None)] if label != MEMORY else \
            [x for x in found if plan_bytes(*used, x) <= memory]
        upper = min([exact.value(weighted, x) for x in candidates] + [uppers.get(label, math.inf)])
        uppers[label] = upper
        cut = upper + slack.get(label, lambda _: 0.0)(upper)
        for mask, survivors in zip(kept, _survivors(local, tables, bound, cut)):
            mask[survivors] = True
    by_list = {}                # nodes that share a list keep the union, so that their edges share tables
    for c, k, mask in zip(problem.choices, keep, kept):
        by_list[id(c)] = np.union1d(by_list.get(id(c), k[mask]), k[mask])
    return [by_list[id(c)] for c in problem.choices]


def _survivors(costs, tables, bounds, upper):
    """Per node, the positions of the configurations whose relaxed min-marginal is at most ``upper`` (a cost
    every assignment that must be kept is within), starting
    from ``bounds`` (those of ``costs`` over ``tables``), in rounds while they shrink. (A node the cut would leave
    empty, which a true upper bound cannot do, keeps what it had: rounding never loses a configuration.)"""
    cut = upper + MARGIN * abs(upper)
    keep = [np.arange(len(c)) for c in costs]
    best = [np.full(len(c), -np.inf) for c in costs]
    while True:
        bounds = [np.maximum(old, new) for old, new in zip(best, bounds)]
        kept = [np.flatnonzero(b <= cut) for b in bounds]
        if not all(len(k) for k in kept):
            return keep
        total = sum(map(len, keep))
        keep = [k[i] for k, i in zip(keep, kept)]
        if sum(map(len, keep)) > SHRINK * total:
            return keep
        best = [b[i] for b, i in zip(bounds, kept)]
        costs = [c[i] for c, i in zip(costs, kept)]
        tables = {(u, v): t[kept[u][:, None], kept[v]] for (u, v), t in tables.items()}
        bounds = relaxed_bounds(costs, tables)


class _Exact:
    """The exact objective of single assignments: each edge's pair costed on every device (kept by pair, and by
    the edge's :meth:`~spmdcnn.cost.transfer.EdgeTraffic.forward`, which the timeline reads later; batching the
    pairs of an edge into one table was measured slower on 1,024 devices: its tables grow with the sum of the
    degrees of all its configurations)."""

    def __init__(self, problem, jobs, edges):
        self.problem, self.jobs, self.edges, self.known = problem, jobs, edges, {}

    def value(self, costs, choices):
        terms = [c[x] for c, x in zip(costs, choices)]
        for u, v, key in self.edges:
            pair = (key, choices[u], choices[v])
            if pair not in self.known:
                traffic, producers, consumers, backward = self.jobs[key]
                found = traffic.forward(producers[choices[u]], consumers[choices[v]])
                self.known[pair] = float(self.problem.cost.exchange_seconds(found.seconds, found.bytes, backward))
            terms.append(self.known[pair])
        return math.fsum(terms)
