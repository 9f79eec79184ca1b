"""Evaluation of a held-out dataset under any plan: every sample once, in order, in batches of the plan's size.

The plan fixes the global batch, so the last batch is padded: its padding samples read as zeros and carry the
label -1 (or a row of NaN targets), which the loss leaves out and no prediction matches (``ops/loss.py``,
``ops/mse.py``). Batch normalization uses its
running statistics and dropout is off, so the padding changes nothing of the real samples' results. The batches
are read as training's are (:class:`~spmdcnn.io.prefetch.Loader`): by worker processes reading ahead, or with
``workers`` 0 by the rank when each batch is taken; images at their center crop, never flipped.
"""

from ..io.prefetch import Loader, evaluation_batches


def evaluation_loader(executor, source, batch, dtype, workers=0, prefetch=2, timeout=300.0, local_ranks=1):
    """The loader of one evaluation of ``source`` in batches of ``batch``; :meth:`~spmdcnn.io.prefetch.Loader.again`
    makes it read the next evaluation with the same workers. ``workers``, ``prefetch``, ``timeout``: as the job's
    ``data`` keys; ``local_ranks``: the ranks on this node."""
    return Loader(source, executor.data_reads(batch), batch, dtype, None, 0, -(-source.num_samples // batch),
                  workers, prefetch, timeout, batches=evaluation_batches(source.num_samples, batch),
                  local_ranks=local_ranks)


def evaluate(executor, source, batch, dtype, workers=0, prefetch=2, timeout=300.0, loader=None):
    """``(loss, score)`` of the model over every sample of ``source``: the mean loss per sample and the fraction
    predicted right, or for a regression loss the mean absolute error over samples and targets (collective: every
    rank of the executor's world calls it). ``loader``: an
    :func:`evaluation_loader` of an earlier evaluation to read with again (else one is made and closed)."""
    own = loader is None
    if own:
        loader = evaluation_loader(executor, source, batch, dtype, workers, prefetch, timeout)
    elif loader.next_step == loader.stop:       # read to the end by an earlier evaluation: once more
        loader.again()
    total = source.num_samples
    loss = correct = 0.0
    try:
        for step in range(loader.stop):
            part, _ = loader.next(step)
            mean, right, _ = executor.forward(part, training=False)
            loss += mean * batch            # the padding adds nothing to the sum
            correct += right
    except BaseException:
        if own:
            loader.close(grace=0)
        raise
    if own:
        loader.close()
    else:
        loader.again()      # the next evaluation's first batches are read while training goes on
    return loss / total, correct / (total * executor.graph.scored_per_sample)
