"""The assumptions reproduce.py predicts the paper's evaluation under, the switches from one set to the other, and
the predictions: spmdcnn's cost model on the paper's machine, its compute calibrated per network so that one device
at 32 images runs at the paper's single-GPU throughput.

- **paper**: what the paper's cost model and runtime assumed (its section 5.1 and the authors' 2018 simulator):
  each layer's gradients pushed to a parameter server per layer on the critical path (``sync: parameter-server``,
  the push charged as the simulator's ``t_s = W (g - 1) / B_intra + W (n - 1) / B_inter``), tensors moved at the
  simulator's bandwidths with no latency (15 and 4.5 MiB/ms), nothing overlapped on the critical path (the pull
  of each sum back from its server goes on while backward does), and Inception-v3 without batch
  norm (``models/inception_v3_nobn.yaml``): ``jobs/machines/paper-p100-4x4-ps.yaml``.
- **modern**: spmdcnn's runtime as it runs today: gradients allreduced in buckets overlapped with backward, by the
  algorithm NCCL and MPI libraries take for the size (published NCCL 2 measurements on P100s and EDR InfiniBand),
  links with their latency, and torchvision's Inception-v3 with batch norm over the global batch:
  ``jobs/machines/paper-p100-4x4.yaml``.

:data:`SWITCHES` change one assumption of the paper's at a time, to measure which accounts for a difference; the last
is not today's but another reading of the paper's: its AlexNet as large as its Figure 8 implies.
"""

import os
import time
from dataclasses import dataclass, replace
from math import prod

from spmdcnn.cost.machine import Machine, ParameterServer, load_machine
from spmdcnn.io.yamlfile import read_yaml
from spmdcnn.graph import load_model, parse_model
from spmdcnn.graph.blocks import DATA
from spmdcnn.planner import make_plan
from spmdcnn.planner.service import cost_model
from spmdcnn.tiling.boxes import part
from spmdcnn.tiling.plan import named, parse_plan_text
from spmdcnn.tiling.transfers import layer_transfers

import paper_data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PER_DEVICE = 32


@dataclass(frozen=True)
class PushAndPull:
    """A parameter server's push and pull as one sum on the communication lane (:class:`ServersOverlapped`)."""

    server: ParameterServer
    ways = ParameterServer.ways     # bytes moved: the push and the pull

    def allreduce(self, size, nbytes):
        """Seconds of the push and the pull of ``nbytes`` over the ``size`` devices of the group."""
        return 2 * self.server.allreduce(size, nbytes)


@dataclass(frozen=True)
class ServersOverlapped(Machine):
    """A what-if for the switch study, not a mode spmdcnn runs: parameter servers whose push and pull both go on
    while backward goes on, as an asynchronous runtime (the paper's Legion) may run them; the timeline lays them
    as buckets of one tensor on the communication lane, each its push and its pull."""

    def gradient_sum(self, group):
        if len(group) < 2:
            return None
        return PushAndPull(Machine.gradient_sum(replace(self, sync="parameter-server"), group))


@dataclass(frozen=True)
class Setting:
    """One set of assumptions: the machine file, how gradients are summed (the machine's ``sync``, and whether
    allreduces overlap backward) and the model file of each network."""

    name: str
    machine: str
    sync: str
    overlap: bool
    files: tuple = ()           # (network, model file) where the file is not the network's own name
    what: str = ""
    inputs: tuple = ()          # (network, [C, H, W]) where the network reads images of another size
    servers_overlapped: bool = False    # the what-if of ServersOverlapped (with sync "parameter-server")

    def model_file(self, network):
        """The model file's name (in models/, without .yaml) of the network under this setting."""
        return dict(self.files).get(network, network)

    def graph(self, network):
        """The network's Graph under this setting: its model file, at its input size."""
        path = os.path.join(ROOT, "models", f"{self.model_file(network)}.yaml")
        if network not in dict(self.inputs):
            return load_model(path)
        data, text = read_yaml(path, "model file")
        return parse_model({**data, "input": list(dict(self.inputs)[network])}, path, text)

    def load_machine(self):
        """The setting's Machine: its file with its ``sync`` (a :class:`ServersOverlapped` for that what-if)."""
        machine = replace(load_machine(os.path.join(ROOT, "jobs", "machines", self.machine)), sync=self.sync)
        if self.servers_overlapped:
            return ServersOverlapped(**{key: getattr(machine, key) for key in machine.__dataclass_fields__
                                        if key != "sync"})
        return machine

    def sync_options(self):
        """The job's ``sync``: a bucket per tensor for overlapped servers (one layer's push and pull each)."""
        return {"overlap": self.overlap, "bucket_mb": 1e-6} if self.servers_overlapped else {"overlap": self.overlap}


PAPER = Setting("paper", "paper-p100-4x4-ps.yaml", "parameter-server", False, (("inception_v3", "inception_v3_nobn"),),
                "a parameter server per layer, its push on the critical path (the pull back of the sum overlaps the "
                "rest of backward), the simulator's bandwidths without latency, nothing else overlapped, "
                "Inception-v3 without batch norm")
