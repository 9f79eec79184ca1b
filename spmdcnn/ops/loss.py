"""Softmax cross-entropy over classes, per sample or per element (pixel, voxel), as
``torch.nn.functional.cross_entropy(logits, labels, ignore_index=...)`` (reduction ``mean``):

    loss = sum_e [logsumexp(z_e) - z_e[label_e]] / T,    gz_e = (softmax(z_e) - onehot(label_e)) / T

over the labelled elements ``e``: the samples of logits (N, K), or the positions of logits (N, K, S...) against
labels (N, S...). ``T`` is the count of labelled elements (those whose label is neither ``ignore_index`` nor
negative: a label of -1 also marks the padding samples of evaluation's last batch). A tile holding part of the
global batch returns its sum (``total=1``) and its count; the executor sums both over the tiles and divides, so
the result is the global mean whatever the split (``runtime/executor.py``). A batch with nothing labelled has
loss 0 and gradient 0 (PyTorch's mean is then NaN).
"""

from .. import backend
from .saved import LossSaved


def widened(x):
    """``(x, its type)``, ``x`` taken in float32 if it is bfloat16: a loss computes in float32 at least, and its
    gradient goes back in the type it came in."""
    dtype = x.dtype
    if dtype.name == "bfloat16":
        x = x.astype(backend.array_module(x).float32)
    return x, dtype


def labelled(labels, ignore_index=-1):
    """Which elements of ``labels`` count: neither ``ignore_index`` nor negative (padding)."""
    return (labels >= 0) & (labels != ignore_index)


def check_labels(labels, classes, ignore_index=-1, where="softmax_cross_entropy"):
    """Refuse a label outside ``[0, classes)`` other than ``ignore_index`` and -1 (padding)."""
    wrong = ~(((labels >= 0) & (labels < classes)) | (labels == -1) | (labels == ignore_index))
    if labels.size and bool(wrong.any()):
        bad = int(labels[wrong].reshape(-1)[0])
        ignore = "" if ignore_index == -1 else f", {ignore_index} (ignore_index)"
        raise ValueError(f"{where}: labels must lie in [0, {classes}) or be -1 (padding){ignore}; got {bad}")


def softmax_cross_entropy_forward(logits, labels, total=None, ignore_index=-1):
    """``(loss, saved)``: the loss summed over the labelled elements, over ``total`` (None: their count here,
    PyTorch's mean). ``saved.counted`` is that count. bfloat16 logits are taken in float32; the gradient comes
    back in the logits' type."""
    xp = backend.array_module(logits)
    logits, dtype = widened(logits)
    N, K = logits.shape[:2]
    if labels.shape != (N,) + tuple(logits.shape[2:]):
        raise ValueError(f"softmax_cross_entropy: logits of shape {tuple(logits.shape)} need labels of shape "
                         f"{(N,) + tuple(logits.shape[2:])}, got {tuple(labels.shape)}")
    labels = labels.astype(xp.int64, copy=False)
    check_labels(labels, K, ignore_index)
    z = logits.reshape(N, K, -1)                    # (N, K, M): M positions per sample (1 for classification)
    flat = labels.reshape(N, 1, -1)
    counts = labelled(flat, ignore_index)
    shifted = z - z.max(axis=1, keepdims=True)
    probs = xp.exp(shifted)
    sum_exp = probs.sum(axis=1, keepdims=True)
    picked = xp.take_along_axis(shifted, xp.where(counts, flat, 0), axis=1)
    counted = int(counts.sum())
    total = (counted or 1) if total is None else total
    loss = float(xp.where(counts, xp.log(sum_exp) - picked, 0).sum(dtype=xp.float64)) / total
    probs /= sum_exp
    return loss, LossSaved(probs, flat, counts, total, dtype, counted, logits.shape)


def softmax_cross_entropy_backward(gloss, saved):
    xp = backend.array_module(saved.probs)
    g = saved.probs.copy()
    g -= xp.arange(g.shape[1]).reshape(1, -1, 1) == saved.labels       # the one-hot of each label
    g *= saved.counts
    g *= gloss / saved.total
    return g.reshape(saved.shape).astype(saved.dtype, copy=False)


def scores(logits, labels, ignore_index=-1, classes=False):
    """What a tile adds to its batch's score: the count of labelled elements predicted right (argmax over the
    classes); with ``classes``, also a (3, K) float64 array of, per class, the labelled elements predicted right,
    predicted as it and labelled as it (the intersections and the two sizes that give IoU and Dice)."""
    xp = backend.array_module(logits)
    predicted = logits.argmax(axis=1)
    counts = labelled(labels, ignore_index)
    right = counts & (predicted == labels)
    correct = int(right.sum())
    if not classes:
        return correct, None
    K = logits.shape[1]
    table = xp.stack([xp.bincount(labels[right], minlength=K), xp.bincount(predicted[counts], minlength=K),
                      xp.bincount(labels[counts], minlength=K)]).astype(xp.float64)
    return correct, table
