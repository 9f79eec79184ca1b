"""``spmdcnn calibrate``: measure the machine model (docs/formats.md#machine-files) on the ranks of a job.

- allreduces: :func:`spmdcnn.comm.calibrate.measure_allreduces` sums 8 B to 64 MiB over groups of 2, 4, ... ranks
  of a node (and of one rank per node, across nodes) and fits each level's ``allreduce`` regimes: recursive
  doubling to the small messages, a ring to the large ones.
- links: :func:`spmdcnn.comm.calibrate.measure_links` times the runtime's exchanges between the ranks of a node
  and between nodes, all pairs at once, and fits ``t = latency + bytes / bandwidth``. With one node,
  ``inter_node`` is ``intra_node`` (nothing crosses nodes in such a job); with one rank per node, ``intra_node``
  is ``inter_node``; one process measures no link and writes :data:`DEFAULT_LINK` (shared memory, conservative).
- device: float32 matrix multiply rate on convolution-sized GEMMs (``flops``), bytes/s of a large ``add``
  counting its three arrays (``memory_bandwidth``), seconds per call of a tiny op (``overhead``); measured
  on every rank at once, so that ranks sharing cores or memory see the contention they will see in training,
  and averaged over the ranks. The device is the CPU with NumPy (named by the CPU model and BLAS threads per
  rank), or with ``--backend cupy`` each rank's GPU (named by the GPU).
- switches: where every rank has Slurm's topology variables (:mod:`spmdcnn.comm.topology`), the levels of
  switches the job's nodes span, innermost first, named ``switch1``, ``switch2``, ...: ``inter_node`` is measured
  between nodes under one first-level switch, and each level above between one pair of nodes whose lowest common
  switch is of it (its latency, and its bandwidth unless the next is measured) and with every node of two children of one such switch
  across it at once (its bandwidth, where each child has two or more nodes); ``oversubscription`` is the level
  below's bandwidth over it (at least 1). A level's ``nodes`` is the most job nodes under one of its switches:
  the real switches may hold more. Without the variables no switch level is written.

The machine's ``measured`` key keeps the raw points, so the file documents what was measured.
"""

import os
import platform
import re
import socket
import statistics
import time

import numpy as np

from ..backend import synchronizer
from ..comm.calibrate import measure_allreduces, measure_links
from .machine import Device, Link, Machine, Regimes, Switch

DEFAULT_LINK = Link(bandwidth=5.0e9, latency=5.0e-6)
# (M, K, N) of the im2col GEMM of a 3x3 convolution: 128 -> 256 channels on a 32x32 tile; 64 -> 64 channels
# on 56x56; 256 -> 512 channels on 14x14
GEMMS = ((1024, 1152, 256), (3136, 576, 64), (196, 2304, 512))
STREAM_BYTES = 64 << 20         # per array of the np.add: far larger than any cache
TINY = 16                       # elements of the op that times the per-call overhead
_NAME = re.compile(r"[A-Za-z0-9_.+-]+")


def cpu_name():
    """The CPU model (``model name`` in /proc/cpuinfo, without (R) and (TM)), or what Python knows of it."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            model = next((line.split(":", 1)[1] for line in cpuinfo if line.startswith("model name")), "")
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "cpu"
    return " ".join(re.sub(r"\((R|TM|tm|r)\)", "", model).split())


def processor_name(xp=np, ranks=1):
    """What runs the kernels: this rank's GPU (CuPy), or the CPU model and its BLAS threads (NumPy; in this
    process, or with ``ranks`` in each rank of a job of that many ranks on this node). The threads are read from
    the thread variables spmdcnn sets (or the user did) and the usable cores, never from an optional package, so
    that a profile's name is the same whatever is installed."""
    if xp is np:
        from .. import threads_per_rank
        return f"{cpu_name()} x{threads_per_rank(ranks)}"
    return xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)["name"].decode()


