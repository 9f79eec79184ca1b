"""OptCNN's Algorithm 1 (planner.search) against the depth-first baseline, and the baseline against brute force."""

import math

import numpy as np
import pytest

from spmdcnn.planner import search
from spmdcnn.planner.search import evaluate, exhaustive, optimize

KINDS = ("uniform", "ties", "inf")
CROSSED = [(0, 1), (0, 2), (1, 3), (2, 3), (1, 4), (2, 4), (3, 5), (4, 5)]


# Graph shapes: (node count, [(u, v), ...]) with u < v.

def chain(rng):
    n = int(rng.integers(2, 9))
    return n, [(i, i + 1) for i in range(n - 1)]


def _branches(pairs, start, lengths):
    """Branches of ``lengths`` nodes each from node ``start`` into one join node; returns the join node."""
    nodes = start + 1 + sum(lengths)
    following = start + 1
    for length in lengths:
        previous = start
        for node in range(following, following + length):
            pairs.append((previous, node))
            previous = node
        pairs.append((previous, nodes))
        following += length
    return nodes


def diamond(rng):
    pairs = []
    join = _branches(pairs, 0, [int(x) for x in rng.integers(0, 3, size=int(rng.integers(2, 5)))])
    return join + 1, pairs


def inception(rng, blocks=None, longest=2):
    pairs, node = [], 0
    for _ in range(blocks or int(rng.integers(1, 3))):
        node = _branches(pairs, node, [int(x) for x in rng.integers(1, longest + 1, size=int(rng.integers(2, 4)))])
    return node + 1, pairs


def residual(rng):
    pairs, node = [], 0
    for _ in range(int(rng.integers(1, 4))):
        node = _branches(pairs, node, [int(rng.integers(1, 3)), 0])
    return node + 1, pairs


def parallel(rng):
    """A chain where some steps are doubled edges (add(x, x)) and one node also feeds a later one twice."""
    n = int(rng.integers(3, 8))
    pairs = [(i, i + 1) for i in range(n - 1)]
    pairs += [(i, i + 1) for i in range(n - 1) if rng.random() < 0.5]
    return n, pairs + [(0, n - 1), (0, n - 1)]


def crossed(rng):
    return 6, list(CROSSED)


def random_dag(rng):
    n = int(rng.integers(4, 8))
    return n, [(u, v) for u in range(n) for v in range(u + 1, n) if rng.random() < 0.45]


SHAPES = {f.__name__: f for f in (chain, diamond, inception, residual, parallel, crossed, random_dag)}


def values(rng, shape, kind):
    if kind == "ties":
        return rng.integers(0, 3, size=shape).astype(np.float64)
    table = rng.random(shape)
    if kind == "inf":
        table[rng.random(shape) < 0.25] = np.inf
    return table


def problem(rng, n, pairs, kind, smallest=1, largest=5):
    sizes = [int(s) for s in rng.integers(smallest, largest + 1, size=n)]
    costs = [values(rng, (s,), kind) for s in sizes]
    return sizes, costs, [(u, v, values(rng, (sizes[u], sizes[v]), kind)) for u, v in pairs]


