"""The stall watchdog under ``mpiexec``: a rank stopped (SIGSTOP) in forward, in a gradient sum, in batch norm's
statistics or halfway through writing a checkpoint, or waiting on a data worker that stopped, ends the job within
warn + abort + a few seconds with one message naming the rank and where it is, no traceback, and the last
checkpoint loadable and resumable; a healthy run with a slow rank completes without a word from it. Every launch
has a timeout, so a watchdog that does not fire fails instead of hanging CI."""

import json
import os
import signal
import subprocess
import sys
import time

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


@pytest.mark.parametrize("ranks, where, words, resume", [
    (2, (1, "forward", "computing", 7), "forward of layer", True),
    (3, (2, "gradients", "bucket", 7), "summing gradients (bucket", False),
    (4, (0, "forward", "batch-norm statistics", 7), "(batch-norm statistics)", False),
])
def test_a_stopped_rank_is_named_and_the_job_ends_with_its_checkpoint(tmp_path, ranks, where, words, resume):
    job = _job(tmp_path, "stall")
    result, stopped = _stalled(ranks, where, "train", job, "--set", "plan=owt")
    line = _check_ended(result, stopped, where[0], words)
    assert (f"rank {where[0]} has not reached the point the other ranks wait at" in line
            or f"rank {where[0]} has gone silent at the point the other ranks wait at" in line), line
    assert f"not heard from: rank {where[0]} (stopped" in line, line
    _resumable(tmp_path, "stall", ranks, resume)


@pytest.mark.parametrize("where, command, words", [
    ((1, "profile", "-", "-"), ["profile", "models/small_resnet.yaml", "--batch", "8", "--devices", "2"],
     "profiling (tile shapes"),
    ((0, "calibrate", "-", "-"), ["calibrate", "--quick"], "calibrating")])
def test_profile_and_calibrate_end_when_a_rank_stops(tmp_path, where, command, words):
    """The commands that measure on the ranks are watched too (``--watchdog WARN,ABORT``)."""
    output = ["-o", str(tmp_path / ("profile.json" if command[0] == "profile" else "machine.yaml"))]
    result, stopped = _stalled(2, where, *command, *output, "--watchdog", f"{WARN},{ABORT}")
    _check_ended(result, stopped, where[0], words)
    assert not os.path.exists(output[1])


def test_a_rank_stopped_halfway_through_a_checkpoint_leaves_the_last_one_whole(tmp_path):
    """Rank 0 writes the checkpoints: stopped with the second one half written, rank 1 speaks for it and ends
    the job; the checkpoint at the path is the first, whole, and the run resumes from it."""
    job = _job(tmp_path, "half")
    result, stopped = _stalled(2, (0, "writing", 2, "-"), "train", job, "--set", "plan=owt")
    _check_ended(result, stopped, 0, "writing the checkpoint")
    assert f"The last checkpoint, {tmp_path / 'half.h5'} (step 5), is untouched." in result.stderr
    aside = any(name.endswith(".tmp") for name in os.listdir(tmp_path))      # the half-written file
    # MPICH kills the stopped rank; Open MPI's launcher may wake it first (SIGCONT, SIGTERM, then SIGKILL), and it
    # may then finish the file: either way the checkpoint at the path is whole
    assert (_resumable(tmp_path, "half"), aside) in ((5, True), (10, False))


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the workers through /proc (Linux)")
def test_a_rank_waiting_on_a_stopped_data_worker_is_named(tmp_path):
    data = small_images(tmp_path)
    job = _job(tmp_path, "worker", data={"kind": "hdf5", "path": data, "workers": 1, "augment": {"crop": [16, 16]}})
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
    assert process.returncode != 0 and "Traceback" not in err, err[-3000:]
    line = next(line for line in err.splitlines() if "Ending the job" in line)
    assert "reading its batch" in line, line
    _resumable(tmp_path, "worker")


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
                 "epochs=3", "checkpoint.every=22", "watchdog={warn: 2, abort: 2}"]
    result = subprocess.run([MPIEXEC, "-n", "4", *spmdcnn("train", "jobs/quickstart.yaml",
                                                          *[x for o in overrides for x in ("--set", o)])],
                            cwd=ROOT, env={**ENV, "SPMDCNN_CACHE": str(tmp_path / "cache")}, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "4 ranks; plan auto (" in result.stdout and "watchdog" not in result.stdout + result.stderr