MODERN = Setting("modern", "paper-p100-4x4.yaml", "allreduce", True, (),
                 "allreduces in buckets overlapped with backward (NCCL 2's measured algorithms), links with latency, "
                 "Inception-v3 with batch norm over the global batch")
SETTINGS = {"paper": PAPER, "modern": MODERN}

# one assumption of the paper's switched to today's at a time
SWITCHES = (
    ("allreduce after backward instead of the parameter servers",
     replace(PAPER, name="paper, allreduce after backward", sync="allreduce")),
    ("allreduce overlapped with backward instead of the parameter servers",
     replace(PAPER, name="paper, allreduce overlapped", sync="allreduce", overlap=True)),
    ("today's links and allreduce regimes (paper-p100-4x4.yaml), parameter servers kept",
     replace(PAPER, name="paper, today's links", machine="paper-p100-4x4.yaml")),
    ("parameter servers overlapped with backward (a what-if: an asynchronous runtime such as the paper's Legion; "
     "spmdcnn's push on the critical path)",
     replace(PAPER, name="paper, servers overlapped", overlap=True, servers_overlapped=True)),
    ("Inception-v3 with batch norm", replace(PAPER, name="paper, batch norm", files=())),
    ("not a switch to today's: AlexNet of 74.7 M parameters (torchvision's at 256x256: pool5 7x7, fc6 over 12,544 "
     "inputs), the size Figure 8's data-parallel bytes imply",
     replace(PAPER, name="paper, AlexNet at 256x256", inputs=(("alexnet", (3, 256, 256)),))),
)


