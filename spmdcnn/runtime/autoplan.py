"""``plan: auto``: before the first step, profile what the cache lacks (all ranks at once), search on rank 0, time
the model's best plans on the ranks (:mod:`.trials`), and give every rank the fastest measured."""

import time

from ..cost.compute import Profile
from ..cost.memory import plan_memory
from ..sizes import format_against, parse_size
from ..planner import make_plan
from ..planner.service import cost_model
from ..planner.idle import idle_note
from ..tiling.plan import named, parse_plan_text
from . import trials as trial
from .profile import default_path, device_name, profile

LABELS = {"data": "data parallelism", "owt": "owt (one weird trick)", "model": "model parallelism"}


def auto_plan(graph, batch, world, machine, xp, dtype, log, sync=None, batchnorm=None, memory=None, trials=None,
              source=None, run_steps=None, seed=0, read_dtype=None, reads=None):
    """The plan for ``graph`` on the ranks of ``world`` (collective): the cost model's optimum, or with ``trials``
    (a :class:`~.trials.TrialSettings` that is on) the one its best plans' trials keep (:func:`~.trials.fastest`).
    ``machine``: a machine YAML path or None (the built-in local machine); ``sync``, ``batchnorm`` and ``memory`` (the most a device may
    hold, bytes or a size such as ``80GB``): the job's keys. The trials train on ``source`` (an opened dataset;
    None: a synthetic batch) with ``seed``, within their share of ``run_steps`` (None: no bound). ``reads``: a
    :class:`~.insitu.JobReads` of the job, for the profile's calibration (the prediction then includes reading;
    ``plan.reads_included``)."""
    if world.size == 1:
        plan = named("data", graph, batch, 1)
        plan.source = "plan auto (one device: the whole model here)"
        return plan
    device = device_name(world, xp, dtype)
    path = default_path(device)

    def load():
        if world.rank != 0:
            return None
        try:
            store = Profile.load(path, device)
        except ValueError as error:         # a cache is disposable: start a new one
            log(f"plan auto: ignoring the cached profile ({error})")
            return Profile(device, path=path)
        return store if store.device == device else Profile(device, path=path)
    store = world.bcast(world.agree(load))
    start = time.perf_counter()
    references = dict(store.in_situ)
    measured = profile(graph, batch, world.size, world, store, xp, dtype, log=log, machine=machine,
                       progress=True, reads=reads)
    renewed = store.in_situ.keys() != references.keys() or any(store.in_situ[k] is not references[k]
                                                                for k in references)
    if (measured or renewed) and world.rank == 0:
        _save(store, path, log)
    profiled = time.perf_counter() - start
    settings = trials or trial.TrialSettings(plans=0)
    model = {}              # rank 0's cost model, for the chosen plan's idle devices

    def search():
        if world.rank != 0:
            return None
        cost = model["cost"] = cost_model(graph, batch, world.size, machine, store, dtype.itemsize, sync=sync,
                                          batchnorm=batchnorm)
        limit = cost.machine.device.memory if memory is None else parse_size(memory)
        best = make_plan(graph, world.size, cost, "optimal", tie=store.spread, memory=limit)
        data = cost.simulate(named("data", graph, batch, world.size)).iteration_s
        predicted = best.prediction.iteration_s
        taken = (f"{measured} tile shapes measured in {profiled:.1f} s" if measured else
                 "every tile shape taken from it")
        log(f"plan auto: searched {best.configurations} configurations of {best.nodes} layers in "
            f"{best.search_s:.2f} s (profile {path}: {taken}); "
            f"predicted {predicted * 1e3:.1f} ms per step, data parallelism {data * 1e3:.1f} ms "
            f"({data / predicted:.2f}x), both on the timeline of what runs")
        if best.ties:
            log(f"plan auto: {best.ties.describe()}")
        if limit is not None:
            used = plan_memory(graph, best.plan, cost.itemsize, cost.machine.device.im2col)
            used_text, limit_text = format_against(used, limit)
            log(f"plan auto: {used_text} per device under the memory model (memory: {limit_text})")
        return propose(best, cost, settings, limit, log)
    world.board.stage("plan", slow=True, name="the search on rank 0")      # the others wait: for the watchdog
    proposed = [(label, parse_plan_text(text, graph, batch, world.size, "plan auto"), seconds)
                for label, text, seconds in world.bcast(world.agree(search))]
    label, plan, predicted, chosen_by = choose(proposed, graph, batch, world, xp, dtype, settings, store, path, log,
                                               sync, batchnorm, source, run_steps, seed, read_dtype)
    for layer in graph.layers:
        log(f"  {layer.name}: {plan[layer.name].describe(short=True)}")
    note = idle_note(model["cost"], plan) if "cost" in model else None
    if note:
        log(f"plan auto: {note}")
    plan.source = f"plan auto ({label}: {chosen_by}; predicted {predicted * 1e3:.1f} ms per step)"
    plan.predicted_s = predicted
    plan.reads_included = reads is not None
    return plan


