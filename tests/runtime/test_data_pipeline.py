"""The data pipeline in training runs: augmentation and worker processes change nothing a run computes (a resumed
run stays bit-exact), the step's data wait is logged, and bad data settings stop the job before any step."""

import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from processes import data_workers, kill_a_data_worker
from spmdcnn.io.checkpoint import CheckpointError, load_checkpoint
from spmdcnn.io.dataset import DataError
from spmdcnn.io.job import parse_job
from spmdcnn.runtime.train import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "tiny_cnn.yaml")      # takes 3 x 15 x 13


def write_data(path, samples=24, shape=(18, 17)):
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=rng.integers(0, 256, (samples, 3) + shape, dtype=np.uint8),
                         chunks=(1, 3) + shape)
        f.create_dataset("labels", data=rng.integers(0, 10, samples))
    return str(path)


def make_job(folder, data, steps=6, **data_keys):
    return parse_job({"model": MODEL, "batch_size": 6, "steps": steps, "dtype": "float64", "seed": 2,
                      "data": {"kind": "hdf5", "path": data, "seed": 4,
                               "augment": {"crop": [15, 13], "flip": True}, **data_keys},
                      "optimizer": {"lr": 0.05, "momentum": 0.9},
                      "checkpoint": {"path": str(folder / "run.h5"), "every": 3},
                      "log": {"every": 1, "metrics": str(folder / "metrics.jsonl")}}, "test-job")


def quiet(_line):
    pass


def test_any_number_of_workers_trains_the_same_weights(tmp_path):
    """And evaluates the same: three evaluations, the later ones reading with the first one's workers."""
    data = write_data(tmp_path / "data.h5")
    val = write_data(tmp_path / "val.h5", samples=15, shape=(16, 16))      # batches of 6: the last one padded
    runs = {}
    for workers in (0, 1, 2):
        folder = tmp_path / f"w{workers}"
        folder.mkdir()
        job = make_job(folder, data, workers=workers, val=val)
        job["eval"]["every"] = 2
        evaluated = []
        Trainer(job, log=lambda line: evaluated.append(line.split("val loss")[1]) if "val loss" in line else None
                ).run()
        runs[workers] = ([json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()],
                         [json.loads(line).get("val_loss") for line in (folder / "metrics.jsonl").read_text()
                          .splitlines()])
        assert len(evaluated) == 3
    assert runs[0] == runs[1] == runs[2]
    a, b = load_checkpoint(tmp_path / "w0" / "run.h5"), load_checkpoint(tmp_path / "w2" / "run.h5")
    assert all(np.array_equal(a.params[name], b.params[name]) for name in a.params)


def test_augmentation_changes_what_is_trained(tmp_path):
    data = write_data(tmp_path / "data.h5")
    flipped = Trainer(make_job(tmp_path, data, steps=3), log=quiet).run()["losses"]
    job = make_job(tmp_path, data, steps=3, augment={"crop": [15, 13], "flip": False})
    job["resume"] = False
    assert Trainer(job, log=quiet).run()["losses"] != flipped


def test_a_resumed_run_with_workers_and_augmentation_is_bit_exact(tmp_path):
    data = write_data(tmp_path / "data.h5")
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    whole.mkdir()
    parts.mkdir()
    uninterrupted = Trainer(make_job(whole, data, steps=10, workers=2), log=quiet).run()["losses"]
    first = Trainer(make_job(parts, data, steps=5, workers=1), log=quiet).run()["losses"]
    rest = Trainer(make_job(parts, data, steps=10, workers=2), log=quiet).run()["losses"]
    assert first + rest == uninterrupted          # 4 batches an epoch: the resumed run starts mid-epoch
    a, b = load_checkpoint(whole / "run.h5"), load_checkpoint(parts / "run.h5")
    for name in a.params:
        assert np.array_equal(a.params[name], b.params[name]) and np.array_equal(a.momentum[name], b.momentum[name])


@pytest.mark.parametrize("before, after, change", [
    ({"crop": [15, 13], "flip": True}, {"crop": [15, 13]}, "'crop 15x13, flip' -> 'crop 15x13'"),
    ({"flip": True}, {}, "'flip' -> 'none'"), ({}, {"flip": True}, "'none' -> 'flip'")])
def test_resuming_with_other_augmentation_is_refused(tmp_path, before, after, change):
    data = write_data(tmp_path / "data.h5", shape=(15, 13))
    Trainer(make_job(tmp_path, data, steps=3, augment=before), log=quiet).run()
    with pytest.raises(CheckpointError, match=f"data.augment {change}"):
        Trainer(make_job(tmp_path, data, augment=after), log=quiet)


def test_a_checkpoint_from_before_augmentation_resumes_a_run_without_it(tmp_path):
    import h5py as h5
    data = write_data(tmp_path / "data.h5", shape=(15, 13))
    Trainer(make_job(tmp_path, data, steps=3, augment={}), log=quiet).run()
    with h5.File(tmp_path / "run.h5", "r+") as f:       # as an older spmdcnn wrote it
        del f["state"].attrs["data.augment"]
    assert Trainer(make_job(tmp_path, data, augment={}), log=quiet).start_step == 3
    with pytest.raises(CheckpointError, match="data.augment 'none' -> 'flip'"):
        Trainer(make_job(tmp_path, data, augment={"flip": True}), log=quiet)


def test_the_data_wait_is_logged_and_recorded(tmp_path):
    data = write_data(tmp_path / "data.h5")
    lines = []
    Trainer(make_job(tmp_path, data, workers=1), log=lines.append).run()
    assert any(line.startswith(f"data: {data}, 24 samples shuffled, random 15x13 crops, horizontal flips; 1 worker "
                               "per rank reading up to 2 batches ahead (") for line in lines), lines
    assert all("data wait" in line for line in lines if line.startswith("step"))
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= record["data_wait_s"] < record["step_s"] + 1 for record in records)


