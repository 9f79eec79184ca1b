"""Upsampling by an integer factor per spatial axis (PyTorch's ``nn.Upsample`` with ``scale_factor``), over 1, 2
or 3 spatial axes: ``nearest``, or ``linear`` (bilinear on images, trilinear on volumes) with ``align_corners``
either way; forward and backward, one implementation for every spatial rank.

Along one axis of input extent ``S`` and output extent ``O = S*s``, output ``o`` reads

- nearest: input ``floor(o / s)``;
- linear, ``align_corners`` false: the point ``max((o + 0.5) / s - 0.5, 0)``, between inputs ``i = floor`` of it and
  ``min(i + 1, S - 1)`` with weights ``1 - l`` and ``l`` (``l`` its fractional part), as PyTorch computes it
  with the scale ``1 / s``;
- linear, ``align_corners`` true: the point ``o * (S - 1) / (O - 1)`` likewise.

Linear interpolation over several axes is the product of the axes' weights, so it is applied one axis after the
other (PyTorch's bilinear and trilinear give the same values up to rounding). Each axis is a gather of one or two
taps (:class:`Taps`), and backward adds each output's gradient back into the inputs it read: a tap's inputs are
non-decreasing along the axis, so the outputs reading one input form a run, and the runs are added one position of
a run at a time (no index twice in one add; as many adds as the longest run, about ``s``), on NumPy and CuPy alike.

A tile computes the outputs ``[o0, o1)`` of each axis from the inputs ``[i0, i1)`` they read
(:func:`source_range`), given where both lie in the global tensor: the taps are the global ones, shifted.
"""

from typing import NamedTuple

import numpy as np

from .. import backend

MODES = ("nearest", "linear")


def _points(mode, scale, align_corners, in_size, out_size, outputs):
    """The global input indices (one or two taps) and weights that outputs ``outputs`` (an integer array) read."""
    if mode == "nearest":
        return ((np.minimum(outputs // scale, in_size - 1), None),)
    if align_corners:
        ratio = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
        src = outputs * ratio
    else:
        src = np.maximum((outputs + 0.5) * (1.0 / scale) - 0.5, 0.0)
    lo = np.minimum(src.astype(np.int64), in_size - 1)
    weight = src - lo
    return ((lo, 1.0 - weight), (np.minimum(lo + 1, in_size - 1), weight))


def source_range(mode, scale, align_corners, in_size, out_size, o0, o1):
    """The inputs ``[i0, i1)`` that outputs ``[o0, o1)`` of one axis read (empty for no outputs)."""
    if o1 <= o0:
        return 0, 0
    taps = _points(mode, scale, align_corners, in_size, out_size, np.array([o0, o1 - 1]))
    return int(taps[0][0][0]), int(taps[-1][0][1]) + 1


class Taps(NamedTuple):
    """One axis of a tile: per tap, the local input index of each output and its weight (None: nearest's 1)."""

    axis: int                   # the array axis (2 for the first spatial one)
    taps: tuple                 # ((indices, weights or None), ...) as arrays of the tile's array module
    inputs: int                 # the tile's input extent along the axis


def axis_taps(xp, axis, mode, scale, align_corners, in_size, out_size, out_range, in_start, inputs, dtype):
    """The :class:`Taps` of ``axis`` for a tile computing outputs ``out_range`` from ``inputs`` inputs starting at
    global ``in_start``."""
    outputs = np.arange(*out_range)
    taps = tuple((xp.asarray(index - in_start), None if weight is None else xp.asarray(weight.astype(dtype)))
                 for index, weight in _points(mode, scale, align_corners, in_size, out_size, outputs))
    return Taps(axis, taps, inputs)


def _weighted(xp, x, taps):
    """``x`` gathered along the axis by each tap and weighted, summed."""
    shape = [1] * x.ndim
    shape[taps.axis] = -1
    y = None
    for index, weight in taps.taps:
        part = xp.take(x, index, axis=taps.axis)
        if weight is not None:
            part *= weight.reshape(shape)
        if y is None:
            y = part
        else:
            y += part
    return y


def upsample_forward(x, axes):
    """``y`` of the tile whose axes are ``axes`` (a :class:`Taps` per spatial axis); returns ``y, saved``."""
    xp = backend.array_module(x)
    y = x
    for taps in axes:
        y = _weighted(xp, y, taps)
    return y, (tuple(axes), x.shape)


def _scatter_add(xp, g, taps):
    """The adjoint of :func:`_weighted` along ``taps.axis``: each output's gradient added into its inputs."""
    axis = taps.axis
    shape = list(g.shape)
    shape[axis] = taps.inputs
    gx = xp.zeros(shape, dtype=g.dtype)
    weight_shape = [1] * g.ndim
    weight_shape[axis] = -1
    for index, weight in taps.taps:
        values = g if weight is None else g * weight.reshape(weight_shape)
        host = backend.to_numpy(index)
        if not host.size:
            continue
        starts = np.flatnonzero(np.r_[True, host[1:] != host[:-1]])        # where each run of one input begins
        lengths = np.diff(np.r_[starts, host.size])
        targets = host[starts]
        for k in range(int(lengths.max())):
            long_enough = lengths > k
            where = [slice(None)] * g.ndim
            where[axis] = xp.asarray(targets[long_enough])
            source = [slice(None)] * g.ndim
            source[axis] = xp.asarray(starts[long_enough] + k)
            gx[tuple(where)] += values[tuple(source)]
    return gx


def upsample_backward(gy, saved):
    """The input's gradient: the axes' adjoints in reverse order."""
    axes, _ = saved
    xp = backend.array_module(gy)
    g = gy
    for taps in reversed(axes):
        g = _scatter_add(xp, g, taps)
    return g
