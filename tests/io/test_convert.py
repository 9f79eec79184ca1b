"""``spmdcnn data convert``: image folders and NumPy arrays into HDF5 datasets, a block at a time."""

import io
import os
import re
import subprocess
import sys

import h5py
import numpy as np
import pytest
from PIL import Image

from spmdcnn.cli import main
from spmdcnn.io import convert
from spmdcnn.io.convert import convert_arrays, convert_folder
from spmdcnn.io.dataset import DataError, HDF5Dataset
from spmdcnn.progress import CLEAR, Progress


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
    ("sizes", "ant/1.png: the image is 9 x 14 (H x W), the first one 12 x 10: give --size H W"),
    ("empty", "no class sub-folders"),
    ("no images", "no images (files ending in .png"),
    ("corrupt", "cannot read the image"),
    ("missing", "imgs: does not exist (expected an image folder, one sub-folder of images per class, or an images "
                ".npy with --labels)"),
    ("a file", "imgs: not a folder (expected an image folder"),
    ("an .npy", "x.npy: an images .npy needs its labels: give --labels LABELS.npy"),
])
def test_folders_that_do_not_convert_say_why(tmp_path, case, message):
    source, _ = folder(tmp_path) if case in ("sizes", "corrupt", "no images") else (tmp_path / "imgs", None)
    if case == "a file":
        source.write_text("not a folder")
    if case == "an .npy":
        source = tmp_path / "x.npy"
        np.save(source, np.zeros((2, 3, 4, 4), np.uint8))
    if case == "empty":
        source.mkdir()
    if case == "no images":
        (source / "dog").mkdir()
    if case == "corrupt":
        (source / "bee" / "9.png").write_bytes(b"\x89PNG broken")
        kwargs = {"size": (4, 4)}
    with pytest.raises(DataError, match=re.escape(message)):
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
    with pytest.raises(DataError, match="expected \\(N, C, H, W\\) or \\(N, H, W, C\\) images, uint8 or float32, "
                       "got \\(11,\\) int64"):
        convert_arrays(tmp_path / "y.npy", tmp_path / "y.npy", tmp_path / "b.h5")


@pytest.mark.parametrize("shape, layout, stored", [
    ((2, 3, 5, 6), None, (3, 5, 6)),                # only the second dim is a channel count: (N, C, H, W)
    ((2, 1, 2, 2), None, (1, 2, 2)),
    ((2, 4, 3, 7), False, (4, 3, 7)),               # said: read as said
    ((2, 6, 5, 3), False, (6, 5, 3)),
    ((2, 3, 5, 3), True, (3, 3, 5)),
])
def test_the_layout_is_read_from_the_shape_or_as_said(tmp_path, shape, layout, stored):
    images = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    np.save(tmp_path / "x.npy", images)
    np.save(tmp_path / "y.npy", np.zeros(2, np.int64))
    count, read = convert_arrays(tmp_path / "x.npy", tmp_path / "y.npy", tmp_path / "a.h5", layout)
    assert (count, read) == (2, stored)
    with h5py.File(tmp_path / "a.h5") as f:
        assert np.array_equal(f["images"][()], images.transpose(0, 3, 1, 2) if layout else images)


