"""Which tiles of a group (or instance) normalisation add up their statistics.

Its statistics are per sample and group of ``per`` consecutive channels, over the group's channels and every
position. A tile holds samples ``[n0, n1)``, channels ``[c0, c1)`` and a box of positions; it touches the groups
``c0 // per`` to ``ceil(c1 / per)``. Tiles of the same samples whose channels touch a common group must add their
partial sums; joined transitively (a split of ``c`` that cuts groups chains its parts), they form a *component*,
which sums on its own. A tile that holds whole groups at every position is a component of one: it communicates
nothing. (Batch norm's statistics, per channel over samples and positions, are summed over the replica group
instead: the tiles of the same channels.)
"""

from typing import NamedTuple


class StatisticsSite(NamedTuple):
    """One tile's place: the sorted devices it adds its sums with (itself included) and ``(g0, g1)``, the groups
    of the component (the columns of the table they sum)."""

    component: tuple
    groups: tuple


def touched_groups(c0, c1, per):
    """The groups ``[g0, g1)`` channels ``[c0, c1)`` belong to."""
    return c0 // per, -(-c1 // per)


def statistics_components(config, shape, per):
    """``{device: StatisticsSite}`` of a normalisation over the output ``shape`` (N, C, S...) with ``per`` channels
    per group under ``config``."""
    tiles = dict(config.tiles(shape))
    by_samples = {}
    for device, index in zip(config.devices, config.indices()):
        by_samples.setdefault(index[0], []).append(device)
    found = {}
    for members in by_samples.values():
        # the channel parts, merged where their groups overlap (parts are consecutive, so a chain is a run)
        parts = sorted({tiles[d][1] for d in members})
        runs, current = [], None
        for c0, c1 in parts:
            g0, g1 = touched_groups(c0, c1, per)
            if current is not None and g0 < current[1]:
                current = (current[0], max(current[1], g1))
            else:
                current = (g0, g1)
                runs.append(current)
            runs[-1] = current
        for run in runs:
            component = tuple(sorted(d for d in members
                                     if run[0] <= touched_groups(*tiles[d][1], per)[0] < run[1]))
            for device in component:
                found[device] = StatisticsSite(component, run)
    return found
