"""The cost of a plan (docs/architecture.md#the-cost-model-and-the-planner).

:meth:`CostModel.simulate` is the plan as the runtime runs it: the timeline of :mod:`.timeline`, with gradient
buckets allreduced on a communication lane that overlaps backward. Every reported number comes from it. The
search optimizes the additive surrogate ``t_o = sum over layers [t_c + t_s] + sum over edges t_x``
(:meth:`CostModel.surrogate`; ``t_s`` charges each layer's gradients as one allreduce of their own, weighted),
whose tables are what the planner's dynamic program can take; the planner then scores its candidates on the
timeline.
"""

from dataclasses import dataclass, field
from math import prod

import numpy as np

from ..graph.blocks import DATA
from ..tiling.ghost import ghost_group
from .buckets import SyncOptions
from .sync import SyncModel
from .transfer import EdgeTraffic

# the float64 numbers a training step sums over the ranks with its loss (the signal flags aside): the loss's sum,
# what it counted and the score (runtime/executor.py); an evaluation of a loss per position adds 3 per class
LOSS_SUMS = 3


@dataclass
class LayerCost:
    name: str
    config: str
    compute_s: float = 0.0
    transfer_s: float = 0.0
    sync_s: float = 0.0             # exposed: batchnorm's sums, and the layer's share of bucket time not hidden
    bytes_transferred: float = 0.0
    bytes_synced: float = 0.0
    allreduce_s: float = 0.0        # the layer's share of its buckets' allreduce time, hidden or not

    @property
    def total_s(self):
        return self.compute_s + self.transfer_s + self.sync_s


@dataclass
class Prediction:
    layers: list = field(default_factory=list)
    overhead_s: float = 0.0         # per iteration: the loss's allreduce with its wait
    timeline: object = None         # the Timeline it comes from (None: the additive surrogate)
    runtime_s: float = 0.0          # per iteration: the runtime's own work the profile measured on the ranks

    def _sum(self, key):
        return sum(getattr(row, key) for row in self.layers)

    @property
    def compute_s(self):
        return self._sum("compute_s")

    @property
    def transfer_s(self):
        return self._sum("transfer_s")

    @property
    def sync_s(self):
        return self._sum("sync_s") + self.overhead_s

    @property
    def iteration_s(self):
        return self.compute_s + self.transfer_s + self.sync_s + self.runtime_s

    def summary(self):
        """The plan YAML's ``predicted`` mapping."""
        return {"iteration_s": self.iteration_s, "compute_s": self.compute_s, "transfer_s": self.transfer_s,
                "sync_s": self.sync_s, "runtime_s": self.runtime_s, "allreduce_s": self._sum("allreduce_s"),
                "bytes_transferred": self._sum("bytes_transferred"), "bytes_synced": self._sum("bytes_synced")}

    def to_json(self):
        return {**self.summary(), "layers": [{**vars(row), "total_s": row.total_s} for row in self.layers]}


