"""``t_s``: the allreduces a layer's configuration costs.

Devices holding the same channel part of a layer hold the same parameter shard: each such replica group sums its
gradients with one allreduce (the library's algorithm for the size over the group's level: :class:`Regimes`), or
on a machine of ``sync: parameter-server`` through the group's server (:class:`ParameterServer`). Batchnorm
combines its statistics over the group: forward gathers every tile's count, mean and M2 per channel (three
float64 each), backward sums two float64 per channel. Group and instance norm sum theirs over the tiles of the same
samples that share groups, layer norm over the tiles of the same samples and positions
(:meth:`SyncModel.statistics`). The groups of a layer run at once; the layer waits for
the slowest.
"""

from dataclasses import dataclass
from math import prod

from ..tiling.boxes import part

STAT_BYTES = 8      # batchnorm's statistics are float64 whatever the activations


@dataclass(frozen=True)
class Sync:
    seconds: float
    bytes: float        # bytes all devices contribute to the allreduces, or push and pull through servers (as the
                        # runtime counts them)
    points: int = 0     # allreduces a device waits in (each a point where the ranks synchronize)
    forward: float = 0.0    # the part of ``seconds`` spent in forward (batchnorm's gather)
    gradient: float = 0.0   # the part of ``seconds`` that sums parameter gradients (ghost batch norm's)


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
        # elements per output channel (a grouped transposed convolution's weight holds C_in x k per group's channel)
        per_row = sum(prod(shape) // channels for name, shape in layer.params.items())
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
        seconds, nbytes, forward = 0.0, 0, 0.0
        for rows, size, regimes, summer, count in groups:
            if size < 2:
                continue
            if batchnorm:
                # forward: every tile's count, mean and M2 gathered; backward: two sums (float64 per channel)
                gather = regimes.allgather(size, 3 * rows * STAT_BYTES)
                time = gather + regimes.allreduce(size, 2 * rows * STAT_BYTES)
                forward = max(forward, gather)
                contributed = 5 * rows * STAT_BYTES
            else:
                gradients = rows * per_row * max(itemsize, 4)       # float32 master gradients under bfloat16
                time = summer.allreduce(size, gradients)
                contributed = gradients * summer.ways                # a server's: pushed and pulled
            seconds = max(seconds, time)
            nbytes += count * size * contributed
        points = (2 if batchnorm else 1) if nbytes else 0
        return Sync(seconds, float(nbytes), points, forward)     # bytes: an integer far below 2**53, exact

    def ghost(self, layer, config, batch, group):
        """The :class:`Sync` of a batchnorm ``layer`` under ghost batch norm (groups of ``group`` samples;
        :mod:`spmdcnn.tiling.ghost`): each component of tiles sharing groups gathers their count, mean and M2 per
        group and channel in forward and sums two values per group and channel in backward; a replica group
        split into several components also sums gamma's and beta's gradients with the other parameters and, off
        the critical path, its running statistics (two float64 per channel)."""
        from ..tiling.config import output_shape
        from ..tiling.ghost import components
        shape = output_shape(layer, batch)
        key = ("ghost", config.degrees, config.devices, shape, group)
        found = self._syncs.get(key)
        if found is not None:
            return found
        sites = components(config, shape, group)
        c_degree = config.degrees[1] if len(config.degrees) > 1 else 1
        channel = {device: part(shape[1], c_degree, index[1] if len(index) > 1 else 0)
                   for device, index in zip(config.devices, config.indices())}
        seconds = forward = gradient = 0.0
        nbytes, points = 0, 0
        for device, site in sites.items():
            lo, hi = channel[device]
            rows, groups, size = hi - lo, site.groups[1] - site.groups[0], len(site.component)
            if size > 1:
                regimes = self.machine.regimes(site.component)
                gather = regimes.allgather(size, 3 * groups * rows * STAT_BYTES)
                total = gather + regimes.allreduce(size, 2 * groups * rows * STAT_BYTES)
                seconds, forward = max(seconds, total), max(forward, gather)
                nbytes += 5 * groups * rows * STAT_BYTES
                points = 2
            if not site.whole:
                replicas = next(g for g in config.replicas().values() if device in g)
                params = 2 * rows * max(self.itemsize, 4)      # float32 master gradients under bfloat16
                summer = self.machine.gradient_sum(replicas)
                gradient = max(gradient, summer.allreduce(len(replicas), params))
                nbytes += params * summer.ways + 2 * rows * STAT_BYTES      # gamma's and beta's; running statistics
        found = self._syncs[key] = Sync(seconds + gradient, float(nbytes), points, forward, gradient)
        return found

    def statistics(self, layer, config, batch):
        """The :class:`Sync` of a group, instance or layer normalisation ``layer`` (:mod:`spmdcnn.tiling.statistics`):
        each component of tiles sharing statistics sums its table (a float64 per sample and group, or per sample
        and position) twice in forward (the means, then the centred squares) and once backward (two tables in one
        sum); its parameter gradients are summed over the replica groups as any layer's (``gradient``)."""
        from ..graph.optable import group_channels
        from ..tiling.config import output_shape
        from ..tiling.statistics import shared_statistics, table_size
        shape = output_shape(layer, batch)
        key = ("statistics", layer.spec.statistics, config.degrees, config.devices, shape, group_channels(layer),
               layer.out_shape[0], tuple(layer.params.items()))
        found = self._syncs.get(key)
        if found is not None:
            return found
        tiles = dict(config.tiles(shape))
        seconds = forward = 0.0
        nbytes = 0
        for device, place in shared_statistics(layer, config, shape).items():
            size = len(place.component)
            if size < 2:
                continue
            table = table_size(layer, place, tiles[device]) * STAT_BYTES
            regimes = self.machine.regimes(place.component)
            first = 2 * regimes.allreduce(size, table)
            seconds, forward = max(seconds, first + regimes.allreduce(size, 2 * table)), max(forward, first)
            nbytes += 4 * table
        params = self.layer(layer, config)
        found = self._syncs[key] = Sync(seconds + params.seconds, float(nbytes) + params.bytes,
                                        (3 if nbytes else 0) + params.points, forward, params.seconds)
        return found

    def groups(self, config, channels):
        """``config``'s replica groups for a layer with ``channels`` output channels, alike ones once, and a
        number for that set of groups: ``(number, ((rows, size, regimes, summer, count), ...))``, ``count`` groups
        of ``size`` devices that hold ``rows`` channels each, allreduce as ``regimes`` (the machine's
        :class:`~spmdcnn.cost.machine.Regimes` of the group's level) and sum gradients as ``summer``
        (:meth:`~spmdcnn.cost.machine.Machine.gradient_sum`)."""
        key = (config.degrees, config.devices, channels)
        found = self._groups.get(key)
        if found is None:
            c_degree = config.degrees[1] if len(config.degrees) > 1 else 1
            alike = {}
            for index, size, regimes, summer in self._replicas(config):
                lo, hi = part(channels, c_degree, index)
                kind = (hi - lo, size, regimes, summer)
                alike[kind] = alike.get(kind, 0) + 1
            groups = tuple(kind + (count,) for kind, count in alike.items())
            found = self._groups[key] = self._distinct.setdefault(groups, (len(self._distinct), groups))
        return found

    def _replicas(self, config):
        """``(channel part, size, regimes, summer)`` of each replica group of ``config``."""
        key = (config.degrees, config.devices)
        if key not in self._rings:
            self._rings[key] = [(index, len(group), self.machine.regimes(group), self.machine.gradient_sum(group))
                                for index, group in config.replicas().items()]
        return self._rings[key]
