"""``spmdcnn data digits`` and ``spmdcnn data info``: scikit-learn's handwritten digits as HDF5 datasets."""

import json
import os

import h5py
import numpy as np
import pytest

from spmdcnn.cli import main
from spmdcnn.io.dataset import HDF5Dataset, dataset_info, write_dataset
from spmdcnn.io.digits import load_digits, make_digits


def test_the_digits_are_scikit_learns():
    images, labels = load_digits()
    assert images.shape == (1797, 1, 8, 8) and images.dtype == np.uint8 and labels.shape == (1797,)
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert images.min() == 0 and images.max() == 255
    # the first image of the file (a zero), row by row, in 0..16 before scaling
    first = [0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0]
    assert (images[0, 0, :2].ravel() == [(v * 255 + 8) // 16 for v in first]).all() and labels[0] == 0


def test_a_held_out_share_of_every_class(tmp_path):
    train, val = make_digits(tmp_path / "train.h5", tmp_path / "val.h5", held_out=0.25, seed=3)
    assert train + val == 1797
    with h5py.File(tmp_path / "train.h5") as a, h5py.File(tmp_path / "val.h5") as b:
        counts = np.bincount(b["labels"][()], minlength=10)
        totals = np.bincount(np.concatenate([a["labels"][()], b["labels"][()]]))
        assert (np.abs(counts - 0.25 * totals) <= 0.5).all()
        held = {bytes(x) for x in b["images"][()].reshape(val, -1)}
        assert not held & {bytes(x) for x in a["images"][()].reshape(train, -1)} - {bytes(64)}
        assert a["images"].attrs["mean"] == pytest.approx(b["images"].attrs["mean"])
    data = HDF5Dataset(tmp_path / "train.h5")
    images, _ = data.read(np.arange(train), np.float64)
    assert images.mean() == pytest.approx(0, abs=1e-9) and images.std() == pytest.approx(1, rel=1e-9)
    data.close()
    make_digits(tmp_path / "again.h5", tmp_path / "again-val.h5", held_out=0.25, seed=3)
    with h5py.File(tmp_path / "val.h5") as b, h5py.File(tmp_path / "again-val.h5") as c:
        assert np.array_equal(b["labels"][()], c["labels"][()]) and np.array_equal(b["images"][()], c["images"][()])
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]


def test_write_dataset_refuses_what_the_format_does_not_hold(tmp_path):
    with pytest.raises(ValueError, match="expected images"):
        write_dataset(tmp_path / "x.h5", np.zeros((3, 8), np.uint8), [0, 1, 2])
    with pytest.raises(ValueError, match="expected images"):
        write_dataset(tmp_path / "x.h5", np.zeros((3, 1, 8, 8), np.uint8), [0, 1])
    assert not os.listdir(tmp_path)


def test_the_data_command(tmp_path, capsys):
    assert main(["data", "digits", "-o", str(tmp_path / "d"), "--held-out", "0.1"]) == 0
    assert "train.h5 (1618 samples) and" in capsys.readouterr().out
    assert main(["data", "info", str(tmp_path / "d" / "val.h5")]) == 0
    out = capsys.readouterr().out
    assert "179 samples of 1x8x8 (C x H x W) uint8, 10 classes (labels 0..9)" in out and "samples per class" in out
    assert main(["data", "info", str(tmp_path / "d" / "val.h5"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info == dataset_info(tmp_path / "d" / "val.h5") and info["samples"] == 179
    assert main(["data", "info", str(tmp_path / "absent.h5")]) == 2
    assert "absent.h5: dataset not found" in capsys.readouterr().err
    assert main(["data", "digits", "-o", str(tmp_path / "e"), "--held-out", "1.5"]) == 2
    assert "held-out fraction must lie in (0, 1)" in capsys.readouterr().err
