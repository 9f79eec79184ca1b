"""2-D convolution (cross-correlation, as PyTorch): forward and backward through im2col + GEMM.

    y[n, k, i, j] = b[k] + sum_{c, p, q} w[k, c, p, q] * xpad[n, c, i*sh + p*dh, j*sw + q*dw]

Samples are processed in blocks so that the column buffer stays near ``COLUMN_BYTES``; the block's columns
are laid out (C, kH, kW, Nb, oH, oW) so that one GEMM covers the whole block. The backward pass rebuilds the
columns block by block instead of keeping them from the forward pass: memory stays proportional to the
activations, not to kH*kW times them. A 1x1, stride-1, unpadded convolution needs no columns at all.
"""

from .. import backend
from .window import output_extent, pad_spatial, pair, sides, window_slice

COLUMN_BYTES = 48 << 20


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


def _block_size(N, row_bytes):
    return max(1, min(N, COLUMN_BYTES // max(row_bytes, 1)))


def im2col(xpad, kH, kW, oH, oW, geometry, out):
    """Fill ``out`` (C, kH, kW, Nb, oH, oW) with the windows of ``xpad`` (Nb, C, Hp, Wp)."""
    (sh, sw), (dh, dw) = geometry.stride, geometry.dilation
    for p in range(kH):
        rows = window_slice(p * dh, oH, sh)
        for q in range(kW):
            cols = window_slice(q * dw, oW, sw)
            out[:, p, q] = xpad[:, :, rows, cols].transpose(1, 0, 2, 3)  # (C, Nb, oH, oW)
    return out


def col2im(columns, kH, kW, oH, oW, geometry, gxpad):
    """Adjoint of :func:`im2col`: add every window of ``columns`` back into ``gxpad`` (Nb, C, Hp, Wp)."""
    (sh, sw), (dh, dw) = geometry.stride, geometry.dilation
    for p in range(kH):
        rows = window_slice(p * dh, oH, sh)
        for q in range(kW):
            cols = window_slice(q * dw, oW, sw)
            gxpad[:, :, rows, cols] += columns[:, p, q].transpose(1, 0, 2, 3)  # (Nb, C, oH, oW)
    return gxpad


def conv2d_forward(x, w, b, geometry, need_input_grad=True):
    """``y = conv2d(x, w) + b`` for x (N, C, H, W), w (K, C, kH, kW), b (K,) or None.

    Returns ``y, saved``; ``need_input_grad=False`` (the network's first layer) lets backward skip ``gx``.
    """
    xp = backend.array_module(x)
    N, C, H, W = x.shape
    K, Cw, kH, kW = w.shape
    if Cw != C:
        raise ValueError(f"conv2d: input has {C} channels, weight expects {Cw}")
    oH, oW = geometry.output_shape(H, W, kH, kW)
    y = xp.empty((N, K, oH, oW), dtype=x.dtype)
    w2 = w.reshape(K, C * kH * kW)
    bias = None if b is None else b.reshape(1, K, 1)
    if geometry.is_pointwise(kH, kW):
        xp.matmul(w2, x.reshape(N, C, H * W), out=y.reshape(N, K, H * W))  # (N, K, HW)
        if bias is not None:
            y.reshape(N, K, oH * oW)[...] += bias
    else:
        Nb = _block_size(N, C * kH * kW * oH * oW * x.itemsize)
        columns = xp.empty((C, kH, kW, Nb, oH, oW), dtype=x.dtype)
        product = xp.empty((K, Nb * oH * oW), dtype=x.dtype)
        for n0 in range(0, N, Nb):
            n1 = min(N, n0 + Nb)
            cols = im2col(pad_spatial(x[n0:n1], geometry.padding), kH, kW, oH, oW, geometry,
                          columns[:, :, :, :n1 - n0])
            part = product[:, :(n1 - n0) * oH * oW]
            xp.matmul(w2, cols.reshape(C * kH * kW, -1), out=part)
            part = part.reshape(K, n1 - n0, oH * oW).transpose(1, 0, 2)  # (Nb, K, oH*oW)
            target = y[n0:n1].reshape(n1 - n0, K, oH * oW)
            if bias is None:
                target[...] = part
            else:
                xp.add(part, bias, out=target)
    saved = (x, w, b is not None, geometry, need_input_grad)
    return y, saved


def conv2d_backward(gy, saved, gw_out=None):
    """Gradients ``gx, gw, gb`` of :func:`conv2d_forward` (``gx`` is None when it was not asked for).

    ``gw`` is written into ``gw_out`` (shaped like the weight) when given.
    """
    x, w, has_bias, geometry, need_input_grad = saved
    xp = backend.array_module(gy)
    N, C, H, W = x.shape
    K, _, kH, kW = w.shape
    _, _, oH, oW = gy.shape
    w2 = w.reshape(K, C * kH * kW)
    gb = gy.sum(axis=(0, 2, 3)) if has_bias else None
    gy_nkp = gy.reshape(N, K, oH * oW)
    if geometry.is_pointwise(kH, kW):
        x_ncp = x.reshape(N, C, H * W)
        gw2 = None if gw_out is None else gw_out.reshape(K, C)
        gw2 = xp.matmul(gy_nkp.transpose(1, 0, 2).reshape(K, -1), x_ncp.transpose(1, 0, 2).reshape(C, -1).T,
                        out=gw2)  # (K, N*HW) @ (N*HW, C)
        gx = xp.matmul(w2.T, gy_nkp).reshape(N, C, H, W) if need_input_grad else None  # (N, C, HW)
        return gx, gw2.reshape(w.shape), gb
    (top, bottom), (left, right) = geometry.padding
    Hp, Wp = H + top + bottom, W + left + right
    Nb = _block_size(N, C * kH * kW * oH * oW * x.itemsize)
    columns = xp.empty((C, kH, kW, Nb, oH, oW), dtype=x.dtype)
    gw2 = xp.zeros((K, C * kH * kW), dtype=x.dtype) if gw_out is None else gw_out.reshape(K, C * kH * kW)
    gw2[...] = 0
    gx = xp.empty_like(x) if need_input_grad else None
    for n0 in range(0, N, Nb):
        n1 = min(N, n0 + Nb)
        nb = n1 - n0
        cols = im2col(pad_spatial(x[n0:n1], geometry.padding), kH, kW, oH, oW, geometry, columns[:, :, :, :nb])
        cols = cols.reshape(C * kH * kW, nb * oH * oW)
        gy_block = gy_nkp[n0:n1].transpose(1, 0, 2).reshape(K, nb * oH * oW)  # (K, Nb*oH*oW)
        gw2 += gy_block @ cols.T
        if need_input_grad:
            xp.matmul(w2.T, gy_block, out=cols)
            gxpad = xp.zeros((nb, C, Hp, Wp), dtype=x.dtype)
            col2im(cols.reshape(C, kH, kW, nb, oH, oW), kH, kW, oH, oW, geometry, gxpad)
            gx[n0:n1] = gxpad[:, :, top:top + H, left:left + W]
    if need_input_grad:
        assert gx.shape == x.shape
    return gx, gw2.reshape(w.shape), gb
