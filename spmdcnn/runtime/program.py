"""One rank's share of a plan: for each layer the tile it computes (if any), the input boxes that tile reads, the
exchange that brings them, and the parameter shard it holds.

Parameters are split along ``c`` like the layer's output: a conv weight ``(K, C, kH, kW)`` tile holds rows
``[c0, c1)``, a linear weight ``(F_out, F_in)`` likewise, batchnorm its channels. The ranks holding the same
channel part form the layer's replica group: their gradients are summed with one allreduce per group (the
shards of all layers with the same group lie side by side in the flat gradient array), and batchnorm sums its
statistics over it.
"""

from dataclasses import dataclass

from ..comm import Exchange, ReplicaGroups
from ..graph.blocks import DATA
from ..tiling.config import output_shape
from ..tiling.fields import NO_PADDING
from ..tiling.transfers import layer_transfers, tile_needs

REDUCED_IN_LAYER = ("batchnorm2d",)     # their parameter gradients come out of the layer already summed


@dataclass
class Site:
    """What this rank does for one layer. ``box`` is None when it holds no tile (it may still send inputs)."""

    layer: object
    box: tuple = None
    needs: list = None
    exchange: object = None
    group: tuple = ()
    reduce: object = None
    global_shape: tuple = ()
    exchanged: dict = None      # {slot: Need} of the inputs the exchange brings (not read from the data)
    input_tiles: dict = None    # {slot: box} of this rank's tiles of the layer's producers

    @property
    def start(self):
        return tuple(lo for lo, _ in self.box)

    @property
    def padding(self):
        return self.needs[0].padding if self.needs else NO_PADDING

    def stride(self, stride):
        """The window stride this tile applies: 1 along a strided read, whose rows arrive subsampled."""
        return self.needs[0].stride(stride) if self.needs else stride

    @property
    def channels(self):
        """The output channel (feature) range of the tile: the parameter shard's rows."""
        return self.box[1] if len(self.box) > 1 else (0, 1)

    @property
    def count(self):
        """Values per channel over the global tensor (batchnorm's M = N*H*W)."""
        N, _, H, W = self.global_shape
        return N * H * W

    @property
    def total(self):
        """The global batch (the loss divides by it)."""
        return self.global_shape[0]


class Program:
    """This rank's :class:`Site` per layer, its replica groups, and the layout of its parameter shards:
    ``param_shapes``/``buffer_shapes`` (flat-store order), ``shards`` (rows of each global tensor), ``owners``
    (each shard's replica group) and ``buckets`` (the gradient slices summed over each group)."""

    def __init__(self, graph, plan, world, dtype, xp):
        self.graph, self.plan, self.world = graph, plan, world
        rank = world.rank
        self.sites = {}
        rank_sets = []
        for layer in graph.layers:
            config = plan[layer.name]
            shape = output_shape(layer, plan.batch)
            replicas = [tuple(sorted(g)) for g in config.replicas().values()]
            needs = tile_needs(plan, layer)
            site = Site(layer, global_shape=shape, box=config.tile_of(rank, shape), exchanged={},
                        input_tiles={slot: self.sites[ref].box for slot, ref in enumerate(layer.inputs)
                                     if ref != DATA and self.sites[ref].box is not None})
            if any(ref != DATA for ref in layer.inputs):
                site.exchange = Exchange(world, layer_transfers(plan, layer, needs), dtype, xp)
            if site.box is not None:
                site.needs = needs[rank]
                site.exchanged = {slot: need for slot, (ref, need) in enumerate(zip(layer.inputs, site.needs))
                                  if ref != DATA}
                site.group = next(g for g in replicas if rank in g)
            if layer.params or layer.buffers:
                rank_sets += replicas
            self.sites[layer.name] = site
        self.groups = ReplicaGroups(world, rank_sets)
        for site in self.sites.values():
            if site.box is not None and site.layer.op in REDUCED_IN_LAYER:
                site.reduce = self.groups.reducer(site.group)       # the identity for a group of one
        self._layout()

    def _layout(self):
        """Shard shapes, grouped so that each replica group's allreduced gradients are one contiguous slice."""
        entries = []
        for order, layer in enumerate(self.graph.layers):
            site = self.sites[layer.name]
            if site.box is None:
                continue
            c0, c1 = site.channels
            for kind, shape in list(layer.params.items()) + list(layer.buffers.items()):
                reduced = layer.op in REDUCED_IN_LAYER or kind in layer.buffers
                entries.append(((site.group, reduced, order), f"{layer.name}.{kind}", kind in layer.params,
                                (c1 - c0,) + tuple(shape[1:]), (c0, c1)))
        entries.sort(key=lambda e: e[0])
        self.param_shapes = {name: shape for _, name, is_param, shape, _ in entries if is_param}
        self.buffer_shapes = {name: shape for _, name, is_param, shape, _ in entries if not is_param}
        self.shards = {name: rows for _, name, _, _, rows in entries}
        self.owners = {name: key[0] for key, name, *_ in entries}
        # the slices of the flat gradient array to sum over each group: (group, first name, last name)
        self.buckets = []
        for key, name, is_param, _, _ in entries:
            group, reduced, _ = key
            if not is_param or reduced or len(group) < 2:
                continue
            if self.buckets and self.buckets[-1][0] == group:
                self.buckets[-1][2] = name
            else:
                self.buckets.append([group, name, name])

    def representative(self, name):
        """Whether this rank writes ``name``'s shard into a checkpoint (the lowest rank of its replica group)."""
        return self.world.rank == self.owners[name][0]

    def global_shape(self, name):
        layer_name, kind = name.rsplit(".", 1)
        layer = self.graph.by_name[layer_name]
        return tuple(layer.params.get(kind, layer.buffers.get(kind)))
