"""One rank's share of a plan, built once: for each layer the tile it computes (if any) as a bound kernel, the input
boxes that tile reads, the exchange that brings them, its replica group, and where its parameter shards lie.

Parameters are split along ``c`` like the layer's output: a conv weight ``(K, C, kH, kW)`` tile holds rows
``[c0, c1)``, a linear weight ``(F_out, F_in)`` likewise, batchnorm its channels. The ranks holding the same
channel part form the layer's replica group: their gradients are summed with one allreduce per group (the
shards of all layers with the same group lie side by side in the flat gradient array: one :class:`Bucket`), and
batchnorm sums its statistics over it.
"""

from dataclasses import dataclass
from typing import NamedTuple

from ..comm import Exchange, ReplicaGroups
from ..graph.blocks import DATA
from ..ops.add import accumulate
from ..tiling.config import output_shape
from ..tiling.transfers import layer_transfers, tile_needs
from .kernels import Tile, TileKernel, Views
from .params import flat_offsets


@dataclass
class Site:
    """What this rank does for one layer. ``box`` is None when it holds no tile (it may still send inputs)."""

    layer: object
    box: tuple = None
    needs: list = None
    exchange: object = None
    group: tuple = ()
    global_shape: tuple = ()
    exchanged: dict = None      # {slot: Need} of the inputs the exchange brings (not read from the data)
    input_tiles: dict = None    # {slot: box} of this rank's tiles of the layer's producers
    reduce: object = None       # the sum over the replica group, for a layer that sums inside (batchnorm)
    kernel: TileKernel = None   # the bound kernel of the tile (:meth:`Program.bind`)
    bucket: object = None       # the Bucket its parameter gradients are summed in (None: not summed after backward)
    grad_slots: frozenset = frozenset()     # the inputs whose gradients backward sends back (Layer.input_grads)

    @property
    def channels(self):
        """The output channel (feature) range of the tile: the parameter shard's rows."""
        return self.box[1] if len(self.box) > 1 else (0, 1)

    def tile(self):
        """The :class:`~spmdcnn.runtime.kernels.Tile` its kernel is bound to."""
        return Tile(self.global_shape, self.box, self.needs[0] if self.needs else None, self.reduce)


@dataclass(frozen=True)
class Shard:
    """This rank's rows of one parameter or buffer, and where they lie in its flat store."""

    name: str           # "<layer>.<kind>"
    layer: str
    kind: str
    param: bool         # a parameter (else a buffer)
    shape: tuple        # the shard's shape
    rows: tuple         # (c0, c1) of the global tensor
    group: tuple        # the replica group holding the same rows
    start: int          # its slice of the flat parameter (or buffer) array
    stop: int


class Bucket(NamedTuple):
    """One allreduce of the flat gradient array's ``[start, stop)`` over the replica group ``ranks``."""

    ranks: tuple
    reduce: object      # sums a contiguous array over the group, in place
    start: int
    stop: int


