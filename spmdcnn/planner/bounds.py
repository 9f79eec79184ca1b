"""Lower bounds for pruning the search: the min-marginals of a relaxation of the objective.

For ``sum_v cost_v[x_v] + sum_(u, v) T_uv[x_u, x_v]`` (one table per pair of nodes), a maximum spanning forest of
the pairs keeps its tables and every other table ``T`` is replaced on the node costs by ``r[a] + s[b] <= T[a, b]``
(its row minima, then the column minima of the rest). The relaxation's min-marginals, by two passes of min-plus
messages over the forest, are lower bounds: ``bounds[v][a] <= min {objective(x) : x_v = a}``. The forest keeps the
tables whose replacement loses most where they are low: the ``_LOSS_QUANTILE`` quantile of ``T - r - s``
(measured: far tighter bounds than by its mean, which pairs that no optimum uses dominate).
"""

import math

import numpy as np

_LOSS_QUANTILE = 0.05       # the forest keeps the tables highest in this quantile of T - r - s (measured best)
_LOSS_SAMPLES = 1024        # entries of T - r - s (a grid) that the quantile is taken over
_FINITE = np.finfo(np.float64).max     # stands for an inf row or column minimum: inf - _FINITE is inf, not nan


def relaxed_bounds(costs, tables, splits=None):
    """``bounds[v][a] <= min {objective(x) : x[v] = a}``: the min-marginals of the relaxation in the module
    docstring; ``tables`` has one table per pair. ``splits`` (a dict, by table id) keeps the tables' splits for
    the next call on the same tables (with other costs): they depend on the tables alone."""
    splits = {} if splits is None else splits       # by id: a table shared by pairs (one object) is split once
    for table in tables.values():
        if id(table) not in splits:
            splits[id(table)] = _split(table)
    forest, roots, unary = {}, list(range(len(costs))), [cost.copy() for cost in costs]
    for (u, v), table in sorted(tables.items(), key=lambda item: splits[id(item[1])][2], reverse=True):
        first, second = _root(roots, u), _root(roots, v)
        if first != second:
            roots[first] = second
            forest[(u, v)] = table
        else:
            rows, cols, _ = splits[id(table)]
            unary[u] += rows
            unary[v] += cols
    return _forest_marginals(unary, forest)


def _split(table):
    """``(r, s, loss)``: ``r[a] + s[b] <= table[a, b]`` (the row minima, then the column minima of the rest) and what
    replacing the table by them loses: the ``_LOSS_QUANTILE`` quantile of the rest ``table - r - s`` on a grid of
    about ``_LOSS_SAMPLES`` entries, then the grid's mean."""
    rows = table.min(axis=1)
    cols = (table - np.minimum(rows, _FINITE)[:, None]).min(axis=0)     # a row of infs stays inf, not nan
    step = -(-max(table.shape) // math.isqrt(_LOSS_SAMPLES))
    rest = table[::step, ::step] - np.minimum(rows[::step], _FINITE)[:, None] - np.minimum(cols[::step], _FINITE)
    low = int(_LOSS_QUANTILE * (rest.size - 1))
    return rows, cols, (float(np.partition(rest, low, axis=None)[low]), float(rest.mean()))


def _root(roots, v):
    while roots[v] != v:
        roots[v] = roots[roots[v]]
        v = roots[v]
    return v


def _forest_marginals(unary, forest):
    """The min-marginals of ``sum_v unary[v][x[v]] + sum_(u, v) forest[(u, v)][x[u], x[v]]`` over a forest: one
    pass of min-plus messages towards the roots, one back, plus the minima of the other trees."""
    around = [[] for _ in unary]
    for (u, v), table in forest.items():
        around[u].append((v, table))
        around[v].append((u, table.T))
    order, parent, tree = [], [None] * len(unary), [None] * len(unary)  # parent: (p, table (p's size, mine))
    for root in range(len(unary)):
        if tree[root] is not None:
            continue
        tree[root], stack = root, [root]
        while stack:
            v = stack.pop()
            order.append(v)
            for w, table in around[v]:
                if tree[w] is None:
                    tree[w], parent[w] = root, (v, table)
                    stack.append(w)
    totals, up = list(unary), [None] * len(unary)
    for v in reversed(order):       # the best of v's subtree given its parent's choice
        if parent[v] is not None:
            p, table = parent[v]
            up[v] = (table + totals[v]).min(axis=1)
            totals[p] = totals[p] + up[v]
    for v in order:                 # parents first: totals[p] is p's min-marginal; take out v's own message
        if parent[v] is not None:
            p, table = parent[v]
            rest = np.subtract(totals[p], up[v], out=np.full_like(up[v], np.inf), where=up[v] != np.inf)
            totals[v] = totals[v] + (rest[:, None] + table).min(axis=0)
    lowest = {root: float(totals[root].min()) for root in set(tree)}
    whole = math.fsum(lowest.values())
    if whole == math.inf:           # some tree has no finite assignment: neither has the whole
        return [np.full(len(total), np.inf) for total in totals]
    return [total + (whole - lowest[root]) for total, root in zip(totals, tree)]