class CostModel:
    """Costs of ``graph`` at global ``batch`` on ``machine``, tile times from ``compute``
    (a :class:`~spmdcnn.cost.compute.ComputeModel`)."""

    def __init__(self, graph, batch, machine, compute, itemsize=4, sync=None, batchnorm=None):
        self.graph, self.batch, self.machine, self.compute, self.itemsize = graph, batch, machine, compute, itemsize
        self.sync = SyncOptions.of(sync)
        self.ghost = ghost_group(batchnorm)      # G of ghost batch norm, or None
        self._edges = {}
        self._nodes = {}
        self._sync = SyncModel(machine, itemsize)

    def node(self, layer, config):
        """``(t_c, t_s, bytes synced)`` of ``layer`` under ``config`` (the same for repeated layers)."""
        nodes = self._node_table(layer)
        key = (config.degrees, config.devices)
        if key not in nodes:
            self._add_nodes(layer, [config], nodes)
        return nodes[key][:3]

    def node_costs(self, layer, configs):
        """``t_c + t_s`` of ``layer`` under each of ``configs``, as :meth:`node` gives them: a float64 array."""
        configs = list(configs)
        nodes = self._node_table(layer)
        keys = [(config.degrees, config.devices) for config in configs]
        missing = [config for config, key in zip(configs, keys) if key not in nodes]
        if missing:
            self._add_nodes(layer, missing, nodes)
        return np.array([nodes[key][0] + nodes[key][1] for key in keys], dtype=np.float64)

    def _node_table(self, layer):
        """``{(degrees, devices): node}`` of the layers with ``layer``'s signature."""
        nodes = self._nodes.get(layer.signature)
        if nodes is None:
            nodes = self._nodes[layer.signature] = {}
        return nodes

    def _add_nodes(self, layer, configs, nodes):
        computes = self.compute.layer_times(layer, self.batch, [config.degrees for config in configs])
        wait = self.compute.wait
        ghost = self.ghost is not None and layer.spec.normalization
        shared = layer.spec.statistics
        if ghost:
            syncs = [self._sync.ghost(layer, config, self.batch, self.ghost) for config in configs]
        elif shared:
            syncs = [self._sync.statistics(layer, config, self.batch) for config in configs]
        else:
            syncs = self._sync.layers(layer, configs)
        for config, compute, sync in zip(configs, computes, syncs):
            seconds = sync.seconds + sync.points * wait
            if self.machine.served:         # a server's push is on the critical path: none to weight
                gradient = 0.0
            elif ghost or shared:
                gradient = sync.gradient
            else:
                gradient = 0.0 if layer.spec.reduced_in_layer else seconds
            nodes[config.degrees, config.devices] = (compute, seconds, sync.bytes,
                                                     sync.forward + wait * (sync.points > 0) * (sync.forward > 0),
                                                     gradient, sync)

    def node_parts(self, layer, config):
        """``(t_c, t_s, bytes synced, the part of t_s in forward, the part of t_s that sums parameter gradients)``
        of ``layer`` under ``config``."""
        self.node(layer, config)
        return self._node_table(layer)[config.degrees, config.devices][:5]

    def node_sync(self, layer, config):
        """The :class:`~spmdcnn.cost.sync.Sync` of ``layer`` under ``config``: its allreduces' own seconds, no
        wait where the ranks meet (the timeline adds that, :meth:`point_wait`)."""
        self.node(layer, config)
        return self._node_table(layer)[config.degrees, config.devices][5]

    def point_wait(self, gap):
        """Seconds the devices lose where they synchronize after ``gap`` seconds of compute since they last did:
        the profile's wait per point and its drift times the gap."""
        return self.compute.wait + self.compute.drift * gap

    def node_split(self, layer, configs):
        """``(critical, gradient)`` float64 arrays over ``configs``: ``t_c`` plus the sync on the critical path
        (batchnorm's statistics), and the surrogate's gradient allreduce (:meth:`node_costs` is their sum)."""
        configs = list(configs)
        costs = self.node_costs(layer, configs)
        nodes = self._node_table(layer)
        gradient = np.array([nodes[config.degrees, config.devices][4] for config in configs], dtype=np.float64)
        return costs - gradient, gradient

    def exchange_seconds(self, seconds, nbytes, backward=True):
        """``t_x`` of an edge from its forward exchange: forward and, when the input needs a gradient
        (``backward``; the executor runs no adjoint exchange for one that does not), backward, each a point where
        the devices that exchange wait for each other when anything crosses devices."""
        directions = 2 if backward else 1
        return directions * (seconds + self.compute.wait * (nbytes > 0))

    def edge(self, layer, slot):
        """The :class:`EdgeTraffic` of input ``slot`` of ``layer`` (shared by edges that move the same way)."""
        producer = self.graph.by_name[layer.inputs[slot]]
        shape = (self.batch,) + tuple(producer.out_shape)
        key = (layer.signature, slot, shape)
        if key not in self._edges:
            self._edges[key] = EdgeTraffic(layer, slot, shape, self.batch, self.itemsize, self.machine)
        return self._edges[key]

    def overhead(self, devices):
        """The surrogate's charge per iteration for the loss's sum: its allreduce and the profile's wait per
        point (the timeline adds the drift since the ranks last met), and the runtime's work per step."""
        if devices < 2:
            return self.compute.step
        return self.loss_sum(devices) + self.compute.wait + self.compute.step

    @property
    def loss_values(self):
        """How many float64 the loss's sum after forward adds up: LOSS_SUMS, and the loss's table per sample and
        class where it has one (Dice's)."""
        return LOSS_SUMS + prod(self.graph.loss_table(self.batch))

    def loss_sum(self, devices):
        """The loss's sum after forward (:attr:`loss_values` float64), no wait: 0 on one device."""
        return self.machine.allreduce_time(tuple(range(devices)), self.loss_values * 8) if devices > 1 else 0.0

    def surrogate(self, plan):
        """The additive :class:`Prediction` the search's tables give ``plan`` (each layer's gradients one
        allreduce on the critical path): what the planner's dynamic program minimizes at weight 1."""
        runtime = self.compute.step
        prediction = Prediction(overhead_s=self.overhead(plan.devices) - runtime, runtime_s=runtime)
        for layer in self.graph.layers:
            config = plan[layer.name]
            compute, sync, synced = self.node(layer, config)
            row = LayerCost(layer.name, config.describe(short=True), compute, 0.0, sync, 0.0, synced)
            for slot, ref in enumerate(layer.inputs):
                if ref == DATA:
                    continue
                traffic = self.edge(layer, slot).forward(plan[ref], config)
                backward = layer.input_grads[slot]
                row.transfer_s += self.exchange_seconds(traffic.seconds, traffic.bytes, backward)
                row.bytes_transferred += (2 if backward else 1) * traffic.bytes
            prediction.layers.append(row)
        return prediction

    def simulate(self, plan, sync=None):
        """The :class:`Prediction` for ``plan`` (any plan: hand-written ones too) on the timeline, with the job's
        ``sync`` options (default: this model's). A layer's ``sync_s`` is what it exposes: batchnorm's sums, and
        its share (by bytes) of the time the slowest device waited for its buckets after backward."""
        from .timeline import timeline
        rows, found = timeline(self, plan, sync)
        share, allreduce = {}, {}
        for bucket in found.buckets:
            for name, nbytes in bucket.layers.items():
                share[name] = share.get(name, 0.0) + bucket.exposed_s * nbytes / bucket.nbytes
                allreduce[name] = allreduce.get(name, 0.0) + (bucket.seconds + bucket.wait_s) * nbytes / bucket.nbytes
        prediction = Prediction(overhead_s=found.overhead_s, timeline=found, runtime_s=found.runtime_s)
        for layer in self.graph.layers:
            compute, transfer, batchnorm, moved, synced = rows[layer.name]
            prediction.layers.append(LayerCost(layer.name, plan[layer.name].describe(short=True), compute, transfer,
                                               batchnorm + share.get(layer.name, 0.0), moved, synced,
                                               allreduce.get(layer.name, 0.0) + (batchnorm if batchnorm else 0.0)))
        return prediction
