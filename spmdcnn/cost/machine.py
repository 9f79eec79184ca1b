"""The machine model (docs/formats.md#machine-files): nodes of devices, and the bandwidth and latency between any
two devices.

    format: spmdcnn-machine/1
    name: paper-p100-4x4
    nodes: 4                       # the most nodes a job may use
    devices_per_node: 4
    intra_node: {bandwidth: 1.8e10, latency: 1.0e-5}     # bytes/s and s, between devices of one node
    inter_node: {bandwidth: 1.2e10, latency: 2.0e-5}     # between devices of different nodes
    device: {name: p100, flops: 9.3e12, memory_bandwidth: 7.3e11}   # optional: the analytic compute model
    allreduce:                     # optional: how the MPI library (or NCCL) allreduces, per level
      intra_node: {small: {bandwidth: 1.5e10, latency: 8.0e-6}, large: {bandwidth: 1.8e10, latency: 1.0e-5}}

Devices are numbered node by node: device ``d`` is on node ``d // devices_per_node`` (as MPI places ranks by
default with ``--map-by core`` or ``srun``'s block distribution). ``device.name`` says what the devices are:
``cpu`` (or this computer's processor, as ``calibrate`` writes it) lets ``plan``, ``simulate`` and ``plot`` time
tiles from this computer's cached profile, any other name keeps them to the analytic model unless ``--profile``
names one; ``flops`` and ``memory_bandwidth`` are the rates of the analytic model for tiles no profile covers;
``memory`` (bytes) is the planner's default memory limit, and ``im2col: false`` (GPUs) leaves the im2col columns out
of the memory model (:mod:`.memory`). ``spmdcnn calibrate`` measures these under ``mpiexec``.

Allreduces run the algorithm an MPI library or NCCL picks for the size (:class:`Regimes`): latency-bound small
messages by recursive doubling (``ceil(log2 p)`` steps of the whole message), bandwidth-bound large ones by a ring
(``2(p-1)`` steps of ``1/p`` of it); the model takes the faster, so the crossover follows from the two fits. Each
regime is a ``{bandwidth, latency}`` per level (a group within one node uses ``intra_node``'s, one that spans nodes
``inter_node``'s); without ``allreduce``, both regimes of a level are its link. ``sync: parameter-server`` sums
parameter gradients through a server per replica group instead, as the paper's runtime did
(:class:`ParameterServer`); batch norm's statistics and the loss still use the allreduce regimes.

Big clusters have switches above the nodes: ``switches`` lists their levels, innermost first::

    switches:
      - {name: leaf, nodes: 32}                       # 32 nodes under one leaf switch: inter_node is their link
      - {name: spine, nodes: 256, oversubscription: 2, latency: 3.0e-6}   # 8 leaves under the spine, 2:1

Each level's ``nodes`` is how many nodes one switch of the level has under it (node ``n`` is under switch ``n //
nodes`` of the level), a multiple of the level below's and greater; the last level's must cover all of the machine's
``nodes``. Devices are then at one of these **levels** (:meth:`Machine.level`): 0 on one node (``intra_node``), 1 on
different nodes under one switch of the first level (``inter_node``; without ``switches``, any two nodes), ``k + 1``
when their lowest common switch is of level ``k`` (0-based, ``k >= 1``). A level's :class:`Switch` ``link`` is the
link of the level below (``inter_node`` for the first) with its bandwidth divided by the level's
``oversubscription`` (default 1: how many times more the nodes under one switch of the level below can send up than
the level carries) and its latency, unless the file gives ``bandwidth`` or ``latency``. ``allreduce`` may name the
levels above the first by their switch's name; a switch level without them takes the regimes of the level below,
their bandwidths divided by the ratio of the two levels' link bandwidths and their latencies increased by the
difference of the links' latencies (not below zero). :meth:`Machine.tiers` lists the levels a job of ``count``
devices spans, as blocks of devices, for tables that price transfers per level.
"""

import math
import re
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from ..io.yamlfile import FormatError, check_keys, load_yaml_text, read_yaml, shipped

FORMAT = "spmdcnn-machine/1"
_KEYS = {"format", "name", "nodes", "devices_per_node", "intra_node", "inter_node", "device", "description",
         "measured", "allreduce", "sync", "switches"}
