"""Ops that move channels: a slice of them, a shuffle of their groups (ShuffleNet's), and blocks of positions moved
into them (space to depth: PyTorch's ``PixelUnshuffle``, TResNet's stem).

A slice's tile reads exactly the input channels its output channels are (``tiling/fields.py``: the output's box
moved by ``start`` along the channels), so its forward is its input and its backward the gradient as it comes: the
exchange that assembles the tile is the slice. A channel shuffle of ``groups`` writes input channel ``g * P + p``
(``P = C / groups``) to output channel ``p * groups + g``: PyTorch's ``x.view(N, groups, P, ...).transpose(1, 2)
.reshape(N, C, ...)``; its tiles read every channel (they are never split over channels: any output channels read
channels from every group). A space to depth is a window of the block's size and stride over the spatial axes,
reading every channel: its tiles split samples and positions (whole blocks), never channels.
"""

from .. import backend


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


def _blocks(shape, block, channels_first):
    """``(split shape, axis order)``: (N, C, S...) split into blocks of ``block`` along every spatial axis, and the
    order that moves each block's positions next to the channels (after them with ``channels_first``)."""
    n, c, spatial = shape[0], shape[1], shape[2:]
    split = (n, c) + sum(((size // block, block) for size in spatial), ())
    inner = [3 + 2 * axis for axis in range(len(spatial))]
    outer = [2 + 2 * axis for axis in range(len(spatial))]
    order = [0] + ([1] + inner if channels_first else inner + [1]) + outer
    return split, order


def space_to_depth_forward(x, block, order="channels"):
    """Each ``block`` per spatial axis of positions moved into the channels: output channel ``c * block^r + p``
    (``order`` channels: PyTorch's ``PixelUnshuffle``) or ``p * C + c`` (blocks: TResNet's ``SpaceToDepth``),
    ``p`` the position inside the block in row-major order."""
    channels_first = order == "channels"
    split, order = _blocks(x.shape, block, channels_first)
    out = (x.shape[0], x.shape[1] * block ** (x.ndim - 2)) + tuple(size // block for size in x.shape[2:])
    xp = backend.array_module(x)
    return xp.ascontiguousarray(x.reshape(split).transpose(order)).reshape(out), (x.shape, block, channels_first)


def space_to_depth_backward(gy, saved):
    shape, block, channels_first = saved
    split, order = _blocks(shape, block, channels_first)
    xp = backend.array_module(gy)
    inverse = [order.index(axis) for axis in range(len(order))]
    moved = gy.reshape(tuple(split[axis] for axis in order)).transpose(inverse)
    return xp.ascontiguousarray(moved).reshape(shape)
