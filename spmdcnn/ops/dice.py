"""Soft Dice loss over the classes, with the cross-entropy added at a weight of its own: MONAI's ``DiceCELoss``
(``softmax=True, to_onehot_y=True``, reduction ``mean``), which is MLPerf HPC's 3D U-Net loss at ``dice: 0.5,
cross_entropy: 0.5, include_background: false``:

    loss = dice * mean_{n, k} (1 - D_nk) + cross_entropy * CE,
    D_nk = (2 I_nk + smooth) / (P_nk + T_nk + smooth)

with ``p = softmax(z)`` over the classes and, over the labelled positions ``e`` of sample ``n``, ``I_nk = sum_e
p_ek [label_e = k]``, ``P_nk = sum_e p_ek``, ``T_nk = sum_e [label_e = k]``; CE is ``ops/loss.py``'s mean. The mean
runs over the samples with a labelled position (padding has none) and the classes (class 0 left out when
``include_background`` is false); with ``batch`` one D_k over the whole batch replaces the per-sample D_nk.

Split over tiles: a tile adds its positions' share of (I, P, T) into a (3, N, K) table at its samples' rows
(:func:`dice_partials`); the table is summed over the ranks with the cross-entropy's sum (``runtime/executor.py``);
:func:`dice_finish`, on every rank, turns the sums into the loss and the derivatives ``a = dL/dI``, ``b = dL/dP``
(N, K); :func:`dice_backward` takes each tile's rows of them back to its logits:

    dL/dp_ek = a_nk [label_e = k] + b_nk,    dL/dz_e = p_e * (dL/dp_e - <p_e, dL/dp_e>)

(positions not labelled: 0), plus the cross-entropy's ``cross_entropy * (p - onehot) / count``. Labels that are
``ignore_index`` or negative count in neither term, as in ``ops/loss.py`` (MONAI has no ignore label).
"""

from typing import NamedTuple

import numpy as np

from .. import backend

SUMS = ("intersection", "prediction", "label")     # the rows of the table: I, P, T


class DiceSeed(NamedTuple):
    """Where backward starts: the cross-entropy sum's factor, and ``a``, ``b`` (N, K) of the Dice terms."""

    cross_entropy: float
    a: np.ndarray
    b: np.ndarray

    def rows(self, start, stop):
        """The seed of the tile holding samples ``[start, stop)``."""
        return DiceSeed(self.cross_entropy, self.a[start:stop], self.b[start:stop])


def dice_partials(saved):
    """(3, n, K) float64: a tile's (I, P, T) per sample and class over its labelled positions, from the
    cross-entropy's forward (``ops/loss.LossSaved``)."""
    xp = backend.array_module(saved.probs)
    K = saved.probs.shape[1]
    onehot = (xp.arange(K).reshape(1, -1, 1) == saved.labels) & saved.counts           # (n, K, M)
    return xp.stack([(saved.probs * onehot).sum(axis=2, dtype=xp.float64),
                     (saved.probs * saved.counts).sum(axis=2, dtype=xp.float64),
                     onehot.sum(axis=2, dtype=xp.float64)])


def dice_finish(table, dice=1.0, include_background=True, smooth=1e-5, batch=False):
    """``(value, a, b)`` from the (3, N, K) table summed over the whole batch: the Dice term of the loss (its
    weight ``dice`` applied) and its derivatives with respect to I and P (N, K; zero where a sample or class does
    not count)."""
    I, P, T = np.asarray(table, dtype=np.float64)
    N, K = I.shape
    real = T.sum(axis=1) > 0                                    # samples with a labelled position
    if batch:
        I, P, T = (np.where(real[:, None], x, 0).sum(axis=0, keepdims=True) for x in (I, P, T))
        real = np.array([bool(real.any())])
    counts = real[:, None] & (np.arange(K) >= (0 if include_background else 1))
    terms = int(counts.sum())
    if not terms:
        return 0.0, np.zeros((N, K)), np.zeros((N, K))
    denominator = P + T + smooth
    score = (2 * I + smooth) / denominator
    weight = dice / terms
    value = weight * float((1 - score)[counts].sum())
    a = np.where(counts, -2 * weight / denominator, 0.0)
    b = np.where(counts, weight * score / denominator, 0.0)
    if batch:
        a, b = np.broadcast_to(a, (N, K)), np.broadcast_to(b, (N, K))
    return value, a, b


def dice_backward(seed, saved):
    """The gradient of the tile's logits: the Dice terms from its rows of ``a`` and ``b`` (``seed``, a
    :class:`DiceSeed`), and the cross-entropy's at ``seed.cross_entropy`` per unit of its sum."""
    xp = backend.array_module(saved.probs)
    probs, counts = saved.probs, saved.counts
    K = probs.shape[1]
    onehot = xp.arange(K).reshape(1, -1, 1) == saved.labels
    a = xp.asarray(seed.a, dtype=probs.dtype)[:, :, None]
    b = xp.asarray(seed.b, dtype=probs.dtype)[:, :, None]
    gp = onehot * a
    gp += b
    gp *= counts
    g = gp - (probs * gp).sum(axis=1, keepdims=True)
    g *= probs
    if seed.cross_entropy:
        ce = probs - onehot
        ce *= counts
        ce *= seed.cross_entropy / saved.total
        g += ce
    return g.reshape(saved.shape).astype(saved.dtype, copy=False)
