"""``spmdcnn data convert``: image folders and NumPy arrays into HDF5 datasets, a block at a time."""

import os

import h5py
import numpy as np
import pytest
from PIL import Image

from spmdcnn.cli import main
from spmdcnn.io import convert
from spmdcnn.io.convert import convert_arrays, convert_folder
from spmdcnn.io.dataset import DataError, HDF5Dataset


def folder(tmp_path, sizes=((12, 10), (9, 14), (12, 10)), classes=("cat", "ant", "bee")):
    rng = np.random.default_rng(0)
    images = {}
    for name in classes:
        (tmp_path / "imgs" / name).mkdir(parents=True)
        for i, (h, w) in enumerate(sizes):
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            path = tmp_path / "imgs" / name / f"{i}.png"
            Image.fromarray(pixels).save(path)
            images[str(path)] = pixels
    (tmp_path / "imgs" / "ant" / "notes.txt").write_text("not an image")
    return tmp_path / "imgs", images


def test_a_folder_becomes_a_dataset_resized_block_by_block(tmp_path, monkeypatch):
    source, images = folder(tmp_path)
    monkeypatch.setattr(convert, "BLOCK_BYTES", 700)          # a few images per block
    count, shape, classes = convert_folder(source, tmp_path / "out.h5", size=(8, 6))
    assert (count, shape, classes) == (9, (3, 8, 6), ["ant", "bee", "cat"])
    with h5py.File(tmp_path / "out.h5") as f:
        assert f["labels"][()].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
        assert list(f.attrs["classes"]) == ["ant", "bee", "cat"]
        stored = f["images"][()]
        expected = np.asarray(Image.fromarray(images[str(source / "cat" / "1.png")]).resize((6, 8), Image.Resampling.LANCZOS))
        assert np.array_equal(stored[7], expected.transpose(2, 0, 1))
        values = stored.astype(np.float64) / 255
        np.testing.assert_allclose(f["images"].attrs["mean"], values.mean(axis=(0, 2, 3)), rtol=1e-12)
        np.testing.assert_allclose(f["images"].attrs["std"], values.std(axis=(0, 2, 3)), rtol=1e-9)
    HDF5Dataset(tmp_path / "out.h5").close()
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]


def test_grayscale_and_images_of_one_size_need_no_resize(tmp_path):
    source, images = folder(tmp_path, sizes=((5, 7), (5, 7)))
    count, shape, _ = convert_folder(source, tmp_path / "g.h5", grayscale=True, normalize=False)
    assert (count, shape) == (6, (1, 5, 7))
    with h5py.File(tmp_path / "g.h5") as f:
        assert "mean" not in f["images"].attrs
        gray = np.asarray(Image.fromarray(images[str(source / "ant" / "0.png")]).convert("L"))
        assert np.array_equal(f["images"][0, 0], gray)


@pytest.mark.parametrize("case, message", [
    ("sizes", "the image is 14x9, the first one 10x12: give --size H W"),
    ("empty", "no class sub-folders"),
    ("no images", "no images (files ending in .png"),
    ("corrupt", "cannot read the image"),
    ("missing", "not a folder"),
])
def test_folders_that_do_not_convert_say_why(tmp_path, case, message):
    source, _ = folder(tmp_path) if case in ("sizes", "corrupt", "no images") else (tmp_path / "imgs", None)
    if case == "empty":
        source.mkdir()
    if case == "no images":
        (source / "dog").mkdir()
    if case == "corrupt":
        (source / "bee" / "9.png").write_bytes(b"\x89PNG broken")
        kwargs = {"size": (4, 4)}
    with pytest.raises(DataError, match=message.replace("(", "\\(")):
        convert_folder(source, tmp_path / "out.h5", **(kwargs if case == "corrupt" else {}))
    assert not (tmp_path / "out.h5").exists()


def test_arrays_convert_memory_mapped(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (11, 6, 5, 3), dtype=np.uint8)
    labels = rng.integers(0, 4, 11)
    np.save(tmp_path / "x.npy", images)
    np.save(tmp_path / "y.npy", labels)
    monkeypatch.setattr(convert, "BLOCK_BYTES", 200)
    assert main(["data", "convert", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy"), "--channels-last",
                 "-o", str(tmp_path / "a.h5")]) == 0
    with h5py.File(tmp_path / "a.h5") as f:
        assert np.array_equal(f["images"][()], images.transpose(0, 3, 1, 2))
        assert np.array_equal(f["labels"][()], labels)
    np.save(tmp_path / "bad.npy", labels[:3])
    with pytest.raises(DataError, match="expected 11 integer labels"):
        convert_arrays(tmp_path / "x.npy", tmp_path / "bad.npy", tmp_path / "b.h5")
    with pytest.raises(DataError, match="expected \\(N, C, H, W\\) images"):
        convert_arrays(tmp_path / "y.npy", tmp_path / "y.npy", tmp_path / "b.h5")


def test_the_convert_command_on_a_folder(tmp_path, capsys):
    source, _ = folder(tmp_path)
    assert main(["data", "convert", str(source), "--size", "8", "8", "-o", str(tmp_path / "f.h5")]) == 0
    assert "9 images of 3x8x8 (C x H x W), 3 classes (ant, bee, cat)" in capsys.readouterr().out
    assert main(["data", "convert", str(source), "--size", "0", "8", "-o", str(tmp_path / "f.h5")]) == 2
    assert "--size must be positive" in capsys.readouterr().err


def test_archives_and_negative_labels_are_refused(tmp_path):
    np.savez(tmp_path / "x.npz", a=np.zeros((2, 1, 2, 2), np.uint8))
    np.save(tmp_path / "y.npy", np.array([0, -1]))
    np.save(tmp_path / "x.npy", np.zeros((2, 1, 2, 2), np.uint8))
    with pytest.raises(DataError, match="x.npz: expected one array"):
        convert_arrays(tmp_path / "x.npz", tmp_path / "y.npy", tmp_path / "o.h5")
    with pytest.raises(DataError, match="labels must be non-negative"):
        convert_arrays(tmp_path / "x.npy", tmp_path / "y.npy", tmp_path / "o.h5")


def test_a_killed_writers_temporary_file_is_removed_by_the_next_write(tmp_path):
    from spmdcnn.io.dataset import write_dataset
    dead = subprocess_pid()
    stale = tmp_path / f"d.h5.{dead}.0123abcd.tmp"
    stale.write_bytes(b"half a dataset")
    alive = tmp_path / f"d.h5.{os.getpid()}.0123abcd.tmp"
    alive.write_bytes(b"being written")
    write_dataset(tmp_path / "d.h5", np.zeros((1, 1, 2, 2), np.uint8), [0])
    assert not stale.exists() and alive.exists()


def subprocess_pid():
    import subprocess
    import sys
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid
