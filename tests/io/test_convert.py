"""``spmdcnn data convert``: image folders and NumPy arrays into HDF5 datasets, a block at a time."""

import contextlib
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
from spmdcnn.io.dataset import DataError, HDF5Dataset, write_dataset
from spmdcnn.io.workers import WorkerError
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
        expected = np.asarray(Image.fromarray(images[str(source / "cat" / "1.png")]).resize(
            (6, 8), Image.Resampling.LANCZOS))
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
    with pytest.raises(DataError, match="expected \\(N, C, H, W\\) or \\(N, H, W, C\\) images, \\(N, C, D, H, W\\) or "
                       "\\(N, D, H, W, C\\) volumes, uint8 or float32, got \\(11,\\) int64"):
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


def stored(path):
    """Everything a dataset file holds: its arrays, their chunk layout and every attribute."""
    with h5py.File(path) as f:
        return {"images": f["images"][()], "labels": f["labels"][()], "chunks": f["images"].chunks,
                "attrs": {k: np.asarray(v).tolist() for k, v in f.attrs.items()},
                "image attrs": {k: np.asarray(v).tolist() for k, v in f["images"].attrs.items()}}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]) if isinstance(a[key], np.ndarray) else a[key] == b[key], key


@pytest.fixture
def started(monkeypatch):
    """The worker processes conversions start."""
    workers = []

    class Counted(convert.Worker):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            workers.append(self)
    monkeypatch.setattr(convert, "Worker", Counted)
    return workers


def test_workers_write_what_one_process_writes_in_file_order(tmp_path, monkeypatch, started):
    source, _ = folder(tmp_path, sizes=((12, 10), (9, 14), (12, 10), (7, 9), (10, 10)))      # 15 images
    monkeypatch.setattr(convert, "BLOCK_BYTES", 3 * 8 * 6 * 4)      # 4 images a block
    convert_folder(source, tmp_path / "one.h5", size=(8, 6), workers=0)
    assert not started
    log = io.StringIO()
    count, shape, classes = convert_folder(source, tmp_path / "two.h5", size=(8, 6), workers=2,
                                           progress=lambda total: Progress(total, "c", stream=log))
    assert (count, shape, classes) == (15, (3, 8, 6), ["ant", "bee", "cat"])
    assert len(started) == 2 and all(worker.process.poll() is not None for worker in started)     # closed
    assert_same(stored(tmp_path / "one.h5"), stored(tmp_path / "two.h5"))
    assert [line.split(" (")[0] for line in log.getvalue().splitlines()] == [
        f"c: {100 * done // 15} %" for done in range(1, 16)]          # each image, as the answers come back


def test_with_workers_an_unreadable_image_is_one_error_naming_it_and_the_workers_end(tmp_path, started):
    source, _ = folder(tmp_path, sizes=((6, 6),) * 4)
    (source / "bee" / "2.png").write_bytes(b"\x89PNG broken")
    (source / "cat" / "0.png").write_bytes(b"also broken")         # later in file order: not the one named
    with pytest.raises(DataError, match=re.escape(f"{source / 'bee' / '2.png'}: cannot read the image")):
        convert_folder(source, tmp_path / "out.h5", size=(4, 4), workers=2)
    assert len(started) == 2 and all(worker.process.poll() is not None for worker in started)
    assert not (tmp_path / "out.h5").exists()


def test_a_worker_that_dies_stops_the_conversion_naming_it(tmp_path, monkeypatch, started):
    source, _ = folder(tmp_path, sizes=((6, 6),) * 4)
    monkeypatch.setattr(convert, "DECODE_BATCH", 1)                 # 12 messages, one at a time at each worker
    monkeypatch.setattr(convert, "IN_FLIGHT", 1)

    class Killing(contextlib.AbstractContextManager):       # a progress bar that kills worker 1
        def __exit__(self, *error):
            pass

        def update(self, done):
            if done == 1:
                started[0].process.kill()
    message = re.escape(f"convert worker 1 of 2 decoding {source}: the worker (pid ") + r"\d+\) was killed by SIGKILL"
    with pytest.raises(WorkerError, match=message):
        convert_folder(source, tmp_path / "out.h5", size=(4, 4), workers=2, progress=lambda total: Killing())
    assert all(worker.process.poll() is not None for worker in started)
    assert not (tmp_path / "out.h5").exists()