def timings(fn, repeats, warmup=1, calls=1, sync=None):
    """Seconds of one call of ``fn`` (timed over ``calls`` calls), ``repeats`` times, after ``warmup`` untimed
    calls; ``sync`` (a device stream's synchronization) ends every call."""
    run = fn if sync is None else (lambda: (fn(), sync()))
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        times.append((time.perf_counter() - start) / calls)
    return times


def median_seconds(fn, repeats, warmup=1, calls=1, sync=None):
    """The median of :func:`timings`."""
    return statistics.median(timings(fn, repeats, warmup, calls, sync))


def spread(times):
    """How much repeated timings of one thing disagree: (slowest - fastest) / median (0 for one timing)."""
    return (max(times) - min(times)) / statistics.median(times) if len(times) > 1 else 0.0


def device_rates(quick=False, barrier=lambda: None, xp=np):
    """This rank's ``{"name", "gemm_seconds": [...], "flops", "memory_bandwidth", "overhead"}``: the GEMMs' median times
    and the rate over all of them (total FLOPs / total time), the ``add``'s bytes/s, the tiny op's seconds, on the
    CPU (NumPy) or this rank's GPU (CuPy; every call ends with the stream's synchronization). ``barrier`` starts
    each measurement on every rank at once."""
    rng = np.random.default_rng(0)
    sync = None if xp is np else synchronizer(xp)
    repeats = 3 if quick else 25
    gemms = GEMMS[:1] if quick else GEMMS
    gemm_seconds = []
    for m, k, n in gemms:
        a = xp.asarray(rng.standard_normal((m, k), dtype=np.float32))
        b = xp.asarray(rng.standard_normal((k, n), dtype=np.float32))
        out = xp.empty((m, n), dtype=np.float32)
        barrier()
        gemm_seconds.append(median_seconds(lambda: xp.matmul(a, b, out=out), repeats, sync=sync))
    flops = sum(2 * m * k * n for m, k, n in gemms) / sum(gemm_seconds)
    count = STREAM_BYTES // 4
    x, y, z = xp.full(count, 1.0, np.float32), xp.full(count, 2.0, np.float32), xp.empty(count, np.float32)
    barrier()
    stream = median_seconds(lambda: xp.add(x, y, out=z), repeats, sync=sync)
    small = [xp.ones(TINY, np.float32) for _ in range(3)]
    barrier()
    overhead = median_seconds(lambda: xp.add(small[0], small[1], out=small[2]), repeats, calls=1000)
    return {"name": processor_name(xp), "gemm_seconds": gemm_seconds, "flops": flops,
            "memory_bandwidth": 3 * STREAM_BYTES / stream, "overhead": overhead}


def _round(value):
    """A plain float with 4 significant digits, for the ``measured`` record."""
    return float(f"{value:.4g}")


def host_name():
    """This host's name, as a machine name may spell it (``node-17`` of ``node-17.cluster.example``): calibrate's
    default, so that a measured machine is not taken for the built-in ``local``."""
    short = socket.gethostname().split(".")[0]
    name = re.sub(r"[^A-Za-z0-9_.+-]", "-", short).strip("-")
    return name or "measured"


def check_name(name):
    """Refuse a machine name that would not read back from the YAML as written."""
    if not _NAME.fullmatch(name or ""):
        raise ValueError(f"calibrate: machine name {name!r} may use only letters, digits and _ . + -")