SYNC_MODES = ("allreduce", "parameter-server")
_LEVELS = ("intra_node", "inter_node")
_REGIME_KEYS = {"small", "large"}
_LINK_KEYS = {"bandwidth", "latency"}
_DEVICE_KEYS = {"name", "flops", "memory_bandwidth", "overhead", "im2col", "memory"}
_SWITCH_KEYS = {"name", "nodes", "oversubscription", "latency", "bandwidth"}
_NAME = re.compile(r"[A-Za-z0-9_.+-]+")


class MachineError(FormatError):
    """A machine file that does not follow the format, or a job that does not fit the machine."""


@dataclass(frozen=True)
class Link:
    bandwidth: float        # bytes/s
    latency: float          # s per message


@dataclass(frozen=True)
class Regimes:
    """How one level's allreduces run: ``small`` (recursive doubling) and ``large`` (ring) fits, each a Link."""

    small: Link
    large: Link
    ways = 1        # bytes a member counts per byte of gradients: its contribution to the sum

    def allreduce(self, size, nbytes):
        """Seconds of summing ``nbytes`` over ``size`` devices: the faster of the two algorithms."""
        if size < 2:
            return 0.0
        doubling = math.ceil(math.log2(size)) * (nbytes / self.small.bandwidth + self.small.latency)
        ring = 2 * (size - 1) * (nbytes / size / self.large.bandwidth + self.large.latency)
        return min(doubling, ring)

    def allgather(self, size, nbytes):
        """Seconds of gathering ``nbytes`` from each of ``size`` devices on all of them (doubling or ring)."""
        if size < 2:
            return 0.0
        doubling = math.ceil(math.log2(size)) * self.small.latency + (size - 1) * nbytes / self.small.bandwidth
        ring = (size - 1) * (nbytes / self.large.bandwidth + self.large.latency)
        return min(doubling, ring)


@dataclass(frozen=True)
class ParameterServer:
    """How a replica group sums its gradients under ``sync: parameter-server`` (Jia et al., section 5.1): every
    member pushes its gradients to the group's first device, the server, which sums them, and the sum is pulled
    back. On their way the members of each node send to the node's first member, which sends the node's sum on:
    one way takes ``within - 1`` transfers over an ``intra`` link and ``across - 1`` over an ``inter`` link, one
    after the other where they arrive (``within``: the group's most devices on one node; ``across``: the nodes it
    spans): the paper's simulator's ``t_s = W (g - 1) / B_intra + W (n - 1) / B_inter``. The push is on the
    critical path (backward goes on once the server has the sum); the pull goes the other way over the same links
    while backward goes on, and takes as long."""
    within: int
    across: int
    intra: Link
    inter: Link
    ways = 2        # bytes a member moves per byte of gradients: its push and its pull

    def allreduce(self, size, nbytes):
        """Seconds of one way of ``nbytes`` between the ``size`` devices of the group and their server."""
        if size < 2:
            return 0.0
        return ((self.within - 1) * (nbytes / self.intra.bandwidth + self.intra.latency)
                + (self.across - 1) * (nbytes / self.inter.bandwidth + self.inter.latency))


@dataclass(frozen=True)
class Switch:
    """One level of switches above the nodes: each switch of the level has ``nodes`` nodes under it (node ``n``
    under switch ``n // nodes``), and ``link`` is between devices whose lowest common switch is of this level,
    derived from the level below's (see the module's docstring) or as the file gives it. ``oversubscription``
    records the file's ratio to the level below's bandwidth (written back by :meth:`Machine.to_yaml`)."""

    name: str
    nodes: int
    link: Link
    oversubscription: float = 1.0


@dataclass(frozen=True)
class Device:
    name: str = "cpu"
    flops: float = 5.0e10               # floating-point operations per second (analytic compute model)
    memory_bandwidth: float = 1.0e10    # bytes/s
    overhead: float = 1.0e-6             # s per NumPy call or kernel launch
    im2col: bool = True                 # convolutions build im2col columns (NumPy); false: cuDNN on a GPU
    memory: float = None                # bytes a device holds: the planner's default memory limit


