"""The switches above the nodes, as Slurm's topology/tree plugin tells each task, for ``spmdcnn calibrate``.

Under the plugin every task has ``SLURM_TOPOLOGY_ADDR`` (its place in the tree, outermost switch first, e.g.
``s0.s3.node17``) and ``SLURM_TOPOLOGY_ADDR_PATTERN`` (what each part is, e.g. ``switch.switch.node``). From them
:func:`find_topology` groups the job's nodes by their switch at each level, innermost first, keeping the levels
that group them further than the level below (a level whose switches each hold the same nodes as one switch below
is invisible to the job). :func:`level_node_pairs` pairs nodes whose lowest common switch is of a given level, for
the links calibrate measures across it. Pure functions: no MPI here.
"""

from dataclasses import dataclass

ADDRESS, PATTERN = "SLURM_TOPOLOGY_ADDR", "SLURM_TOPOLOGY_ADDR_PATTERN"
ABSENT = (f"not measured: Slurm's topology variables ({ADDRESS}, {PATTERN}) absent; add the switch levels above "
          "the nodes by hand (docs/formats.md#machine-files)")


def switch_path(address, pattern):
    """The switches of one task's ``address`` under ``pattern``, outermost first, without the node:
    ``switch_path("s0.s3.node17", "switch.switch.node") == ("s0", "s3")``. The node's name may hold dots."""
    kinds = pattern.split(".")
    names = address.split(".", len(kinds) - 1)
    if kinds[-1] != "node" or any(kind != "switch" for kind in kinds[:-1]) or len(names) != len(kinds):
        raise ValueError(f"{ADDRESS}={address!r} does not follow {PATTERN}={pattern!r} (switch.switch...node)")
    return tuple(names[:-1])


@dataclass(frozen=True)
class Topology:
    """The job's nodes under the switches: ``levels[k][n]`` is the switch (numbered from 0, in node order of first
    appearance) over node ``n`` at switch level ``k``, innermost first, only levels that group the nodes further
    than the one below; ``sizes[k]`` the nodes under one switch of level ``k`` for the machine file (the most
    under one, rounded up to a multiple of the level below's); ``block`` whether node ``n`` is under switch ``n //
    sizes[k]`` at every level, as the machine model numbers them; ``note`` why there are no levels."""

    levels: tuple = ()
    sizes: tuple = ()
    block: bool = True
    note: str = ""


def _numbered(keys):
    numbers = {}
    return tuple(numbers.setdefault(key, len(numbers)) for key in keys)


def find_topology(node_of, addresses):
    """The :class:`Topology` of a job whose rank ``r`` is on node ``node_of[r]`` and has ``addresses[r]``, the
    ``(address, pattern)`` of its Slurm variables or None."""
    if not addresses or any(found is None for found in addresses):
        return Topology(note=ABSENT)
    paths = {}
    for rank, (node, (address, pattern)) in enumerate(zip(node_of, addresses)):
        try:
            path = switch_path(address, pattern)
        except ValueError as error:
            return Topology(note=f"not measured: rank {rank}: {error}")
        if paths.setdefault(node, path) != path:
            return Topology(note=f"not measured: the ranks of node {node} disagree on its switches ({ADDRESS})")
    nodes = len(paths)
    ordered = [paths[node] for node in range(nodes)]
    depth = len(ordered[0])
    if any(len(path) != depth for path in ordered):
        return Topology(note="not measured: the nodes sit at different depths of Slurm's switch tree")
    if nodes < 2:
        return Topology(note="not measured: the job runs on one node")
    if len({path[:1] for path in ordered}) > 1:
        return Topology(note="not measured: the nodes have no common switch in Slurm's topology")
    levels, below = [], tuple(range(nodes))
    for cut in range(depth, 0, -1):         # innermost switch first
        groups = _numbered(path[:cut] for path in ordered)
        if len(set(groups)) < len(set(below)):
            levels.append(groups)
            below = groups
    sizes, block = [], True
    for groups in levels:
        under = max(groups.count(g) for g in set(groups))
        previous = sizes[-1] if sizes else 1
        size = max(-(-under // previous), 2) * previous
        sizes.append(size)
        block = block and all(g == n // size for n, g in enumerate(groups))
    return Topology(tuple(levels), tuple(sizes), block)


def level_node_pairs(topology, level):
    """Pairs of nodes whose lowest common switch is of switch level ``level``, all disjoint: in each switch of the
    level, its children (the switches of the level below; nodes, below the first level) paired first with second,
    third with fourth, ...; the i-th node of one child with the i-th of the other."""
    nodes = len(topology.levels[0])
    below = topology.levels[level - 1] if level else tuple(range(nodes))
    above = topology.levels[level]
    pairs = []
    for switch in sorted(set(above)):
        children = sorted({below[n] for n in range(nodes) if above[n] == switch})
        for first, second in zip(children[::2], children[1::2]):
            pairs += zip([n for n in range(nodes) if below[n] == first], [n for n in range(nodes) if below[n] == second])
    return pairs


def loaded_node_pairs(topology, level):
    """Node pairs that load one switch of ``level`` (>= 1) from both sides: the nodes of two of its children with
    two or more nodes each, i-th with i-th; empty where no switch of the level has two such children."""
    nodes = len(topology.levels[0])
    below, above = topology.levels[level - 1], topology.levels[level]
    for switch in sorted(set(above)):
        children = [[n for n in range(nodes) if below[n] == child]
                    for child in sorted({below[n] for n in range(nodes) if above[n] == switch})]
        big = [child for child in children if len(child) >= 2]
        if len(big) >= 2:
            return list(zip(big[0], big[1]))
    return []


def rank_partners(node_of, node_pairs):
    """Each rank's partner (None for none) for the ``node_pairs``: the i-th rank of one node with the i-th of the
    other; ranks beyond the smaller node's count sit out."""
    partner = [None] * len(node_of)
    for first, second in node_pairs:
        ranks_a = [r for r, n in enumerate(node_of) if n == first]
        ranks_b = [r for r, n in enumerate(node_of) if n == second]
        for a, b in zip(ranks_a, ranks_b):
            partner[a], partner[b] = b, a
    return partner
