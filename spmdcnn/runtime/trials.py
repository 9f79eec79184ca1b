"""Trials: the cost model proposes, measurement disposes (docs/architecture.md#trials).

``plan: auto`` (and ``spmdcnn plan --trials K`` under ``mpiexec``) times the model's few best plans, data
parallelism always among them, for a few steps each on the job's own ranks and batches, and keeps data
parallelism unless another plan ran clearly faster (:func:`fastest`), then the fastest of those; when the one
kept and its closest rival ran too close for their steps to tell apart, the two are timed again and the same rule
chooses over both timings (:func:`contenders`, :func:`merged`). Each candidate
trains on an executor of its own, built from the job's seed and dropped after its steps: the run's weights,
optimizer and data order are those it would have without trials, so a run with trials equals the same run under
the plan they chose (and every plan equals one process). The trials take at most ``share`` of
the run's steps; what they measured is cached in the profile, keyed by the model, batch, ranks and sync options,
and a later run whose candidates are the same skips them.
"""

import gc
import hashlib
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..backend import synchronizer
from ..comm.errors import CollectiveError
from .insitu import JobReads, training_step
from .trace import traced_step


MOST_STEPS = 1000   # timed steps per plan, at most, whatever trials.seconds asks of a short predicted step
MARGIN = 0.03      # how much faster than data parallelism (or the model's choice) another plan must run to replace it


@dataclass(frozen=True)
class TrialSettings:
    """The job's ``trials`` mapping: ``plans`` timed (0 or 1: no trials), ``steps`` timed each after ``warmup``,
    or more where those would take less than ``seconds`` (a few steps of a few milliseconds tell plans apart by
    the scheduler's hiccups, not by their speed), and the most of the run's steps they may take (``share``)."""

    plans: int = 4
    steps: int = 6
    seconds: float = 1.0
    warmup: int = 2
    share: float = 0.1

    @classmethod
    def of(cls, spec):
        """From the job's ``trials`` mapping (None: the defaults)."""
        return cls(**(spec or {}))

    @property
    def on(self):
        return self.plans > 1

    def __post_init__(self):
        if self.steps < 2:
            raise ValueError(f"trials.steps must be 2 or more (one in each pass), got {self.steps}")

    def steps_within(self, count, run_steps, step_s=None):
        """Timed steps per plan for ``count`` plans within ``share`` of ``run_steps`` (None: the run's steps are
        unknown, no bound): :attr:`steps`, fewer when the share needs it (0 when not even two fit), or more where
        ``step_s`` (the fastest plan's predicted step; None: unknown) says they take less than :attr:`seconds`, as
        many more as leave room in the share for a run-off of two (:func:`contenders`). A plan runs :attr:`warmup`
        steps before its first pass and one before its second (:func:`run_trials`)."""
        def fits(plans):
            if run_steps is None:
                return MOST_STEPS
            return int(self.share * run_steps) // plans - self.warmup - 1      # and the second pass's warm-up
        steps = min(self.steps, fits(count))
        if steps < 2:
            return 0
        if step_s and step_s > 0:
            wanted = MOST_STEPS if self.seconds >= step_s * MOST_STEPS else math.ceil(self.seconds / step_s)
            steps = max(steps, min(wanted, fits(count + 2)))
        return steps

    def total(self, count, steps):
        """The steps ``count`` plans of ``steps`` (2 or more) timed steps take, warm-ups included."""
        return count * (self.warmup + steps + 1)


class Trial(NamedTuple):
    """One candidate: its ``label`` (how the planner found it), ``plan``, predicted seconds per step and the
    median measured (None when it could not run: ``error`` says why)."""

    label: str
    plan: object
    predicted_s: float
    measured_s: float = None
    error: str = None
    spread: float = 0.0         # how much its steps disagreed: (75th - 25th percentile) / median, the widest rank's
    passes: tuple = ()          # the median step of each pass (the slowest rank's)
    steps: int = 0              # steps timed (both passes; 0: not known, as in a cache written before it was kept)


