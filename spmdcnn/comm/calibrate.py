"""Measuring the links between ranks for ``spmdcnn calibrate``: which node each rank is on, and how long the
runtime's exchanges take between two ranks of one node and between two nodes.

An exchange is what :class:`~spmdcnn.comm.exchange.Exchange` does: post the receive, post the send, wait for
both, through the world's transport (host buffers; on GPUs, device buffers staged through the host or handed to a
CUDA-aware MPI or NCCL). All pairs exchange at once, both ways, so each link is measured under the load
training puts on it (ranks of one node share its memory bus; ranks of two nodes share their network adapters).

No deadlock is possible: the pairs come from the placement that every rank gathered, so every rank computes the
same pairs; every rank runs the same barriers and collectives in the same order, a rank without a partner in a
round only joining the barriers; and a pair's two ranks post the same number of exchanges.
"""

import os
import platform
import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..backend import array_module
from .topology import ADDRESS, PATTERN, find_topology, level_node_pairs, loaded_node_pairs, rank_partners
from .world import mpi

SIZES = (8, 1 << 10, 1 << 16, 1 << 20, 1 << 22, 1 << 24)     # bytes per message: 8 B, 1 KiB, ... 16 MiB
QUICK_SIZES = (8, 1 << 16, 1 << 20, 1 << 22)
BATCH_BYTES = 1 << 20       # small messages are timed in batches of back-to-back exchanges of about this many
                            # bytes, so that the barrier's skew (microseconds) does not count as latency
TAG = 1


