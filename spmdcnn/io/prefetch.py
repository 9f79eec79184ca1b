"""The batches of a training run for one rank, read ahead by worker processes (job keys ``data.workers``,
``data.prefetch``, ``data.timeout``; docs/formats.md#reading-ahead).

A rank reads, of every batch, the boxes its first layers' tiles need (``reads``: ``(box, steps)`` in global batch
coordinates, fixed by the plan). :class:`Loader` hands out the batches of steps ``start, start + 1, ...`` in
order. With workers, the reads of the next ``prefetch`` batches run in worker processes (:mod:`spmdcnn.io.workers`)
while the rank computes: each worker opens the dataset itself and fills a slot of a shared buffer, batch ``i``
going to worker ``i mod W`` and slot ``i mod (prefetch + 1)`` (the extra slot is the batch the rank is using).
A worker runs the same :meth:`read` as the rank would, so the values are bit-identical with any number of
workers, or none (``workers: 0``: each batch is read when its step asks for it).
"""

import time
from collections import deque

import numpy as np

from .. import cores_per_rank
from .augment import Augment, count
from .batch import Batch
from .dataset import DataError, HDF5Dataset
from .synthetic import SyntheticData
from .workers import CLOSE_GRACE_S, SharedBuffer, Worker, attach, close_all

MAX_AUTO_WORKERS = 8
AUTO_MIN_READ_S = 1.0   # data.workers auto: no workers when all the batches read here in less (they cost more)
PROBE_READS = 3          # batches after the first that data.workers auto times (their mean)
STALLED = "raise data.timeout for slow storage, or copy the data to local disk"


def default_workers(local_ranks):
    """``data.workers: auto``: one worker per core this rank may use (:func:`spmdcnn.cores_per_rank`: the cores
    it is bound to, else its share of the node's; not its BLAS threads, which a GPU job sets to one), at most
    MAX_AUTO_WORKERS."""
    return max(1, min(MAX_AUTO_WORKERS, cores_per_rank(local_ranks)))


def resolve(workers, prefetch, local_ranks=1):
    """``(workers, prefetch)`` for the job's settings (``auto``: :func:`default_workers`, and one batch ahead per
    worker and one more, so that every worker has a batch to read while the rank takes the next)."""
    workers = default_workers(local_ranks) if workers == "auto" else int(workers)
    prefetch = max(2, workers + 1) if prefetch == "auto" else int(prefetch)
    return workers, prefetch


def open_source(spec):
    """The data source a :meth:`spec` describes (in a worker)."""
    spec = dict(spec)
    kind = spec.pop("kind")
    if kind == "hdf5":
        augment = spec.pop("augment")
        return HDF5Dataset(spec.pop("path"), augment=Augment.from_spec(augment), **spec)
    return SyntheticData(**spec)


def _key(box, steps):
    return tuple(tuple(int(v) for v in r) for r in box), (None if steps is None else tuple(int(s) for s in steps))