@dataclass(frozen=True)
class Machine:
    name: str
    nodes: int
    devices_per_node: int
    intra_node: Link
    inter_node: Link
    device: Device = Device()
    source: str = "<machine>"
    measured: dict = field(default_factory=dict, compare=False)
    allreduce: dict = field(default_factory=dict, hash=False)     # level -> Regimes, where the file gives them
    sync: str = "allreduce"         # how replica groups sum gradients: "allreduce" or "parameter-server"
    switches: tuple = ()            # Switch levels above the nodes, innermost first

    def __post_init__(self):
        if self.sync not in SYNC_MODES:
            raise MachineError(f"{self.source}: 'sync' must be 'allreduce' or 'parameter-server', got {self.sync!r}")
        top = self.switches[-1] if self.switches else None
        if top is not None and top.nodes < self.nodes:
            raise MachineError(f"{self.source}: switches: the last level, {top.name!r}, has {top.nodes} nodes under one "
                               f"switch but the machine has {self.nodes} nodes ('nodes', or --nodes): every node must "
                               f"be under one switch of the last level; add a level above {top.name!r} or use fewer "
                               "nodes")
        # per level: its link and its allreduce regimes, looked up by the cost model tens of thousands of times
        links = (self.intra_node, self.switches[0].link if self.switches else self.inter_node,
                 *(switch.link for switch in self.switches[1:]))
        object.__setattr__(self, "_links", links)
        object.__setattr__(self, "_blocks", tuple(switch.nodes for switch in self.switches))
        object.__setattr__(self, "_regimes", self._level_regimes())

    @property
    def served(self):
        """Whether replica groups sum their gradients through parameter servers (``sync: parameter-server``)."""
        return self.sync == "parameter-server"

    @property
    def level_names(self):
        """The levels' names, innermost first: ``intra_node``, ``inter_node``, then the switch levels' above the
        first (the keys of ``allreduce``)."""
        return ("intra_node", "inter_node", *(switch.name for switch in self.switches[1:]))

    def level(self, a, b):
        """The level of devices ``a`` and ``b``: 0 on one node (or ``a == b``), 1 on different nodes under one
        switch of the first level (without switches: any two nodes), ``k + 1`` when their lowest common switch is
        of level ``k`` (``switches[k]``, ``k >= 1``)."""
        node_a, node_b = a // self.devices_per_node, b // self.devices_per_node
        if node_a == node_b:
            return 0
        for index, nodes in enumerate(self._blocks):
            if node_a // nodes == node_b // nodes:
                return index + 1
        return len(self._links) - 1

    def level_link(self, level):
        """The :class:`Link` between devices of ``level``."""
        return self._links[level]

    def _level_regimes(self):
        found = []
        for level, name in enumerate(self.level_names):
            regimes = self.allreduce.get(name)
            if regimes is None and level < 2:
                regimes = Regimes(self._links[level], self._links[level])
            elif regimes is None:
                below, link = self._links[level - 1], self._links[level]
                ratio, extra = below.bandwidth / link.bandwidth, link.latency - below.latency
                regimes = Regimes(*(Link(fit.bandwidth / ratio, max(0.0, fit.latency + extra))
                                    for fit in (found[-1].small, found[-1].large)))
            found.append(regimes)
        return tuple(found)

    def regimes(self, group):
        """The :class:`Regimes` of allreduces over the devices ``group``: of the highest level it spans (levels
        are blocks of consecutive devices, so that of its first and last device). None for fewer than two
        devices."""
        if len(group) < 2:
            return None
        return self._regimes[self.level(min(group), max(group))]

    def gradient_sum(self, group):
        """How the devices ``group`` sum their parameter gradients: the allreduce :class:`Regimes` of the group's
        level, or a :class:`ParameterServer` under ``sync: parameter-server`` (its ``inter`` the link of the
        highest level the group spans, ``inter_node`` within one first switch); either's ``allreduce(size,
        nbytes)`` gives the seconds (of one way, for a server). None for fewer than two devices."""
        if len(group) < 2:
            return None
        if not self.served:
            return self.regimes(group)
        per_node = Counter(self.node_of(device) for device in group)
        inter = self._links[max(1, self.level(min(group), max(group)))]
        return ParameterServer(max(per_node.values()), len(per_node), self.intra_node, inter)

    @property
    def max_devices(self):
        return self.nodes * self.devices_per_node

    def node_of(self, device):
        return device // self.devices_per_node

    def link(self, a, b):
        """The :class:`Link` between devices ``a`` and ``b``: that of their :meth:`level`."""
        return self._links[self.level(a, b)]

    def tiers(self, count):
        """The levels a job on devices ``0..count-1`` spans beyond the device itself, innermost first: ``[(devices
        per block, Link), ...]``, a block being the devices of one node, then of one switch of each level:
        ``(devices_per_node, intra_node)``, ``(devices_per_node * switches[0].nodes, inter_node)`` (the first
        level's link), ``(devices_per_node * switches[1].nodes, switches[1].link)``, ..., ending with the first
        level whose block holds all ``count`` devices (the last block is made at least ``count``). Within one node:
        ``[(devices_per_node, intra_node)]``; without switches: that and ``(max(max_devices, count),
        inter_node)``."""
        per = self.devices_per_node
        tiers = [(per, self.intra_node)]
        if count <= per:
            return tiers
        sizes = [per * nodes for nodes in self._blocks] or [self.max_devices]
        for level, size in enumerate(sizes, start=1):
            tiers.append((max(size, count) if level == len(sizes) else size, self._links[level]))
            if size >= count:
                break
        return tiers

    def check_devices(self, devices):
        """Reject a job with more devices than the machine has."""
        if devices > self.max_devices:
            raise MachineError(f"{self.source}: the job uses {devices} devices but machine {self.name!r} has "
                               f"{self.nodes} node{'s' * (self.nodes != 1)} x {self.devices_per_node} devices; "
                               f"raise 'nodes' or use --nodes")
        return self

    def with_nodes(self, nodes):
        return replace(self, nodes=nodes)

    def matrices(self, count):
        """``(seconds per byte, latency)`` between devices ``0..count-1``: two ``(count, count)`` arrays, zero on
        the diagonal (a device does not send to itself)."""
        node = np.arange(count) // self.devices_per_node
        level = np.where(node[:, None] == node[None, :], 0, len(self._links) - 1)
        for index in range(len(self._blocks) - 2, -1, -1):     # outermost first: a lower common switch overrides
            block = node // self._blocks[index]
            level = np.where((level > 0) & (block[:, None] == block[None, :]), index + 1, level)
        inverse = np.array([1 / link.bandwidth for link in self._links])[level]
        latency = np.array([link.latency for link in self._links])[level]
        np.fill_diagonal(inverse, 0)
        np.fill_diagonal(latency, 0)
        return inverse, latency

    def allreduce_time(self, group, nbytes):
        """Summing ``nbytes`` over the devices ``group``, as the library runs it (:meth:`Regimes.allreduce`)."""
        regimes = self.regimes(group)
        return 0.0 if regimes is None else regimes.allreduce(len(group), nbytes)

    def ring_link(self, group):
        """The slowest link of a ring over the devices ``group`` (in that order): the lowest bandwidth and the
        highest latency among its links; None for fewer than two devices."""
        if len(group) < 2:
            return None
        links = {self.link(a, b) for a, b in zip(group, group[1:] + group[:1])}
        return Link(min(link.bandwidth for link in links), max(link.latency for link in links))

    def to_yaml(self):
        """The machine as a YAML document (what ``spmdcnn calibrate`` writes)."""
        def link(l):
            return f"{{bandwidth: {l.bandwidth:.4g}, latency: {l.latency:.4g}}}"
        d = self.device
        lines = [f"format: {FORMAT}", f"name: {self.name}", f"nodes: {self.nodes}",
                 f"devices_per_node: {self.devices_per_node}",
                 f"intra_node: {link(self.intra_node)}    # bytes/s, s per message",
                 f"inter_node: {link(self.inter_node)}",
                 f"device: {{name: {d.name!r}, flops: {d.flops:.4g}, memory_bandwidth: {d.memory_bandwidth:.4g}, "
                 f"overhead: {d.overhead:.4g}{'' if d.im2col else ', im2col: false'}"
                 f"{'' if d.memory is None else f', memory: {d.memory:.4g}'}}}"]
        if self.sync != "allreduce":
            lines.append(f"sync: {self.sync}")
        if self.switches:
            lines.append("switches:    # innermost first: nodes under one switch, and the link across it")
            lines += [f"  - {{name: {s.name}, nodes: {s.nodes}, "
                      + (f"oversubscription: {_exact(s.oversubscription)}, " if s.oversubscription != 1 else "")
                      + f"bandwidth: {_exact(s.link.bandwidth)}, latency: {_exact(s.link.latency)}}}"
                      for s in self.switches]
        if self.allreduce:
            lines.append("allreduce:    # the library's algorithms: small by recursive doubling, large by a ring")
            lines += [f"  {level}: {{small: {link(r.small)}, large: {link(r.large)}}}"
                      for level, r in self.allreduce.items()]
        if self.measured:
            import yaml
            lines.append(yaml.safe_dump({"measured": self.measured}, default_flow_style=None, sort_keys=False)
                         .rstrip())
        return "\n".join(lines) + "\n"


