"""Augmentation of training images (job key ``data.augment``, docs/formats.md#augmentation): a random crop of
each stored image and a random horizontal flip, as functions of (data seed, epoch, sample index).

Nothing is drawn in sequence: the crop offset and flip of sample ``i`` in epoch ``e`` are counter-based hashes
of (seed, e, i) (:mod:`spmdcnn.counters`), so every rank that reads part of a sample, and a resumed run, sees the
same crop and flip, whatever the plan and the number of ranks. Evaluation reads the center crop, unflipped.

A :class:`Window` says where a sample's crop lies in the stored image; :func:`stored_slices` turns a box of the
crop (what one tile reads, with its strides) into the hyperslab of the stored image to read, mirrored under a
flip, so that each rank reads only the stored pixels its box needs.
"""

from dataclasses import dataclass

import numpy as np

from ..counters import stream_key, uniform
from .yamlfile import FormatError

KEYS = ("crop", "flip")


@dataclass(frozen=True)
class Augment:
    """``crop``: (H, W) of the crop taken from each stored image, or None (the whole image); ``flip``: mirror
    each image left to right with probability 1/2."""

    crop: tuple = None
    flip: bool = False

    @classmethod
    def from_spec(cls, spec, where="data.augment"):
        """The augmentation of a job's ``data.augment`` mapping (None or empty: none); FormatError naming the
        key otherwise."""
        if not spec:
            return cls()
        if not isinstance(spec, dict):
            raise FormatError(f"{where}: expected a mapping with keys {', '.join(KEYS)}, got {spec!r}")
        unknown = sorted(set(spec) - set(KEYS))
        if unknown:
            raise FormatError(f"{where}: unknown key '{unknown[0]}' (allowed: {', '.join(KEYS)})")
        crop = spec.get("crop")
        if crop is not None:
            if (not isinstance(crop, (list, tuple)) or len(crop) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in crop)):
                raise FormatError(f"{where}.crop: expected [H, W], two positive integers, got {crop!r}")
            crop = tuple(crop)
        flip = spec.get("flip", False)
        if not isinstance(flip, bool):
            raise FormatError(f"{where}.flip: expected true or false, got {flip!r}")
        return cls(crop, flip)

    def __bool__(self):
        return self.crop is not None or self.flip

    def describe(self):
        parts = [f"random {self.crop[0]}x{self.crop[1]} crops"] if self.crop else []
        return ", ".join(parts + ["horizontal flips"] * self.flip) or "none"

    def identity(self):
        """What a resumed run must share: ``crop HxW, flip`` (or ``none``)."""
        parts = [f"crop {self.crop[0]}x{self.crop[1]}"] if self.crop else []
        return ", ".join(parts + ["flip"] * self.flip) or "none"

    def output_shape(self, stored):
        """The (C, H, W) a stored image of ``stored`` shape becomes."""
        return tuple(stored[:1]) + (tuple(self.crop) if self.crop else tuple(stored[1:]))

    def problem(self, stored, key="data.augment.crop"):
        """What is wrong with cropping stored images of shape ``stored`` (a crop larger than them), or None."""
        if self.crop and (self.crop[0] > stored[1] or self.crop[1] > stored[2]):
            return (f"{key} {self.crop[0]} x {self.crop[1]} (H x W) is larger than the stored images, {stored[1]} x "
                    f"{stored[2]}: convert the images larger (spmdcnn data convert --size) or crop less")
        return None

    def windows(self, stored, seed, epoch, indices):
        """The :class:`Windows` of samples ``indices`` in ``epoch`` (None: evaluation, the center crop)."""
        indices = np.asarray(indices, dtype=np.int64)
        H, W = stored[1:]
        h, w = self.crop or (H, W)
        if epoch is None:
            rows = np.full(len(indices), (H - h) // 2, dtype=np.int64)
            cols = np.full(len(indices), (W - w) // 2, dtype=np.int64)
            return Windows(rows, cols, np.zeros(len(indices), dtype=bool), (h, w))
        counter = indices.astype(np.uint64)

        def draw(name, count):
            return np.minimum((uniform(np, stream_key(seed, name, epoch), counter) * count).astype(np.int64),
                              count - 1)
        rows = draw("augment crop rows", H - h + 1) if self.crop else np.zeros(len(indices), dtype=np.int64)
        cols = draw("augment crop columns", W - w + 1) if self.crop else np.zeros(len(indices), dtype=np.int64)
        flips = draw("augment flip", 2).astype(bool) if self.flip else np.zeros(len(indices), dtype=bool)
        return Windows(rows, cols, flips, (h, w))


@dataclass
class Windows:
    """Per sample: the crop's first stored row and column and whether it is mirrored; ``size`` (h, w) of the
    crop."""

    rows: np.ndarray
    cols: np.ndarray
    flips: np.ndarray
    size: tuple


def stored_slices(window, k, ranges, steps):
    """``(start, count, stride)`` per (C, H, W) axis of the stored image that sample ``k`` of ``window`` reads for
    the crop's ``ranges`` (``[(c0, c1), (h0, h1), (w0, w1)]``) read with ``steps``, and whether the columns read
    must then be reversed (a flipped sample: its crop columns ``w0, w0 + s, ...`` are the stored columns
    ``x + w - 1 - w0, x + w - 1 - w0 - s, ...``, read in increasing order)."""
    (c0, c1), (h0, h1), (w0, w1) = ranges
    sc, sh, sw = steps
    counts = [max(0, -(-(hi - lo) // s)) for (lo, hi), s in zip(ranges, steps)]
    row, col = int(window.rows[k]), int(window.cols[k])
    flip = bool(window.flips[k])
    if flip and counts[2]:
        last = w0 + sw * (counts[2] - 1)
        first_col = col + window.size[1] - 1 - last
    else:
        first_col = col + w0
    return ((c0, counts[0], sc), (row + h0, counts[1], sh), (first_col, counts[2], sw)), flip