def same(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def consistent(solution, sizes, costs, edges):
    assert len(solution.choices) == len(sizes)
    assert all(isinstance(c, int) and 0 <= c < s for c, s in zip(solution.choices, sizes))
    assert evaluate(sizes, costs, edges, solution.choices) == solution.cost


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_optimize_equals_exhaustive(shape, kind):
    rng = np.random.default_rng([sorted(SHAPES).index(shape), KINDS.index(kind)])
    for case in range(10):
        sizes, costs, edges = problem(rng, *SHAPES[shape](rng), kind)
        reference = exhaustive(sizes, costs, edges)
        solution = optimize(sizes, costs, edges)
        consistent(reference, sizes, costs, edges)
        consistent(solution, sizes, costs, edges)
        assert solution.exact and reference.exact and reference.method == "exhaustive"
        assert same(solution.cost, reference.cost), (case, solution, reference.cost)
        assert solution.eliminated_nodes + solution.remaining_nodes == len(sizes)


def objectives(sizes, costs, edges):
    """The objective of every assignment, on a dense grid of all of them."""
    grid = np.zeros(sizes)
    for v, cost in enumerate(costs):
        grid += cost.reshape([-1 if w == v else 1 for w in range(len(sizes))])
    for u, v, table in edges:
        grid += table.reshape([sizes[w] if w in (u, v) else 1 for w in range(len(sizes))])
    return grid


def brute_force(sizes, costs, edges):
    """The minimum over every assignment."""
    return objectives(sizes, costs, edges).min()


@pytest.mark.parametrize("seed", range(5))
def test_exhaustive_equals_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    for case in range(10):
        sizes, costs, edges = problem(rng, *random_dag(rng), KINDS[case % 3], largest=4)
        assert same(exhaustive(sizes, costs, edges).cost, brute_force(sizes, costs, edges)), case


def with_tails(rng, n, pairs):
    """A chain before node 0 and after the last node, and a dangling node: all of them reduce away.
    Returns the node count, the edges and where the original nodes start."""
    head, tail = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    moved = [(u + head, v + head) for u, v in pairs]
    last = n - 1 + head
    total = head + n + tail + 1
    return total, ([(i, i + 1) for i in range(head)] + moved +
                   [(i, i + 1) for i in range(last, last + tail)] + [(last - 1, total - 1)]), head


@pytest.mark.parametrize("shape", ["crossed", "random_dag"])
def test_fallbacks(shape):
    """Limits under the product of the sizes force variable elimination; a limit of 1 forces local search."""
    rng = np.random.default_rng(7 + len(shape))
    methods = set()
    for case in range(15):
        n, pairs = SHAPES[shape](rng)
        total, pairs, head = with_tails(rng, n, pairs) if case % 2 else (n, pairs, 0)
        sizes, costs, edges = problem(rng, total, pairs, KINDS[case % 3], smallest=2)
        reference = exhaustive(sizes, costs, edges)
        product = math.prod(sizes[head:head + n])
        for limit in (product - 1, product // 8, product // 64, 1):
            solution = optimize(sizes, costs, edges, limit=limit)
            consistent(solution, sizes, costs, edges)
            methods.add(solution.method)
            if solution.exact:
                assert same(solution.cost, reference.cost), (case, limit, solution, reference.cost)
            else:
                assert solution.method == "elimination+local-search"
                assert solution.cost >= reference.cost or same(solution.cost, reference.cost)
    assert {"elimination+variable-elimination", "elimination+local-search"} <= methods
    if shape == "crossed":
        assert {"elimination+variable-elimination", "elimination+local-search"} == methods


def test_crossed_graph_is_searched_exhaustively():
    rng = np.random.default_rng(3)
    sizes, costs, edges = problem(rng, 6, CROSSED, "uniform", smallest=2)
    solution = optimize(sizes, costs, edges)
    assert solution.method == "elimination+exhaustive" and solution.remaining_nodes == 6
    assert solution.eliminated_nodes == solution.eliminated_edges == 0
    assert same(solution.cost, exhaustive(sizes, costs, edges).cost)


def test_all_infinite_still_gives_an_assignment():
    rng = np.random.default_rng(4)
    sizes, costs, edges = problem(rng, 6, CROSSED, "uniform", smallest=2)
    edges = [(u, v, np.full_like(t, np.inf)) for u, v, t in edges]
    for solution in (optimize(sizes, costs, edges), optimize(sizes, costs, edges, limit=1),
                     exhaustive(sizes, costs, edges)):
        consistent(solution, sizes, costs, edges)
        assert solution.cost == np.inf


def test_sizes_of_one_give_the_trivial_solution():
    rng = np.random.default_rng(5)
    n, pairs = inception(rng, blocks=2)
    sizes, costs, edges = problem(rng, n, pairs + [(0, n - 1)], "uniform", largest=1)
    solution = optimize(sizes, costs, edges)
    assert solution.choices == [0] * n and solution.exact
    assert same(solution.cost, sum(c[0] for c in costs) + sum(t[0, 0] for _, _, t in edges))


def test_chain_reduces_to_its_ends():
    rng = np.random.default_rng(6)
    for n in (2, 3, 10, 40):
        sizes, costs, edges = problem(rng, n, [(i, i + 1) for i in range(n - 1)], "uniform")
        solution = optimize(sizes, costs, edges)
        assert (solution.eliminated_nodes, solution.remaining_nodes, solution.remaining_edges) == (n - 2, 2, 1)
        assert solution.eliminated_edges == 0 and solution.method == "elimination"
        if n <= 10:
            assert same(solution.cost, exhaustive(sizes, costs, edges).cost)


def test_inception_reduces_to_two_nodes():
    rng = np.random.default_rng(8)
    n, pairs = inception(rng, blocks=3, longest=3)
    sizes, costs, edges = problem(rng, n, pairs, "uniform", smallest=2, largest=3)
    solution = optimize(sizes, costs, edges)
    assert (solution.remaining_nodes, solution.remaining_edges) == (2, 1)
    assert solution.eliminated_nodes == n - 2
    assert solution.eliminated_edges == len(pairs) - (n - 2) - 1     # each node elimination: 2 edges into 1
    consistent(solution, sizes, costs, edges)


def test_nodes_without_edges():
    costs = [np.array([3.0, 1.0, 2.0]), np.array([5.0])]
    solution = optimize([3, 1], costs, [])
    assert solution.choices == [1, 0] and solution.cost == 6.0 and solution.method == "elimination"
    assert optimize([], [], []).choices == exhaustive([], [], []).choices == []


def test_long_chain_runs():
    """A smoke check of a planner-sized problem (no timing assertion)."""
    rng = np.random.default_rng(9)
    sizes, costs, edges = problem(rng, 200, [(i, i + 1) for i in range(199)], "uniform", 150, 150)
    solution = optimize(sizes, costs, edges)
    consistent(solution, sizes, costs, edges)
    assert solution.remaining_nodes == 2


def test_exhaustive_limit():
    sizes, costs, edges = problem(np.random.default_rng(10), 8, [(i, i + 1) for i in range(7)], "uniform", 5, 5)
    with pytest.raises(ValueError, match=r"exhaustive: 8 nodes have 390625 assignments, more than the limit of "
                                         r"1000: use --strategy optimal .*, or raise --limit") as info:
        exhaustive(sizes, costs, edges, limit=1000)
    assert "()" not in str(info.value)          # options of the command, never functions
    assert exhaustive(sizes, costs, edges, limit=390625).exact


@pytest.mark.parametrize("change, message", [
    (lambda s, c, e: (s, c[:-1], e), r"optimize: 2 cost vectors for 3 nodes"),
    (lambda s, c, e: ([0, 2, 2], [np.zeros(0)] + c[1:], e), r"node 0 has 0 configurations; expected at least 1"),
    (lambda s, c, e: (s, [np.zeros(3)] + c[1:], e), r"node 0's costs have shape \(3,\); expected \(2,\)"),
    (lambda s, c, e: (s, [np.array([0.0, np.nan])] + c[1:], e), r"node 0's costs contain nan or -inf"),
    (lambda s, c, e: (s, c, [(0, 1, np.array([[0.0, -np.inf], [0, 0]]))]), r"edge 0 \(0 -> 1\) contain nan or -inf"),
    (lambda s, c, e: (s, c, e + [(2, 1, np.zeros((2, 2)))]), r"edge 2 \(2 -> 1\): expected 0 <= u < v < 3"),
    (lambda s, c, e: (s, c, e + [(1, 3, np.zeros((2, 2)))]), r"edge 2 \(1 -> 3\): expected 0 <= u < v < 3"),
    (lambda s, c, e: (s, c, [(0, 1, np.zeros((2, 3)))]), r"edge 0 \(0 -> 1\) have shape \(2, 3\); expected \(2, 2\)"),
])
def test_invalid_problems(change, message):
    sizes, costs, edges = [2, 2, 2], [np.zeros(2)] * 3, [(0, 1, np.zeros((2, 2))), (1, 2, np.zeros((2, 2)))]
    with pytest.raises(ValueError, match=message):
        optimize(*change(sizes, costs, edges))
    with pytest.raises(ValueError, match=message.replace("optimize", "exhaustive")):
        exhaustive(*change(sizes, costs, edges))


def test_invalid_choices():
    sizes, costs, edges = [2, 3], [np.zeros(2), np.zeros(3)], [(0, 1, np.zeros((2, 3)))]
    with pytest.raises(ValueError, match=r"evaluate: 1 choices for 2 nodes"):
        evaluate(sizes, costs, edges, [0])
    with pytest.raises(ValueError, match=r"evaluate: node 1: choice 3 is not in 0..2"):
        evaluate(sizes, costs, edges, [0, 3])


# Pruning configurations before Algorithm 1 (forced here with _PRUNE_WORK = -1: small problems skip it).

@pytest.fixture
def always_prune(monkeypatch):
    monkeypatch.setattr(search, "_PRUNE_WORK", -1)


def shifted(costs, edges, by):
    """Every cost and table entry plus ``by`` (negative costs are allowed)."""
    return [cost + by for cost in costs], [(u, v, table + by) for u, v, table in edges]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_pruned_optimize_equals_exhaustive(shape, kind, always_prune):
    rng = np.random.default_rng([sorted(SHAPES).index(shape), KINDS.index(kind), 1])
    for case in range(8):
        sizes, costs, edges = problem(rng, *SHAPES[shape](rng), kind, largest=6)
        if case % 2:
            costs, edges = shifted(costs, edges, -0.5)
        reference = exhaustive(sizes, costs, edges)
        solution = optimize(sizes, costs, edges)
        consistent(solution, sizes, costs, edges)
        assert solution.exact and same(solution.cost, reference.cost), (case, solution, reference.cost)


@pytest.mark.parametrize("seed", range(4))
def test_pruning_keeps_every_optimal_assignment(seed):
    """Every configuration of every optimal assignment (ties included) survives the pruning."""
    rng = np.random.default_rng(300 + seed)
    pruned = 0
    for case in range(12):
        n, pairs = (random_dag, inception, residual)[case % 3](rng)
        sizes, costs, edges = problem(rng, n, pairs, KINDS[case % 3], smallest=2, largest=6 if n < 7 else 3)
        if case % 4 == 1:
            costs, edges = shifted(costs, edges, -0.5)
        keep = search._prune(search._Reduction(sizes, costs, edges), costs, edges, 2_000_000)
        grid = objectives(sizes, costs, edges)
        if keep is None:            # no finite assignment was found: nothing is pruned
            assert grid.min() == np.inf or KINDS[case % 3] == "inf", case
            continue
        assert all(len(k) >= 1 and np.all(np.diff(k) > 0) for k in keep)
        for optimum in np.argwhere(grid == grid.min()):
            assert all(c in k for c, k in zip(optimum, keep)), (case, optimum, keep)
        pruned += sum(sizes) - sum(map(len, keep))
    assert pruned > 0               # the test sees configurations removed


def test_pruning_on_a_planner_sized_problem(monkeypatch):
    """Inception-like blocks with distance-like tables, as the planner makes: pruning runs by default, removes
    over half of the configurations and gives the optimum that Algorithm 1 alone gives."""
    rng = np.random.default_rng(11)
    n, pairs = inception(rng, blocks=5, longest=3)
    size = 64
    layout = rng.random((size, 2))                  # a table: the distance between two layouts, scaled per edge
    distance = np.abs(layout[:, None, :] - layout[None, :, :]).sum(axis=2)
    sizes = [size] * n
    costs = [rng.random(size) for _ in range(n)]
    edges = [(u, v, distance * rng.uniform(0.5, 2.0)) for u, v in pairs]
    assert search._Reduction(sizes, costs, edges).dense_work() > search._PRUNE_WORK
    kept, restricted = [], search._restricted

    def recorded(costs, edges, keep):
        kept.append(keep)           # the last call: the configurations that Algorithm 1 searches
        return restricted(costs, edges, keep)

    monkeypatch.setattr(search, "_restricted", recorded)
    solution = optimize(sizes, costs, edges)
    monkeypatch.undo()
    assert sum(map(len, kept[-1])) < sum(sizes) / 2
    monkeypatch.setattr(search, "_PRUNE_WORK", math.inf)
    reference = optimize(sizes, costs, edges)
    consistent(solution, sizes, costs, edges)
    assert same(solution.cost, reference.cost) and solution.exact
    assert (solution.eliminated_nodes, solution.eliminated_edges, solution.remaining_nodes, solution.method) == \
        (reference.eliminated_nodes, reference.eliminated_edges, reference.remaining_nodes, reference.method)


def test_pruning_with_no_finite_assignment(always_prune):
    rng = np.random.default_rng(12)
    sizes, costs, edges = problem(rng, 6, CROSSED, "uniform", smallest=2)
    edges = [(u, v, np.full_like(t, np.inf)) for u, v, t in edges]
    assert search._prune(search._Reduction(sizes, costs, edges), costs, edges, 2_000_000) is None
    solution = optimize(sizes, costs, edges)
    consistent(solution, sizes, costs, edges)
    assert solution.cost == np.inf


def test_shared_and_list_tables():
    """A table object shared by edges is checked once per shape; tables may be nested lists, made on the fly."""
    rng = np.random.default_rng(13)
    sizes, costs, edges = problem(rng, 5, [(0, 1), (1, 2), (2, 3), (3, 4), (0, 4)], "uniform", 3, 3)
    shared = edges[1][2]
    edges = [(u, v, shared if 1 <= u <= 2 else table) for u, v, table in edges]
    expected = optimize(sizes, costs, edges)
    listed = optimize(sizes, costs, ((u, v, table.tolist()) for u, v, table in edges))
    assert listed.choices == expected.choices and listed.cost == expected.cost
    with pytest.raises(ValueError, match=r"edge 1 \(1 -> 2\) have shape \(3, 3\); expected \(3, 2\)"):
        optimize([3, 3, 2], costs[:2] + [costs[2][:2]], [(0, 1, shared), (1, 2, shared)])