def _exact(value):
    """``value`` with 4 significant digits where that reads back as the same float, else in full."""
    short = f"{value:.4g}"
    return short if float(short) == value else repr(float(value))


def _number(value):
    """YAML 1.1 reads ``1.8e10`` (no sign in the exponent) as a string: accept it as the number it means."""
    try:
        return float(value) if isinstance(value, str) else value
    except ValueError:          # not a number: the caller says what it expected
        return value


def _positive(value, where, key):
    value = _number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise MachineError(f"{where}: '{key}' must be a positive number, got {value!r}")
    return float(value)


def _latency(value, where):
    latency = _number(value)
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not 0 <= latency < float("inf"):
        raise MachineError(f"{where}: 'latency' must be a number >= 0 (seconds), got {latency!r}")
    return float(latency)


def _link(data, where):
    check_keys(data, _LINK_KEYS, where, required=("bandwidth", "latency"))
    return Link(_positive(data["bandwidth"], where, "bandwidth"), _latency(data["latency"], where))


def _count(value, where, key):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MachineError(f"{where}: '{key}' must be a positive integer, got {value!r}")
    return value


def from_mapping(data, source="<machine>"):
    try:
        check_keys(data, _KEYS, source, required=("format", "nodes", "devices_per_node", "intra_node"))
        if data["format"] != FORMAT:
            raise MachineError(f"{source}: format must be {FORMAT!r}, got {data['format']!r}")
        nodes = _count(data["nodes"], source, "nodes")
        per_node = _count(data["devices_per_node"], source, "devices_per_node")
        intra = _link(data["intra_node"], f"{source}: intra_node")
        inter = _link(data["inter_node"], f"{source}: inter_node") if "inter_node" in data else intra
        device = Device() if data.get("device") is None else _device(data["device"], f"{source}: device")
        switches = _switches(data.get("switches"), f"{source}: switches", inter)
        allreduce = _regimes(data.get("allreduce"), f"{source}: allreduce", switches)
    except MachineError:
        raise
    except FormatError as error:
        raise MachineError(str(error)) from None
    return Machine(str(data.get("name", "machine")), nodes, per_node, intra, inter, device, source,
                   data.get("measured") or {}, allreduce, data.get("sync", "allreduce"),     # sync: checked there
                   switches)    # that the last level covers the nodes: checked there


