"""The ``spmdcnn`` command: model tables, help, bench, train -> checkpoint info, and clean errors."""

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

from spmdcnn.cli import main
from spmdcnn.io.checkpoint import load_checkpoint
from spmdcnn.io.yamlfile import FormatError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")
TINY = os.path.join(MODELS, "tiny_cnn.yaml")
SUBCOMMANDS = ["model", "train", "bench", "checkpoint", "plan", "simulate", "profile", "calibrate"]


def run(*args, timeout=120):
    """``python -m spmdcnn.cli ARGS`` in the repository root, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "spmdcnn.cli", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def call(capsys, *args):
    """``main(ARGS)`` in this process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def model_json(capsys, *args):
    code, out, err = call(capsys, "model", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def expect_clean_error(result, *fragments):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.startswith("spmdcnn: error:"), result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def write_job(tmp_path, name="job.yaml", **extra):
    values = {"model": TINY, "batch_size": 4, "steps": 3, "backend": "numpy",
              "data": {"kind": "synthetic", "num_samples": 32, "seed": 1},
              "optimizer": {"lr": 0.05, "momentum": 0.9},
              "checkpoint": {"path": str(tmp_path / "out" / "run.h5"), "every": 2},
              "log": {"every": 1, "metrics": str(tmp_path / "out" / "metrics.jsonl")}}
    values.update(extra)
    path = tmp_path / name
    path.write_text(json.dumps(values))  # JSON is YAML
    return path


# --- model --------------------------------------------------------------------------------------------------------

def test_model_table_of_alexnet_has_the_totals(capsys):
    code, out, err = call(capsys, "model", os.path.join(MODELS, "alexnet.yaml"))
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("model alexnet")
    total = [line for line in lines if line.startswith("total")]
    assert len(total) == 1 and "61,100,840" in total[0]
    assert any(line.startswith("conv1 ") for line in lines)
    assert any(line.startswith("fc8 ") and "4,097,000" in line for line in lines)


def test_model_json_of_alexnet(capsys):
    data = model_json(capsys, os.path.join(MODELS, "alexnet.yaml"))
    assert data["name"] == "alexnet"
    assert data["total_params"] == 61_100_840
    assert data["input"] == [3, 224, 224] and data["batch"] == 1
    assert isinstance(data["total_flops"], int) and data["total_flops"] > 0
    assert sum(row["params"] for row in data["layers"]) == data["total_params"]
    assert sum(row["flops"] for row in data["layers"]) == data["total_flops"]
    # AlexNet's forward pass is about 0.7 G multiply-adds; counted as FLOPs it is between 0.7 and 3 G.
    assert 0.7e9 < data["total_flops"] < 3e9


def test_model_batch_multiplies_flops_not_params(capsys):
    path = os.path.join(MODELS, "alexnet.yaml")
    one, four = model_json(capsys, path), model_json(capsys, path, "--batch", "4")
    assert four["batch"] == 4
    assert four["total_flops"] == 4 * one["total_flops"]
    assert four["total_params"] == one["total_params"]
    for a, b in zip(one["layers"], four["layers"]):
        assert b["flops"] == 4 * a["flops"]
        assert b["output_shape"] == [4, *a["output_shape"][1:]]
    code, out, _ = call(capsys, "model", path, "--batch", "4")
    assert code == 0 and "batch 4" in out.splitlines()[0]
    assert any(line.startswith("conv1 ") and "4x64x55x55" in line for line in out.splitlines())


def test_model_expand_lists_every_layer_of_inception_v3(capsys):
    path = os.path.join(MODELS, "inception_v3.yaml")
    code, grouped, _ = call(capsys, "model", path)
    assert code == 0
    code, expanded, _ = call(capsys, "model", path, "--expand")
    assert code == 0
    names = [line.split()[0] for line in expanded.splitlines()[2:-1]]
    assert "Mixed_5b.branch1x1.conv" in names
    assert "Mixed_5b.branch1x1.conv" not in grouped
    grouped_names = [line.split()[0] for line in grouped.splitlines()[2:-1]]
    assert "Mixed_5b" in grouped_names and "Mixed_5b" not in names
    assert any(line.startswith("Mixed_5b ") and "block (" in line for line in grouped.splitlines())
    assert len(names) > len(grouped_names)
    # the totals are the same either way
    assert expanded.splitlines()[-1].split() == grouped.splitlines()[-1].split()
    assert "23,834,568" in expanded.splitlines()[-1]


def test_model_expand_json_has_one_row_per_layer(capsys):
    path = os.path.join(MODELS, "inception_v3.yaml")
    grouped, expanded = model_json(capsys, path), model_json(capsys, path, "--expand")
    assert len(expanded["layers"]) == expanded["num_layers"]
    names = [row["name"] for row in expanded["layers"]]
    assert len(set(names)) == len(names) and "Mixed_5b.branch1x1.conv" in names
    assert len(grouped["layers"]) < grouped["num_layers"]
    assert sum(row["layers"] for row in grouped["layers"]) == grouped["num_layers"]
    for data in (grouped, expanded):
        assert data["total_params"] == 23_834_568
        assert sum(row["params"] for row in data["layers"]) == data["total_params"]
        assert sum(row["flops"] for row in data["layers"]) == data["total_flops"]


def test_model_of_a_plain_network_has_one_row_per_layer(capsys):
    data = model_json(capsys, TINY)
    assert [row["name"] for row in data["layers"]][:3] == ["conv1", "bn1", "relu1"]
    assert len(data["layers"]) == data["num_layers"] == 13


# --- help --------------------------------------------------------------------------------------------------------

def test_top_level_help_mentions_every_subcommand(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: spmdcnn")
    for command in SUBCOMMANDS:
        assert f"\n    {command}" in out, command


@pytest.mark.parametrize("argv", [["model"], ["train"], ["bench"], ["checkpoint"], ["checkpoint", "info"]])
def test_help_of_every_subcommand(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: spmdcnn {' '.join(argv)}")
    assert "--help" in out


def test_no_subcommand_prints_help_and_fails(capsys):
    code = main([])
    out = capsys.readouterr().out
    assert code == 2 and "usage: spmdcnn" in out


def test_the_console_script_runs():
    script = shutil.which("spmdcnn") or os.path.join(os.path.dirname(sys.executable), "spmdcnn")
    assert os.path.exists(script), "the spmdcnn console script is not installed"
    result = subprocess.run([script, "model", "models/tiny_cnn.yaml", "--json"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["name"] == "tiny_cnn"


def test_version(capsys):
    import spmdcnn
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert spmdcnn.__version__ in capsys.readouterr().out


# --- bench -------------------------------------------------------------------------------------------------------

def test_bench_json(capsys):
    code, out, err = call(capsys, "bench", TINY, "--batch", "4", "--steps", "2", "--warmup", "1", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["model"] == "tiny_cnn" and result["batch"] == 4 and result["steps"] == 2
    assert result["images_per_s"] > 0
    assert isinstance(result["peak_memory_bytes"], int) and result["peak_memory_bytes"] > 2**20
    assert result["step_s_mean"] > 0
    assert result["images_per_s"] == pytest.approx(4 / result["step_s_mean"])


def test_bench_text(capsys):
    code, out, _ = call(capsys, "bench", TINY, "--batch", "2", "--steps", "1", "--warmup", "0")
    assert code == 0
    assert out.startswith("tiny_cnn: batch 2") and "images/s" in out and "peak memory" in out


@pytest.mark.parametrize("args", [["--batch", "0"], ["--batch", "4", "--steps", "0"], ["--batch", "-1"]])
def test_bench_refuses_non_positive_counts(capsys, args):
    with pytest.raises(SystemExit) as info:
        main(["bench", TINY, *args])
    assert info.value.code == 2
    assert "must be positive" in capsys.readouterr().err


# --- train and checkpoint info ------------------------------------------------------------------------------------

def test_train_writes_checkpoint_and_metrics_then_info_reads_it(tmp_path, capsys):
    job = write_job(tmp_path)
    code, out, err = call(capsys, "train", job)
    assert code == 0, err
    assert "tiny_cnn" in out
    checkpoint = tmp_path / "out" / "run.h5"
    metrics = tmp_path / "out" / "metrics.jsonl"
    assert checkpoint.exists() and metrics.exists()
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert np.isfinite(record["loss"]) and record["loss"] > 0
        assert record["images_per_s"] > 0
    ckpt = load_checkpoint(checkpoint)
    assert ckpt.step == 3
    assert ckpt.momentum  # momentum 0.9 -> the velocity is saved
    assert sorted(os.listdir(tmp_path / "out")) == ["metrics.jsonl", "run.h5"]  # no temporary left

    code, out, err = call(capsys, "checkpoint", "info", checkpoint)
    assert code == 0, err
    assert "tiny_cnn" in out
    assert "step         3" in out

    code, out, err = call(capsys, "checkpoint", "info", checkpoint, "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["step"] == 3 and info["format"] == "spmdcnn-checkpoint/1"
    assert info["params"]["conv1.weight"] == [8, 3, 3, 3]
    assert info["momentum"] is True


def test_train_resumes_from_its_checkpoint(tmp_path, capsys):
    job = write_job(tmp_path)
    assert call(capsys, "train", job)[0] == 0
    code, out, err = call(capsys, "train", job, "--set", "steps=5")
    assert code == 0, err
    assert "resumed" in out and "step 3" in out
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert load_checkpoint(tmp_path / "out" / "run.h5").step == 5


def test_train_end_to_end_in_a_subprocess(tmp_path):
    job = write_job(tmp_path, steps=2)
    result = run("train", job, "--set", "log.every=2")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2]
    assert {"step", "loss", "images_per_s"} <= set(records[0])
    info = run("checkpoint", "info", tmp_path / "out" / "run.h5")
    assert info.returncode == 0, info.stderr
    assert "step         2" in info.stdout and "tiny_cnn" in info.stdout


def test_a_complete_run_says_so_and_how_to_train_again(tmp_path, capsys):
    job = write_job(tmp_path)
    assert call(capsys, "train", job)[0] == 0
    code, out, err = call(capsys, "train", job)
    assert code == 0, err
    assert "this run is already complete (step 3 of 3): nothing to train" in out, out
    assert "--set resume=false" in out and "--set checkpoint.path=OTHER.h5" in out and "--set steps=N" in out
    code, out, err = call(capsys, "train", job, "--set", "resume=false")     # what the message says works
    assert code == 0 and "already complete" not in out and "step      3/3" in out, out


def test_a_copied_job_run_elsewhere_stops_on_its_paths_before_writing_anything(tmp_path):
    """The quick start's job copied to another folder: its relative model path is missing there. The job is
    checked whole before data.make writes the digits or an output folder is made."""
    shutil.copy(os.path.join(ROOT, "jobs", "quickstart.yaml"), tmp_path / "job.yaml")
    result = subprocess.run([sys.executable, "-m", "spmdcnn.cli", "train", "job.yaml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    expect_clean_error(result, "job.yaml: 'model' names models/digits_cnn.yaml, which does not exist",
                       f"relative to the current folder, {tmp_path}")
    assert sorted(os.listdir(tmp_path)) == ["job.yaml"]


@pytest.mark.parametrize("key, value", [("init", "nothing.h5"), ("data.path", "nothing.h5"), ("plan", "p.yaml"),
                                        ("machine", "m.yaml")])
def test_a_missing_input_names_its_key_and_who_gave_it(tmp_path, key, value):
    extra = ["--set", "data={kind: hdf5, path: nothing.h5}"] if key == "data.path" else []
    job = write_job(tmp_path, checkpoint={"path": str(tmp_path / "new" / "run.h5")})
    result = run("train", job, *extra, "--set", f"{key}={value}" if key != "data.path" else "seed=0")
    origin = "--set data={kind: hdf5, path: nothing.h5}" if key == "data.path" else f"--set {key}={value}"
    expect_clean_error(result, f"{origin}: '{key}' names {value}, which does not exist")
    assert not (tmp_path / "new").exists()


def test_output_folders_are_made_only_once_the_job_is_checked(tmp_path):
    (tmp_path / "bad-plan.yaml").write_text("format: spmdcnn-plan/1\ndevices: 1\nlayers: {nolayer: {n: 1}}\n")
    job = write_job(tmp_path, plan=str(tmp_path / "bad-plan.yaml"),
                    checkpoint={"path": str(tmp_path / "deep" / "er" / "run.h5")})
    expect_clean_error(run("train", job), "nolayer")
    assert not (tmp_path / "deep").exists()


# --- errors: exit 2, one line, no traceback ------------------------------------------------------------------

def test_missing_job_file(tmp_path):
    missing = tmp_path / "absent.yaml"
    expect_clean_error(run("train", missing), str(missing), "not found")


def test_job_with_an_unknown_key(tmp_path):
    job = write_job(tmp_path, learning_rate=0.1)
    expect_clean_error(run("train", job), str(job), "learning_rate")


def test_job_with_an_unknown_nested_key_given_by_set(tmp_path):
    job = write_job(tmp_path)
    expect_clean_error(run("train", job, "--set", "optimizer.lrr=0.1"), "optimizer.lrr")


BAD_OP_MODEL = """\
    name: bad
    input: [3, 8, 8]
    layers:
      - {name: conv1, op: conv3d, out_channels: 4, kernel: 3}
      - {name: flat, op: flatten}
      - {name: fc, op: linear, out_features: 3}
      - {name: loss, op: softmax_cross_entropy}
    """


@pytest.mark.parametrize("command", ["model", "bench", "train"])
def test_model_with_an_unknown_op(tmp_path, command):
    model = tmp_path / "bad.yaml"
    model.write_text(textwrap.dedent(BAD_OP_MODEL))
    if command == "model":
        args = ["model", model]
    elif command == "bench":
        args = ["bench", model, "--batch", "2"]
    else:
        args = ["train", write_job(tmp_path, model=str(model))]
    expect_clean_error(run(*args), str(model), "conv3d")


def test_missing_checkpoint(tmp_path):
    missing = tmp_path / "absent.h5"
    expect_clean_error(run("checkpoint", "info", missing), str(missing))


def test_checkpoint_info_of_a_file_that_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "notes.h5"
    path.write_text("not hdf5")
    expect_clean_error(run("checkpoint", "info", path), str(path))


def test_checkpoint_info_of_a_structurally_corrupt_checkpoint(tmp_path):
    """A dataset where /params should be a group: a clear error, not an AttributeError traceback."""
    path = tmp_path / "corrupt.h5"
    with h5py.File(path, "w") as f:
        f.attrs.update(format="spmdcnn-checkpoint/1", step=1, epoch=0, model="name: x\n")
        f.create_dataset("params", data=np.zeros(3))
    expect_clean_error(run("checkpoint", "info", path), str(path))


def test_train_with_a_dataset_that_does_not_fit_the_model(tmp_path):
    data = tmp_path / "data.h5"
    with h5py.File(data, "w") as f:
        f.create_dataset("images", data=np.zeros((8, 3, 9, 9), dtype=np.uint8))
        f.create_dataset("labels", data=np.zeros(8, dtype=np.int64))
    job = write_job(tmp_path, data={"kind": "hdf5", "path": str(data)})
    expect_clean_error(run("train", job), str(data), "tiny_cnn")


def test_train_with_a_batch_bigger_than_the_dataset(tmp_path):
    data = tmp_path / "data.h5"
    with h5py.File(data, "w") as f:
        f.create_dataset("images", data=np.zeros((3, 3, 15, 13), dtype=np.uint8))
        f.create_dataset("labels", data=np.zeros(3, dtype=np.int64))
    job = write_job(tmp_path, data={"kind": "hdf5", "path": str(data)})
    expect_clean_error(run("train", job), str(data), "batch")


def test_debug_shows_the_exception(tmp_path):
    missing = tmp_path / "absent.yaml"
    with pytest.raises(FormatError, match="not found"):
        main(["--debug", "train", str(missing)])
    result = run("--debug", "train", missing)
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_in_process_errors_print_one_line(tmp_path, capsys):
    code, out, err = call(capsys, "train", tmp_path / "absent.yaml")
    assert code == 2 and out == ""
    assert err.startswith("spmdcnn: error:") and err.count("\n") == 1


def _examples():
    from spmdcnn.cli import EXAMPLES
    return [shlex.split(line) for line in EXAMPLES.splitlines()[1:] if line.strip()]     # as a shell splits them


def test_every_help_example_parses():
    from spmdcnn.cli import build_parser, routed
    for words in _examples():
        words = words[words.index("spmdcnn") + 1:]
        build_parser().parse_args(routed(words))    # exits on a bad option


def test_the_help_examples_that_train_after_the_quick_start_really_train():
    """After the quick start, a train example that resumed its complete checkpoint would only evaluate it."""
    from spmdcnn.io.job import load_job
    quick = load_job(os.path.join(ROOT, "jobs", "quickstart.yaml"))
    trains = [w for w in _examples() if "train" in w]
    assert len(trains) >= 3
    for words in trains[1:]:
        sets = [words[i + 1] for i, word in enumerate(words) if word == "--set"]
        job = load_job(os.path.join(ROOT, "jobs", "quickstart.yaml"), sets)
        fresh = job["resume"] is False or job["checkpoint"]["path"] != quick["checkpoint"]["path"]
        assert fresh, words
        if job["checkpoint"]["path"] != quick["checkpoint"]["path"]:
            assert job["log"]["metrics"] != quick["log"]["metrics"], words    # nor overwrite its metrics


def test_the_plan_examples_run_as_written(tmp_path):
    """``plan -o plan.yaml``, then ``simulate plan.yaml owt ...`` on it, as --help shows them."""
    examples = [w[w.index("spmdcnn") + 1:] for w in _examples() if w[w.index("spmdcnn") + 1] in ("plan", "simulate")
                and "plan.yaml" in w]
    assert [e[0] for e in examples] == ["plan", "simulate"]
    for words in examples:
        words = [os.path.join(ROOT, w) if w.startswith("models/") else w for w in words]
        result = subprocess.run([sys.executable, "-m", "spmdcnn.cli", *words], cwd=tmp_path, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "plan.yaml").exists()


def test_bench_names_the_blas_without_threadpoolctl_and_says_where_it_wrote_the_trace(tmp_path, monkeypatch,
                                                                                     capsys):
    """Without threadpoolctl, bench names the BLAS NumPy was built against rather than 'unknown'."""
    import builtins

    from spmdcnn.runtime import bench
    real = builtins.__import__

    def without_threadpoolctl(name, *args, **kwargs):
        if name.startswith("threadpoolctl"):
            raise ImportError(name)
        return real(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", without_threadpoolctl)
    words = bench.describe_blas(bench.blas_info())
    assert "openblas" in words.lower() and "NumPy's build; pip install threadpoolctl" in words
    assert bench.describe_blas([]) == "unknown: install threadpoolctl to see it"
    monkeypatch.setattr(builtins, "__import__", real)
    trace = tmp_path / "trace.json"
    code, out, _ = call(capsys, "bench", TINY, "--batch", "2", "--steps", "1", "--warmup", "0", "--trace", str(trace))
    assert code == 0 and trace.exists()
    assert f"wrote the last timed iteration of 1 rank to {trace} (spmdcnn plot --trace {trace} draws it)" in out


def test_a_run_says_what_blas_each_rank_runs(monkeypatch):
    """Training's start-up line: the BLAS once when every rank runs the same, else each with its ranks; a GPU rank's
    host BLAS is not said."""
    from types import SimpleNamespace

    from spmdcnn.runtime import bench
    found = {0: "openblas 0.3.31 SkylakeX x1", 1: "openblas 0.3.31 SkylakeX x1", 2: "mkl 2025 x2"}

    def world(ranks, host=None):
        return SimpleNamespace(allgather=lambda mine: [found[r] if host is None or r in host else None
                                                       for r in range(ranks)])
    assert bench.blas_of_ranks(world(2)) == "openblas 0.3.31 SkylakeX x1 on every rank"
    assert bench.blas_of_ranks(world(3)) == "openblas 0.3.31 SkylakeX x1 on ranks 0, 1; mkl 2025 x2 on rank 2"
    assert bench.blas_of_ranks(world(2, host={1})) == "openblas 0.3.31 SkylakeX x1 on rank 1"
    assert bench.blas_of_ranks(world(2, host=set())) == ""
    one = SimpleNamespace(allgather=lambda mine: [mine])
    assert bench.blas_of_ranks(one) == bench.describe_host()
    assert bench.describe_host().startswith(bench.describe_blas(bench.blas_info()) + "; compiled kernels ")


def test_a_missing_file_suggests_the_one_meant_and_a_shipped_machine_goes_by_its_name(capsys):
    code, _, err = call(capsys, "model", "models/alexnet.yml")
    assert code == 2 and "models/alexnet.yml: model file not found (did you mean models/alexnet.yaml?)" in err
    code, _, err = call(capsys, "plan", TINY, "--devices", "4", "--batch", "8", "--machine",
                        "jobs/machines/paper-p100-4x3.yaml")
    assert code == 2 and "(did you mean jobs/machines/paper-p100-4x4.yaml?)" in err
    code, out, err = call(capsys, "plan", TINY, "--devices", "4", "--batch", "8", "--machine", "paper-p100-4x4")
    assert code == 0, err
    assert "machine paper-p100-4x4" in out
