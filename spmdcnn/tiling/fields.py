"""Receptive fields: the box of each input a layer's output tile depends on.

A window op (conv, pooling) acts on each spatial axis (depth, height, width) alone: along one, output positions
``[o0, o1)`` read the input positions ``[o0*s - p, (o1-1)*s - p + d*(k-1) + 1)`` (stride s, padding before p,
dilation d, kernel k). The part of that range outside the tensor is padding: the tile pads those sides locally,
so it computes exactly its outputs. A 1-wide window with stride s > 1 (a strided kernel-1 convolution) reads only
every s-th position of that range: its need is strided, the tile receives just those positions and applies
stride 1 to them. Along such an axis the padding counts outputs (zeros added to the packed input), and a need's
elements are ``shape_of(box, steps)``, not its box's volume.
A transposed convolution's input position ``i`` adds into outputs ``i*s - p + q*d`` (kernel position q): an output
tile reads the inputs that reach its part (``reach_range``), without padding, computes what they give and keeps
its part (``ops/conv_transpose.py``: the crop). An upsampling's output tile reads, of its own channels, the inputs
its outputs interpolate between (``ops/upsample.py: source_range``). A group (or instance) normalisation's tile reads
its own box (the tiles sharing a group add their statistics: ``tiling/statistics.py``). ``mul`` reads the output's box
of each input but along an input's axes of size 1, where it reads that one element (a gate (C, 1, 1): its samples'
and channels' gates, whatever the tile's positions).
Convolutions read all input channels (with groups, those of the groups the tile's output channels fall in: a
split over ``c`` keeps groups whole, ``tiling/config.py``), pooling the output's channels; linear and flatten read
every feature of their samples; the cross-entropy every class at its samples' positions (its output has one
channel), and so does a channel shuffle (every channel at the output's samples and positions); element-wise ops
and add read the output's own box; concat reads, from each input, the part of the output's channel range that input supplies
(possibly nothing); a slice reads the output's box moved along the channels by its start (the input channels its
output's are). A pad is a window of kernel 1: a tile reads its own positions inside the tensor and pads where it
meets the tensor's sides.
"""

from dataclasses import dataclass

from ..graph.optable import (READS_BROADCAST, READS_CHANNEL_PARTS, READS_CHANNEL_SLICE, READS_CHANNEL_WINDOW,
                              READS_INTERPOLATED, READS_PLANE, READS_POSITIONS, READS_SAMPLE, READS_TRANSPOSED,
                              READS_WINDOW, layer_groups)
from ..ops.conv import group_inputs
from ..ops.upsample import source_range
from ..ops.window import ntuple

def no_padding(rank):
    """The padding of a tile that adds none: a ``(0, 0)`` pair per spatial axis."""
    return ((0, 0),) * rank


@dataclass(frozen=True)
class Need:
    """The input box one tile reads (global coordinates, inside the tensor; a range may be empty) and, for window
    ops, the padding ``((before, after), ...)`` per spatial axis the tile adds around it (None: none). ``steps``
    (None: all 1) is set when a 1-wide window strides over a spatial axis: the tile reads only every ``step``-th
    position of it, and the padding then counts outputs that fall in the tensor's padding."""

    box: tuple
    padding: tuple = None
    steps: tuple = None

    @property
    def pads(self):
        """The padding per spatial axis, ``(0, 0)`` pairs where the need has none."""
        return self.padding if self.padding is not None else no_padding(len(self.box) - 2)

    def stride(self, stride):
        """The stride a tile applies to this need, per spatial axis: 1 along a strided read (the positions come
        subsampled)."""
        if self.steps is None:
            return tuple(stride)
        return tuple(1 if step > 1 else s for s, step in zip(stride, self.steps[2:]))


def window_range(o0, o1, kernel, stride, pad, dilation, extent):
    """``(start, stop), (pad_before, pad_after)`` of the input a window op reads for outputs ``[o0, o1)``."""
    lo = o0 * stride - pad
    hi = (o1 - 1) * stride - pad + dilation * (kernel - 1) + 1
    a, b = min(max(lo, 0), extent), min(max(hi, 0), extent)
    if a >= b:                                  # the tile reads only padding
        return (a, a), (hi - lo, 0)
    return (a, b), (a - lo, hi - b)