def calibrated_cost(setting, graph, devices, factor):
    """The cost model of ``graph`` on ``devices`` devices of ``setting``'s machine (more nodes of it past 16
    devices), compute scaled by ``factor``."""
    machine = setting.load_machine()
    nodes = max(machine.nodes, -(-devices // machine.devices_per_node))
    cost = cost_model(graph, PER_DEVICE * devices, devices, machine, None, 4, nodes, setting.sync_options())
    cost.compute.scale = {None: factor, "sgd": factor}
    return cost


def calibration(setting, graph, single):
    """The factor that makes one device run at ``single`` images/s under ``setting``."""
    modelled = calibrated_cost(setting, graph, 1, 1.0).simulate(named("data", graph, PER_DEVICE, 1)).iteration_s
    return (PER_DEVICE / single) / modelled


def factors(setting, networks):
    """The calibration factor of each network: to the paper's single-GPU throughput, and for a network the paper
    does not run (ResNet-50) the median of the paper's networks' factors (Inception-v3's: the closest kind)."""
    known = {name: calibration(setting, setting.graph(name), paper_data.single(name)) for name in paper_data.MODELS}
    default = sorted(known.values())[len(known) // 2]
    return {name: known.get(name, default) for name in networks}


def bytes_as_the_paper_counts(cost, plan):
    """``(input, activations, parameters)`` bytes of one step as the paper's Figure 8 counts them: the global
    batch's images loaded, the activations moved between devices forward, and every replica's gradients pushed
    and parameters pulled (2 x the shard's bytes x the replicas of each group of two or more)."""
    graph = cost.graph
    images = plan.batch * prod(graph.input_shape) * cost.itemsize
    forward = parameters = 0.0
    for layer in graph.layers:
        config = plan[layer.name]
        for slot, ref in enumerate(layer.inputs):
            if ref != DATA:
                forward += cost.edge(layer, slot).forward(plan[ref], config).bytes
        if layer.params:
            c_degree = config.degrees[1] if len(config.degrees) > 1 else 1
            per_row = sum(prod(shape[1:]) for shape in layer.params.values()) * cost.itemsize
            for index, group in config.replicas().items():
                if len(group) > 1:
                    lo, hi = part(layer.out_shape[0], c_degree, index)
                    parameters += 2 * (hi - lo) * per_row * len(group)
    return images, forward, parameters


def run(setting, networks, device_counts, log=print):
    """Every network under every strategy on every device count: a row each (JSON-ready)."""
    scale = factors(setting, networks)
    rows = []
    for name in networks:
        graph = setting.graph(name)
        for devices in device_counts:
            cost = calibrated_cost(setting, graph, devices, scale[name])
            for strategy in paper_data.STRATEGIES:
                start = time.perf_counter()
                result = make_plan(graph, devices, cost, strategy)
                seconds = time.perf_counter() - start
                summary = result.prediction.summary()
                images, forward, parameters = bytes_as_the_paper_counts(cost, result.plan)
                rows.append({"setting": setting.name, "model": name, "model_file": setting.model_file(name),
                             "devices": devices, "strategy": strategy, "factor": scale[name],
                             "iteration_s": summary["iteration_s"],
                             "images_per_s": PER_DEVICE * devices / summary["iteration_s"],
                             "compute_s": summary["compute_s"], "transfer_s": summary["transfer_s"],
                             "sync_s": summary["sync_s"], "bytes_transferred": summary["bytes_transferred"],
                             "bytes_synced": summary["bytes_synced"],
                             "paper_bytes": {"images": images, "activations": forward, "parameters": parameters},
                             "search_s": seconds, "plan": result.plan.text if strategy == "optimal" else None})
                log(f"{setting.name:<7} {name:<13} {devices:>3} {strategy:<8} {rows[-1]['images_per_s']:>9.1f} "
                    f"images/s  search {seconds:.3f} s")
    return rows


def serialized_transfers(cost, plan):
    """Seconds of a plan's exchanges if every (producer tile, consumer tile) transfer between devices ran one after
    another at its link's bandwidth, forward and (where a gradient flows back) backward: the other reading of the
    paper's ``t_x`` (the cost model charges each exchange its busiest device, all devices at once)."""
    seconds = 0.0
    for layer in cost.graph.layers:
        if all(ref == DATA for ref in layer.inputs):
            continue
        for move in layer_transfers(plan, layer):
            if move.src != move.dst:
                nbytes = prod(hi - lo for lo, hi in move.box) * cost.itemsize
                link = cost.machine.link(move.src, move.dst)
                seconds += (nbytes / link.bandwidth + link.latency) * (2 if layer.input_grads[move.slot] else 1)
    return seconds


def transfer_readings(setting, networks, devices, scale):
    """``[(network, strategy, images/s as the model charges exchanges, images/s with them serialized)]`` for owt
    and the layer-wise plan at ``devices``."""
    found = []
    for name in networks:
        graph = setting.graph(name)
        cost = calibrated_cost(setting, graph, devices, scale[name])
        for strategy in ("owt", "optimal"):
            prediction = make_plan(graph, devices, cost, strategy)
            iteration = prediction.prediction.iteration_s
            serial = iteration - prediction.prediction.transfer_s + serialized_transfers(cost, prediction.plan)
            found.append((name, strategy, PER_DEVICE * devices / iteration, PER_DEVICE * devices / serial))
    return found


def table5_plan(graph, flat_degree):
    """Table 5's VGG-16 plan on 4 devices (batch 128), with ``flatten`` (a layer the paper's graph lacks: pool5
    feeds fc6 there) split over ``flat_degree`` devices."""
    block5 = "".join(f"  {name}: {{h: 2, w: 2}}\n" for name in ("conv5_1.conv", "conv5_2.conv", "conv5_3.conv",
                                                                  "pool5"))
    text = ("format: spmdcnn-plan/1\nmodel: vgg16\nbatch_size: 128\ndevices: 4\ndefault: {n: 4}\nlayers:\n" + block5
            + f"  flat: {{n: {flat_degree}}}\n  fc6: {{c: 4}}\n  fc7: {{c: 4}}\n  fc8: {{c: 2}}\n  loss: {{n: 1}}\n")
    return parse_plan_text(text, graph, 128, 4, "Table 5 of the paper")


def table5(setting, factor):
    """``(paper's plan, its prediction, found plan's Result)`` for VGG-16 on 4 devices under ``setting``: the
    paper's plan with the cheapest split of ``flatten``."""
    graph = setting.graph("vgg16")
    cost = calibrated_cost(setting, graph, 4, factor)
    paper = min((table5_plan(graph, degree) for degree in (1, 2, 4)),
                key=lambda plan: cost.simulate(plan).iteration_s)
    return paper, cost.simulate(paper), make_plan(graph, 4, cost, "optimal")


def where_layerwise_wins(setting, name, devices, factor):
    """The layers whose configuration the layer-wise optimum changes from the best other strategy at ``devices``,
    with each one's time in both: ``(best other strategy, gain, [(layer, other config, optimal config,
    (compute, transfer, exposed sync, allreduce time) difference in s)])``."""
    graph = setting.graph(name)
    cost = calibrated_cost(setting, graph, devices, factor)
    results = {s: make_plan(graph, devices, cost, s) for s in paper_data.STRATEGIES}
    other = min(("data", "model", "owt"), key=lambda s: results[s].prediction.iteration_s)
    best, mine = results[other], results["optimal"]
    rows = {row.name: row for row in best.prediction.layers}
    changed = []
    for row in mine.prediction.layers:
        layer = graph.by_name[row.name]
        if layer.op in ("relu", "dropout") or best.plan[row.name] == mine.plan[row.name]:
            continue
        was = rows[row.name]
        changed.append((row.name, best.plan[row.name].describe(short=True), mine.plan[row.name].describe(short=True),
                        (row.compute_s - was.compute_s, row.transfer_s - was.transfer_s, row.sync_s - was.sync_s,
                         row.allreduce_s - was.allreduce_s)))
    gain = best.prediction.iteration_s / mine.prediction.iteration_s
    return other, gain, changed