def calibrate(world, name="local", quick=False, xp=np):
    """Measure the machine the ranks of ``world`` run on (a collective: every rank calls it and gets the same
    :class:`Machine`): the links through the world's transport, and the device (``xp``: NumPy, the CPU; CuPy,
    each rank's GPU). ``quick``: fewer sizes, shapes and repetitions (seconds, for tests)."""
    check_name(name)
    start = time.perf_counter()
    world.board.stage("calibrate", slow=True)        # where this rank is, for the watchdog
    where, links = measure_links(world, quick, xp)
    allreduces = measure_allreduces(world, quick, xp)
    world.board.at("calibrate", "the device's rates")
    rates = world.allgather(device_rates(quick, world.barrier, xp))    # every rank at once: training's contention
    device = Device(rates[0]["name"],
                    *(statistics.fmean(r[key] for r in rates) for key in ("flops", "memory_bandwidth", "overhead")),
                    im2col=xp is np)       # on GPUs cuDNN runs the convolutions: no im2col columns
    intra = links.get("intra_node") or links.get("inter_node")
    inter = links.get("inter_node") or intra
    measured = {"ranks": world.size, "hosts": sorted(set(where.hosts), key=where.hosts.index),
                "placement": "block" if where.block else "not block", "transport": world.transport.name}
    for kind in ("intra_node", "inter_node"):
        m = links.get(kind)
        measured[kind] = _measured_link(m) if m else _unmeasured(kind, where, world.size)
    if allreduces:
        measured["allreduce"] = {kind: {"groups": list(m.groups), "bytes": list(m.sizes),
                                        "seconds": [[_round(t) for t in times] for times in m.seconds],
                                        "fit": {regime: {"bandwidth": _round(bw), "latency": _round(lat)}
                                                for regime, (lat, bw) in (("small", m.small), ("large", m.large))}}
                                 for kind, m in allreduces.items()}
    regimes = {kind: Regimes(Link(m.small[1], m.small[0]), Link(m.large[1], m.large[0]))
               for kind, m in allreduces.items()}
    gemms = GEMMS[:len(rates[0]["gemm_seconds"])]
    measured["device"] = {
        "gemm_shapes_mkn": [list(shape) for shape in gemms],
        "gemm_seconds_rank0": [_round(s) for s in rates[0]["gemm_seconds"]],
        "flops_per_rank": [_round(r["flops"]) for r in rates],
        "add_bytes": 3 * STREAM_BYTES,
        "memory_bandwidth_per_rank": [_round(r["memory_bandwidth"]) for r in rates],
        "overhead_per_rank": [_round(r["overhead"]) for r in rates]}
    across = _link(inter)
    switches, measured["switches"] = _switches(where.topology, links,
                                               Link(_round(across.bandwidth), _round(across.latency)))
    warnings = [w for w in (where.warning(),) if w]
    if switches and not where.topology.block:
        warnings.append("the nodes are not numbered switch by switch (node n under switch n // nodes at each level), "
                        "as the machine model numbers them; its switch levels are approximate for this job")
    if warnings:
        measured["warnings"] = warnings
    measured["quick"] = bool(quick)
    measured["seconds"] = _round(world.bcast(time.perf_counter() - start))
    return Machine(name, where.nodes, where.per_node, _link(intra), _link(inter), device, source="calibrate",
                   measured=measured, allreduce=regimes, switches=switches)


def _switches(topology, links, inter):
    """``(switches, measured)``: the :class:`Switch` levels of ``topology`` with their measured links (the first
    level's is ``inter_node``) and what ``measured`` records of them (a sentence where none)."""
    if not topology.levels:
        return (), topology.note or "not measured: the job's nodes share no switch level"
    found = [Switch("switch1", topology.sizes[0], inter)]
    record = [{"name": "switch1", "nodes": topology.sizes[0], "link": "inter_node"}]
    for (pair, loaded), nodes in zip(links.get("switches", ()), topology.sizes[1:]):
        below = found[-1].link
        bandwidth = (loaded or pair).bandwidth
        link = Link(_round(bandwidth), _round(pair.latency))
        found.append(Switch(f"switch{len(found) + 1}", nodes, link, _round(max(1.0, below.bandwidth / bandwidth))))
        record.append({"name": found[-1].name, "nodes": nodes, "pair": _measured_link(pair),
                       "loaded": _measured_link(loaded) if loaded else
                       "not measured: no switch of this level has two children of two or more nodes"})
    return tuple(found), record


def _link(m):
    return DEFAULT_LINK if m is None else Link(m.bandwidth, m.latency)


def _measured_link(m):
    return {"pairs_at_once": m.pairs, "bytes": list(m.sizes), "seconds": [_round(s) for s in m.seconds],
            "fit": {"bandwidth": _round(m.bandwidth), "latency": _round(m.latency)}}


