"""The planner's search: one configuration per node of a DAG minimizing node costs plus edge costs.

Node ``v`` has ``sizes[v]`` configurations and a cost vector ``node_costs[v]``; an edge ``(u, v, table)``, ``u < v``,
costs ``table[choice[u], choice[v]]`` (several edges may join one pair). The objective is
``sum_v node_costs[v][choice[v]] + sum_e table_e[choice[u], choice[v]]``. Costs are float64, finite or ``+inf``
(an infeasible choice or pair); everything here is NumPy and imports neither MPI nor CuPy.

**Algorithm 1** (``optimize``; Jia et al., ICML 2018). Until nothing changes: *node elimination* removes a node
``j`` with exactly one in-edge ``i -> j`` and one out-edge ``j -> k`` and adds the edge ``i -> k`` with table
``T[a, c] = min_b E1[a, b] + cost_j[b] + E2[b, c]`` (node ``j``'s own cost is folded into it); *edge elimination*
replaces parallel edges ``i -> j`` by one edge with the summed table. What is left is searched exactly, then the
node eliminations are undone in reverse order: ``choice[j] = argmin_b E1[choice[i], b] + cost_j[b] +
E2[b, choice[k]]``. A pure chain reduces to its two ends, and so do Inception and residual blocks in sequence.

**Tables are composed on demand.** The edge left by a node elimination keeps ``(E1, cost_j, E2)`` instead of the
dense table: building it costs ``sizes[i] * sizes[j] * sizes[k]`` (a 200-node chain with 200 choices: seconds),
while what the search needs of it is usually a min-plus product with a vector (``sizes[j] * sizes[k]`` per
eliminated node) or one row or column (memoized, so that undoing a chain costs one pass). The dense table is built
(in row slices of ``_SLICE_ENTRIES`` entries) only where a whole table is needed: where parallel edges are summed
(when the sum is first used) and for the edges of the core below.

**Pruning first.** Those dense sums cost ``sizes[i] * sizes[j] * sizes[k]`` per node on a summed path, which
dominates on real networks (Inception v3: about 190 such products). When they would take more than ``_PRUNE_WORK``
entries, the configurations that provably no optimum uses are removed first and Algorithm 1 runs on the rest
(the same graph: the same eliminations). A configuration goes when a lower bound of the objective of every
assignment with it exceeds the objective of a known assignment. The bounds are the min-marginals of a
spanning-forest relaxation (:mod:`.bounds`). The known assignment is Algorithm 1's optimum over each node's
``_CANDIDATES`` configurations of lowest bound. Rounds repeat on what is left (a row minimum over fewer columns
is higher; a bound is the highest of its rounds) while the dense sums would still cost more than ``_PRUNE_WORK``
and a round removes enough (``_SHRINK``). Exact: no optimal assignment loses a configuration, as each of its
bounds is at most the optimum; a margin of ``_PRUNE_MARGIN`` times the known objective plus twice the costs'
negative parts covers rounding.

**Searching what is left.** First every node with a single neighbour is folded into it, repeatedly
(``cost_k[c] += min_b cost_j[b] + T[b, c]``, undone by the argmin): exact, and for the usual remnant, the source
and the sink joined by one edge, it is the whole search (method ``"elimination"``). A node left with no neighbour
takes its cheapest configuration. If a core of nodes with two or more neighbours remains and the product of its
sizes is at most ``limit``, a depth-first branch-and-bound search solves it exactly
(``"elimination+exhaustive"``); a larger one, exact variable elimination where no intermediate table exceeds
``limit`` entries (``"elimination+variable-elimination"``); both in :mod:`.core`.

**Fallback: local search** (``"elimination+local-search"``, ``exact=False``). Otherwise the core starts from the
better of each node's cheapest configuration and the exact optimum over a breadth-first spanning tree (the other
edges ignored), then iterated conditional modes: sweep the nodes in order, give each the configuration that
minimizes the objective given its neighbours, until a sweep changes nothing. The result is a local optimum, and
``Solution.lower`` a lower bound of the optimum (the spanning-forest relaxation's optimum, :mod:`.bounds`): the
plan is at most ``cost - lower`` from the optimum, proven.

**Baseline** (``exhaustive``): the same depth-first branch-and-bound over all the original nodes, with no
elimination; it is exact and proves Algorithm 1 on small graphs.
"""

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from .bounds import relaxed_bounds
from .core import adjacency, depth_first, variable_elimination

