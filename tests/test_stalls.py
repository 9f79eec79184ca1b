"""The stall watchdog under ``mpiexec``: a rank stopped (SIGSTOP) in forward, in a gradient sum, in batch norm's
statistics or halfway through writing a checkpoint, or waiting on a data worker that stopped, ends the job within
warn + abort + a few seconds with one message naming the rank and where it is, no traceback, and the last
checkpoint loadable and resumable; a healthy run with a slow rank completes without a word from it. Every launch
has a timeout, so a watchdog that does not fire fails instead of hanging CI. The stopped jobs run at the same time
(the ``stops`` fixture); the healthy ones after them, on their own."""

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from processes import data_workers, process_table
from test_mpi import ENV, MPIEXEC, ROOT, small_images, spmdcnn, write_job

WARN, ABORT = 3, 3
WITHIN = WARN + ABORT + 10      # seconds from the stop to the job's end: the thresholds, a beat, the launcher's kill
SCRIPT = os.path.join(ROOT, "tests", "mpi_scripts", "stall_one_rank.py")


def _job(tmp_path, name, **overrides):
    values = {"steps": 400, "watchdog": {"warn": WARN, "abort": ABORT},
              "log": {"every": 1, "progress": False, "metrics": str(tmp_path / f"{name}.jsonl")},
              "checkpoint": {"path": str(tmp_path / f"{name}.h5"), "every": 5}, "dtype": "float32"}
    values.update(overrides)
    return write_job(tmp_path, name, **values)


def _stalled(ranks, where, *args, timeout=240):
    """Run ``spmdcnn ARGS`` on ``ranks`` with a rank stopped at ``where`` (stall_one_rank.py's RANK KIND NOTE
    STEP): its completed process and the line saying where the rank stopped."""
    command = [MPIEXEC, "-n", str(ranks), sys.executable, SCRIPT, *map(str, where), *map(str, args)]
    process = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        ended = time.time()
        _kill_group(process)
    stopped = next((line for line in err.splitlines() if line.startswith("stall_one_rank:")), None)
    # the rank stopped (the line ends with the time), and the job ended within the thresholds and a few seconds
    assert stopped is None or ended - float(stopped.rsplit(" ", 1)[1]) < WITHIN, (stopped, ended)
    return subprocess.CompletedProcess(command, process.returncode, out, err), stopped


