"""``spmdcnn data bench`` and ``spmdcnn bench --data``: the rate a dataset delivers, a worker's memory against its
buffers, the time a training step waits for data, and the errors of bad settings."""

import json
import os

import h5py
import numpy as np
import pytest

from spmdcnn.cli import main
from spmdcnn.io.databench import data_bench

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL_RESNET = os.path.join(ROOT, "models", "small_resnet.yaml")      # takes 3 x 16 x 16, 10 classes


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("bench") / "data.h5")
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=rng.integers(0, 256, (64, 3, 40, 40), dtype=np.uint8), chunks=(1, 3, 40, 40))
        f.create_dataset("labels", data=rng.integers(0, 10, 64))
    return path


def call(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_data_bench_reports_the_rate_and_the_workers_memory(stored):
    result = data_bench(stored, 16, workers=2, augment={"crop": [32, 32], "flip": True}, batches=6, warmup=1)
    assert result["images_per_s"] > 0 and result["workers"] == 2 and result["prefetch"] == 3
    assert result["sample_shape"] == [3, 32, 32] and result["augment"] == "random 32x32 crops, horizontal flips"
    assert result["shared_bytes"] == 4 * result["batch_bytes"] >= 4 * 16 * 3 * 32 * 32 * 4
    # a worker holds an idle interpreter's memory, the shared batches and one batch as stored: no more
    bound = result["idle_worker_bytes"] + result["shared_bytes"] + result["staging_bytes"]
    assert result["worker_peak_bytes"] <= bound + (16 << 20), (result["worker_peak_bytes"], bound)


def test_data_bench_without_workers(stored):
    result = data_bench(stored, 8, workers=0, batches=3, warmup=0)
    assert result["workers"] == 0 and result["worker_peak_bytes"] is None and result["shared_bytes"] == 0


def test_data_bench_command_text_and_json(stored, capsys):
    code, out, _ = call(capsys, "data", "bench", stored, "--batch", 8, "--workers", 1, "--batches", 3, "--augment",
                        "{crop: [24, 24]}")
    assert code == 0
    assert f"{stored}: shuffled batches of 8 images of 3x40x40 uint8 (chunks [1, 3, 40, 40]), augmentation: random " \
           "24x24 crops" in out
    assert "images/s delivered" in out and "1 worker, 2 batches ahead" in out and "a worker's peak memory" in out
    code, out, _ = call(capsys, "data", "bench", stored, "--batch", 8, "--workers", 0, "--batches", 2, "--json")
    assert code == 0 and json.loads(out)["images_per_s"] > 0


@pytest.mark.parametrize("args, fragment", [
    (["--augment", "{crop: [48, 48]}"], "data.augment.crop 48 x 48 (H x W) is larger than the stored images, 40 x 40"),
    (["--augment", "{crap: 1}"], "--augment: unknown key 'crap' (allowed: crop, flip)"),
    (["--batch", "100"], "64 samples cannot fill one batch of 100"),
    (["--batches", "0"], "--batch and --batches must be positive")])
def test_data_bench_bad_settings_say_what_is_wrong(stored, capsys, args, fragment):
    argv = ["data", "bench", stored, "--batch", "8", *args]
    code, _, err = call(capsys, *argv)
    assert code == 2 and fragment in err and err.count("\n") == 1, err


def test_data_bench_refuses_a_worker_count_that_is_not_one(stored, capsys):
    with pytest.raises(SystemExit):
        main(["data", "bench", stored, "--batch", "8", "--workers", "many"])
    assert "expected auto or a non-negative integer, got 'many'" in capsys.readouterr().err


def test_bench_on_real_data_reports_the_data_wait(stored, capsys):
    code, out, _ = call(capsys, "bench", SMALL_RESNET, "--batch", 4, "--steps", 3, "--warmup", 1, "--data", stored,
                        "--augment", "{crop: [16, 16], flip: true}", "--workers", 1, "--json")
    assert code == 0
    result = json.loads(out)
    assert result["data"] == stored and result["workers"] == 1 and 0 <= result["data_wait_s"] < result["step_s_mean"]
    code, out, _ = call(capsys, "bench", SMALL_RESNET, "--batch", 4, "--steps", 2, "--warmup", 0, "--data", stored,
                        "--augment", "{crop: [16, 16]}", "--workers", 0)
    assert code == 0 and "(read in each step): a step waited" in out


def test_bench_on_data_that_does_not_fit_the_model(stored, capsys):
    code, _, err = call(capsys, "bench", SMALL_RESNET, "--batch", 4, "--steps", 1, "--data", stored)
    assert code == 2 and "images are [3, 40, 40] (C, H, W) but model 'small_resnet' takes [3, 16, 16]: set " \
                          "--augment '{crop: [16, 16]}' to crop them" in err