def propose(best, cost, settings, limit=None, log=None):
    """``[(label, plan text, predicted seconds)]``: the planner's choice (``best``, a planner Result under
    ``cost``) and, with ``settings`` on, the model's next best plans within the memory ``limit`` (bytes or None),
    data parallelism among them when it fits (:func:`~.trials.candidates`)."""
    graph = cost.graph
    data_plan = named("data", graph, cost.batch, best.plan.devices)
    names = {named(name, graph, cost.batch, best.plan.devices).text: LABELS[name] for name in LABELS}
    predicted = best.prediction.iteration_s
    proposed = [(names.get(best.plan.text, "the model's choice"), best.plan.text, predicted)]
    if not settings.on:
        return proposed

    def fits(plan):
        return limit is None or plan_memory(graph, plan, cost.itemsize, cost.machine.device.im2col) <= limit
    scored = [(proposed[0][0], best.plan, predicted)] + [
        (names.get(plan.text, label), plan, seconds) for label, plan, seconds in best.scored if fits(plan)]
    data_fits = fits(data_plan)
    chosen = trial.candidates(scored, settings.plans, data_plan if data_fits else None,
                              cost.simulate(data_plan).iteration_s)
    if not data_fits and log:
        log("plan auto: data parallelism does not fit the memory limit: not among the trials")
    return [(label, plan.text, seconds) for label, plan, seconds in chosen]


def choose(proposed, graph, batch, world, xp, dtype, settings, store, path, log, sync=None, batchnorm=None,
           source=None, run_steps=None, seed=0, read_dtype=None):
    """``(label, plan, predicted seconds, how it was chosen)`` among ``proposed`` (``(label, plan, predicted)``,
    the model's choice first; collective): the first alone, or the one their trials keep (:func:`_trials`, cached
    in ``store``, the profile at ``path``; :func:`~.trials.fastest`)."""
    (label, plan, predicted), chosen_by = proposed[0], "optimal under the cost model"
    if len(proposed) > 1:
        data_text = named("data", graph, batch, world.size).text
        incumbent = next((i for i, (_, candidate, _) in enumerate(proposed) if candidate.text == data_text), 0)
        found = _trials(proposed, graph, batch, world, xp, dtype, settings, store, path, log, sync, batchnorm,
                        source, run_steps, seed, read_dtype, incumbent)
        winner = trial.fastest(found, incumbent=incumbent) if found else None
        if winner is not None:
            label, plan, predicted = winner.label, winner.plan, winner.predicted_s
            quickest = min(t.measured_s for t in found if t.measured_s is not None)
            kept = "the fastest of" if winner.measured_s == quickest else "no other clearly faster, of"
            chosen_by = f"{kept} {len(found)} plans timed here, {winner.measured_s * 1e3:.1f} ms per step"
            log(f"plan auto: chose {label}, {chosen_by}")
        elif found:
            log(f"plan auto: none of the {len(found)} plans could be timed: keeping the model's choice")
    return label, plan, predicted, chosen_by


