"""``spmdcnn data bench``: the images per second a dataset delivers to one rank, shuffled, as training reads them
(:class:`~spmdcnn.io.prefetch.Loader`, with its workers and augmentation), with no computing in between: the most
a training run on this file can be fed."""

import time

import numpy as np

from .augment import Augment, stored_read
from .dataset import HDF5Dataset
from .prefetch import Loader, resolve
from .workers import Worker, close_all


def idle_worker_memory(path):
    """The peak resident bytes of a worker that opens the dataset at ``path`` as a reading worker does, and reads
    nothing."""
    worker = Worker(("spmdcnn.io.databench", "_idle", {"path": path}), "an idle data worker")
    worker.send(0)
    worker.receive(60)
    peaks = close_all([worker])
    return peaks[0] if peaks else None


def _idle(path):
    from . import prefetch  # noqa: F401  (what a reading worker loads)
    source = HDF5Dataset(path)
    return lambda message: source.num_samples


def _staged_values(source):
    """The values of one sample a whole read stages (:func:`~spmdcnn.io.augment.stored_read`: its crop's rows,
    whole when the crop is most of them)."""
    windows = source.augment.windows(source.stored_shape, 0, None, [0])
    ranges = [(0, extent) for extent in source.sample_shape]
    return int(np.prod(stored_read(windows, 0, ranges, (1,) * len(ranges), source.stored_shape[-1]).count))


def data_bench(path, batch, workers="auto", prefetch="auto", augment=None, batches=50, warmup=3, dtype="float32",
               seed=0):
    """Time ``batches`` shuffled batches of ``batch`` samples of the dataset at ``path`` after ``warmup``, read
    whole by one rank (``augment``: a ``data.augment`` mapping); returns the rates, waits and worker memory."""
    augment = Augment.from_spec(augment, "--augment")
    source = HDF5Dataset(path, seed=seed, shuffle=True, augment=augment)
    workers, prefetch = resolve(workers, prefetch)
    try:
        per_epoch = source.batches_per_epoch(batch)
        box = ((0, batch),) + tuple((0, extent) for extent in source.sample_shape)
        total = warmup + batches
        waits = []
        with Loader(source, [(box, None)], batch, np.dtype(dtype), per_epoch, 0, total, workers,
                    prefetch) as loader:
            for step in range(total):
                if step == warmup:
                    start = time.perf_counter()
                _, waited = loader.next(step)
                if step >= warmup:
                    waits.append(waited)
            elapsed = time.perf_counter() - start
        slot = loader.layout.slot_bytes
        result = {"path": path, "batch": batch, "batches": batches, "warmup": warmup, "workers": workers,
                  "prefetch": prefetch if workers else 0, "augment": augment.describe(),
                  "stored_shape": list(source.stored_shape), "sample_shape": list(source.sample_shape),
                  "stored_dtype": str(source.images.dtype), "dtype": str(np.dtype(dtype)),
                  "chunks": None if source.images.chunks is None else list(source.images.chunks),
                  "images_per_s": batches * batch / elapsed, "batch_s": elapsed / batches,
                  "wait_s_median": float(np.median(waits)),
                  "batch_bytes": slot, "shared_bytes": slot * (prefetch + 1) if workers else 0,
                  "staging_bytes": batch * _staged_values(source) * source.images.dtype.itemsize,
                  "worker_peak_bytes": max(loader.peaks) if loader.peaks else None}
    finally:
        source.close()
    if workers:
        result["idle_worker_bytes"] = idle_worker_memory(path)
    return result


def _mib(count):
    if count < 1 << 20:
        return f"{count / 1024:.0f} KiB"
    return f"{count / 2 ** 20:.1f} MiB" if count < 10 << 20 else f"{count / 2 ** 20:.0f} MiB"


def describe(result):
    """The lines ``spmdcnn data bench`` prints."""
    stored = "x".join(map(str, result["stored_shape"]))
    lines = [f"{result['path']}: shuffled batches of {result['batch']} images of {stored} {result['stored_dtype']}"
             f" (chunks {result['chunks'] or 'none: contiguous'}), augmentation: {result['augment']}, read as "
             f"{result['dtype']}"]
    how = (f"{result['workers']} worker{'s' * (result['workers'] != 1)}, {result['prefetch']} batches ahead"
           if result["workers"] else "read by this process (no workers)")
    lines.append(f"  {result['images_per_s']:,.0f} images/s delivered ({result['batch_s'] * 1e3:.1f} ms per batch, "
                 f"{result['batches']} batches after {result['warmup']}; {how})")
    if result["workers"]:
        lines.append(f"  a worker's peak memory: {_mib(result['worker_peak_bytes'])} (an idle worker alone: "
                     f"{_mib(result['idle_worker_bytes'])}; what it may add: the shared batches, "
                     f"{result['prefetch'] + 1} of {_mib(result['batch_bytes'])}, and one batch as stored, "
                     f"{_mib(result['staging_bytes'])})")
    return lines
