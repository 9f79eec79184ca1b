"""2-D convolution (cross-correlation, as PyTorch): forward and backward through im2col + GEMM.

    y[n, k, i, j] = b[k] + sum_{c, p, q} w[k, c, p, q] * xpad[n, c, i*sh + p*dh, j*sw + q*dw]

Samples are processed in blocks so that the column buffer stays near ``COLUMN_BYTES``; a block's columns are
laid out (C, kH, kW, Nb, positions) so that one GEMM covers the whole block. Backward rebuilds the columns
block by block rather than keeping them from forward: memory stays proportional to the activations, not to
kH*kW times them. Copies are split over samples between threads (``parallel.parallel_for``).

Paths:
- pointwise (1x1, stride 1, no padding): no columns at all, one batched matmul per direction; a strided 1x1
  convolution without padding subsamples its input first and then takes this path;
- stride 1 ("shifted rows"): every output row is computed over the full padded width Wp, so the window of
  kernel position (p, q) is one contiguous run ``xpad_flat[n, c, p*dh*Wp + q*dw :][: oH*Wp]``; im2col and
  col2im become long contiguous copies, at the price of computing (Wp - oW) discarded columns per row, so
  this path is taken when those are at most ``SHIFTED_WASTE`` of the row;
- strided (and narrow stride-1 maps): classic im2col with strided window views.

CuPy arrays go to cuDNN (``ops/cuda/conv.py``) and take these paths only where cuDNN cannot run a case. What
forward keeps for backward is a :class:`~spmdcnn.ops.saved.ConvSaved`.
"""

from .. import backend
from .saved import ConvSaved
from .cuda import conv as cudnn
from .parallel import over_samples
from .scratch import scratch
from .window import output_extent, pair, sides, window_slice

COLUMN_BYTES = 48 << 20
# Shifted rows compute (Wp - oW) discarded columns per row; above this fraction of oW (13x13 maps with a 3x3
# kernel: 15 %) the extra GEMM work costs as much as strided copies do (measured on AlexNet's layers).
SHIFTED_WASTE = 0.10


class ConvGeometry:
    """Stride, per-side padding and dilation of a convolution; the kernel size comes from the weight."""

    __slots__ = ("stride", "padding", "dilation")

    def __init__(self, stride=1, padding=0, dilation=1):
        self.stride = pair(stride, "stride")
        self.padding = sides(padding)
        self.dilation = pair(dilation, "dilation")

    def output_shape(self, H, W, kH, kW):
        (top, bottom), (left, right) = self.padding
        oH = output_extent(H, kH, self.stride[0], top, bottom, self.dilation[0])
        oW = output_extent(W, kW, self.stride[1], left, right, self.dilation[1])
        return oH, oW

    def is_pointwise(self, kH, kW):
        return (kH, kW) == (1, 1) and self.stride == (1, 1) and self.padding == ((0, 0), (0, 0))

    def __repr__(self):
        return f"ConvGeometry(stride={self.stride}, padding={self.padding}, dilation={self.dilation})"


