"""Sliding-window geometry shared by convolution and pooling: sizes, padding, strided window slices.

Padding is per side, ``((top, bottom), (left, right))``, because a tile of a tensor split over height or width
needs padding only on the sides that touch the tensor's border.
"""

from .. import backend


def pair(value, what="value"):
    """``v`` -> ``(v, v)``; ``[a, b]`` -> ``(a, b)``."""
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ValueError(f"{what}: expected an int or [h, w], got {value!r}")
        return int(value[0]), int(value[1])
    return int(value), int(value)


def sides(padding):
    """Normalise padding to ``((top, bottom), (left, right))``.

    Accepts an int, ``[ph, pw]`` (PyTorch's symmetric padding) or ``[[top, bottom], [left, right]]``.
    """
    if isinstance(padding, (list, tuple)) and len(padding) == 2 and isinstance(padding[0], (list, tuple)):
        (top, bottom), (left, right) = padding
        return (int(top), int(bottom)), (int(left), int(right))
    ph, pw = pair(padding, "padding")
    return (ph, ph), (pw, pw)


def output_extent(size, kernel, stride, pad_before, pad_after, dilation=1):
    """Output positions of a window sliding over ``size`` elements (floor mode, as PyTorch)."""
    return (size + pad_before + pad_after - dilation * (kernel - 1) - 1) // stride + 1


def pad_spatial(x, padding, value=0.0):
    """Copy of ``x`` (N, C, H, W) padded on H and W; ``x`` itself when there is no padding."""
    (top, bottom), (left, right) = padding
    if top == bottom == left == right == 0:
        return x
    xp = backend.array_module(x)
    N, C, H, W = x.shape
    out = xp.empty((N, C, H + top + bottom, W + left + right), dtype=x.dtype)
    out[:, :, :top] = value
    out[:, :, top + H:] = value
    out[:, :, top:top + H, :left] = value
    out[:, :, top:top + H, left + W:] = value
    out[:, :, top:top + H, left:left + W] = x
    return out


def window_slice(offset, out_extent, stride):
    """Slice of the padded input read by kernel position ``offset`` for every output position."""
    return slice(offset, offset + stride * (out_extent - 1) + 1, stride)
