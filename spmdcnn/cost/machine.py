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
names one; ``flops`` and ``memory_bandwidth`` are the rates of the analytic model used for tiles no profile covers.
``spmdcnn calibrate`` measures all of these under ``mpiexec``.

Allreduces run the algorithm an MPI library or NCCL picks for the size (:class:`Regimes`): latency-bound small
messages by recursive doubling (``ceil(log2 p)`` steps of the whole message), bandwidth-bound large ones by a
ring (``2(p-1)`` steps of ``1/p`` of it); the model takes the faster, so the crossover follows from the two fits.
Each regime is a ``{bandwidth, latency}`` per level (a group within one node uses ``intra_node``'s, one that
spans nodes ``inter_node``'s); without ``allreduce``, both regimes of a level are its link. ``sync:
parameter-server`` sums parameter gradients through a server per replica group instead, as the paper's runtime
did (:class:`ParameterServer`); batch norm's statistics and the loss still use the allreduce regimes.
"""

import math
from collections import Counter

from dataclasses import dataclass, field, replace

import numpy as np

from ..io.yamlfile import FormatError, check_keys, load_yaml_text, read_yaml

FORMAT = "spmdcnn-machine/1"
_KEYS = {"format", "name", "nodes", "devices_per_node", "intra_node", "inter_node", "device", "description",
         "measured", "allreduce", "sync"}
SYNC_MODES = ("allreduce", "parameter-server")
_LEVELS = ("intra_node", "inter_node")
_REGIME_KEYS = {"small", "large"}
_LINK_KEYS = {"bandwidth", "latency"}
_DEVICE_KEYS = {"name", "flops", "memory_bandwidth", "overhead"}


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

    def allreduce(self, size, nbytes):
        """Seconds of summing ``nbytes`` over ``size`` devices: the faster of the two algorithms."""
        if size < 2:
            return 0.0
        doubling = math.ceil(math.log2(size)) * (nbytes / self.small.bandwidth + self.small.latency)
        ring = 2 * (size - 1) * (nbytes / size / self.large.bandwidth + self.large.latency)
        return min(doubling, ring)

    def allgather(self, size, nbytes):
        """Seconds of gathering ``nbytes`` from each of ``size`` devices on all of them (recursive doubling or a
        ring, the faster)."""
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

    def allreduce(self, size, nbytes):
        """Seconds of one way of ``nbytes`` between the ``size`` devices of the group and their server."""
        if size < 2:
            return 0.0
        return ((self.within - 1) * (nbytes / self.intra.bandwidth + self.intra.latency)
                + (self.across - 1) * (nbytes / self.inter.bandwidth + self.inter.latency))


@dataclass(frozen=True)
class Device:
    name: str = "cpu"
    flops: float = 5.0e10               # floating-point operations per second (analytic compute model)
    memory_bandwidth: float = 1.0e10    # bytes/s
    overhead: float = 1.0e-6             # s per NumPy call or kernel launch


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

    def __post_init__(self):
        if self.sync not in SYNC_MODES:
            raise MachineError(f"{self.source}: 'sync' must be 'allreduce' or 'parameter-server', got {self.sync!r}")

    @property
    def served(self):
        """Whether replica groups sum their gradients through parameter servers (``sync: parameter-server``)."""
        return self.sync == "parameter-server"

    def regimes(self, group):
        """The :class:`Regimes` of allreduces over the devices ``group``: of ``inter_node`` when it spans nodes.
        None for fewer than two devices."""
        if len(group) < 2:
            return None
        level = "intra_node" if len({self.node_of(d) for d in group}) == 1 else "inter_node"
        found = self.allreduce.get(level)
        if found is None:
            link = getattr(self, level)
            found = Regimes(link, link)
        return found

    def gradient_sum(self, group):
        """How the devices ``group`` sum their parameter gradients: the allreduce :class:`Regimes` of the group's
        level, or a :class:`ParameterServer` under ``sync: parameter-server``; either's ``allreduce(size, nbytes)``
        gives the seconds (of one way, for a server). None for fewer than two devices."""
        if len(group) < 2:
            return None
        if not self.served:
            return self.regimes(group)
        per_node = Counter(self.node_of(device) for device in group)
        return ParameterServer(max(per_node.values()), len(per_node), self.intra_node, self.inter_node)

    @property
    def max_devices(self):
        return self.nodes * self.devices_per_node

    def node_of(self, device):
        return device // self.devices_per_node

    def link(self, a, b):
        return self.intra_node if self.node_of(a) == self.node_of(b) else self.inter_node

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
        inverse, latency = np.zeros((count, count)), np.zeros((count, count))
        node = np.arange(count) // self.devices_per_node
        same = node[:, None] == node[None, :]
        inverse[...] = np.where(same, 1 / self.intra_node.bandwidth, 1 / self.inter_node.bandwidth)
        latency[...] = np.where(same, self.intra_node.latency, self.inter_node.latency)
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
                 f"overhead: {d.overhead:.4g}}}"]
        if self.sync != "allreduce":
            lines.append(f"sync: {self.sync}")
        if self.allreduce:
            lines.append("allreduce:    # the library's algorithms: small by recursive doubling, large by a ring")
            lines += [f"  {level}: {{small: {link(r.small)}, large: {link(r.large)}}}"
                      for level, r in self.allreduce.items()]
        if self.measured:
            import yaml
            lines.append(yaml.safe_dump({"measured": self.measured}, default_flow_style=None, sort_keys=False)
                         .rstrip())
        return "\n".join(lines) + "\n"


def _number(value):
    """YAML 1.1 reads ``1.8e10`` (no sign in the exponent) as a string: accept it as the number it means."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _positive(value, where, key):
    value = _number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise MachineError(f"{where}: '{key}' must be a positive number, got {value!r}")
    return float(value)


def _link(data, where):
    check_keys(data, _LINK_KEYS, where, required=("bandwidth", "latency"))
    latency = _number(data["latency"])
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or latency < 0:
        raise MachineError(f"{where}: 'latency' must be a number >= 0 (seconds), got {latency!r}")
    return Link(_positive(data["bandwidth"], where, "bandwidth"), float(latency))


def _count(value, where, key):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MachineError(f"{where}: '{key}' must be a positive integer, got {value!r}")
    return value


def from_mapping(data, source="<machine>"):
    try:
        check_keys(data, _KEYS, source, required=("format", "nodes", "devices_per_node", "intra_node"))
    except FormatError as error:
        raise MachineError(str(error)) from None
    if data["format"] != FORMAT:
        raise MachineError(f"{source}: format must be {FORMAT!r}, got {data['format']!r}")
    nodes = _count(data["nodes"], source, "nodes")
    per_node = _count(data["devices_per_node"], source, "devices_per_node")
    try:
        intra = _link(data["intra_node"], f"{source}: intra_node")
        inter = _link(data["inter_node"], f"{source}: inter_node") if "inter_node" in data else intra
        device = Device()
        if data.get("device") is not None:
            spec = data["device"]
            check_keys(spec, _DEVICE_KEYS, f"{source}: device")
            device = Device(str(spec.get("name", device.name)),
                            *(_positive(spec.get(key, getattr(device, key)), f"{source}: device", key)
                              for key in ("flops", "memory_bandwidth")),
                            _positive(spec.get("overhead", device.overhead), f"{source}: device", "overhead"))
        allreduce = _regimes(data.get("allreduce"), f"{source}: allreduce")
    except MachineError:
        raise
    except FormatError as error:
        raise MachineError(str(error)) from None
    return Machine(str(data.get("name", "machine")), nodes, per_node, intra, inter, device, source,
                   data.get("measured") or {}, allreduce, data.get("sync", "allreduce"))   # sync: checked there


def _regimes(data, where):
    """``{level: Regimes}`` of the ``allreduce`` mapping (None: none given)."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise MachineError(f"{where}: must be a mapping of levels (intra_node, inter_node), got {data!r}")
    check_keys(data, set(_LEVELS), where)
    found = {}
    for level, spec in data.items():
        if not isinstance(spec, dict):
            raise MachineError(f"{where}.{level}: must be a mapping with small and large, got {spec!r}")
        check_keys(spec, _REGIME_KEYS, f"{where}.{level}", required=("small", "large"))
        found[level] = Regimes(_link(spec["small"], f"{where}.{level}.small"),
                               _link(spec["large"], f"{where}.{level}.large"))
    return found


def load_machine(path):
    data, _ = read_yaml(path, "machine file")
    return from_mapping(data, str(path))


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