def candidates(scored, count, data_plan, data_predicted_s):
    """The ``(label, plan, predicted seconds)`` to time: the planner's choice first (``scored[0]``), then the
    fastest other distinct plans of ``scored`` (``(label, plan, seconds)`` fastest first), ``count`` in all, data
    parallelism (``data_plan``, unless None: it does not fit) always among them."""
    chosen, seen = [], set()
    for label, plan, seconds in scored:
        if plan.text not in seen:
            seen.add(plan.text)
            chosen.append((label, plan, seconds))
    chosen = chosen[:count]
    if data_plan is not None and data_plan.text not in {plan.text for _, plan, _ in chosen}:
        chosen = chosen[:count - 1] + [("data parallelism", data_plan, data_predicted_s)]
    return chosen


def cache_key(graph, batch, ranks, sync, batchnorm, settings):
    """Where a profile keeps the trials of ``graph`` at ``batch`` on ``ranks`` ranks under these options."""
    digest = hashlib.sha256(graph.text.encode()).hexdigest()[:12]
    options = json.dumps({"sync": vars(sync) if sync is not None else None, "batchnorm": batchnorm,
                          "plans": settings.plans}, sort_keys=True, default=str)
    return f"{graph.name} ({digest}) batch {batch} on {ranks} ranks, {options}"


def cached(store, key, proposed):
    """The :class:`Trial` s ``store`` (a Profile) holds under ``key`` for exactly the ``proposed`` plans
    (``(label, plan, predicted)``), with today's predictions, or None."""
    entry = store.trials.get(key)
    if not entry or entry.get("plans") != [plan.text for _, plan, _ in proposed]:
        return None
    spreads = entry.get("spreads") or [0.0] * len(proposed)
    passes = entry.get("passes") or [[]] * len(proposed)
    steps = entry.get("steps") or [0] * len(proposed)
    return [Trial(label, plan, predicted, measured, error, spread, tuple(taken), count)
            for (label, plan, predicted), measured, error, spread, taken, count
            in zip(proposed, entry["measured"], entry["errors"], spreads, passes, steps)]


def remember(store, key, trials):
    store.trials[key] = {"plans": [t.plan.text for t in trials], "measured": [t.measured_s for t in trials],
                         "errors": [t.error for t in trials], "spreads": [t.spread for t in trials],
                         "passes": [list(t.passes) for t in trials], "steps": [t.steps for t in trials]}


def run_trials(proposed, graph, batch, world, xp, dtype, settings, steps, seed=0, sync=None, batchnorm=None,
               source=None, read_dtype=None):
    """Time each of ``proposed`` (``(label, plan, predicted)``) for ``steps`` steps on the ranks of ``world``
    (collective): in two passes, the plans in order and then in reverse (a machine whose speed drifts favours no
    plan by its turn), each pass on a fresh executor of the plan, which trains on ``source``'s first batches, read
    in the step (an opened dataset; None: a fixed synthetic batch) after ``settings.warmup`` steps (one in the second
    pass) and is dropped. A plan's time is the slowest rank's median step over both passes, the steps run as
    training runs them (:func:`paced_steps`). A candidate the memory of some rank cannot hold (:func:`refuse`), or
    whose executor could not be built (it raised on every rank), is kept with the reason and not timed. Returns the
    :class:`Trial` s, in the order of ``proposed``."""
    local = world.node_ranks()[1] if world.size > 1 else 1
    times, errors = {}, {}
    for index, (_, plan, _) in enumerate(proposed):
        try:
            world.agree(lambda plan=plan: refuse(graph, plan, dtype, xp, local))
        except (CollectiveError, ValueError) as error:
            errors[index] = str(error)
    first = (steps + 1) // 2
    passes = [(range(len(proposed)), settings.warmup, first), (range(len(proposed) - 1, -1, -1), 1, steps - first)]
    for order, warmup, count in passes:
        for index in order:
            if index in errors:
                continue
            world.board.stage("trial", slow=True, name=proposed[index][0])      # for the watchdog
            taken = _timed(proposed[index][1], graph, batch, world, xp, dtype, warmup, count, seed, sync, batchnorm,
                           source, read_dtype)
            if isinstance(taken, str):
                errors[index] = taken
            else:
                times.setdefault(index, []).append(taken)
    found = []
    for index, (label, plan, predicted) in enumerate(proposed):
        if index in errors or len(times.get(index, ())) < len(passes):     # failed in the second pass
            found.append(Trial(label, plan, predicted, None, errors.get(index)))
            continue
        mine = [seconds for taken in times[index] for seconds in taken]
        middle = statistics.median(mine)
        ranks = world.allgather((middle, float(np.ptp(np.percentile(mine, [25, 75]))) / middle,
                                 [statistics.median(taken) for taken in times[index]]))
        found.append(Trial(label, plan, predicted, max(r[0] for r in ranks), None, max(r[1] for r in ranks),
                           tuple(max(r[2][k] for r in ranks) for k in range(len(passes))), len(mine)))
    return found


