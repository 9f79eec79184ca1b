"""Whole training iterations measured in place, for a profile (:mod:`.profile`) and the trials (:mod:`.trials`):
a training step of a model on one rank or on the ranks under a plan (:func:`training_step`), the job's batches
read as its run reads them (:class:`JobReads`), the reference iteration every tile time is scaled by
(:func:`reference_iteration`) and what the ranks lose where they meet, from data-parallel steps taken one after the
other (:func:`synchronization`)."""

import statistics
import time
from typing import NamedTuple

import numpy as np

from ..backend import synchronizer
from ..cost.calibrate import timings
from .optimizer import SGD

class JobReads:
    """``training_step``'s ``feed`` that reads a job's batches as its run will (``plan: auto``), at the
    calibration's batch size: its dataset (``source``, opened), read dtype, ``workers`` and ``prefetch`` (the
    job's keys, ``auto`` deciding as for a run of ``run_steps``). Reading a batch costs a step more than the read's own wait (it runs between the kernels and
    evicts their data), so the profile's calibration takes its steps this way when it can, and the plan's
    prediction then includes the reading."""

    def __init__(self, source, dtype, workers, prefetch, run_steps, local_ranks=1):
        self.source, self.dtype = source, dtype
        self.workers, self.prefetch, self.run_steps, self.local_ranks = workers, prefetch, run_steps, local_ranks
        self.loader = None

    def describe(self):
        return f"{self.source.path}, workers {self.workers}, prefetch {self.prefetch}"

    def __call__(self, executor):
        from ..io.prefetch import Loader
        stop = max(self.run_steps or 0, CALIBRATION_WARMUP + CALIBRATION_STEPS[1])
        batch = executor.plan.batch         # the calibration's: the job's, or its share times the ranks
        self.loader = Loader(self.source, executor.data_reads(), batch, self.dtype,
                             self.source.batches_per_epoch(batch), 0, stop, self.workers, self.prefetch,
                             local_ranks=self.local_ranks, auto_steps=self.run_steps)      # auto: as the run's
        return lambda index: self.loader.next(index)[0]

    def close(self):
        if self.loader is not None:
            self.loader.close(grace=0)
            self.loader = None


def training_step(graph, batch, xp, dtype, world=None, plan=None, seed=0, feed=None, sync=None, batchnorm=None):
    """``step(index)``: one training iteration (forward, backward, SGD update) of ``graph`` at global ``batch`` on
    one fixed synthetic batch, the whole model here or, with ``plan``, this rank's share of it on the ranks of
    ``world``. ``feed``: a function of the executor that gives the batch of each step index instead (a function
    of the index: ``spmdcnn bench --data``)."""
    from ..io.synthetic import SyntheticData
    from .executor import Executor, array_batch
    executor = Executor(graph, xp, dtype, seed=seed, plan=plan, world=world, sync=sync, batchnorm=batchnorm)
    optimizer = SGD(executor.params.shapes, executor.param_dtype, xp, lr=1e-3, momentum=0.9, weight_decay=5e-4)
    update = optimizer.updater(executor.params.flat, executor.grads.flat)
    if feed is None:
        images, labels = SyntheticData.for_model(graph, batch, seed=seed).batch(0, 0, batch, dtype)
        fixed = array_batch(xp.asarray(images), xp.asarray(labels))

        def batch_of(index):
            return fixed
    else:
        batch_of = feed(executor)

    def step(index=0):
        executor.forward(batch_of(index), step=index)
        executor.backward(update=update)
    step.executor = executor
    return step


def reference_iteration(graph, batch, xp, dtype, world, repeats=5, warmup=2, seconds=None):
    """Median seconds of a training iteration of the whole model at ``batch`` on this rank alone (every rank at
    once: the contention of training, without its communication). A fresh process's first iterations run slower
    (its heap grows, pages fault in), one iteration can differ from the next by a fifth on a shared machine, and
    such a machine can be slow for a second at a time: two warm-up iterations, then the median of at least
    ``repeats``, as many as fill ``seconds`` (None: :data:`REFERENCE_S`; at most :data:`REFERENCE_MOST`), the same
    count on every rank (their iterations run side by side throughout)."""
    run, sync = training_step(graph, batch, xp, dtype), synchronizer(xp)
    count = _warm_up(run, sync, world, warmup, REFERENCE_S if seconds is None else seconds, (repeats, REFERENCE_MOST))
    return statistics.median(timings(run, count, 0, sync=sync))


def _warm_up(step, sync, world, warmup, seconds, bounds):
    """Run ``warmup`` steps of ``step`` (``sync`` ending each) from a barrier; return how many steps fill
    ``seconds`` at the slowest rank's pace, within ``bounds`` (fewest, most): the same count on every rank."""
    world.barrier()
    began = time.perf_counter()
    for index in range(warmup):
        step(index)
        sync()
    taken = max(world.allgather((time.perf_counter() - began) / max(warmup, 1)))
    fewest, most = bounds
    return max(fewest, min(most, int(seconds / max(taken, 1e-6))))


REFERENCE_S = 1.0       # seconds of iterations the reference iteration's median is taken over, at least five
REFERENCE_MOST = 100    # and at most this many


