"""The planner's memory limit: the fastest plan whose busiest device holds at most ``memory`` bytes under the
memory model (:mod:`spmdcnn.cost.memory`): what every layer keeps from forward to backward, summed, plus the
largest transient among the layers (what one holds only while it runs).

The sum is additive over the search's nodes and the peak is not, so the search runs over the peak: a plan whose
largest transient lies in ``[T_lo, T_hi]`` uses only configurations of transient at most ``T_hi`` and keeps at
most ``memory - T_lo``. Over the sorted distinct transients, intervals are searched best bound first
(:func:`within_memory`): each is relaxed to that pair of conditions, whose optimum (:func:`_within_kept`, the
Lagrangian relaxation of the kept bytes below) bounds every plan of the interval; an interval of one value is exact;
the others split in two while their bound beats the fastest fitting plan found. Within an interval, the kept
bytes' limit is priced: the search runs on the costs plus ``price`` times each configuration's kept bytes; the
price rises until a plan fits and is bisected, giving a fitting plan and a lower bound, and branch and bound
(:func:`_branch_and_bound`) closes the gap.
"""

import heapq
import time
from dataclasses import replace

import numpy as np

from ..sizes import format_against
from . import search


def plan_bytes(kept, transients, choices):
    """The memory model's bytes of the plan ``choices``: the kept bytes summed and the largest transient."""
    return float(sum(k[c] for k, c in zip(kept, choices))) + float(max(t[c] for t, c in zip(transients, choices)))


def _tolerance(value):
    """How far apart two objectives within rounding of ``value`` may lie."""
    return 1e-9 * max(abs(value), 1e-12)


def _reaches(bound, value):
    """Whether a lower ``bound`` proves that nothing beats ``value``."""
    return bound >= value - _tolerance(value)


def _lightest(kept, transients, levels):
    """Per level ``T`` of ``levels`` (sorted): the least kept bytes of a plan whose transients are at most ``T``
    (infinite where some node has no such configuration)."""
    total = np.zeros(len(levels))
    for k, t in zip(kept, transients):
        order = np.argsort(t, kind="stable")
        best = np.minimum.accumulate(k[order])                # the lightest among the first j by transient
        count = np.searchsorted(t[order], levels, side="right")
        total += np.where(count > 0, best[np.maximum(count - 1, 0)], np.inf)
    return total


def lightest(kept, transients):
    """The least memory (:func:`plan_bytes`) of any plan: over the levels of peak transient, the lightest kept
    bytes under each plus the level."""
    levels = np.unique(np.concatenate(transients))
    return float(np.min(_lightest(kept, transients, levels) + levels))


def within_memory(problem, sizes, memory, itemsize, rounds=24, nodes=100_000, seconds=30.0):
    """The fastest plan (a search Solution) whose memory (:func:`plan_bytes` of ``problem.memory`` and
    ``problem.transients``) fits in ``memory`` bytes (module docstring). The unlimited optimum when it fits.
    Exact when the searches finish within ``nodes`` relaxed searches and ``seconds``; otherwise the best fitting
    plan found, within a proven distance of the optimum (``lower``), which its method names. A limit below the
    lightest plan's memory is an error."""
    kept, transients = problem.memory(itemsize), problem.transients(itemsize)
    costs, edges = problem.node_costs, problem.edges
    free = search.optimize(sizes, costs, edges)
    if plan_bytes(kept, transients, free.choices) <= memory:
        return free
    levels = np.unique(np.concatenate(transients))
    light = _lightest(kept, transients, levels)
    feasible = np.flatnonzero(light + levels <= memory)
    if not len(feasible):
        needs, limit = format_against(float(np.min(light + levels)), memory)
        raise ValueError(f"no plan fits in {limit} per device (--memory): the lightest needs {needs} "
                         "(the memory model of docs/architecture.md#memory)")
    deadline = time.perf_counter() + seconds

    def objective(choices):
        return search.evaluate(sizes, costs, edges, choices)

    def relaxed(lo, hi):
        """The best plan whose transients are at most ``levels[hi]`` and kept bytes at most ``memory -
        levels[lo]``: ``(solution or None, its objective, a lower bound of every plan of peak in the interval)``."""
        allowed = {v: t <= levels[hi] for v, t in enumerate(transients)}
        return _within_kept(sizes, costs, edges, kept, memory - levels[lo], allowed, objective, rounds, nodes,
                            deadline)
    best, value = None, np.inf
    unclosed = []               # lower bounds of the intervals of one level whose search did not close its gap
    heap = [(-np.inf, int(feasible[0]), int(feasible[-1]))]
    while heap:
        bound, lo, hi = heapq.heappop(heap)
        if _reaches(bound, value):
            continue
        if time.perf_counter() > deadline:
            heapq.heappush(heap, (bound, lo, hi))
            break
        solution, found, lower = relaxed(lo, hi)
        if solution is not None and plan_bytes(kept, transients, solution.choices) <= memory and found < value:
            best, value = solution, found
        if _reaches(lower, value):
            continue
        if lo == hi:
            unclosed.append(lower)
            continue
        middle = (lo + hi) // 2
        heapq.heappush(heap, (lower, lo, middle))
        heapq.heappush(heap, (lower, middle + 1, hi))
    if best is None:
        raise ValueError(f"no plan found within {format_against(memory, memory)[0]} per device (--memory)")
    lower = min([value] + unclosed + [bound for bound, _, _ in heap])
    exact = _reaches(lower, value)
    gap = 0.0 if exact else (value - lower) / abs(value)
    method = best.method + ("+memory limit (peak search, Lagrangian branch and bound)" if exact else
                            f"+memory limit (peak search, Lagrangian branch and bound, within {100 * gap:.2g} % "
                            "of optimal)")
    return replace(best, cost=value, exact=exact, method=method, lower=None if exact else lower)


