"""``spmdcnn data convert``: image folders and NumPy arrays into the HDF5 dataset format
(docs/formats.md#dataset-files).

Both stream: images are read, resized and written a block at a time into a dataset of known size, so datasets
larger than memory convert (NumPy arrays are memory-mapped). The per-channel ``mean`` and ``std`` (of the
images as training reads them: uint8 over 255) are summed along the way and stored, unless told not to. The file
is written aside and renamed into place when complete.

- **A folder** holds one sub-folder per class (their sorted names give labels 0, 1, ...; stored as the
  ``classes`` attribute), each with image files Pillow reads (PNG, JPEG, BMP, GIF, TIFF, WebP, ...). Every image
  becomes RGB (or one channel with ``grayscale``) and is resized to ``size`` (height, width) with Lanczos
  filtering; without ``size`` every image must already have the first one's size.
- **Arrays**: ``images`` (N, C, H, W) or (N, H, W, C), uint8 or float32, and ``labels`` (N,) integers, as
  ``.npy`` files. Which layout is said by ``channels_last`` (``--channels-first``/``--channels-last``), or read
  from the shape when unambiguous (:func:`_is_channels_last`).

Both take a ``progress``: None (nothing shown), or a function of the image count that returns a
:class:`spmdcnn.progress.Progress` (or anything with its ``update`` and context manager), told the images done so
far: for a folder after each image is read (decoding is what takes the time, and a block may hold thousands of small
images), for arrays after each block is written.
"""

import contextlib
import os

import numpy as np

from .dataset import DataError, write_blocks

BLOCK_BYTES = 32 << 20      # images per block written: about this many bytes
CHANNEL_COUNTS = (1, 3, 4)  # what an images array's channel dim may be when its layout is read from its shape
SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


