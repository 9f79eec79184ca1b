"""``spmdcnn plan``, ``simulate`` and ``profile`` as users run them, the shipped machine files, and the errors a
bad machine file or a job too big for its machine gives."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from spmdcnn.cost.compute import Profile
from spmdcnn.cost.machine import MachineError, load_machine, parse_machine_text
from spmdcnn.graph import load_model
from spmdcnn.tiling.plan import from_mapping

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCAL = os.path.join(ROOT, "jobs", "machines", "local.yaml")
PAPER = os.path.join(ROOT, "jobs", "machines", "paper-p100-4x4.yaml")


def run(*args, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "spmdcnn.cli", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_the_shipped_machines_load():
    local, paper = load_machine(LOCAL), load_machine(PAPER)
    assert local.nodes == 1
    assert (paper.nodes, paper.devices_per_node) == (4, 4)
    assert paper.link(0, 3) == paper.intra_node and paper.link(3, 4) == paper.inter_node
    assert paper.inter_node.bandwidth < paper.intra_node.bandwidth


@pytest.mark.parametrize("change,message", [
    ({"bandwidth_typo": 1}, "unknown key 'bandwidth_typo'"),
    ({"nodes": 0}, "'nodes' must be a positive integer"),
    ({"intra_node": {"bandwidth": -1, "latency": 0}}, "'bandwidth' must be a positive number"),
    ({"intra_node": {"bandwidth": 1e9}}, "missing key 'latency'"),
    ({"format": "other/1"}, "format must be"),
])
def test_a_bad_machine_file_names_the_file_and_the_key(tmp_path, change, message):
    data = yaml.safe_load(open(LOCAL, encoding="utf-8"))
    data.update(change)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(MachineError, match=message) as error:
        load_machine(str(path))
    assert str(path) in str(error.value)
    result = run("plan", "models/tiny_cnn.yaml", "--devices", 2, "--batch", 4, "--machine", path)
    assert result.returncode == 2 and message.split("'")[0] in result.stderr and "Traceback" not in result.stderr


def test_yaml_numbers_without_a_signed_exponent_are_numbers():
    machine = parse_machine_text("format: spmdcnn-machine/1\nnodes: 1\ndevices_per_node: 2\n"
                                 "intra_node: {bandwidth: 1.8e10, latency: 1e-5}\n")
    assert machine.intra_node.bandwidth == 1.8e10 and machine.intra_node.latency == 1e-5


def test_a_job_bigger_than_the_machine_is_refused():
    result = run("plan", "models/tiny_cnn.yaml", "--devices", 32, "--batch", 32, "--machine", PAPER)
    assert result.returncode == 2
    assert "32 devices" in result.stderr and "4 nodes x 4 devices" in result.stderr


def test_plan_writes_a_plan_with_its_prediction_and_simulate_scores_it(tmp_path):
    out = tmp_path / "plan.yaml"
    result = run("plan", "models/alexnet.yaml", "--devices", 4, "--batch", 64, "--machine", PAPER, "-o", out)
    assert result.returncode == 0, result.stderr
    for layer in ("conv1", "fc6", "loss"):
        assert f"\n{layer} " in result.stdout
    assert "predicted iteration" in result.stdout and "search:" in result.stdout
    data = yaml.safe_load(out.read_text())
    graph = load_model(os.path.join(ROOT, "models", "alexnet.yaml"))
    plan = from_mapping(data, graph, 64, 4, str(out))
    assert set(data["predicted"]) == {"iteration_s", "compute_s", "transfer_s", "sync_s", "bytes_transferred",
                                      "bytes_synced"}
    simulated = run("simulate", out, "data", "--model", "models/alexnet.yaml", "--devices", 4, "--batch", 64,
                    "--machine", PAPER, "--json")
    assert simulated.returncode == 0, simulated.stderr
    scored = json.loads(simulated.stdout)
    assert [entry["plan"] for entry in scored] == [str(out), "data"]
    assert scored[0]["predicted"]["iteration_s"] == pytest.approx(data["predicted"]["iteration_s"], rel=1e-6)
    assert scored[0]["predicted"]["iteration_s"] <= scored[1]["predicted"]["iteration_s"]
    assert [row["name"] for row in scored[0]["predicted"]["layers"]] == list(plan.configs)


def test_a_plan_written_elsewhere_is_simulated_from_its_own_folder(tmp_path):
    """model_file is written relative to the plan file's folder, and read from there, whatever the folder."""
    plan = tmp_path / "x" / "plan.yaml"
    written = run("plan", "models/tiny_cnn.yaml", "--devices", 2, "--batch", 4, "-o", plan)
    assert written.returncode == 0, written.stderr
    model_file = yaml.safe_load(plan.read_text())["model_file"]
    assert os.path.normpath(os.path.join(plan.parent, model_file)) == os.path.join(ROOT, "models", "tiny_cnn.yaml")
    for cwd in (tmp_path / "x", tmp_path):
        result = subprocess.run([sys.executable, "-m", "spmdcnn.cli", "simulate", os.path.relpath(plan, cwd)],
                                cwd=cwd, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and "predicted iteration" in result.stdout, result.stderr


def test_a_plan_whose_model_file_is_missing_says_where_it_looked(tmp_path):
    (tmp_path / "plan.yaml").write_text("format: spmdcnn-plan/1\nmodel: tiny_cnn\nbatch_size: 4\ndevices: 2\n"
                                        "model_file: ../models/tiny.yaml\n")
    result = run("simulate", tmp_path / "plan.yaml")
    assert result.returncode == 2, result.stderr
    assert "model_file ../models/tiny.yaml does not exist (read from the plan file's folder: " \
        f"{os.path.join(os.path.dirname(tmp_path), 'models', 'tiny.yaml')})" in result.stderr, result.stderr


def test_plan_compare_and_json_list_every_strategy():
    result = run("plan", "models/vgg16.yaml", "--devices", 16, "--batch", 512, "--machine", PAPER, "--compare")
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("strategy")[-1]
    for strategy in ("optimal", "data", "model", "owt"):
        assert f"\n{strategy} " in table
    as_json = run("plan", "models/tiny_cnn.yaml", "--devices", 2, "--batch", 4, "--compare", "--json")
    plans = json.loads(as_json.stdout)["plans"]
    assert set(plans) == {"optimal", "data", "model", "owt"}
    assert plans["optimal"]["exact"] is True
    best = plans["optimal"]["predicted"]["iteration_s"]
    assert all(best <= p["predicted"]["iteration_s"] * (1 + 1e-12) for p in plans.values())


def test_simulate_explains_a_plan_it_cannot_place(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("format: spmdcnn-plan/1\nmodel: nothing_like_this\ndevices: 2\n")
    result = run("simulate", path)
    assert result.returncode == 2 and "--model" in result.stderr


def test_profile_measures_each_tile_shape_once_and_the_planner_uses_it(tmp_path):
    out = tmp_path / "profile.json"
    first = run("profile", "models/tiny_cnn.yaml", "--batch", 4, "--devices", 2, "-o", out, "--repeats", 1)
    assert first.returncode == 0, first.stderr
    store = Profile.load(str(out))
    assert len(store) > 10 and all(seconds > 0 for seconds in store.entries.values())
    again = run("profile", "models/tiny_cnn.yaml", "--batch", 4, "--devices", 2, "-o", out, "--repeats", 1)
    assert "measured 0 tile shapes" in again.stdout
    planned = run("plan", "models/tiny_cnn.yaml", "--devices", 2, "--batch", 4, "--profile", out)
    assert planned.returncode == 0 and f"profile {out}" in planned.stdout


@pytest.mark.parametrize("batch", ['"8"', "-4", "0", "2.5", "true"])
def test_simulate_refuses_a_plan_with_a_bad_batch_size(tmp_path, batch):
    path = tmp_path / "p.yaml"
    path.write_text(f"format: spmdcnn-plan/1\nmodel: tiny_cnn\nbatch_size: {batch}\ndevices: 2\n"
                    f"model_file: {json.dumps(os.path.join(ROOT, 'models', 'tiny_cnn.yaml'))}\n")
    result = run("simulate", path)
    assert result.returncode == 2 and "batch_size" in result.stderr and "Traceback" not in result.stderr


def test_profile_refuses_a_profile_of_another_device(tmp_path):
    out = tmp_path / "other.json"
    Profile("some other device").save(str(out))
    result = run("profile", "models/tiny_cnn.yaml", "--batch", 4, "--devices", 1, "-o", out)
    assert result.returncode == 2 and "not of this device" in result.stderr
