"""Traces: ``spmdcnn bench --trace`` writes each rank's measured iteration and ``simulate --trace`` the predicted one
as Chrome trace-event JSON; ``plot --trace`` draws them. Every launch has a timeout."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from spmdcnn.graph import load_model
from spmdcnn.io.trace import Event, read_trace, write_trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIEXEC = shutil.which("mpiexec")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "SPMDCNN_NUM_THREADS": "1"}
MODEL = os.path.join(ROOT, "models", "small_resnet.yaml")


def run(*args, ranks=1, timeout=240):
    prefix = [MPIEXEC, "-n", str(ranks)] if ranks > 1 else []
    return subprocess.run([*prefix, sys.executable, "-m", "spmdcnn.cli", *map(str, args)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def chrome(path):
    data = json.loads(path.read_text())
    return data, [e for e in data["traceEvents"] if e["ph"] == "X"]


def test_events_survive_the_file(tmp_path):
    events = [Event("conv1", "forward", 0, "compute", 0.0, 0.002),
              Event("gradients", "allreduce", 1, "communication", 0.001, 0.0035)]
    write_trace(tmp_path / "t.json", events, "a title")
    title, again = read_trace(tmp_path / "t.json")
    assert title == "a title"
    assert [(e.name, e.kind, e.rank, e.lane) for e in again] == [(e.name, e.kind, e.rank, e.lane) for e in events]
    assert [e.end for e in again] == pytest.approx([e.end for e in events], abs=1e-9)


@pytest.mark.parametrize("text, message", [("[]", "traceEvents"), ("{", "not a readable trace")])
def test_a_file_that_is_no_trace_is_refused(tmp_path, text, message):
    (tmp_path / "t.json").write_text(text)
    with pytest.raises(ValueError, match=message):
        read_trace(tmp_path / "t.json")
    with pytest.raises(ValueError, match="not found"):
        read_trace(tmp_path / "missing.json")


def test_simulate_writes_the_predicted_timeline_of_every_device(tmp_path):
    out = tmp_path / "p.json"
    result = run("simulate", "data", "--model", MODEL, "--devices", 2, "--batch", 8, "--bucket-mb", "0.005",
                 "--trace", out)
    assert result.returncode == 0, result.stderr
    data, events = chrome(out)
    assert data["otherData"]["title"].startswith("predicted: small_resnet")
    names = {layer.name for layer in load_model(MODEL).layers}
    for rank in (0, 1):
        mine = [e for e in events if e["pid"] == rank]
        assert {e["name"] for e in mine if e["cat"] == "forward"} == names
        assert any(e["cat"] == "allreduce" and e["tid"] == 1 for e in mine)
    ends = [e["ts"] + e["dur"] for e in events]
    assert max(ends) > 0 and all(e["dur"] >= 0 for e in events)
    two = run("simulate", "data", "owt", "--model", MODEL, "--devices", 2, "--batch", 8, "--trace", out)
    assert two.returncode == 2 and "one plan" in two.stderr


@pytest.mark.skipif(not MPIEXEC, reason="needs mpiexec (pip install mpich)")
def test_bench_writes_each_ranks_measured_iteration_and_plot_draws_both(tmp_path):
    measured, predicted, picture = tmp_path / "m.json", tmp_path / "p.json", tmp_path / "t.png"
    result = run("bench", MODEL, "--batch", 8, "--steps", 2, "--warmup", 1, "--bucket-mb", "0.005", "--trace",
                 measured, "--json", ranks=2)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["trace"] == str(measured)
    data, events = chrome(measured)
    assert data["otherData"]["title"].startswith("measured: small_resnet")
    for rank in (0, 1):
        mine = [e for e in events if e["pid"] == rank]
        kinds = {e["cat"] for e in mine}
        assert {"forward", "backward", "allreduce", "update"} <= kinds, kinds
        assert all(e["tid"] == (1 if e["cat"] in ("allreduce", "batchnorm", "loss") else 0) for e in mine)
    assert run("simulate", "data", "--model", MODEL, "--devices", 2, "--batch", 8, "--trace", predicted).returncode == 0
    drawn = run("plot", "--trace", measured, predicted, "-o", picture)
    assert drawn.returncode == 0, drawn.stderr
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    both = run("plot", "data", "--trace", measured, "-o", picture)
    assert both.returncode == 2 and "not both" in both.stderr


def _ranks(count, alike=1):
    """A measured-looking trace of ``count`` ranks: ranks ``r`` and ``r + count / alike`` alike, each finishing
    later than the one before."""
    events = []
    for rank in range(count):
        slow = (rank % (count // alike)) * 1e-4
        events += [Event("conv1", "forward", rank, "compute", 0.0, 0.001 + slow),
                   Event("gradients", "allreduce", rank, "communication", 0.001 + slow, 0.002 + slow)]
    return events


def test_a_trace_of_many_ranks_is_summarised_and_says_what_it_left_out():
    from spmdcnn.io.trace import MAX_RANKS, summarize
    drawn, note = summarize(_ranks(6))
    assert [d.label for d in drawn] == [f"rank {r}" for r in range(6)] and note is None
    drawn, note = summarize(_ranks(64))
    assert len(drawn) == MAX_RANKS
    assert drawn[0].rank == 0 and drawn[-1].rank == 63                 # the fastest and the slowest
    assert "64 ranks in 64 different timelines: drew 8 by when they finish" in note
    assert "56 ranks left out, finishing between 2.10 and 8.20 ms" in note
    drawn, note = summarize(_ranks(64, alike=16))           # 4 timelines, each of 16 ranks
    assert [d.label for d in drawn][0] == "ranks 0, 4, 8, ... (16 alike), ends 2.00 ms"
    assert len(drawn) == 4 and note == "64 ranks in 4 different timelines: one row each"
    drawn, note = summarize(_ranks(64, alike=64))
    assert drawn[0].label.startswith("ranks 0-63 (64 alike)") and note.startswith("all 64 ranks have the same")


def test_plot_of_64_ranks_fits_a_page(tmp_path):
    pytest.importorskip("matplotlib")
    trace, picture = tmp_path / "m.json", tmp_path / "t.png"
    write_trace(trace, _ranks(64), "measured: 64 ranks")
    drawn = run("plot", "--trace", trace, "-o", picture)
    assert drawn.returncode == 0, drawn.stderr
    assert "measured: 64 ranks: 64 ranks in 64 different timelines: drew 8" in drawn.stdout
    width, height = int.from_bytes(picture.read_bytes()[16:20], "big"), int.from_bytes(picture.read_bytes()[20:24],
                                                                                     "big")
    assert width <= 1400 and height <= 1400, (width, height)