class _Moments:
    """Per-channel sums of values and squares, in float64, for the mean and std."""

    def __init__(self, channels):
        self.count, self.total, self.squares = 0, np.zeros(channels), np.zeros(channels)

    def add(self, block, step=1 << 20):
        """Add the images ``block`` (N, C, H, W), about ``step`` values at a time (float64 copies stay small)."""
        scale = 255 if block.dtype == np.uint8 else 1
        rows = max(1, step // max(1, block[0].size))
        for i in range(0, len(block), rows):
            values = block[i:i + rows].astype(np.float64) / scale
            self.count += values.size // values.shape[1]
            self.total += values.sum(axis=(0, 2, 3))
            self.squares += np.square(values).sum(axis=(0, 2, 3))

    def result(self):
        """``(mean, std)`` (a constant channel's std taken as 1), or None before any value."""
        if not self.count:
            return None
        mean = self.total / self.count
        std = np.sqrt(np.maximum(self.squares / self.count - mean ** 2, 0))
        return mean, np.where(std > 0, std, 1.0)


def _write(output, shape, dtype, labels, blocks, normalize, attrs, bar=None):
    """Write the images ``blocks`` yields (:func:`~spmdcnn.io.dataset.write_blocks`), with their per-channel mean
    and std when ``normalize``; ``bar``, when given, is told the images written so far."""
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
    write_blocks(output, shape, dtype, labels, measured(), moments.result if normalize else None, attrs)


def _opened(progress, total):
    """The Progress ``progress(total)``, or a context that gives None without one."""
    return progress(total) if progress else contextlib.nullcontext()


def _block_size(shape, itemsize):
    return max(1, BLOCK_BYTES // max(1, int(np.prod(shape)) * itemsize))


def convert_arrays(images_path, labels_path, output, channels_last=None, normalize=True, progress=None):
    """Convert ``.npy`` images and labels; returns ``(count, (C, H, W))``. ``channels_last``: True if the images
    are (N, H, W, C), False if (N, C, H, W), None (the default) to read it from their shape, refusing a shape
    that does not tell (:func:`_is_channels_last`). ``progress``: see the module's docstring."""
    images, labels = _load_arrays(images_path, labels_path)
    if _is_channels_last(images.shape, channels_last, images_path):
        images = images.transpose(0, 3, 1, 2)          # (N, C, H, W), a view of the memory map
    shape = tuple(images.shape[1:])
    step = _block_size(shape, images.dtype.itemsize)
    blocks = (np.ascontiguousarray(images[i:i + step]) for i in range(0, len(images), step))
    with _opened(progress, len(images)) as bar:
        _write(output, shape, images.dtype, labels, blocks, normalize,
               {"description": f"converted from {os.path.basename(images_path)} and {os.path.basename(labels_path)}"},
               bar)
    return len(images), shape


def _load_arrays(images_path, labels_path):
    """``(images, labels)`` memory-mapped from their ``.npy`` files: 4-dimensional uint8 or float32 images, as
    many non-negative integer labels; DataError naming the file otherwise."""
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
    if images.ndim != 4 or images.dtype not in (np.uint8, np.float32):
        raise DataError(f"{images_path}: expected (N, C, H, W) or (N, H, W, C) images, uint8 or float32, got "
                        f"{images.shape} {images.dtype}")
    if labels.shape != images.shape[:1] or labels.dtype.kind not in "iu":
        raise DataError(f"{labels_path}: expected {images.shape[0]} integer labels, got {labels.shape} {labels.dtype}")
    if len(labels) and int(labels.min()) < 0:
        raise DataError(f"{labels_path}: labels must be non-negative (classes 0, 1, ...), got {int(labels.min())}")
    return images, labels


def _is_channels_last(shape, channels_last, path):
    """Whether images of ``shape`` (4 dims) are (N, H, W, C). ``channels_last`` when it is True or False; when
    None, (N, C, H, W) if the second dim is a channel count (CHANNEL_COUNTS) and the last is not, and any other
    shape is refused (DataError) with the option that says which it is."""
    if channels_last is not None:
        return bool(channels_last)
    first, last = shape[1] in CHANNEL_COUNTS, shape[3] in CHANNEL_COUNTS
    if first and not last:
        return False
    what, counts = f"{path}: images of shape {tuple(shape)}", "a channel count (1, 3 or 4)"
    if last and not first:
        raise DataError(f"{what} look like (N, H, W, C), {_read_as(shape, True)}: the last dim ({shape[3]}) is "
                        f"{counts} and the second ({shape[1]}) is not; pass --channels-last (or --channels-first "
                        f"if they really are (N, C, H, W), {_read_as(shape, False)})")
    how = (f"the second dim ({shape[1]}) and the last ({shape[3]}) could both be {counts}" if first else
           f"neither the second dim ({shape[1]}) nor the last ({shape[3]}) is {counts}")
    raise DataError(f"{what} are ambiguous: {how}; pass --channels-first if they are (N, C, H, W), "
                    f"{_read_as(shape, False)}, or --channels-last if they are (N, H, W, C), {_read_as(shape, True)}")


def _read_as(shape, channels_last):
    """How ``shape`` reads in a layout: ``3 channels of 6 x 5 (H x W)``."""
    _, C, H, W = (shape[0], shape[3], shape[1], shape[2]) if channels_last else shape
    return f"{C} channel{'s' * (C != 1)} of {H} x {W} (H x W)"


def list_folder(folder):
    """``(classes, [(path, label)])``: the class sub-folders of ``folder`` (sorted) and their image files."""
    if not os.path.isdir(folder):
        raise DataError(_not_a_folder(folder))
    classes = sorted(name for name in os.listdir(folder) if os.path.isdir(os.path.join(folder, name)))
    if not classes:
        raise DataError(f"{folder}: no class sub-folders (expected one sub-folder of images per class)")
    files = []
    for label, name in enumerate(classes):
        found = sorted(entry for entry in os.listdir(os.path.join(folder, name)) if entry.lower().endswith(SUFFIXES))
        if not found:
            raise DataError(f"{os.path.join(folder, name)}: no images (files ending in {', '.join(SUFFIXES)})")
        files += [(os.path.join(folder, name, entry), label) for entry in found]
    return classes, files


def _not_a_folder(path):
    """What is wrong with a ``path`` to convert that is not a folder."""
    expected = "expected an image folder, one sub-folder of images per class, or an images .npy with --labels"
    if not os.path.exists(path):
        return f"{path}: does not exist ({expected})"
    if str(path).lower().endswith(".npy"):
        return f"{path}: an images .npy needs its labels: give --labels LABELS.npy (an .npy of N integers)"
    return f"{path}: not a folder ({expected})"


def convert_folder(folder, output, size=None, grayscale=False, normalize=True, progress=None):
    """Convert an image folder; returns ``(count, (C, H, W), classes)``. ``size``: (H, W) to resize every image
    to. ``progress``: see the module's docstring."""
    read = _image_reader(size, grayscale)
    classes, files = list_folder(folder)
    first = read(files[0][0])
    shape = first.shape
    step = _block_size(shape, 1)

    def blocks(bar):
        for i in range(0, len(files), step):
            block = []
            for k, (path, _) in enumerate(files[i:i + step]):
                image = first if i + k == 0 else read(path)
                if image.shape != shape:
                    raise DataError(f"{path}: the image is {image.shape[1]} x {image.shape[2]} (H x W), the first "
                                    f"one {shape[1]} x {shape[2]}: give --size H W to resize them all")
                block.append(image)
                if bar is not None:
                    bar.update(i + k + 1)
            yield np.stack(block)
    with _opened(progress, len(files)) as bar:
        _write(output, shape, np.uint8, [label for _, label in files], blocks(bar), normalize,
               {"classes": classes, "description": f"converted from the image folder {os.path.abspath(folder)}"})
    return len(files), shape, classes


def _image_reader(size, grayscale):
    """A function of an image file's path that gives its pixels, (C, H, W) uint8: RGB, or one channel when
    ``grayscale``, resized to ``size`` (H, W) unless None; DataError naming the file it cannot read."""
    try:
        from PIL import Image
    except ImportError:
        raise DataError("converting image folders needs Pillow: pip install pillow (or spmdcnn[images])") from None
    if size is not None and min(size) <= 0:
        raise DataError(f"--size must be positive, got {size[0]} x {size[1]} (H x W)")
    mode, channels = ("L", 1) if grayscale else ("RGB", 3)

    def read(path):
        try:
            with Image.open(path) as image:
                image = image.convert(mode)
                if size is not None and image.size != (size[1], size[0]):     # Pillow's size is (W, H)
                    image = image.resize((size[1], size[0]), Image.Resampling.LANCZOS)
                array = np.asarray(image, dtype=np.uint8)
        except (OSError, ValueError) as error:
            raise DataError(f"{path}: cannot read the image: {error}") from None
        return array.reshape(array.shape[0], array.shape[1], channels).transpose(2, 0, 1)   # (C, H, W)
    return read
