"""``spmdcnn data convert``: image folders and NumPy arrays into the HDF5 dataset format
(docs/formats.md#dataset-files).

Both stream: images are read, resized and written a block at a time into a dataset of known size, so datasets
larger than memory convert (NumPy arrays are memory-mapped). The per-channel ``mean`` and ``std`` (of the
images as training reads them: uint8 over 255) are summed along the way and stored, unless told not to. The file
is written aside and renamed into place when complete, ``chunk`` images to an HDF5 chunk (one by default: a
shuffled read of a sample then touches that sample alone; 0: one contiguous array).

- **A folder** holds one sub-folder per class (their sorted names give labels 0, 1, ...; stored as the
  ``classes`` attribute), each with image files Pillow reads (PNG, JPEG, BMP, GIF, TIFF, WebP, ...); or, with
  ``labels``, the image files themselves, labelled by a text or CSV file (ImageNet's validation set comes so:
  :mod:`spmdcnn.io.labels`). Class names number as in ``classes`` (a training set's file, whose mean and std the
  held-out file then shares) where given, else in sorted order. Every image becomes RGB (or one channel with
  ``grayscale``) and is fitted to ``size`` (height, width) with Lanczos filtering (:func:`_image_reader`:
  stretched, or its shorter side resized and the center cut); without ``size`` every image must already have the
  first one's size. With
  ``workers`` > 1, worker processes (:mod:`spmdcnn.io.workers`) decode the images; the file written is the same.
- **Arrays**: ``images`` (N, C, H, W) or (N, H, W, C), uint8 or float32, and ``labels`` (N,) integers, as
  ``.npy`` files. Which layout is said by ``channels_last`` (``--channels-first``/``--channels-last``), or read
  from the shape when unambiguous (:func:`_is_channels_last`).

Both take a ``progress``: None (nothing shown), or a function of the image count that returns a
:class:`spmdcnn.progress.Progress` (or anything with its ``update`` and context manager), told the images done so
far: for a folder after each image is decoded (decoding is what takes the time, and a block may hold thousands of
small images), for arrays after each block is written.
"""

import contextlib
import itertools
import os

import numpy as np

from .dataset import DataError, write_blocks
from .labels import load_classes, numbered, read_labels, training_statistics, unknown
from .pictures import SUFFIXES, fitted, images_in  # noqa: F401  (SUFFIXES: what a folder's images are)
from .samples import axes_text, kind as samples_kind
from .workers import Worker, close_all

BLOCK_BYTES = 32 << 20      # images per block written: about this many bytes
CHANNEL_COUNTS = (1, 3, 4)  # what an images array's channel dim may be when its layout is read from its shape
FITS = ("stretch", "crop")
DECODE_BATCH = 32           # image files a worker decodes per message (fewer when there are few files)
IN_FLIGHT = 3               # messages queued at each worker, so that none waits for its next one
DECODE_TIMEOUT_S = 600.0    # how long one message's images may take to decode


