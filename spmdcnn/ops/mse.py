"""Mean squared error for regression, averaged over the samples and the targets, as
``torch.nn.functional.mse_loss`` (reduction ``mean``):

    loss = sum_{n, k} (y[n, k] - t[n, k])^2 / T,    gy = 2 (y - t) / T,    T = N * K

A target row of NaN marks a padding sample (evaluation pads its last batch to the plan's size): it adds nothing to
the loss or to the gradient, nor to ``T``, as the cross-entropy's label -1 does (``ops/loss.py``). A tile holding
some of the samples returns its sum (``total=1``) and its count, which the executor sums over the tiles.
bfloat16 predictions are taken in float32; the gradient comes back in their type.
"""

from .. import backend
from .loss import widened
from .saved import MSESaved


def mse_loss_forward(y, targets, total=None):
    """``(loss, saved)`` of predictions ``y`` (N, K) against ``targets`` (N, K): the squared errors summed over
    ``total`` (None: the count of values here that are not padding, ``saved.counted``)."""
    xp = backend.array_module(y)
    y, dtype = widened(y)
    N, K = y.shape
    if targets.shape != (N, K):
        raise ValueError(f"mse_loss: predictions of shape {(N, K)} but targets of shape {targets.shape}")
    padding = xp.isnan(targets).any(axis=1) if N else xp.zeros(0, dtype=bool)
    counted = (N - int(padding.sum())) * K
    total = (counted or 1) if total is None else total
    difference = y - xp.where(padding[:, None], y, targets.astype(y.dtype, copy=False))   # padding: 0
    loss = float((difference * difference).sum(dtype=xp.float64)) / total
    return loss, MSESaved(difference, total, dtype, counted)


def mse_loss_backward(gloss, saved):
    gy = saved.difference * (2.0 * gloss / saved.count)
    return gy.astype(saved.dtype, copy=False)


def absolute_errors(y, targets):
    """The sum of ``|y - t|`` over the samples that are not padding (a NaN target row): evaluation's mean
    absolute error adds these up."""
    xp = backend.array_module(y)
    valid = ~xp.isnan(targets).any(axis=1)
    return float(xp.abs(y[valid].astype(xp.float64) - targets[valid]).sum())
