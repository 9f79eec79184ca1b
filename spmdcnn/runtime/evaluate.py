"""Evaluation of a held-out dataset under any plan: every sample once, in order, in batches of the plan's size.

The plan fixes the global batch, so the last batch is padded: its padding samples read as zeros and carry the
label -1, which the loss leaves out and no prediction matches (``ops/loss.py``). Batch normalization uses its
running statistics and dropout is off, so the padding changes nothing of the real samples' results. The batches
are read as training's are (:class:`~spmdcnn.io.prefetch.Loader`): by worker processes reading ahead, or with
``workers`` 0 by the rank when each batch is taken; images at their center crop, never flipped.
"""

from ..io.prefetch import Loader, evaluation_batches


def evaluate(executor, source, batch, dtype, workers=0, prefetch=2, timeout=300.0):
    """``(loss, accuracy)`` of the model over every sample of ``source``: the mean loss per sample and the
    fraction predicted right (collective: every rank of the executor's world calls it). ``workers``,
    ``prefetch``, ``timeout``: as the job's ``data`` keys (resolved)."""
    total = source.num_samples
    steps = -(-total // batch)
    loss = correct = 0.0
    with Loader(source, executor.data_reads(batch), batch, dtype, None, 0, steps, workers, prefetch, timeout,
                batches=evaluation_batches(total, batch)) as loader:
        for step in range(steps):
            part, _ = loader.next(step)
            mean, right, _ = executor.forward(part, training=False)
            loss += mean * batch            # the padding adds nothing to the sum
            correct += right
    return loss / total, correct / total