@pytest.mark.parametrize("shape, message", [
    ((2, 6, 5, 3), "x.npy: images of shape (2, 6, 5, 3) look like (N, H, W, C), 3 channels of 6 x 5 (H x W): the "
                   "last dim (3) is a channel count (1, 3 or 4) and the second (6) is not; pass --channels-last (or "
                   "--channels-first if they really are (N, C, H, W), 6 channels of 5 x 3 (H x W))"),
    ((2, 3, 5, 4), "x.npy: images of shape (2, 3, 5, 4) are ambiguous: the second dim (3) and the last (4) could "
                   "both be a channel count (1, 3 or 4); pass --channels-first if they are (N, C, H, W), 3 channels "
                   "of 5 x 4 (H x W), or --channels-last if they are (N, H, W, C), 4 channels of 3 x 5 (H x W)"),
    ((2, 6, 5, 7), "x.npy: images of shape (2, 6, 5, 7) are ambiguous: neither the second dim (6) nor the last (7) "
                   "is a channel count (1, 3 or 4); pass --channels-first if they are (N, C, H, W), 6 channels of "
                   "5 x 7 (H x W), or --channels-last if they are (N, H, W, C), 7 channels of 6 x 5 (H x W)"),
    ((2, 1, 4, 1), "x.npy: images of shape (2, 1, 4, 1) are ambiguous: the second dim (1) and the last (1) could "
                   "both be a channel count (1, 3 or 4); pass --channels-first if they are (N, C, H, W), 1 channel "
                   "of 4 x 1 (H x W), or --channels-last if they are (N, H, W, C), 1 channel of 1 x 4 (H x W)"),
])
def test_a_layout_the_shape_does_not_tell_is_refused_naming_the_options(tmp_path, capsys, shape, message):
    np.save(tmp_path / "x.npy", np.zeros(shape, np.uint8))
    np.save(tmp_path / "y.npy", np.zeros(2, np.int64))
    with pytest.raises(DataError, match=re.escape(message) + "$"):
        convert_arrays(tmp_path / "x.npy", tmp_path / "y.npy", tmp_path / "a.h5")
    assert not (tmp_path / "a.h5").exists()
    argv = ["data", "convert", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy"),
            "-o", str(tmp_path / "a.h5")]
    assert main(argv) == 2
    assert "images of shape " + str(shape) in capsys.readouterr().err
    assert main(argv + ["--channels-first"]) == 0 and main(argv + ["--channels-last"]) == 0
    with pytest.raises(SystemExit):
        main(argv + ["--channels-first", "--channels-last"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_convert_command_on_a_folder_shows_its_progress_then_what_it_wrote(tmp_path, capsys, monkeypatch):
    source, _ = folder(tmp_path)
    monkeypatch.setattr(convert, "BLOCK_BYTES", 3 * 8 * 8 * 4)      # 4 images a block
    assert main(["data", "convert", str(source), "--size", "8", "8", "-o", str(tmp_path / "f.h5")]) == 0
    lines = capsys.readouterr().out.splitlines()           # captured: not a terminal, so a line each 5 %
    assert [line.split(",")[0] for line in lines[:-1]] == [
        f"convert: {100 * done // 9} % ({done} of 9 images)" for done in range(1, 10)]      # 11 % each image
    assert " images/s, done in " in lines[-2]
    assert lines[-1] == f"wrote {tmp_path / 'f.h5'}: 9 images of 3x8x8 (C x H x W), 3 classes (ant, bee, cat)"
    assert main(["data", "convert", str(source), "--size", "0", "8", "-o", str(tmp_path / "f.h5")]) == 2
    assert "--size must be positive, got 0 x 8 (H x W)" in capsys.readouterr().err


def test_the_convert_command_in_a_batch_log_prints_progress_lines(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((5, 3, 6, 6), np.uint8))
    np.save(tmp_path / "y.npy", np.arange(5))
    run = subprocess.run([sys.executable, "-c", "import sys; from spmdcnn.cli import main; sys.exit(main())",
                          "data", "convert", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy"),
                          "-o", str(tmp_path / "a.h5")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("convert: 100 % (5 of 5 images), ") and "done in" in lines[0]
    assert lines[1:] == [f"wrote {tmp_path / 'a.h5'}: 5 images of 3x6x6 (C x H x W)"]
    assert "\x1b" not in run.stdout and not run.stderr


def test_the_progress_a_library_caller_asks_for(tmp_path, monkeypatch):
    source, _ = folder(tmp_path)
    monkeypatch.setattr(convert, "BLOCK_BYTES", 3 * 4 * 4 * 5)      # 5 images a block
    log, terminal = io.StringIO(), Terminal()
    convert_folder(source, tmp_path / "a.h5", size=(4, 4), progress=lambda total: Progress(total, "c", stream=log))
    assert [line.split(" (")[0] for line in log.getvalue().splitlines()] == [     # a folder: each image read
        f"c: {100 * done // 9} %" for done in range(1, 10)]
    np.save(tmp_path / "x.npy", np.zeros((9, 3, 4, 5), np.uint8))        # 60 bytes: 4 images a block
    np.save(tmp_path / "y.npy", np.zeros(9, np.int64))
    log = io.StringIO()
    convert_arrays(tmp_path / "x.npy", tmp_path / "y.npy", tmp_path / "b.h5",
                   progress=lambda total: Progress(total, "c", unit="arrays", stream=log))
    assert [line.split(",")[0] for line in log.getvalue().splitlines()] == [     # arrays: each block written
        "c: 44 % (4 of 9 arrays)", "c: 88 % (8 of 9 arrays)", "c: 100 % (9 of 9 arrays)"]
    (source / "bee" / "9.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(DataError, match="9.png: cannot read the image"):
        convert_folder(source, tmp_path / "b.h5", size=(4, 4),
                       progress=lambda total: Progress(total, "c", stream=terminal))
    assert terminal.getvalue().startswith(CLEAR + "c [##...")        # 1 of 10 read, drawn at once
    assert terminal.getvalue().endswith(CLEAR)              # the bar is erased before the error is printed


class Terminal(io.StringIO):
    def isatty(self):
        return True


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