def test_the_convert_command_decodes_in_workers(tmp_path, capsys, started):
    source, _ = folder(tmp_path, sizes=((12, 10),) * 4)
    for workers, name in (("2", "w.h5"), ("0", "s.h5")):
        assert main(["data", "convert", str(source), "--size", "8", "8", "--workers", workers,
                     "-o", str(tmp_path / name)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"wrote {tmp_path / 's.h5'}: 12 images of 3x8x8 (C x H x W), 3 classes (ant, bee, cat)")
    assert_same(stored(tmp_path / "w.h5"), stored(tmp_path / "s.h5"))
    assert len(started) == 2
    assert main(["data", "convert", str(source), "--workers", "-1", "-o", str(tmp_path / "n.h5")]) == 2
    assert "--workers must be 0 or more, got -1" in capsys.readouterr().err


def images_folder(tmp_path, names=("b.png", "a.png", "c.jpg", "d.png")):
    """A folder of images (no class sub-folders), image ``k`` of the sorted names filled with the value 10 k."""
    (tmp_path / "val").mkdir()
    for k, name in enumerate(sorted(names)):
        Image.fromarray(np.full((5, 4, 3), 10 * k, np.uint8)).save(tmp_path / "val" / name, quality=100)
    return tmp_path / "val"


def training_set(tmp_path, classes=("bee", "cat", "ant")):
    """A dataset converted from class sub-folders: its classes attribute is ["ant", "bee", "cat"]."""
    source, _ = folder(tmp_path, sizes=((4, 4),), classes=classes)
    convert_folder(source, tmp_path / "train.h5")
    return tmp_path / "train.h5"


@pytest.mark.parametrize("text, names, labels, classes", [
    ("2\n0\n\n1\n2\n", None, [2, 0, 1, 2], None),                           # a label a line, sorted file order
    ("2 the rest is ignored\n0\n1\n2\n", "h5", [2, 0, 1, 2], ["ant", "bee", "cat"]),
    ("file,label\nd.png,1\na.png,0\nc,2\nb,1\n", None, [0, 1, 2, 1], None),     # a header; names with or without
    ("d.png,1\na.png,0\nc,2\nsub/b.png,1\n", None, [0, 1, 2, 1], None),         # no header; a path's folders
    ("ImageId,PredictionString\nc,cat 1 2 3 4 cat 5 6 7 8\nd,ant 1 1 2 2\na,bee 0 0 1 1\nb,cat 3 3 4 4\n",
     "h5", [1, 2, 2, 0], ["ant", "bee", "cat"]),                             # Kaggle's LOC_val_solution.csv
    ("bee\ncat\nbee\nant\n", "h5", [1, 2, 1, 0], ["ant", "bee", "cat"]),
    ("bee\ncat\nbee\nant\n", "txt", [0, 1, 0, 2], ["bee", "cat", "ant"]),
    ("cat\nbee\nbee\ncat\n", None, [1, 0, 0, 1], ["bee", "cat"]),            # numbered in sorted order
])
def test_a_folder_of_images_takes_its_labels_from_a_file(tmp_path, text, names, labels, classes):
    source = images_folder(tmp_path)
    (tmp_path / "labels.txt").write_text(text)
    (tmp_path / "names.txt").write_text("bee  an insect\ncat\n\nant\n")
    given = {"h5": training_set(tmp_path), "txt": tmp_path / "names.txt", None: None}[names]
    count, shape, found = convert_folder(source, tmp_path / "v.h5", labels=tmp_path / "labels.txt", classes=given)
    assert (count, shape, found) == (4, (3, 5, 4), classes)
    with h5py.File(tmp_path / "v.h5") as f:
        assert f["labels"][()].tolist() == labels
        assert f["images"][:, 0, 0, 0].tolist() == [0, 10, 20, 30]       # a.png, b.png, c.jpg, d.png
        assert (list(f.attrs["classes"]) if "classes" in f.attrs else None) == classes


@pytest.mark.parametrize("case, text, message", [
    ("fewer", "0\n1\n2\n", "labels.txt: 3 labels for the 4 images of {val} (one a line, in sorted file order): "
                           "none for d.png and after"),
    ("more", "0\n1\n\n2\n3\n4\n", "labels.txt: 5 labels for the 4 images of {val} (one a line, in sorted file "
                                  "order): line 6 labels no image"),
    ("no such file", "a,0\nb,0\ne.png,0\nc,0\nd,0\n", "labels.txt: line 3: no image 'e.png' in {val}"),
    ("no row", "a,0\nc,0\nb,0\n", "labels.txt: no row for the image {val}/d.png"),
    ("no rows", "a,0\n", "labels.txt: no row for the image {val}/b.png (nor for 2 more of its 4)"),
    ("twice", "a,0\nb,0\nc,1\na,1\nd,0\n", "labels.txt: line 4: a second row for a.png (the first is line 1)"),
    ("no label", "a,0\nb, \nc,1\nd,1\n", "labels.txt: line 2: no label for b.png (expected file,label rows)"),
    ("two files", "a,0\nb,0\nc,0\nd,0\n", "labels.txt: line 1: 'a' could be any of the images a.jpg, a.png of "
                                          "{val}: give the file's whole name"),
    ("unknown", "bee\nbea\ncat\nant\n", "labels.txt: line 2: the label 'bea' is not among the 3 classes of "
                                        "{train} (the nearest: 'bee')"),
    ("far", "bee\nbee\nxyz\nant\n", "labels.txt: line 3: the label 'xyz' is not among the 3 classes of {train}$"),
    ("beyond", "0\n1\n3\n2\n", "labels.txt: line 3: label 3 lies outside the classes 0..2 of {train}"),
    ("negative", "0\n-1\n1\n1\n", "labels.txt: line 2: label -1 is negative (labels are classes 0, 1, ...)"),
    ("sub-folders", "0\n", "val: has class sub-folders (x) and --labels {labels} was given"),
    ("no labels", None, "labels.txt: labels not found"),
    ("binary", b"\x93NUMPY\x01\x00\xff\xfe", "labels.txt: cannot read labels as text"),
    ("no images", "0\n", "val: no images (files ending in .png"),
])
def test_a_label_file_that_does_not_fit_its_folder_is_refused_naming_the_file_and_line(tmp_path, case, text,
                                                                                      message):
    source = images_folder(tmp_path, ("a.png", "a.jpg", "b.png", "c.png") if case == "two files" else
                           () if case == "no images" else ("b.png", "a.png", "c.jpg", "d.png"))
    labels = tmp_path / "labels.txt"
    if isinstance(text, bytes):
        labels.write_bytes(text)
    elif text is not None:
        labels.write_text(text)
    if case == "sub-folders":
        (source / "x").mkdir()
    train = training_set(tmp_path) if case in ("unknown", "far", "beyond") else None
    whole = message.endswith("$")                                  # the message ends there
    pattern = re.escape(message.rstrip("$").format(val=source, train=train, labels=labels)) + "$" * whole
    with pytest.raises(DataError, match=pattern):
        convert_folder(source, tmp_path / "v.h5", labels=labels, classes=train)
    assert not (tmp_path / "v.h5").exists()


@pytest.mark.parametrize("case, text, message", [
    ("no attribute", None, "a.h5: the dataset has no classes attribute (--classes takes a dataset converted from "
                           "class sub-folders, or a text file of class names, one a line)"),
    ("twice", "cat\nant\ncat\n", "names.txt: the class name 'cat' is there twice (labels 0 and 2)"),
    ("empty", "\n\n", "names.txt: no class names"),
    ("missing", None, "none.txt: class names not found"),
    ("sub-folder", "ant\nbeet\n", "{imgs}/bee: the class folder 'bee' is not among the 2 classes of {names} (the "
                                   "nearest: 'beet')"),
])
def test_class_names_that_cannot_number_the_labels_are_refused(tmp_path, case, text, message):
    source, _ = folder(tmp_path, sizes=((4, 4),))                  # ant/0.png, bee/0.png, cat/0.png
    (tmp_path / "labels.txt").write_text("cat\n")
    names = tmp_path / {"no attribute": "a.h5", "missing": "none.txt"}.get(case, "names.txt")
    if case == "no attribute":
        write_dataset(names, np.zeros((1, 1, 2, 2), np.uint8), [0])
    elif text is not None:
        names.write_text(text)
    images, labels = (source, None) if case == "sub-folder" else (source / "cat", tmp_path / "labels.txt")
    with pytest.raises(DataError, match=re.escape(message.format(imgs=source, names=names))):
        convert_folder(images, tmp_path / "v.h5", labels=labels, classes=names)


def test_class_sub_folders_number_as_the_classes_given(tmp_path):
    source, _ = folder(tmp_path, sizes=((4, 4),), classes=("cat", "ant"))
    (tmp_path / "names.txt").write_text("cat\nbee\nant\n")
    count, _, classes = convert_folder(source, tmp_path / "v.h5", classes=tmp_path / "names.txt")
    assert (count, classes) == (2, ["cat", "bee", "ant"])
    with h5py.File(tmp_path / "v.h5") as f:
        assert f["labels"][()].tolist() == [2, 0]          # ant, cat in file order
        assert list(f.attrs["classes"]) == ["cat", "bee", "ant"]


def test_the_convert_command_labels_a_folder_of_images_as_the_training_set_does(tmp_path, capsys):
    source = images_folder(tmp_path)
    train = training_set(tmp_path)
    (tmp_path / "val.csv").write_text("ImageId,PredictionString\na,cat 1 2 3 4\nb,ant 0 0 1 1\nc,bee 1 1 2 2\n"
                                      "d,ant 2 2 3 3\n")
    argv = ["data", "convert", str(source), "--labels", str(tmp_path / "val.csv"), "--size", "4", "4",
            "--workers", "2", "-o", str(tmp_path / "v.h5")]
    assert main(argv + ["--classes", str(train)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"wrote {tmp_path / 'v.h5'}: 4 images of 3x4x4 (C x H x W), 3 classes (ant, bee, cat) as in {train} and "
        "normalised with its mean and std")
    with h5py.File(tmp_path / "v.h5") as f, h5py.File(train) as t:
        assert f["labels"][()].tolist() == [2, 0, 1, 0]
        for key in ("mean", "std"):            # the training set's, not the held-out images' own
            np.testing.assert_array_equal(f["images"].attrs[key], t["images"].attrs[key])
    (tmp_path / "val.csv").write_text("a,cat\nb,dog\nc,cat\nd,dog\n")
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"wrote {tmp_path / 'v.h5'}: 4 images of 3x4x4 (C x H x W), 2 classes (cat, dog), numbered in sorted order "
        "(no --classes)")
    (tmp_path / "val.txt").write_text("1\n0\n1\n1\n")
    assert main(argv[:4] + [str(tmp_path / "val.txt")] + argv[5:]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"wrote {tmp_path / 'v.h5'}: 4 images of 3x4x4 (C x H x W), integer labels from {tmp_path / 'val.txt'}")
    np.save(tmp_path / "x.npy", np.zeros((2, 1, 2, 2), np.uint8))
    np.save(tmp_path / "y.npy", np.zeros(2, np.int64))
    assert main(["data", "convert", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy"), "--classes",
                 str(train), "-o", str(tmp_path / "a.h5")]) == 2
    assert "an images .npy takes integer labels" in capsys.readouterr().err


@pytest.mark.parametrize("h, w", [(10, 16), (16, 10), (13, 9), (12, 12), (6, 6)])
def test_fit_crop_keeps_the_center_of_the_image_resized_to_cover_the_size(tmp_path, h, w):
    (tmp_path / "imgs" / "a").mkdir(parents=True)
    pixels = np.random.default_rng(2).integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "imgs" / "a" / "0.png")
    convert_folder(tmp_path / "imgs", tmp_path / "c.h5", size=(6, 6), fit="crop")
    s = 6 / min(h, w)                                           # the shorter side becomes 6
    resized = Image.fromarray(pixels)
    if (h, w) != (6, 6):
        resized = resized.resize((round(w * s), round(h * s)), Image.Resampling.LANCZOS)
    left, top = (resized.size[0] - 6) // 2, (resized.size[1] - 6) // 2
    expected = np.asarray(resized.crop((left, top, left + 6, top + 6))).transpose(2, 0, 1)
    with h5py.File(tmp_path / "c.h5") as f:
        assert np.array_equal(f["images"][0], expected)


