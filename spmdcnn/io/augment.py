"""Augmentation of training images (job key ``data.augment``, docs/formats.md#augmentation): a random crop of
each stored image and a random horizontal flip, as functions of (data seed, epoch, sample index).

Nothing is drawn in sequence: the crop offset and flip of sample ``i`` in epoch ``e`` are counter-based hashes
of (seed, e, i) (:mod:`spmdcnn.counters`), so every rank that reads part of a sample, and a resumed run, sees the
same crop and flip, whatever the plan and the number of ranks. Evaluation reads the center crop, unflipped.

:class:`Windows` say where each sample's crop lies in its stored image; :func:`stored_read` turns a box of the
crop (what one tile reads, with its strides) into the part of the stored image to read, mirrored under a flip:
the rows the box needs and the columns from its first to its last (whole rows when those are most of them).
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
        unknown = sorted(set(spec) - set(KEYS), key=str)
        if unknown:
            colon = (" (YAML needs a space after each colon: {crop: [224, 224], flip: true})"
                     if ":" in str(unknown[0]) else "")
            raise FormatError(f"{where}: unknown key '{unknown[0]}' (allowed: {', '.join(KEYS)}){colon}")
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


def count(lo, hi, step):
    """How many elements ``range(lo, hi, step)`` has (``step`` > 0)."""
    return max(0, -(-(hi - lo) // step))


WHOLE_ROW = 0.75    # read whole stored rows when the columns needed span this share of them or more


@dataclass(frozen=True)
class StoredRead:
    """What one sample's read takes from the file: the hyperslab ``start``, ``count``, ``stride`` per stored
    (C, H, W) axis (columns always dense), and ``columns``, the slice of each row read that gives the box's
    columns in the crop's order (mirrored for a flipped sample)."""

    start: tuple
    count: tuple
    stride: tuple
    columns: slice


def stored_read(windows, k, ranges, steps, width):
    """The :class:`StoredRead` of sample ``k`` of ``windows`` for the crop's ``ranges`` (``[(c0, c1), (h0, h1),
    (w0, w1)]``) read with ``steps``, from stored images ``width`` columns wide.

    The crop's column ``w`` is the stored column ``x + w`` (``x`` the window's first), or ``x + cw - 1 - w`` when
    flipped (``cw`` the crop's width). The rows needed are read (strided as the box is), and of them the columns
    from the first to the last needed, or the whole row when those cover WHOLE_ROW of it: HDF5 copies a hyperslab
    one contiguous run at a time, a run per row of a part of a row but one per channel of whole rows (3-8x faster
    for a 224 crop of a 256 image, for 14 % more bytes)."""
    (c0, _), (h0, _), (w0, _) = ranges
    sc, sh, sw = steps
    nc, nh, nw = (count(lo, hi, s) for (lo, hi), s in zip(ranges, steps))
    row, x = int(windows.rows[k]), int(windows.cols[k])
    flip = bool(windows.flips[k])
    first = x + w0 if not flip else x + windows.size[1] - 1 - (w0 + sw * (nw - 1))
    last = first + sw * (nw - 1)
    lo, span = (0, width) if last - first + 1 >= WHOLE_ROW * width else (first, last - first + 1)
    a, b = first - lo, last - lo
    columns = slice(b, a - 1 if a > 0 else None, -sw) if flip else slice(a, b + 1, sw)
    return StoredRead((c0, row + h0, lo), (nc, nh, span), (sc, sh, 1), columns)
