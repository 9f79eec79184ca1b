"""One rank's share of a plan, built once: for each layer the tile it computes (if any) as a bound kernel, the input
boxes that tile reads, the exchange that brings them, its replica group, and where its parameter shards lie.

Parameters are split along ``c`` like the layer's output: a conv weight ``(K, C, k...)`` tile holds rows
``[c0, c1)``, a linear weight ``(F_out, F_in)`` likewise, batchnorm its channels. The ranks holding the same
channel part form the layer's replica group: batchnorm sums its statistics over it, and the group's gradients are
summed in buckets (:mod:`spmdcnn.cost.buckets`): the shards of all layers with the same group lie side by side in
the flat gradient array, so each :class:`Bucket` is one slice of it, allreduced once the backward of the earliest
layer it holds has run.
"""

from dataclasses import dataclass
from math import prod
from typing import NamedTuple

from .. import backend
from ..comm import Exchange, ReplicaGroups
from ..cost.buckets import SyncOptions, assign
from ..graph.blocks import DATA
from ..ops.add import accumulate
from ..tiling.config import output_shape
from ..tiling.transfers import layer_transfers, tile_needs
from ..tiling.ghost import components
from ..tiling.statistics import shared_statistics
from .kernels import Ghost, Tile, TileKernel, Views
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
    gather: object = None       # the arrays of the replica group stacked, likewise
    ghost: object = None        # ghost batch norm's Ghost (runtime.kernels) instead of reduce and gather
    statistics: tuple = None    # group norm: the groups whose sums ``reduce`` adds (tiling.statistics; else None)
    kernel: TileKernel = None   # the bound kernel of the tile (:meth:`Program.bind`)
    grad_slots: frozenset = frozenset()     # the inputs whose gradients backward sends back (Layer.input_grads)

    @property
    def channels(self):
        """The output channel (feature) range of the tile: the parameter shard's rows."""
        return self.box[1] if len(self.box) > 1 else (0, 1)

    def tile(self):
        """The :class:`~spmdcnn.runtime.kernels.Tile` its kernel is bound to."""
        return Tile(self.global_shape, self.box, self.needs[0] if self.needs else None, self.reduce, self.gather,
                    self.ghost, self.statistics)


@dataclass(frozen=True)
class Shard:
    """This rank's rows of one parameter or buffer, and where they lie in its flat store."""

    name: str           # "<layer>.<kind>"
    layer: str
    kind: str
    param: bool         # a parameter (else a buffer)
    shape: tuple        # the shard's shape
    rows: tuple         # (c0, c1) of the global tensor along ``axis``
    group: tuple        # the replica group holding the same rows
    start: int          # its slice of the flat parameter (or buffer) array
    stop: int
    axis: int = 0       # the axis of the output channels (Layer.param_axis)

    @property
    def index(self):
        """The slices of the global tensor it holds."""
        return (slice(None),) * self.axis + (slice(*self.rows),)


class Bucket(NamedTuple):
    """One allreduce of the flat gradient array's ``[start, stop)`` over the replica group ``ranks``, ready once
    the backward of the layer ``ready`` has run."""

    ranks: tuple
    start_sum: object   # starts summing a contiguous array over the group in place: an InFlight (comm.world)
    start: int
    stop: int
    ready: str


