"""The job's communicator, with the counters ``spmdcnn bench`` reports and the checks every rank runs together."""

import hashlib
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..backend import array_module
from .errors import CollectiveError
from .server import Pull, push
from .transport import HostTransport, mpi
from .watchdog import Board, Watchdog

_HOST = HostTransport()         # the parameter server's transfers: MPI on host memory, whatever the job's transport

# what MPI launchers (mpiexec of MPICH, Open MPI, MVAPICH, Intel MPI; srun with PMI or PMIx) put in the environment
LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE",
                      "MPI_LOCALNRANKS")


def slurm_tasks():
    """The number of tasks of the Slurm job step this process belongs to (1 outside ``srun``)."""
    value = os.environ.get("SLURM_STEP_NUM_TASKS", "")
    return int(value) if value.isdigit() else 1


def launched():
    """Whether this process was started by an MPI launcher (``SPMDCNN_MPI=0/1`` overrides the guess)."""
    forced = os.environ.get("SPMDCNN_MPI")
    if forced in ("0", "1"):
        return forced == "1"
    return any(variable in os.environ for variable in LAUNCHER_VARIABLES) or slurm_tasks() > 1


@dataclass
class Counters:
    """Seconds and bytes per kind of communication since the last :meth:`World.reset`."""

    transfer_s: float = 0.0        # redistribution between layers (forward and backward), including waiting
    sync_exposed_s: float = 0.0    # the part of sync_s this rank spent waiting (not hidden behind backward)
    bytes_transferred: int = 0     # bytes this rank sent to other ranks in redistributions
    bytes_synced: int = 0          # bytes this rank contributed to allreduces, or pushed and pulled through servers
    intervals: list = field(default_factory=list, repr=False)     # (start, end, what) of the recent allreduces
    settled_s: float = 0.0         # the union of the allreduces compacted out of ``intervals``

    KEEP = 4096                    # intervals kept before the oldest are compacted into ``settled_s``

    def busy(self, start, end, what="allreduce"):
        """Count ``[start, end)`` as time an allreduce (``what``: ``gradients``, ``batchnorm``, ``loss``) was going
        on. A long run (training never resets the counters) keeps the most recent ones and the union of the rest."""
        self.intervals.append((start, end, what))
        if len(self.intervals) > self.KEEP:
            ordered = sorted(self.intervals)
            old, self.intervals = ordered[:-self.KEEP // 2], ordered[-self.KEEP // 2:]
            self.settled_s += _union(old)

    @property
    def sync_s(self):
        """Gradient allreduces (start to completion), batchnorm statistics, loss reduction: the time any of them
        was going on (allreduces in flight together count once)."""
        return self.settled_s + _union(sorted(self.intervals))


def _union(ordered):
    """The length of the union of ``(start, end, ...)`` intervals sorted by start."""
    total, reach = 0.0, float("-inf")
    for start, end, *_ in ordered:
        start = max(start, reach)
        if end > start:
            total += end - start
            reach = end
    return total


class InFlight:
    """One sum in flight (``pending``: a transport's Pending, or a server's Pull), counted: ``sync_s`` gets the time
    from its start (``started``) until it was seen complete, ``sync_exposed_s`` only the time this rank spent
    starting it (until now) and blocked in :meth:`wait`; ``bytes_synced`` this rank's ``nbytes``."""

    def __init__(self, counters, pending, started, nbytes):
        self.counters, self.pending, self.started, self.finished = counters, pending, started, None
        self.counters.sync_exposed_s += time.perf_counter() - started
        self.counters.bytes_synced += nbytes

    def test(self):
        """Whether it has completed (each call lets MPI progress it: that time is exposed too)."""
        if self.finished is None:
            start = time.perf_counter()
            complete = self.pending.test()
            now = time.perf_counter()
            self.counters.sync_exposed_s += now - start
            if complete:
                self._finish(now)
        return self.finished is not None

    def wait(self):
        if self.finished is None:
            start = time.perf_counter()
            self.pending.wait()
            now = time.perf_counter()
            self.counters.sync_exposed_s += now - start
            self._finish(now)

    def _finish(self, now):
        done = self.pending.finished_at() if self.pending.finished_at is not None else None
        self.finished = now if done is None else min(done, now)      # the thread's clock, where it tells
        self.counters.busy(self.started, self.finished, "gradients")


class Served(InFlight):
    """A sum through a parameter server whose push is done (:meth:`World.serve`: exposed) and whose pull is on its
    way: an :class:`InFlight` from the push's start; ``array``, a device array the host copy goes back to."""

    def __init__(self, counters, pull, started, nbytes, array=None):
        super().__init__(counters, pull, started, nbytes)
        self.array = array

    def _finish(self, now):
        if self.array is not None:
            self.array.set(self.pending.array)
        super()._finish(now)


class World:
    """``rank``, ``size`` and collective helpers over an mpi4py communicator.

    ``World.create()`` is COMM_WORLD under an MPI launcher and a one-rank world without MPI otherwise (a process
    started alone never initialises MPI, which on some clusters' login nodes fails or hangs).
    """

    def __init__(self, comm=None):
        self.comm = comm
        self.rank = 0 if comm is None else comm.Get_rank()
        self.size = 1 if comm is None else comm.Get_size()
        self.counters = Counters()
        self.subcomms = {}          # sorted ranks -> sub-communicator (None where this rank is not a member)
        self.lanecomms = {}         # sorted ranks -> its twin for gradient buckets (members only)
        self.transport = HostTransport()     # replaced by the job's choice (comm.transport.choose)
        self.board = Board()        # where this rank is, for the watchdog (:mod:`.watchdog`)
        self.watchdog = None
        self._watches, self._watch_comm = 0, None   # watches so far; their communicator (:meth:`watch_comm`)

    @classmethod
    def create(cls):
        if not launched():
            return cls(None)
        world = cls(mpi().COMM_WORLD)
        if world.size == 1 and slurm_tasks() > 1 and not any(v in os.environ for v in LAUNCHER_VARIABLES):
            # each task would train alone, all writing the same checkpoint: stop instead
            raise RuntimeError(
                f"srun started {slurm_tasks()} tasks but MPI sees one rank in each: mpi4py does not use the MPI "
                "that srun's PMI talks to. Use srun --mpi=pmix (or pmi2), or build mpi4py against the site's MPI "
                "(env MPICC=$(which mpicc) pip install --no-binary=mpi4py mpi4py)")
        return world

    def reset(self):
        self.counters = Counters()

    def watch(self, settings):
        """Start the stall watchdog (:mod:`.watchdog`; ``settings``: a :class:`~.watchdog.Settings`); collective.
        Nothing to watch on one rank."""
        if self.size > 1:
            settings = self.bcast(settings)     # rank 0's: the ranks watch alike even when their jobs differ
        if self.size > 1 and settings.on and self.watchdog is None:
            self._watches += 1
            self.watchdog = Watchdog(self, settings, self._watches).start()
        return self

    def watch_comm(self):
        """The watchdogs' own communicator (collective the first time; one for every watchdog of this world, so
        that a run after a run makes none)."""
        if self._watch_comm is None:
            self._watch_comm = self.comm.Dup()
        return self._watch_comm

    def unwatch(self):
        """Stop this rank's watchdog (each rank alone)."""
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None

    def local_rank(self):
        """This rank's index among the ranks on its node (collective the first time): a shared-memory split of
        the world, which holds whatever the launcher (srun, mpiexec inside an allocation, ...) sets; alone, the
        launcher's variables (:func:`spmdcnn.backend.local_rank`)."""
        return self.node_ranks()[0]

    def node_ranks(self):
        """``(this rank's index on its node, the number of ranks on its node)``; collective the first time."""
        if self.comm is None:
            from ..backend import local_rank
            return local_rank(), 1
        return self._node()[:2]

    def _node(self):
        """``(index on its node, ranks on its node, the node's lowest rank)``: one shared-memory split of the world,
        which holds whatever the launcher set; collective the first time."""
        if getattr(self, "_node_info", None) is None:
            node = self.comm.Split_type(mpi().COMM_TYPE_SHARED)
            self._node_info = node.Get_rank(), node.Get_size(), node.allreduce(self.rank, op=mpi().MIN)
            node.Free()
        return self._node_info

    def allreduce(self, array, comm=None, what="sum"):
        """Sum the contiguous ``array`` over ``comm`` (the world by default) in place, through the transport;
        returns it. ``what`` names it in traces (``loss``, ``batchnorm``)."""
        comm = self.comm if comm is None else comm
        if comm is not None and comm.Get_size() > 1:
            start = time.perf_counter()
            self.transport.allreduce(array, comm)
            end = time.perf_counter()
            self.counters.busy(start, end, what)
            self.counters.sync_exposed_s += end - start
            self.counters.bytes_synced += array.nbytes
        return array

    def node_ids(self):
        """The node of every rank (the lowest rank on it), in rank order (:meth:`_node`); collective the first
        time."""
        if self.comm is None:
            return [0]
        if getattr(self, "_node_ids", None) is None:
            self._node_ids = self.comm.allgather(self._node()[2])
        return self._node_ids

    def serve(self, array, comm, nodes, index):
        """Push the contiguous ``array`` to the group's parameter server over ``comm`` and start pulling the sum
        back into it (:mod:`.server`; ``nodes``: each member's node; ``index``: the sum's place among the group's,
        the same on every member), on host memory (a device array is staged): the push is waited for here
        (exposed), the pull is the returned :class:`Served` to test and wait on."""
        start = time.perf_counter()
        host = _HOST.send_buffer(array)             # the array itself when it is a contiguous host one
        steps = push(host, comm, nodes, _HOST, index)
        # bytes: the push and the pull, each the array's (as the cost model counts a server's sum)
        return Served(self.counters, Pull(host, comm, steps, mpi(), index), start, 2 * array.nbytes,
                      None if host is array else array)

    def allgather_array(self, array, comm):
        """The ``array`` of every rank of ``comm``, stacked in rank order: ``(size,) + array.shape``, on the host
        (small arrays: batchnorm's statistics; a device array is copied down and the result copied up)."""
        host = np.ascontiguousarray(array.get() if not isinstance(array, np.ndarray) else array)
        self.board.note("batch-norm statistics")
        out = np.empty((comm.Get_size(),) + host.shape, dtype=host.dtype)
        start = time.perf_counter()
        comm.Allgather(host, out)
        end = time.perf_counter()
        self.counters.busy(start, end, "batchnorm")
        self.counters.sync_exposed_s += end - start
        self.counters.bytes_synced += host.nbytes
        return out if isinstance(array, np.ndarray) else array_module(array).asarray(out)

    def start_allreduce(self, array, comm):
        """Start summing the contiguous ``array`` over ``comm`` in place without waiting: an :class:`InFlight`
        to :meth:`~InFlight.test` and :meth:`~InFlight.wait` on (``array`` is not to be touched before)."""
        started = time.perf_counter()
        return InFlight(self.counters, self.transport.iallreduce(array, comm), started, array.nbytes)

    def use(self, transport):
        """Move bytes with ``transport`` from now on (collective: it attaches to the world and the replica
        groups' communicators made so far)."""
        self.transport.close()
        self.transport = transport
        transport.attach(self.comm)
        for sub in list(self.subcomms.values()) + list(self.lanecomms.values()):
            if sub is not None:
                transport.attach(sub)

    def sum_scalars(self, *values):
        """The sums over all ranks of a few numbers (float64)."""
        return tuple(self.allreduce(np.array(values, dtype=np.float64), what="loss").tolist())

    def agree(self, fn):
        """Run ``fn`` on every rank; if it raised anywhere, raise a :class:`CollectiveError` on every rank with the
        message of the lowest failing rank. Returns ``fn``'s result. With one rank, errors pass unchanged."""
        if self.size == 1:
            return fn()
        try:
            result, error = fn(), None
        except (ValueError, OSError, RuntimeError, MemoryError) as failure:
            result, error = None, failure
        messages = self.comm.allgather(None if error is None else str(error) or type(error).__name__)
        failed = [(rank, text) for rank, text in enumerate(messages) if text is not None]
        if failed:
            rank, text = failed[0]
            where = "" if len(failed) == self.size else f" (on rank {rank})"
            raise CollectiveError(f"{text}{where}") from error
        return result

    def check_same(self, items):
        """Stop with one message when the ranks do not hold the same ``items`` (``{what: text}``): the model,
        plan and job every rank loaded."""
        digests = {what: hashlib.sha256(text.encode()).hexdigest() for what, text in items.items()}
        everyone = self.allgather(digests)
        for what in items:
            differing = [rank for rank, d in enumerate(everyone) if d[what] != everyone[0][what]]
            if differing:
                raise CollectiveError(
                    f"the ranks do not hold the same {what}: rank {differing[0]} differs from rank 0 "
                    f"({len(differing)} of {self.size} ranks differ); every rank must read the same files "
                    "and options")

    def bcast(self, obj, root=0):
        return self.comm.bcast(obj, root=root) if self.size > 1 else obj

    def bcast_array(self, array, root=0):
        """Broadcast a contiguous host array in place (every rank passes one of the same shape and dtype)."""
        if self.size > 1:
            self.comm.Bcast(array, root=root)
        return array

    def gather(self, obj, root=0):
        return self.comm.gather(obj, root=root) if self.size > 1 else [obj]

    def allgather(self, obj):
        return self.comm.allgather(obj) if self.size > 1 else [obj]

    def barrier(self):
        if self.size > 1:
            self.comm.Barrier()