@dataclass(frozen=True)
class Placement:
    """Where the ranks run: ``hosts[r]`` is rank r's processor name, ``node_of[r]`` its node (nodes numbered in
    rank order of first appearance), ``per_node`` the most ranks on one node, ``addresses[r]`` its Slurm
    topology ``(address, pattern)`` or None (:mod:`spmdcnn.comm.topology`)."""

    hosts: tuple
    node_of: tuple
    per_node: int
    addresses: tuple = ()

    @property
    def topology(self):
        """The :class:`~spmdcnn.comm.topology.Topology` of the nodes under their switches."""
        return find_topology(self.node_of, self.addresses)

    @property
    def nodes(self):
        return max(self.node_of) + 1

    @property
    def block(self):
        """Whether ranks fill nodes one after another (rank r on node r // per_node), as the machine model's
        device numbering assumes."""
        return all(node == rank // self.per_node for rank, node in enumerate(self.node_of))

    def warning(self):
        """A sentence saying how the placement differs from block placement, or None."""
        if self.block:
            return None
        first = next(r for r, node in enumerate(self.node_of) if node != r // self.per_node)
        return (f"ranks are not placed node by node (rank {first} is on node {self.node_of[first]}, "
                f"{self.hosts[first]}, not on node {first // self.per_node}); the machine model numbers devices "
                f"node by node ({self.per_node} per node), so launch jobs with block placement (mpiexec "
                "--map-by core, srun --distribution=block) for its links to be the right ones")


def placement(world):
    """The :class:`Placement` of ``world``'s ranks (a collective: every rank calls it)."""
    name = mpi().Get_processor_name() if world.comm is not None else platform.node()
    address, pattern = os.environ.get(ADDRESS), os.environ.get(PATTERN)
    found = world.allgather((name, (address, pattern) if address and pattern else None))
    hosts = [host for host, _ in found]
    numbers = {}
    node_of = tuple(numbers.setdefault(host, len(numbers)) for host in hosts)
    per_node = max(node_of.count(node) for node in range(len(numbers)))
    return Placement(tuple(hosts), node_of, per_node, tuple(where for _, where in found))


def intra_node_partners(node_of):
    """Each rank's partner on its own node (None for none): a node's ranks in rank order, paired first with
    second, third with fourth, ...; the last of an odd count sits out."""
    partner = [None] * len(node_of)
    for node in sorted(set(node_of)):
        ranks = [r for r, n in enumerate(node_of) if n == node]
        for a, b in zip(ranks[::2], ranks[1::2]):
            partner[a], partner[b] = b, a
    return partner


def inter_node_partners(node_of):
    """Each rank's partner on another node (None for none): nodes paired 0 with 1, 2 with 3, ...; the i-th rank
    of one node with the i-th of the other. A node left over (odd count) or ranks beyond the smaller node's
    count sit out."""
    partner = [None] * len(node_of)
    nodes = sorted(set(node_of))
    for first, second in zip(nodes[::2], nodes[1::2]):
        ranks_a = [r for r, n in enumerate(node_of) if n == first]
        ranks_b = [r for r, n in enumerate(node_of) if n == second]
        for a, b in zip(ranks_a, ranks_b):
            partner[a], partner[b] = b, a
    return partner


@dataclass(frozen=True)
class LinkMeasurement:
    """One level's exchanges: ``seconds[i]`` is the time of one exchange of ``sizes[i]`` bytes each way (the
    slowest pair's median), with ``pairs`` pairs exchanging at once; ``latency`` and ``bandwidth`` fit them."""

    kind: str
    pairs: int
    sizes: tuple
    seconds: tuple
    latency: float
    bandwidth: float


def fit_link(sizes, seconds):
    """``(latency, bandwidth)`` of ``t = latency + bytes / bandwidth`` fitted to the points by least squares on
    the relative error, ``sum(((latency + s / bandwidth - t) / t) ** 2)``: the small messages' times fix the
    latency, the large ones' the bandwidth. A negative latency (noise) is clamped to zero and the slope refitted;
    times that do not grow with the size give the bandwidth of the largest message alone."""
    s = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if s.size < 2 or np.any(t <= 0) or np.any(s <= 0):
        raise ValueError(f"fit_link: need two or more positive sizes and times, got sizes {list(sizes)} and "
                         f"times {list(seconds)}")
    (latency, slope), *_ = np.linalg.lstsq(np.stack([1 / t, s / t], axis=1), np.ones_like(t), rcond=None)
    if latency < 0:
        latency, slope = 0.0, np.sum(s / t) / np.sum((s / t) ** 2)
    if slope <= 0:
        largest = np.argmax(s)
        return float(np.min(t)), float(s[largest] / t[largest])
    return float(latency), float(1 / slope)


def _exchange_seconds(world, partner, send, receive, repeats, warmup, batch):
    """This rank's median time of one exchange with ``partner`` (None: only the barriers, returns None), through
    the world's transport as training's exchanges go (device buffers staged, or handed to MPI or NCCL)."""
    comm, transport = world.comm, world.transport
    times = []
    for repeat in range(warmup + repeats):
        world.barrier()
        start = time.perf_counter()
        if partner is not None:
            for _ in range(batch):
                buffer = transport.recv_buffer(receive)
                transport.exchange(comm, [(buffer, partner, TAG)], [(transport.send_buffer(send), partner, TAG)])
                if buffer is not receive:
                    receive[...] = array_module(receive).asarray(buffer)
        if repeat >= warmup:
            times.append((time.perf_counter() - start) / batch)
    return statistics.median(times) if partner is not None else None


def measure_link(world, kind, partner, sizes, repeats, warmup, max_batch, xp=np):
    """Time the exchanges of every size between the pairs ``partner`` (the same list on every rank) and fit
    them, with buffers of ``xp`` (NumPy, or CuPy on the GPUs). A collective: every rank calls it with the same
    arguments."""
    largest = max(sizes)
    send, receive = xp.ones(largest, dtype=np.uint8), xp.empty(largest, dtype=np.uint8)
    mine = []
    for size in sizes:
        batch = max(1, min(max_batch, BATCH_BYTES // size))
        world.board.at("calibrate", f"{kind} links, {size:,} bytes")      # where this rank is, for the watchdog
        mine.append(_exchange_seconds(world, partner[world.rank], send[:size], receive[:size], repeats, warmup,
                                      batch))
    everyone = [times for times in world.allgather(mine) if times[0] is not None]
    seconds = tuple(max(times[i] for times in everyone) for i in range(len(sizes)))
    latency, bandwidth = fit_link(sizes, seconds)
    pairs = sum(p is not None for p in partner) // 2
    return LinkMeasurement(kind, pairs, tuple(sizes), seconds, latency, bandwidth)


def measure_links(world, quick=False, xp=np):
    """``(placement, {"intra_node": LinkMeasurement, "inter_node": ..., "switches": [(pair, loaded), ...]})``; a
    level with no pair to measure (one rank per node; one node) is missing. With Slurm's topology
    (:attr:`Placement.topology`), ``inter_node`` pairs nodes under one switch of the first level, and for each
    switch level above, ``pair`` is one pair of nodes whose lowest common switch is of that level (all their
    ranks, i-th with i-th) and ``loaded`` (or None) every node of two children of one such switch across it at
    once. A collective: every rank calls it. One process measures nothing."""
    where = placement(world)
    links = {}
    if world.size == 1:
        return where, links
    sizes = QUICK_SIZES if quick else SIZES
    repeats, warmup, max_batch = (3, 1, 8) if quick else (15, 3, 64)
    topology = where.topology
    across = (rank_partners(where.node_of, level_node_pairs(topology, 0)) if topology.levels
              else inter_node_partners(where.node_of))
    for kind, partner in (("intra_node", intra_node_partners(where.node_of)), ("inter_node", across)):
        if any(p is not None for p in partner):
            links[kind] = measure_link(world, kind, partner, sizes, repeats, warmup, max_batch, xp)
    if len(topology.levels) > 1:
        links["switches"] = []
        for level in range(1, len(topology.levels)):
            kind = f"switch{level + 1}"
            one = rank_partners(where.node_of, level_node_pairs(topology, level)[:1])
            loaded = loaded_node_pairs(topology, level)
            links["switches"].append((
                measure_link(world, kind, one, sizes, repeats, warmup, max_batch, xp),
                measure_link(world, kind, rank_partners(where.node_of, loaded), sizes, repeats, warmup, max_batch,
                             xp) if loaded else None))
    return where, links


# allreduce message sizes: 8 B to 64 MiB, the span over which libraries switch algorithms
ALLREDUCE_SIZES = (8, 64, 512, 1 << 12, 1 << 15, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26)
QUICK_ALLREDUCE_SIZES = (8, 1 << 12, 1 << 18, 1 << 20)
SMALL_BYTES = 1 << 16       # points up to this size fit the latency-bound regime
LARGE_BYTES = 1 << 20       # points from this size the bandwidth-bound one


@dataclass(frozen=True)
class AllreduceMeasurement:
    """One level's allreduces: ``seconds[g][i]`` is the slowest member's median time of summing ``sizes[i]``
    bytes (float32) over the first ``groups[g]`` ranks of the level; ``small`` and ``large`` are the
    ``(latency, bandwidth)`` fits of recursive doubling and of a ring to them."""

    kind: str
    groups: tuple
    sizes: tuple
    seconds: tuple
    small: tuple
    large: tuple


def allreduce_groups(node_of, first_switch=None):
    """``{level: [ranks, ...]}``: the groups whose allreduces calibrate times, the same on every rank. Within a
    node: the first 2, 4, 8, ... ranks of node 0 and all of them; across nodes: the first rank of the first 2, 4,
    ... nodes and of all (``first_switch[n]``, node n's switch of the first level where known: of the nodes under
    node 0's). A level with fewer than two ranks has none."""
    nodes = sorted(set(node_of))
    if first_switch:
        nodes = [node for node in nodes if first_switch[node] == first_switch[nodes[0]]]
    first = [r for r, n in enumerate(node_of) if n == nodes[0]]
    leaders = [min(r for r, n in enumerate(node_of) if n == node) for node in nodes]

    def prefixes(ranks):
        counts = sorted({c for c in (2 ** k for k in range(1, len(ranks).bit_length())) if c <= len(ranks)}
                        | ({len(ranks)} if len(ranks) > 1 else set()))
        return [tuple(ranks[:c]) for c in counts]
    return {level: groups for level, groups in (("intra_node", prefixes(first)), ("inter_node", prefixes(leaders)))
            if groups}


def fit_allreduce(groups, sizes, seconds):
    """``(small, large)``: the ``(latency, bandwidth)`` of recursive doubling, ``ceil(log2 p) * (latency + n /
    bandwidth)``, fitted to the points up to :data:`SMALL_BYTES`, and of a ring, ``2(p - 1) * (latency + n / p /
    bandwidth)``, to those from :data:`LARGE_BYTES` (all points where a range has fewer than two), by least
    squares on the relative error; a negative latency (noise) is clamped to zero and the slope refitted."""
    rows = [(p, n, t) for p, times in zip(groups, seconds) for n, t in zip(sizes, times)]

    def fit(points, steps, share):
        x = np.array([[steps(p), steps(p) * share(p) * n] for p, n, _ in points], dtype=np.float64)
        t = np.array([t for _, _, t in points], dtype=np.float64)
        (latency, slope), *_ = np.linalg.lstsq(x / t[:, None], np.ones_like(t), rcond=None)
        if latency < 0:
            column = x[:, 1] / t
            latency, slope = 0.0, float(np.sum(column) / np.sum(column ** 2))
        if slope <= 0:
            slope = min(t[i] / x[i, 1] for i in range(len(t)))
        return float(latency), float(1 / slope)

    small = [r for r in rows if r[1] <= SMALL_BYTES]
    large = [r for r in rows if r[1] >= LARGE_BYTES]
    doubling = fit(small if len(small) >= 2 else rows, lambda p: int(np.ceil(np.log2(p))), lambda p: 1.0)
    ring = fit(large if len(large) >= 2 else rows, lambda p: 2 * (p - 1), lambda p: 1.0 / p)
    return doubling, ring


def _allreduce_seconds(world, comm, array, repeats, warmup, batch):
    """This rank's median time of one allreduce of ``array`` over ``comm`` (None: not a member; only the
    barriers), through the world's transport."""
    times = []
    for repeat in range(warmup + repeats):
        world.barrier()
        start = time.perf_counter()
        if comm is not None:
            for _ in range(batch):
                world.transport.allreduce(array, comm)
        if repeat >= warmup:
            times.append((time.perf_counter() - start) / batch)
    return statistics.median(times) if comm is not None else None


def measure_allreduces(world, quick=False, xp=np):
    """``{level: AllreduceMeasurement}`` of the groups of :func:`allreduce_groups` (a collective: every rank
    calls it; one process measures nothing)."""
    if world.size == 1:
        return {}
    where = placement(world)
    sizes = QUICK_ALLREDUCE_SIZES if quick else ALLREDUCE_SIZES
    repeats, warmup, max_batch = (3, 1, 4) if quick else (7, 2, 32)
    buffer = xp.ones(max(sizes) // 4, dtype=np.float32)
    found, kept = {}, []        # the groups' communicators live on: a transport may key its own by them
    topology = where.topology
    for level, groups in allreduce_groups(where.node_of, topology.levels[0] if topology.levels else None).items():
        seconds = []
        for ranks in groups:
            world.board.at("calibrate", f"allreduces over {len(ranks)} ranks ({level})")
            member = world.rank in ranks
            sub = world.comm.Split(0 if member else mpi().UNDEFINED, key=world.rank)
            if member:
                world.transport.attach(sub)
            mine = [_allreduce_seconds(world, sub if member else None, buffer[:size // 4], repeats, warmup,
                                       max(1, min(max_batch, BATCH_BYTES // size))) for size in sizes]
            kept.append(sub)
            everyone = [times for times in world.allgather(mine) if times[0] is not None]
            seconds.append(tuple(max(times[i] for times in everyone) for i in range(len(sizes))))
        counts = tuple(len(ranks) for ranks in groups)
        small, large = fit_allreduce(counts, sizes, seconds)
        found[level] = AllreduceMeasurement(level, counts, tuple(sizes), tuple(seconds), small, large)
    return found