POINT_KINDS = ("loss", "batchnorm")      # the collectives on a data-parallel step's critical path
CALIBRATION_S = 2.0     # seconds of data-parallel steps a profile's calibration trains
CALIBRATION_STEPS = (5, 200)    # the fewest and most of them
CALIBRATION_WARMUP = 2  # steps before them
BLOCKS = 5              # stretches of them, each timed as a run's log line times its steps


def typical_step(totals, blocks=BLOCKS):
    """The step a run's log lines show most often, from steps taken one after the other (``totals``, seconds):
    the median of the mean steps of up to ``blocks`` equal stretches of them, each of three steps or more (a log
    line's step is the mean over its stretch; under six steps, the mean of all). On a shared machine whose speed
    wanders for a second at a time, the mean of all the steps carries a slow second into every prediction; the
    median of five stretches' means is not moved by a slow spell within two of them, and the mean within each
    still counts every hiccup a run's steps have."""
    count = min(blocks, len(totals) // 3) or 1
    return float(np.median([statistics.fmean(part) for part in np.array_split(np.asarray(totals), count)]))


class Synchronization(NamedTuple):
    """What the ranks lose where they synchronize beyond the profile's compute and the machine's collectives
    (:func:`synchronization`): a point after ``gap`` seconds of the model's compute since the ranks last met costs
    ``latency + drift * gap``."""

    latency: float      # seconds per point
    drift: float        # seconds per second of the model's compute since the ranks last met
    points: int         # synchronization points per data-parallel step
    measured: float     # the data-parallel step measured (seconds: the slowest rank's typical_step)


def synchronization(graph, batch, world, xp, dtype, cost, steps=None, warmup=CALIBRATION_WARMUP, feed=None):
    """The :class:`Synchronization` of the ranks of ``world``, in the units of ``cost`` (a
    :class:`~spmdcnn.cost.model.CostModel` of ``graph`` at ``batch`` on them from the profile being measured):
    the data-parallel plan trains for a few steps one after the other (no barrier between them, as in training;
    ``steps`` None: about :data:`CALIBRATION_S` of them, within :data:`CALIBRATION_STEPS`),
    and each segment of a step (a rank's step starts where its previous one ended), from the end of one point where
    every rank meets (the loss's sum, batch norm's gathers and sums) to the end of the next, is set against what
    the cost model gives it: the profile's compute and the machine's collective. Ranks drift apart (uneven cores,
    the operating system), ranks that share cores take turns, and each meeting costs a wake-up: the excess is
    fitted as ``latency + drift * gap`` (both at least 0), ``gap`` the model's compute in the segment. Measured
    in the model's own units, a wait is never counted twice: when ranks share cores, the profile's compute
    already includes their taking turns (:func:`reference_iteration`), and what is left is the meeting.
    ``feed``: :func:`training_step`'s (a :class:`JobReads`: the job's batches read as its run reads them; None,
    a fixed synthetic batch)."""
    from ..cost.timeline import layer_lanes, walk
    from ..tiling.plan import named
    plan = named("data", graph, batch, world.size)
    step, sync = training_step(graph, batch, xp, dtype, world, plan, feed=feed), synchronizer(xp)
    segments, totals = [], []
    filling = _warm_up(step, sync, world, warmup, CALIBRATION_S, CALIBRATION_STEPS)
    steps = filling if steps is None else steps
    world.reset()
    mark = time.perf_counter()
    for index in range(warmup, warmup + steps):        # one after the other, as training runs them
        start, seen = mark, len(world.counters.intervals)
        step(index)
        sync()
        mark = time.perf_counter()
        totals.append(mark - start)
        ends = sorted(end for _, end, what in world.counters.intervals[seen:] if what in POINT_KINDS)
        segments.append(np.diff([start] + ends))
    world.reset()
    walked = walk(layer_lanes(cost, plan)[1], cost.loss_sum(world.size), lambda gap: 0.0)
    gaps = np.array([gap for gap, _, _ in walked.points])
    modelled = gaps + np.array([communication for _, communication, _ in walked.points])
    counted = {len(segment) for segment in segments}
    mine = np.median(segments, axis=0) if counted == {len(gaps)} else None
    ranks = world.allgather(mine)
    measured = max(world.allgather(typical_step(totals)))
    if any(r is None for r in ranks) or not len(gaps):
        return Synchronization(0.0, 0.0, len(gaps), measured)
    excess = np.median(ranks, axis=0) - modelled
    latency, drift = _fit_wait(gaps, excess)
    return Synchronization(latency, drift, len(gaps), measured)


def _fit_wait(gaps, excess):
    """``(a, b)``, both at least 0, of the least-squares fit ``excess ~ a + b * gaps``."""
    if len(gaps) > 1 and np.ptp(gaps) > 0:
        b, a = np.polyfit(gaps, excess, 1)
        if a >= 0 and b >= 0:
            return float(a), float(b)
    a = max(float(np.mean(excess)), 0.0)
    b = max(float(np.dot(excess, gaps) / np.dot(gaps, gaps)), 0.0) if np.dot(gaps, gaps) > 0 else 0.0
    if not a:
        return 0.0, b
    if not b:
        return a, 0.0
    fits = [(float(np.sum((excess - a) ** 2)), (a, 0.0)), (float(np.sum((excess - b * gaps) ** 2)), (0.0, b))]
    return min(fits)[1]
