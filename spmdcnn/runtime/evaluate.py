"""Evaluation of a held-out dataset under any plan: every sample once, in order, in batches of the plan's size.

The plan fixes the global batch, so the last batch is padded: its padding samples read as zeros and carry the
label -1, which the loss leaves out and no prediction matches (``ops/loss.py``). Batch normalization uses its
running statistics and dropout is off, so the padding changes nothing of the real samples' results.
"""

import numpy as np

from ..io.dataset import Batch


class PaddedBatch(Batch):
    """Samples ``indices`` of ``source`` followed by ``size - len(indices)`` padding samples."""

    def __init__(self, source, indices, size, dtype):
        super().__init__(source, indices, dtype)
        self.real, self.size = len(self.indices), size

    def images(self, box, steps=None):
        (n0, n1), *region = box
        real = super().images(((n0, min(n1, self.real)),) + tuple(region), steps) if n0 < self.real else None
        if n1 <= self.real and real is not None:
            return real
        shape = self.source.read(self.indices[:0], self.dtype, region, None if steps is None else steps[1:])[0].shape
        padding = np.zeros((n1 - max(n0, self.real),) + shape[1:], dtype=self.dtype)
        return padding if real is None else np.concatenate([real, padding])

    def labels(self, lo, hi):
        real = self.source.read_labels(self.indices[lo:min(hi, self.real)]) if lo < self.real else np.zeros(0, int)
        return np.concatenate([real, np.full(max(0, hi - max(lo, self.real)), -1, dtype=np.int64)])


def evaluate(executor, source, batch, dtype):
    """``(loss, accuracy)`` of the model over every sample of ``source``: the mean loss per sample and the
    fraction predicted right (collective: every rank of the executor's world calls it)."""
    total = source.num_samples
    loss = correct = 0.0
    for start in range(0, total, batch):
        part = PaddedBatch(source, np.arange(start, min(start + batch, total)), batch, dtype)
        mean, right, _ = executor.forward(part, training=False)
        loss += mean * batch            # the padding adds nothing to the sum
        correct += right
    return loss / total, correct / total