def strided_range(o0, o1, stride, pad, extent):
    """For a 1-wide window: ``(start, stop), (outputs before, outputs after)`` where outputs ``[o0, o1)`` read
    the rows ``o*stride - pad``, every ``stride``-th row from ``start``; outputs whose row is padding are
    counted before and after."""
    first = max(o0, -(-pad // stride))                  # the first output reading a row inside the tensor
    end = min(o1, (extent - 1 + pad) // stride + 1)     # just past the last one
    if first >= end:                                    # every output reads padding
        before = min(first, o1) - o0
        return (0, 0), (before, o1 - o0 - before)
    return (first * stride - pad, (end - 1) * stride - pad + 1), (first - o0, o1 - end)


def _axis(o0, o1, kernel, stride, pad, dilation, extent):
    """``(range, padding, step)`` of one spatial axis of a window op's need."""
    if kernel == 1 and stride > 1 and o1 - o0 > 1:
        rows, padding = strided_range(o0, o1, stride, pad, extent)
        return rows, padding, stride
    rows, padding = window_range(o0, o1, kernel, stride, pad, dilation, extent)
    return rows, padding, 1


def _window_need(layer, out_box, in_shape, channels):
    geometry = layer.window
    axes = [_axis(o0, o1, k, s, before, d, extent) for (o0, o1), k, s, (before, _), d, extent in
            zip(out_box[2:], geometry.kernel, geometry.stride, geometry.padding, geometry.dilation, in_shape[2:])]
    steps = tuple(step for _, _, step in axes)
    return Need((out_box[0], channels) + tuple(r for r, _, _ in axes), tuple(p for _, p, _ in axes),
                None if all(step == 1 for step in steps) else (1, 1) + steps)


def reach_range(o0, o1, kernel, stride, pad, dilation, extent):
    """The inputs ``[start, stop)`` of one axis of a transposed convolution whose contributions reach outputs
    ``[o0, o1)``: input ``i`` adds into outputs ``i*s - pad + p*d`` for kernel positions ``p`` (clipped to the
    tensor; empty when none does)."""
    lo = max(0, -(-(o0 + pad - dilation * (kernel - 1)) // stride))
    hi = min(extent, (o1 - 1 + pad) // stride + 1)
    lo = min(lo, extent)
    return lo, max(lo, hi)


def spatial_reach(layer, axis, o0, o1, extent):
    """The input positions ``[start, stop)`` along spatial ``axis`` (2 for the first) that outputs ``[o0, o1)`` of
    a transposed convolution or an upsampling read, ``extent`` the input's along it: they pad nothing, so what a
    part reads depends on where it lies, not only on its size."""
    a = axis - 2
    if layer.spec.reads == READS_TRANSPOSED:
        geometry = layer.window
        return reach_range(o0, o1, geometry.kernel[a], geometry.stride[a], geometry.padding[a][0],
                           geometry.dilation[a], extent)
    attrs = layer.attrs
    scale = ntuple(attrs["scale"], len(layer.in_shapes[0]) - 1)[a]
    return source_range(attrs["mode"], scale, attrs["align_corners"], extent, layer.out_shape[axis - 1], o0, o1)


def _reaching_need(layer, out_box, in_shape, channels):
    return Need((out_box[0], channels) + tuple(spatial_reach(layer, axis, o0, o1, in_shape[axis])
                                               for axis, (o0, o1) in enumerate(out_box[2:], start=2)))


def needs(layer, out_box, in_shapes):
    """One :class:`Need` per input of ``layer`` for the output tile ``out_box``; ``in_shapes`` are the inputs'
    global shapes (batch first)."""
    reads, n = layer.spec.reads, out_box[0]
    if reads == READS_WINDOW:
        return [_window_need(layer, out_box, in_shapes[0], _group_inputs(layer, out_box, in_shapes[0][1]))]
    if reads == READS_CHANNEL_WINDOW:
        return [_window_need(layer, out_box, in_shapes[0], out_box[1])]
    if reads == READS_TRANSPOSED:
        return [_reaching_need(layer, out_box, in_shapes[0], (0, in_shapes[0][1]))]
    if reads == READS_INTERPOLATED:
        return [_reaching_need(layer, out_box, in_shapes[0], out_box[1])]
    if reads == READS_PLANE:
        return [Need((n, out_box[1]) + tuple((0, extent) for extent in in_shapes[0][2:]))]
    if reads == READS_POSITIONS:        # every channel of the output's samples and positions
        return [Need((n, (0, in_shapes[0][1])) + tuple(out_box[2:]))]
    if reads == READS_SAMPLE:
        return [Need((n,) + tuple((0, extent) for extent in in_shapes[0][1:]))]
    if reads == READS_CHANNEL_PARTS:
        result, offset = [], 0
        c0, c1 = out_box[1]
        for shape in in_shapes:
            result.append(Need((n, _concat_range(c0, c1, offset, shape[1])) + tuple(out_box[2:])))
            offset += shape[1]
        return result
    if reads == READS_CHANNEL_SLICE:    # the input channels the output's are
        start = layer.attrs["start"]
        return [Need((n, (start + out_box[1][0], start + out_box[1][1])) + tuple(out_box[2:]))]
    if reads == READS_BROADCAST:        # an axis of size 1 the output's is longer than: its one element
        return [Need((n,) + tuple((0, 1) if extent == 1 else span for extent, span in zip(shape[1:], out_box[1:])))
                for shape in in_shapes]
    return [Need(tuple(out_box)) for _ in in_shapes]        # element-wise, batchnorm, add


def _group_inputs(layer, out_box, channels):
    """The input channels an output tile of a convolution reads: all ``channels``, or with groups, those of the
    groups its output channels fall in."""
    groups = layer_groups(layer)
    if groups == 1:
        return 0, channels
    return group_inputs(*out_box[1], layer.out_shape[0], channels, groups)


def _concat_range(c0, c1, offset, count):
    """The channels ``[c0, c1)`` of a concat's output that come from the input at ``offset``, in that input's
    coordinates; an empty range when none do."""
    lo, hi = max(c0, offset) - offset, min(c1, offset + count) - offset
    if hi <= lo:
        clipped = min(max(c0 - offset, 0), count)
        return clipped, clipped
    return lo, hi