def _unmeasured(kind, where, ranks):
    if ranks == 1:
        return "not measured: one process; conservative shared-memory default"
    if kind == "inter_node":
        return "not measured: one node; inter_node = intra_node"
    return "not measured: one rank per node; intra_node = inter_node"


def summary(machine, path=None):
    """The lines ``spmdcnn calibrate`` prints about ``machine``."""
    measured, d = machine.measured, machine.device

    def link(kind):
        entry, value = measured.get(kind), getattr(machine, kind)
        numbers = f"{value.bandwidth / 1e9:.2f} GB/s, {value.latency * 1e6:.1f} us latency"
        if isinstance(entry, dict):
            return f"{numbers} ({entry['pairs_at_once']} pair{'s' * (entry['pairs_at_once'] != 1)} at once)"
        return f"{numbers} ({entry})" if entry else numbers
    ranks = measured.get("ranks", machine.max_devices)
    lines = [f"machine {machine.name}: {ranks} rank{'s' * (ranks != 1)} on {machine.nodes} "
             f"node{'s' * (machine.nodes != 1)}, {machine.devices_per_node} per node "
             f"(measured in {measured.get('seconds', 0):.1f} s)",
             f"  links measured through the {measured.get('transport', 'host')} transport",
             f"  intra-node: {link('intra_node')}",
             f"  inter-node: {link('inter_node')}",
             f"  device {d.name!r}: {d.flops / 1e9:.1f} GFLOP/s (float32 matmul), {d.memory_bandwidth / 1e9:.2f} GB/s "
             f"memory, {d.overhead * 1e6:.2f} us per op call"]
    for kind, regimes in machine.allreduce.items():
        groups = measured.get("allreduce", {}).get(kind, {}).get("groups", [])
        lines.append(f"  allreduce {kind.replace('_', '-')} (groups of {', '.join(map(str, groups))}): small messages "
                     f"{regimes.small.bandwidth / 1e9:.2f} GB/s, {regimes.small.latency * 1e6:.1f} us a step; large "
                     f"{regimes.large.bandwidth / 1e9:.2f} GB/s, {regimes.large.latency * 1e6:.1f} us a step")
    if ranks == 1:
        lines.append("note: link numbers need mpiexec -n 2 or more (mpiexec -n K spmdcnn calibrate -o FILE); "
                     "wrote conservative shared-memory defaults")
    for switch in machine.switches[1:]:
        lines.append(f"  switch level {switch.name} ({switch.nodes} nodes under one switch): "
                     f"{switch.link.bandwidth / 1e9:.2f} GB/s, {switch.link.latency * 1e6:.1f} us latency, "
                     f"{switch.oversubscription:g}:1 oversubscribed")
    if isinstance(measured.get("switches"), str):
        lines.append(f"  switch levels: {measured['switches']}")
    lines += [f"warning: {w}" for w in measured.get("warnings", ())]
    if path:
        lines.append(f"wrote {path}")
    return lines


def to_json(machine, path=None):
    """``machine`` as a JSON-ready dict (what ``spmdcnn calibrate --json`` prints)."""
    d = machine.device
    return {"path": path, "name": machine.name, "nodes": machine.nodes, "devices_per_node": machine.devices_per_node,
            "intra_node": vars(machine.intra_node), "inter_node": vars(machine.inter_node),
            "switches": [{"name": s.name, "nodes": s.nodes, "oversubscription": s.oversubscription, **vars(s.link)}
                         for s in machine.switches],
            "device": {"name": d.name, "flops": d.flops, "memory_bandwidth": d.memory_bandwidth,
                       "overhead": d.overhead}, "measured": machine.measured}


def prepare_output(path):
    """Make the directory of ``path`` (before measuring, so that a path that cannot be written fails at once)."""
    if os.path.isdir(path):
        raise OSError(f"calibrate: output {path!r} is a directory; give a file name such as {path}/local.yaml")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def write_machine(machine, path):
    """Write ``machine``'s YAML to ``path``, making its directory."""
    prepare_output(path)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(machine.to_yaml())
