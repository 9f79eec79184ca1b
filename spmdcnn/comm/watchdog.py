"""The stall watchdog (docs/architecture.md#when-a-rank-stalls): a job that stops making progress says which rank holds
it up and where, and ends, instead of spinning in MPI until its allocation runs out.

Each rank's main thread writes where it is on its :class:`Board` (a tuple assigned at once: the step, a count of
the points every rank passes in the same order, what it is doing and since when): a few hundred assignments a
step. A thread of each rank sends its board to the two monitors (:func:`monitors`: rank 0 and the lowest rank
on another node) every ``beat`` seconds (a small message on a communicator of its own, numbered by its watch; a
send the monitor has not taken yet is not repeated). A monitor's thread takes those messages and judges: the job
moves while some rank's board changes. When none has for ``warn`` seconds, the first monitor still heard from
prints one line naming the ranks that have not reached the point the others wait at, where each of them is and
for how long, and which ranks it has not heard from (a stopped rank, a lost node, or a rank stuck in a call that
holds Python's lock); ``abort`` seconds later it prints the line again
and calls ``MPI_Abort`` (exit status :data:`STATUS`), which ends every rank of the job, the stopped ones
included. A checkpoint is only ever replaced by a complete new file, so the last one is untouched.

The threads need ``MPI_THREAD_MULTIPLE`` (mpi4py asks for it; MPICH and Open MPI give it); without it a rank's
watchdog watches only its own board and says so. Blocking MPI calls release Python's lock in mpi4py, so the
threads run while the main thread waits inside one.
"""

import atexit
import math
import socket
import sys
import threading
import time
from dataclasses import dataclass

from .transport import mpi

STATUS = 3                  # the job's exit status when the watchdog ends it
WARN_FLOOR_S = 60.0         # the automatic warn: at least this, and 20 steps
ABORT_FLOOR_S = 540.0       # the automatic abort, after the warning: at least this (60 + 540: NCCL's 10 minutes)
WARN_STEPS, ABORT_STEPS = 20, 100
SLOW = 5                    # the automatic thresholds of a slow phase (a first step, a checkpoint, a profile)
_TAG = 7301

WORDS = {"setup": "setting up", "data": "reading its batch", "forward": "forward", "loss": "summing the loss",
         "backward": "backward", "gradients": "summing gradients", "evaluation": "evaluating",
         "checkpoint": "writing the checkpoint", "profile": "profiling", "plan": "planning",
         "calibrate": "calibrating", "trial": "timing a candidate plan", "done": "finished"}


class Board:
    """Where this rank is, written by its main thread and read by its watchdog's: :attr:`where` is ``(stage, point,
    step, kind, name, note, since, slow)``. ``stage`` counts the steps and other stages (an evaluation, a
    checkpoint) and ``point`` the points every rank passes in the same order within one (a layer's forward or
    backward, the loss, the gradient sums): ranks compare by the two. ``kind`` and ``name`` say where (``WORDS``;
    a layer's name), ``note`` what within it (its exchange, computing, batch-norm statistics), ``since`` when (the
    monotonic clock), ``slow`` whether the automatic thresholds are :data:`SLOW` times longer there."""

    def __init__(self):
        self.where = (0, 0, None, "setup", None, None, time.monotonic(), True)
        self.typical = None         # seconds of a step, once known: the automatic thresholds follow it
        self.saved = None           # what the last checkpoint is, for the watchdog's last line

    def stage(self, kind, step=None, slow=False, name=None):
        """A new stage (``step``: a training step's number, 0-based) that every rank begins in the same order."""
        self.where = (self.where[0] + 1, 0, step, kind, name, None, time.monotonic(), slow)

    def at(self, kind, name=None, note=None):
        """The next point of the stage (every rank passes the same points in the same order)."""
        stage, point, step, *_, slow = self.where
        self.where = (stage, point + 1, step, kind, name, note, time.monotonic(), slow)

    def note(self, text):
        """What the rank does within the point (not compared between ranks)."""
        where = self.where
        self.where = where[:5] + (text, time.monotonic(), where[7])


def describe(where, age):
    """The words for a board's ``where``, there for ``age`` seconds: ``step 6, forward of layer 'conv2' (its
    exchange), for 12 s``."""
    _, _, step, kind, name, note, _, _ = where
    text = WORDS.get(kind, kind)
    if name is not None:
        text += f" of layer '{name}'" if kind in ("forward", "backward") else f" ({name})"
    if note:
        text += f" ({note})"
    return (f"step {step + 1}, " if step is not None else "") + f"{text}, for {age:.0f} s"


