"""A global batch as the tiles of a plan read it: each tile takes only its box of the samples and its samples'
answers. One class serves every source: reads from a dataset file as a tile asks (``io/dataset.py``), the boxes
worker processes read ahead (``io/prefetch.py``) and arrays in memory (``runtime/executor.array_batch``)."""


class Batch:
    """``size`` samples; ``images(box, steps=None)`` is the box ``(n, c, spatial...)`` of the samples in global
    batch coordinates (with ``steps``, every step-th element along each axis), ``answers(box)`` the answers in
    ``box`` (the samples' range, then for masks the spatial ranges): labels, masks (N, S...), or targets (K per
    sample) for a regression loss. ``read(box, steps)`` and ``answers(box)`` are the source's functions."""

    def __init__(self, size, read, answers):
        self.size, self._read, self._answers = size, read, answers

    def images(self, box, steps=None):
        return self._read(box, steps)

    def answers(self, box):
        return self._answers(tuple(box))
