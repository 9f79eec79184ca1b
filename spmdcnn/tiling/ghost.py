"""Ghost batch norm's geometry (job key ``batchnorm: {group: G}``): statistics over fixed groups of ``G``
consecutive samples of the global batch, whatever the plan.

A batchnorm tile holds samples ``[n0, n1)`` of its channels; it touches the groups ``n0 // G`` to
``ceil(n1 / G)``. Tiles of one replica group (the same channels) that touch a common group must combine their
statistics; joined transitively, they form a *component*, which communicates on its own. A tile that holds whole
groups no other tile touches is a component of one: it communicates nothing in forward or backward.
"""

from typing import NamedTuple


class GhostSite(NamedTuple):
    """One tile's place in ghost batch norm."""

    component: tuple    # the sorted devices whose statistics this tile combines with (itself included)
    groups: tuple       # (g0, g1): the component's groups
    spans: tuple        # per group of the component, the tile's samples (s0, s1) of it, relative to the tile
    whole: bool         # the component is the whole replica group: it sees every group of the batch
    leader: bool        # the lowest device of its component


def ghost_group(spec):
    """G of the job's ``batchnorm`` key: None for ``global`` (or None), else ``{group: G}``'s G (or G itself)."""
    if spec is None or spec == "global":
        return None
    if isinstance(spec, int) and not isinstance(spec, bool):
        return spec
    return spec["group"]


def touched(n0, n1, group):
    """The groups ``[g0, g1)`` samples ``[n0, n1)`` belong to."""
    return n0 // group, -(-n1 // group)


def components(config, shape, group):
    """``{device: GhostSite}`` of a batchnorm configuration over the output ``shape`` (N, C, H, W) with groups of
    ``group`` samples."""
    tiles = dict(config.tiles(shape))
    found = {}
    for members in config.replicas().values():
        members = sorted(members)
        ranges = {d: touched(tiles[d][0][0], tiles[d][0][1], group) for d in members}
        parent = {d: d for d in members}

        def root(d):
            while parent[d] != d:
                parent[d] = parent[parent[d]]
                d = parent[d]
            return d
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                (a0, a1), (b0, b1) = ranges[a], ranges[b]
                if a0 < b1 and b0 < a1:
                    parent[root(b)] = root(a)
        sets = {}
        for d in members:
            sets.setdefault(root(d), []).append(d)
        for component in sets.values():
            g0 = min(ranges[d][0] for d in component)
            g1 = max(ranges[d][1] for d in component)
            for d in component:
                n0, n1 = tiles[d][0]
                spans = tuple((min(max(g * group - n0, 0), n1 - n0), min(max((g + 1) * group - n0, 0), n1 - n0))
                              for g in range(g0, g1))
                found[d] = GhostSite(tuple(component), (g0, g1), spans, len(component) == len(members),
                                     d == component[0])
    return found
