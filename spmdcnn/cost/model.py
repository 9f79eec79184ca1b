"""The cost of a plan (docs/architecture.md#the-cost-model-and-the-planner):
``t_o = sum over layers [t_c + t_s] + sum over edges t_x``.

The runtime runs the layers in order on every device and each exchange waits for the tiles it reads, so one
iteration lasts the sum, layer by layer, of the slowest tile (``t_c``), the slowest replica group's allreduces
(``t_s``), and the busiest device's share of each exchange, forward and backward (``t_x``). The same numbers,
message for message, are what the planner minimizes and what ``spmdcnn simulate`` reports.
"""

from dataclasses import dataclass, field

import numpy as np

from ..graph.blocks import DATA
from .sync import SyncModel
from .transfer import EdgeTraffic


@dataclass
class LayerCost:
    name: str
    config: str
    compute_s: float = 0.0
    transfer_s: float = 0.0
    sync_s: float = 0.0
    bytes_transferred: float = 0.0
    bytes_synced: float = 0.0

    @property
    def total_s(self):
        return self.compute_s + self.transfer_s + self.sync_s


@dataclass
class Prediction:
    layers: list = field(default_factory=list)
    overhead_s: float = 0.0         # per iteration, whatever the plan: the loss and accuracy allreduce

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
        return self.compute_s + self.transfer_s + self.sync_s

    def summary(self):
        """The plan YAML's ``predicted`` mapping."""
        return {"iteration_s": self.iteration_s, "compute_s": self.compute_s, "transfer_s": self.transfer_s,
                "sync_s": self.sync_s, "bytes_transferred": self._sum("bytes_transferred"),
                "bytes_synced": self._sum("bytes_synced")}

    def to_json(self):
        return {**self.summary(), "layers": [{**vars(row), "total_s": row.total_s} for row in self.layers]}


class CostModel:
    """Costs of ``graph`` at global ``batch`` on ``machine``, tile times from ``compute``
    (a :class:`~spmdcnn.cost.compute.ComputeModel`)."""

    def __init__(self, graph, batch, machine, compute, itemsize=4):
        self.graph, self.batch, self.machine, self.compute, self.itemsize = graph, batch, machine, compute, itemsize
        self._edges = {}
        self._nodes = {}
        self._sync = SyncModel(machine, itemsize)

    def node(self, layer, config):
        """``(t_c, t_s, bytes synced)`` of ``layer`` under ``config`` (the same for repeated layers)."""
        nodes = self._node_table(layer)
        key = (config.degrees, config.devices)
        if key not in nodes:
            self._add_nodes(layer, [config], nodes)
        return nodes[key]

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
        for config, compute, sync in zip(configs, computes, self._sync.layers(layer, configs)):
            nodes[config.degrees, config.devices] = (compute, sync.seconds + sync.points * self.compute.wait,
                                                     sync.bytes)

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
        if devices < 2:
            return 0.0
        return self.machine.allreduce_time(tuple(range(devices)), 2 * 8) + self.compute.wait

    def simulate(self, plan):
        """The :class:`Prediction` for ``plan`` (any plan: hand-written ones too)."""
        prediction = Prediction(overhead_s=self.overhead(plan.devices))
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
