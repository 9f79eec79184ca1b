"""Augmentation of training samples (job key ``data.augment``, docs/formats.md#augmentation): a random crop of each
stored sample and random flips, as functions of (data seed, epoch, sample index), for images and volumes alike.

``crop`` gives the crop's extent along every spatial axis (``[H, W]`` for images, ``[D, H, W]`` for volumes);
``flip: true`` mirrors the last axis (an image left to right) with probability 1/2, and ``flip: [d, h, w]`` (any of
the sample's axes) mirrors each axis named, independently, with probability 1/2.

Nothing is drawn in sequence: the crop offset and flips of sample ``i`` in epoch ``e`` are counter-based hashes
of (seed, e, i) (:mod:`spmdcnn.counters`), one stream per axis, so every rank that reads part of a sample, and a
resumed run, sees the same crop and flips, whatever the plan and the number of ranks. Evaluation reads the center
crop, unflipped.

:class:`Windows` say where each sample's crop lies in its stored sample; :func:`stored_read` turns a box of the
crop (what one tile reads, with its strides) into the part of the stored sample to read, mirrored along the
flipped axes: along every axis but the last the positions the box needs (strided as the box is), along the last
those from the first to the last needed (whole rows when those are most of them).
"""

from dataclasses import dataclass

import numpy as np

from ..counters import stream_key, uniform
from .samples import AXES, axis_names, kind as kind_of
from .yamlfile import FormatError

KEYS = ("crop", "flip")
# the counter streams of each axis's offsets and flips, by its name (the last two as images have always drawn them)
CROP_STREAMS = {"d": "augment crop depth", "h": "augment crop rows", "w": "augment crop columns"}
FLIP_STREAMS = {"d": "augment flip depth", "h": "augment flip rows", "w": "augment flip"}


