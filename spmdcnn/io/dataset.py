"""Training data: the HDF5 dataset of docs/formats.md#dataset-files and a synthetic source with the same interface.

    /images (N, C, S...) uint8 or float32 (images (N, C, H, W), volumes (N, C, D, H, W), sequences (N, C, W));
    the answers: /labels (N,) integer (classification), /labels (N, S...) integer masks, a class per position
    (segmentation), or /targets (N, K) float32 (regression, mse_loss); optional attrs mean, std (per channel)

Batch ``s`` of epoch ``e`` holds the samples ``order(e)[s*B : (s+1)*B]``, where ``order(e)`` is the identity
without shuffling and a permutation drawn from a generator keyed by (seed, e) with it: a fixed function of
(seed, epoch, s), so a resumed run reads exactly the batches an uninterrupted one would. An epoch has
floor(N / B) batches (the incomplete last one is dropped). uint8 images are divided by 255, then normalised by
``mean`` and ``std`` where the file has them. A mask is cropped and flipped with its image (the same windows), and
read, as an image is, only in the box a tile asks for.
"""

import zlib

import h5py
import numpy as np

from . import samples
from .augment import Augment, count, stored_read
from .batch import Batch
from .writer import write_blocks, write_dataset  # noqa: F401  (the dataset format's writers, where they were)
from .yamlfile import FormatError

CHUNK_CACHE_BYTES = 1 << 20     # HDF5's default, for compressed chunks (which must pass through the cache)
MASKS_CHECKED = 16              # samples whose masks the dataset's identity sums (all of them may be large)
MASK_BLOCK = 1 << 24            # mask elements read at a time when checking every value once


class DataError(FormatError):
    pass


def sample_order(num_samples, epoch, seed, shuffle):
    if not shuffle:
        return np.arange(num_samples)
    return np.random.default_rng([int(seed), int(epoch)]).permutation(num_samples)


class _Source:
    """What both data sources share: the epoch's sample order (cached) and batches cut from it."""

    path = "<data>"

    def batches_per_epoch(self, batch):
        count = self.num_samples // batch
        if count == 0:
            raise DataError(f"{self.path}: {self.num_samples} samples cannot fill one batch of {batch}")
        return count

    def indices(self, epoch, s, batch):
        """The samples of batch ``s`` of ``epoch``: ``order(epoch)[s*batch : (s+1)*batch]``."""
        if not 0 <= s < self.batches_per_epoch(batch):
            raise DataError(f"{self.path}: batch {s} of {batch} samples lies outside an epoch of "
                            f"{self.num_samples} samples")
        orders = self.__dict__.setdefault("_orders", {})     # this epoch's and the next (read ahead across it)
        if epoch not in orders:
            if len(orders) >= 2:
                orders.pop(min(orders))
            orders[epoch] = sample_order(self.num_samples, epoch, self.seed, self.shuffle)
        return orders[epoch][s * batch:(s + 1) * batch]

    def batch(self, epoch, s, batch, dtype=np.float32):
        """Images and labels of batch ``s`` of ``epoch``, whole (augmented as training reads them)."""
        return self.read(self.indices(epoch, s, batch), dtype, epoch=epoch)

    def tiles(self, epoch, s, batch, dtype=np.float32):
        """Batch ``s`` of ``epoch`` as a :class:`Batch`, from which each tile reads only its box."""
        return reading_batch(self, self.indices(epoch, s, batch), dtype, epoch)

    def close(self):
        pass

    def identity(self):
        """What fixes every batch this source yields (a resumed run must see the same): ``{key: value}``."""
        return {"data.kind": self.kind, "data.num_samples": self.num_samples, "data.seed": int(self.seed),
                "data.shuffle": bool(self.shuffle), "data.sample_shape": "x".join(map(str, self.sample_shape))}


def reading_batch(source, indices, dtype, epoch=None):
    """The :class:`~spmdcnn.io.batch.Batch` of the samples ``indices`` of ``source``, read as each tile asks for its
    box. ``epoch``: the training epoch whose augmentation applies (None: evaluation's center crop)."""
    indices = np.asarray(indices)

    def read(box, steps):
        (n0, n1), *region = box
        return source.read(indices[n0:n1], dtype, region, None if steps is None else steps[1:], epoch=epoch,
                           answers=False)[0]
    def answers(box):
        (n0, n1), *region = box
        return source.read_answers(indices[n0:n1], region or None, epoch)
    return Batch(len(indices), read, answers)


