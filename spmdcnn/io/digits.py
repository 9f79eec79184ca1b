"""The handwritten digits scikit-learn ships, as HDF5 datasets (docs/formats.md#dataset-files): ``spmdcnn data digits``.

1,797 images of 8x8 pixels (values 0..16) in 10 classes, a copy of the test set of the UCI Optical Recognition of
Handwritten Digits data (E. Alpaydin and C. Kaynak, 1998; CC BY 4.0), kept in the package as scikit-learn 1.9.1
ships it (``data/digits.csv.gz``; ``data/README.md``). The samples of each class are split at random (a generator
keyed by ``seed``) into a training and a held-out set. Pixels become uint8 (``v * 255 / 16``, rounded), one channel,
and both files carry the training set's ``mean`` and ``std``, so that training sees inputs of mean 0 and unit
variance.
"""

import gzip
import os

import numpy as np

from .dataset import write_dataset

SOURCE = os.path.join(os.path.dirname(__file__), "data", "digits.csv.gz")


def load_digits():
    """``(images, labels)``: ``(1797, 1, 8, 8)`` uint8 and ``(1797,)`` int64, in the file's order."""
    with gzip.open(SOURCE, "rt", encoding="ascii") as stream:
        table = np.loadtxt(stream, delimiter=",", dtype=np.int64)
    pixels, labels = table[:, :64], table[:, 64]
    images = ((pixels * 255 + 8) // 16).astype(np.uint8).reshape(-1, 1, 8, 8)
    return images, labels


def split(labels, held_out, seed):
    """``(train, val)`` sample indices: ``held_out`` (a fraction) of each class, drawn at random, held out (at
    least one sample of each class on each side)."""
    rng = np.random.default_rng([int(seed), 0xD161])
    train, val = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        count = min(max(1, int(round(held_out * len(members)))), len(members) - 1)
        val.append(members[:count])
        train.append(members[count:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


def make_digits(train_path, val_path, held_out=0.2, seed=0):
    """Write the training and held-out digits datasets; returns their sample counts."""
    if not 0 < held_out < 1:
        raise ValueError(f"the held-out fraction must lie in (0, 1), got {held_out}")
    images, labels = load_digits()
    train, val = split(labels, held_out, seed)
    scaled = images[train].astype(np.float64) / 255
    mean, std = [scaled.mean()], [scaled.std()]
    source = "scikit-learn's handwritten digits (UCI Optical Recognition of Handwritten Digits, CC BY 4.0)"
    for path, rows, part in ((train_path, train, "training"), (val_path, val, "held-out")):
        write_dataset(path, images[rows], labels[rows], mean=mean, std=std,
                      description=f"{source}: the {part} {100 * (len(rows) / len(labels)):.0f} %, seed {seed}")
    return len(train), len(val)
