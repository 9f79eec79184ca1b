"""Max, average and global average pooling with PyTorch's semantics, over 1, 2 or 3 spatial axes (one
implementation for every spatial rank: (N, C, S...) with ``S`` the spatial extents).

Floor mode; max pooling pads with -inf (padding never wins) and picks the first maximum of a window in row-major
order on ties, as PyTorch's CPU kernel does; average pooling counts the padding, so every window divides by
prod(kernel) (with floor mode no window leaves the padded input). Ceil mode is floor mode over more padding after
(``graph/optable.window``): the positions a last window reaches past the padded input count for nothing, so those
windows divide by the positions they hold inside it (PyTorch's ``ceil_mode=True``, ``count_include_pad=True``);
with ``count_include_pad: false`` every window divides by the positions it holds inside the input.
``PoolGeometry.counts`` gives them per axis (a window's count is their product), and average pooling rescales
those outputs.
"""

from functools import lru_cache
from math import prod

import numpy as np

from .. import backend
from . import compiled
from .cuda import kernels as cuda
from .parallel import CHUNK, parallel_for
from .saved import PoolSaved
from .window import (interior, kernel_positions, ntuple, output_extents, pad_spatial, padded_extents, rank_of, sides,
                     window_slice)


class PoolGeometry:
    """Kernel, stride (default: the kernel) and per-side padding of a pooling window, one value per spatial axis
    (``rank`` of them: given, or the length of the first one given as a sequence, else 2)."""

    __slots__ = ("kernel", "stride", "padding", "counts", "_factors")

    def __init__(self, kernel, stride=None, padding=0, rank=None, counts=None):
        rank = rank or rank_of(kernel, stride, padding)
        self.kernel = ntuple(kernel, rank, "kernel")
        self.stride = self.kernel if stride is None else ntuple(stride, rank, "stride")
        self.padding = sides(padding, rank)
        self.counts = counts    # per axis, the positions each output's window holds inside the input (None: all)
        self._factors = {}      # (array module, dtype) -> the per-axis factors, made once for every step

    def rescaled(self, y, xp):
        """``y`` (divided by the kernel's positions) divided by its windows' own counts instead, in place."""
        if self.counts is None:
            return y
        key = (xp.__name__, y.dtype)
        if key not in self._factors:
            rank, factors = len(self.kernel), []
            for axis, (counts, k) in enumerate(zip(self.counts, self.kernel)):
                shape = [1] * (2 + rank)
                shape[2 + axis] = len(counts)
                factors.append(xp.asarray([k / c for c in counts], dtype=y.dtype).reshape(shape))
            self._factors[key] = factors
        for factor in self._factors[key]:
            y *= factor
        return y

    @property
    def positions(self):
        """Kernel positions in a window."""
        return prod(self.kernel)

    def output_shape(self, spatial):
        return output_extents(spatial, self.kernel, self.stride, self.padding)

    def windows(self, out, first=0):
        """``(index, slices)`` for every kernel position, in row-major order: the spatial slices of the padded
        input it reads for the output extents ``out``, whose first axis starts at output ``first``."""
        for index, p in enumerate(kernel_positions(self.kernel)):
            start = (p[0] + first * self.stride[0],) + p[1:]
            yield index, tuple(window_slice(i, o, s) for i, o, s in zip(start, out, self.stride))

    def pieces(self, rows, out, disjoint_inputs=False):
        """The host's blocks of a pooling's work over ``rows`` (samples x channels) with output extents ``out``:
        ``(r0, r1, o0, o1)``, rows ``[r0, r1)`` and outputs ``[o0, o1)`` along the first spatial axis, about a
        million window reads (16 :data:`~spmdcnn.ops.parallel.CHUNK`) each: enough blocks for every thread even
        for one sample of a volume, few enough that NumPy's calls (5 per kernel position) stay long. Measured on a
        2x2x2 pooling of 32 x 128^3, forward: 38-46 ms, against 106 ms in blocks of 64 Ki reads, 82 ms in blocks of
        16 Mi and 162 ms on one thread. With ``disjoint_inputs`` a block splits the first
        axis only where its windows do not overlap along it (kernel at most the stride), so that blocks read (and
        backward writes) disjoint inputs."""
        target = max(1, 16 * CHUNK // self.positions)
        plane, per_row = max(prod(out[1:]), 1), max(prod(out), 1)
        if per_row >= target and (not disjoint_inputs or self.kernel[0] <= self.stride[0]):
            step = max(1, target // plane)
            return [(r, r + 1, o, min(out[0], o + step)) for r in range(rows) for o in range(0, out[0], step)]
        step = max(1, target // per_row)
        return [(r, min(rows, r + step), 0, out[0]) for r in range(0, rows, step)]

    def __repr__(self):
        return f"PoolGeometry(kernel={self.kernel}, stride={self.stride}, padding={self.padding})"


def maxpool_forward(x, geometry):
    """``y[n, c, i, j] = max`` over the window; saves the winning kernel position of each output.

    The winner is tracked with modular uint8 arithmetic, ``idx += better * (index - idx)``, which is several
    times faster than masked assignment and keeps the first maximum on ties. On the host the work runs in blocks
    of rows and output planes (:meth:`PoolGeometry.pieces`) split between threads.
    """
    if backend.on_device(x):
        return cuda.maxpool_forward(x, geometry)
    xp = backend.array_module(x)
    N, C = x.shape[:2]
    out = geometry.output_shape(x.shape[2:])
    xpad = xp.ascontiguousarray(pad_spatial(x, geometry.padding, value=-xp.inf))
    index_type = xp.uint8 if geometry.positions <= 256 else xp.uint32
    rows = xpad.reshape((N * C,) + xpad.shape[2:])
    y = xp.empty((N, C) + out, dtype=x.dtype)
    argmax = xp.empty((N, C) + out, dtype=index_type)
    ys, winners = y.reshape((N * C,) + out), argmax.reshape((N * C,) + out)
    pieces = geometry.pieces(N * C, out)

    def run(first, last):
        for r0, r1, o0, o1 in pieces[first:last]:
            best, winner = ys[r0:r1, o0:o1], winners[r0:r1, o0:o1]
            better = xp.empty(best.shape, dtype=bool)
            step = xp.empty(best.shape, dtype=index_type)
            winner[...] = 0
            for index, slices in geometry.windows(best.shape[1:], o0):
                window = rows[(slice(r0, r1),) + slices]
                if index == 0:
                    best[...] = window
                    continue
                xp.greater(window, best, out=better)
                xp.maximum(best, window, out=best)
                xp.subtract(index_type(index), winner, out=step)
                step *= better
                winner += step
    parallel_for(run, len(pieces), y.size * geometry.positions)
    return y, PoolSaved(x.shape, geometry, argmax)


def _padded_zeros(xp, x_shape, geometry, dtype):
    return xp.zeros(tuple(x_shape[:2]) + padded_extents(x_shape[2:], geometry.padding), dtype=dtype)


def maxpool_backward(gy, saved):
    """Route each output gradient to the input element that won its window: on the host one add per output where
    the compiled kernels run (``ops/compiled.py``), else block by block (:meth:`PoolGeometry.pieces`, blocks that
    write disjoint inputs), each zeroing its inputs and adding its outputs' shares while they are in cache."""
    if backend.on_device(gy):
        return cuda.maxpool_backward(gy, saved)
    x_shape, argmax, geometry = saved.x_shape, saved.argmax, saved.geometry
    xp = backend.array_module(gy)
    N, C = x_shape[:2]
    padded = padded_extents(x_shape[2:], geometry.padding)
    if compiled.available(gy):
        gxpad = compiled.maxpool_backward(gy, argmax, geometry, (N, C) + padded)
    else:
        gxpad = _routed(xp, gy, argmax, geometry, padded)
    return xp.ascontiguousarray(gxpad[interior(geometry.padding, x_shape[2:])])


def _routed(xp, gy, argmax, geometry, padded):
    """NumPy's :func:`maxpool_backward` into the padded input's gradient, block by block."""
    N, C = gy.shape[:2]
    out = gy.shape[2:]
    gxpad = xp.empty((N, C) + padded, dtype=gy.dtype)
    rows = gxpad.reshape((N * C,) + padded)
    gys = xp.ascontiguousarray(gy).reshape((N * C,) + out)
    winners = argmax.reshape((N * C,) + out)
    pieces = geometry.pieces(N * C, out, disjoint_inputs=True)

    def run(first, last):
        for r0, r1, o0, o1 in pieces[first:last]:
            # the input planes these outputs' windows read (whole rows unless the first axis is split)
            end = padded[0] if o1 == out[0] else o1 * geometry.stride[0]
            rows[r0:r1, o0 * geometry.stride[0]:end] = 0
            share = xp.empty((r1 - r0, o1 - o0) + out[1:], dtype=gy.dtype)
            hit = xp.empty(share.shape, dtype=bool)
            for index, slices in geometry.windows(share.shape[1:], o0):
                xp.equal(winners[r0:r1, o0:o1], index, out=hit)
                xp.multiply(gys[r0:r1, o0:o1], hit, out=share)
                rows[(slice(r0, r1),) + slices] += share
    parallel_for(run, len(pieces), gy.size * geometry.positions)
    return gxpad


def avgpool_forward(x, geometry):
    """``y = sum over the (zero-padded) window / prod(kernel)``."""
    xp = backend.array_module(x)
    if backend.on_device(x):
        y, saved = cuda.avgpool_forward(x, geometry)
        return geometry.rescaled(y, xp), saved
    out = geometry.output_shape(x.shape[2:])
    xpad = pad_spatial(x, geometry.padding)
    y = xp.zeros(x.shape[:2] + out, dtype=x.dtype)
    for _, slices in geometry.windows(out):
        y += xpad[(slice(None), slice(None)) + slices]
    y *= 1.0 / geometry.positions
    return geometry.rescaled(y, xp), PoolSaved(x.shape, geometry)


def avgpool_backward(gy, saved):
    x_shape, geometry = saved.x_shape, saved.geometry
    xp = backend.array_module(gy)
    if geometry.counts is not None:
        gy = geometry.rescaled(gy.copy(), xp)
    if backend.on_device(gy):
        return cuda.avgpool_backward(gy, saved)
    gxpad = _padded_zeros(xp, x_shape, geometry, gy.dtype)
    share = gy * (1.0 / geometry.positions)
    for _, slices in geometry.windows(gy.shape[2:]):
        gxpad[(slice(None), slice(None)) + slices] += share
    return xp.ascontiguousarray(gxpad[interior(geometry.padding, x_shape[2:])])


def window_counts(o0, o1, kernel, stride, first, limit):
    """The positions each window of outputs ``[o0, o1)`` along one axis holds inside ``[first, limit)`` of the
    padded input (the padded input itself: a ceil-mode window may reach past it; or the input alone: the padding
    left out of the divisor)."""
    return tuple(min(o * stride + kernel, limit) - max(o * stride, first) for o in range(o0, o1))


@lru_cache(maxsize=64)
def adaptive_weights(size, out):
    """The (out, size) matrix averaging PyTorch's adaptive window of each output along one axis: output ``i`` over
    inputs ``[floor(i * size / out), ceil((i + 1) * size / out))``; made once per shape, not every step (read
    only)."""
    weights = np.zeros((out, size))
    for i in range(out):
        start, stop = i * size // out, -(-(i + 1) * size // out)
        weights[i, start:stop] = 1.0 / (stop - start)
    weights.flags.writeable = False
    return weights


def _along_axes(x, matrices):
    """``x`` (N, C, S...) with spatial axis ``k`` multiplied by ``matrices[k]`` (out, in): a box average is the
    product of the averages along its axes."""
    for axis, matrix in enumerate(matrices):
        moved = backend.array_module(x).moveaxis(x, 2 + axis, -1)
        x = backend.array_module(x).moveaxis(moved @ matrix.T, -1, 2 + axis)
    return x


def adaptive_avgpool_forward(x, output_size):
    """PyTorch's adaptive average pooling to ``output_size`` (an int, or one per spatial axis), any sizes."""
    xp = backend.array_module(x)
    sizes = ntuple(output_size, x.ndim - 2, "output_size")
    matrices = [xp.asarray(adaptive_weights(size, out), dtype=x.dtype) for size, out in zip(x.shape[2:], sizes)]
    return xp.ascontiguousarray(_along_axes(x, matrices)), matrices


def adaptive_avgpool_backward(gy, matrices):
    return backend.array_module(gy).ascontiguousarray(_along_axes(gy, [matrix.T for matrix in matrices]))


def global_avgpool_forward(x):
    """Mean over the spatial axes: (N, C, S...) -> (N, C, 1...)."""
    mean = x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=backend.master_dtype(x.dtype))
    return mean.astype(x.dtype, copy=False), x.shape


def global_avgpool_backward(gy, x_shape):
    xp = backend.array_module(gy)
    share = gy.astype(backend.master_dtype(gy.dtype), copy=False) * (1.0 / prod(x_shape[2:]))
    return xp.broadcast_to(share.astype(gy.dtype, copy=False), x_shape).copy()
