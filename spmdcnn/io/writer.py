"""Writing the HDF5 dataset of docs/formats.md#dataset-files: images a block at a time, then their answers (labels,
masks or targets), into a file beside the path that is renamed over it when complete (``io/atomic.py``).
"""

import h5py
import numpy as np

from .atomic import written_aside


def _answers(answers, spatial):
    """``answers`` as written: (N,) int64 labels, integer masks (N, S...) of the samples' ``spatial`` extents (kept
    as they are, not copied), or (N, K) float32 targets; ValueError otherwise."""
    answers = np.asarray(answers)
    if answers.ndim == 1 and answers.dtype.kind in "iu":
        return answers.astype(np.int64)
    if answers.ndim >= 2 and answers.dtype.kind in "iu" and tuple(answers.shape[1:]) == tuple(spatial):
        return answers
    if answers.ndim == 2 and answers.dtype.kind in "fiu":
        return answers.astype(np.float32)
    raise ValueError(f"expected labels (N,) integers, masks (N, {', '.join(map(str, spatial))}) integers or targets "
                     f"(N, K) floats, got {answers.shape} {answers.dtype}")


def write_dataset(path, images, answers, mean=None, std=None, description=None, target_names=None):
    """Write ``images`` (N, C, S...) uint8 or float32 and their ``answers`` as an HDF5 dataset (:func:`write_blocks`):
    (N,) integer labels, (N, S...) integer masks, or (N, K) float targets; ``mean`` and ``std`` per channel, if
    given."""
    images = np.asarray(images)
    answers = _answers(answers, images.shape[2:])
    if not 3 <= images.ndim <= 5 or images.dtype not in (np.uint8, np.float32) or len(answers) != len(images):
        raise ValueError(f"expected images (N, C, H, W) or (N, C, D, H, W), uint8 or float32, and an answer per "
                         f"sample, got {images.shape} {images.dtype} and {answers.shape}")
    attrs = {"description": description} if description else None
    write_blocks(path, images.shape[1:], images.dtype, answers, [images], (mean, std), attrs,
                 target_names=target_names)


def write_blocks(path, shape, dtype, answers, blocks, statistics=None, attrs=None, chunk=1, target_names=None):
    """Write ``len(answers)`` samples of ``shape`` (C, S...) and ``dtype``, which ``blocks`` yields in turn as
    (n, C, S...) arrays, and their ``answers``, atomically (into a file beside ``path``, renamed over it when
    complete): (N,) integer labels or (N, S...) integer masks as /labels (masks chunked a sample at a time, as the
    images), or (N, K) float targets as /targets (``target_names``: a name per target, kept as the attribute
    ``names``). The answers are written after the blocks, so a generator of blocks may fill masks as it goes.
    ``statistics``: the per-channel ``(mean, std)`` (either may be None), or a function that gives them once every
    block is written; ``attrs``: the file's attributes; ``chunk``: samples per HDF5 chunk (one: a shuffled read
    of a sample touches that sample alone; 0: no chunks, one contiguous array)."""
    answers = _answers(answers, shape[1:])
    count = len(answers)
    with written_aside(path) as temporary, h5py.File(temporary, "w") as f:
        chunks = (min(int(chunk), count),) + tuple(shape) if chunk and count else None
        images = f.create_dataset("images", (count,) + tuple(shape), dtype=dtype, chunks=chunks)
        done = 0
        for block in blocks:
            images[done:done + len(block)] = block
            done += len(block)
        if done != count:
            raise ValueError(f"{path}: {done} samples for {count} answers")
        masks = answers.dtype.kind in "iu" and answers.ndim > 1
        written = f.create_dataset("labels" if answers.ndim == 1 or masks else "targets", data=answers,
                                   chunks=(1,) + answers.shape[1:] if masks and count else None)
        if target_names is not None:
            written.attrs["names"] = [str(name) for name in target_names]
        for key, value in zip(("mean", "std"), (statistics() if callable(statistics) else statistics) or ()):
            if value is not None:
                images.attrs[key] = np.asarray(value, dtype=np.float64)
        f.attrs.update(attrs or {})
