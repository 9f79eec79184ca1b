"""Where a convolution's im2col columns read its padded input (``ops/conv.py``'s column paths): the padded block
of a chunk of samples, the window of every kernel position in it, im2col and its adjoint, and the GEMM's positions.

A chunk is a block of whole samples whose columns take about :data:`COLUMN_BYTES`, or, where one sample's would
take more (a volume's), some output planes (along the first spatial axis) of one sample.
"""

from math import prod

from .. import backend
from .parallel import over_samples
from .scratch import scratch
from .window import interior, is_padded, kernel_positions, padded_extents, window_slice

COLUMN_BYTES = 48 << 20
# Shifted rows compute discarded positions (Wp - oW per row of an image); above this fraction of the kept ones
# (13x13 maps with a 3x3 kernel: 15 %) the extra GEMM work costs as much as strided copies do (measured on
# AlexNet's layers).
SHIFTED_WASTE = 0.10


class Layout:
    """Where each kernel position's window lies, for one input size; shared by forward and backward.

    Shifted rows read the padded input as its stride's phases: along an axis of stride ``s``, phase ``r`` holds
    the padded positions ``r, r + s, r + 2s, ...`` (``extents``: ``ceil(padded / s)`` each, the phases stored one
    after another, each flattened with a ``tail``). Output ``o`` of kernel position ``p`` (dilated: ``p * d``) reads
    phase ``p*d % s`` at ``o + p*d // s``: a stride-1 window, one contiguous run of the flattened phase, so a strided
    convolution's columns are long contiguous copies as a stride-1 one's are (for stride 1 the one phase is the
    padded input itself)."""

    def __init__(self, x_shape, kernel, geometry, itemsize):
        N, C = x_shape[:2]
        self.C, self.spatial, self.kernel = C, tuple(x_shape[2:]), tuple(kernel)
        self.geometry = geometry
        stride, dilation = geometry.stride, geometry.dilation
        self.padded = padded_extents(self.spatial, geometry.padding)
        self.out = geometry.output_shape(self.spatial, kernel)
        self.extents = tuple(-(-size // s) for size, s in zip(self.padded, stride))      # of each phase
        inner_kept, inner_all = prod(self.out[1:]), prod(self.extents[1:])
        self.shifted = inner_all - inner_kept <= SHIFTED_WASTE * inner_kept
        # positions per sample: a phase's whole extents past the first axis when shifted, the output grid otherwise
        self.grid = (self.out[0],) + self.extents[1:] if self.shifted else self.out
        self.plane = prod(self.grid[1:])        # positions per output plane (along the first spatial axis)
        flat = [prod(self.extents[a + 1:]) for a in range(len(kernel))]     # a step along each axis, flattened
        # the last windows run past a phase's end by the kernel's reach along every axis but the first
        self.tail = sum((k - 1) * d // s * f for k, d, s, f in zip(kernel[1:], dilation[1:], stride[1:], flat[1:])) \
            if self.shifted else 0
        phase_flat = [prod(stride[a + 1:]) for a in range(len(kernel))]
        self.offsets = []               # (kernel position, its phase, the offset of its window in the phase)
        for p in kernel_positions(kernel):
            taps = [i * d for i, d in zip(p, dilation)]
            self.offsets.append((p, sum(t % s * f for t, s, f in zip(taps, stride, phase_flat)),
                                 sum(t // s * f for t, s, f in zip(taps, stride, flat))))
        self.phases = prod(stride) if self.shifted else 1
        self.phase_size = prod(self.extents) + self.tail if self.shifted else prod(self.padded)
        # a chunk: a block of whole samples whose columns take about COLUMN_BYTES, or where one sample's would
        # take more (a volume's), ``rows`` output planes of one sample
        plane_bytes = max(C * prod(kernel) * self.plane * itemsize, 1)
        self.rows = min(self.out[0], max(1, COLUMN_BYTES // plane_bytes))
        self.block = max(1, min(N, COLUMN_BYTES // max(plane_bytes * self.out[0], 1))) if self.rows == self.out[0] else 1
        self.P = self.rows * self.plane         # positions of a chunk, per sample

    def chunks(self, N):
        """``(n0, nb, o0, o1)``: the samples ``[n0, n0 + nb)`` and output planes ``[o0, o1)`` of each chunk, in
        order (a sample's planes one after another)."""
        if self.rows == self.out[0]:
            return [(n0, min(N, n0 + self.block) - n0, 0, self.out[0]) for n0 in range(0, N, self.block)]
        return [(n, 1, o0, min(self.out[0], o0 + self.rows)) for n in range(N) for o0 in range(0, self.out[0],
                                                                                               self.rows)]

    def zeros(self, xp, nb, dtype, slot, x=None):
        """A zeroed padded block: (Nb, C, phases, prod(extents) + tail) when shifted, (Nb, C, padded...)
        otherwise; with ``x`` (Nb, C, S...) written into it (:meth:`fill`). Split over samples between threads."""
        shape = (nb, self.C, self.phases, self.phase_size) if self.shifted else (nb, self.C) + self.padded
        block = scratch(xp, slot, shape, dtype)

        def run(n0, n1):
            block[n0:n1] = 0
            if x is not None:
                self.fill(block[n0:n1], x[n0:n1])
        over_samples(xp, run, nb, block.size)
        return block

    def _parts(self):
        """``(phase, its slices, the input's slices)``: where each phase of a shifted block (as (Nb, C,
        extents...)) and the unpadded input hold the same elements (every input element in exactly one)."""
        stride, padding = self.geometry.stride, self.geometry.padding
        for phase, r in enumerate(kernel_positions(stride)):
            inside, source = [slice(None)] * 2, [slice(None)] * 2
            for ra, s, (before, _), size, extent in zip(r, stride, padding, self.spatial, self.extents):
                lo, hi = max(0, -(-(before - ra) // s)), min(extent, -(-(before + size - ra) // s))
                inside.append(slice(lo, max(lo, hi)))
                source.append(slice(lo * s + ra - before, max(lo, hi) * s + ra - before, s))
            yield phase, tuple(inside), tuple(source)

    def _phase(self, block, phase):
        return block[:, :, phase, :prod(self.extents)].reshape(block.shape[:2] + self.extents)

    def fill(self, block, x):
        """Write the unpadded ``x`` into a zeroed padded ``block``."""
        if not self.shifted:
            block[interior(self.geometry.padding, self.spatial)] = x
            return
        for phase, inside, source in self._parts():
            self._phase(block, phase)[inside] = x[source]

    def unpad(self, block, out):
        """``out[...] =`` the part of a padded ``block`` that holds the unpadded tensor (adjoint of :meth:`fill`
        with the padding dropped)."""
        if not self.shifted:
            out[...] = block[interior(self.geometry.padding, self.spatial)]
            return
        for phase, inside, source in self._parts():
            out[source] = self._phase(block, phase)[inside]

    def padded_block(self, x):
        """The block ``x`` zero-padded (in scratch memory)."""
        xp = backend.array_module(x)
        if not self.shifted and not is_padded(self.geometry.padding):
            return x
        return self.zeros(xp, x.shape[0], x.dtype, "conv.padded", x)

    def window(self, xpad, p, phase, offset, o0, o1):
        """The input read by kernel position ``p`` for the positions of output planes ``[o0, o1)``: (Nb, C,
        positions) or (Nb, C, o1 - o0, O...)."""
        if self.shifted:
            start = offset + o0 * self.plane
            return xpad[:, :, phase, start:start + (o1 - o0) * self.plane]
        g = self.geometry
        first = (o0 * g.stride[0],) + (0,) * (len(self.out) - 1)
        extents = (o1 - o0,) + self.out[1:]
        return xpad[(slice(None), slice(None)) + tuple(window_slice(i * d + f, o, s) for i, d, f, o, s
                                                       in zip(p, g.dilation, first, extents, g.stride))]

    def _columns_view(self, columns):
        """``columns`` (C, k..., Nb, positions) indexed like the windows: flat positions for shifted rows."""
        return columns if self.shifted else columns.reshape(columns.shape[:-1] + (-1,) + self.out[1:])

    def im2col(self, xpad, columns, o0, o1):
        """Fill ``columns`` (C, k..., Nb, positions) with every window of the padded block for output planes
        ``[o0, o1)``."""
        view = self._columns_view(columns)

        def copy(n0, n1):
            for p, phase, offset in self.offsets:
                window = self.window(xpad[n0:n1], p, phase, offset, o0, o1)     # (Nb, C, positions...)
                view[(slice(None),) + p + (slice(n0, n1),)] = window.swapaxes(0, 1)
        over_samples(backend.array_module(columns), copy, xpad.shape[0], columns.size)
        return columns

    def col2im(self, columns, gpad, o0, o1):
        """Adjoint of :meth:`im2col`: add every window of ``columns`` back into the padded gradient block."""
        view = self._columns_view(columns)

        def add(n0, n1):
            for p, phase, offset in self.offsets:
                target = self.window(gpad[n0:n1], p, phase, offset, o0, o1)
                target += view[(slice(None),) + p + (slice(n0, n1),)].swapaxes(0, 1)
        over_samples(backend.array_module(columns), add, gpad.shape[0], columns.size)
        return gpad

    def to_positions(self, g, out):
        """``g`` (Nb, K, planes, O...) as the GEMM's (K, Nb*positions): discarded positions of shifted rows are
        zero."""
        nb, K = g.shape[0], g.shape[1]
        grid = out.reshape((K, nb, g.shape[2]) + self.grid[1:])

        def copy(k0, k1):
            part = grid[k0:k1]
            if self.shifted:    # zero what lies past the output along each axis but the first, kept before it
                kept = [slice(None)] * 3
                for axis in range(1, len(self.out)):
                    part[tuple(kept) + (slice(self.out[axis], None),)] = 0
                    kept.append(slice(0, self.out[axis]))
                part = part[tuple(kept)]
            part[...] = g[:, k0:k1].swapaxes(0, 1)                      # (K, Nb, O...)
        over_samples(backend.array_module(out), copy, K, out.size)     # split over the channels
        return out

    def copy_out(self, product, nb, bias, target):
        """``target`` (Nb, K, planes, O...) ``=`` the GEMM's (K, Nb*positions) ``product`` ``+ bias`` ((1, K, 1...)
        or None), split over the channels between threads."""
        xp, block = backend.array_module(product), self.from_positions(product, nb)

        def copy(k0, k1):
            if bias is None:
                target[:, k0:k1] = block[:, k0:k1]
            else:
                xp.add(block[:, k0:k1], bias[:, k0:k1], out=target[:, k0:k1])
        over_samples(xp, copy, block.shape[1], block.size)

    def from_positions(self, product, nb):
        """The GEMM's (K, Nb*positions) as (Nb, K, planes, O...) (a view)."""
        K = product.shape[0]
        grid = product.reshape((K, nb, -1) + self.grid[1:])
        return grid[(slice(None),) * 3 + tuple(slice(0, o) for o in self.out[1:])].swapaxes(0, 1)
