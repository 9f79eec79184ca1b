"""Constant padding of the spatial axes (PyTorch's ``F.pad(x, pad, value=v)`` over the spatial axes), cropping
where a side is negative.

A pad is a window op of kernel 1 (``graph/optable.window``): a tile reads its own positions that lie in the input
(a negative side moves them: the tile's first output reads input position ``-before``) and pads the sides of it
that meet the tensor's padding (``tiling/fields.py``), so it computes exactly its part of the padded tensor under
any split; a tile inside the tensor copies nothing (its output is its input).
"""

from .window import interior, pad_spatial


def pad_forward(x, padding, value=0.0):
    """``(x padded by (before, after) per spatial axis with value, x's spatial extents)``."""
    return pad_spatial(x, padding, value), x.shape[2:]


def pad_backward(gy, spatial, padding):
    """The gradient of the positions that were the input's."""
    return gy[interior(padding, spatial)]
