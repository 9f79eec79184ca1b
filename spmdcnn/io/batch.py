"""A global batch as the tiles of a plan read it: each tile takes only its box of the images and its samples'
labels. One class serves every source: reads from a dataset file as a tile asks (``io/dataset.py``), the boxes
worker processes read ahead (``io/prefetch.py``) and arrays in memory (``runtime/executor.array_batch``)."""


class Batch:
    """``size`` samples; ``images(box, steps=None)`` is the box ``(n, c, h, w)`` of their images in global batch
    coordinates (with ``steps``, every step-th element along each axis), ``labels(lo, hi)`` the labels of samples
    ``lo..hi-1``. ``read(box, steps)`` and ``labels(lo, hi)`` are the source's functions."""

    def __init__(self, size, read, labels):
        self.size, self._read, self._labels = size, read, labels

    def images(self, box, steps=None):
        return self._read(box, steps)

    def labels(self, lo, hi):
        return self._labels(lo, hi)
