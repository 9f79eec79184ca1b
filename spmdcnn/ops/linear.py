"""Fully connected layer: ``y = x @ w.T + b`` for x (N, F_in), w (F_out, F_in), b (F_out,)."""


def linear_forward(x, w, b, need_input_grad=True):
    y = x @ w.T
    if b is not None:
        y += b
    return y, (x, w, b is not None, need_input_grad)


def linear_backward(gy, saved):
    """``gx = gy @ w``, ``gw = gy.T @ x``, ``gb = sum_n gy``."""
    x, w, has_bias, need_input_grad = saved
    gx = gy @ w if need_input_grad else None
    gw = gy.T @ x
    gb = gy.sum(axis=0) if has_bias else None
    return gx, gw, gb
