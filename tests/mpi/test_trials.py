"""``plan: auto``'s trials on ranks (runtime/trials.py): the model's best plans timed on the job's ranks and data,
the run then equal to the same run under the plan they chose (and to one process), their result cached, a
candidate that cannot run reported and passed over, and no trials when they are off or the run too short."""

import os
import tempfile

import numpy as np
import pytest

from conftest import agree
from spmdcnn.comm import World
from test_trainer_on_ranks import _dataset, _job

TRIALS = {"plans": 3, "steps": 2, "warmup": 1, "share": 1.0, "seconds": 0.05}
# the trials choose between plans the same way on any number of ranks (the quick starts run them on 4)
pytestmark = [pytest.mark.timeout(300), pytest.mark.ranks(2)]


@pytest.fixture(autouse=True)
def brief_measurements(monkeypatch):
    """The profile's reference iteration and calibration, and each trial (``seconds`` above), time a few steps
    instead of seconds of them: these tests check what the trials do with their measurements, not how steady
    the measurements are."""
    from spmdcnn.runtime import insitu
    monkeypatch.setattr(insitu, "REFERENCE_S", 0.05)
    monkeypatch.setattr(insitu, "CALIBRATION_S", 0.1)


@pytest.fixture
def data(world):
    """The HDF5 dataset of the trainer's tests; trials time plans on several ranks, so one rank skips."""
    if world.size == 1:
        pytest.skip("trials time plans on several ranks")
    return _dataset(world)


@pytest.fixture
def cache(world, monkeypatch):
    folder = world.bcast(tempfile.mkdtemp(prefix="spmdcnn-trials-") if world.rank == 0 else None)
    monkeypatch.setenv("SPMDCNN_CACHE", folder)
    return folder


def _trained(world, job, lines=None):
    from spmdcnn.runtime.train import Trainer
    trainer = Trainer(job, log=(lines.append if lines is not None else lambda line: None), world=world)
    return trainer.plan, trainer.run()["losses"]


