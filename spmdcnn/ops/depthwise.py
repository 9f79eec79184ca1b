"""Depthwise convolutions on the host (groups equal to the input's channels, ``m`` outputs per input channel), any
spatial rank, for ``ops/conv.py``:

    y[n, c*m + j] = sum over kernel positions t of w[c*m + j, 0, t] * window_t(xpad[n, c])

No columns: each output channel is its input channel's windows times one weight each, added tap by tap, over
blocks of channels whose padded planes fit in cache (``BLOCK`` elements), the blocks split between threads
(``ops/parallel.py``): each tap is a pass over a block in cache. Through im2col the same layer made ``prod(k)``
copies of its input and a stack of one-row products: ConvNeXt-T's 7x7 over 96x56x56 at batch 8 took 295 ms
forward and backward that way, 88 ms this way (PyTorch's oneDNN kernel 38-48 ms; ``benchmarks/README.md``).
"""

from math import prod

import numpy as np

from .. import backend
from .parallel import num_threads, parallel_for
from .window import kernel_positions, padded_extents, window_slice

# Elements of a block's padded planes (256 KiB of float32; its output's and a product's come on top)
BLOCK = 1 << 16


def applies(x, geometry):
    """Whether the convolution is depthwise on the host (each output channel reads one input channel)."""
    return geometry.groups > 1 and geometry.groups == x.shape[1] and not backend.on_device(x)


class _Taps:
    """A depthwise convolution's pieces for one input size: the padded plane, where the input lies in it, and the
    window each kernel position reads (strided by the stride, spaced by the dilation)."""

    def __init__(self, x_shape, kernel, geometry, out):
        self.padded = padded_extents(x_shape[2:], geometry.padding)
        self.inner = (slice(None),) + tuple(slice(before, before + size) for (before, _), size
                                            in zip(geometry.padding, x_shape[2:]))
        self.windows = [(slice(None),) + tuple(window_slice(i * d, o, s) for i, d, o, s
                                               in zip(p, geometry.dilation, out, geometry.stride))
                        for p in kernel_positions(kernel)]
        self.block = max(1, BLOCK // prod(self.padded))
        self.blocks = -(-x_shape[1] // self.block)

    def channels(self, first, last, count):
        """The channel ranges of blocks ``[first, last)`` of ``count`` channels."""
        return [(c, min(count, c + self.block)) for c in range(first * self.block, min(count, last * self.block),
                                                               self.block)]


def workspace_elements(x_shape, kernel, geometry):
    """Elements of the blocks the threads hold while a depthwise convolution of an input of ``x_shape`` runs (the
    memory model's workspace): a padded plane, its gradient's and a product per block, a block per thread."""
    out = geometry.output_shape(x_shape[2:], kernel)
    taps = _Taps(x_shape, kernel, geometry, out)
    per_block = min(taps.block, x_shape[1]) * (2 * prod(taps.padded) + prod(out))
    return per_block * min(num_threads(), taps.blocks)


def forward(x, w, geometry, out):
    """y[n, c*m + j] = sum over taps of w[c*m + j, 0, tap] * window_tap(x[n, c]) (module docstring)."""
    N, C = x.shape[:2]
    m = w.shape[0] // C                                                 # outputs per input channel
    taps = _Taps(x.shape, w.shape[2:], geometry, out)
    weights = w.reshape(C, m, len(taps.windows))
    y = np.empty((N, C * m) + tuple(out), dtype=x.dtype)
    per_channel = y.reshape((N, C, m) + tuple(out))
    column = (slice(None),) + (None,) * len(out)

    def run(first, last):
        for c0, c1 in taps.channels(first, last, C):
            plane = np.zeros((c1 - c0,) + taps.padded, dtype=x.dtype)
            product = np.empty((c1 - c0,) + tuple(out), dtype=x.dtype)
            for n in range(N):
                plane[taps.inner] = x[n, c0:c1]
                for j in range(m):
                    into = per_channel[n, c0:c1, j]
                    for t, window in enumerate(taps.windows):
                        if t == 0:
                            np.multiply(plane[window], weights[c0:c1, j, t][column], out=into)
                        else:
                            np.multiply(plane[window], weights[c0:c1, j, t][column], out=product)
                            into += product
    parallel_for(run, taps.blocks, y.size * len(taps.windows))
    return y


def backward(gy, x, w, geometry, need_input_grad, gw_out=None):
    """``(gx or None, gw)`` of :func:`forward` (``gw`` written into the contiguous ``gw_out`` when given): ``gw`` tap
    by tap as the sums of gy times the tap's window, ``gx`` each tap's weight times gy added into the tap's window
    of a padded plane."""
    N, C = x.shape[:2]
    m = w.shape[0] // C
    out = gy.shape[2:]
    taps = _Taps(x.shape, w.shape[2:], geometry, out)
    weights = w.reshape(C, m, len(taps.windows))
    gw = gw_out if gw_out is not None else np.empty_like(w)
    sums = gw.reshape(C, m, len(taps.windows))
    gx = np.empty_like(x) if need_input_grad else None
    per_channel = gy.reshape((N, C, m) + tuple(out))
    column = (slice(None),) + (None,) * len(out)

    def run(first, last):
        for c0, c1 in taps.channels(first, last, C):
            plane = np.zeros((c1 - c0,) + taps.padded, dtype=x.dtype)
            gplane = np.zeros_like(plane) if need_input_grad else None
            product = np.empty((c1 - c0,) + tuple(out), dtype=x.dtype)
            totals = np.zeros((c1 - c0, m, len(taps.windows)), dtype=x.dtype)
            for n in range(N):
                plane[taps.inner] = x[n, c0:c1]
                if need_input_grad:
                    gplane[...] = 0
                for j in range(m):
                    g = per_channel[n, c0:c1, j]
                    for t, window in enumerate(taps.windows):
                        np.multiply(g, plane[window], out=product)
                        totals[:, j, t] += product.reshape(c1 - c0, -1).sum(axis=1)
                        if need_input_grad:
                            np.multiply(g, weights[c0:c1, j, t][column], out=product)
                            gplane[window] += product
                if need_input_grad:
                    gx[n, c0:c1] = gplane[taps.inner]
            sums[c0:c1] = totals
    parallel_for(run, taps.blocks, gy.size * len(taps.windows) * (2 + need_input_grad))
    return gx, gw
