"""Which tiles of a normalisation add up their statistics, and how many numbers each adds.

Its statistics are per sample and group of ``per`` consecutive channels, over the group's channels and every
position. A tile holds samples ``[n0, n1)``, channels ``[c0, c1)`` and a box of positions; it touches the groups
``c0 // per`` to ``ceil(c1 / per)``. Tiles of the same samples whose channels touch a common group must add their
partial sums; joined transitively (a split of ``c`` that cuts groups chains its parts), they form a *component*,
which sums on its own. A tile that holds whole groups at every position is a component of one: it communicates
nothing. Layer norm's statistics are per sample and position, over the channels: the tiles of the same samples
and positions (those that differ in their channels alone) add theirs. (Batch norm's statistics, per channel over
samples and positions, are summed over the replica group instead: the tiles of the same channels.)
"""

from math import prod
from typing import NamedTuple

from ..graph.optable import STATISTICS_GROUPS, group_channels


class StatisticsSite(NamedTuple):
    """One tile's place: the sorted devices it adds its sums with (itself included) and ``(g0, g1)``, the groups
    of the component (the columns of the table they sum; None for layer norm, whose table is the tile's samples
    and positions)."""

    component: tuple
    groups: tuple


def shared_statistics(layer, config, shape):
    """``{device: StatisticsSite}`` of the normalisation ``layer`` (the op table's ``statistics``) under
    ``config`` over its output ``shape`` (N, C, S...)."""
    if layer.spec.statistics == STATISTICS_GROUPS:
        return statistics_components(config, shape, group_channels(layer))
    by_place = {}
    for device, index in zip(config.devices, config.indices()):
        by_place.setdefault(tuple(index[:1]) + tuple(index[2:]), []).append(device)
    return {device: StatisticsSite(tuple(sorted(members)), None)
            for members in by_place.values() for device in members}


def table_size(layer, place, box):
    """Numbers per sum a tile of output ``box`` at ``place`` adds with its component: a float64 per sample and
    group of the component, or (layer norm) per sample and position of the tile."""
    samples = box[0][1] - box[0][0]
    if layer.spec.statistics == STATISTICS_GROUPS:
        return samples * (place.groups[1] - place.groups[0])
    return samples * prod(hi - lo for lo, hi in box[2:])


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