@dataclass(frozen=True)
class Settings:
    """``watchdog`` of a job: ``warn`` and ``abort`` in seconds (None: from the step time, :meth:`thresholds`;
    ``abort`` False: warn only), or off."""

    on: bool = True
    warn: float = None
    abort: object = None

    @classmethod
    def of(cls, spec):
        """From a job's ``watchdog`` value: true (automatic), false (off) or ``{warn: S, abort: S}``, each S a
        number, ``auto`` or null; ``abort: false`` only warns."""
        if spec is False:
            return cls(on=False)
        if spec is True or spec is None:
            return cls()
        auto = (None, "auto")
        return cls(True, None if spec.get("warn") in auto else float(spec["warn"]),
                   None if spec.get("abort") in auto else False if spec["abort"] is False else float(spec["abort"]))

    @classmethod
    def parse(cls, text):
        """From a command's ``--watchdog``: ``auto``, ``off``, ``WARN`` or ``WARN,ABORT`` (seconds; ABORT may be
        ``never``)."""
        if text in ("auto", "off"):
            return cls(on=text == "auto")
        parts = text.split(",")
        try:
            if len(parts) > 2:
                raise ValueError
            warn = float(parts[0])
            abort = None if len(parts) == 1 else False if parts[1] == "never" else float(parts[1])
            if not _seconds(warn) or (abort is not None and abort is not False and not _seconds(abort)):
                raise ValueError
        except ValueError:
            raise ValueError(f"--watchdog {text}: give auto, off, WARN or WARN,ABORT (positive seconds; ABORT may "
                             "be never)") from None
        return cls(True, warn, abort)

    def thresholds(self, typical, slow):
        """``(warn, abort)`` seconds: ``abort`` counts from the warning (None: never)."""
        steps = typical or 0.0
        factor = SLOW if slow else 1
        warn = self.warn if self.warn is not None else factor * max(WARN_FLOOR_S, WARN_STEPS * steps)
        abort = (None if self.abort is False else self.abort if self.abort is not None
                 else factor * max(ABORT_FLOOR_S, ABORT_STEPS * steps))
        return warn, abort


