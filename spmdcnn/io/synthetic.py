"""Synthetic training data: learnable samples of any shape, each a fixed function of (seed, sample), with the
interface of the HDF5 dataset (``io/dataset.py``), for jobs of ``data.kind: synthetic`` and the benchmarks."""

import numpy as np

from ..counters import stream_key, uniform
from .dataset import DataError, _cut, _Source

SYNTHETIC_SAMPLES = 50_000      # samples per epoch of a job's synthetic data unless data.num_samples says


class SyntheticData(_Source):
    """Learnable synthetic samples (images, volumes or sequences); sample ``i`` is a fixed function of (seed, i),
    so any part of any batch can be made alone.

    Classification (``targets`` None): its label comes from a counter-based hash of (seed, i); its sample is the
    label's fixed pattern (a coarse grid of GRID cells per spatial axis per channel, stretched over the sample,
    times ``signal``) plus standard normal noise from a generator keyed by (seed, i). Regression (``targets`` K):
    its K targets are counter-based hashes of (seed, i, k) in [-1, 1], and its sample is the sum of K fixed
    patterns weighted by them, times ``signal``, plus the noise. Segmentation (``dense``): its mask gives each cell of
    the coarse grid a class (hashes of (seed, i, cell)), and its sample is, in each cell, that class's colour (a
    value per channel, times ``signal``) plus the noise: each position's class is told by the colour around it."""

    GRID = 4
    kind = "synthetic"
    path = "synthetic data"

    def __init__(self, sample_shape, num_classes, num_samples=SYNTHETIC_SAMPLES, seed=0, signal=0.5, shuffle=True,
                 targets=None, dense=False):
        self.sample_shape = tuple(sample_shape)
        self.num_classes = int(num_classes)
        self.num_samples = int(num_samples)
        self.targets = None if targets is None else int(targets)
        self.answers = "labels" if targets is None else "targets"
        self.dense = bool(dense) and targets is None
        self.seed, self.signal, self.shuffle = seed, float(signal), shuffle
        if self.num_samples <= 0:
            raise DataError(f"{self.path}: num_samples must be positive, got {self.num_samples}")
        C, spatial = self.sample_shape[0], self.sample_shape[1:]
        patterns = np.random.default_rng([int(seed), 0x5EED]).standard_normal(
            (self.targets or self.num_classes, C) + (self.GRID,) * len(spatial)).astype(np.float32)
        # pattern cell j along an axis covers the positions p with j == p * GRID // extent
        self._counts = [np.bincount(np.arange(extent) * self.GRID // extent, minlength=self.GRID)
                        for extent in spatial]
        self._coarse = patterns * np.float32(signal)
        # segmentation: each class's colour (K, C), its pattern's first cell
        self._colours = self._coarse.reshape(self._coarse.shape[:2] + (-1,))[:, :, 0]
        self._label_key = stream_key(seed, "synthetic labels")

    @classmethod
    def for_model(cls, graph, num_samples=SYNTHETIC_SAMPLES, seed=0, signal=0.5, shuffle=True):
        """Samples of ``graph``'s input shape with the answers its loss reads: labels of its classes, or its
        outputs' count of targets."""
        targets = graph.num_outputs if graph.regression else None
        return cls(graph.input_shape, graph.num_outputs, num_samples, seed, signal, shuffle, targets,
                   graph.dense_labels)

    @property
    def num_targets(self):
        return self.targets

    def check_model(self, graph):
        pass

    def identity(self):
        return {**super().identity(), "data.signal": self.signal, "data.answers": self.answers}

    def _cells(self, indices):
        """The classes of the coarse grid's cells of samples ``indices``: (n, GRID...) int64."""
        rank = len(self.sample_shape) - 1
        cells = self.GRID ** rank
        counters = indices.astype(np.uint64)[:, None] * np.uint64(cells) + np.arange(cells, dtype=np.uint64)
        labels = (uniform(np, self._label_key, counters) * self.num_classes).astype(np.int64)
        return labels.reshape((len(indices),) + (self.GRID,) * rank)

    def read_answers(self, indices, region=None, epoch=None):
        """Labels (int64), masks (int64, of the spatial ``region``: ``[(lo, hi) per axis]``, None: all), or
        targets (float32, K per sample)."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.num_samples):
            raise DataError(f"{self.path}: sample indices must lie in [0, {self.num_samples})")
        if self.dense:
            cut = (slice(None),) + tuple(slice(lo, hi) for lo, hi in region or ())
            return self._stretched(self._cells(indices), first=1)[cut]
        if self.targets is None:
            return (uniform(np, self._label_key, indices.astype(np.uint64)) * self.num_classes).astype(np.int64)
        counters = indices.astype(np.uint64)[:, None] * np.uint64(self.targets) + np.arange(self.targets,
                                                                                             dtype=np.uint64)
        return (2 * uniform(np, self._label_key, counters) - 1).astype(np.float32)

    def spec(self):
        """What makes this source again in another process (:mod:`spmdcnn.io.prefetch`)."""
        return {"kind": "synthetic", "sample_shape": list(self.sample_shape), "num_classes": self.num_classes,
                "num_samples": self.num_samples, "seed": self.seed, "signal": self.signal, "shuffle": self.shuffle,
                "targets": self.targets, "dense": self.dense}

    def _stretched(self, coarse, first=1):
        """A coarse pattern (its spatial axes from axis ``first``: (C, GRID...)) stretched over the sample's spatial
        extents."""
        for axis, counts in enumerate(self._counts):
            coarse = np.repeat(coarse, counts, axis=axis + first)
        return coarse

    def read(self, indices, dtype=np.float32, region=None, steps=None, epoch=None, out=None, answers=True):
        """Like :meth:`HDF5Dataset.read` (without augmentation: ``epoch`` changes nothing); a sample is made whole
        (it is a function of (seed, i)), then cut."""
        truth = self._cells(np.asarray(indices, dtype=np.int64)) if self.dense else self.read_answers(indices)
        cut = _cut(region, self.sample_shape, steps)
        shape = (len(truth),) + tuple(len(range(c.start, c.stop, c.step)) for c in cut)
        images = np.empty(shape, dtype=dtype) if out is None else out
        if images.shape != shape:
            raise ValueError(f"out is {images.shape}, the read gives {shape}")
        for row, (index, answer) in enumerate(zip(np.asarray(indices).tolist(), truth)):
            noise = np.random.default_rng([int(self.seed), 0x1A6E, index]).standard_normal(
                self.sample_shape, dtype=np.float32)
            if self.dense:          # each cell the colour of its class
                coarse = np.moveaxis(self._colours[answer], -1, 0)
            elif self.targets is None:
                coarse = self._coarse[int(answer)]
            else:
                coarse = np.tensordot(answer, self._coarse, axes=1)
            noise += self._stretched(coarse)
            images[row] = noise[cut]
        if not answers:
            return images, None
        return images, self._stretched(truth, first=1) if self.dense else truth