def _timed(plan, graph, batch, world, xp, dtype, warmup, steps, seed, sync, batchnorm, source, read_dtype):
    """This rank's seconds of ``steps`` steps of ``plan`` on a fresh executor after ``warmup`` (:func:`run_trials`),
    or why it could not be built (a string)."""
    feed = None if source is None else JobReads(source, read_dtype or dtype, 0, "auto", warmup + steps)
    try:
        run = world.agree(lambda: training_step(graph, batch, xp, dtype, world, plan, seed, feed, sync, batchnorm))
    except (CollectiveError, ValueError, MemoryError, OSError, RuntimeError) as error:
        if feed is not None:
            feed.close()
        return str(error) or type(error).__name__
    try:
        return paced_steps(run, world, synchronizer(xp), warmup, steps)
    finally:
        if feed is not None:
            feed.close()
        del run
        gc.collect()


def available_bytes(xp, local_ranks=1):
    """The memory one of ``local_ranks`` ranks sharing this node (or device) may still take: its share of what the
    system (or the device) has free; None where it does not say."""
    if xp is not np:
        free, _ = xp.cuda.Device().mem_info
        return free // local_ranks
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // local_ranks
    except (ValueError, OSError, AttributeError):
        return None


def refuse(graph, plan, dtype, xp, local_ranks=1):
    """Raise ValueError when this rank's share of free memory cannot hold ``plan`` under the memory model (a trial
    that would swap or fail to allocate times nothing worth knowing)."""
    from ..cost.memory import plan_memory
    from ..sizes import format_bytes
    free = available_bytes(xp, local_ranks)
    need = plan_memory(graph, plan, np.dtype(dtype).itemsize, xp is np)
    if free is not None and need > free:
        raise ValueError(f"refused: it needs {format_bytes(need)} per device under the memory model, "
                         f"{format_bytes(free)} is free for each rank here")


def _beats(other, base, margin):
    """Whether trial ``other`` ran faster than ``base`` by more than ``margin`` and more than their medians' noise
    (:func:`noise`) overall, and by more than ``margin`` in each pass (not by its turn while the machine drifted)."""
    return (other.measured_s * (1 + max(margin, noise(other, base))) < base.measured_s
            and all(b * (1 + margin) < f for b, f in zip(other.passes, base.passes)))


def noise(one, two):
    """How far apart the median steps of trials ``one`` and ``two`` may come by chance, as a fraction: twice the
    standard error of their difference, each trial's error the larger of its steps' and its passes'. Its steps':
    a median of ``steps`` steps whose interquartile range over their median is ``spread`` (about 1.25 sigma over
    the root of the steps, sigma the range over 1.35); two trials of 12 steps each whose ranges are 12 % then tell
    apart plans 9 % apart, of 100 steps 3 %, of 6 steps 13 %. Its passes': a shared machine is slow for a second
    at a time, so steps are not independent, and a slow spell shows as passes that disagree (the standard error of
    their mean). Where a trial's count is not known (a cache written before it was kept), the wider range itself."""
    if not one.steps or not two.steps:
        return max(one.spread, two.spread)
    return 2.0 * math.hypot(_error(one), _error(two))


def _error(trial):
    """A trial's median step's standard error, as a fraction of it (:func:`noise`)."""
    steps = 1.25 / 1.35 * trial.spread / math.sqrt(trial.steps)
    passes = (statistics.stdev(trial.passes) / math.sqrt(len(trial.passes)) / trial.measured_s
              if len(trial.passes) > 1 else 0.0)
    return max(steps, passes)


