"""Ops that move channels: a slice of them, and a shuffle of their groups (ShuffleNet's).

A slice's tile reads exactly the input channels its output channels are (``tiling/fields.py``: the output's box
moved by ``start`` along the channels), so its forward is its input and its backward the gradient as it comes: the
exchange that assembles the tile is the slice. A channel shuffle of ``groups`` writes input channel ``g * P + p``
(``P = C / groups``) to output channel ``p * groups + g``: PyTorch's ``x.view(N, groups, P, ...).transpose(1, 2)
.reshape(N, C, ...)``; its tiles read every channel (they are never split over channels: any output channels read
channels from every group).
"""


def slice_forward(x):
    """The tile's input is its output (its need is the sliced channels)."""
    return x, None


def slice_backward(gy, saved):
    return gy


def _moved(x, first, second):
    """``x`` (N, C, ...) with its channels read as (first, second) and written as (second, first)."""
    n, c = x.shape[:2]
    rest = x.shape[2:]
    return x.reshape((n, first, second) + rest).swapaxes(1, 2).reshape((n, c) + rest)


def channel_shuffle_forward(x, groups):
    return _moved(x, groups, x.shape[1] // groups), groups


def channel_shuffle_backward(gy, groups):
    """The inverse permutation: the shuffle of C / groups groups."""
    return _moved(gy, gy.shape[1] // groups, groups)