class Layout:
    """Where each read of a batch lies in a slot: ``(box, steps, shape, byte offset)``, and a slot's bytes."""

    def __init__(self, reads, dtype):
        self.dtype = np.dtype(dtype)
        self.parts, offset = [], 0
        seen = set()
        for box, steps in reads:
            key = _key(box, steps)
            if key in seen:
                continue
            seen.add(key)
            box, steps = key
            shape = tuple(count(lo, hi, s) for (lo, hi), s in zip(box, steps or (1,) * len(box)))
            self.parts.append((box, steps, shape, offset))
            offset += -(-int(np.prod(shape)) * self.dtype.itemsize // 64) * 64      # 64-byte aligned
        self.slot_bytes = max(offset, 64)

    def private(self):
        """``{key: array}`` of one slot of memory of this process alone, aligned as a shared slot is."""
        memory = np.empty(self.slot_bytes + 64, np.uint8)
        skip = -memory.ctypes.data % 64
        return self.views(memory[skip:skip + self.slot_bytes], 0)

    def views(self, memory, slot):
        """``{key: array}`` of the slot ``slot`` of ``memory`` (a buffer of slots)."""
        base = slot * self.slot_bytes
        return {(box, steps): np.ndarray(shape, self.dtype, memory, base + offset)
                for box, steps, shape, offset in self.parts}


def read_batch(source, layout, indices, epoch, views):
    """Fill ``views`` (:meth:`Layout.views`) with the reads of the batch of samples ``indices``; an index of -1
    (evaluation's padding, at the end of a batch) reads as zeros."""
    for box, steps, shape, _ in layout.parts:
        (n0, n1), *region = box
        wanted, out = indices[n0:n1], views[(box, steps)]
        real = int(np.count_nonzero(wanted >= 0))
        source.read(wanted[:real], layout.dtype, region, None if steps is None else steps[1:], epoch=epoch,
                    out=out[:real], answers=False)
        out[real:] = 0


def evaluation_batches(count, batch):
    """The batches of an evaluation of ``count`` samples in order, a function of the step: ``(None, indices)``
    (None: no augmentation, the center crop), the last batch padded with -1 to ``batch`` samples."""
    def batch_of(step):
        indices = np.arange(step * batch, (step + 1) * batch, dtype=np.int64)
        indices[indices >= count] = -1
        return None, indices
    return batch_of


def batch_answers(source, indices, epoch):
    """``answers(box)`` of the batch of samples ``indices`` (-1: padding): labels (-1 for padding) or targets (a
    row of NaN for padding) of the box's samples, read for the whole batch at once; or masks, read as each box
    asks (of its samples and positions; -1 throughout a padding sample's), cropped and flipped as ``epoch``'s
    images are."""
    real = indices >= 0
    if source.dense:
        def masks(box):
            (n0, n1), *region = box
            wanted = indices[n0:n1]
            answers = np.full((n1 - n0,) + tuple(hi - lo for lo, hi in region), -1, dtype=np.int64)
            answers[wanted >= 0] = source.read_answers(wanted[wanted >= 0], region, epoch)
            return answers
        return masks
    if source.num_targets is None:
        answers = np.full(len(indices), -1, dtype=np.int64)
    else:
        answers = np.full((len(indices), source.num_targets), np.nan, dtype=np.float32)
    answers[real] = source.read_answers(indices[real])
    return lambda box: answers[box[0][0]:box[0][1]]


def batch_read(arrays, answers, size, what):
    """The :class:`~spmdcnn.io.batch.Batch` of ``size`` samples already read: ``arrays`` by box (``_key``), one
    per read, and its ``answers(box)`` (:func:`batch_answers`). The arrays may be a shared slot that workers
    refill once the next batch is taken: they are valid until then."""
    def read(box, steps):
        try:
            return arrays[_key(box, steps)]
        except KeyError:
            raise DataError(f"{what}: the box {box} was not read ahead for this rank") from None
    return Batch(size, read, answers)


class SlotReader:
    """A worker's handler (made in the worker): opens the source, maps the shared slots, and fills a slot per
    message ``(slot, epoch, indices)``; answers the seconds it took."""

    def __init__(self, spec, identity, reads, dtype, fd, nbytes):
        self.source = open_source(spec)
        found = self.source.identity()
        changed = [f"{key} {value!r} (the rank's: {identity[key]!r})" for key, value in found.items()
                   if identity.get(key) != value]
        if changed:
            raise DataError(f"{spec.get('path', spec['kind'])}: the file changed since the rank opened it: "
                            + "; ".join(changed))
        self.layout = Layout(reads, dtype)
        self.memory = attach(fd, nbytes)

    def __call__(self, message):
        slot, epoch, indices = message
        start = time.perf_counter()
        read_batch(self.source, self.layout, indices, epoch, self.layout.views(self.memory, slot))
        return time.perf_counter() - start


class Loader:
    """The batches of steps ``start .. stop - 1`` of a training run on one rank, in order (:meth:`next`).

    ``source``: the data; ``reads``: the ``(box, steps)`` this rank reads of each batch; ``batch``: the global
    batch size; ``steps_per_epoch`` turns a step into (epoch, batch of the epoch); ``workers``, ``prefetch``,
    ``timeout``: as the job keys (``auto`` allowed: :meth:`_auto_workers`, :func:`resolve`; ``local_ranks``: the
    ranks on this node, for auto; ``auto_steps``: the steps auto weighs the reads over, when the run they stand for
    is shorter than ``stop - start``: a profile's calibration reads more steps than a short run). A rank that reads
    no data starts no worker;
    no more workers or batches ahead are used than there are steps. ``batches``: instead of the training order, a
    function of the step that gives its ``(epoch, indices)`` (:func:`evaluation_batches`).

    Make and use a loader on a thread that outlives it (the main thread): on Linux a worker is ended by the
    kernel when the thread that started it ends."""

    def __init__(self, source, reads, batch, dtype, steps_per_epoch, start, stop, workers=0, prefetch=2,
                 timeout=300.0, batches=None, local_ranks=1, auto_steps=None):
        self.source, self.batch, self.dtype = source, batch, np.dtype(dtype)
        self.steps_per_epoch, self.first, self.next_step, self.stop = steps_per_epoch, start, start, stop
        self.batch_of = batches or self._training_batch
        self.layout = Layout(reads, dtype)
        self.timeout = float(timeout)
        self.workers, self.pending, self.buffer = [], deque(), None
        self.issued = start
        self.peaks = []
        self.probe_s, self._first = None, None
        self.auto_steps = stop - start if auto_steps is None else auto_steps
        if workers == "auto":
            workers = self._auto_workers(local_ranks)
        workers, prefetch = resolve(workers, prefetch, local_ranks)
        if workers and prefetch < 1:
            raise ValueError(f"workers read batches ahead: prefetch must be 1 or more, got {prefetch}")
        started = self.started = max(0, min(int(workers), stop - self.issued)) if self.layout.parts else 0
        self.prefetch = min(int(prefetch), max(stop - self.issued, 1)) if started else 0
        if started:
            self._start(started)

    def _auto_workers(self, local_ranks):
        """``data.workers: auto``: none when reading every batch here would take under AUTO_MIN_READ_S in all
        (timed on the mean of the next PROBE_READS batches, read here once: the first read, kept for the first step,
        also opens the file and its caches), else :func:`default_workers`."""
        if self.issued >= self.stop:
            return 0
        epoch, indices = self.batch_of(self.issued)
        arrays = self.layout.private()
        started = time.perf_counter()
        read_batch(self.source, self.layout, indices, epoch, arrays)
        self.probe_s = time.perf_counter() - started
        following = range(self.issued + 1, min(self.issued + 1 + PROBE_READS, self.stop))
        if following:       # the first read also opens the file: the next batches' are the run's
            scratch, started = self.layout.private(), time.perf_counter()
            for step in following:
                epoch, others = self.batch_of(step)
                read_batch(self.source, self.layout, others, epoch, scratch)
            self.probe_s = (time.perf_counter() - started) / len(following)
        self._first = (arrays, indices, self.batch_of(self.issued)[0])
        self.issued += 1
        return 0 if self.probe_s * self.auto_steps < AUTO_MIN_READ_S else default_workers(local_ranks)

    def _start(self, count):
        """Start ``count`` workers and their first reads."""
        self.shift = 0          # step s reads into slot (s + shift) mod slots (again() moves it)
        source = self.source
        self.slots = self.prefetch + 1
        self.buffer = SharedBuffer(self.slots * self.layout.slot_bytes)
        try:
            setup = ("spmdcnn.io.prefetch", "SlotReader",
                     {"spec": source.spec(), "identity": source.identity(),
                      "reads": [(box, steps) for box, steps, _, _ in self.layout.parts],
                      "dtype": self.dtype.str, "fd": self.buffer.fd, "nbytes": self.buffer.nbytes})
            for k in range(count):
                self.workers.append(Worker(setup, f"data worker {k + 1} of {count} reading {source.path}",
                                           (self.buffer.fd,)))
            self.views = [self.layout.views(self.buffer.map, slot) for slot in range(self.slots)]
            self._fill()
        except BaseException:
            self.close(grace=0)
            raise

    def _training_batch(self, step):
        epoch, s = divmod(step, self.steps_per_epoch)
        return epoch, self.source.indices(epoch, s, self.batch)

    def _fill(self):
        """Issue reads until ``prefetch`` batches are in flight (the slot of the batch in use stays untouched)."""
        while self.issued < self.stop and self.issued - self.next_step < self.slots - 1:
            step = self.issued
            worker = self.workers[step % len(self.workers)]
            epoch, indices = self.batch_of(step)
            worker.send(((step + self.shift) % self.slots, epoch, indices))
            self.pending.append((step, worker, indices, epoch))
            self.issued += 1

    def next(self, step=None):
        """``(batch, seconds waited for it)`` of the next step (``step``, when given, must be it)."""
        if step is not None and step != self.next_step:
            raise ValueError(f"the loader is at step {self.next_step}, asked for step {step}")
        if self.next_step >= self.stop:
            raise ValueError(f"the loader's steps end at {self.stop}")
        step = self.next_step
        started = time.perf_counter()
        if self._first is not None:                # read when the workers were chosen
            (arrays, indices, epoch), self._first = self._first, None
            started -= self.probe_s
        elif self.workers:
            head, worker, indices, epoch = self.pending.popleft()
            assert head == step
            worker.receive(self.timeout, STALLED)
            arrays = self.views[(step + self.shift) % self.slots]
        else:
            epoch, indices = self.batch_of(step)
            arrays = self.layout.private()
            read_batch(self.source, self.layout, indices, epoch, arrays)
        waited = time.perf_counter() - started
        self.next_step += 1
        if self.workers:
            self._fill()       # the previous batch's slot is free now: the caller has moved on to this one
        return batch_read(arrays, batch_answers(self.source, indices, epoch), len(indices),
                          f"{self.source.path}, step {step + 1}"), waited

    def again(self):
        """Start over from the first step (another evaluation), keeping the workers, which begin reading at once;
        every step must have been taken. The last batch taken stays valid until the next is: its slot is then the
        one in use (the slots are shifted so that the first step follows it)."""
        if self.next_step != self.stop:
            raise ValueError(f"the loader is at step {self.next_step} of {self.stop}: take them all first")
        if self.workers:
            self.shift = (self.shift + self.stop - self.first) % self.slots
        self.next_step = self.issued = self.first
        if self.workers:
            self._fill()

    def close(self, grace=CLOSE_GRACE_S):
        """End the workers (their peak resident memory is kept in ``peaks``; ``grace``: the seconds they may take
        to finish the reads they have queued, 0 after an error) and free the shared buffer."""
        self.peaks += close_all(self.workers, grace)
        self.workers, self.pending = [], deque()
        self.views = []
        if self.buffer is not None:
            self.buffer.close()
            self.buffer = None

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        self.close(grace=0 if kind else CLOSE_GRACE_S)
