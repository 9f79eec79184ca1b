"""Shapes to segment: images or volumes of random discs, boxes and rings on textured noise, with a mask giving every
pixel's (voxel's) class, a segmentation task any machine makes in seconds (``spmdcnn data shapes``).

Each sample is a fixed function of (seed, sample): a background of smooth noise (white noise averaged over
windows of :data:`TEXTURE` positions per axis, rescaled to [0, 0.5]), and 2 to :data:`MOST` objects drawn over it
in turn, each of a random class, centre, radius (a share of the sample's extent) and brightness. The classes
(:data:`CLASSES`) are told apart by shape alone, never by brightness, which every object draws from the same
range: a disc (a ball in 3D) is the positions within the radius of its centre, a box those within it along every
axis (the maximum norm), and a ring the disc less its inner 60 % (a shell in 3D). A later object covers an earlier
one. Every object carries the background's texture, so that a pixel's class takes its neighbourhood to tell, as a
U-Net's receptive field gives.

One function serves every spatial rank: the distances are taken over however many axes the sample has.
"""

import functools

import numpy as np

from .dataset import write_blocks

CLASSES = ("background", "disc", "box", "ring")
MOST = 5                    # objects per sample, at most (2 at least)
TEXTURE = 3                 # the background noise is averaged over windows of this many positions per axis
RADII = (0.12, 0.3)         # an object's radius, as a share of the sample's smallest extent
INNER = 0.6                 # a ring's inner radius, as a share of its outer one
BLOCK = 64                  # samples made and written at a time
SAMPLES = 512               # training samples unless told


def held_out(samples):
    """Held-out samples for ``samples`` training ones unless told: a quarter of them."""
    return max(1, samples // 4)


def _texture(rng, shape):
    """Smooth noise over ``shape`` in [0, 1]: white noise averaged over TEXTURE positions along each axis."""
    field = rng.standard_normal(tuple(extent + TEXTURE - 1 for extent in shape))
    for axis, extent in enumerate(shape):
        sums = np.cumsum(field, axis=axis)
        ahead = np.take(sums, range(TEXTURE - 1, extent + TEXTURE - 1), axis=axis)
        behind = np.take(sums, range(-1, extent - 1), axis=axis)
        behind = np.where((np.arange(extent) == 0).reshape((-1,) + (1,) * (len(shape) - axis - 1)), 0, behind)
        field = ahead - behind
    low, high = field.min(), field.max()
    return (field - low) / max(high - low, 1e-12)


def sample(shape, seed, index):
    """``(image, mask)`` of sample ``index``: the image (1, S...) float32 in [0, 1] and its mask (S...) uint8."""
    rng = np.random.default_rng([int(seed), 0x5A9E, int(index)])
    image = 0.5 * _texture(rng, shape)
    mask = np.zeros(shape, dtype=np.uint8)
    grid = np.ogrid[tuple(slice(0, extent) for extent in shape)]
    smallest = min(shape)
    for _ in range(rng.integers(2, MOST + 1)):
        kind = int(rng.integers(1, len(CLASSES)))
        centre = [rng.uniform(0, extent) for extent in shape]
        radius = rng.uniform(*RADII) * smallest
        offsets = [np.abs(axis - c) for axis, c in zip(grid, centre)]
        if CLASSES[kind] == "box":
            inside = functools.reduce(np.maximum, offsets) <= radius
        else:
            distance = np.sqrt(sum(offset ** 2 for offset in offsets))
            inside = distance <= radius
            if CLASSES[kind] == "ring":
                inside &= distance >= INNER * radius
        brightness = rng.uniform(0.45, 0.95)
        image = np.where(inside, brightness + 0.25 * (image - 0.25), image)
        mask[inside] = kind
    return np.clip(image, 0, 1)[None].astype(np.float32), mask


def write_shapes(path, shape, first, count, seed, progress=None, statistics=None):
    """Write samples ``first .. first + count - 1`` of ``seed`` to ``path``: uint8 images (1, S...) with their masks
    as /labels (count, S...), and the mean and std of its own images (or ``statistics``: a held-out set takes the
    training set's); returns those. ``progress(n)`` is told the index just past the last sample made."""
    masks = np.zeros((count,) + tuple(shape), dtype=np.uint8)
    sums = np.zeros(2)

    def blocks():
        for start in range(0, count, BLOCK):
            stop = min(count, start + BLOCK)
            images = np.empty((stop - start, 1) + tuple(shape), dtype=np.uint8)
            for row, i in enumerate(range(start, stop)):
                image, masks[i] = sample(shape, seed, first + i)
                images[row] = np.rint(image * 255)
            values = images.astype(np.float64) / 255
            sums[:] += values.sum(), (values ** 2).sum()
            if progress is not None:
                progress(first + stop)
            yield images

    def own():
        n = count * int(np.prod(shape))
        mean = sums[0] / n
        found[:] = [mean], [np.sqrt(max(sums[1] / n - mean ** 2, 1e-30))]
        return found
    found = list(statistics) if statistics is not None else [None, None]
    what = "x".join(map(str, shape))
    description = (f"shapes of {what} (spmdcnn data shapes, seed {seed}, samples {first} to {first + count - 1}): "
                   f"masks of {', '.join(CLASSES)}")
    # the masks are made with the images, so the file's answers are written once every block is
    write_blocks(path, (1,) + tuple(shape), np.uint8, masks, blocks(), own if statistics is None else
                 tuple(statistics), {"description": description, "classes": list(CLASSES)})
    return tuple(found)


def make_shapes(train_path, val_path, size=64, rank=2, samples=SAMPLES, val_samples=None, seed=0, progress=None):
    """Write ``samples`` training samples of ``size`` along each of ``rank`` axes to ``train_path`` and
    ``val_samples`` (a quarter by default) held-out ones to ``val_path``, normalised alike; returns the counts."""
    val_samples = held_out(samples) if val_samples is None else val_samples
    if size < 8 or rank not in (1, 2, 3) or samples < 1 or val_samples < 1:
        raise ValueError(f"shapes: --size must be 8 or more, the rank 1, 2 or 3 and the sample counts positive, got "
                         f"size {size}, rank {rank}, {samples} and {val_samples} samples")
    shape = (size,) * rank
    statistics = write_shapes(train_path, shape, 0, samples, seed, progress)
    write_shapes(val_path, shape, samples, val_samples, seed, progress, statistics)
    return samples, val_samples