def _device(spec, where):
    """The :class:`Device` of a machine file's ``device`` mapping."""
    check_keys(spec, _DEVICE_KEYS, where)
    im2col, memory, default = spec.get("im2col", True), spec.get("memory"), Device()
    if not isinstance(im2col, bool):
        raise MachineError(f"{where}: 'im2col' must be true (convolutions build im2col columns, as on CPUs) or false "
                           f"(cuDNN on GPUs), got {im2col!r}")
    return Device(str(spec.get("name", default.name)),
                  *(_positive(spec.get(key, getattr(default, key)), where, key)
                    for key in ("flops", "memory_bandwidth", "overhead")),
                  im2col, None if memory is None else _positive(memory, where, "memory"))


def _switches(data, where, inter):
    """The :class:`Switch` levels of the ``switches`` list (None: none), each link derived from the one below."""
    if data is None:
        return ()
    if not isinstance(data, list):
        raise MachineError(f"{where}: must be a list of switch levels, innermost first, each {{name, nodes, "
                           f"oversubscription, latency, bandwidth}}, got {data!r}")
    found, below = [], inter
    for index, spec in enumerate(data):
        at = f"{where}[{index}]"
        check_keys(spec, _SWITCH_KEYS, at, required=("name", "nodes"))
        name = spec["name"]
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise MachineError(f"{at}: 'name' must be a word of letters, digits and _ . + -, got {name!r}")
        if name in _LEVELS or any(name == switch.name for switch in found):
            taken = "a level of its own" if name in _LEVELS else "an earlier switch level"
            raise MachineError(f"{at}: 'name' {name!r} is taken (by {taken}); the levels' names must differ from "
                               "each other and from intra_node and inter_node")
        nodes = _count(spec["nodes"], at, "nodes")
        if not found and nodes < 2:
            raise MachineError(f"{at}: 'nodes' must be at least 2 (the nodes under one switch of the first level), "
                               f"got {nodes}")
        if found and (nodes <= found[-1].nodes or nodes % found[-1].nodes):
            raise MachineError(f"{at}: 'nodes' must be a multiple of the level below's ({found[-1].name!r}: "
                               f"{found[-1].nodes} nodes) greater than it, got {nodes}")
        over = _number(spec.get("oversubscription", 1))
        if isinstance(over, bool) or not isinstance(over, (int, float)) or not 1 <= over < float("inf"):
            raise MachineError(f"{at}: 'oversubscription' must be a number >= 1 (the level below's bandwidth over "
                               f"this level's), got {over!r}")
        bandwidth = (_positive(spec["bandwidth"], at, "bandwidth") if "bandwidth" in spec
                     else below.bandwidth / over)
        latency = _latency(spec["latency"], at) if "latency" in spec else below.latency
        below = Link(bandwidth, latency)
        found.append(Switch(name, nodes, below, float(over)))
    return tuple(found)


