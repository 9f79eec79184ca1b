"""Reading ahead (docs/formats.md#reading-ahead): the batches worker processes deliver equal those read in the
step, bit for bit; a worker that dies or stalls ends the read with a message naming the file, within seconds."""

import os
import signal
import time

import h5py
import numpy as np
import pytest

from spmdcnn.io.augment import Augment
from spmdcnn.io.dataset import HDF5Dataset
from spmdcnn.io.synthetic import SyntheticData
from spmdcnn.io.prefetch import Loader, default_workers, resolve
from spmdcnn.io.workers import Worker, WorkerError, close_all

N, C, H, W = 30, 3, 12, 10
BATCH = 4
# what two tiles of one rank might read: a box of samples and rows, and a strided box of another sample range
READS = [(((0, 2), (0, 3), (0, 5), (0, 8)), None), (((1, 4), (1, 3), (2, 8), (0, 8)), (1, 1, 2, 3))]


@pytest.fixture
def data(tmp_path):
    path = str(tmp_path / "data.h5")
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=rng.integers(0, 256, (N, C, H, W), dtype=np.uint8), chunks=(1, C, H, W))
        f.create_dataset("labels", data=rng.integers(0, 10, N))
        f["images"].attrs.update({"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.3, 0.25]})
    source = HDF5Dataset(path, seed=5, augment=Augment((8, 8), True))
    yield source
    source.close()


def delivered(source, workers, prefetch, start=0, stop=20):
    per_epoch = source.batches_per_epoch(BATCH)
    out = []
    with Loader(source, READS, BATCH, np.float32, per_epoch, start, stop, workers, prefetch) as loader:
        assert len(loader.workers) == workers
        for step in range(start, stop):
            batch, _ = loader.next(step)
            out.append(([batch.images(box, steps).copy() for box, steps in READS], batch.answers(((0, BATCH),))))
    return out


def test_workers_deliver_exactly_the_batches_read_in_the_step(data):
    """Over several epochs (7 batches each), with crops and flips, with any number of workers and batches ahead."""
    reference = delivered(data, 0, 2)
    for workers, prefetch in ((1, 1), (2, 3), (3, 7)):
        got = delivered(data, workers, prefetch)
        for step, ((images, labels), (expected, expected_labels)) in enumerate(zip(got, reference)):
            np.testing.assert_array_equal(labels, expected_labels)
            for part, want in zip(images, expected):
                assert part.tobytes() == want.tobytes(), f"{workers} workers, step {step}"


def test_the_batches_are_those_the_source_gives_each_step(data):
    """A loader started at step 9 (a resumed run) gives step 9's batch: the boxes of source.tiles."""
    per_epoch = data.batches_per_epoch(BATCH)
    for (images, labels), step in zip(delivered(data, 2, 2, start=9, stop=12), range(9, 12)):
        tiles = data.tiles(*divmod(step, per_epoch), BATCH)
        for part, (box, steps) in zip(images, READS):
            np.testing.assert_array_equal(part, tiles.images(box, steps))
        np.testing.assert_array_equal(labels, tiles.answers(((0, BATCH),)))


def test_synthetic_data_is_read_ahead_too():
    source = SyntheticData((3, 12, 10), 10, num_samples=24, seed=2)
    reference = delivered(source, 0, 2, stop=8)
    for (images, _), (expected, _) in zip(delivered(source, 2, 2, stop=8), reference):
        for part, want in zip(images, expected):
            np.testing.assert_array_equal(part, want)


def test_steps_are_taken_in_order(data):
    with Loader(data, READS, BATCH, np.float32, 7, 0, 5, 1, 2) as loader:
        loader.next(0)
        with pytest.raises(ValueError, match="at step 1, asked for step 3"):
            loader.next(3)


def ended(pid):
    """Whether child ``pid`` has ended: reaped already, or a zombie now reaped here (a loaded machine may be slow
    to reap a killed process; only a process still running is a failure)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


def _wait_for_batches(loader, count):
    for _ in range(count):
        loader.next()


def test_a_killed_worker_ends_the_read_within_seconds_naming_the_file(data):
    with Loader(data, READS, BATCH, np.float32, 7, 0, 50, 2, 2) as loader:
        _wait_for_batches(loader, 2)
        os.kill(loader.workers[0].pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            _wait_for_batches(loader, 10)
        assert time.monotonic() - start < 5
    message = str(info.value)
    assert data.path in message and "data worker 1 of 2" in message and "killed by SIGKILL" in message


def test_a_stalled_worker_is_an_error_after_the_timeout_not_a_hang(data):
    with Loader(data, READS, BATCH, np.float32, 7, 0, 50, 1, 2, timeout=1.0) as loader:
        _wait_for_batches(loader, 1)
        os.kill(loader.workers[0].pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(WorkerError) as info:
                _wait_for_batches(loader, 5)
            assert time.monotonic() - start < 5
        finally:
            os.kill(loader.workers[0].pid, signal.SIGCONT)
    assert data.path in str(info.value) and "nothing read in 1 s" in str(info.value)


def test_a_worker_that_cannot_read_the_file_says_why(data, tmp_path):
    moved = str(tmp_path / "moved.h5")
    os.rename(data.path, moved)       # the rank has the file open; a worker opening it by name finds nothing
    try:
        with pytest.raises(WorkerError) as info:
            with Loader(data, READS, BATCH, np.float32, 7, 0, 5, 1, 2) as loader:
                loader.next()
    finally:
        os.rename(moved, data.path)
    assert "data worker 1 of 1" in str(info.value) and "dataset not found" in str(info.value)


def test_workers_end_with_the_loader_and_report_their_peak_memory(data):
    loader = Loader(data, READS, BATCH, np.float32, 7, 0, 10, 2, 2)
    pids = [worker.pid for worker in loader.workers]
    _wait_for_batches(loader, 3)
    loader.close()
    for pid in pids:
        assert ended(pid)
    assert len(loader.peaks) == 2 and all(10 << 20 < peak < 1 << 30 for peak in loader.peaks)


def test_a_loader_of_no_steps_starts_no_worker(data):
    with Loader(data, READS, BATCH, np.float32, 7, 5, 5, 4, 2) as loader:
        assert loader.workers == []


def test_auto_settings():
    assert resolve("auto", "auto", 1) == (default_workers(1), max(2, default_workers(1) + 1))
    assert resolve(0, "auto") == (0, 2) and resolve(3, 1) == (3, 1)
    assert 1 <= default_workers(64) <= default_workers(1) <= 8


def test_workers_need_a_batch_ahead(data):
    with pytest.raises(ValueError, match="prefetch must be 1 or more, got 0"):
        Loader(data, READS, BATCH, np.float32, 7, 0, 5, 1, 0)


def test_no_more_batches_ahead_than_steps_and_no_worker_for_a_rank_that_reads_nothing(data):
    with Loader(data, READS, BATCH, np.float32, 7, 0, 3, 8, 20) as loader:
        assert len(loader.workers) == 3 and loader.prefetch == 3 and loader.slots == 4
    with Loader(data, [], BATCH, np.float32, 7, 0, 5, 2, 2) as loader:     # its tiles read no data
        assert loader.workers == [] and loader.next()[0].answers(((0, BATCH),)).shape == (BATCH,)


def test_a_setup_error_is_reported_even_when_the_worker_ended_before_the_first_message():
    worker = Worker(("spmdcnn.io.no_such_module", "handler", {}), "data worker 1 of 1 reading x.h5")
    try:
        worker.process.wait(timeout=30)            # it has sent its error and exited
        with pytest.raises(WorkerError) as info:
            worker.send(("a read",))
            worker.receive(5)
    finally:
        close_all([worker], grace=0)
    assert "data worker 1 of 1 reading x.h5: No module named 'spmdcnn.io.no_such_module'" in str(info.value)


def test_an_error_in_the_rank_ends_its_busy_workers_at_once(data):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="the step failed"):
        with Loader(data, READS, BATCH, np.float32, 7, 0, 50, 3, 6) as loader:
            loader.next()
            pids = [worker.pid for worker in loader.workers]
            for worker in loader.workers:
                os.kill(worker.pid, signal.SIGSTOP)        # busy, or stuck: they cannot finish in time
            raise RuntimeError("the step failed")
    assert time.monotonic() - start < 4
    for pid in pids:
        assert ended(pid)


def test_a_file_replaced_after_the_rank_opened_it_is_refused_by_the_workers(data, tmp_path):
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_dataset("images", data=np.zeros((N, C, H, W), np.uint8))
        f.create_dataset("labels", data=np.arange(N) % 7)
    os.replace(tmp_path / "other.h5", data.path)       # the rank still holds the old file open
    with pytest.raises(WorkerError) as info:
        with Loader(data, READS, BATCH, np.float32, 7, 0, 5, 1, 2) as loader:
            loader.next()
    assert f"{data.path}: the file changed since the rank opened it: data.labels_crc32" in str(info.value)


def test_evaluation_batches_pad_the_last_batch_with_zeros_and_label_minus_one(data):
    from spmdcnn.io.prefetch import evaluation_batches
    reads = [(((0, BATCH), (0, 3), (0, 8), (0, 8)), None)]
    steps = -(-N // BATCH)                              # 30 samples in batches of 4: the last holds 2
    for workers in (0, 2):
        with Loader(data, reads, BATCH, np.float32, None, 0, steps, workers, 2,
                    batches=evaluation_batches(N, BATCH)) as loader:
            for step in range(steps):
                batch, _ = loader.next(step)
                images, labels = batch.images(*reads[0]), batch.answers(((0, BATCH),))
                real = np.arange(step * BATCH, min(N, (step + 1) * BATCH))
                np.testing.assert_array_equal(images[:len(real)], data.read(real)[0])      # center crops
                assert not images[len(real):].any() and list(labels[len(real):]) == [-1] * (BATCH - len(real))
                np.testing.assert_array_equal(labels[:len(real)], data.read_answers(real))


def test_a_loader_read_again_keeps_its_workers_and_gives_the_same_batches(data):
    from spmdcnn.io.prefetch import evaluation_batches
    reads = [(((0, BATCH), (0, 3), (0, 8), (0, 8)), None)]
    # 7 steps, 4 slots: the last batch (step 6) is in the slot step 2 would take, were the slots not shifted
    with Loader(data, reads, BATCH, np.float32, None, 0, 7, 1, 3, batches=evaluation_batches(N, BATCH)) as loader:
        pids = [worker.pid for worker in loader.workers]
        first = [loader.next()[0].images(*reads[0]).copy() for _ in range(6)]
        with pytest.raises(ValueError, match="at step 6 of 7: take them all first"):
            loader.again()
        last = loader.next(6)[0].images(*reads[0])
        first.append(last.copy())
        loader.again()
        time.sleep(0.5)                 # the workers read the next batches meanwhile, into the other slots
        np.testing.assert_array_equal(last, first[-1])
        second = [loader.next()[0].images(*reads[0]).copy() for _ in range(7)]
        assert [worker.pid for worker in loader.workers] == pids
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("threshold, expected", [(1e9, 0), (0.0, None)])
def test_auto_workers_only_when_the_rank_s_own_reads_would_take_long(data, monkeypatch, threshold, expected):
    """``auto`` times the first batch's read (and hands that batch out first): no workers when all the run's reads
    would take the rank under the threshold, else one per core; the batches are the same either way."""
    from spmdcnn.io import prefetch
    monkeypatch.setattr(prefetch, "AUTO_MIN_READ_S", threshold)
    reference = delivered(data, 0, 2, stop=10)
    with Loader(data, READS, BATCH, np.float32, 7, 0, 10, "auto", "auto") as loader:
        assert loader.probe_s > 0
        assert len(loader.workers) == (default_workers(1) if expected is None else expected)
        for step, (images, labels) in enumerate(reference):
            batch, _ = loader.next(step)
            np.testing.assert_array_equal(batch.answers(((0, BATCH),)), labels)
            for want, (box, steps) in zip(images, READS):
                assert batch.images(box, steps).tobytes() == want.tobytes()


def test_closing_stalled_workers_takes_the_grace_once_not_once_per_worker(data):
    loader = Loader(data, READS, BATCH, np.float32, 7, 0, 50, 3, 6)
    loader.next()
    pids = [worker.pid for worker in loader.workers]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    start = time.monotonic()
    loader.close(grace=2.0)
    assert time.monotonic() - start < 5         # once per worker would be 6 s
    assert all(ended(pid) for pid in pids)


def test_auto_weighs_the_steps_of_the_run_it_stands_for(data):
    """A profile's calibration reads up to 200 steps of a job's batches as its run will: ``auto`` decides over the
    run's steps (``auto_steps``), not over the calibration's longer span. A batch here reads in far more than
    AUTO_MIN_READ_S / 10**7 (0.1 microseconds) and far less than AUTO_MIN_READ_S / 10 (0.1 s), on any machine."""
    with Loader(data, READS, BATCH, np.float32, 7, 0, 10, "auto", "auto", auto_steps=10 ** 7) as loader:
        assert len(loader.workers) == default_workers(1), loader.probe_s
    with Loader(data, READS, BATCH, np.float32, 7, 0, 10 ** 7, "auto", "auto", auto_steps=10) as loader:
        assert loader.workers == [] and loader.stop == 10 ** 7