def _plan_file(world, cache, name, plan):
    """``plan`` written by rank 0 under ``cache``; its path on every rank."""
    path = None
    if world.rank == 0:
        path = os.path.join(cache, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(plan.text)
    return world.bcast(path)


def _trial_job(data, plan="auto", trials=TRIALS, steps=12):
    job = _job(data, plan)
    job["steps"], job["trials"] = steps, dict(trials)
    return job


def test_the_trials_choose_among_the_models_best_and_the_run_equals_that_plan_alone(world, cache, data):
    lines = []
    plan, losses = _trained(world, _trial_job(data), lines)
    timed = [line for line in lines if "predicted" in line and "measured" in line and "per step (" in line]
    problems = []
    if world.rank == 0:
        text = "\n".join(lines)
        if "plan auto: timing the model's" not in text or not 2 <= len(timed) <= 3:
            problems.append(f"no trials logged:\n{text}")
        if not any(line.startswith("  data parallelism: predicted") for line in timed):
            problems.append(f"data parallelism not timed: {timed}")
        if "plan auto: chose " not in text:
            problems.append("no choice logged")
    path = _plan_file(world, cache, "chosen.yaml", plan)
    _, alone = _trained(world, _trial_job(data, path, {"plans": 0}))
    if losses != alone:
        problems.append(f"trials changed the run: {losses} against {alone}")
    _, one = _trained(World(None), _trial_job(data, "data", {"plans": 0}))
    if not np.allclose(losses, one, rtol=0, atol=1e-10):
        problems.append(f"not one process's losses: {losses} against {one}")
    agree(world, problems)


def test_a_second_run_takes_the_trials_from_the_cache(world, cache, data, monkeypatch):
    from spmdcnn.runtime import trials
    first, _ = _trained(world, _trial_job(data))

    def refused(*args, **keys):
        raise AssertionError("the trials ran again")
    monkeypatch.setattr(trials, "run_trials", refused)
    lines = []
    again, _ = _trained(world, _trial_job(data), lines)
    problems = [] if again.text == first.text else ["another plan from the cache"]
    if world.rank == 0 and not any("are cached in" in line for line in lines):
        problems.append("the cache not said")
    agree(world, problems)


def test_two_plans_too_close_to_tell_apart_run_off_and_the_run_equals_the_winner_alone(world, cache, data,
                                                                                       monkeypatch):
    from spmdcnn.runtime import trials
    timed, run = [], trials.run_trials

    def counted(proposed, *args, **keys):
        timed.append([plan.text for _, plan, _ in proposed])
        return run(proposed, *args, **keys)
    monkeypatch.setattr(trials, "run_trials", counted)
    monkeypatch.setattr(trials, "contenders", lambda found, **keys: (found[0], found[1]))   # as if too close
    lines = []
    plan, losses = _trained(world, _trial_job(data, steps=20), lines)     # room in the share for the run-off
    problems = []
    if len(timed) != 2 or len(timed[1]) != 2 or set(timed[1]) != set(timed[0][:2]):
        problems.append(f"no run-off of the first two: {timed}")
    if world.rank == 0 and not any("a run-off of the two" in line for line in lines):
        problems.append("the run-off not said:\n" + "\n".join(lines))
    path = _plan_file(world, cache, "settled.yaml", plan)
    _, alone = _trained(world, _trial_job(data, path, {"plans": 0}, steps=20))
    if losses != alone:
        problems.append(f"the run-off changed the run: {losses} against {alone}")
    agree(world, problems)


def test_a_candidate_that_cannot_run_or_is_refused_is_said_and_passed_over(world, cache, data, monkeypatch):
    from spmdcnn.runtime import trials
    step, calls = trials.training_step, []

    def failing(graph, batch, xp, dtype, world_, plan, *args):
        calls.append(plan.text)
        if len(calls) == 2:                       # every rank: the second candidate fails as it is built
            raise ValueError("no room for this plan")
        return step(graph, batch, xp, dtype, world_, plan, *args)
    monkeypatch.setattr(trials, "training_step", failing)
    lines = []
    plan, _ = _trained(world, _trial_job(data), lines)
    problems = []
    if world.rank == 0 and not any("could not run: no room for this plan" in line for line in lines):
        problems.append("the failure not said:\n" + "\n".join(lines))
    monkeypatch.setattr(trials, "training_step", step)
    monkeypatch.setattr(trials, "available_bytes", lambda xp, local=1: 1 if world.rank == world.size - 1 else None)
    monkeypatch.setenv("SPMDCNN_CACHE", cache + "-refused")
    lines.clear()
    refused, _ = _trained(world, _trial_job(data), lines)
    if world.rank == 0:
        text = "\n".join(lines)
        if "refused: it needs" not in text or f"(on rank {world.size - 1})" not in text:
            problems.append("the refusal not said:\n" + text)
        if "plan auto: chose" in text:
            problems.append("a plan chosen though none ran")
    agree(world, problems)


@pytest.mark.parametrize("trials,steps,said", [({"plans": 0}, 10, None), ({"plans": 1}, 10, None),
                                                ({"plans": 3, "share": 0.05}, 10, "plan auto: no trials")])
def test_no_trials_when_off_or_the_run_is_too_short(world, cache, data, monkeypatch, trials, steps, said):
    from spmdcnn.runtime import trials as module
    monkeypatch.setattr(module, "run_trials", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trials ran")))
    lines = []
    _trained(world, _trial_job(data, trials=trials, steps=steps), lines)
    problems = []
    if world.rank == 0 and said is not None and not any(said in line for line in lines):
        problems.append(f"{said!r} not said")
    said_trials = [line for line in lines if "plan auto: timing" in line or "the trials" in line]
    if world.rank == 0 and said is None and said_trials:
        problems.append(f"trials though off: {said_trials}")
    agree(world, problems)


def test_plan_auto_calibrates_on_the_jobs_reads_and_another_jobs_reads_measure_again(world, cache, data):
    """The profile's data-parallel calibration reads the job's batches as its run does: the plan's prediction
    includes the reading (the trainer adds no read of its own), the profile's entry names the reads, and a job
    that reads otherwise (workers reading ahead) measures the entry again."""
    from spmdcnn.cost.compute import Profile
    from spmdcnn.runtime.profile import default_path, device_name
    from spmdcnn.runtime.train import Trainer
    problems = []
    for workers, said in ((0, True), (0, False), (1, True)):
        job = _trial_job(data, trials={"plans": 0})
        job["data"]["workers"] = workers
        lines = []
        trainer = Trainer(job, log=lines.append, world=world)
        trainer.run()
        if not trainer.plan.reads_included or trainer.read_s != 0.0:
            problems.append(f"workers {workers}: the read added to a prediction that includes it")
        measured = any("reading the job's batches as its run will" in line for line in lines)
        if world.rank == 0 and measured != said:
            problems.append(f"workers {workers}: calibration {'not ' if said else ''}measured: {lines}")
    if world.rank == 0:
        store = Profile.load(default_path(device_name(world, np, np.float64)))
        reads = [entry.get("reads") for entry in store.in_situ.values()]
        if reads != [f"{data}, workers 1, prefetch auto"]:
            problems.append(f"the profile's reads: {reads}")
    agree(world, problems)
