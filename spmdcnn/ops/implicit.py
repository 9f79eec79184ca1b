"""Implicit-GEMM convolution on the host: no im2col columns, a GEMM per kernel position accumulated with ``beta =
1`` (``ops/blas.py``), on the shifted-rows layout of ``ops/im2col.py`` (any spatial rank, strides through the
phases, dilation, groups).

With shifted rows, kernel position ``p``'s window over one sample's padded block (C, phases, phase size) is a
(C, L) matrix whose rows are ``phases * phase size`` apart: phase ``p*d % s`` from offset ``p*d // s``, ``L`` the
sample's positions (its output planes over the phase's full extents past the first axis). So, per sample, group
and kernel position ``t``, with ``W_t`` (K/G, C/G) the weight's slice at ``t``::

    Y[:, j]   += W_t @ X[:, off_t + j]            forward (K/G, L)
    gW_t      += G @ X[:, off_t + j].T            weight gradient (the output gradient G as positions)
    gX[:, off_t + j] += W_t.T @ G                 input gradient, into the zeroed padded block

each a BLAS call on the arrays in place, in blocks of positions whose operands stay in a core's cache while every
kernel position adds into them. Against im2col (a copy of the input per kernel position, then one GEMM) this
trades the copies for GEMMs whose inner dimension is the channels of one group instead of channels x taps:
:func:`applies` takes it where that pays, measured on this project's VM (benchmarks/README.md): 16 input channels or
more a group and 400 positions or more a sample (below 16 channels the thin GEMMs lose: a 3-channel 7x7/2 layer
took 2.4x im2col's time, a 4-channel 2x2x2 one 1.5x).
"""

from math import prod

import numpy as np

from . import blas
from . import im2col
from .scratch import scratch

MIN_CHANNELS = 16       # input channels per group: below, a GEMM per kernel position is too thin to pay
MIN_POSITIONS = 400     # positions per sample: below, the per-call cost of many small GEMMs loses to im2col's copy
BLOCK_BYTES = 4 << 20   # operands of one block of positions (its input rows and output rows), kept in cache
PAD_BYTES = 16 << 20    # padded input of a run of samples, padded at once (split between threads)


def applies(layout, x, groups, *others):
    """Whether a convolution of host array ``x`` with this :class:`~spmdcnn.ops.im2col.Layout` runs here, the
    ``others`` (its weight, the output's gradient) host arrays of the same type."""
    return (isinstance(x, np.ndarray) and all(isinstance(a, np.ndarray) and a.dtype == x.dtype for a in others)
            and takes(layout, groups, x.dtype))


def takes(layout, groups, dtype):
    """Whether a host convolution of ``dtype`` with this layout and ``groups`` runs here (:func:`applies`): shifted
    rows, enough channels and positions, a GEMM whose integers hold the padded block's strides."""
    dtype = np.dtype(dtype)
    return (dtype.type in (np.float32, np.float64) and layout.shifted
            and layout.C // groups >= MIN_CHANNELS and positions(layout) >= MIN_POSITIONS
            and blas.gemm(dtype) is not None and layout.C * layout.phases * layout.phase_size <= blas.largest(dtype))


def positions(layout):
    """Positions per sample: the output planes over the phase's extents past the first axis."""
    return layout.out[0] * layout.plane


