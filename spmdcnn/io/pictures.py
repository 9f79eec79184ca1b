"""Image files as ``spmdcnn data convert`` finds and fits them: which files of a folder are images, and an image (or
a mask) fitted to a size, stretched or centre-cropped (``io/convert.py``, ``io/masks.py``)."""

import os

from .dataset import DataError

SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


def images_in(folder):
    """The sorted names of the image files in ``folder``; DataError if there are none."""
    with os.scandir(folder) as entries:          # is_file() needs no stat on most file systems
        found = sorted(entry.name for entry in entries if entry.name.lower().endswith(SUFFIXES) and entry.is_file())
    if not found:
        raise DataError(f"{folder}: no images (files ending in {', '.join(SUFFIXES)})")
    return found


def fitted(image, size, fit, resample):
    """A Pillow ``image`` fitted to ``size`` (H, W) as ``fit`` says, resized by ``resample`` (Lanczos for images,
    nearest for masks, whose values are classes): ``stretch`` resizes it to H x W; ``crop`` resizes an h x w image
    by s = max(H / h, W / w), keeping its aspect, and cuts the H x W at its centre."""
    H, W = size
    w, h = image.size                                           # Pillow's size is (W, H)
    if fit == "stretch":
        return image if (w, h) == (W, H) else image.resize((W, H), resample)
    s = max(H / h, W / w)
    w, h = max(W, round(w * s)), max(H, round(h * s))
    if image.size != (w, h):
        image = image.resize((w, h), resample)
    left, top = (w - W) // 2, (h - H) // 2
    return image.crop((left, top, left + W, top + H)) if (w, h) != (W, H) else image
