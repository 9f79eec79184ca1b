"""``t_s``: the allreduces a layer's configuration costs.

Devices holding the same channel part of a layer hold the same parameter shard: each such replica group sums its
gradients with one allreduce (a ring over the group, with the slowest link's bandwidth and latency). Batchnorm
also sums its statistics over the group: two allreduces of one value per channel forward, one of two values per
channel backward. The groups of a layer run at once; the layer waits for the slowest.
"""

from dataclasses import dataclass
from math import prod

from ..tiling.boxes import part


@dataclass(frozen=True)
class Sync:
    seconds: float
    bytes: float        # bytes all devices contribute to the allreduces (as the runtime counts them)
    points: int = 0     # allreduces a device waits in (each a point where the ranks synchronize)


def layer_sync(layer, config, machine, itemsize=4):
    """The :class:`Sync` of ``layer`` under ``config``."""
    if not layer.params and not layer.buffers:
        return Sync(0.0, 0.0)
    groups = config.replicas()
    channels = layer.out_shape[0]
    c_degree = config.degrees[1] if len(config.degrees) > 1 else 1
    seconds = nbytes = 0.0
    for index, group in groups.items():
        lo, hi = part(channels, c_degree, index)
        rows = hi - lo
        values = sum(rows * prod(shape[1:]) for shape in layer.params.values())
        if layer.op == "batchnorm2d":
            stats = 4 * rows           # forward: mean, then variance (one per channel each); backward: two sums
            time = (machine.allreduce_time(group, rows * itemsize) * 2
                    + machine.allreduce_time(group, 2 * rows * itemsize))
            contributed = stats
        else:
            time = machine.allreduce_time(group, values * itemsize)
            contributed = values
        seconds = max(seconds, time)
        if len(group) > 1:
            nbytes += len(group) * contributed * itemsize
    points = (3 if layer.op == "batchnorm2d" else 1) if nbytes else 0
    return Sync(seconds, nbytes, points)
