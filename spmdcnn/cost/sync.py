"""``t_s``: the allreduces a layer's configuration costs.

Devices holding the same channel part of a layer hold the same parameter shard: each such replica group sums its
gradients with one allreduce (a ring over the group, with the slowest link's bandwidth and latency). Batchnorm
also sums its statistics over the group: two allreduces of one value per channel forward, one of two values per
channel backward. The groups of a layer run at once; the layer waits for the slowest.
"""

from dataclasses import dataclass
from math import prod

from ..tiling.boxes import part
from .machine import ring_time


@dataclass(frozen=True)
class Sync:
    seconds: float
    bytes: float        # bytes all devices contribute to the allreduces (as the runtime counts them)
    points: int = 0     # allreduces a device waits in (each a point where the ranks synchronize)


def layer_sync(layer, config, machine, itemsize=4):
    """The :class:`Sync` of ``layer`` under ``config``."""
    return SyncModel(machine, itemsize).layer(layer, config)


NO_SYNC = Sync(0.0, 0.0)


class SyncModel:
    """:func:`layer_sync` on one machine. It remembers each configuration's replica groups, and the sync of each
    kind of layer (batchnorm or not, channels, parameters per channel) for each set of alike groups."""

    def __init__(self, machine, itemsize=4):
        self.machine, self.itemsize = machine, itemsize
        self._rings = {}
        self._groups = {}
        self._distinct = {}
        self._syncs = {}

    def layer(self, layer, config):
        """The :class:`Sync` of ``layer`` under ``config``."""
        return self.layers(layer, [config])[0]

    def layers(self, layer, configs):
        """The :class:`Sync` of ``layer`` under each of ``configs``."""
        if not layer.params and not layer.buffers:
            return [NO_SYNC] * len(configs)
        batchnorm, channels = layer.spec.reduced_in_layer, layer.out_shape[0]
        per_row = sum(prod(shape[1:]) for shape in layer.params.values())
        known = self._syncs.get((batchnorm, channels, per_row))
        if known is None:
            known = self._syncs[batchnorm, channels, per_row] = {}
        result = []
        for config in configs:
            number, groups = self.groups(config, channels)
            sync = known.get(number)
            if sync is None:
                sync = known[number] = self._sync(batchnorm, per_row, groups)
            result.append(sync)
        return result

    def _sync(self, batchnorm, per_row, groups):
        itemsize = self.itemsize
        seconds, nbytes = 0.0, 0
        for rows, size, link, count in groups:
            if batchnorm:
                stats = 4 * rows       # forward: mean, then variance (one per channel each); backward: two sums
                time = ring_time(size, link, rows * itemsize) * 2 + ring_time(size, link, 2 * rows * itemsize)
                contributed = stats
            else:
                values = rows * per_row
                time = ring_time(size, link, values * itemsize)
                contributed = values
            seconds = max(seconds, time)
            if size > 1:
                nbytes += count * size * contributed * itemsize
        points = (3 if batchnorm else 1) if nbytes else 0
        return Sync(seconds, float(nbytes), points)       # an integer far below 2**53: exact as a float

    def groups(self, config, channels):
        """``config``'s replica groups for a layer with ``channels`` output channels, alike ones once, and a
        number for that set of groups: ``(number, ((rows, size, link, count), ...))``, ``count`` groups of
        ``size`` devices that hold ``rows`` channels each and allreduce over a ring whose slowest link is
        ``link``."""
        key = (config.degrees, config.devices, channels)
        found = self._groups.get(key)
        if found is None:
            c_degree = config.degrees[1] if len(config.degrees) > 1 else 1
            alike = {}
            for index, size, link in self._replicas(config):
                lo, hi = part(channels, c_degree, index)
                alike[hi - lo, size, link] = alike.get((hi - lo, size, link), 0) + 1
            groups = tuple(kind + (count,) for kind, count in alike.items())
            found = self._groups[key] = self._distinct.setdefault(groups, (len(self._distinct), groups))
        return found

    def _replicas(self, config):
        """``(channel part, size, slowest link)`` of each replica group of ``config``."""
        key = (config.degrees, config.devices)
        if key not in self._rings:
            self._rings[key] = [(index, len(group), self.machine.ring_link(group))
                                for index, group in config.replicas().items()]
        return self._rings[key]
