"""Evaluation of a held-out dataset under any plan: every sample once, in order, in batches of the plan's size.

The plan fixes the global batch, so the last batch is padded: its padding samples read as zeros and carry the
label -1 (a mask of -1, or a row of NaN targets), which the loss leaves out and no prediction matches
(``ops/loss.py``, ``ops/mse.py``). A model with a loss per position (segmentation) is scored per class as well:
over the whole set, per class ``k``, the labelled positions predicted right (``TP_k``), predicted as ``k``
(``P_k``) and labelled ``k`` (``L_k``) give its IoU ``TP_k / (P_k + L_k - TP_k)`` and Dice ``2 TP_k / (P_k + L_k)``,
averaged over the classes that occur in the labels or the predictions. Batch normalization uses its
running statistics and dropout is off, so the padding changes nothing of the real samples' results. The batches
are read as training's are (:class:`~spmdcnn.io.prefetch.Loader`): by worker processes reading ahead, or with
``workers`` 0 by the rank when each batch is taken; images at their center crop, never flipped.
"""

from typing import NamedTuple

import numpy as np

from ..io.prefetch import Loader, evaluation_batches


class Evaluation(NamedTuple):
    """The scores of one evaluation: the mean ``loss``; ``score``, the fraction predicted right (of samples, or
    of labelled positions: pixel accuracy) or a regression's mean absolute error; for a loss per position the
    ``mean_iou`` and ``mean_dice`` over the classes (else None)."""

    loss: float
    score: float
    mean_iou: float = None
    mean_dice: float = None


def class_means(classes):
    """``(mean IoU, mean Dice)`` of a (3, K) table of per-class right, predicted and labelled counts, over the
    classes that occur in either (None when none does)."""
    right, predicted, labelled = np.asarray(classes, dtype=np.float64)
    sizes = predicted + labelled
    present = sizes > 0
    if not present.any():
        return None, None
    iou = right[present] / (sizes[present] - right[present])
    dice = 2 * right[present] / sizes[present]
    return float(iou.mean()), float(dice.mean())


def evaluation_loader(executor, source, batch, dtype, workers=0, prefetch=2, timeout=300.0, local_ranks=1):
    """The loader of one evaluation of ``source`` in batches of ``batch``; :meth:`~spmdcnn.io.prefetch.Loader.again`
    makes it read the next evaluation with the same workers. ``workers``, ``prefetch``, ``timeout``: as the job's
    ``data`` keys; ``local_ranks``: the ranks on this node."""
    return Loader(source, executor.data_reads(batch), batch, dtype, None, 0, -(-source.num_samples // batch),
                  workers, prefetch, timeout, batches=evaluation_batches(source.num_samples, batch),
                  local_ranks=local_ranks)


def evaluate(executor, source, batch, dtype, workers=0, prefetch=2, timeout=300.0, loader=None):
    """The :class:`Evaluation` of the model over every sample of ``source``: the mean loss and the fraction
    predicted right, or for a regression loss the mean absolute error over samples and targets, and for a loss
    per position the mean IoU and Dice (collective: every rank of the executor's world calls it). ``loader``: an
    :func:`evaluation_loader` of an earlier evaluation to read with again (else one is made and closed)."""
    own = loader is None
    if own:
        loader = evaluation_loader(executor, source, batch, dtype, workers, prefetch, timeout)
    elif loader.next_step == loader.stop:       # read to the end by an earlier evaluation: once more
        loader.again()
    loss = correct = counted = 0.0
    classes = 0.0
    try:
        for step in range(loader.stop):
            part, _ = loader.next(step)
            mean, right, _ = executor.forward(part, training=False)
            tally = executor.tally
            loss += mean * tally.counted            # the padding adds nothing to either
            counted += tally.counted
            correct += right
            if tally.classes is not None:
                classes = classes + tally.classes
    except BaseException:
        if own:
            loader.close(grace=0)
        raise
    if own:
        loader.close()
    else:
        loader.again()      # the next evaluation's first batches are read while training goes on
    counted = counted or 1.0
    if not executor.graph.classes_scored:
        return Evaluation(loss / counted, correct / counted)
    return Evaluation(loss / counted, correct / counted, *class_means(classes))
