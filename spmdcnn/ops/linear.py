"""Fully connected layer: ``y = x @ w.T + b`` for x (N, F_in), w (F_out, F_in), b (F_out,)."""

from .. import backend


def linear_forward(x, w, b, need_input_grad=True):
    y = x @ w.T
    if b is not None:
        y += b
    return y, (x, w, b is not None, need_input_grad)


def linear_backward(gy, saved, gw_out=None):
    """``gx = gy @ w``, ``gw = gy.T @ x``, ``gb = sum_n gy``; ``gw`` is written into ``gw_out`` when given."""
    x, w, has_bias, need_input_grad = saved
    xp = backend.array_module(gy)
    gx = gy @ w if need_input_grad else None
    gw = xp.matmul(gy.T, x, out=gw_out)
    gb = gy.sum(axis=0) if has_bias else None
    return gx, gw, gb