class Program:
    """This rank's :class:`Site` per layer (in execution order), its replica groups, the :class:`Shard` of every
    parameter and buffer it holds (``layout``, in flat-store order), the gradient :class:`Bucket` list in the
    order backward makes them ready (``ready``: ``{layer: buckets ready after its backward}``), and the slices of
    the flat gradient array no bucket sums (``local``). ``sync``: a :class:`~spmdcnn.cost.buckets.SyncOptions`."""

    def __init__(self, graph, plan, world, dtype, xp, sync=None, batchnorm=None):
        self.graph, self.plan, self.world = graph, plan, world
        self.sync = SyncOptions.of(sync)
        self.batchnorm = batchnorm          # G of ghost batch norm (None: the global batch's statistics)
        self.deferred = []                  # (InFlight, apply) of running statistics summed off the critical path
        ghosts, shared = {}, {}
        self.grad_itemsize = backend.master_dtype(dtype).itemsize
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
            if layer.spec.normalization and batchnorm is not None:
                ghosts[layer.name] = components(config, shape, batchnorm)
                rank_sets += [ghost.component for ghost in ghosts[layer.name].values()]
            if layer.spec.statistics:
                places = shared_statistics(layer, config, shape)
                rank_sets += [place.component for place in places.values()]
                if site.box is not None:
                    shared[layer.name] = places[rank]
            self.sites[layer.name] = site
        self.groups = ReplicaGroups(world, rank_sets)
        for name, place in shared.items():       # group and layer norm: a sum over the tiles sharing statistics
            self.sites[name].reduce = self.groups.reducer(place.component)      # the identity for one
            self.sites[name].statistics = place.groups
        for site in self.sites.values():
            if site.box is None or not site.layer.spec.reduced_in_layer:
                continue
            if site.layer.name in ghosts:
                site.ghost = self._ghost(site, ghosts[site.layer.name][rank])
            else:
                site.reduce = self.groups.reducer(site.group)       # the identity for a group of one
                site.gather = self.groups.gatherer(site.group) if len(site.group) > 1 else None
        self.layout = self._layout()
        self.buckets = self._buckets()
        self.ready = {}
        for bucket in self.buckets:
            self.ready.setdefault(bucket.ready, []).append(bucket)
        self.local = self._local()

    def _ghost(self, site, ghost):
        """The :class:`~spmdcnn.runtime.kernels.Ghost` of a batchnorm tile of ghost site ``ghost``."""
        N, positions = site.global_shape[0], prod(site.global_shape[2:])
        component = ghost.component
        alone = len(component) < 2
        defer = None
        if not ghost.whole:
            start_sum = self.groups.starter(site.group)

            def defer(contribution, apply):
                self.deferred.append((start_sum(contribution), contribution, apply))
        return Ghost(ghost, self.batchnorm * positions, N // self.batchnorm,
                     None if alone else self.groups.gatherer(component),
                     None if alone else self.groups.reducer(component), defer)

    def finish_deferred(self):
        """Wait for the running statistics summed off the critical path and apply them."""
        deferred, self.deferred = self.deferred, []
        for inflight, contribution, apply in deferred:
            inflight.wait()
            apply(contribution)

    def summed_in_layer(self, layer):
        """Whether ``layer``'s parameter gradients are complete after its own backward (batchnorm's, unless ghost
        batch norm splits its replica group into components: their parts are summed in the buckets)."""
        if not layer.spec.reduced_in_layer:
            return False
        site = self.sites[layer.name]
        return site.ghost is None or site.ghost.site.whole

    def _layout(self):
        """``{name: Shard}``, grouped so that each replica group's allreduced gradients are one contiguous slice:
        by group, then those summed in the layer (or buffers) last, then in the model's order."""
        entries = []
        for order, layer in enumerate(self.graph.layers):
            site = self.sites[layer.name]
            if site.box is None:
                continue
            for kind in list(layer.params) + list(layer.buffers):
                reduced = self.summed_in_layer(layer) or kind in layer.buffers
                entries.append(((site.group, reduced, order), layer, kind, layer.shard_shape(kind, site.channels),
                                layer.shard_rows(kind, site.channels)))
        entries.sort(key=lambda entry: entry[0])
        shapes = {param: {f"{layer.name}.{kind}": shape for _, layer, kind, shape, _ in entries
                          if (kind in layer.params) == param} for param in (True, False)}
        offsets = {param: flat_offsets(shapes[param]) for param in (True, False)}      # as the FlatStores lay out
        layout = {}
        for (group, _, _), layer, kind, shape, rows in entries:
            name, param = f"{layer.name}.{kind}", kind in layer.params
            layout[name] = Shard(name, layer.name, kind, param, shape, rows, group, *offsets[param][name],
                                 axis=layer.param_axis(kind))
        return layout

    def _buckets(self):
        """Each replica group's allreduced shards (batchnorm's, summed in the layer, left out) packed into buckets
        in reverse layer order, in the order they become ready (:func:`~spmdcnn.cost.buckets.assign`); under
        ``sync.served``, a bucket per layer summed through the group's parameter server."""
        by_group = {}
        for shard in self.layout.values():
            layer = self.graph.by_name[shard.layer]
            if shard.param and not self.summed_in_layer(layer) and len(shard.group) > 1 and shard.stop > shard.start:
                by_group.setdefault(shard.group, []).append(shard)
        order = {layer.name: index for index, layer in enumerate(self.graph.layers)}
        tensors = {group: [(s.layer, (s.stop - s.start) * self.grad_itemsize) for s in shards]
                   for group, shards in by_group.items()}
        nodes = self.world.node_ids() if self.sync.served else None      # collective: every rank builds one
        buckets, counts = [], {}
        for group, first, stop, ready in assign(tensors, order, self.sync):
            members = by_group[group][first:stop]
            counts[group] = counts.get(group, -1) + 1           # the bucket's place among its group's
            start = self.groups.server(group, nodes, counts[group]) if nodes is not None else \
                self.groups.starter(group)
            buckets.append(Bucket(group, start, members[0].start, members[-1].stop, ready))
        return buckets

    def _local(self):
        """The ``(start, stop)`` slices of the flat gradient array outside every bucket (final after backward)."""
        slices, at = [], 0
        size = sum(shard.stop - shard.start for shard in self.layout.values() if shard.param)
        for bucket in sorted(self.buckets, key=lambda b: b.start):
            if bucket.start > at:
                slices.append((at, bucket.start))
            at = bucket.stop
        if size > at:
            slices.append((at, size))
        return slices

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