def planes(layout, out_channels, itemsize):
    """Output planes (along the first spatial axis) a chunk of a sample's positions holds: as many as keep its
    product (``out_channels`` rows) within im2col's column cap, so that a volume's product is bounded as its
    columns are."""
    return max(1, min(layout.out[0], im2col.COLUMN_BYTES // max(out_channels * layout.plane * itemsize, 1)))


def workspace_elements(layout, N, out_channels, groups, itemsize):
    """Elements of the scratch arrays this path holds: a run of padded samples, a chunk's product and output
    gradient as positions (both slots stay allocated between calls), a padded gradient block, and the weight and
    its gradient by kernel position."""
    per_sample = layout.C * layout.phases * layout.phase_size
    chunk = planes(layout, out_channels, itemsize) * layout.plane
    return (_run(layout, N, itemsize) + 1) * per_sample + 2 * out_channels * chunk + \
        2 * out_channels * layout.C // groups * prod(layout.kernel)


def _run(layout, N, itemsize):
    """Samples padded at once: :data:`PAD_BYTES` of them."""
    return max(1, min(N, PAD_BYTES // max(layout.C * layout.phases * layout.phase_size * itemsize, 1)))


class _Taps:
    """A convolution's GEMMs: the weight as (taps, K, C/G), where each group's operands start, and a sample's
    positions in chunks of whole output planes (``chunks``: ``(o0, o1, [(j0, j1) blocks of positions])``)."""

    def __init__(self, layout, w, groups):
        self.layout, self.G = layout, groups
        self.K, self.Cg = w.shape[0], w.shape[1]
        self.Kg = self.K // groups
        self.size = w.itemsize
        self.gemm = blas.gemm(w.dtype)
        self.wt = np.ascontiguousarray(w.reshape(self.K, self.Cg, -1).transpose(2, 0, 1))      # (taps, K, C/G)
        self.ld = layout.phases * layout.phase_size             # between a sample's channels in its padded block
        per = max(256, BLOCK_BYTES // ((self.Kg + self.Cg) * self.size))
        rows, plane = planes(layout, self.K, self.size), layout.plane
        self.chunks = []
        for o0 in range(0, layout.out[0], rows):
            o1 = min(layout.out[0], o0 + rows)
            self.chunks.append((o0, o1, [(j0, min(o1 * plane, j0 + per)) for j0 in range(o0 * plane, o1 * plane,
                                                                                           per)]))
        self.P = rows * plane                                   # positions of the longest chunk

    def window(self, sample, group, t, j0):
        """The address of kernel position ``t``'s window over a padded sample (C, phases, phase size), at group
        ``group``'s first channel and position ``j0``."""
        _, phase, offset = self.layout.offsets[t]
        return sample.ctypes.data + (group * self.Cg * self.ld + phase * self.layout.phase_size + offset + j0) * \
            self.size

    def weight(self, t, group):
        return self.weight_of(self.wt, t, group)

    def weight_of(self, array, t, group):
        """The address of group ``group``'s rows of kernel position ``t`` in a (taps, K, C/G) array."""
        return array[t].ctypes.data + group * self.Kg * self.Cg * self.size

    def rows(self, chunk, group, j):
        """The address of group ``group``'s first row of a chunk (K, positions), at its position ``j``."""
        return chunk.ctypes.data + (group * self.Kg * chunk.shape[1] + j) * self.size


def _padded_runs(layout, x, slot):
    """``(n0, padded samples)``: runs of samples of ``x`` zero-padded into the shifted layout."""
    N = x.shape[0]
    run = _run(layout, N, x.itemsize)
    for n0 in range(0, N, run):
        yield n0, layout.zeros(np, min(N, n0 + run) - n0, x.dtype, slot, x[n0:n0 + run])


def forward(x, w, b, layout, groups, y):
    """``y`` (N, K, O...) ``= conv(x, w) + b``."""
    taps = _Taps(layout, w, groups)
    gemm, K, Kg, Cg, ld = taps.gemm, taps.K, taps.Kg, taps.Cg, taps.ld
    product = scratch(np, "conv.product", (K * taps.P,), x.dtype)
    bias = None if b is None else b.reshape((1, K) + (1,) * len(layout.out))
    for n0, padded in _padded_runs(layout, x, "conv.padded"):
        for i, sample in enumerate(padded):
            for o0, o1, blocks in taps.chunks:
                chunk = product[:K * (o1 - o0) * layout.plane].reshape(K, -1)       # contiguous: rows a chunk apart
                first = o0 * layout.plane
                for group in range(groups):
                    for j0, j1 in blocks:
                        for t in range(len(layout.offsets)):
                            gemm(blas.ROW_MAJOR, blas.NO_TRANS, blas.NO_TRANS, Kg, j1 - j0, Cg, 1.0,
                                 taps.weight(t, group), Cg, taps.window(sample, group, t, j0), ld,
                                 1.0 if t else 0.0, taps.rows(chunk, group, j0 - first), chunk.shape[1])
                layout.copy_out(chunk, 1, bias, y[n0 + i:n0 + i + 1, :, o0:o1])
    return y


def backward(gy, x, w, layout, groups, need_input_grad=True, gw=None, need_weight_grad=True):
    """``(gx, gw)`` of :func:`forward` (``gx`` None without ``need_input_grad``; ``gw`` (taps, K, C/G) written into
    ``gw`` when given, None without ``need_weight_grad``); ``x`` may be None when only ``gx`` is asked for (its
    shape is the layout's)."""
    taps = _Taps(layout, w, groups)
    gemm, K, Kg, Cg, ld = taps.gemm, taps.K, taps.Kg, taps.Cg, taps.ld
    N, dtype = gy.shape[0], gy.dtype
    g = scratch(np, "conv.gpositions", (K * taps.P,), dtype)
    gx = np.empty((N, layout.C) + layout.spatial, dtype) if need_input_grad else None
    if need_weight_grad and gw is None:
        gw = np.empty(taps.wt.shape, dtype)
    if need_weight_grad and N == 0:
        gw[...] = 0
    runs = _padded_runs(layout, x, "conv.padded") if need_weight_grad else ((0, None),)
    for n0, padded in runs:
        for n in range(n0, N if padded is None else n0 + len(padded)):
            gpad = layout.zeros(np, 1, dtype, "conv.gpad")[0] if need_input_grad else None
            for o0, o1, blocks in taps.chunks:
                chunk = layout.to_positions(gy[n:n + 1, :, o0:o1], g[:K * (o1 - o0) * layout.plane].reshape(K, -1))
                first = o0 * layout.plane
                for group in range(groups):
                    for j0, j1 in blocks:
                        rows = taps.rows(chunk, group, j0 - first)
                        for t in range(len(layout.offsets)):
                            if need_weight_grad:
                                gemm(blas.ROW_MAJOR, blas.NO_TRANS, blas.TRANS, Kg, Cg, j1 - j0, 1.0, rows,
                                     chunk.shape[1], taps.window(padded[n - n0], group, t, j0), ld,
                                     0.0 if n == 0 and j0 == 0 else 1.0, taps.weight_of(gw, t, group), Cg)
                            if need_input_grad:
                                gemm(blas.ROW_MAJOR, blas.TRANS, blas.NO_TRANS, Cg, j1 - j0, Kg, 1.0,
                                     taps.weight(t, group), Cg, rows, chunk.shape[1], 1.0,
                                     taps.window(gpad, group, t, j0), ld)
            if need_input_grad:
                layout.unpad(gpad[None], gx[n:n + 1])
    return gx, gw


def weight_gradient_shape(w):
    """The (taps, K, C/G) array :func:`backward` writes the weight gradient into."""
    return (prod(w.shape[2:]), w.shape[0], w.shape[1])