def _base_and_better(trials, margin, incumbent):
    """``(base, [trials clearly faster than it])`` (:func:`fastest`), or ``(None, ran)`` when the base did not
    run."""
    ran = [t for t in trials if t.measured_s is not None]
    base = trials[incumbent] if trials[incumbent].measured_s is not None else trials[0]
    if base.measured_s is None:
        return None, ran
    return base, [t for t in ran if t is not base and _beats(t, base, margin)]


def fastest(trials, margin=MARGIN, incumbent=0):
    """The trial to keep (None when none ran): the ``incumbent`` (an index: data parallelism when it ran, which
    moves nothing between layers, else the model's choice) unless another ran faster than it by more than
    ``margin`` (a fraction) in each pass (in order, then reversed: not by its turn) and, overall, by more than
    ``margin`` and more than the two could differ by chance (:func:`noise`); then the fastest of those that did."""
    base, better = _base_and_better(trials, margin, incumbent)
    if base is None:
        return min(better, key=lambda t: t.measured_s) if better else None
    return min(better, key=lambda t: t.measured_s) if better else base


def contenders(trials, margin=MARGIN, incumbent=0):
    """``(the trial :func:`fastest` keeps, its closest rival)`` when a few more steps could change the choice, or
    None: the rival (the fastest of the others that ran) ran faster than the one kept (which stays for not being
    clearly beaten), or the one kept did not run clearly faster than the rival. A run-off of the two settles it
    (:func:`merged`; the same rule then chooses over both timings)."""
    winner = fastest(trials, margin, incumbent)
    others = [t for t in trials if t.measured_s is not None and t is not winner]
    if winner is None or not others:
        return None
    rival = min(others, key=lambda t: t.measured_s)
    if rival.measured_s < winner.measured_s or not _beats(winner, rival, margin):
        return winner, rival
    return None


def merged(trial, again):
    """``trial`` with a run-off's timing of the same plan (``again``) added: its passes are both timings' passes,
    its time their median, its spread the larger."""
    if again.measured_s is None:
        return trial._replace(measured_s=None, error=again.error)
    passes = tuple(trial.passes) + tuple(again.passes)
    steps = trial.steps + again.steps if trial.steps and again.steps else 0
    return trial._replace(measured_s=statistics.median(passes), spread=max(trial.spread, again.spread),
                          passes=passes, steps=steps)


def describe(trial):
    """One line of a trial for the log: predicted against measured."""
    if trial.measured_s is None:
        return f"  {trial.label}: predicted {trial.predicted_s * 1e3:.1f} ms, could not run: {trial.error}"
    off = 100 * (trial.predicted_s / trial.measured_s - 1)
    return (f"  {trial.label}: predicted {trial.predicted_s * 1e3:.1f} ms, measured {trial.measured_s * 1e3:.1f} ms "
            f"per step ({off:+.0f} %; its steps varied by {100 * trial.spread:.0f} %)")


def paced_steps(run, world, finish, warmup, steps):
    """This rank's seconds of each of ``steps`` steps after ``warmup``, run one after the other as training runs
    them (a barrier before the first only; each step from the end of the one before, ``finish()`` waiting for the
    device)."""
    world.barrier()
    for step in range(warmup):
        run(step)
        finish()
    times, mark = [], time.perf_counter()
    for step in range(warmup, warmup + steps):
        run(step)
        finish()
        times.append(time.perf_counter() - mark)
        mark += times[-1]
    world.reset()
    return times


def timed_steps(run, world, finish, warmup, steps, trace=False):
    """``(times, events)``: each timed step's seconds (from a barrier until the slowest rank is done, ``finish()``
    waiting for the device) and, with ``trace``, the last timed step's events on this rank."""
    times, events = [], []
    for step in range(warmup + steps):
        if step == warmup:
            world.reset()
        world.barrier()
        start = time.perf_counter()
        if trace and step == warmup + steps - 1:
            events = traced_step(lambda step=step: (run(step), finish()), run.executor, world)
        else:
            run(step)
            finish()
        world.barrier()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    return times, events
