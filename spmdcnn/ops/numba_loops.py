"""numba's loops behind ``ops/compiled.py`` (imported there on the first call, so that a process that never runs
them never imports numba). Each takes rows ``[r0, r1)`` of its work; see ``ops/compiled.py``."""

import numba

_jit = numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})    # NaN and inf kept


@_jit
def centred_dots(a, x, mean, out, r0, r1):
    """``out[r] = sum(a[r] * (x[r] - mean[c]))``."""
    C = mean.shape[0]
    for r in range(r0, r1):
        m, ar, xr = mean[r % C], a[r], x[r]
        total = 0.0
        for p in range(xr.shape[0]):
            total += ar[p] * (xr[p] - m)
        out[r] = total


@_jit
def gradient_sums(gy, x, mean, sums, dots, r0, r1):
    """``sums[r] = sum(gy[r])``, ``dots[r] = sum(gy[r] * (x[r] - mean[c]))`` in one pass."""
    C = mean.shape[0]
    for r in range(r0, r1):
        m, g, xr = mean[r % C], gy[r], x[r]
        total, dot = 0.0, 0.0
        for p in range(xr.shape[0]):
            total += g[p]
            dot += g[p] * (xr[p] - m)
        sums[r] = total
        dots[r] = dot


@_jit
def affine(x, scale, shift, y, r0, r1):
    """``y[r] = x[r] * scale[c] + shift[c]``."""
    C = scale.shape[0]
    for r in range(r0, r1):
        a, b, xr, yr = scale[r % C], shift[r % C], x[r], y[r]
        for p in range(xr.shape[0]):
            yr[p] = xr[p] * a + b


@_jit
def input_gradient(gy, x, mean, k1, k2, k3, gx, r0, r1):
    """``gx[r] = gy[r] * k1[c] - (x[r] - mean[c]) * k2[c] - k3[c]``."""
    C = mean.shape[0]
    for r in range(r0, r1):
        c = r % C
        a, b, e, m, g, xr, out = k1[c], k2[c], k3[c], mean[c], gy[r], x[r], gx[r]
        for p in range(xr.shape[0]):
            out[p] = g[p] * a - (xr[p] - m) * b - e


@numba.njit(nogil=True, cache=True)
def maxpool_backward(gy, argmax, kernel, stride, gx, r0, r1):
    """Adds each output's gradient to its window's winner in the zeroed padded rows ``gx``."""
    _, kh, kw = kernel
    sd, sh, sw = stride
    for r in range(r0, r1):
        for od in range(gy.shape[1]):
            for oh in range(gy.shape[2]):
                for ow in range(gy.shape[3]):
                    i = argmax[r, od, oh, ow]
                    a, rest = divmod(i, kh * kw)
                    b, c = divmod(rest, kw)
                    gx[r, od * sd + a, oh * sh + b, ow * sw + c] += gy[r, od, oh, ow]
