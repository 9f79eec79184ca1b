"""Sliding-window geometry shared by convolution and pooling, for any number of spatial axes: sizes, padding,
strided window slices.

A window op's settings hold one value per spatial axis (``(d, h, w)`` of a volume, ``(h, w)`` of an image,
``(w,)`` of a sequence), as PyTorch's ``_ntuple`` makes them. Padding is per side, ``((before, after), ...)``
per axis, because a tile of a tensor split over a spatial axis needs padding only on the sides that touch the
tensor's border.
"""

from itertools import product

from .. import backend


def ntuple(value, rank, what="value"):
    """``v`` -> ``(v,) * rank``; a list of ``rank`` values -> their tuple."""
    if isinstance(value, (list, tuple)):
        if len(value) != rank:
            raise ValueError(f"{what}: expected an int or {rank} values (one per spatial axis), got {value!r}")
        return tuple(int(v) for v in value)
    return (int(value),) * rank


def sides(padding, rank):
    """Padding as ``((before, after), ...)``, one pair per spatial axis.

    Accepts an int, one int per axis (PyTorch's symmetric padding) or one ``[before, after]`` pair per axis.
    """
    if isinstance(padding, (list, tuple)) and len(padding) == rank and all(isinstance(p, (list, tuple))
                                                                           for p in padding):
        for p in padding:
            if len(p) != 2:
                raise ValueError(f"padding: expected [before, after] per axis, got {padding!r}")
        return tuple((int(before), int(after)) for before, after in padding)
    return tuple((p, p) for p in ntuple(padding, rank, "padding"))


def rank_of(*values, default=2):
    """The spatial rank the first sequence among ``values`` gives (its length; a padding of per-side pairs
    included), else ``default``: geometries made from plain ints (tests) are 2-D unless told otherwise."""
    for value in values:
        if isinstance(value, (list, tuple)):
            return len(value)
    return default


def output_extent(size, kernel, stride, pad_before, pad_after, dilation=1):
    """Output positions of a window sliding over ``size`` elements (floor mode, as PyTorch)."""
    return (size + pad_before + pad_after - dilation * (kernel - 1) - 1) // stride + 1


def ceil_extra(size, kernel, stride, pad_before, pad_after, dilation=1):
    """Positions past the padded end that ceil mode's last window reaches along one axis (PyTorch's
    ``ceil_mode=True``: one more window where the floor leaves part of the input unread, but never one that would
    start in the padding after the input), 0 where it adds none."""
    span = size + pad_before + pad_after - dilation * (kernel - 1) - 1
    count = -(-span // stride) + 1
    if (count - 1) * stride >= size + pad_before:
        count -= 1
    return max(0, (count - 1) * stride + dilation * (kernel - 1) + 1 - (size + pad_before + pad_after))


def output_extents(spatial, kernel, stride, padding, dilation=None):
    """:func:`output_extent` along every spatial axis (``padding`` per side)."""
    dilation = dilation or (1,) * len(spatial)
    return tuple(output_extent(size, k, s, before, after, d)
                 for size, k, s, (before, after), d in zip(spatial, kernel, stride, padding, dilation))


def is_padded(padding):
    return any(before or after for before, after in padding)


def padded_extents(spatial, padding):
    """The extents of ``spatial`` extents padded by ``padding`` (a ``(before, after)`` pair per axis)."""
    return tuple(size + before + after for size, (before, after) in zip(spatial, padding))


def pad_spatial(x, padding, value=0.0):
    """Copy of ``x`` (N, C, spatial...) padded along its spatial axes; ``x`` itself when there is no padding."""
    if not is_padded(padding):
        return x
    xp = backend.array_module(x)
    out = xp.empty(x.shape[:2] + padded_extents(x.shape[2:], padding), dtype=x.dtype)
    inner = [slice(None), slice(None)]
    for axis, ((before, after), size) in enumerate(zip(padding, x.shape[2:])):
        # the slabs before and after the interior along this axis, inside the interior along the earlier ones
        head = tuple(inner) + (slice(0, before),)
        tail = tuple(inner) + (slice(before + size, None),)
        out[head] = value
        out[tail] = value
        inner.append(slice(before, before + size))
    out[tuple(inner)] = x
    return out


def interior(padding, spatial):
    """The slices of an array (N, C, spatial...) padded by ``padding`` that hold the unpadded ``spatial`` extents."""
    return (slice(None), slice(None)) + tuple(slice(before, before + size)
                                              for (before, _), size in zip(padding, spatial))


def window_slice(offset, out_extent, stride):
    """Slice of the padded input read by kernel position ``offset`` for every output position."""
    return slice(offset, offset + stride * (out_extent - 1) + 1, stride)


def kernel_positions(kernel):
    """Every kernel position (one offset per axis), in row-major order: the order PyTorch numbers them in."""
    return product(*(range(k) for k in kernel))