class Watchdog:
    """The thread of one rank (:mod:`module docs <spmdcnn.comm.watchdog>`); :meth:`start` is collective.
    ``run``: this watch's number on its world (the same on every rank): a message of an earlier watch is ignored."""

    def __init__(self, world, settings, run=0, stream=None):
        self.world, self.settings, self.board, self.run = world, settings, world.board, run
        self.stream = stream or sys.stderr
        self.stopping = threading.Event()
        self.thread = self.comm = None
        self.size, self.rank = world.size, world.rank
        self.hosts, self.monitors, self.heard_all = [], [], True
        warn, _ = settings.thresholds(None, False)
        self.beat = min(1.0, warn / 4)
        self.heard = {}             # rank -> (its board's where, its typical step, when heard, its age then)
        self.moved = self.seen = self.warned = None
        self.sends = {}

    def start(self):
        """Begin watching (collective: every rank of the world calls it)."""
        self.comm = self.world.watch_comm()
        self.hosts = self.world.comm.allgather(socket.gethostname())
        self.heard_all = mpi().Query_thread() >= mpi().THREAD_MULTIPLE
        self.monitors = monitors(self.hosts) if self.heard_all else [self.rank]
        started = time.monotonic()
        ranks = range(self.size) if self.heard_all else [self.rank]
        self.heard = {rank: (self.board.where, None, started, 0.0) for rank in ranks}
        self.moved = started
        self.thread = threading.Thread(target=self._run, daemon=True, name="spmdcnn-watchdog")
        self.thread.start()
        atexit.register(self.stop)         # before mpi4py's MPI_Finalize, which atexit runs after it
        return self

    def stop(self):
        """End the thread (each rank alone; no collective)."""
        if self.thread is not None:
            self.stopping.set()
            self.thread.join()
            self.thread = None
            atexit.unregister(self.stop)

    def _run(self):
        while not self.stopping.wait(self.beat):
            try:
                self._send()
                if self.rank in self.monitors:
                    self._receive()
                    self._judge(time.monotonic())
            except Exception as error:      # the watchdog must never take a healthy job down
                print(f"spmdcnn: watchdog: rank {self.rank}: stopped watching: {error}", file=self.stream,
                      flush=True)
                return

    def _send(self):
        """This rank's board to each monitor (not again while the last one is on its way)."""
        where, now = self.board.where, time.monotonic()
        message = (self.run, where, self.board.typical, now - where[6])    # its age: the ranks' clocks may differ
        self.heard[self.rank] = message[1:3] + (now, now - where[6])
        for monitor in self.monitors:
            if monitor == self.rank:
                continue
            request = self.sends.get(monitor)
            if request is None or request.Test():
                self.sends[monitor] = self.comm.isend(message, dest=monitor, tag=_TAG)

    def _receive(self):
        status = mpi().Status()
        while self.comm.Iprobe(source=mpi().ANY_SOURCE, tag=_TAG, status=status):
            run, where, typical, age = self.comm.recv(source=status.Get_source(), tag=_TAG)
            if run == self.run:
                self.heard[status.Get_source()] = (where, typical, time.monotonic(), age)

    def _judge(self, now):
        places = tuple(heard[0] for heard in self.heard.values())
        if places != self.seen:
            if self.warned is not None and self._speaks(now):
                self._say(f"spmdcnn: watchdog: the job moved on after {now - self.moved:.0f} s without progress")
            self.seen, self.moved, self.warned = places, now, None
            return
        typical = max((heard[1] for heard in self.heard.values() if heard[1]), default=None)
        slow = any(where[7] for where in places)
        warn, abort = self.settings.thresholds(typical, slow)
        stalled = now - self.moved
        if stalled < warn:
            return
        if self.warned is None:
            self.warned = now
            if self._speaks(now):
                self._say(self.report(now) + (f" The job ends in {abort:.0f} s unless it moves on "
                                              "(watchdog.abort)." if abort is not None
                                              else " (watchdog.abort: false: it waits on)."))
        elif abort is not None and now - self.warned >= abort and (self._speaks(now) or not self.heard_all):
            saved = f" The last checkpoint, {self.board.saved}, is untouched." if self.board.saved else ""
            self._say(self.report(now) + f" Ending the job (watchdog.abort: {abort:.0f} s after the warning)."
                      + saved)
            time.sleep(0.5)         # the launcher forwards output through its proxies: let it pass first
            mpi().COMM_WORLD.Abort(STATUS)

    def _speaks(self, now):
        """Whether this monitor speaks: the first monitor heard from lately (the second when the first is
        silent); without MPI_THREAD_MULTIPLE, rank 0 warns (and every rank ends the job when it has waited)."""
        if not self.heard_all:
            return self.rank == 0
        first = next((rank for rank in self.monitors if rank == self.rank or not self._silent(rank, now)), None)
        return first == self.rank

    def _silent(self, rank, now):
        return now - self.heard[rank][2] > max(3 * self.beat, 2.0)

    def report(self, now):
        """The line naming the ranks that hold the job up, where each of them is and since when: the ranks at the
        earliest point any rank is at, when some rank is further on, or else those not heard from lately (stopped
        where the others wait); where the others wait; and the ranks not heard from."""
        silent = [rank for rank in self.heard if rank != self.rank and self._silent(rank, now)]
        earliest = min(heard[0][:2] for heard in self.heard.values())
        behind = [rank for rank, heard in self.heard.items() if heard[0][:2] == earliest]
        culprits = behind if len(behind) < len(self.heard) else silent
        others = [rank for rank in self.heard if rank not in culprits]
        if not self.heard_all:
            parts = [f"this rank, {self._places([self.rank], now)} (MPI gives no MPI_THREAD_MULTIPLE: it cannot "
                     "hear the others)"]
        elif culprits and others:
            verb = "has" if len(culprits) == 1 else "have"
            how = "not reached the point" if culprits is behind else "gone silent at the point"
            parts = [f"{_ranks(culprits)} {verb} {how} the other ranks wait at ({self._places(others, now)})",
                     self._places(culprits, now, alone=True)]
        else:
            parts = [f"every rank is at the same point ({self._places(list(self.heard), now)})"]
        if silent:
            parts.append(f"not heard from: {_ranks(silent)} (stopped, its node lost, or stuck in a call that "
                         "holds Python's lock, such as a hung file read)")
        return f"spmdcnn: watchdog: no progress for {now - self.moved:.0f} s: " + "; ".join(parts) + "."

    def _places(self, ranks, now, alone=False):
        """``rank 3: where`` for each place of ``ranks``, the ranks at one place together (``alone``: each rank
        on its own, with its node and when it was last heard from when it is silent); at most 8 places."""
        places = {}
        for rank in sorted(ranks):
            where = self.heard[rank][0]
            places.setdefault(rank if alone else where[:6], []).append(rank)
        texts = []
        for group in list(places.values())[:8]:
            where, _, heard_at, age = self.heard[group[0]]
            on = f" on {self.hosts[group[0]]}" if alone and len(set(self.hosts)) > 1 else ""
            last = f" (last heard from {now - heard_at:.0f} s ago)" if alone and self._silent(group[0], now) else ""
            texts.append(f"{_ranks(group)}{on}: {describe(where, age + now - heard_at)}{last}")
        more = len(places) - 8
        return "; ".join(texts) + (f"; and {more} more place{'s' * (more > 1)}" if more > 0 else "")

    def _say(self, line):
        print(line, file=self.stream, flush=True)


def monitors(hosts):
    """The ranks that judge: rank 0, and the lowest rank on another node than rank 0's (rank 1 on one node), so
    that a lost node does not take both."""
    if len(hosts) < 2:
        return [0]
    other = next((rank for rank, host in enumerate(hosts) if host != hosts[0]), 1)
    return [0, other]


def _seconds(value):
    """Whether ``value`` is a number of seconds a threshold may be: finite and positive."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _ranks(ranks):
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    return f"ranks {shown}"
