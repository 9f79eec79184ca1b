"""``spmdcnn data convert``: image folders and NumPy arrays into the HDF5 dataset format (DESIGN.md §3.6).

Both stream: images are read, resized and written a block at a time into a dataset of known size, so datasets
larger than memory convert (NumPy arrays are memory-mapped). The per-channel ``mean`` and ``std`` (of the
images as training reads them: uint8 over 255) are summed along the way and stored, unless told not to. The file
is written aside and renamed into place when complete.

- **A folder** holds one sub-folder per class (their sorted names give labels 0, 1, ...; stored as the
  ``classes`` attribute), each with image files Pillow reads (PNG, JPEG, BMP, GIF, TIFF, WebP, ...). Every image
  becomes RGB (or one channel with ``grayscale``) and is resized to ``size`` (height, width) with Lanczos
  filtering; without ``size`` every image must already have the first one's size.
- **Arrays**: ``images`` (N, C, H, W), or (N, H, W, C) with ``channels_last``, uint8 or float32, and ``labels``
  (N,) integers, as ``.npy`` files.
"""

import os

import numpy as np

from .dataset import DataError, write_blocks

BLOCK_BYTES = 32 << 20      # images per block written: about this many bytes
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


def _write(output, shape, dtype, labels, blocks, normalize, attrs):
    """Write the images ``blocks`` yields (:func:`~spmdcnn.io.dataset.write_blocks`), with their per-channel mean
    and std when ``normalize``."""
    moments = _Moments(shape[0])

    def measured():
        for block in blocks:
            moments.add(block)
            yield block
    write_blocks(output, shape, dtype, labels, measured() if normalize else blocks,
                 moments.result if normalize else None, attrs)


def _block_size(shape, itemsize):
    return max(1, BLOCK_BYTES // max(1, int(np.prod(shape)) * itemsize))


def convert_arrays(images_path, labels_path, output, channels_last=False, normalize=True):
    """Convert ``.npy`` images and labels; returns ``(count, (C, H, W))``."""
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
        raise DataError(f"{images_path}: expected (N, C, H, W) images, uint8 or float32 (or (N, H, W, C) with "
                        f"--channels-last), got {images.shape} {images.dtype}")
    if labels.shape != images.shape[:1] or labels.dtype.kind not in "iu":
        raise DataError(f"{labels_path}: expected {images.shape[0]} integer labels, got {labels.shape} {labels.dtype}")
    if len(labels) and int(labels.min()) < 0:
        raise DataError(f"{labels_path}: labels must be non-negative (classes 0, 1, ...), got {int(labels.min())}")
    if channels_last:
        images = images.transpose(0, 3, 1, 2)
    shape = tuple(images.shape[1:])
    step = _block_size(shape, images.dtype.itemsize)
    blocks = (np.ascontiguousarray(images[i:i + step]) for i in range(0, len(images), step))
    _write(output, shape, images.dtype, labels, blocks, normalize,
           {"description": f"converted from {os.path.basename(images_path)} and {os.path.basename(labels_path)}"})
    return len(images), shape


def list_folder(folder):
    """``(classes, [(path, label)])``: the class sub-folders of ``folder`` (sorted) and their image files."""
    if not os.path.isdir(folder):
        raise DataError(f"{folder}: not a folder (expected one sub-folder of images per class)")
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


def convert_folder(folder, output, size=None, grayscale=False, normalize=True):
    """Convert an image folder; returns ``(count, (C, H, W), classes)``."""
    try:
        from PIL import Image
    except ImportError:
        raise DataError("converting image folders needs Pillow: pip install pillow (or spmdcnn[images])") from None
    if size is not None and min(size) <= 0:
        raise DataError(f"--size must be positive, got {size[0]} x {size[1]}")
    classes, files = list_folder(folder)
    mode, channels = ("L", 1) if grayscale else ("RGB", 3)

    def read(path):
        try:
            with Image.open(path) as image:
                image = image.convert(mode)
                if size is not None and image.size != (size[1], size[0]):
                    image = image.resize((size[1], size[0]), Image.Resampling.LANCZOS)
                array = np.asarray(image, dtype=np.uint8)
        except (OSError, ValueError) as error:
            raise DataError(f"{path}: cannot read the image: {error}") from None
        return array.reshape(array.shape[0], array.shape[1], channels).transpose(2, 0, 1)

    first = read(files[0][0])
    shape = first.shape
    step = _block_size(shape, 1)

    def blocks():
        for i in range(0, len(files), step):
            block = [first if i + k == 0 else read(path) for k, (path, _) in enumerate(files[i:i + step])]
            for (path, _), image in zip(files[i:i + step], block):
                if image.shape != shape:
                    raise DataError(f"{path}: the image is {image.shape[2]}x{image.shape[1]}, the first one "
                                    f"{shape[2]}x{shape[1]}: give --size H W to resize them all")
            yield np.stack(block)
    _write(output, shape, np.uint8, [label for _, label in files], blocks(), normalize,
           {"classes": classes, "description": f"converted from the image folder {os.path.abspath(folder)}"})
    return len(files), shape, classes