def _ranges(region, shape):
    """``(c, spatial...)`` ranges, the whole sample when ``region`` is None."""
    return [tuple(r) for r in region] if region is not None else [(0, extent) for extent in shape]


def _cut(region, shape, steps):
    """The ``(c, spatial...)`` slices of ``region`` read with ``steps`` (every step-th element; None: all)."""
    steps = steps or (1,) * len(shape)
    return tuple(slice(lo, hi, step) for (lo, hi), step in zip(_ranges(region, shape), steps))


class HDF5Dataset(_Source):
    """Random access to an HDF5 dataset; reads only the samples, channels, rows and columns asked for."""

    kind = "hdf5"
    KEPT_BUFFERS = 4    # read shapes whose buffers are kept (a rank's reads take one or two; evaluation one more)

    def __init__(self, path, seed=0, shuffle=True, augment=None, answers=None):
        self.path = str(path)
        self.seed, self.shuffle = seed, shuffle
        self.augment = augment or Augment()
        self.answers = answers      # labels or targets: what batches carry (None: labels, else what the file has)
        self._staged = {}
        self.file = self._open(CHUNK_CACHE_BYTES)
        try:
            images = self.file.get("images")
            if isinstance(images, h5py.Dataset) and images.chunks and not images.id.get_create_plist().get_nfilters():
                # uncompressed chunks: no chunk cache, so that HDF5 reads each hyperslab straight into the
                # buffer (shuffled samples are not read twice an epoch; measured 20-50 % faster: benchmarks/)
                self.file.close()
                self.file = self._open(0)
            self._validate()
            problem = self.augment.problem(self.stored_shape)
            if problem:
                raise DataError(f"{self.path}: {problem}")
        except BaseException:
            self.file.close()
            raise

    def _open(self, cache_bytes):
        try:
            return h5py.File(self.path, "r", rdcc_nbytes=cache_bytes)
        except FileNotFoundError:
            raise DataError(f"{self.path}: dataset not found") from None
        except OSError as error:
            raise DataError(f"{self.path}: cannot open dataset (not HDF5, or unreadable): {error}") from None

    def _validate(self):
        expected = ("expected /images (N, C, H, W) or (N, C, D, H, W) and /labels (N,), /labels (N, H, W) masks "
                    "or /targets (N, K); docs/formats.md#dataset-files")
        if not isinstance(self.file.get("images"), h5py.Dataset):
            raise DataError(f"{self.path}: dataset lacks /images as an array ({expected})")
        present = [key for key in ("labels", "targets") if isinstance(self.file.get(key), h5py.Dataset)]
        if not present:
            raise DataError(f"{self.path}: dataset lacks /labels and /targets as arrays ({expected})")
        self.images = self.file["images"]
        if not 3 <= self.images.ndim <= 5 or self.images.dtype not in (np.uint8, np.float32, np.float64):
            raise DataError(f"{self.path}: /images must be (N, C, H, W) images or (N, C, D, H, W) volumes "
                            f"((N, C, W) sequences), uint8 or float32, got {self.images.shape} {self.images.dtype}")
        N = self.images.shape[0]
        self.all_labels = self.all_targets = self.masks = None      # labels and targets small: read once
        if "labels" in present:
            labels = self.file["labels"]
            spatial = tuple(self.images.shape[2:])
            if labels.dtype.kind not in "iu" or labels.shape not in ((N,), (N,) + spatial):
                raise DataError(f"{self.path}: /labels must be ({N},) integers (a class per sample) or integer masks "
                                f"({', '.join(map(str, (N,) + spatial))}) of the images' spatial shape (a class per "
                                f"position), got {labels.shape} {labels.dtype}")
            if labels.ndim == 1:
                self.all_labels = labels[()].astype(np.int64)
            else:
                self.masks = labels
        if "targets" in present:
            targets = self.file["targets"]
            if targets.ndim != 2 or targets.shape[0] != N or targets.dtype.kind != "f":
                raise DataError(f"{self.path}: /targets must be ({N}, K) floats (K values per sample to regress), "
                                f"got {targets.shape} {targets.dtype}")
            self.all_targets = targets[()].astype(np.float32)
            if not np.isfinite(self.all_targets).all():
                raise DataError(f"{self.path}: /targets holds NaN or infinite values (sample "
                                f"{int(np.argwhere(~np.isfinite(self.all_targets))[0, 0])})")
        if self.answers is None:
            self.answers = present[0]
        elif self.answers not in present:
            raise DataError(f"{self.path}: the dataset has no /{self.answers}")
        C = self.images.shape[1]
        self.mean = self._channel_attr("mean", C)
        self.std = self._channel_attr("std", C)
        names = self.file.attrs.get("classes")
        self.classes = None if names is None else [n.decode() if isinstance(n, bytes) else str(n)
                                                   for n in np.atleast_1d(names)]

    def _channel_attr(self, key, C):
        if key not in self.images.attrs and key not in self.file.attrs:
            return None
        value = np.asarray(self.images.attrs.get(key, self.file.attrs.get(key)), dtype=np.float64).reshape(-1)
        if value.size == 1:
            value = np.repeat(value, C)
        if value.size != C or (key == "std" and np.any(value <= 0)):
            raise DataError(f"{self.path}: attribute {key!r} must hold {C} per-channel values"
                            f"{' > 0' if key == 'std' else ''}, got {value.tolist()}")
        return value

    @property
    def num_samples(self):
        return self.images.shape[0]

    @property
    def stored_shape(self):
        """(C, S...) of the samples in the file."""
        return tuple(self.images.shape[1:])

    @property
    def sample_shape(self):
        """(C, S...) of the samples the model sees: the stored ones, or their crop."""
        return self.augment.output_shape(self.stored_shape)

    @property
    def dense(self):
        """Whether /labels are masks: a class per position of each sample."""
        return self.masks is not None

    @property
    def num_targets(self):
        """K of the /targets the batches carry, or None when they carry labels."""
        return self.all_targets.shape[1] if self.answers == "targets" else None

    def spec(self):
        """What opens this source again in another process (:mod:`spmdcnn.io.prefetch`)."""
        return {"kind": "hdf5", "path": self.path, "seed": self.seed, "shuffle": self.shuffle,
                "augment": self.augment.spec(), "answers": self.answers}

    def check_model(self, graph, crop_key="data.augment.crop: {crop}", scan_masks=True):
        """Refuse samples the model does not take (``crop_key``: how the hint says to crop them, ``{crop}`` the
        crop's extents), answers of another kind than its loss compares with (labels for softmax cross-entropy,
        targets for mse_loss), labels outside its classes and a target count other than its outputs; from then on
        the batches carry the answers the model's loss reads. Every value of masks is read to check them, unless
        ``scan_masks`` is False (the ranks of a job but one: that one's finding stops them all)."""
        if self.sample_shape != graph.input_shape:
            crop = f" cropped by data.augment.crop to {list(self.sample_shape)}" if self.augment.crop else ""
            hint = (f": set {crop_key.format(crop=list(graph.input_shape[1:]))} to crop them"
                    if not self.augment.crop and len(self.stored_shape) == len(graph.input_shape)
                    and self.stored_shape[0] == graph.input_shape[0]
                    and all(s >= m for s, m in zip(self.stored_shape[1:], graph.input_shape[1:])) else "")
            rank, wanted = len(self.stored_shape) - 1, len(graph.input_shape) - 1
            takes = list(graph.input_shape) if wanted == rank else \
                f"{samples.kind(wanted)} {list(graph.input_shape)} {samples.layout(wanted)}"
            raise DataError(f"{self.path}: {samples.kind(rank)} are {list(self.stored_shape)} {samples.layout(rank)}"
                            f"{crop} but model '{graph.name}' takes {takes}{hint}")
        loss = f"model '{graph.name}' ends in {graph.loss.op}"
        if graph.regression:
            if self.all_targets is None:
                raise DataError(f"{self.path}: the dataset has no /targets, but {loss}, which regresses "
                                f"{graph.num_outputs} values per sample: write them as /targets (N, "
                                f"{graph.num_outputs}) float32")
            if self.all_targets.shape[1] != graph.num_outputs:
                raise DataError(f"{self.path}: /targets holds {self.all_targets.shape[1]} values per sample, but "
                                f"{loss} over {graph.num_outputs} outputs")
        elif graph.dense_labels:
            if self.masks is None:
                has = "per-sample /labels" if self.all_labels is not None else "no /labels"
                raise DataError(f"{self.path}: the dataset has {has}, but {loss} over every position, which needs a "
                                f"mask per sample: /labels (N, {', '.join(map(str, self.stored_shape[1:]))}) integers")
            if scan_masks:
                self._check_classes(mask_values(self.masks), graph)
        else:
            if self.all_labels is None:
                has = "masks as /labels" if self.masks is not None else "no /labels"
                raise DataError(f"{self.path}: the dataset has {has}, but {loss}, which needs a class per sample"
                                + (" (its /targets are for a regression loss, mse_loss)" if self.masks is None
                                   else ": end the model in a loss per position (logits (K, S...))"))
            self._check_classes(np.unique(self.all_labels), graph)
        self.answers = graph.answers

    def _check_classes(self, values, graph):
        """Refuse label ``values`` (sorted) outside the model's classes, other than its loss's ``ignore_index``."""
        K, ignore = graph.num_classes, graph.loss.attrs.get("ignore_index", -1)
        wrong = [int(v) for v in values if not 0 <= v < K and v != ignore]
        if wrong:
            what = "masks" if self.masks is not None else "labels"
            other = "" if ignore == -1 else f" or {ignore}, the loss's ignore_index"
            raise DataError(f"{self.path}: the {what} range over [{int(values[0])}, {int(values[-1])}]: {wrong[0]} is "
                            f"not one of model '{graph.name}''s {K} classes (labels must lie in [0, {K - 1}]{other})")

    def _answers_array(self):
        return self.all_labels if self.answers == "labels" else self.all_targets

    def identity(self):
        # the answers' checksum tells a replaced or reordered file from the one a run started with (of masks,
        # those of up to MASKS_CHECKED samples spread over the file: all of them may be far larger)
        key = "data.labels_crc32" if self.answers == "labels" else "data.targets_crc32"
        if self.masks is not None:
            picked = np.unique(np.linspace(0, self.num_samples - 1, min(self.num_samples, MASKS_CHECKED)).astype(int))
            answers = self.masks[picked.tolist()] if len(picked) else np.zeros(0)
        else:
            answers = self._answers_array()
        return {**super().identity(), key: zlib.crc32(np.ascontiguousarray(answers).tobytes()),
                "data.augment": self.augment.identity()}

    def read(self, indices, dtype=np.float32, region=None, steps=None, epoch=None, out=None, answers=True):
        """Samples (as ``dtype``, scaled and normalised) and answers (int64 labels, float32 targets, or whole
        masks; None unless ``answers``: a tile's read, whose answers come by :meth:`read_answers`) of the samples
        ``indices``; only the channel and spatial ranges of ``region`` (``[(c0, c1), (lo, hi) per spatial
        axis]``, in the coordinates of the samples the model sees: the crop) when given, and of those only every
        ``steps``-th element.
        ``epoch``: the training epoch whose crops and flips to apply (:mod:`spmdcnn.io.augment`); None reads the
        center crop, unflipped. ``out``: an array of the result's shape and ``dtype`` to fill (else one is made).

        Each sample is one hyperslab of the file (:func:`~spmdcnn.io.augment.stored_read`: the positions the
        region needs along every axis but the last, and along the last from its first to its last or whole rows),
        read straight into a buffer kept for the next batch of this shape (a point selection over several samples
        is executed element by element by HDF5: 30x slower)."""
        indices = np.asarray(indices, dtype=np.int64)
        ranges = _ranges(region, self.sample_shape)
        steps = tuple(steps or (1,) * len(ranges))
        shape = (len(indices),) + tuple(count(lo, hi, s) for (lo, hi), s in zip(ranges, steps))
        if out is None:
            out = np.empty(shape, dtype=dtype)
        elif out.shape != shape or out.dtype != np.dtype(dtype):
            raise ValueError(f"out is {out.shape} {out.dtype}, the read gives {shape} {np.dtype(dtype)}")
        if not out.size:
            return out, self.read_answers(indices, epoch=epoch) if answers else None
        if indices.min() < 0 or indices.max() >= self.num_samples:
            raise DataError(f"{self.path}: sample indices must lie in [0, {self.num_samples})")
        windows = self.augment.windows(self.stored_shape, self.seed, epoch, indices)
        parts = [stored_read(windows, k, ranges, steps, self.stored_shape[-1]) for k in range(len(indices))]
        staged = self._read_parts(indices, parts)
        if all(part.identity for part in parts):
            np.copyto(out, staged, casting="unsafe")
        else:
            for k, part in enumerate(parts):
                np.copyto(out[k], staged[k][part.picks], casting="unsafe")
        self._normalise(out, slice(ranges[0][0], ranges[0][1], steps[0]))
        return out, self.read_answers(indices, epoch=epoch) if answers else None

    def _read_parts(self, indices, parts):
        """Sample ``indices[k]``'s :class:`~spmdcnn.io.augment.StoredRead` ``parts[k]``, each into its row of a
        buffer of the stored type kept for reads of that shape (every part reads the same count)."""
        shape = (len(indices),) + parts[0].count
        staged = self._staged.get(shape)
        if staged is None:
            if len(self._staged) >= self.KEPT_BUFFERS:
                self._staged.clear()
            staged = self._staged[shape] = np.empty(shape, dtype=self.images.dtype)
        space, memory = self.images.id.get_space(), h5py.h5s.create_simple(shape[1:])
        for k, (index, part) in enumerate(zip(indices.tolist(), parts)):
            space.select_hyperslab((index,) + part.start, (1,) + part.count, (1,) + part.stride)
            try:
                self.images.id.read(memory, space, staged[k])
            except (OSError, RuntimeError, KeyError) as error:
                raise DataError(f"{self.path}: cannot read sample {index} of /images (a truncated or damaged "
                                f"file?): {error}") from None
        return staged

    def _normalise(self, out, channels):
        """Scale ``out`` (read from the file, of the stored ``channels``) as training reads images: uint8 over
        255, then less ``mean`` and over ``std`` per channel where the file has them."""
        if self.images.dtype == np.uint8:
            out /= 255
        per_channel = (1, -1) + (1,) * (out.ndim - 2)
        if self.mean is not None:
            out -= self.mean[channels].reshape(per_channel).astype(out.dtype)
        if self.std is not None:
            out /= self.std[channels].reshape(per_channel).astype(out.dtype)

    def read_answers(self, indices, region=None, epoch=None):
        """The answers of the samples ``indices``: int64 labels, float32 targets (K per sample), or int64 masks
        of the spatial ``region`` (``[(lo, hi) per spatial axis]`` of the crop; None: all of it) cropped and
        flipped as ``epoch`` crops and flips the images (None: the center crop, unflipped)."""
        indices = np.asarray(indices, dtype=np.int64)
        if self.masks is None or self.answers != "labels":
            return self._answers_array()[indices]
        spatial = self.sample_shape[1:]
        ranges = [(0, 1)] + ([tuple(r) for r in region] if region else [(0, extent) for extent in spatial])
        out = np.empty((len(indices),) + tuple(hi - lo for lo, hi in ranges[1:]), dtype=np.int64)
        if not len(indices):
            return out
        if indices.min() < 0 or indices.max() >= self.num_samples:
            raise DataError(f"{self.path}: sample indices must lie in [0, {self.num_samples})")
        windows = self.augment.windows(self.stored_shape, self.seed, epoch, indices)
        for k, index in enumerate(indices.tolist()):
            part = stored_read(windows, k, ranges, (1,) * len(ranges), self.stored_shape[-1])
            where = tuple(slice(start, start + n * step, step)
                          for start, n, step in zip(part.start[1:], part.count[1:], part.stride[1:]))
            try:
                out[k] = self.masks[(index,) + where][part.picks[1:]]
            except (OSError, RuntimeError, KeyError) as error:
                raise DataError(f"{self.path}: cannot read the mask of sample {index} (a truncated or damaged "
                                f"file?): {error}") from None
        return out

    def close(self):
        self.file.close()


