"""The labels of a folder of images that has no class sub-folders (ImageNet's validation set): a text file of one
label a line or a CSV of ``file,label`` rows (:func:`read_labels`), class names numbered as a training set numbers
them (:func:`load_classes`, :func:`numbered`), and the training set's mean and std (:func:`training_statistics`),
for ``spmdcnn data convert`` (:mod:`spmdcnn.io.convert`)."""

import csv
import difflib
import os
import re

import h5py
import numpy as np

from .dataset import DataError, HDF5Dataset

INTEGER = re.compile(r"[+-]?\d+$")


def _text_lines(path, what):
    """The lines of the text file ``path``; DataError naming it (as ``what``) if it cannot be read."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:    # -sig: a byte-order mark is not a character
            return f.read().splitlines()
    except FileNotFoundError:
        raise DataError(f"{path}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: cannot read {what} as text: {error}") from None


def load_classes(path):
    """The class names of ``path``, in label order: the ``classes`` attribute of an HDF5 dataset (a training set
    converted from class sub-folders), or the first word of each non-blank line of a text file (the rest of a line,
    a description, is ignored)."""
    if os.path.isfile(path) and h5py.is_hdf5(path):
        with h5py.File(path, "r") as f:
            stored = f.attrs.get("classes")
        if stored is None:
            raise DataError(f"{path}: the dataset has no classes attribute (--classes takes a dataset converted "
                            "from class sub-folders, or a text file of class names, one a line)")
        names = [name.decode() if isinstance(name, bytes) else str(name) for name in np.atleast_1d(stored)]
    else:
        names = [line.split()[0] for line in _text_lines(path, "class names") if line.strip()]
    if not names:
        raise DataError(f"{path}: no class names")
    first = {}
    for label, name in enumerate(names):
        if name in first:
            raise DataError(f"{path}: the class name {name!r} is there twice (labels {first[name]} and {label})")
        first[name] = label
    return names


def read_labels(path, folder, names):
    """The label of each image file ``names`` (sorted) of ``folder``, as ``(word, line)``, from ``path``: a text
    file of one label a line for the files in that order (its blank lines skipped), or a CSV of ``file,label``
    rows (:func:`_csv_labels`) when its first line holds a comma. A label is the first word of its line or field."""
    lines = _text_lines(path, "labels")
    rows = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if rows and "," in rows[0][1]:
        return _csv_labels(path, folder, names, lines)
    where = f"for the {len(names)} images of {folder} (one a line, in sorted file order)"
    if len(rows) < len(names):
        raise DataError(f"{path}: {len(rows)} labels {where}: none for {names[len(rows)]} and after")
    if len(rows) > len(names):
        raise DataError(f"{path}: {len(rows)} labels {where}: line {rows[len(names)][0]} labels no image")
    return [(line.split()[0], number) for number, line in rows]


def _csv_labels(path, folder, names, lines):
    """The labels of a CSV of ``file,label`` rows (further fields ignored) that names every image once: ``file``
    an image's name, with or without its extension (a path's folders ignored), and a first row naming no image a
    header (``ImageId,PredictionString``); a label the first word of its field (Kaggle's ImageNet
    ``LOC_val_solution.csv`` gives a class and its boxes: ``n01751748 1 2 3 4 ...``)."""
    index = {name: i for i, name in enumerate(names)}
    stems = {}
    for i, name in enumerate(names):
        stem = os.path.splitext(name)[0]
        stems[stem] = None if stem in stems else i      # None: two files share it
    found, first = [None] * len(names), True
    reader = csv.reader(lines)
    for row in reader:
        if not any(field.strip() for field in row):
            continue
        where = f"{path}: line {reader.line_num}"
        key = os.path.basename(row[0].strip())
        i = index.get(key, stems.get(key))
        if i is None and key in stems:
            alike = [name for name in names if os.path.splitext(name)[0] == key]
            raise DataError(f"{where}: {key!r} could be any of the images {', '.join(alike)} of {folder}: give the "
                            "file's whole name")
        if i is None and not first:
            raise DataError(f"{where}: no image {key!r} in {folder}")
        first = False
        if i is None:
            continue                                    # a header
        if len(row) < 2 or not row[1].split():
            raise DataError(f"{where}: no label for {names[i]} (expected file,label rows)")
        if found[i] is not None:
            raise DataError(f"{where}: a second row for {names[i]} (the first is line {found[i][1]})")
        found[i] = (row[1].split()[0], reader.line_num)
    missing = [name for name, label in zip(names, found) if label is None]
    if missing:
        raise DataError(f"{path}: no row for the image {os.path.join(folder, missing[0])}"
                        + (f" (nor for {len(missing) - 1} more of its {len(names)})" if len(missing) > 1 else ""))
    return found


def numbered(labels, path, classes=None, classes_path=None):
    """``(indices, classes)`` of ``labels`` ``[(word, line)]``: integers as they are (``classes`` unchanged,
    None without it); else class names, numbered by their place in ``classes`` (the names of ``classes_path``)
    or, without it, in the sorted names found (returned as the ``classes``)."""
    words = [word for word, _ in labels]
    if all(INTEGER.match(word) for word in words):
        for word, line in labels:
            if int(word) < 0:
                raise DataError(f"{path}: line {line}: label {int(word)} is negative (labels are classes 0, 1, ...)")
            if classes is not None and int(word) >= len(classes):
                raise DataError(f"{path}: line {line}: label {int(word)} lies outside the classes 0.."
                                f"{len(classes) - 1} of {classes_path}")
        return [int(word) for word in words], classes
    if classes is None:
        classes = sorted(set(words))
    place = {name: i for i, name in enumerate(classes)}
    for word, line in labels:
        if word not in place:
            raise DataError(f"{path}: line {line}: the label {unknown(word, classes, classes_path)}")
    return [place[word] for word in words], classes


def unknown(name, classes, source):
    """``'n0175174' is not among the 1000 classes of train.h5 (the nearest: 'n01751748')``."""
    nearest = difflib.get_close_matches(name, classes, n=1)
    return (f"{name!r} is not among the {len(classes)} classes of {source}"
            + (f" (the nearest: {nearest[0]!r})" if nearest else ""))


def training_statistics(path):
    """The ``(mean, std)`` per channel stored with the dataset at ``path`` (a training set given as ``--classes``),
    as training reads them (:class:`~spmdcnn.io.dataset.HDF5Dataset`: one value stands for every channel), or
    None when ``path`` is not a dataset or has none: a held-out set is normalised as its training set is."""
    if not (path and os.path.isfile(path) and h5py.is_hdf5(path)):
        return None
    data = HDF5Dataset(path, shuffle=False)
    try:
        return None if data.mean is None or data.std is None else (data.mean, data.std)
    finally:
        data.close()
