"""The benchmark scripts run (on a tiny model), so the numbers in benchmarks/README.md stay reproducible."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args):
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_vs_pytorch_reports_both_sides_and_the_ratio():
    summary = json.loads(run("benchmarks/vs_pytorch.py", "models/tiny_cnn.yaml", "--batch", "4", "--steps", "2",
                             "--warmup", "1", "--rounds", "1", "--json"))
    assert summary["spmdcnn_images_per_s"] > 0 and summary["pytorch_images_per_s"] > 0
    assert summary["ratio"] == summary["spmdcnn_images_per_s"] / summary["pytorch_images_per_s"]
    assert summary["spmdcnn_peak_memory_mib"] > 0 and summary["pytorch_peak_memory_mib"] > 0


def test_profile_step_names_the_layers_and_the_gemm_floor():
    out = run("benchmarks/profile_step.py", "models/small_resnet.yaml", "--batch", "4", "--steps", "1")
    assert "per op" in out and "conv2d" in out and "GFLOP per iteration" in out


def test_runtime_overhead_times_the_runtime_without_kernels():
    out = run("benchmarks/runtime_overhead.py", "models/small_inception.yaml", "--steps", "2", "--rounds", "2")
    assert "ms of runtime per training step" in out and "us per layer and direction" in out


def test_data_pipeline_times_reads_workers_and_training():
    summary = json.loads(run("benchmarks/data_pipeline.py", "--images", "40", "--size", "16", "--batch", "8",
                             "--batches", "2", "--rounds", "1", "--train-model", "models/small_resnet.yaml",
                             "--train-batch", "4", "--train-ranks", "1", "--train-steps", "2", "--train-rounds", "1",
                             "--json"))
    reads = summary["reads_images_per_s"]
    assert "one image per chunk, per-sample hyperslabs (now)" in reads and all(rate > 0 for rate in reads.values())
    assert set(summary["workers"]) == {"0", "1", "2"} and summary["workers"]["2"]["worker_peak_mib"] > 0
    assert summary["training"]["ratio"] > 0 and summary["training"]["data_wait_s"] >= 0


def test_overlap_compares_the_thread_testing_and_after_backward():
    out = run("benchmarks/overlap.py", "--runs", "tiny_cnn:8", "--rounds", "1", "--steps", "2", "--warmup", "1",
              "--test-progress")
    assert "MPI" in out.splitlines()[0]
    for mode in ("overlap", "after", "test"):
        assert f"{mode:>8}: " in out
    assert "exposed with overlap / allreduce time without" in out


def test_collectives_times_blocking_and_nonblocking_allreduces():
    import shutil
    done = subprocess.run([shutil.which("mpiexec"), "-n", "2", sys.executable, "benchmarks/collectives.py",
                           "--rounds", "1", "--repeats", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    assert [int(row[0]) for row in rows] == [8, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
    assert all(float(row[1]) > 0 and float(row[2]) > 0 for row in rows)


def test_kernels_vs_torch_lists_each_shape_and_the_totals():
    out = run("benchmarks/kernels_vs_torch.py", "models/small_resnet.yaml", "--batch", "2", "--repeats", "1")
    assert "conv " in out and "batchnorm " in out
    assert "  conv  ours" in out and "  bn    ours" in out and "its matrix products at this BLAS's rate" in out


def test_kernels_vs_torch_times_transposed_convolutions_and_upsampling():
    out = run("benchmarks/kernels_vs_torch.py", "benchmarks/models/decoder_block.yaml", "--batch", "1", "--repeats",
              "1")
    assert "convT 64x24x36 -> 48, k3 s2 p1 op1" in out and "convT 48x48x72 -> 32, k2 s2 p0 op0" in out
    assert "upsample 32x96x144 x2 linear" in out and "  convT ours" in out and "  up    ours" in out


def test_search_time_reports_the_command_the_search_and_a_reference():
    out = run("benchmarks/search_time.py", "--models", "small_resnet", "--devices", "4", "--rounds", "1",
              "--reference", "HEAD")
    assert out.startswith("start-up (interpreter, imports, files, printing): ")
    row = [line for line in out.splitlines() if line.startswith("small_resnet")]
    assert len(row) == 1
    fields = row[0].split()
    assert fields[1] == "4" and int(fields[2]) >= int(fields[3]) > 0
    stages, search, command = [float(x) for x in fields[4:9]], float(fields[9]), float(fields[10])
    # Each figure is printed to 0.01 s: the stages' sum may exceed the search's by half a unit per rounded figure.
    assert 0 < sum(stages) <= search * 1.01 + 0.005 * (len(stages) + 1) and command >= search
    assert "HEAD: command s, GiB, iteration ms" in out and row[0].endswith(" ms")


def test_quickstart_predictions_reports_the_plans_and_the_errors(tmp_path):
    out = run("benchmarks/quickstart_predictions.py", "--ranks", "2", "--runs", "1", "--data", str(tmp_path / "d"),
              "--json", str(tmp_path / "q.json"))
    assert "2 ranks, run 1: predicted" in out and "2 ranks: the same plan in 1 of 1 runs" in out
    entry = json.loads((tmp_path / "q.json").read_text())["2"][0]
    assert entry["predicted_s"] > 0 and entry["measured_s"] > 0 and "format:" in entry["plan"]


def test_import_coverage_tries_each_network_and_says_what_it_found():
    table = run("benchmarks/import_coverage.py", "--libraries", "torchvision", "--only", "mnasnet0_5",
                "swin_t", "--size", "64")
    rows = {line.split()[1]: line for line in table.splitlines() if line.startswith("torchvision ")}
    assert rows["mnasnet0_5"].split()[2] == "2,218,512" and rows["mnasnet0_5"].endswith("exact")
    assert "refused: it is built on attention over activations" in rows["swin_t"], rows["swin_t"]
    assert "torchvision: 1 of 2 exact, 1 refused, 0 differing or failing" in table