_SLICE_ENTRIES = 1 << 17    # entries of one min-plus slice (1 MiB): measured fastest, fits in cache
_REL_TOL = 1e-9             # postcondition: the search's value and the objective of its choices agree
_PRUNE_MARGIN = 1e-9        # relative slack of the pruning cut: a bound adds up thousands of rounded terms
_PRUNE_WORK = 1 << 22       # min-plus entries of the dense sums above which configurations are pruned first
_CANDIDATES = 8             # configurations per node (lowest bounds first) searched for the known assignment
_SHRINK = 0.8               # pruning stops after a round that keeps more than this fraction of configurations


@dataclass
class Solution:
    cost: float             # the objective at ``choices``
    choices: list           # one configuration index per node
    exact: bool             # True when guaranteed optimal
    method: str
    eliminated_nodes: int
    eliminated_edges: int
    remaining_nodes: int    # nodes left after the eliminations
    remaining_edges: int
    kept: int = 0           # configurations searched: all of them, or those left after pruning
    lower: float = None     # when not exact: a lower bound of the optimum (a relaxation's), so cost - lower bounds
                            # the distance from it


def evaluate(sizes, node_costs, edges, choices):
    """The objective of ``choices``: ``sum_v node_costs[v][choices[v]] + sum_e table_e[choices[u], choices[v]]``."""
    sizes, costs, edges = _validated("evaluate", sizes, node_costs, edges)
    if len(choices) != len(sizes):
        raise ValueError(f"evaluate: {len(choices)} choices for {len(sizes)} nodes")
    for v, (choice, size) in enumerate(zip(choices, sizes)):
        if not 0 <= choice < size:
            raise ValueError(f"evaluate: node {v}: choice {choice} is not in 0..{size - 1}")
    return _objective(costs, ((u, v, t) for u, v, t in edges), choices)


def optimize(sizes, node_costs, edges, limit=2_000_000):
    """OptCNN's Algorithm 1 (module docstring): eliminations, an exact search of the rest, the eliminations undone."""
    sizes, costs, edges = _validated("optimize", sizes, node_costs, edges)
    reduction = _Reduction(sizes, costs, edges)
    keep = _prune(reduction, costs, edges, limit) if reduction.dense_work() > _PRUNE_WORK else None
    if keep is None:
        choices, value, method, exact = _search(reduction, costs, limit)
    else:                           # the same graph, fewer configurations: the same eliminations
        restricted = _restricted(costs, edges, keep)
        choices, value, method, exact = _search(_Reduction(*restricted), restricted[1], limit)
        choices = [int(configurations[c]) for configurations, c in zip(keep, choices)]
    cost = _objective(costs, edges, choices)
    assert math.isclose(cost, value, rel_tol=_REL_TOL, abs_tol=_REL_TOL), f"optimize: {cost} != searched {value}"
    lower = None if exact else min(cost, max(float(b.min()) for b in relaxed_bounds(costs, _pair_tables(edges))))
    return Solution(cost, choices, exact, method, len(reduction.eliminated), reduction.merged,
                    len(sizes) - len(reduction.eliminated), len(reduction.edges),
                    sum(sizes) if keep is None else sum(map(len, keep)), lower)


def _search(reduction, costs, limit):
    """Choices of every node and the optimum's value, the method and whether it is exact, after ``reduction``."""
    eliminated = {through.j for through in reduction.eliminated}
    nodes = [v for v in range(len(costs)) if v not in eliminated]
    choices, value, method, exact = _solve_remnant(nodes, reduction.edges, costs, limit)
    for through in reversed(reduction.eliminated):
        prices = through.first.row(choices[through.i]) + through.cost + through.second.col(choices[through.k])
        choices[through.j] = int(np.argmin(prices))
    return [choices[v] for v in range(len(costs))], value, method, exact