@dataclass(frozen=True)
class Augment:
    """``crop``: the crop's extents (one per spatial axis) taken from each stored sample, or None (the whole
    sample); ``flip``: the axes (names, :data:`AXES`) each mirrored with probability 1/2, ``()`` for none; True (the
    job's ``flip: true``) is the last axis."""

    crop: tuple = None
    flip: object = ()

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
            if (not isinstance(crop, (list, tuple)) or not 1 <= len(crop) <= 3
                    or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in crop)):
                raise FormatError(f"{where}.crop: expected [H, W] (images) or [D, H, W] (volumes), positive "
                                  f"integers, got {crop!r}")
            crop = tuple(crop)
        flip = spec.get("flip", False)
        if isinstance(flip, (list, tuple)):
            if not flip or any(axis not in AXES for axis in flip) or len(set(flip)) != len(flip):
                raise FormatError(f"{where}.flip: expected true, false or a list of distinct axes among d, h, w, "
                                  f"got {flip!r}")
            flip = tuple(axis for axis in AXES if axis in flip)
        elif not isinstance(flip, bool):
            raise FormatError(f"{where}.flip: expected true or false (or a list of axes among d, h, w), got "
                              f"{flip!r}")
        return cls(crop, flip if flip is not False else ())

    def flipped(self, rank):
        """The axes flipped in samples of ``rank`` spatial axes (names)."""
        if self.flip is True:
            return axis_names(rank)[-1:]
        return tuple(self.flip) if self.flip else ()

    def __bool__(self):
        return self.crop is not None or bool(self.flip)

    def _flip_words(self):
        if self.flip is True:
            return ["horizontal flips"]
        return [f"flips of {', '.join(self.flip)}"] if self.flip else []

    def describe(self):
        parts = [f"random {'x'.join(map(str, self.crop))} crops"] if self.crop else []
        return ", ".join(parts + self._flip_words()) or "none"

    def identity(self):
        """What a resumed run must share: ``crop HxW, flip`` (or ``none``)."""
        parts = [f"crop {'x'.join(map(str, self.crop))}"] if self.crop else []
        flips = ["flip"] if self.flip is True else ([f"flip {','.join(self.flip)}"] if self.flip else [])
        return ", ".join(parts + flips) or "none"

    def spec(self):
        """The job's ``data.augment`` mapping that makes this again (:meth:`from_spec`)."""
        return {"crop": None if self.crop is None else list(self.crop),
                "flip": self.flip if isinstance(self.flip, bool) else (list(self.flip) or False)}

    def output_shape(self, stored):
        """The (C, S...) a stored sample of ``stored`` shape becomes."""
        return tuple(stored[:1]) + (tuple(self.crop) if self.crop else tuple(stored[1:]))

    def problem(self, stored, key="data.augment"):
        """What is wrong with augmenting stored samples of shape ``stored`` (C, S...): a crop of another rank or
        larger than them, a flip of an axis they lack; or None."""
        rank = len(stored) - 1
        names = axis_names(rank)
        kind = kind_of(rank)
        if self.crop and len(self.crop) != rank:
            return (f"{key}.crop {list(self.crop)} has {len(self.crop)} extent{'s' * (len(self.crop) != 1)}, but the "
                    f"stored {kind} have {rank} spatial axes ({', '.join(names)}: {list(stored[1:])})")
        if self.crop and any(c > s for c, s in zip(self.crop, stored[1:])):
            what = " x ".join(name.upper() for name in names)
            return (f"{key}.crop {' x '.join(map(str, self.crop))} ({what}) is larger than the stored {kind}, "
                    f"{' x '.join(map(str, stored[1:]))}: convert them larger (spmdcnn data convert --size) or "
                    "crop less")
        absent = [axis for axis in self.flipped(rank) if axis not in names]
        if absent:
            return f"{key}.flip: the stored {kind} have no axis {absent[0]} (their spatial axes: {', '.join(names)})"
        return None

    def windows(self, stored, seed, epoch, indices):
        """The :class:`Windows` of samples ``indices`` in ``epoch`` (None: evaluation, the center crop)."""
        indices = np.asarray(indices, dtype=np.int64)
        spatial = tuple(stored[1:])
        names = axis_names(len(spatial))
        size = tuple(self.crop or spatial)
        if epoch is None:
            starts = np.array([(s - c) // 2 for s, c in zip(spatial, size)], dtype=np.int64)
            return Windows(np.repeat(starts[None], len(indices), axis=0),
                           np.zeros((len(indices), len(spatial)), dtype=bool), size)
        counter = indices.astype(np.uint64)

        def draw(name, count):
            return np.minimum((uniform(np, stream_key(seed, name, epoch), counter) * count).astype(np.int64),
                              count - 1)
        starts = np.zeros((len(indices), len(spatial)), dtype=np.int64)
        flips = np.zeros((len(indices), len(spatial)), dtype=bool)
        flipped = self.flipped(len(spatial))
        for axis, name in enumerate(names):
            if self.crop:
                starts[:, axis] = draw(CROP_STREAMS[name], spatial[axis] - size[axis] + 1)
            if name in flipped:
                flips[:, axis] = draw(FLIP_STREAMS[name], 2).astype(bool)
        return Windows(starts, flips, size)


@dataclass
class Windows:
    """Per sample (rows) and spatial axis (columns): the crop's first stored position and whether that axis is
    mirrored; ``size``, the crop's extents."""

    starts: np.ndarray
    flips: np.ndarray
    size: tuple


def count(lo, hi, step):
    """How many elements ``range(lo, hi, step)`` has (``step`` > 0)."""
    return max(0, -(-(hi - lo) // step))


WHOLE_ROW = 0.75    # read whole stored rows when the columns needed span this share of them or more


@dataclass(frozen=True)
class StoredRead:
    """What one sample's read takes from the file: the hyperslab ``start``, ``count``, ``stride`` per stored
    (C, S...) axis (the last axis always dense), and ``picks``, the slices of the staged hyperslab (C, S...) that
    give the box in the crop's order: along the last axis the box's positions among those read, along any axis
    mirrored for a flipped sample."""

    start: tuple
    count: tuple
    stride: tuple
    picks: tuple

    @property
    def identity(self):
        """Whether the staged hyperslab is the box as it is (no pick to apply)."""
        return all(pick == slice(None) for pick in self.picks[:-1]) and \
            self.picks[-1] == slice(0, self.count[-1], 1)


def stored_read(windows, k, ranges, steps, width):
    """The :class:`StoredRead` of sample ``k`` of ``windows`` for the crop's ``ranges`` (``[(c0, c1), (lo, hi)
    per spatial axis]``) read with ``steps``, from stored samples ``width`` positions wide along the last axis.

    Along a spatial axis the crop's position ``i`` is the stored ``x + i`` (``x`` the window's first), or
    ``x + size - 1 - i`` when that axis is flipped. Every axis but the last is read strided as the box is (and
    reversed in memory when flipped); of the last, the positions from the first to the last needed, or the whole
    row when those cover WHOLE_ROW of it: HDF5 copies a hyperslab one contiguous run at a time, a run per row of a
    part of a row but one per channel of whole rows (3-8x faster for a 224 crop of a 256 image, for 14 % more
    bytes)."""
    (c0, c1), *spatial = ranges
    sc, *spatial_steps = steps
    start, number, stride, picks = [c0], [count(c0, c1, sc)], [sc], [slice(None)]
    last = len(spatial) - 1
    for axis, ((lo, hi), step) in enumerate(zip(spatial, spatial_steps)):
        n = count(lo, hi, step)
        x, flip = int(windows.starts[k, axis]), bool(windows.flips[k, axis])
        first = x + lo if not flip else x + windows.size[axis] - 1 - (lo + step * (n - 1))
        if axis < last:
            start.append(first)
            number.append(n)
            stride.append(step)
            picks.append(slice(None, None, -1) if flip else slice(None))
            continue
        end = first + step * (n - 1)
        begin, span = (0, width) if end - first + 1 >= WHOLE_ROW * width else (first, end - first + 1)
        a, b = first - begin, end - begin
        start.append(begin)
        number.append(span)
        stride.append(1)
        picks.append(slice(b, a - 1 if a > 0 else None, -step) if flip else slice(a, b + 1, step))
    return StoredRead(tuple(start), tuple(number), tuple(stride), tuple(picks))
