"""Softmax cross-entropy, averaged over the global batch.

    loss = sum_n [logsumexp(z_n) - z_n[label_n]] / N_global,    gz = (softmax(z) - onehot(label)) / N_global

A tile holding some of the samples returns its share of the sum; the shares add up to the global mean. A label
of -1 marks a padding sample (evaluation pads its last batch to the plan's size): it adds nothing to the loss or
to the gradient, and the mean still divides by the whole batch.
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


def softmax_cross_entropy_forward(logits, labels, total=None):
    """bfloat16 logits are taken in float32; the gradient comes back in the logits' type."""
    xp = backend.array_module(logits)
    logits, dtype = widened(logits)
    N, F = logits.shape
    total = N if total is None else total
    if labels.shape != (N,):
        raise ValueError(f"softmax_cross_entropy: {N} logits rows but labels of shape {labels.shape}")
    labels = labels.astype(xp.int64, copy=False)
    if N and (int(labels.min()) < -1 or int(labels.max()) >= F):
        raise ValueError(f"softmax_cross_entropy: labels must lie in [0, {F}) (or be -1: padding), got range "
                         f"[{int(labels.min())}, {int(labels.max())}]")
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = xp.exp(shifted)
    sum_exp = exp.sum(axis=1, keepdims=True)
    rows = xp.arange(N)
    padding = labels < 0
    per_row = xp.log(sum_exp[:, 0]) - shifted[rows, xp.where(padding, 0, labels)]
    loss = xp.where(padding, 0, per_row).sum(dtype=xp.float64) / total
    probs = exp
    probs /= sum_exp
    return float(loss), LossSaved(probs, labels, total, dtype)


def softmax_cross_entropy_backward(gloss, saved):
    probs, labels, total, dtype = saved.probs, saved.labels, saved.total, saved.dtype
    xp = backend.array_module(probs)
    g = probs.copy()
    padding = labels < 0
    g[xp.arange(len(labels)), xp.where(padding, 0, labels)] -= 1.0
    g[padding] = 0
    g *= gloss / total
    return g.astype(dtype, copy=False)