def _within_kept(sizes, costs, edges, kept, budget, allowed, objective, rounds, nodes, deadline):
    """``(solution, value, lower)``: the fastest plan among the ``allowed`` configurations (``{node: mask}``)
    whose kept bytes fit in ``budget`` (None when none does), its ``objective``, and a lower bound of the best
    such plan's objective; ``solution.exact`` says whether it is proven the best."""
    if budget < 0:
        return None, np.inf, np.inf

    def solve(price, restricted=None):
        """The priced search over the configurations ``restricted`` allows (each a subset of ``allowed``'s)."""
        priced = [c + price * b for c, b in zip(costs, kept)]
        for v, mask in (allowed if restricted is None else restricted).items():
            priced[v] = np.where(mask, priced[v], np.inf)
        solution = search.optimize(sizes, priced, edges)
        if not np.isfinite(solution.cost):
            return solution, np.inf
        return solution, float(sum(b[c] for b, c in zip(kept, solution.choices)))
    lightest = float(sum(b[m].min() if m.any() else np.inf for b, m in
                         zip(kept, (allowed.get(v, np.ones(len(b), dtype=bool)) for v, b in enumerate(kept)))))
    if lightest > budget:
        return None, np.inf, np.inf
    solution, used = solve(0.0)
    if used <= budget:
        return replace(solution, exact=True), objective(solution.choices), solution.cost
    bound, price_at = solution.cost, 0.0            # price 0: the unlimited optimum bounds every fitting plan
    best, low, high = None, 0.0, max(abs(solution.cost), 1e-12) / used
    for _ in range(64):                 # raise the price until a plan fits
        fits, used = solve(high)
        if fits.cost - high * budget > bound:
            bound, price_at = fits.cost - high * budget, high
        if used <= budget:
            best, value = fits, objective(fits.choices)
            break
        low, high = high, high * 4
    if best is None:
        return None, np.inf, bound
    for _ in range(rounds):             # and bisect it down, keeping the fastest that fits and the best bound
        middle = (low + high) / 2
        candidate, used = solve(middle)
        if candidate.cost - middle * budget > bound:
            bound, price_at = candidate.cost - middle * budget, middle
        if used > budget:
            low = middle
            continue
        high = middle
        found = objective(candidate.choices)
        if found < value:
            best, value = candidate, found
    best, value, lower = _branch_and_bound(solve, kept, budget, price_at, best, value, bound, nodes, deadline,
                                           objective, allowed)
    exact = _reaches(lower, value)
    return replace(best, cost=value, exact=exact), value, lower


def _branch_and_bound(solve, bytes_, memory, price, best, value, bound, budget, deadline, objective, start=None):
    """``(best, value, lower)``: the fitting plan of least ``objective`` found from the incumbent ``best``
    (``value``) by best-first branch and bound on relaxed searches at ``price``, and a proven lower bound on the
    best fitting plan's objective: ``value`` itself when the tree was searched within ``budget`` searches before
    ``deadline`` (``time.perf_counter``), else the least bound of the subtrees left. ``bound`` is the root's lower
    bound. A node of the tree restricts some layers' configurations (the root to ``start``, ``{node: mask}``), its
    bound is the relaxed optimum at the best price under those restrictions, and it branches on the layer whose
    relaxed choice takes the most memory beyond its lightest allowed one (that choice alone, or all but it)."""
    tolerance = _tolerance(value)
    if value - bound <= tolerance:
        return best, value, value
    heap = [(bound, 0, dict(start or {}))]      # subtrees to search: (parent's bound, order, restrictions)
    searches = 0
    while heap:
        if searches >= budget or time.perf_counter() > deadline:
            return best, value, min(value, heap[0][0])
        _, _, allowed = heapq.heappop(heap)
        solution, used = solve(price, allowed)
        searches += 1
        lower = solution.cost - price * memory
        if not np.isfinite(solution.cost) or lower >= value - tolerance:
            continue                        # nothing in this subtree beats the incumbent
        if used <= memory:
            found = objective(solution.choices)
            if found < value:
                best, value = solution, found
            if found - lower <= tolerance:
                continue                    # the subtree's best fitting plan is this one
        # branch on the layer whose relaxed choice takes the most memory beyond its lightest allowed configuration
        # (a plan that fits: beyond the least its other allowed configurations take)
        excess = []
        for v, (b, c) in enumerate(zip(bytes_, solution.choices)):
            mask = allowed.get(v, np.ones(len(b), dtype=bool))
            others = mask.copy()
            others[c] = False
            if used <= memory:
                excess.append(b[c] - b[others].min() if others.any() else -np.inf)
            else:
                excess.append(b[c] - b[mask].min())
        v = int(np.argmax(excess))
        if excess[v] == -np.inf or (used > memory and excess[v] <= 0):
            continue        # every layer fixed, or every layer at its lightest: nothing better in this subtree
        mask = allowed.get(v, np.ones(len(bytes_[v]), dtype=bool))
        without, only = mask.copy(), np.zeros_like(mask)
        without[solution.choices[v]] = False
        only[solution.choices[v]] = True
        heapq.heappush(heap, (lower, searches * 2 + 1, {**allowed, v: only}))
        heapq.heappush(heap, (lower, searches * 2, {**allowed, v: without}))
    return best, value, value
