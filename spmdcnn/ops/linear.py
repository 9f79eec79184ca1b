"""Fully connected layer: ``y = x @ w.T + b`` for x (N, F_in), w (F_out, F_in), b (F_out,).

With activations of a lower precision than the weights (bfloat16 under float32 master weights), the products
are computed in the weights' type and ``y`` and ``gx`` rounded to the activations' type.
"""

from .. import backend
from .saved import LinearSaved


def linear_forward(x, w, b, need_input_grad=True):
    xw = x.astype(w.dtype, copy=False)
    y = xw @ w.T
    if b is not None:
        y += b
    return y.astype(x.dtype, copy=False), LinearSaved(xw, w, b is not None, need_input_grad, x.dtype)


def linear_backward(gy, saved, gw_out=None):
    """``gx = gy @ w``, ``gw = gy.T @ x``, ``gb = sum_n gy``; ``gw`` is written into ``gw_out`` when given."""
    x, w, has_bias, need_input_grad, dtype = saved.x, saved.w, saved.has_bias, saved.need_input_grad, saved.dtype
    xp = backend.array_module(gy)
    gy = gy.astype(w.dtype, copy=False)
    gx = (gy @ w).astype(dtype, copy=False) if need_input_grad else None
    gw = xp.matmul(gy.T, x, out=gw_out)
    gb = gy.sum(axis=0) if has_bias else None
    return gx, gw, gb