def exhaustive(sizes, node_costs, edges, limit=None):
    """The depth-first baseline: branch-and-bound over every node, no elimination; exact.

    Raises ValueError when the product of ``sizes`` exceeds ``limit`` (None: no limit)."""
    sizes, costs, edges = _validated("exhaustive", sizes, node_costs, edges)
    assignments = math.prod(sizes)
    if limit is not None and assignments > limit:
        raise ValueError(f"exhaustive: {len(sizes)} nodes have {assignments} assignments, more than the limit of "
                         f"{limit}: use --strategy optimal (Algorithm 1, exact under the same model), or raise --limit")
    choices, value = depth_first(sizes, costs, _pair_tables(edges))    # one row per assigned neighbour
    cost = _objective(costs, edges, choices)
    assert math.isclose(cost, value, rel_tol=_REL_TOL, abs_tol=_REL_TOL), f"exhaustive: {cost} != searched {value}"
    return Solution(cost, choices, True, "exhaustive", 0, 0, len(sizes), len(edges), sum(sizes))


def _validated(caller, sizes, node_costs, edges):
    sizes = [int(size) for size in sizes]
    if len(node_costs) != len(sizes):
        raise ValueError(f"{caller}: {len(node_costs)} cost vectors for {len(sizes)} nodes")
    costs = []
    for v, (size, cost) in enumerate(zip(sizes, node_costs)):
        if size < 1:
            raise ValueError(f"{caller}: node {v} has {size} configurations; expected at least 1")
        costs.append(_checked(caller, f"node {v}'s costs", cost, (size,)))
    checked, seen = [], {}      # id -> (table, values): a table shared by edges (one object) is checked once
    for e, (u, v, table) in enumerate(edges):
        u, v = int(u), int(v)
        if not 0 <= u < v < len(sizes):
            raise ValueError(f"{caller}: edge {e} ({u} -> {v}): expected 0 <= u < v < {len(sizes)} "
                             "(nodes in topological order)")
        _, values = seen.get(id(table), (None, None))   # holding the table keeps its id from being reused
        if values is None or values.shape != (sizes[u], sizes[v]):
            values = _checked(caller, f"edge {e} ({u} -> {v})", table, (sizes[u], sizes[v]))
            seen[id(table)] = (table, values)
        checked.append((u, v, values))
    return sizes, costs, checked


def _checked(caller, what, values, shape):
    values = np.asarray(values, dtype=np.float64)
    if values.shape != shape:
        raise ValueError(f"{caller}: {what} have shape {values.shape}; expected {shape}")
    lowest = values.min()           # one pass: nan if there is a nan, else -inf if there is a -inf
    if np.isnan(lowest) or lowest == -np.inf:
        raise ValueError(f"{caller}: {what} contain nan or -inf; expected finite numbers or +inf")
    return values


def _objective(costs, edges, choices):
    """The objective over ``(u, v, table)`` edges, summed exactly (math.fsum) so that it does not depend on order."""
    return math.fsum([costs[v][c] for v, c in enumerate(choices)] +
                     [table[choices[u], choices[v]] for u, v, table in edges])


# Edge tables: dense, or composed on demand from a node elimination.

class _Table:
    """A dense table ``(sizes[u], sizes[v])``."""

    def __init__(self, table):
        self.table = table

    def row(self, a):
        return self.table[a]

    def col(self, c):
        return self.table[:, c]


class _Sum(_Table):
    """Parallel edges ``u -> v`` (an edge elimination): the sum of their tables, built when first needed."""

    def __init__(self, parts):
        self.parts, self._table = parts, None

    @property
    def table(self):
        if self._table is None:
            self._table = sum(_dense(part) for part in self.parts)
        return self._table


