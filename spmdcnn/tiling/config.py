"""A layer's parallel configuration: a degree per dimension of its output, and the devices holding the tiles.

Which dimensions an op may split (docs/architecture.md#layer-wise-parallelism): outputs with spatial axes (conv,
pooling, batchnorm, element-wise, concat, add) ``n, c`` and their spatial axes, ``d, h, w`` for volumes, ``h, w``
for images, ``w`` for sequences; flatten ``n``; linear ``n, c``; the loss ``n`` (its tiles are the per-sample
losses), and a loss per position its spatial axes too. The tile with multi-index ``(i_n, i_c, i_d, i_h, i_w)`` (as many as the output has dimensions) lives on
``devices[row-major index]``.
"""

import functools
from dataclasses import dataclass
from itertools import product

from ..graph.optable import channels_whole, output_grain
from ..io.samples import AXES, axis_names
from .boxes import part

SPATIAL = AXES                        # the spatial axes' names: a tensor with fewer has the last ones
NAMES = ("n", "c") + SPATIAL          # every dimension a tensor may have, in tensor order


def names_of(rank):
    """The names of the dimensions of a tensor of ``rank`` dimensions (the batch included), in tensor order:
    ``n`` for the loss's, ``n, c`` for features, then ``w``, ``h, w`` or ``d, h, w`` for 1 to 3 spatial axes."""
    return NAMES[:min(rank, 2)] + axis_names(max(rank - 2, 0))


def dims_of(layer):
    """The dimensions of ``layer``'s output that a configuration may split, in tensor order: all of them, except
    where the op table's ``splits`` names fewer (flatten and a loss per sample split only ``n``)."""
    names = names_of(1 + len(layer.out_shape))
    if layer.spec.splits is not None:
        return tuple(name for name in names if name in layer.spec.splits)
    return names


def keeps_groups(layer, degree):
    """Whether splitting ``layer``'s output channels ``degree`` ways keeps its groups whole (a grouped convolution's
    parts must: the op table's ``grouped``; any split does for other ops): every part's bounds fall on a group's.
    A grouped transposed convolution splits none (``graph/optable.channels_whole``)."""
    if channels_whole(layer):
        return degree == 1
    grain = output_grain(layer)
    return grain == 1 or all(part(layer.out_shape[0], degree, i)[0] % grain == 0 for i in range(1, degree))


def output_shape(layer, batch):
    """The global output shape a configuration of ``layer`` splits: ``(N, C, S...)`` (``(N, C, H, W)`` for images),
    ``(N, F)`` for flatten and linear, ``(N,)`` for a loss per sample, ``(N, 1, S...)`` for one per position."""
    return (batch,) + tuple(layer.out_shape)


SHORT_DEVICES = 6       # device lists longer than this are abbreviated for people (describe(short=True))


class Devices(tuple):
    """A tuple of device numbers that works out its hash once: the cost model and the planner key their tables by
    configurations of up to thousands of devices, and a tuple hashes all its items every time. Equal to, and
    hashing as, the plain tuple."""

    def __hash__(self):
        try:
            return self._hash
        except AttributeError:
            self._hash = tuple.__hash__(self)
            return self._hash


@functools.lru_cache(maxsize=64)
def device_range(count):
    """Devices ``0 .. count-1``, one :class:`Devices` per count (configurations on them share it)."""
    return Devices(range(count))


@dataclass(frozen=True)
class ParallelConfig:
    """``degrees``, one per dimension of the output (1 where the op may not split), and one device per tile."""

    degrees: tuple
    devices: tuple

    @property
    def size(self):
        return len(self.devices)

    def indices(self):
        """Tile multi-indices in row-major order (the order of ``devices``)."""
        return product(*(range(d) for d in self.degrees))

    def tiles(self, shape):
        """``[(device, box)]`` for every tile of a tensor of ``shape``."""
        return [(device, self.box(shape, index)) for device, index in zip(self.devices, self.indices())]

    def box(self, shape, index):
        return tuple(part(extent, degree, i) for extent, degree, i in zip(shape, self.degrees, index))

    def tile_of(self, device, shape):
        """The box ``device`` holds, or None."""
        for holder, box in self.tiles(shape):
            if holder == device:
                return box
        return None

    def index_of(self, device):
        for holder, index in zip(self.devices, self.indices()):
            if holder == device:
                return index
        return None

    @property
    def names(self):
        """Its dimensions' names (:func:`names_of`)."""
        return names_of(len(self.degrees))

    def replicas(self, channel_axis=1):
        """Devices grouped by the channel part they hold: ``{i_c: [devices]}`` (all devices when c is not split).

        Devices in one group hold the same parameter shard (split along c) and the same channels for batchnorm
        statistics."""
        groups = {}
        for device, index in zip(self.devices, self.indices()):
            key = index[channel_axis] if len(index) > channel_axis else 0
            groups.setdefault(key, []).append(device)
        return groups

    def describe(self, short=False):
        """The configuration in plan YAML's flow style: ``{n: 2, h: 2, devices: [0, 1, 2, 3]}``; ``short``, for
        people, abbreviates a long device list: ``[0, 1, 2, ..., 15]`` for a run of consecutive devices,
        ``[7, 3, 5, ... (64 devices)]`` otherwise."""
        text = ", ".join(f"{d}: {k}" for d, k in zip(self.names, self.degrees) if k != 1) or "n: 1"
        devices = list(self.devices)
        if short and len(devices) > SHORT_DEVICES:
            run = devices == list(range(devices[0], devices[0] + len(devices)))
            tail = f"..., {devices[-1]}" if run else f"... ({len(devices)} devices)"
            listed = ", ".join(map(str, devices[:3])) + ", " + tail
        else:
            listed = ", ".join(map(str, devices))
        return f"{{{text}, devices: [{listed}]}}"