def test_held_out_data_is_center_cropped_to_the_training_crop(tmp_path):
    """The held-out result on 16x16 images under a 15x13 crop equals that on the same images cut at their center
    beforehand (rows 0-14, columns 1-13), never flipped."""
    data = write_data(tmp_path / "data.h5")
    val = write_data(tmp_path / "val.h5", samples=7, shape=(16, 16))
    with h5py.File(val) as f, h5py.File(tmp_path / "center.h5", "w") as center:
        center["images"], center["labels"] = f["images"][:, :, 0:15, 1:14], f["labels"][()]
    results = []
    for held_out in (val, str(tmp_path / "center.h5")):
        folder = tmp_path / os.path.basename(held_out)[:-3]
        folder.mkdir()
        job = make_job(folder, data, val=held_out)
        job["eval"]["every"] = 3
        results.append(Trainer(job, log=quiet).run()["val"])
    assert results[0] == results[1]


@pytest.mark.parametrize("augment, fragment", [
    ({"crop": [19, 13]}, "data.augment.crop 19 x 13 (H x W) is larger than the stored images, 18 x 17"),
    ({"crop": None}, "images are [3, 18, 17] (C, H, W) but model 'tiny_cnn' takes [3, 15, 13]: set "
                     "data.augment.crop: [15, 13] to crop them")])
def test_a_crop_that_does_not_fit_is_refused_before_training(tmp_path, augment, fragment):
    data = write_data(tmp_path / "data.h5")
    job = make_job(tmp_path, data)
    job["data"]["augment"].update(augment)
    with pytest.raises(DataError) as info:
        Trainer(job, log=quiet)
    assert data in str(info.value) and fragment in str(info.value)
    assert not os.path.exists(tmp_path / "run.h5")


def test_a_truncated_dataset_is_refused_naming_the_file(tmp_path):
    data = write_data(tmp_path / "data.h5")
    size = os.path.getsize(data)
    with open(data, "r+b") as handle:
        handle.truncate(size // 2)
    with pytest.raises(DataError) as info:
        Trainer(make_job(tmp_path, data), log=quiet)
    assert data in str(info.value)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the workers through /proc (Linux)")
@pytest.mark.timeout(120)
def test_a_worker_killed_mid_run_ends_the_job_with_a_message(tmp_path):
    data = write_data(tmp_path / "data.h5", samples=60)
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({"model": MODEL, "batch_size": 6, "steps": 100000,
                               "data": {"kind": "hdf5", "path": data, "workers": 2,
                                        "augment": {"crop": [15, 13]}},
                               "log": {"every": 1, "progress": False}}))
    process = subprocess.Popen([sys.executable, "-m", "spmdcnn.cli", "train", str(job)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    err = kill_a_data_worker(process, lambda: data_workers({process.pid}), 2, 1, within=10)
    assert process.returncode != 0
    assert f"data worker 2 of 2 reading {data}" in err and "killed by SIGKILL" in err, err


def test_held_out_classes_must_be_the_training_set_s(tmp_path):
    data = write_data(tmp_path / "data.h5")
    val = write_data(tmp_path / "val.h5", samples=7, shape=(16, 16))
    with h5py.File(data, "r+") as f:
        f.attrs["classes"] = [f"n{k:08d}" for k in range(10)]
    with h5py.File(val, "r+") as f:
        f.attrs["classes"] = [f"n{k:08d}" for k in reversed(range(10))]
    with pytest.raises(DataError) as info:
        Trainer(make_job(tmp_path, data, val=val), log=quiet)
    assert (f"{val}: its classes are not those of the training set {data} (label 0 is 'n00000009' there, "
            f"'n00000000' in training): convert the held-out images with --classes {data}") in str(info.value)


def test_held_out_data_normalised_otherwise_is_said(tmp_path):
    data = write_data(tmp_path / "data.h5")
    val = write_data(tmp_path / "val.h5", samples=7, shape=(16, 16))
    for path, mean in ((data, 0.5), (val, 0.4)):
        with h5py.File(path, "r+") as f:
            f["images"].attrs.update({"mean": [mean] * 3, "std": [0.25] * 3})
    lines = []
    Trainer(make_job(tmp_path, data, val=val, steps=1), log=lines.append)
    assert f"warning: data.val {val} is normalised with its own mean and std, not the training set's ({data}): " \
           f"convert it with --classes {data} to share them" in lines


def test_auto_starts_no_workers_for_a_run_that_reads_little(tmp_path):
    data = write_data(tmp_path / "data.h5")
    lines = []
    Trainer(make_job(tmp_path, data, steps=3), log=lines.append).run()
    assert any(line.startswith(f"data: {data}, 24 samples shuffled") and "read in each step (data.workers auto: a "
               "batch read in " in line and "the run's would take under 1 s)" in line for line in lines), lines


def test_held_out_data_without_the_training_set_s_statistics_is_said(tmp_path):
    data = write_data(tmp_path / "data.h5")
    val = write_data(tmp_path / "val.h5", samples=7, shape=(16, 16))
    with h5py.File(data, "r+") as f:
        f["images"].attrs.update({"mean": [0.5] * 3, "std": [0.25] * 3})
    lines = []
    Trainer(make_job(tmp_path, data, val=val, steps=1), log=lines.append)
    assert f"warning: data.val {val} is normalised with no mean and std, not the training set's ({data}): " \
           f"convert it with --classes {data} to share them" in lines
