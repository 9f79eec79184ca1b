"""Segmentation masks for ``spmdcnn data convert FOLDER --masks MASKS``: a folder of images and a parallel folder of
masks, a class per pixel (docs/formats.md#dataset-files).

Image ``name.jpg`` pairs with the mask of the same name before its suffix (``name.png``, any image suffix); every
image needs a mask and every mask an image. A mask is read as what its pixels hold: a palette image (PNG mode
``P``, as Pascal VOC's) gives each pixel's palette index, a greyscale one its value; with a value map (``--mask-values
FILE``) each pixel's value, or for a colour mask its RGB colour, is looked up in the map, and a value the map lacks
is refused with the file and the value named. The value map is a text file of one entry a line, ``VALUE CLASS`` or
``R G B CLASS`` (``#`` starts a comment), ``CLASS`` an integer (the loss's ``ignore_index``, such as 255 or -1, to
leave those pixels out). A mask is fitted to the image's size as its image is (stretched or centre-cropped), by
nearest neighbour: its values are classes, never blends. A mask of another size than its image is refused with
both files named.
"""

import os

import numpy as np

from .dataset import DataError
from .pictures import fitted, images_in


def paired(folder, images, masks):
    """The mask path of each of ``images`` (names in ``folder``), from the mask folder ``masks`` (its image files,
    ``names``): the one of the same name before its suffix. DataError for an image without one (or with two), or a
    mask without an image."""
    by_stem = {}
    for name in images_in(masks):
        by_stem.setdefault(os.path.splitext(name)[0], []).append(name)
    stems = [os.path.splitext(name)[0] for name in images]
    result = []
    for name, stem in zip(images, stems):
        found = by_stem.get(stem, [])
        if len(found) != 1:
            what = "no mask" if not found else f"two masks ({', '.join(found)})"
            raise DataError(f"{masks}: {what} for the image {os.path.join(folder, name)} (a mask has its image's "
                            "name, any image suffix: name.png for name.jpg)")
        result.append(os.path.join(masks, found[0]))
    orphans = sorted(set(by_stem) - set(stems))
    if orphans:
        raise DataError(f"{masks}: the mask {by_stem[orphans[0]][0]} has no image in {folder}")
    return result


def read_value_map(path):
    """``{value: class}`` of a value map file: ``VALUE CLASS`` or ``R G B CLASS`` a line (values as ints, colours as
    (r, g, b) tuples). DataError naming the line of anything else."""
    if path is None:
        return None
    mapping = {}
    try:
        with open(path, encoding="utf-8") as stream:
            lines = stream.read().splitlines()
    except OSError as error:
        raise DataError(f"--mask-values {path}: cannot read it: {error}") from None
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        try:
            values = [int(word) for word in words]
        except ValueError:
            values = []
        if len(values) not in (2, 4):
            raise DataError(f"{path}, line {number}: expected 'VALUE CLASS' or 'R G B CLASS' (integers), got {line!r}")
        key = values[0] if len(values) == 2 else tuple(values[:3])
        if key in mapping:
            raise DataError(f"{path}, line {number}: the value {key} is mapped twice")
        mapping[key] = values[-1]
    if not mapping:
        raise DataError(f"{path}: no 'VALUE CLASS' or 'R G B CLASS' line")
    kinds = {isinstance(key, tuple) for key in mapping}
    if len(kinds) > 1:
        raise DataError(f"{path}: mixes grey values and RGB colours; a map is one or the other")
    return mapping


def mask_reader(size, fit, values):
    """A function of a mask's path and its image's path that gives the mask, (H, W) int64, fitted to ``size`` as the
    image is (nearest neighbour); ``values``: the value map, or None. DataError for a mask of another size than its
    image (before fitting)."""
    from PIL import Image
    colour = values is not None and isinstance(next(iter(values)), tuple)

    def read(path, image_path):
        try:
            with Image.open(image_path) as image:       # its header: the size before fitting
                image_size = image.size[::-1]
            with Image.open(path) as mask:
                if colour:
                    mask = mask.convert("RGB")
                elif mask.mode not in ("P", "L", "I", "I;16", "1"):
                    mask = mask.convert("L")
                if mask.size[::-1] != tuple(image_size):
                    raise DataError(f"{path}: the mask is {mask.size[1]} x {mask.size[0]} (H x W), its image "
                                    f"{image_path} {image_size[0]} x {image_size[1]}")
                if size is not None:
                    mask = fitted(mask, size, fit, Image.Resampling.NEAREST)
                array = np.asarray(mask).astype(np.int64)
        except OSError as error:
            raise DataError(f"{path}: cannot read the mask: {error}") from None
        return array if values is None else _mapped(array, values, path, colour)
    return read


def _mapped(array, values, path, colour):
    """The classes of a mask's pixel values (or RGB colours) by the value map."""
    if colour:
        codes = (array[..., 0] << 16) | (array[..., 1] << 8) | array[..., 2]
        table = {(r << 16) | (g << 8) | b: k for (r, g, b), k in values.items()}
    else:
        codes, table = array, values
    found, inverse = np.unique(codes, return_inverse=True)
    missing = [int(code) for code in found if int(code) not in table]
    if missing:
        code = missing[0]
        value = (code >> 16, (code >> 8) & 255, code & 255) if colour else code
        raise DataError(f"{path}: the value {value} is not in the value map (--mask-values)")
    return np.array([table[int(code)] for code in found], dtype=np.int64)[inverse].reshape(codes.shape)


def mask_dtype(masks):
    """The smallest integer type that holds every class of ``masks`` (uint8 for most)."""
    low, high = (int(masks.min()), int(masks.max())) if masks.size else (0, 0)
    for dtype in (np.uint8, np.int16, np.int32):
        if np.iinfo(dtype).min <= low and high <= np.iinfo(dtype).max:
            return dtype
    return np.int64