class Program:
    """This rank's :class:`Site` per layer (in execution order), its replica groups, the :class:`Shard` of every
    parameter and buffer it holds (``layout``, in flat-store order) and the gradient :class:`Bucket` list."""

    def __init__(self, graph, plan, world, dtype, xp):
        self.graph, self.plan, self.world = graph, plan, world
        rank = world.rank
        self.sites = {}
        rank_sets = []
        for layer in graph.layers:
            config = plan[layer.name]
            replicas = [tuple(sorted(g)) for g in config.replicas().values()]
            needs = tile_needs(plan, layer)
            shape = output_shape(layer, plan.batch)
            site = Site(layer, global_shape=shape, box=config.tile_of(rank, shape), exchanged={},
                        grad_slots=frozenset(slot for slot, needed in enumerate(layer.input_grads) if needed),
                        input_tiles={slot: self.sites[ref].box for slot, ref in enumerate(layer.inputs)
                                     if ref != DATA and self.sites[ref].box is not None})
            if any(ref != DATA for ref in layer.inputs):
                site.exchange = Exchange(world, layer_transfers(plan, layer, needs), dtype, xp, accumulate=accumulate)
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
            if site.box is not None and site.layer.spec.reduced_in_layer:
                site.reduce = self.groups.reducer(site.group)       # the identity for a group of one
        self.layout = self._layout()
        self.buckets = self._buckets()
        for site in self.sites.values():
            if site.box is not None and site.layer.params:
                first = self.layout[f"{site.layer.name}.{next(iter(site.layer.params))}"]
                site.bucket = next((b for b in self.buckets if b.start <= first.start < b.stop), None)

    def _layout(self):
        """``{name: Shard}``, grouped so that each replica group's allreduced gradients are one contiguous slice:
        by group, then those summed in the layer (or buffers) last, then in the model's order."""
        entries = []
        for order, layer in enumerate(self.graph.layers):
            site = self.sites[layer.name]
            if site.box is None:
                continue
            c0, c1 = site.channels
            for kind, shape in list(layer.params.items()) + list(layer.buffers.items()):
                reduced = layer.spec.reduced_in_layer or kind in layer.buffers
                entries.append(((site.group, reduced, order), layer, kind, (c1 - c0,) + tuple(shape[1:]), (c0, c1)))
        entries.sort(key=lambda entry: entry[0])
        shapes = {param: {f"{layer.name}.{kind}": shape for _, layer, kind, shape, _ in entries
                          if (kind in layer.params) == param} for param in (True, False)}
        offsets = {param: flat_offsets(shapes[param]) for param in (True, False)}      # as the FlatStores lay out
        layout = {}
        for (group, _, _), layer, kind, shape, rows in entries:
            name, param = f"{layer.name}.{kind}", kind in layer.params
            layout[name] = Shard(name, layer.name, kind, param, shape, rows, group, *offsets[param][name])
        return layout

    def _buckets(self):
        """The slices of the flat gradient array each replica group sums: one per group, the parameters a layer
        sums itself (batchnorm's) left out."""
        buckets = []
        for shard in self.layout.values():
            layer = self.graph.by_name[shard.layer]
            if not shard.param or layer.spec.reduced_in_layer or len(shard.group) < 2:
                continue
            if buckets and buckets[-1].ranks == shard.group and buckets[-1].stop == shard.start:
                buckets[-1] = buckets[-1]._replace(stop=shard.stop)
            else:
                buckets.append(Bucket(shard.group, self.groups.reducer(shard.group), shard.start, shard.stop))
        return buckets

    def shapes(self, param):
        """``{name: shard shape}`` of the parameters (``param``) or buffers, in flat-store order."""
        return {name: shard.shape for name, shard in self.layout.items() if shard.param == param}

    def bind(self, params, grads, buffers, seed, overwritable):
        """Bind every tile's kernel to the flat stores' views (``params``, ``grads``, ``buffers``: FlatStores
        laid out by :meth:`shapes`); ``overwritable``: ``{layer: input it may overwrite, or None}``."""
        for site in self.sites.values():
            if site.box is None:
                continue
            layer = site.layer
            views = Views({kind: params[f"{layer.name}.{kind}"] for kind in layer.params},
                          {kind: grads[f"{layer.name}.{kind}"] for kind in layer.params},
                          {kind: buffers[f"{layer.name}.{kind}"] for kind in layer.buffers})
            site.kernel = TileKernel(layer, site.tile(), views, overwritable[layer.name], seed)

    def representative(self, name):
        """Whether this rank writes ``name``'s shard into a checkpoint (the lowest rank of its replica group)."""
        return self.world.rank == self.layout[name].group[0]

    def global_shape(self, name):
        layer_name, kind = name.rsplit(".", 1)
        layer = self.graph.by_name[layer_name]
        return tuple(layer.params.get(kind, layer.buffers.get(kind)))