class _Moments:
    """Per-channel sums of values and squares, in float64, for the mean and std."""

    def __init__(self, channels):
        self.count, self.total, self.squares = 0, np.zeros(channels), np.zeros(channels)

    def add(self, block, step=1 << 20):
        """Add the samples ``block`` (N, C, S...), about ``step`` values at a time (float64 copies stay small)."""
        scale = 255 if block.dtype == np.uint8 else 1
        rows = max(1, step // max(1, block[0].size))
        axes = (0,) + tuple(range(2, block.ndim))
        for i in range(0, len(block), rows):
            values = block[i:i + rows].astype(np.float64) / scale
            self.count += values.size // values.shape[1]
            self.total += values.sum(axis=axes)
            self.squares += np.square(values).sum(axis=axes)

    def result(self):
        """``(mean, std)`` (a constant channel's std taken as 1), or None before any value."""
        if not self.count:
            return None
        mean = self.total / self.count
        std = np.sqrt(np.maximum(self.squares / self.count - mean ** 2, 0))
        return mean, np.where(std > 0, std, 1.0)


def _write(output, shape, dtype, labels, blocks, normalize, attrs, bar=None, chunk=1, statistics=None):
    """Write the images ``blocks`` yields (:func:`~spmdcnn.io.dataset.write_blocks`, ``chunk`` images to an HDF5
    chunk), with their per-channel mean and std when ``normalize`` (``statistics``: the ``(mean, std)`` to store
    instead of those measured); ``bar``, when given, is told the images written so far."""
    moments = _Moments(shape[0])

    def measured():
        done = 0
        for block in blocks:
            if normalize:
                moments.add(block)
            yield block
            done += len(block)      # write_blocks asks for the next block once this one is written
            if bar is not None:
                bar.update(done)
    if statistics is not None and len(statistics[0]) != shape[0]:
        raise DataError(f"{output}: the training set's mean and std hold {len(statistics[0])} channels, the images "
                        f"{shape[0]}")
    write_blocks(output, shape, dtype, labels, measured(),
                 (statistics or moments.result) if normalize else None, attrs, chunk=chunk)


def _checked_chunk(chunk):
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 0:
        raise DataError(f"--chunk must be a number of images per HDF5 chunk, or 0 for one contiguous array; got "
                        f"{chunk!r}")
    return int(chunk)


def _opened(progress, total):
    """The Progress ``progress(total)``, or a context that gives None without one."""
    return progress(total) if progress else contextlib.nullcontext()


def _block_size(shape, itemsize):
    return max(1, BLOCK_BYTES // max(1, int(np.prod(shape)) * itemsize))


def convert_arrays(images_path, labels_path, output, channels_last=None, normalize=True, progress=None, chunk=1,
                   targets=False):
    """Convert ``.npy`` samples and their labels, or (``targets``) their targets (N, K); returns ``(count, (C,
    S...))``. The samples are images (N, C, H, W), volumes (N, C, D, H, W) or sequences (N, C, W), or the same with
    the channels last. ``channels_last``: True if the channels are last, False if second, None (the default) to
    read it from their shape, refusing a shape that does not tell (:func:`_is_channels_last`). ``progress``,
    ``chunk``: see the module's docstring."""
    chunk = _checked_chunk(chunk)
    images, labels = _load_arrays(images_path, labels_path, targets)
    if _is_channels_last(images.shape, channels_last, images_path):
        images = np.moveaxis(images, -1, 1)             # (N, C, S...), a view of the memory map
    shape = tuple(images.shape[1:])
    step = _block_size(shape, images.dtype.itemsize)
    blocks = (np.ascontiguousarray(images[i:i + step]) for i in range(0, len(images), step))
    with _opened(progress, len(images)) as bar:
        _write(output, shape, images.dtype, labels, blocks, normalize,
               {"description": f"converted from {os.path.basename(images_path)} and {os.path.basename(labels_path)}"},
               bar, chunk)
    return len(images), shape


def _load_arrays(images_path, labels_path, targets=False):
    """``(samples, answers)`` memory-mapped from their ``.npy`` files: 3- to 5-dimensional uint8 or float32 samples,
    as many non-negative integer labels, or (``targets``) float targets (N, K); DataError naming the file
    otherwise."""
    arrays = []
    for path in (images_path, labels_path):
        try:
            array = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as error:
            raise DataError(f"{path}: cannot read the array: {error}") from None
        if not isinstance(array, np.ndarray):
            raise DataError(f"{path}: expected one array (.npy), got an archive of several (.npz): save each with "
                            "numpy.save")
        arrays.append(array)
    images, labels = arrays
    if not 3 <= images.ndim <= 5 or images.dtype not in (np.uint8, np.float32):
        raise DataError(f"{images_path}: expected (N, C, H, W) or (N, H, W, C) images, (N, C, D, H, W) or (N, D, H, "
                        f"W, C) volumes, uint8 or float32, got {images.shape} {images.dtype}")
    if targets:
        if labels.ndim != 2 or len(labels) != len(images) or labels.dtype.kind != "f" \
                or not np.isfinite(labels).all():
            raise DataError(f"{labels_path}: expected targets ({images.shape[0]}, K), finite floats, got "
                            f"{labels.shape} {labels.dtype}")
        return images, np.asarray(labels, dtype=np.float32)
    if labels.shape != images.shape[:1] or labels.dtype.kind not in "iu":
        raise DataError(f"{labels_path}: expected {images.shape[0]} integer labels, got {labels.shape} {labels.dtype}")
    if len(labels) and int(labels.min()) < 0:
        raise DataError(f"{labels_path}: labels must be non-negative (classes 0, 1, ...), got {int(labels.min())}")
    return images, labels


def _axes(ndim):
    """``(first, last)``: the layouts of samples of ``ndim`` dims (the batch's included) in words."""
    spatial = axes_text(ndim - 2)
    return f"(N, C, {spatial})", f"(N, {spatial}, C)"


def _is_channels_last(shape, channels_last, path):
    """Whether samples of ``shape`` (3 to 5 dims) have their channels last. ``channels_last`` when it is True or
    False; when None, channels second if the second dim is a channel count (CHANNEL_COUNTS) and the last is not,
    and any other shape is refused (DataError) with the option that says which it is."""
    if channels_last is not None:
        return bool(channels_last)
    first, last = shape[1] in CHANNEL_COUNTS, shape[-1] in CHANNEL_COUNTS
    if first and not last:
        return False
    (before, after), kind = _axes(len(shape)), samples_kind(len(shape) - 2)
    what, counts = f"{path}: {kind} of shape {tuple(shape)}", "a channel count (1, 3 or 4)"
    if last and not first:
        raise DataError(f"{what} look like {after}, {_read_as(shape, True)}: the last dim ({shape[-1]}) is "
                        f"{counts} and the second ({shape[1]}) is not; pass --channels-last (or --channels-first "
                        f"if they really are {before}, {_read_as(shape, False)})")
    how = (f"the second dim ({shape[1]}) and the last ({shape[-1]}) could both be {counts}" if first else
           f"neither the second dim ({shape[1]}) nor the last ({shape[-1]}) is {counts}")
    raise DataError(f"{what} are ambiguous: {how}; pass --channels-first if they are {before}, "
                    f"{_read_as(shape, False)}, or --channels-last if they are {after}, {_read_as(shape, True)}")


def _read_as(shape, channels_last):
    """How ``shape`` reads in a layout: ``3 channels of 6 x 5 (H x W)``."""
    C = shape[-1] if channels_last else shape[1]
    spatial = shape[1:-1] if channels_last else shape[2:]
    return f"{C} channel{'s' * (C != 1)} of {' x '.join(map(str, spatial))} ({axes_text(len(spatial), ' x ')})"


def list_folder(folder, labels=None, classes=None):
    """``(classes, [(path, label)])`` of an image folder, its image files in sorted order: those of its class
    sub-folders, labelled by the sub-folder's place among them (sorted), or in ``classes``; or, with ``labels``
    (a label file, :func:`~spmdcnn.io.labels.read_labels`), those of the folder itself, labelled by that file
    (:func:`~spmdcnn.io.labels.numbered`). ``classes``: None, or the file of the class names
    (:func:`~spmdcnn.io.labels.load_classes`); the ``classes`` returned are None for integer labels without it."""
    if not os.path.isdir(folder):
        raise DataError(_not_a_folder(folder))
    names = load_classes(classes) if classes is not None else None
    sub_folders = sorted(name for name in os.listdir(folder) if os.path.isdir(os.path.join(folder, name)))
    if labels is not None:
        if sub_folders:
            raise DataError(f"{folder}: has class sub-folders ({_few(sub_folders)}) and --labels {labels} was "
                            "given: a folder of class sub-folders takes its labels from them; --labels is for one "
                            "folder of images")
        found = images_in(folder)
        indices, names = numbered(read_labels(labels, folder, found), labels, names, classes)
        return names, [(os.path.join(folder, name), label) for name, label in zip(found, indices)]
    if not sub_folders:
        raise DataError(f"{folder}: no class sub-folders (expected one sub-folder of images per class, or one folder "
                        "of images with --labels)")
    place = {name: i for i, name in enumerate(names or sub_folders)}
    files = []
    for name in sub_folders:
        if name not in place:
            raise DataError(f"{os.path.join(folder, name)}: the class folder {unknown(name, names, classes)}")
        files += [(os.path.join(folder, name, entry), place[name])
                  for entry in images_in(os.path.join(folder, name))]
    return names or sub_folders, files


def _few(names, shown=3):
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _not_a_folder(path):
    """What is wrong with a ``path`` to convert that is not a folder."""
    expected = "expected an image folder, one sub-folder of images per class, or an images .npy with --labels"
    if not os.path.exists(path):
        return f"{path}: does not exist ({expected})"
    if str(path).lower().endswith(".npy"):
        return f"{path}: an images .npy needs its labels: give --labels LABELS.npy (an .npy of N integers)"
    return f"{path}: not a folder ({expected})"


def convert_folder(folder, output, size=None, grayscale=False, normalize=True, progress=None, *, labels=None,
                   classes=None, fit="stretch", workers=0, chunk=1, masks=None, mask_values=None):
    """Convert an image folder; returns ``(count, (C, H, W), classes)``. ``size``: (H, W) to fit every image to,
    as ``fit`` says (:func:`_image_reader`). ``labels``: the label file of a folder of images (:func:`list_folder`),
    ``classes``: the file of the class names (a training set's dataset: its mean and std are stored too,
    :func:`~spmdcnn.io.labels.training_statistics`). ``masks``: instead of labels, the folder of the images' masks
    (segmentation, :mod:`spmdcnn.io.masks`; ``mask_values``: the file mapping their values to classes).
    ``workers``: the processes that decode the images (0 or 1: this one). ``progress``, ``chunk``: see the
    module's docstring."""
    chunk = _checked_chunk(chunk)
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 0:
        raise DataError(f"--workers must be 0 or more, got {workers!r}")
    read = _image_reader(size, grayscale, fit)
    statistics = training_statistics(classes)
    if masks is not None:
        answers, classes, paths = _masked(folder, masks, mask_values, classes, size, fit)
    else:
        classes, files = list_folder(folder, labels, classes)
        paths, answers = [path for path, _ in files], [label for _, label in files]
    setup = ("spmdcnn.io.convert", "_decoder", {"size": size, "grayscale": grayscale, "fit": fit})
    attrs = {"description": f"converted from the image folder {os.path.abspath(folder)}"
                            + (f" and the masks in {os.path.abspath(masks)}" if masks is not None else "")}
    if classes is not None:
        attrs["classes"] = classes
    with _opened(progress, len(paths)) as bar, \
            contextlib.closing(_decoded(paths, read, setup, workers, folder)) as images:
        first = next(images)
        if masks is not None:
            answers = answers(first.shape[1:])
        _write(output, first.shape, np.uint8, answers, _stacked(itertools.chain([first], images), paths,
                                                                 first.shape, bar), normalize, attrs, chunk=chunk,
               statistics=statistics)
    return len(paths), first.shape, classes


def _masked(folder, masks, mask_values, classes, size, fit):
    """``(masks of the images' shape, classes, image paths)`` of a folder of images and its folder of masks
    (:mod:`spmdcnn.io.masks`): the masks as a function of the images' (H, W), which the first image gives."""
    from .masks import mask_dtype, mask_reader, paired, read_value_map
    if not os.path.isdir(folder):
        raise DataError(_not_a_folder(folder))
    if not os.path.isdir(masks):
        raise DataError(f"--masks {masks}: not a folder (expected a folder of masks, one per image)")
    names = images_in(folder)
    mask_paths = paired(folder, names, masks)
    paths = [os.path.join(folder, name) for name in names]
    read = mask_reader(size, fit, read_value_map(mask_values))

    def answers(shape):
        found = np.empty((len(paths),) + tuple(shape), dtype=np.int16)     # classes, held in 2 bytes a pixel
        limits = np.iinfo(found.dtype)
        for k, (mask, image) in enumerate(zip(mask_paths, paths)):
            value = read(mask, image)
            if value.shape != tuple(shape):
                raise DataError(f"{mask}: the mask is {value.shape[0]} x {value.shape[1]} (H x W) once fitted, the "
                                f"images {shape[0]} x {shape[1]}: give --size H W to fit them all")
            if value.size and (value.min() < limits.min or value.max() > limits.max):
                raise DataError(f"{mask}: a class value {int(value.max())} or {int(value.min())} outside "
                                f"[{limits.min}, {limits.max}]: a mask's values are classes")
            found[k] = value
        dtype = mask_dtype(found)
        return found if dtype == found.dtype else found.astype(dtype)
    return answers, load_classes(classes) if classes is not None else None, paths


def _stacked(images, paths, shape, bar):
    """The ``images`` of ``paths`` (in that order), all of ``shape``, in blocks (n, C, H, W) of about BLOCK_BYTES;
    ``bar``, when given, told the images done after each. DataError naming a file whose image is not of ``shape``."""
    step, block = _block_size(shape, 1), []
    for done, (path, image) in enumerate(zip(paths, images), 1):
        if image.shape != shape:
            raise DataError(f"{path}: the image is {image.shape[1]} x {image.shape[2]} (H x W), the first one "
                            f"{shape[1]} x {shape[2]}: give --size H W to resize them all")
        block.append(image)
        if bar is not None:
            bar.update(done)
        if len(block) == step or done == len(paths):
            yield np.stack(block)
            block = []


def _decoded(paths, read, setup, workers, folder):
    """The images of ``paths``, in order: read here by ``read``, or with ``workers`` > 1 by that many worker
    processes made by ``setup`` (:func:`_decoder`). Batch ``k`` (DECODE_BATCH paths, fewer when there are few, so
    that every worker gets IN_FLIGHT) goes to worker ``k % workers``, which answers its batches in order; each
    worker has IN_FLIGHT batches queued, and gets the next of its own when one comes back. The workers end when
    the generator does (closed, or on an error)."""
    batch = max(1, min(DECODE_BATCH, -(-len(paths) // (max(1, workers) * IN_FLIGHT))))
    batches = [paths[i:i + batch] for i in range(0, len(paths), batch)]
    workers = min(workers, len(batches))
    if workers <= 1:
        yield from map(read, paths)
        return
    started = []
    try:
        for k in range(workers):
            started.append(Worker(setup, f"convert worker {k + 1} of {workers} decoding {folder}"))
        for k in range(min(len(batches), workers * IN_FLIGHT)):
            started[k % workers].send(batches[k])
        for k in range(len(batches)):
            worker = started[k % workers]
            answer = worker.receive(DECODE_TIMEOUT_S)
            if k + workers * IN_FLIGHT < len(batches):
                worker.send(batches[k + workers * IN_FLIGHT])
            for image in answer:
                if isinstance(image, str):      # the message of a file it could not read
                    raise DataError(image)
                yield image
    except BaseException:                       # an error, or the generator closed early: no reads to finish
        close_all(started, grace=0)
        raise
    close_all(started)


def _decoder(size, grayscale, fit):
    """In a worker: a function of a list of image paths that gives their pixels (:func:`_image_reader`), up to
    and including, in place of an image, the message of the first it cannot read."""
    read = _image_reader(size, grayscale, fit)

    def decode(paths):
        images = []
        for path in paths:
            try:
                images.append(read(path))
            except DataError as error:
                images.append(str(error))
                break
        return images
    return decode


def _image_reader(size, grayscale, fit="stretch"):
    """A function of an image file's path that gives its pixels, (C, H, W) uint8: RGB, or one channel when
    ``grayscale``, fitted to ``size`` (H, W) unless None, with Lanczos filtering. ``fit``: ``stretch`` resizes
    to H x W; ``crop`` resizes an h x w image by s = max(H / h, W / w) (to round(h s) x round(w s), at least
    H x W), keeping its aspect, and cuts the H x W at its center (from row (round(h s) - H) // 2, column
    (round(w s) - W) // 2). DataError naming the file it cannot read."""
    try:
        from PIL import Image
    except ImportError:
        raise DataError("converting image folders needs Pillow: pip install pillow (or spmdcnn[images])") from None
    if size is not None and min(size) <= 0:
        raise DataError(f"--size must be positive, got {size[0]} x {size[1]} (H x W)")
    if fit not in FITS:
        raise DataError(f"--fit must be one of {', '.join(FITS)}, got {fit!r}")
    if fit == "crop" and size is None:
        raise DataError("--fit crop cuts the center H x W of each image: it needs --size H W")
    mode, channels = ("L", 1) if grayscale else ("RGB", 3)

    def read(path):
        try:
            with Image.open(path) as image:
                image = image.convert(mode)
                if size is not None:
                    image = fitted(image, size, fit, Image.Resampling.LANCZOS)
                array = np.asarray(image, dtype=np.uint8)
        except (OSError, ValueError) as error:
            raise DataError(f"{path}: cannot read the image: {error}") from None
        # (C, H, W), laid out so in memory as a worker's pickled answer is: blocks stacked from either are summed
        # in the same order, to the same mean and std
        return np.ascontiguousarray(array.reshape(array.shape[0], array.shape[1], channels).transpose(2, 0, 1))
    return read