class _Through:
    """The edge ``i -> k`` left by eliminating ``j``: ``T[a, c] = min_b first[a, b] + cost[b] + second[b, c]``."""

    def __init__(self, i, j, k, first, cost, second):
        self.i, self.j, self.k, self.first, self.cost, self.second = i, j, k, first, cost, second
        self.rows, self.cols = {}, {}     # memoized rows and columns, by index

    def row(self, a):
        """``T[a, :]``; rows along the chain of ``first`` edges are memoized on the way."""
        spine, edge = [], self
        while isinstance(edge, _Through) and a not in edge.rows:
            spine.append(edge)
            edge = edge.first
        values = edge.rows[a] if isinstance(edge, _Through) else edge.table[a]
        for edge in reversed(spine):
            values = edge.rows[a] = _vecmat(values + edge.cost, edge.second)
        return values

    def col(self, c):
        """``T[:, c]``; columns along the chain of ``second`` edges are memoized on the way."""
        spine, edge = [], self
        while isinstance(edge, _Through) and c not in edge.cols:
            spine.append(edge)
            edge = edge.second
        values = edge.cols[c] if isinstance(edge, _Through) else edge.table[:, c]
        for edge in reversed(spine):
            values = edge.cols[c] = _matvec(edge.first, edge.cost + values)
        return values


def _factors(edge):
    """The min-plus product an edge stands for, in order: tables (2-D) and node costs (1-D), ``T0, c1, T1, ...``."""
    factors, stack = [], [edge]
    while stack:                    # iterative: a chain of eliminations nests as deep as it is long
        item = stack.pop()
        if isinstance(item, _Through):
            stack += [item.second, item.cost, item.first]
        else:
            factors.append(item.table if isinstance(item, _Table) else item)
    return factors


def _vecmat(x, edge):
    """``min_a x[a] + T[a, :]``."""
    for factor in _factors(edge):
        x = (x[:, None] + factor).min(axis=0) if factor.ndim == 2 else x + factor
    return x


def _matvec(edge, y):
    """``min_c T[:, c] + y[c]``."""
    for factor in reversed(_factors(edge)):
        y = (factor + y[None, :]).min(axis=1) if factor.ndim == 2 else factor + y
    return y


def _dense(edge):
    """The whole table of ``edge``."""
    factors = _factors(edge)
    table = factors[0]
    for cost, factor in zip(factors[1::2], factors[2::2]):
        table = _min_plus(table + cost, factor)
    return table