def _kill_group(process):
    """End the launcher and whatever it left (a stopped rank included)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _check_ended(result, stopped, rank, words):
    """The job ended by the watchdog, its message naming ``rank`` and ``words`` (where it stopped)."""
    assert stopped, result.stderr[-3000:]
    assert result.returncode != 0, result.stdout[-2000:] + result.stderr[-3000:]
    err = result.stderr
    assert "spmdcnn: watchdog: no progress for" in err, err[-3000:]
    assert "Ending the job" in err and "Traceback" not in err, err[-3000:]
    line = next(line for line in err.splitlines() if "Ending the job" in line)
    assert f"rank {rank}" in line and words in line, line
    return line


def _resumable(tmp_path, name, ranks=2, resume=True):
    """The last checkpoint loads, and (``resume``) a run resumed from it, without the stop, trains on."""
    from spmdcnn.io.checkpoint import load_checkpoint
    step = load_checkpoint(tmp_path / f"{name}.h5").step
    assert step >= 5
    if not resume:
        return step
    rest = subprocess.run([MPIEXEC, "-n", str(ranks), *spmdcnn("train", tmp_path / f"{name}.yaml", "--set",
                                                                   f"steps={step + 2}")],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert rest.returncode == 0, rest.stdout[-2000:] + rest.stderr[-2000:]
    assert f"resumed from {tmp_path / f'{name}.h5'} at step {step}" in rest.stdout
    return step


# The jobs a test stops a rank of: ``name: (ranks, where, command)`` (stall_one_rank.py's RANK KIND NOTE STEP; the
# command's job and output files are made in the job's own folder). They are started together, in threads, once
# for the selected tests of this module that check them: each spends most of its time waiting for the watchdog's
# thresholds, and WITHIN is measured for each from its own rank's stop, so they overlap without changing what is
# checked (and a busy machine is one they must pass on).
STOPS = {
    "forward": (2, (1, "forward", "computing", 7), ("train", "stall")),
    "gradients": (3, (2, "gradients", "bucket", 7), ("train", "stall")),
    "batchnorm": (4, (0, "forward", "batch-norm statistics", 7), ("train", "stall")),
    "writing": (2, (0, "writing", 2, "-"), ("train", "half")),
    "profiling": (2, (1, "profile", "-", "-"), ("profile", "models/small_resnet.yaml", "--batch", "8", "--devices",
                                                "2")),
    "calibrating": (2, (0, "calibrate", "-", "-"), ("calibrate", "--quick")),
}


def _output(folder, name):
    """The file a stopped profile or calibration must not leave behind."""
    return folder / ("profile.json" if name == "profiling" else "machine.yaml")


def _arguments(folder, name):
    """The ``spmdcnn`` arguments of job ``name`` of STOPS, its files made in ``folder``."""
    command = STOPS[name][2]
    if command[0] == "train":
        return ["train", _job(folder, command[1]), "--set", "plan=owt"]
    return [*command, "-o", str(_output(folder, name)), "--watchdog", f"{WARN},{ABORT}"]


@pytest.fixture(scope="module")
def stops(request, tmp_path_factory):
    """``{name: (folder, future)}`` of the jobs the selected tests of this module check, all started at once: those
    of STOPS, each future giving :func:`_stalled`'s ``(result, stopped)``, and "reading", a data worker stopped
    (:func:`_data_worker_stalled`)."""
    wanted = {item.callspec.params["stop"] for item in request.session.items
              if item.module is request.module and "stop" in getattr(getattr(item, "callspec", None), "params", {})}
    if not os.path.isdir("/proc"):
        wanted.discard("reading")      # it finds the data workers through /proc (Linux)
    with ThreadPoolExecutor(max_workers=len(wanted)) as pool:
        started = {}
        for name in sorted(wanted):
            folder = tmp_path_factory.mktemp(name)
            if name == "reading":
                started[name] = folder, pool.submit(_data_worker_stalled, folder)
            else:
                ranks, where, _ = STOPS[name]
                started[name] = folder, pool.submit(_stalled, ranks, where, *_arguments(folder, name))
        yield started


@pytest.mark.parametrize("stop, words, resume", [
    ("forward", "forward of layer", True),
    ("gradients", "summing gradients (bucket", False),
    ("batchnorm", "(batch-norm statistics)", False),
])
def test_a_stopped_rank_is_named_and_the_job_ends_with_its_checkpoint(stops, stop, words, resume):
    folder, started = stops[stop]
    result, stopped = started.result()
    ranks, where, _ = STOPS[stop]
    line = _check_ended(result, stopped, where[0], words)
    assert (f"rank {where[0]} has not reached the point the other ranks wait at" in line
            or f"rank {where[0]} has gone silent at the point the other ranks wait at" in line), line
    assert f"not heard from: rank {where[0]} (stopped" in line, line
    _resumable(folder, "stall", ranks, resume)


@pytest.mark.parametrize("stop, words", [("profiling", "profiling (tile shapes"), ("calibrating", "calibrating")])
def test_profile_and_calibrate_end_when_a_rank_stops(stops, stop, words):
    """The commands that measure on the ranks are watched too (``--watchdog WARN,ABORT``)."""
    folder, started = stops[stop]
    result, stopped = started.result()
    _check_ended(result, stopped, STOPS[stop][1][0], words)
    assert not _output(folder, stop).exists()


@pytest.mark.parametrize("stop", ["writing"])
def test_a_rank_stopped_halfway_through_a_checkpoint_leaves_the_last_one_whole(stops, stop):
    """Rank 0 writes the checkpoints: stopped with the second one half written, rank 1 speaks for it and ends
    the job; the checkpoint at the path is the first, whole, and the run resumes from it."""
    folder, started = stops[stop]
    result, stopped = started.result()
    _check_ended(result, stopped, 0, "writing the checkpoint")
    assert f"The last checkpoint, {folder / 'half.h5'} (step 5), is untouched." in result.stderr
    aside = any(name.endswith(".tmp") for name in os.listdir(folder))      # the half-written file
    # MPICH kills the stopped rank; Open MPI's launcher may wake it first (SIGCONT, SIGTERM, then SIGKILL), and it
    # may then finish the file: either way the checkpoint at the path is whole
    assert (_resumable(folder, "half"), aside) in ((5, True), (10, False))


def _data_worker_stalled(folder):
    """``(exit status, standard error)`` of a job on 2 ranks whose data worker of rank 1 is stopped (SIGSTOP) once
    the job has logged step 7, ended within WITHIN of the stop."""
    data = small_images(folder)
    job = _job(folder, "worker", data={"kind": "hdf5", "path": data, "workers": 1, "augment": {"crop": [16, 16]}})
    process = subprocess.Popen([MPIEXEC, "-n", "2", *spmdcnn("train", job, "--set", "plan=owt")], cwd=ROOT, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    ranks = set()
    try:
        while not process.stdout.readline().startswith("step      7"):
            assert process.poll() is None, process.stderr.read()
        ranks = {pid for pid, (_, _, command) in process_table().items() if str(job) in command
                 and "mpiexec" not in command}
        workers = data_workers(ranks)
        assert len(workers) == 2, workers
        victim = max(workers)
        os.kill(victim, signal.SIGSTOP)
        stopped_at = time.monotonic()
        _, err = process.communicate(timeout=WITHIN + 30)
        assert time.monotonic() - stopped_at < WITHIN
    finally:
        _kill_group(process)
        for pid in data_workers(ranks):
            os.kill(pid, signal.SIGKILL)
    return process.returncode, err


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the workers through /proc (Linux)")
@pytest.mark.parametrize("stop", ["reading"])
def test_a_rank_waiting_on_a_stopped_data_worker_is_named(stops, stop):
    """A rank waits for the batch its stopped data worker reads: the watchdog names it and what it waits for, and
    the run resumes from the last checkpoint."""
    folder, started = stops[stop]
    returncode, err = started.result()
    assert returncode != 0 and "Traceback" not in err, err[-3000:]
    line = next(line for line in err.splitlines() if "Ending the job" in line)
    assert "reading its batch" in line, line
    _resumable(folder, "worker")


def test_a_slow_rank_below_the_threshold_completes_and_is_reported(tmp_path):
    """A rank that sleeps 0.5 s in every step (below warn) slows the job without a word from the watchdog; the
    log names it as the slowest rank and the metrics give the spread."""
    job = _job(tmp_path, "slow", steps=8, checkpoint={"path": str(tmp_path / "slow.h5")},
               watchdog={"warn": 2, "abort": 2})
    script = os.path.join(ROOT, "tests", "mpi_scripts", "slow_rank.py")
    result = subprocess.run([MPIEXEC, "-n", "2", sys.executable, script, "1", "0.5", "train", str(job), "--set",
                             "plan=owt"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "watchdog" not in result.stderr, result.stderr
    assert "slowest rank 1:" in result.stdout, result.stdout
    records = [json.loads(line) for line in open(tmp_path / "slow.jsonl", encoding="utf-8")]
    assert all(r["slowest_rank"] == 1 and r["work_slowest_s"] > r["work_others_s"] + 0.4 for r in records[1:])


def test_a_healthy_run_on_more_ranks_than_cores_never_hears_from_the_watchdog(tmp_path):
    """The quick start on 4 ranks sharing 2 cores, plan auto (profile, search on rank 0, trials, training,
    evaluations, checkpoints) with thresholds of 2 s: not a word from the watchdog."""
    data = tmp_path / "digits"
    overrides = [f"data.path={data / 'train.h5'}", f"data.val={data / 'val.h5'}", f"checkpoint.path={tmp_path / 'q.h5'}",
                 f"log.metrics={tmp_path / 'q.jsonl'}", "epochs=3", "checkpoint.every=22",
                 "watchdog={warn: 2, abort: 2}"]
    result = subprocess.run([MPIEXEC, "-n", "4", *spmdcnn("train", "jobs/quickstart.yaml",
                                                          *[x for o in overrides for x in ("--set", o)])],
                            cwd=ROOT, env={**ENV, "SPMDCNN_CACHE": str(tmp_path / "cache")}, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "4 ranks; plan auto (" in result.stdout and "watchdog" not in result.stdout + result.stderr