def open_checked(path, graph, seed=0, shuffle=True, augment=None, batch=None,
                 crop_key="data.augment.crop: {crop}", scan_masks=True):
    """The HDF5 dataset at ``path`` (:class:`HDF5Dataset`), refused (and closed) when its images or labels do not
    fit ``graph`` (:meth:`HDF5Dataset.check_model`, whose hint names ``crop_key``; ``scan_masks``: whether to read
    every mask's values) or, given ``batch``, when it cannot fill one batch."""
    data = HDF5Dataset(path, seed=seed, shuffle=shuffle, augment=augment)
    try:
        data.check_model(graph, crop_key, scan_masks)
        if batch is not None:
            data.batches_per_epoch(batch)
    except BaseException:
        data.close()
        raise
    return data


def mask_counts(masks):
    """``{value: positions}`` over every mask of ``masks`` (an HDF5 dataset (N, S...)), read a block of samples at
    a time (all of them once: a file's masks may be larger than memory)."""
    per = max(1, MASK_BLOCK // max(1, int(np.prod(masks.shape[1:]))))
    counts = {}
    for start in range(0, masks.shape[0], per):
        values, found = np.unique(masks[start:start + per], return_counts=True)
        for value, pixels in zip(values.tolist(), found.tolist()):
            counts[value] = counts.get(value, 0) + pixels
    return dict(sorted(counts.items()))


def mask_values(masks):
    """The distinct values of every mask of ``masks`` (:func:`mask_counts`)."""
    return np.array(list(mask_counts(masks)), dtype=np.int64)


def held_out_problems(train, val):
    """``(error, warning)`` about evaluating on ``val`` a model trained on ``train`` (either None): class names
    that differ (the same label would name other classes: an error), and another mean or std (the held-out
    images are then normalised otherwise than the training images: a warning)."""
    error = warning = None
    if train.classes is not None and val.classes is not None and train.classes != val.classes:
        at = next((k for k, (a, b) in enumerate(zip(train.classes, val.classes)) if a != b),
                  min(len(train.classes), len(val.classes)))
        error = (f"{val.path}: its classes are not those of the training set {train.path} (label {at} is "
                 f"{val.classes[at] if at < len(val.classes) else 'absent'!r} there, "
                 f"{train.classes[at] if at < len(train.classes) else 'absent'!r} in training): convert the held-out "
                 f"images with --classes {train.path}")
    def differ(a, b):
        return (a is None) != (b is None) or (a is not None and not np.allclose(a, b, rtol=1e-6, atol=0))
    if differ(train.mean, val.mean) or differ(train.std, val.std):
        own = "its own mean and std" if val.mean is not None or val.std is not None else "no mean and std"
        theirs = ("the training set's" if train.mean is not None or train.std is not None else
                  "without them as the training set is")
        warning = (f"data.val {val.path} is normalised with {own}, not {theirs} ({train.path}): convert it with "
                   f"--classes {train.path} to share them")
    return error, warning


def dataset_info(path):
    """What ``spmdcnn data info`` prints: samples, their shape and type, the answers (labels per class, or the
    targets' count and range), mean/std, description."""
    data = HDF5Dataset(path, shuffle=False)
    try:
        description, names = data.file.attrs.get("description"), data.file.attrs.get("classes")
        info = {"samples": data.num_samples, "shape": list(data.sample_shape), "dtype": str(data.images.dtype),
                "kind": samples.kind(len(data.sample_shape) - 1),
                "mean": None if data.mean is None else data.mean.tolist(),
                "std": None if data.std is None else data.std.tolist(),
                "description": None if description is None else str(description),
                "class_names": None if names is None else [str(name) for name in names]}
        if data.masks is not None:
            counts = mask_counts(data.masks)
            info.update({"classes": len(counts), "labels": [min(counts), max(counts)] if counts else [],
                         "masks": True, "per_class": {str(k): v for k, v in counts.items()}})
        if data.all_labels is not None:
            labels, counts = np.unique(data.all_labels, return_counts=True)
            info.update({"classes": len(labels), "labels": [int(labels.min()), int(labels.max())] if len(labels)
                         else [], "per_class": {str(k): int(v) for k, v in zip(labels, counts)}})
        if data.all_targets is not None:
            targets = data.all_targets.astype(np.float64)
            info["targets"] = {"count": targets.shape[1],
                               "min": targets.min(axis=0).tolist() if len(targets) else [],
                               "max": targets.max(axis=0).tolist() if len(targets) else [],
                               "mean": targets.mean(axis=0).tolist() if len(targets) else [],
                               "names": _names(data.file["targets"].attrs.get("names"))}
        return info
    finally:
        data.close()


def _names(values):
    return None if values is None else [v.decode() if isinstance(v, bytes) else str(v) for v in np.atleast_1d(values)]


