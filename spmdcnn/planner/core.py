"""Exact searches of a core: the nodes Algorithm 1's eliminations leave with two or more neighbours.

``tables`` maps ``(p, q)`` to one dense table per pair of nodes; ``costs`` are the nodes' cost vectors.

**Branch and bound** (:func:`depth_first`): nodes are assigned most-connected first; at each depth all choices of
the node are priced by one vector sum (its cost plus the rows of its tables to already assigned nodes), tried
cheapest first, and cut when the price plus a lower bound of the unassigned nodes (each node's cheapest cost plus
the column minima of its tables to earlier nodes) reaches the best complete assignment found so far.

**Variable elimination** (:func:`variable_elimination`): the nodes are eliminated one at a time in a greedy order
(the smallest joint table first, then the fewest new neighbour pairs, then the lowest id): the node's factors are
summed into a table over the node and its neighbours and minimized over the node, keeping the argmin for the way
back. It gives up (None) when a joint table would have more than ``limit`` entries.
"""

import math

import numpy as np


def depth_first(sizes, costs, tables):
    """The optimum (choices, value) by depth-first branch-and-bound; ``tables`` maps ``(p, q)``, one per pair."""
    order = _assignment_order(len(sizes), tables)
    if not order:
        return [], 0.0
    position = {v: p for p, v in enumerate(order)}
    earlier = [[] for _ in order]   # by position: (earlier position, table (earlier size, this size))
    for (u, v), table in tables.items():
        if position[u] < position[v]:
            earlier[position[v]].append((position[u], table))
        else:
            earlier[position[u]].append((position[v], table.T))
    own = [costs[v] for v in order]
    bounds = [np.min(own[p] + sum(table.min(axis=0) for _, table in earlier[p])) for p in range(len(order))]
    rest = [0.0] * (len(order) + 1)     # rest[p]: a lower bound of the positions p.. whatever comes before
    for p in reversed(range(len(order))):
        rest[p] = rest[p + 1] + bounds[p]

    def prices(p, picked):
        values = own[p].copy()
        for q, table in earlier[p]:
            values += table[picked[q]]
        return values

    picked, best_value = [0] * len(order), 0.0      # the first incumbent: cheapest choice at each position
    for p in range(len(order)):
        values = prices(p, picked)
        picked[p] = int(np.argmin(values))
        best_value += values[picked[p]]
    best = list(picked)
    candidates, totals, next_try = [None] * len(order), [None] * len(order), [0] * len(order)
    p, base = 0, 0.0
    while p >= 0:
        if base is not None:            # entering position p: price its choices, keep the promising ones
            values = base + prices(p, picked)
            keep = np.flatnonzero(values + rest[p + 1] < best_value)
            candidates[p] = keep[np.argsort(values[keep], kind="stable")]
            totals[p], next_try[p] = values[candidates[p]], 0
        t = next_try[p]
        if t == len(candidates[p]) or totals[p][t] + rest[p + 1] >= best_value:
            p, base = p - 1, None
            continue
        next_try[p] = t + 1
        picked[p] = int(candidates[p][t])
        if p == len(order) - 1:         # cheapest first: the others at this position cannot beat it
            best_value, best = totals[p][t], list(picked)
            p, base = p - 1, None
        else:
            p, base = p + 1, totals[p][t]
    choices = [0] * len(order)
    for p, v in enumerate(order):
        choices[v] = best[p]
    return choices, float(best_value)


def _assignment_order(count, tables):
    """Most-connected first: then the node with most assigned neighbours (then degree, then lowest id)."""
    around = adjacency(count, tables)
    links = [0] * count
    order, left = [], set(range(count))
    while left:
        v = min(left, key=lambda w: (-links[w], -len(around[w]), w))
        order.append(v)
        left.remove(v)
        for w in around[v]:
            links[w] += 1
    return order


def adjacency(count, tables):
    around = [set() for _ in range(count)]
    for u, v in tables:
        around[u].add(v)
        around[v].add(u)
    return around


def variable_elimination(sizes, costs, tables, limit):
    """The optimum (choices, value) by bucket elimination, or None if a joint table would exceed ``limit``."""
    order = _elimination_order(sizes, tables, limit)
    if order is None:
        return None
    factors = [((v,), cost) for v, cost in enumerate(costs)] + [(pair, table) for pair, table in tables.items()]
    way_back = []
    for v in order:
        mine = [f for f in factors if v in f[0]]
        factors = [f for f in factors if v not in f[0]]
        scope = (v,) + tuple(sorted({w for f in mine for w in f[0]} - {v}))
        joint = np.zeros([sizes[w] for w in scope])
        for variables, values in mine:
            joint += _aligned(variables, values, scope)
        best = joint.argmin(axis=0)     # (neighbour sizes...)
        factors.append((scope[1:], np.take_along_axis(joint, best[None], axis=0)[0]))
        way_back.append((v, scope[1:], best))
    choices = [0] * len(sizes)
    for v, rest, best in reversed(way_back):
        choices[v] = int(best[tuple(choices[w] for w in rest)])
    return choices, math.fsum(float(values) for _, values in factors)


def _aligned(variables, values, scope):
    """``values`` over ``variables`` transposed and reshaped to broadcast over ``scope``."""
    axes = sorted(range(len(variables)), key=lambda a: scope.index(variables[a]))
    shape = [values.shape[variables.index(w)] if w in variables else 1 for w in scope]
    return np.transpose(values, axes).reshape(shape)


def _elimination_order(sizes, tables, limit):
    """Greedy: the smallest joint table, then the fewest new neighbour pairs, then the lowest id; None over limit."""
    around = adjacency(len(sizes), tables)
    left, order = set(range(len(sizes))), []

    def key(v):
        fill = sum(1 for a in around[v] for b in around[v] if a < b and b not in around[a])
        return sizes[v] * math.prod(sizes[w] for w in around[v]), fill, v

    while left:
        joint, _, v = min(key(w) for w in left)
        if joint > limit:
            return None
        order.append(v)
        left.remove(v)
        for a in around[v]:
            around[a] |= around[v] - {a}
            around[a].discard(v)
    return order
