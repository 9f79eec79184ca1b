"""Training data: the HDF5 dataset of DESIGN.md §3.6 and a synthetic source with the same interface.

    /images (N, C, H, W) uint8 or float32;  /labels (N,) integer;  optional attrs mean, std (per channel)

Batch ``s`` of epoch ``e`` holds the samples ``order(e)[s*B : (s+1)*B]``, where ``order(e)`` is the identity
without shuffling and a permutation drawn from a generator keyed by (seed, e) with it: a fixed function of
(seed, epoch, s), so a resumed run reads exactly the batches an uninterrupted one would. An epoch has
floor(N / B) batches (the incomplete last one is dropped). uint8 images are divided by 255, then normalised by
``mean`` and ``std`` where the file has them.
"""

import h5py
import numpy as np

from .yamlfile import FormatError


class DataError(FormatError):
    pass


def sample_order(num_samples, epoch, seed, shuffle):
    if not shuffle:
        return np.arange(num_samples)
    return np.random.default_rng([int(seed), int(epoch)]).permutation(num_samples)


class HDF5Dataset:
    """Random access to an HDF5 dataset; reads only the samples (and, later, rows and columns) asked for."""

    def __init__(self, path, seed=0, shuffle=True):
        self.path = str(path)
        self.seed, self.shuffle = seed, shuffle
        try:
            self.file = h5py.File(self.path, "r")
        except FileNotFoundError:
            raise DataError(f"{self.path}: dataset not found") from None
        except OSError as error:
            raise DataError(f"{self.path}: cannot open dataset (not HDF5, or unreadable): {error}") from None
        try:
            self._validate()
        except BaseException:
            self.file.close()
            raise

    def _validate(self):
        for key in ("images", "labels"):
            if key not in self.file:
                raise DataError(f"{self.path}: dataset lacks /{key} (expected /images (N, C, H, W) and /labels (N,))")
        self.images, self.labels = self.file["images"], self.file["labels"]
        if self.images.ndim != 4 or self.images.dtype not in (np.uint8, np.float32, np.float64):
            raise DataError(f"{self.path}: /images must be (N, C, H, W) uint8 or float32, got "
                            f"{self.images.shape} {self.images.dtype}")
        if self.labels.shape != (self.images.shape[0],) or self.labels.dtype.kind not in "iu":
            raise DataError(f"{self.path}: /labels must be ({self.images.shape[0]},) integers, got "
                            f"{self.labels.shape} {self.labels.dtype}")
        C = self.images.shape[1]
        self.mean = self._channel_attr("mean", C)
        self.std = self._channel_attr("std", C)

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
    def sample_shape(self):
        return tuple(self.images.shape[1:])

    def check_model(self, graph):
        if self.sample_shape != graph.input_shape:
            raise DataError(f"{self.path}: images are {list(self.sample_shape)} (C, H, W) but model '{graph.name}' "
                            f"takes {list(graph.input_shape)}")

    def batches_per_epoch(self, batch):
        count = self.num_samples // batch
        if count == 0:
            raise DataError(f"{self.path}: {self.num_samples} samples cannot fill one batch of {batch}")
        return count

    def read(self, indices, dtype=np.float32):
        """Images (as ``dtype``, scaled and normalised) and int64 labels of the samples ``indices``."""
        # h5py reads a selection only in increasing order: read the distinct samples sorted, then reorder.
        unique, inverse = np.unique(np.asarray(indices), return_inverse=True)
        images = self.images[unique][inverse]
        labels = self.labels[unique][inverse]
        out = images.astype(dtype)
        if self.images.dtype == np.uint8:
            out /= 255
        if self.mean is not None:
            out -= self.mean.reshape(1, -1, 1, 1).astype(out.dtype)
        if self.std is not None:
            out /= self.std.reshape(1, -1, 1, 1).astype(out.dtype)
        return out, labels.astype(np.int64)

    def batch(self, epoch, s, batch, dtype=np.float32):
        if not 0 <= s < self.batches_per_epoch(batch):
            raise DataError(f"{self.path}: batch {s} of {batch} samples lies outside an epoch of "
                            f"{self.num_samples} samples")
        order = sample_order(self.num_samples, epoch, self.seed, self.shuffle)
        return self.read(order[s * batch:(s + 1) * batch], dtype)

    def close(self):
        self.file.close()


class SyntheticData:
    """Learnable synthetic images, a fixed function of (seed, epoch, batch index): each class has a fixed
    random pattern on a coarse 4x4 grid per channel (so patterns stay small for 1000 classes), stretched over
    the image and added to unit noise."""

    GRID = 4

    def __init__(self, sample_shape, num_classes, num_samples=50_000, seed=0, signal=0.2):
        self.sample_shape = tuple(sample_shape)
        self.num_classes = int(num_classes)
        self.num_samples = int(num_samples)
        self.seed, self.signal = seed, signal
        C = self.sample_shape[0]
        self.patterns = np.random.default_rng([int(seed), 0x5EED]).standard_normal(
            (self.num_classes, C, self.GRID, self.GRID)).astype(np.float32)

    def check_model(self, graph):
        pass

    def batches_per_epoch(self, batch):
        return max(1, self.num_samples // batch)

    def batch(self, epoch, s, batch, dtype=np.float32):
        rng = np.random.default_rng([int(self.seed), int(epoch), int(s)])
        labels = rng.integers(0, self.num_classes, size=batch)
        images = rng.standard_normal((batch,) + self.sample_shape, dtype=np.float32)
        _, H, W = self.sample_shape
        rows = np.arange(H) * self.GRID // H
        cols = np.arange(W) * self.GRID // W
        images += self.signal * self.patterns[labels][:, :, rows[:, None], cols[None, :]]
        return images.astype(dtype, copy=False), labels.astype(np.int64)
