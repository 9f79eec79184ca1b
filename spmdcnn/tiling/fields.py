"""Receptive fields: the box of each input a layer's output tile depends on.

For a window op (conv, pooling) over rows, output rows ``[o0, o1)`` read the input rows
``[o0*s - p, (o1-1)*s - p + d*(k-1) + 1)`` (stride s, top padding p, dilation d, kernel k). The part of that
range outside ``[0, H)`` is padding: the tile pads those sides locally, so it computes exactly its output rows.
Convolutions read all input channels, pooling the output's channels; linear and flatten read every feature of
their samples; element-wise ops and add read the output's own box; concat reads, from each input, the part of
the output's channel range that input supplies (possibly nothing).
"""

from dataclasses import dataclass

from ..ops.window import pair

NO_PADDING = ((0, 0), (0, 0))


@dataclass(frozen=True)
class Need:
    """The input box one tile reads (global coordinates, inside the tensor; a range may be empty) and, for window
    ops, the padding ``((top, bottom), (left, right))`` the tile adds around it."""

    box: tuple
    padding: tuple = NO_PADDING


def window_range(o0, o1, kernel, stride, pad, dilation, extent):
    """``(start, stop), (pad_before, pad_after)`` of the input a window op reads for outputs ``[o0, o1)``."""
    lo = o0 * stride - pad
    hi = (o1 - 1) * stride - pad + dilation * (kernel - 1) + 1
    a, b = min(max(lo, 0), extent), min(max(hi, 0), extent)
    if a >= b:                                  # the tile reads only padding
        return (a, a), (hi - lo, 0)
    return (a, b), (a - lo, hi - b)


def _window_need(layer, out_box, in_shape, channels):
    a = layer.attrs
    (kh, kw), (dh, dw) = pair(a["kernel"]), pair(a.get("dilation", 1))
    sh, sw = pair(a["kernel"] if a.get("stride") is None else a["stride"])
    ph, pw = pair(a["padding"])
    rows, pad_rows = window_range(*out_box[2], kh, sh, ph, dh, in_shape[2])
    cols, pad_cols = window_range(*out_box[3], kw, sw, pw, dw, in_shape[3])
    return Need((out_box[0], channels, rows, cols), (pad_rows, pad_cols))


def needs(layer, out_box, in_shapes):
    """One :class:`Need` per input of ``layer`` for the output tile ``out_box``; ``in_shapes`` are the inputs'
    global shapes (batch first)."""
    op, n = layer.op, out_box[0]
    if op == "conv2d":
        return [_window_need(layer, out_box, in_shapes[0], (0, in_shapes[0][1]))]
    if op in ("maxpool2d", "avgpool2d"):
        return [_window_need(layer, out_box, in_shapes[0], out_box[1])]
    if op == "global_avgpool":
        (_, _, H, W) = in_shapes[0]
        return [Need((n, out_box[1], (0, H), (0, W)))]
    if op in ("flatten", "linear", "softmax_cross_entropy"):
        return [Need((n,) + tuple((0, extent) for extent in in_shapes[0][1:]))]
    if op == "concat":
        result, offset = [], 0
        c0, c1 = out_box[1]
        for shape in in_shapes:
            result.append(Need((n, _concat_range(c0, c1, offset, shape[1])) + tuple(out_box[2:])))
            offset += shape[1]
        return result
    return [Need(tuple(out_box)) for _ in in_shapes]        # element-wise, batchnorm, add


def _concat_range(c0, c1, offset, count):
    """The channels ``[c0, c1)`` of a concat's output that come from the input at ``offset``, in that input's
    coordinates; an empty range when none do."""
    lo, hi = max(c0, offset) - offset, min(c1, offset + count) - offset
    if hi <= lo:
        clipped = min(max(c0 - offset, 0), count)
        return clipped, clipped
    return lo, hi