class _Layout:
    """Where each kernel position's window lies, for one input size; shared by forward and backward."""

    def __init__(self, x_shape, kH, kW, geometry, itemsize):
        N, C, H, W = x_shape
        self.C, self.H, self.W, self.kH, self.kW = C, H, W, kH, kW
        self.geometry = geometry
        (self.top, bottom), (self.left, right) = geometry.padding
        self.Hp, self.Wp = H + self.top + bottom, W + self.left + right
        self.oH, self.oW = geometry.output_shape(H, W, kH, kW)
        self.shifted = geometry.stride == (1, 1) and self.Wp - self.oW <= SHIFTED_WASTE * self.oW
        # positions per sample: whole padded rows when shifted, the output grid otherwise
        self.P = self.oH * self.Wp if self.shifted else self.oH * self.oW
        dh, dw = geometry.dilation
        self.tail = (kW - 1) * dw if self.shifted else 0     # the last window runs past the plane's end
        self.offsets = [(p, q, p * dh * self.Wp + q * dw) for p in range(kH) for q in range(kW)]
        self.block = max(1, min(N, COLUMN_BYTES // max(C * kH * kW * self.P * itemsize, 1)))

    def zeros(self, xp, nb, dtype, slot):
        """A zeroed padded block: (Nb, C, Hp*Wp + tail) when shifted, (Nb, C, Hp, Wp) otherwise."""
        shape = (nb, self.C, self.Hp * self.Wp + self.tail) if self.shifted else (nb, self.C, self.Hp, self.Wp)
        block = scratch(xp, slot, shape, dtype)
        block[...] = 0
        return block

    def interior(self, block):
        """The view of a padded block that holds the unpadded tensor."""
        nb = block.shape[0]
        if self.shifted:
            block = block[:, :, :self.Hp * self.Wp].reshape(nb, self.C, self.Hp, self.Wp)
        return block[:, :, self.top:self.top + self.H, self.left:self.left + self.W]

    def padded(self, x):
        """The block ``x`` zero-padded (in scratch memory)."""
        xp = backend.array_module(x)
        if not self.shifted and self.geometry.padding == ((0, 0), (0, 0)):
            return x
        block = self.zeros(xp, x.shape[0], x.dtype, "conv.padded")
        self.interior(block)[...] = x
        return block

    def window(self, xpad, p, q, offset):
        """The input read by kernel position (p, q) for every position: (Nb, C, P) or (Nb, C, oH, oW)."""
        if self.shifted:
            return xpad[:, :, offset:offset + self.P]
        (sh, sw), (dh, dw) = self.geometry.stride, self.geometry.dilation
        return xpad[:, :, window_slice(p * dh, self.oH, sh), window_slice(q * dw, self.oW, sw)]

    def _columns_view(self, columns):
        """``columns`` (C, kH, kW, Nb, P) indexed like the windows: P stays flat for shifted rows."""
        return columns if self.shifted else columns.reshape(self.C, self.kH, self.kW, -1, self.oH, self.oW)

    def im2col(self, xpad, columns):
        """Fill ``columns`` (C, kH, kW, Nb, P) with every window of the padded block."""
        view = self._columns_view(columns)

        def copy(n0, n1):
            for p, q, offset in self.offsets:
                window = self.window(xpad[n0:n1], p, q, offset)            # (Nb, C, P) or (Nb, C, oH, oW)
                view[:, p, q, n0:n1] = window.swapaxes(0, 1)
        over_samples(backend.array_module(columns), copy, xpad.shape[0])
        return columns

    def col2im(self, columns, gpad):
        """Adjoint of :meth:`im2col`: add every window of ``columns`` back into the padded gradient block."""
        view = self._columns_view(columns)

        def add(n0, n1):
            for p, q, offset in self.offsets:
                target = self.window(gpad[n0:n1], p, q, offset)
                target += view[:, p, q, n0:n1].swapaxes(0, 1)
        over_samples(backend.array_module(columns), add, gpad.shape[0])
        return gpad

    def to_positions(self, g, out):
        """``g`` (Nb, K, oH, oW) as the GEMM's (K, Nb, P): discarded columns of shifted rows are zero."""
        nb, K = g.shape[0], g.shape[1]
        if self.shifted:
            grid = out.reshape(K, nb, self.oH, self.Wp)
            grid[:, :, :, self.oW:] = 0
            grid[:, :, :, :self.oW] = g.transpose(1, 0, 2, 3)  # (K, Nb, oH, oW)
        else:
            out.reshape(K, nb, self.oH, self.oW)[...] = g.transpose(1, 0, 2, 3)
        return out

    def from_positions(self, product, nb):
        """The GEMM's (K, Nb*P) as (Nb, K, oH, oW) (a view)."""
        K = product.shape[0]
        grid = product.reshape(K, nb, self.oH, self.P // self.oH)[:, :, :, :self.oW]
        return grid.transpose(1, 0, 2, 3)


def conv2d_forward(x, w, b, geometry, need_input_grad=True):
    """``y = conv2d(x, w) + b`` for x (N, C, H, W), w (K, C, kH, kW), b (K,) or None.

    Returns ``y, saved``; ``need_input_grad=False`` (the network's first layer) lets backward skip ``gx``.
    """
    N, C, H, W = x.shape
    K, Cw, kH, kW = w.shape
    if Cw != C:
        raise ValueError(f"conv2d: input has {C} channels, weight expects {Cw}")
    oH, oW = geometry.output_shape(H, W, kH, kW)
    if oH <= 0 or oW <= 0:
        raise ValueError(f"conv2d: a {kH}x{kW} kernel with {geometry} over a {H}x{W} input gives an empty output")
    if backend.on_device(x) and cudnn.available():
        result = cudnn.conv2d_forward(x, w, b, geometry, need_input_grad)
        if result is not None:
            return result
    return _host_forward(x, w, b, geometry, need_input_grad, oH, oW)


def _host_forward(x, w, b, geometry, need_input_grad, oH, oW):
    """im2col + GEMM (on NumPy, or on CuPy where cuDNN is missing or cannot run a case)."""
    K, _, kH, kW = w.shape
    if (kH, kW) == (1, 1) and geometry.padding == ((0, 0), (0, 0)) and geometry.stride != (1, 1):
        # a strided 1x1 convolution reads every s-th pixel: subsample, then a pointwise product
        sh, sw = geometry.stride
        y, inner = conv2d_forward(x[:, :, ::sh, ::sw].copy(), w, b, ConvGeometry(), need_input_grad)
        return y, ConvSaved("subsample", geometry, x_shape=x.shape, inner=inner)
    y = _columns_forward(x, w, b, geometry, oH, oW)
    return y, ConvSaved("direct", geometry, x=x, w=w, has_bias=b is not None, need_input_grad=need_input_grad)


def _columns_forward(x, w, b, geometry, oH, oW):
    xp = backend.array_module(x)
    N, C, H, W = x.shape
    K, _, kH, kW = w.shape
    y = xp.empty((N, K, oH, oW), dtype=x.dtype)
    w2 = w.reshape(K, C * kH * kW)
    if geometry.is_pointwise(kH, kW):
        xp.matmul(w2, x.reshape(N, C, H * W), out=y.reshape(N, K, H * W))  # (N, K, HW)
        if b is not None:
            y += b.reshape(1, K, 1, 1)
        return y
    layout = _Layout(x.shape, kH, kW, geometry, x.itemsize)
    Nb, P = layout.block, layout.P
    columns = scratch(xp, "conv.columns", (C, kH, kW, Nb, P), x.dtype)
    product = scratch(xp, "conv.product", (K, Nb * P), x.dtype)
    for n0 in range(0, N, Nb):
        nb = min(N, n0 + Nb) - n0
        cols = layout.im2col(layout.padded(x[n0:n0 + nb]), columns[:, :, :, :nb])
        part = product[:, :nb * P]
        xp.matmul(w2, cols.reshape(C * kH * kW, nb * P), out=part)
        block = layout.from_positions(part, nb)
        if b is None:
            y[n0:n0 + nb] = block
        else:
            xp.add(block, b.reshape(1, K, 1, 1), out=y[n0:n0 + nb])
    return y


def conv2d_backward(gy, saved, gw_out=None):
    """Gradients ``gx, gw, gb`` of :func:`conv2d_forward` (``gx`` is None when it was not asked for).

    ``gw`` is written into ``gw_out`` (shaped like the weight) when given.
    """
    if saved.kind == "cudnn":
        return _backward_on_cudnn(gy, saved, gw_out)
    if saved.kind == "subsample":
        gx_sub, gw, gb = conv2d_backward(gy, saved.inner, gw_out)
        gx = None
        if gx_sub is not None:
            sh, sw = saved.geometry.stride
            gx = backend.array_module(gy).zeros(saved.x_shape, dtype=gy.dtype)
            gx[:, :, ::sh, ::sw] = gx_sub
        return gx, gw, gb
    return _columns_backward(gy, saved.x, saved.w, saved.has_bias, saved.geometry, saved.need_input_grad, gw_out)


def _backward_on_cudnn(gy, saved, gw_out):
    """Gradients of a forward that ran on cuDNN: through cuDNN, or where no engine runs them, through im2col;
    computed for the padded input cuDNN read, then cropped to the input."""
    gy = cudnn.aligned_contiguous(gy)
    gradients = cudnn.conv2d_backward(gy, saved, gw_out)
    if gradients is None:
        gradients = _padded_columns_backward(gy, saved)
    gxpad, gw, gb = gradients
    return _cropped(gxpad, saved), _into(gw, gw_out, gw is gw_out), gb


def _padded_columns_backward(gy, saved):
    """im2col's gradients of the convolution cuDNN ran (the padded input, the symmetric padding), ``gw`` and
    ``gb`` in the master weights' type."""
    symmetric = ConvGeometry(saved.geometry.stride, saved.padding, saved.geometry.dilation)
    gxpad, gw, gb = _columns_backward(gy, saved.x, saved.wio, saved.has_bias, symmetric, saved.need_input_grad, None)
    master = saved.w.dtype
    return gxpad, gw.astype(master, copy=False), None if gb is None else gb.astype(master, copy=False)


def _cropped(gxpad, saved):
    """The input's gradient from that of its padded copy a cuDNN forward read (None when not asked for)."""
    if gxpad is None or gxpad.shape == tuple(saved.x_shape):
        return gxpad
    (top, _), (left, _) = saved.geometry.padding
    top, left = top - saved.padding[0], left - saved.padding[1]
    H, W = saved.x_shape[2:]
    return backend.array_module(gxpad).ascontiguousarray(gxpad[:, :, top:top + H, left:left + W])


def _columns_backward(gy, x, w, has_bias, geometry, need_input_grad, gw_out):
    xp = backend.array_module(gy)
    N, C, H, W = x.shape
    K, _, kH, kW = w.shape
    w2 = w.reshape(K, C * kH * kW)
    gb = gy.sum(axis=(0, 2, 3)) if has_bias else None
    direct = gw_out is not None and gw_out.flags.c_contiguous
    gw2 = gw_out.reshape(K, C * kH * kW) if direct else None
    if geometry.is_pointwise(kH, kW):
        gw2, gx = _pointwise_backward(gy, x, w2, gw2, need_input_grad)
        return gx, _into(gw2.reshape(w.shape), gw_out, direct), gb
    layout = _Layout(x.shape, kH, kW, geometry, x.itemsize)
    Nb, P = layout.block, layout.P
    columns = scratch(xp, "conv.columns", (C, kH, kW, Nb, P), x.dtype)
    positions = scratch(xp, "conv.product", (K, Nb * P), x.dtype)
    gw_block = scratch(xp, "conv.gw", (K, C * kH * kW), x.dtype) if N > Nb else None
    gx = xp.empty_like(x) if need_input_grad else None
    for n0 in range(0, N, Nb):
        nb = min(N, n0 + Nb) - n0
        cols = layout.im2col(layout.padded(x[n0:n0 + nb]), columns[:, :, :, :nb]).reshape(C * kH * kW, nb * P)
        g = layout.to_positions(gy[n0:n0 + nb], positions[:, :nb * P])      # (K, Nb*P)
        if n0 == 0:
            gw2 = xp.matmul(g, cols.T, out=gw2)
        else:
            gw2 += xp.matmul(g, cols.T, out=gw_block)
        if need_input_grad:
            xp.matmul(w2.T, g, out=cols)                                     # the columns' gradient
            gpad = layout.zeros(xp, nb, x.dtype, "conv.gpad")
            layout.col2im(cols.reshape(C, kH, kW, nb, P), gpad)
            gx[n0:n0 + nb] = layout.interior(gpad)
    if need_input_grad:
        assert gx.shape == x.shape
    return gx, _into(gw2.reshape(w.shape), gw_out, direct), gb


def _into(gw, gw_out, direct):
    """``gw`` in ``gw_out`` when one was given: already there when the GEMMs wrote it ``direct``ly (a
    contiguous ``gw_out``), copied otherwise."""
    if gw_out is None:
        return gw
    if not direct:
        gw_out[...] = gw
    return gw_out


def _pointwise_backward(gy, x, w2, gw2, need_input_grad):
    """1x1 convolution: ``gw = sum_n gy[n] @ x[n].T`` over sample blocks (bounded copies), ``gx = w.T @ gy``."""
    xp = backend.array_module(gy)
    N, C, H, W = x.shape
    K = w2.shape[0]
    HW = H * W
    gy_nkp, x_ncp = gy.reshape(N, K, HW), x.reshape(N, C, HW)
    Nb = max(1, min(N, COLUMN_BYTES // max((K + C) * HW * x.itemsize, 1)))
    if gw2 is None:
        gw2 = xp.empty((K, C), dtype=x.dtype)
    part = scratch(xp, "conv.gw", (K, C), x.dtype) if N > Nb else None
    for n0 in range(0, N, Nb):
        nb = min(N, n0 + Nb) - n0
        g = scratch(xp, "conv.product", (K, nb, HW), x.dtype)
        g[...] = gy_nkp[n0:n0 + nb].transpose(1, 0, 2)                   # (K, Nb, HW)
        xs = scratch(xp, "conv.columns", (C, nb, HW), x.dtype)
        xs[...] = x_ncp[n0:n0 + nb].transpose(1, 0, 2)                   # (C, Nb, HW)
        if n0 == 0:
            xp.matmul(g.reshape(K, -1), xs.reshape(C, -1).T, out=gw2)
        else:
            gw2 += xp.matmul(g.reshape(K, -1), xs.reshape(C, -1).T, out=part)
    gx = xp.matmul(w2.T, gy_nkp).reshape(N, C, H, W) if need_input_grad else None   # (N, C, HW)
    return gw2, gx