def _regimes(data, where, switches=()):
    """``{level: Regimes}`` of the ``allreduce`` mapping (None: none given); its levels are ``intra_node``,
    ``inter_node`` and the names of the switch levels above the first."""
    if data is None:
        return {}
    levels = [*_LEVELS, *(switch.name for switch in switches[1:])]
    if not isinstance(data, dict):
        raise MachineError(f"{where}: must be a mapping of levels ({', '.join(levels)}), got {data!r}")
    if switches and switches[0].name in data:
        raise MachineError(f"{where}: {switches[0].name!r} is the first switch level, whose allreduces (between "
                           "the nodes under one such switch) are the 'inter_node' level's: give them there")
    check_keys(data, set(levels), where)
    found = {}
    for level, spec in data.items():
        if not isinstance(spec, dict):
            raise MachineError(f"{where}.{level}: must be a mapping with small and large, got {spec!r}")
        check_keys(spec, _REGIME_KEYS, f"{where}.{level}", required=("small", "large"))
        found[level] = Regimes(*(_link(spec[size], f"{where}.{level}.{size}") for size in ("small", "large")))
    return found


def load_machine(path):
    """The machine file at ``path``, or a shipped one named bare (``paper-p100-4x4``: in ``jobs/machines/``)."""
    path = shipped(path, "jobs/machines")
    return from_mapping(read_yaml(path, "machine file")[0], path)


def parse_machine_text(text, source="<machine>"):
    return from_mapping(load_yaml_text(text, source), source)


LOCAL_TEXT = """\
format: spmdcnn-machine/1
name: local
nodes: 1
devices_per_node: 16
intra_node: {bandwidth: 9.5e+9, latency: 4.0e-6}
inter_node: {bandwidth: 9.5e+9, latency: 4.0e-6}
device: {name: cpu, flops: 1.2e+11, memory_bandwidth: 8.5e+9, overhead: 7.0e-7}
allreduce:
  intra_node: {small: {bandwidth: 2.1e+9, latency: 5.3e-6}, large: {bandwidth: 6.8e+9, latency: 0}}
"""


def default_machine():
    """The machine model used when a job or command names none: ``jobs/machines/local.yaml``'s numbers."""
    return parse_machine_text(LOCAL_TEXT, "the built-in local machine (jobs/machines/local.yaml)")
