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
other (PyTorch's bilinear and trilinear give the same values up to rounding). Along one axis each output reads one
input (nearest) or two (linear), each a *tap*. With an integer factor the outputs of one phase (every ``s``-th)
read consecutive inputs, so a tap is a few :class:`Segment` s, a strided slice of outputs against a slice of
inputs with a weight per output, cut only where the clamping at the edges (or ``align_corners``' ratio just below
1) repeats an input; forward adds weighted input slices into output slices and backward the reverse, with no
gather or scatter by index, alike on NumPy and CuPy.

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


class Segment(NamedTuple):
    """Outputs ``[first, first + step*count)`` every ``step``-th (slice ``outputs``) that read the consecutive
    inputs ``[start, start + count)`` (slice ``inputs``) with ``weights`` (None: 1), one per output."""

    outputs: slice
    inputs: slice
    weights: object
    first: bool         # of the first tap: the segments of the first tap write every output once


class Taps(NamedTuple):
    """One axis of a tile as :class:`Segment` s: ``axis`` the array axis (2 for the first spatial one), the tile's
    ``inputs`` and ``outputs`` extents along it, ``segments`` of every tap (module docstring)."""

    axis: int
    segments: tuple
    inputs: int
    outputs: int


def _segments(xp, index, weight, scale, dtype, tap):
    """The :class:`Segment` s of one tap (``index`` of each output, ``weight`` or None): with an integer factor
    the outputs of one phase (every ``scale``-th) read consecutive inputs, but where the clamping at the edges, or
    ``align_corners``' ratio below 1, repeats one; such a phase is cut there."""
    found = []
    for phase in range(min(scale, len(index))):
        rows = index[phase::scale]
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        for lo, hi in zip(np.r_[0, breaks], np.r_[breaks, len(rows)]):
            first = phase + lo * scale
            found.append(Segment(slice(first, phase + (hi - 1) * scale + 1, scale),
                                 slice(int(rows[lo]), int(rows[lo]) + hi - lo),
                                 None if weight is None else xp.asarray(weight[first::scale][:hi - lo].astype(dtype)),
                                 tap == 0))
    return tuple(found)


def axis_taps(xp, axis, mode, scale, align_corners, in_size, out_size, out_range, in_start, inputs, dtype):
    """The :class:`Taps` of ``axis`` for a tile computing outputs ``out_range`` from ``inputs`` inputs starting at
    global ``in_start``."""
    outputs = np.arange(*out_range)
    segments = ()
    for tap, (index, weight) in enumerate(_points(mode, scale, align_corners, in_size, out_size, outputs)):
        segments += _segments(xp, index - in_start, weight, scale, dtype, tap)
    return Taps(axis, segments, inputs, len(outputs))


def _along(ndim, axis, part):
    return (slice(None),) * axis + (part,)


def _weights(segment, ndim, axis):
    return segment.weights.reshape((-1,) + (1,) * (ndim - axis - 1))


def upsample_forward(x, axes):
    """``y`` of the tile whose axes are ``axes`` (a :class:`Taps` per spatial axis); returns ``y, saved``."""
    xp = backend.array_module(x)
    y = x
    for taps in sorted(axes, key=lambda taps: -taps.axis):     # the last axis first, while the array is smallest:
        shape = list(y.shape)                                   # its writes are strided element by element
        shape[taps.axis] = taps.outputs
        out = xp.empty(shape, dtype=y.dtype)
        for segment in taps.segments:          # the first tap's first: they write every output once
            source = y[_along(y.ndim, taps.axis, segment.inputs)]
            target = out[_along(y.ndim, taps.axis, segment.outputs)]
            if segment.weights is None:
                target[...] = source
            elif segment.first:
                xp.multiply(source, _weights(segment, y.ndim, taps.axis), out=target)
            else:
                target += source * _weights(segment, y.ndim, taps.axis)
        y = out
    return y, (tuple(axes), x.shape)


def _scatter_add(xp, g, taps):
    """The adjoint of the forward along ``taps.axis``: each output's gradient added into its inputs, a segment
    (a strided slice of outputs onto consecutive inputs) at a time."""
    shape = list(g.shape)
    shape[taps.axis] = taps.inputs
    gx = xp.zeros(shape, dtype=g.dtype)
    for segment in taps.segments:
        source = g[_along(g.ndim, taps.axis, segment.outputs)]
        target = gx[_along(g.ndim, taps.axis, segment.inputs)]
        if segment.weights is None:
            target += source
        else:
            target += source * _weights(segment, g.ndim, taps.axis)
    return gx


def upsample_backward(gy, saved):
    """The input's gradient: the axes' adjoints in reverse order."""
    axes, _ = saved
    xp = backend.array_module(gy)
    g = gy
    for taps in sorted(axes, key=lambda taps: taps.axis):      # the forward's order reversed
        g = _scatter_add(xp, g, taps)
    return g
