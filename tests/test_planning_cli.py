"""``spmdcnn plan``, ``simulate`` and ``profile`` as users run them, the shipped machine files, and the errors a
bad machine file or a job too big for its machine gives."""

import json
import os
import re
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
    assert local.sync == paper.sync == "allreduce"


def test_the_papers_own_machine_syncs_through_servers_at_its_simulators_bandwidths():
    served = load_machine(os.path.join(ROOT, "jobs", "machines", "paper-p100-4x4-ps.yaml"))
    assert served.sync == "parameter-server"
    assert served.intra_node.bandwidth == 15 * 2 ** 20 * 1e3 and served.inter_node.bandwidth == 4.5 * 2 ** 20 * 1e3
    assert served.intra_node.latency == served.inter_node.latency == 0
    assert "sync: parameter-server" in served.to_yaml()
    result = run("plan", "models/alexnet.yaml", "--devices", 16, "--batch", 512, "--machine",
                 os.path.join(ROOT, "jobs", "machines", "paper-p100-4x4-ps.yaml"), "--strategy", "data", "--json")
    assert result.returncode == 0, result.stderr
    predicted = json.loads(result.stdout)["plans"]["data"]["predicted"]
    # AlexNet's 244 MB of gradients pushed to a server on the critical path and pulled back, 3 transfers in its node
    # and 3 between nodes each way
    nbytes = 61_100_840 * 4
    one_way = 3 * nbytes / served.intra_node.bandwidth + 3 * nbytes / served.inter_node.bandwidth
    assert predicted["sync_s"] >= one_way and predicted["allreduce_s"] == pytest.approx(2 * one_way, rel=1e-6)
    shown = run("plan", "models/alexnet.yaml", "--devices", 16, "--batch", 512, "--machine",
                os.path.join(ROOT, "jobs", "machines", "paper-p100-4x4-ps.yaml"), "--strategy", "data")
    assert "gradients through parameter servers: each layer's push after its backward" in shown.stdout, shown.stdout