@pytest.mark.parametrize("kwargs, message", [
    ({"fit": "crop"}, "--fit crop cuts the center H x W of each image: it needs --size H W"),
    ({"fit": "pad", "size": (4, 4)}, "--fit must be one of stretch, crop, got 'pad'"),
    ({"chunk": -1}, "--chunk must be a number of images per HDF5 chunk, or 0 for one contiguous array; got -1"),
])
def test_fits_and_chunks_that_do_not_exist_are_refused(tmp_path, kwargs, message):
    source, _ = folder(tmp_path, sizes=((4, 4),))
    with pytest.raises(DataError, match=re.escape(message)):
        convert_folder(source, tmp_path / "o.h5", **kwargs)


@pytest.mark.parametrize("option, chunk", [([], 1), (["--chunk", "2"], 2), (["--chunk", "100"], 6),
                                           (["--chunk", "0"], 0)])
def test_chunks_hold_the_images_asked_for(tmp_path, option, chunk):
    source, _ = folder(tmp_path, sizes=((4, 4), (4, 4)))
    np.save(tmp_path / "x.npy", np.zeros((6, 3, 4, 5), np.uint8))
    np.save(tmp_path / "y.npy", np.zeros(6, np.int64))
    for argv in ([str(source), "--size", "4", "5"], [str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy")]):
        assert main(["data", "convert", *argv, *option, "-o", str(tmp_path / "o.h5")]) == 0
        assert stored(tmp_path / "o.h5")["chunks"] == ((chunk, 3, 4, 5) if chunk else None)     # 0: contiguous
    with pytest.raises(DataError, match="--chunk must be"):
        convert_arrays(tmp_path / "x.npy", tmp_path / "y.npy", tmp_path / "o.h5", chunk=-2)


def test_a_training_set_s_single_mean_and_std_stand_for_every_channel_of_the_held_out_set(tmp_path, capsys):
    source = images_folder(tmp_path)
    train = training_set(tmp_path)
    with h5py.File(train, "r+") as f:           # one value for every channel, as the format allows
        f["images"].attrs.update({"mean": [0.25], "std": [0.5]})
    (tmp_path / "val.csv").write_text("a,cat\nb,ant\nc,bee\nd,ant\n")
    assert main(["data", "convert", str(source), "--labels", str(tmp_path / "val.csv"), "--classes", str(train),
                 "--size", "4", "4", "-o", str(tmp_path / "v.h5")]) == 0
    with h5py.File(tmp_path / "v.h5") as f:
        assert f["images"].attrs["mean"].tolist() == [0.25] * 3 and f["images"].attrs["std"].tolist() == [0.5] * 3


# --- volumes and targets ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("channels_last", [False, True])
def test_volumes_and_targets_from_arrays(tmp_path, capsys, channels_last):
    from spmdcnn.cli import main
    from spmdcnn.io.dataset import HDF5Dataset
    rng = np.random.default_rng(0)
    volumes = rng.standard_normal((5, 2, 6, 5, 7)).astype(np.float32)
    targets = rng.uniform(-1, 1, (5, 3)).astype(np.float32)
    np.save(tmp_path / "v.npy", np.moveaxis(volumes, 1, -1) if channels_last else volumes)
    np.save(tmp_path / "t.npy", targets)
    layout = ["--channels-last"] if channels_last else ["--channels-first"]
    assert main(["data", "convert", str(tmp_path / "v.npy"), "--targets", str(tmp_path / "t.npy"), "-o",
                 str(tmp_path / "v.h5"), *layout]) == 0
    assert "5 volumes of 2x6x5x7 (C x D x H x W), targets from" in capsys.readouterr().out
    data = HDF5Dataset(tmp_path / "v.h5")
    try:
        assert data.answers == "targets" and data.sample_shape == (2, 6, 5, 7)
        np.testing.assert_array_equal(data.all_targets, targets)
        with h5py.File(tmp_path / "v.h5") as f:
            np.testing.assert_array_equal(f["images"][()], volumes)
            np.testing.assert_allclose(f["images"].attrs["mean"], volumes.mean(axis=(0, 2, 3, 4)), rtol=1e-5)
    finally:
        data.close()


@pytest.mark.parametrize("targets,fragment", [(np.zeros(5, np.float32), "expected targets (5, K)"),
                                              (np.zeros((5, 2), np.int64), "finite floats"),
                                              (np.full((5, 2), np.inf, np.float32), "finite floats")])
def test_bad_targets_are_refused_naming_the_file(tmp_path, capsys, targets, fragment):
    from spmdcnn.cli import main
    np.save(tmp_path / "v.npy", np.zeros((5, 1, 3, 3, 3), np.float32))
    np.save(tmp_path / "t.npy", targets)
    assert main(["data", "convert", str(tmp_path / "v.npy"), "--targets", str(tmp_path / "t.npy"), "-o",
                 str(tmp_path / "v.h5")]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "t.npy" in err


def test_an_ambiguous_volume_layout_names_both(tmp_path, capsys):
    from spmdcnn.cli import main
    np.save(tmp_path / "v.npy", np.zeros((2, 3, 5, 5, 3), np.float32))
    np.save(tmp_path / "t.npy", np.zeros((2, 1), np.float32))
    assert main(["data", "convert", str(tmp_path / "v.npy"), "--targets", str(tmp_path / "t.npy"), "-o",
                 str(tmp_path / "v.h5")]) == 2
    assert "(N, C, D, H, W)" in capsys.readouterr().err