def _trials(proposed, graph, batch, world, xp, dtype, settings, store, path, log, sync, batchnorm, source,
            run_steps, seed, read_dtype, incumbent=0):
    """The :class:`~.trials.Trial` s of ``proposed``, from the profile's cache or timed now, with a run-off of
    the two closest when they cannot be told apart and the run's share allows (:func:`_run_off`), and cached in
    ``store`` at ``path``, when given; None when the run is too short for them."""
    key = trial.cache_key(graph, batch, world.size, sync, batchnorm, settings)
    found = world.bcast(trial.cached(store, key, proposed) if world.rank == 0 else None)
    if found is not None:
        log(f"plan auto: the trials of these {len(found)} plans are cached in {path} (measured per step):")
    else:
        steps = settings.steps_within(len(proposed), run_steps, min(predicted for _, _, predicted in proposed))
        if not steps:
            log(f"plan auto: no trials: {len(proposed)} plans of {settings.warmup} + 2 steps would take more than "
                f"{settings.share * 100:g} % of the run's {run_steps} steps (trials.share)")
            return None
        total = settings.total(len(proposed), steps)
        share = f", {100 * total / run_steps:.1f} % of the run's {run_steps}" if run_steps else ""
        batches = "the job's batches" if source is not None else "a synthetic batch"
        log(f"plan auto: timing the model's {len(proposed)} best plans, data parallelism among them, "
            f"{steps} steps each after a warm-up, in two passes, on these ranks and {batches} ({total} steps{share}; "
            "the run's weights are untouched)")
        start = time.perf_counter()
        found = trial.run_trials(proposed, graph, batch, world, xp, dtype, settings, steps, seed, sync, batchnorm,
                                 source, read_dtype=read_dtype)
        spare = None if run_steps is None else settings.share * run_steps - total
        found = _run_off(found, graph, batch, world, xp, dtype, settings, steps, spare, log, incumbent, seed, sync,
                         batchnorm, source, read_dtype)
        if world.rank == 0:
            trial.remember(store, key, found)
            if path:
                _save(store, path, log)
        log(f"plan auto: the trials took {time.perf_counter() - start:.1f} s (measured per step):")
    for found_trial in found:
        log(trial.describe(found_trial))
    return found


def _run_off(found, graph, batch, world, xp, dtype, settings, steps, spare, log, incumbent, seed, sync, batchnorm,
             source, read_dtype):
    """``found`` with the trial :func:`~.trials.fastest` keeps and its closest rival, when their steps cannot
    tell them apart (:func:`~.trials.contenders`), timed again in two passes of the pair, and each merged with
    its first timing (:func:`~.trials.merged`); unchanged when there are no such two or ``spare`` (steps left in
    the run's share; None: no bound) cannot hold the run-off."""
    pair = trial.contenders(found, incumbent=incumbent)
    cost = settings.total(2, steps)
    if pair is None or (spare is not None and cost > spare):
        return found
    first, second = pair
    log(f"plan auto: {first.label} and {second.label} ran too close for their steps to tell apart "
        f"({first.measured_s * 1e3:.1f} and {second.measured_s * 1e3:.1f} ms): a run-off of the two, {steps} steps "
        f"each in two passes ({cost} steps)")
    again = trial.run_trials([(t.label, t.plan, t.predicted_s) for t in (second, first)], graph, batch, world, xp,
                             dtype, settings, steps, seed, sync, batchnorm, source, read_dtype=read_dtype)
    timed = {id(second): again[0], id(first): again[1]}
    return [trial.merged(t, timed[id(t)]) if id(t) in timed else t for t in found]


def _save(store, path, log):
    try:
        store.save(path)
    except OSError as error:
        log(f"plan auto: could not cache the profile in {path}: {error}")
