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
from .parallel import over_samples
from .scratch import scratch

MIN_CHANNELS = 16       # input channels per group: below, a GEMM per kernel position is too thin to pay
MIN_POSITIONS = 400     # positions per sample: below, the per-call cost of many small GEMMs loses to im2col's copy
BLOCK_BYTES = 4 << 20   # operands of one block of positions (its input rows and output rows), kept in cache
PAD_BYTES = 16 << 20    # padded input of a run of samples, padded at once (split between threads)


def applies(layout, x, groups):
    """Whether a convolution of host array ``x`` with this :class:`~spmdcnn.ops.im2col.Layout` runs here."""
    return isinstance(x, np.ndarray) and takes(layout, groups, x.dtype)


def takes(layout, groups, dtype):
    """Whether a host convolution of ``dtype`` with this layout and ``groups`` runs here (:func:`applies`)."""
    return (np.dtype(dtype).type in (np.float32, np.float64) and layout.shifted
            and layout.C // groups >= MIN_CHANNELS and positions(layout) >= MIN_POSITIONS
            and blas.gemm(dtype) is not None)


def positions(layout):
    """Positions per sample: the output planes over the phase's extents past the first axis."""
    return layout.out[0] * layout.plane


def workspace_elements(layout, N, out_channels, groups, itemsize):
    """Elements of the scratch arrays this path holds: a run of padded samples, one sample's product and output
    gradient as positions (both slots stay allocated between calls), a padded gradient block and the weight
    gradient by kernel position."""
    per_sample = layout.C * layout.phases * layout.phase_size
    return (_run(layout, N, itemsize) + 1) * per_sample + 2 * out_channels * positions(layout) + \
        out_channels * layout.C // groups * prod(layout.kernel)


def _run(layout, N, itemsize):
    """Samples padded at once: :data:`PAD_BYTES` of them."""
    return max(1, min(N, PAD_BYTES // max(layout.C * layout.phases * layout.phase_size * itemsize, 1)))


class _Taps:
    """A convolution's GEMMs: the weight as (taps, K, C/G) and where each group's operands start."""

    def __init__(self, layout, w, groups):
        self.layout, self.G = layout, groups
        self.K, self.Cg = w.shape[0], w.shape[1]
        self.Kg = self.K // groups
        self.dtype = w.dtype
        self.size = w.itemsize
        self.gemm = blas.gemm(w.dtype)
        self.wt = np.ascontiguousarray(w.reshape(self.K, self.Cg, -1).transpose(2, 0, 1))      # (taps, K, C/G)
        self.L = positions(layout)
        self.ld = layout.phases * layout.phase_size             # between a sample's channels in its padded block
        per = max(256, BLOCK_BYTES // ((self.Kg + self.Cg) * self.size))
        self.blocks = [(j0, min(self.L, j0 + per)) for j0 in range(0, self.L, per)]

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

    def rows(self, array, group, j0):
        """The address of group ``group``'s first row of a (K, L) array, at position ``j0``."""
        return array.ctypes.data + (group * self.Kg * self.L + j0) * self.size


def _padded_runs(layout, x, slot):
    """``(n0, padded samples)``: runs of samples of ``x`` zero-padded into the shifted layout."""
    N = x.shape[0]
    run = _run(layout, N, x.itemsize)
    for n0 in range(0, N, run):
        yield n0, layout.zeros(np, min(N, n0 + run) - n0, x.dtype, slot, x[n0:n0 + run])


def forward(x, w, b, layout, groups, y):
    """``y`` (N, K, O...) ``= conv(x, w) + b``."""
    taps = _Taps(layout, w, groups)
    gemm, K, Kg, Cg, L, ld = taps.gemm, taps.K, taps.Kg, taps.Cg, taps.L, taps.ld
    product = scratch(np, "conv.product", (K, L), x.dtype)
    bias = None if b is None else b.reshape((K,) + (1,) * len(layout.out))
    for n0, padded in _padded_runs(layout, x, "conv.padded"):
        for i, sample in enumerate(padded):
            for group in range(groups):
                for j0, j1 in taps.blocks:
                    for t in range(len(layout.offsets)):
                        gemm(blas.ROW_MAJOR, blas.NO_TRANS, blas.NO_TRANS, Kg, j1 - j0, Cg, 1.0,
                             taps.weight(t, group), Cg, taps.window(sample, group, t, j0), ld, 1.0 if t else 0.0,
                             taps.rows(product, group, j0), L)
            block, target = layout.from_positions(product, 1)[0], y[n0 + i]

            def copy(k0, k1):                                            # split over the channels
                if bias is None:
                    target[k0:k1] = block[k0:k1]
                else:
                    np.add(block[k0:k1], bias[k0:k1], out=target[k0:k1])
            over_samples(np, copy, K, block.size)
    return y


def backward(gy, x, w, layout, groups, need_input_grad=True, gw=None, need_weight_grad=True):
    """``(gx, gw)`` of :func:`forward` (``gx`` None without ``need_input_grad``; ``gw`` (taps, K, C/G) written into
    ``gw`` when given, None without ``need_weight_grad``); ``x`` may be None when only ``gx`` is asked for (its
    shape is the layout's)."""
    taps = _Taps(layout, w, groups)
    gemm, K, Kg, Cg, L, ld = taps.gemm, taps.K, taps.Kg, taps.Cg, taps.L, taps.ld
    N, dtype = gy.shape[0], gy.dtype
    g = scratch(np, "conv.gpositions", (K, L), dtype)
    gx = np.empty((N, layout.C) + layout.spatial, dtype) if need_input_grad else None
    if need_weight_grad and gw is None:
        gw = np.empty(taps.wt.shape, dtype)
    runs = _padded_runs(layout, x, "conv.padded") if need_weight_grad else ((0, None),)
    for n0, padded in runs:
        count = N - n0 if padded is None else len(padded)
        for i in range(count):
            n = n0 + i
            layout.to_positions(gy[n:n + 1], g)
            gpad = layout.zeros(np, 1, dtype, "conv.gpad")[0] if need_input_grad else None
            for group in range(groups):
                for j0, j1 in taps.blocks:
                    for t in range(len(layout.offsets)):
                        if need_weight_grad:
                            gemm(blas.ROW_MAJOR, blas.NO_TRANS, blas.TRANS, Kg, Cg, j1 - j0, 1.0,
                                 taps.rows(g, group, j0), L, taps.window(padded[i], group, t, j0), ld,
                                 0.0 if n == 0 and j0 == 0 else 1.0, taps.weight_of(gw, t, group), Cg)
                        if need_input_grad:
                            gemm(blas.ROW_MAJOR, blas.TRANS, blas.NO_TRANS, Cg, j1 - j0, Kg, 1.0,
                                 taps.weight(t, group), Cg, taps.rows(g, group, j0), L, 1.0,
                                 taps.window(gpad, group, t, j0), ld)
            if need_input_grad:
                layout.unpad(gpad[None], gx[n:n + 1])
    return gx, gw


def weight_gradient_shape(w):
    """The (taps, K, C/G) array :func:`backward` writes the weight gradient into."""
    return (prod(w.shape[2:]), w.shape[0], w.shape[1])