def _min_plus(left, right):
    """``out[a, c] = min_b left[a, b] + right[b, c]``, in slices of rows of about ``_SLICE_ENTRIES`` entries."""
    out = np.empty((left.shape[0], right.shape[1]))
    step = max(1, _SLICE_ENTRIES // right.size)
    for start in range(0, left.shape[0], step):
        out[start:start + step] = (left[start:start + step, :, None] + right[None, :, :]).min(axis=1)
    return out


# Algorithm 1.

class _Reduction:
    """Node and edge elimination to a fixed point. ``edges`` maps ``(u, v)`` to the one edge left between them;
    ``eliminated`` holds the :class:`_Through` of every node elimination, in order; ``merged`` counts the edge
    eliminations (each a :class:`_Sum`, so nothing dense is built here)."""

    def __init__(self, sizes, costs, edges):
        self.sizes, self.edges, self.eliminated, self.merged = sizes, {}, [], 0
        self.ins = [set() for _ in sizes]
        self.outs = [set() for _ in sizes]
        for u, v, table in edges:
            self._add(u, v, _Table(table))
        queue, queued = deque(range(len(sizes))), [True] * len(sizes)
        while queue:
            j = queue.popleft()
            queued[j] = False
            if len(self.ins[j]) != 1 or len(self.outs[j]) != 1:
                continue
            (i,), (k,) = self.ins[j], self.outs[j]
            through = _Through(i, j, k, self.edges.pop((i, j)), costs[j], self.edges.pop((j, k)))
            self.outs[i].discard(j)
            self.ins[k].discard(j)
            self.ins[j].clear()
            self.outs[j].clear()
            self.eliminated.append(through)
            self._add(i, k, through)
            for node in (i, k):         # their degrees changed: they may be eliminable now
                if not queued[node]:
                    queue.append(node)
                    queued[node] = True

    def _add(self, u, v, edge):
        if (u, v) in self.edges:        # edge elimination
            self.edges[(u, v)] = _Sum([self.edges[(u, v)], edge])
            self.merged += 1
        else:
            self.edges[(u, v)] = edge
            self.outs[u].add(v)
            self.ins[v].add(u)

    def dense_work(self, sizes=None):
        """About how many entries the min-plus products that build the sums of parallel edges take (for the same
        graph with ``sizes`` configurations, if given)."""
        sizes, work = sizes or self.sizes, 0
        stack = [(edge, False) for edge in self.edges.values()]     # (edge, inside a sum)
        while stack:
            edge, summed = stack.pop()
            if isinstance(edge, _Through):
                work += sizes[edge.i] * sizes[edge.j] * sizes[edge.k] if summed else 0
                stack += [(edge.first, summed), (edge.second, summed)]
            elif isinstance(edge, _Sum):
                stack += [(part, True) for part in edge.parts]
        return work


# Pruning.

def _prune(reduction, costs, edges, limit):
    """The configurations (indices) of each node that an optimum may use (module docstring), or None when no
    finite assignment was found. ``reduction`` is the problem's: it estimates what is left to do."""
    tables = _pair_tables(edges)
    distinct = {id(table): table for _, _, table in edges}
    negative = math.fsum(max(0.0, -float(values.min())) for values in costs + list(distinct.values()))
    keep, left, best = [np.arange(len(cost)) for cost in costs], list(costs), math.inf
    bounds = [np.full(len(cost), -np.inf) for cost in costs]
    while True:                     # an optimal assignment stays whole: its bounds stay at most the optimum
        bounds = [np.maximum(old, new) for old, new in zip(bounds, relaxed_bounds(left, tables))]
        candidates = [configurations[np.argsort(bound, kind="stable")[:_CANDIDATES]]
                      for configurations, bound in zip(keep, bounds)]
        restricted = _restricted(costs, edges, candidates)
        picked = _search(_Reduction(*restricted), restricted[1], limit)[0]
        best = min(best, _objective(costs, edges, [int(c[p]) for c, p in zip(candidates, picked)]))
        if best == math.inf:
            return None
        cut = best + _PRUNE_MARGIN * (abs(best) + 2 * negative)
        kept = [np.flatnonzero(bound <= cut) for bound in bounds]
        total = sum(map(len, keep))
        keep = [configurations[k] for configurations, k in zip(keep, kept)]
        sizes = [len(configurations) for configurations in keep]
        if sum(sizes) > _SHRINK * total or reduction.dense_work(sizes) <= _PRUNE_WORK:
            return keep
        left, bounds = [cost[k] for cost, k in zip(left, kept)], [bound[k] for bound, k in zip(bounds, kept)]
        tables = {(u, v): table[kept[u][:, None], kept[v]] for (u, v), table in tables.items()}


def _pair_tables(edges):
    """``{(u, v): table}``: one table per pair of nodes, parallel edges summed."""
    tables = {}
    for u, v, table in edges:
        tables[(u, v)] = tables[(u, v)] + table if (u, v) in tables else table
    return tables


def _restricted(costs, edges, keep):
    """``(sizes, costs, edges)`` of the problem over the configurations ``keep[v]`` of each node ``v``."""
    return ([len(configurations) for configurations in keep], [cost[k] for cost, k in zip(costs, keep)],
            [(u, v, table[keep[u][:, None], keep[v]]) for u, v, table in edges])


# The search of what is left.

def _solve_remnant(nodes, edges, costs, limit):
    """Choices for ``nodes`` (a dict), the optimum's value, the method and whether it is exact."""
    neighbours, costs, folds = _fold_dangling(nodes, edges, {v: costs[v] for v in nodes})
    choices, values = {}, []
    for v, around in neighbours.items():
        if not around:
            choices[v] = int(np.argmin(costs[v]))
            values.append(costs[v][choices[v]])
    core = [v for v, around in neighbours.items() if around]
    method, exact = "elimination", True
    if core:
        index = {v: p for p, v in enumerate(core)}
        tables = {(index[u], index[v]): _dense(edge) for u in core
                  for v, (edge, forward) in neighbours[u].items() if forward}
        picked, value, method, exact = _search_core([len(costs[v]) for v in core], [costs[v] for v in core],
                                                    tables, limit)
        choices.update(zip(core, picked))
        values.append(value)
    _unfold(folds, choices)
    return choices, math.fsum(values), method, exact


def _fold_dangling(nodes, edges, costs):
    """Fold every node with one neighbour into that neighbour, repeatedly (a tree DP, exact).

    Returns the neighbours of the nodes not folded (``{node: {neighbour: (edge, node is its source)}}``), their
    folded costs, and the folds to undo."""
    neighbours = {v: {} for v in nodes}
    for (u, v), edge in edges.items():
        neighbours[u][v] = (edge, True)
        neighbours[v][u] = (edge, False)
    folds = []
    work = [v for v in nodes if len(neighbours[v]) == 1]
    while work:
        j = work.pop()
        if j not in neighbours or len(neighbours[j]) != 1:
            continue
        (k, (edge, forward)), = neighbours.pop(j).items()
        del neighbours[k][j]
        folds.append((j, k, edge, forward, costs[j]))
        costs[k] = costs[k] + (_vecmat(costs[j], edge) if forward else _matvec(edge, costs[j]))
        if len(neighbours[k]) == 1:
            work.append(k)
    return neighbours, costs, folds


def _unfold(folds, choices):
    for j, k, edge, forward, cost in reversed(folds):
        choices[j] = int(np.argmin(cost + (edge.col(choices[k]) if forward else edge.row(choices[k]))))


def _search_core(sizes, costs, tables, limit):
    if math.prod(sizes) <= limit:
        return depth_first(sizes, costs, tables) + ("elimination+exhaustive", True)
    solved = variable_elimination(sizes, costs, tables, limit)
    if solved is not None:
        return solved + ("elimination+variable-elimination", True)
    return _local_search(sizes, costs, tables) + ("elimination+local-search", False)


def _local_search(sizes, costs, tables):
    """A local optimum (choices, value): iterated conditional modes from the better of two starts."""
    around = [[] for _ in sizes]    # (neighbour, table (this size, neighbour size))
    for (u, v), table in tables.items():
        around[u].append((v, table))
        around[v].append((u, table.T))
    edges = [(u, v, table) for (u, v), table in tables.items()]
    starts = [[int(np.argmin(cost)) for cost in costs], _spanning_tree_optimum(costs, tables)]
    choices = min(starts, key=lambda start: _objective(costs, edges, start))
    changed = True
    while changed:                  # each change lowers (number of inf terms, finite sum): it ends
        changed = False
        for v in range(len(sizes)):
            prices = costs[v].copy()
            for w, table in around[v]:
                prices += table[:, choices[w]]
            best = int(np.argmin(prices))
            if prices[best] < prices[choices[v]]:
                choices[v], changed = best, True
    return choices, _objective(costs, edges, choices)


def _spanning_tree_optimum(costs, tables):
    """The exact optimum over the edges of a breadth-first spanning forest, the other edges ignored."""
    around = adjacency(len(costs), tables)
    tree, seen = {}, set()
    for root in range(len(costs)):
        if root in seen:
            continue
        seen.add(root)
        queue = deque([root])
        while queue:
            v = queue.popleft()
            for w in sorted(around[v] - seen):
                seen.add(w)
                queue.append(w)
                pair = (v, w) if (v, w) in tables else (w, v)
                tree[pair] = _Table(tables[pair])
    neighbours, folded, folds = _fold_dangling(range(len(costs)), tree, dict(enumerate(costs)))
    choices = {v: int(np.argmin(folded[v])) for v in neighbours}   # one root left per tree
    _unfold(folds, choices)
    return [choices[v] for v in range(len(costs))]