@pytest.mark.parametrize("change,message", [
    ({"bandwidth_typo": 1}, "unknown key 'bandwidth_typo'"),
    ({"nodes": 0}, "'nodes' must be a positive integer"),
    ({"intra_node": {"bandwidth": -1, "latency": 0}}, "'bandwidth' must be a positive number"),
    ({"intra_node": {"bandwidth": 1e9}}, "missing key 'latency'"),
    ({"format": "other/1"}, "format must be"),
    ({"sync": "ring"}, "'sync' must be 'allreduce' or 'parameter-server', got 'ring'"),
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
    assert set(data["predicted"]) == {"iteration_s", "compute_s", "transfer_s", "sync_s", "runtime_s", "allreduce_s",
                                      "bytes_transferred", "bytes_synced"}
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
    first = run("profile", "models/tiny_cnn.yaml", "--batch", 4, "--devices", 2, "-o", out, "--repeats", 2)
    assert first.returncode == 0, first.stderr
    assert "tile shapes to measure, on this process" in first.stdout   # progress lines only past 3 s of work
    assert "profile: a training step of the whole model at 2 samples (its share of the global batch 4 on 2 " \
        "devices) took" in first.stdout and "so the plan's layer times are taken as" in first.stdout
    assert "repeated timings of a tile differ by" in first.stdout and "1 rank" not in first.stdout
    store = Profile.load(str(out))
    assert len(store) > 10 and all(seconds > 0 for seconds in store.entries.values())
    again = run("profile", "models/tiny_cnn.yaml", "--batch", 4, "--devices", 2, "-o", out, "--repeats", 2)
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


def _cached(tmp_path, devices, model="tiny_cnn", batch=4, entries=1):
    """A profile in a private cache, named as a job of ``devices`` ranks on this machine names it, and measured
    (so its reference iteration says) for ``model`` at ``batch``."""
    from spmdcnn.runtime.profile import default_path, job_device, reference_key
    threads = ("SPMDCNN_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    env = {key: value for key, value in os.environ.items() if key not in threads}
    env["SPMDCNN_CACHE"] = str(tmp_path / "cache")
    old = {key: os.environ.pop(key, None) for key in threads}
    os.environ["SPMDCNN_CACHE"] = env["SPMDCNN_CACHE"]
    try:
        device = job_device(devices)
        path = default_path(device)
    finally:
        os.environ.pop("SPMDCNN_CACHE")
        os.environ.update({key: value for key, value in old.items() if value is not None})
    graph = load_model(os.path.join(ROOT, "models", f"{model}.yaml"))
    reference = {reference_key(graph, batch, devices, devices): {"measured": 1.0, "isolated": 1.0, "wait": 0.0}}
    store = Profile(device, {f"bogus-{i}": 1.0 for i in range(entries)}, spreads={"bogus-0": 0.08},
                    in_situ=reference)
    store.save(path)
    return env, device, path


@pytest.mark.parametrize("command", ["plan", "simulate", "plot"])
def test_the_first_line_says_which_compute_model_and_a_cached_profile_is_used(tmp_path, command):
    env, device, path = _cached(tmp_path, 2)
    args = {"plan": ["plan", "models/tiny_cnn.yaml", "--devices", 2, "--batch", 4],
            "simulate": ["simulate", "owt", "--model", "models/tiny_cnn.yaml", "--devices", 2, "--batch", 4],
            "plot": ["plot", "owt", "--model", "models/tiny_cnn.yaml", "--devices", 2, "--batch", 4,
                     "-o", tmp_path / "p.png"]}[command]
    used = run(*args, env=env)
    assert used.returncode == 0, used.stderr
    assert used.stdout.splitlines()[0] == f"compute: the cached profile {path} of {device!r} (1 tile times, " \
                                          "spread 8.0 %)", used.stdout
    other = run(*[a if a != 2 else 3 for a in args], env=env)           # 3 ranks: no profile of those
    assert other.returncode == 0, other.stderr
    assert other.stdout.startswith("compute: the analytic model (no cached profile of ") and "3 ranks" in \
        other.stdout.splitlines()[0]
    forced = run(*args, "--profile", "none", env=env)
    assert forced.stdout.startswith("compute: the analytic model (--profile none)")
    paper = run(*args, "--machine", PAPER, env=env)
    assert paper.stdout.startswith("compute: the analytic model of machine paper-p100-4x4's device 'p100' (not "
                                   "this computer")


def test_a_cached_profile_of_other_shapes_is_not_extrapolated(tmp_path):
    """A profile measured for another model (or batch) would time this one's tiles by extrapolating its own."""
    env, _, path = _cached(tmp_path, 2, "digits_cnn", 64)
    for args in (("models/tiny_cnn.yaml", "--batch", 4), ("models/digits_cnn.yaml", "--batch", 32)):
        result = run("plan", args[0], "--devices", 2, *args[1:], env=env)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"compute: the analytic model (the cached profile {path} was not measured "
                                        f"for this model at batch {args[2]} on 2 devices; `mpiexec -n 2 spmdcnn "
                                        f"profile {args[0]} --batch {args[2]} --devices 2` measures it)"), result.stdout
    given = run("plan", "models/tiny_cnn.yaml", "--devices", 2, "--batch", 4, "--profile", path, env=env)
    assert "not measured for this model, batch and device count: the tiles it lacks are extrapolated" in \
        given.stdout.splitlines()[0]


def test_plan_breaks_ties_within_the_profiles_spread_and_says_so(tmp_path):
    env, _, _ = _cached(tmp_path, 4, "digits_cnn", 64)
    result = run("plan", "models/digits_cnn.yaml", "--devices", 4, "--batch", 64, env=env)
    assert result.returncode == 0, result.stderr
    assert "ties: plans within 8.0 % of the fastest" in result.stdout, result.stdout
    off = run("plan", "models/digits_cnn.yaml", "--devices", 4, "--batch", 64, "--tie", 0, env=env)
    assert "ties:" not in off.stdout


def test_the_profile_name_does_not_depend_on_optional_packages():
    """threadpoolctl (a test extra) must not change the cache key: a profile would silently be measured again."""
    code = ("import sys; sys.modules['threadpoolctl'] = None if sys.argv[1] == 'without' else sys.modules.get("
            "'threadpoolctl'); from spmdcnn.runtime.profile import job_device; print(job_device(1), '|', "
            "job_device(4))")
    names = [subprocess.run([sys.executable, "-c", code, case], cwd=ROOT, capture_output=True, text=True,
                            timeout=60).stdout for case in ("with", "without")]
    assert names[0] == names[1] and "x" in names[0], names


def test_long_device_lists_are_abbreviated_and_memory_shows_the_limits_digits(tmp_path):
    result = run("plan", "models/vgg16.yaml", "--devices", 16, "--batch", 512, "--machine", PAPER, "--memory",
                 "2.70GiB")
    assert result.returncode == 0, result.stderr
    assert "devices: [0, 1, 2, ..., 15]}" in result.stdout and "7, 8, 9" not in result.stdout
    used = re.search(r"memory: (\d\.\d\d) GiB on the busiest device \((.*) kept for backward \+ (.*) while "
                     r"(\S+) runs; limit 2\.70 GiB\)", result.stdout)
    assert used and float(used.group(1)) <= 2.70 and used.group(4) in result.stdout.split("memory:")[0], result.stdout
    assert max(len(line) for line in result.stdout.splitlines() if "devices: [" in line) < 120


def test_plot_json_prints_the_prediction(tmp_path):
    out = tmp_path / "p.svg"
    result = run("plot", "owt", "--model", "models/tiny_cnn.yaml", "--devices", 2, "--batch", 4, "-o", out, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["output"] == str(out) and out.exists() and data["predicted"]["iteration_s"] > 0
    assert data["compute"].startswith("compute: ")


def test_plan_prints_every_strategys_memory_says_when_it_is_proven_and_refuses_a_negative_tie():
    fixed = run("plan", "models/tiny_cnn.yaml", "--devices", 2, "--batch", 4, "--strategy", "owt")
    assert fixed.returncode == 0 and "memory: " in fixed.stdout and "search:" not in fixed.stdout, fixed.stdout
    best = run("plan", "models/tiny_cnn.yaml", "--devices", 2, "--batch", 4)
    assert "proven optimal under the surrogate" in best.stdout, best.stdout
    assert "scored on the timeline (ms): " in best.stdout and "data " in best.stdout, best.stdout
    negative = run("plan", "models/tiny_cnn.yaml", "--devices", 2, "--batch", 4, "--tie", "-1")
    assert negative.returncode == 2 and "--tie must be zero or positive" in negative.stderr
    given = run("plan", "models/digits_cnn.yaml", "--devices", 4, "--batch", 64, "--tie", "0.3")
    assert "ties: plans within 30.0 % of the fastest (" in given.stdout and "; --tie) are ties" in given.stdout


def test_plan_and_simulate_take_bfloat16_as_profile_bench_and_jobs_do():
    """bfloat16 moves 2 bytes an element between layers and sums float32 gradients; no CPU profile has it."""
    found = {}
    for dtype in ("float32", "bfloat16"):
        result = run("simulate", "owt", "--model", "models/tiny_cnn.yaml", "--devices", 4, "--batch", 8,
                     "--dtype", dtype, "--json")
        assert result.returncode == 0, result.stderr
        found[dtype] = json.loads(result.stdout)
    moved = [found[d][0]["predicted"]["bytes_transferred"] for d in ("float32", "bfloat16")]
    synced = [found[d][0]["predicted"]["bytes_synced"] for d in ("float32", "bfloat16")]
    assert moved[0] == 2 * moved[1] > 0 and synced[0] == synced[1] > 0
    result = run("plan", "models/tiny_cnn.yaml", "--devices", 4, "--batch", 8, "--dtype", "bfloat16")
    assert result.returncode == 0 and "compute: the analytic model (bfloat16 runs on GPUs" in result.stdout
