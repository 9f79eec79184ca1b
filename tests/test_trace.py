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
