"""Max, average and global average pooling with PyTorch's semantics.

Floor mode; max pooling pads with -inf (padding never wins) and picks the first maximum of a window in row-major
order on ties, as PyTorch's CPU kernel does; average pooling counts the padding, so every window divides by
kH*kW (with floor mode no window leaves the padded input).
"""

from .. import backend
from .cuda import kernels as cuda
from .parallel import over_samples
from .saved import PoolSaved
from .window import output_extent, pad_spatial, pair, sides, window_slice


class PoolGeometry:
    """Kernel, stride (default: the kernel) and per-side padding of a pooling window."""

    __slots__ = ("kernel", "stride", "padding")

    def __init__(self, kernel, stride=None, padding=0):
        self.kernel = pair(kernel, "kernel")
        self.stride = self.kernel if stride is None else pair(stride, "stride")
        self.padding = sides(padding)

    def output_shape(self, H, W):
        (top, bottom), (left, right) = self.padding
        return (output_extent(H, self.kernel[0], self.stride[0], top, bottom),
                output_extent(W, self.kernel[1], self.stride[1], left, right))

    def windows(self, oH, oW):
        """``(index, rows, cols)`` for every kernel position, in row-major order."""
        (kH, kW), (sh, sw) = self.kernel, self.stride
        for p in range(kH):
            for q in range(kW):
                yield p * kW + q, window_slice(p, oH, sh), window_slice(q, oW, sw)

    def __repr__(self):
        return f"PoolGeometry(kernel={self.kernel}, stride={self.stride}, padding={self.padding})"


def maxpool2d_forward(x, geometry):
    """``y[n, c, i, j] = max`` over the window; saves the winning kernel position of each output.

    The winner is tracked with modular uint8 arithmetic, ``idx += better * (index - idx)``, which is several
    times faster than masked assignment and keeps the first maximum on ties.
    """
    if backend.on_device(x):
        return cuda.maxpool2d_forward(x, geometry)
    xp = backend.array_module(x)
    N, C, H, W = x.shape
    oH, oW = geometry.output_shape(H, W)
    xpad = pad_spatial(x, geometry.padding, value=-xp.inf)
    positions = geometry.kernel[0] * geometry.kernel[1]
    index_type = xp.uint8 if positions <= 256 else xp.uint32
    y = xp.empty((N, C, oH, oW), dtype=x.dtype)
    argmax = xp.zeros((N, C, oH, oW), dtype=index_type)

    def run(n0, n1):
        best, winner = y[n0:n1], argmax[n0:n1]
        better = xp.empty(best.shape, dtype=bool)
        step = xp.empty(best.shape, dtype=index_type)
        for index, rows, cols in geometry.windows(oH, oW):
            window = xpad[n0:n1, :, rows, cols]
            if index == 0:
                best[...] = window
                continue
            xp.greater(window, best, out=better)
            xp.maximum(best, window, out=best)
            xp.subtract(index_type(index), winner, out=step)
            step *= better
            winner += step
    over_samples(xp, run, N)
    return y, PoolSaved(x.shape, geometry, argmax)


def maxpool2d_backward(gy, saved):
    """Route each output gradient to the input element that won its window."""
    if backend.on_device(gy):
        return cuda.maxpool2d_backward(gy, saved)
    x_shape, argmax, geometry = saved.x_shape, saved.argmax, saved.geometry
    xp = backend.array_module(gy)
    N, C, H, W = x_shape
    (top, bottom), (left, right) = geometry.padding
    gxpad = xp.zeros((N, C, H + top + bottom, W + left + right), dtype=gy.dtype)
    _, _, oH, oW = gy.shape

    def run(n0, n1):
        share = xp.empty((n1 - n0,) + gy.shape[1:], dtype=gy.dtype)
        hit = xp.empty(share.shape, dtype=bool)
        for index, rows, cols in geometry.windows(oH, oW):
            xp.equal(argmax[n0:n1], index, out=hit)
            xp.multiply(gy[n0:n1], hit, out=share)
            gxpad[n0:n1, :, rows, cols] += share
    over_samples(xp, run, N)
    return xp.ascontiguousarray(gxpad[:, :, top:top + H, left:left + W])


def avgpool2d_forward(x, geometry):
    """``y = sum over the (zero-padded) window / (kH*kW)``."""
    if backend.on_device(x):
        return cuda.avgpool2d_forward(x, geometry)
    xp = backend.array_module(x)
    N, C, H, W = x.shape
    oH, oW = geometry.output_shape(H, W)
    xpad = pad_spatial(x, geometry.padding)
    y = xp.zeros((N, C, oH, oW), dtype=x.dtype)
    for _, rows, cols in geometry.windows(oH, oW):
        y += xpad[:, :, rows, cols]
    y *= 1.0 / (geometry.kernel[0] * geometry.kernel[1])
    return y, PoolSaved(x.shape, geometry)


def avgpool2d_backward(gy, saved):
    if backend.on_device(gy):
        return cuda.avgpool2d_backward(gy, saved)
    x_shape, geometry = saved.x_shape, saved.geometry
    xp = backend.array_module(gy)
    N, C, H, W = x_shape
    (top, bottom), (left, right) = geometry.padding
    gxpad = xp.zeros((N, C, H + top + bottom, W + left + right), dtype=gy.dtype)
    share = gy * (1.0 / (geometry.kernel[0] * geometry.kernel[1]))
    _, _, oH, oW = gy.shape
    for _, rows, cols in geometry.windows(oH, oW):
        gxpad[:, :, rows, cols] += share
    return xp.ascontiguousarray(gxpad[:, :, top:top + H, left:left + W])


def global_avgpool_forward(x):
    """Mean over H and W: (N, C, H, W) -> (N, C, 1, 1)."""
    mean = x.mean(axis=(2, 3), keepdims=True, dtype=backend.master_dtype(x.dtype))
    return mean.astype(x.dtype, copy=False), x.shape


def global_avgpool_backward(gy, x_shape):
    xp = backend.array_module(gy)
    H, W = x_shape[2], x_shape[3]
    share = gy.astype(backend.master_dtype(gy.dtype), copy=False) * (1.0 / (H * W))
    return xp.broadcast_to(share.astype(gy.dtype, copy=False), x_shape).copy()
