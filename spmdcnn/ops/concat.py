"""Concatenation along channels (axis 1)."""

from .. import backend


def concat_forward(xs):
    xp = backend.array_module(xs[0])
    return xp.concatenate(xs, axis=1), [x.shape[1] for x in xs]


def concat_backward(gy, channels):
    """Split ``gy`` back into one gradient per input."""
    grads, start = [], 0
    for count in channels:
        grads.append(gy[:, start:start + count])
        start += count
    return grads
