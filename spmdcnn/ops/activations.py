"""The activations of today's CNNs, as ``torch.nn.functional``'s, forward and backward, one element at a time:

    sigmoid      y = 1 / (1 + exp(-x))                      gx = gy * y * (1 - y)            (keeps y)
    silu         y = x * sigmoid(x)                         gx = gy * s * (1 + x * (1 - s))  (keeps x)
    gelu         y = x * Phi(x)                             gx = gy * (Phi(x) + x * phi(x))  (keeps x)
    gelu, approximate tanh:  y = x/2 * (1 + tanh(u)),  u = sqrt(2/pi) * (x + 0.044715 x^3)     (keeps x)
    hardswish    y = x * relu6(x + 3) / 6                   gx = gy * (2x + 3) / 6 inside (-3, 3), gy from 3
    hardsigmoid  y = relu6(x + 3) / 6                       gx = gy / 6 inside (-3, 3)       (keeps a mask)
    relu6        y = min(max(x, 0), 6)                      gx = gy inside (0, 6)            (keeps a mask)
    hardtanh     y = min(max(x, lo), hi)                    gx = gy inside (lo, hi)          (keeps a mask)
    clamp        y = min(max(x, lo), hi)                    gx = gy inside [lo, hi]          (keeps a mask)
    elu          y = g x (x > 0), g a (exp(s x) - 1)        gx = gy g, gy g a s exp(s x)     (keeps x; SELU's a, g)
    mish         y = x tanh(softplus(x))                    gx = gy (t + x sigmoid(x) (1 - t^2)), t = tanh(sp(x))

(``Phi`` and ``phi``: the standard normal's distribution and density; at the kinks the gradients are PyTorch's.)
The op table's ``keeps`` says what each keeps, so the executor knows which may write over their input
(``inplace``). NumPy has no ``erf``: exact GELU takes, in float64, W. J. Cody's rational Chebyshev approximation
(Math. Comp. 23, 1969; netlib SPECFUN ``calerf``), accurate to float64's precision; in float32 (and bfloat16, which
computes in float32) the rational approximation on [-4, 4] that Eigen and XLA use for float32 (an odd degree-13
numerator over an even degree-8 denominator; within 4.5e-7 of erf, a few float32 ulp, and exactly +-1 beyond),
about a fifth of Cody's work and without its three masked intervals; CuPy's ``cupyx.scipy.special.erf`` on a GPU.
On the host, exact GELU runs over cache-sized chunks split between threads (``ops/parallel.py``), so that its
dozen passes stay in cache: one process's ConvNeXt-T step at batch 8 spent 5.4 of its 9.3 s in GELU before.
Each runs on NumPy and CuPy arrays alike.
"""

import math

from .. import backend
from .parallel import over_chunks

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
GELU_TANH = 0.044715

# Cody's coefficients (netlib SPECFUN calerf): erf on |x| <= 0.46875, erfc on (0.46875, 4], erfc beyond
_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02, 3.20937758913846947e03,
      1.85777706184603153e-1)
_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03, 2.84423683343917062e03)
_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01, 2.98635138197400131e02,
      8.81952221241769090e02, 1.71204761263407058e03, 2.05107837782607147e03, 1.23033935479799725e03,
      2.15311535474403846e-8)
_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02, 1.62138957456669019e03,
      3.29079923573345963e03, 4.36261909014324716e03, 3.43936767414372164e03, 1.23033935480374942e03)
_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1, 1.60837851487422766e-2,
      6.58749161529837803e-4, 1.63153871373020978e-2)
_Q = (2.56852019228982242e00, 1.87295284992346047e00, 5.27905102951428412e-1, 6.05183413124413191e-2,
      2.33520497626869185e-3)
_SQRPI = 5.6418958354775628695e-1      # 1 / sqrt(pi)


# Eigen's and XLA's float32 erf on [-4, 4]: x * p(x^2) / q(x^2)
_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
         -1.42647390514189e-02)
CHUNK = 1 << 14         # elements a host loop takes at a time: its temporaries stay in the core's cache


def erf(x):
    """The error function of ``x`` (NumPy: Cody's approximation in float64, Eigen's and XLA's in float32; CuPy:
    its own)."""
    xp = backend.array_module(x)
    if xp.__name__ != "numpy":
        from cupyx.scipy.special import erf as device_erf
        return device_erf(x)
    if x.dtype == xp.float32:
        return _erf32(x)
    if x.dtype != xp.float64:               # float16, bfloat16: in float32, rounded back
        return _erf32(x.astype(xp.float32)).astype(x.dtype)
    y = xp.abs(x)
    result = xp.empty_like(x)
    small = y <= 0.46875
    z = y[small] ** 2
    num, den = _A[4] * z, z
    for i in range(3):
        num, den = (num + _A[i]) * z, (den + _B[i]) * z
    result[small] = x[small] * (num + _A[3]) / (den + _B[3])
    middle = (y > 0.46875) & (y <= 4.0)
    w = y[middle]
    num, den = _C[8] * w, w
    for i in range(7):
        num, den = (num + _C[i]) * w, (den + _D[i]) * w
    result[middle] = _erfc_scaled_to_erf(w, (num + _C[7]) / (den + _D[7]), x[middle])
    large = y > 4.0
    w = y[large]
    z = 1.0 / (w * w)
    num, den = _P[5] * z, z
    for i in range(4):
        num, den = (num + _P[i]) * z, (den + _Q[i]) * z
    tail = (_SQRPI - z * (num + _P[4]) / (den + _Q[4])) / w
    result[large] = _erfc_scaled_to_erf(w, tail, x[large])
    return result


def _erf32(x):
    """erf of a float32 array: Eigen's and XLA's rational approximation (module docstring)."""
    xp = backend.array_module(x)
    x = xp.clip(x, -4.0, 4.0)
    x2 = x * x
    p = x2 * _ALPHA[0]
    p += _ALPHA[1]
    for a in _ALPHA[2:]:
        p *= x2
        p += a
    q = x2 * _BETA[0]
    q += _BETA[1]
    for b in _BETA[2:]:
        q *= x2
        q += b
    p *= x
    p /= q
    return p


def _by_chunks(function, out, *arrays):
    """``out[...] = function(*arrays)`` element by element, over cache-sized chunks of the flattened (contiguous)
    arrays, split between threads; ``out`` is returned."""
    flats = [array.reshape(-1) for array in arrays]
    target = out.reshape(-1)

    def run(part):
        target[part] = function(*(flat[part] for flat in flats))
    over_chunks(run, target.size, CHUNK)
    return out


def _erfc_scaled_to_erf(y, scaled, x):
    """erf of ``x`` (|x| = ``y``) from ``scaled`` = erfc(y) exp(y^2), exp(-y^2) split as Cody does (y rounded to
    sixteenths, then the rest) to keep its accuracy."""
    xp = backend.array_module(y)
    rounded = xp.trunc(y * 16.0) / 16.0
    erfc = xp.exp(-rounded * rounded) * xp.exp(-(y - rounded) * (y + rounded)) * scaled
    return xp.where(x < 0, erfc - 1.0, 1.0 - erfc)


def _work(x):
    """``(x in its computing type, the activations' type)``: float32 for bfloat16."""
    dtype = x.dtype
    if dtype.name == "bfloat16":
        return x.astype(backend.array_module(x).float32), dtype
    return x, dtype


def _sigmoid(x):
    xp = backend.array_module(x)
    y = xp.tanh(x * 0.5)        # sigmoid(x) = (1 + tanh(x / 2)) / 2, without exp's overflow
    y += 1.0
    y *= 0.5
    return y


def sigmoid_forward(x, inplace=False):
    """``(y, y)``: it keeps its output."""
    w, dtype = _work(x)
    y = _sigmoid(w).astype(dtype, copy=False)
    if inplace and y is not x and dtype.name != "bfloat16":
        x[...] = y
        y = x
    return y, y


def sigmoid_backward(gy, y):
    w, dtype = _work(y)
    gx = w * (1.0 - w)
    gx *= gy
    return gx.astype(dtype, copy=False)


def silu_forward(x, inplace=False):
    """``(y, x)``: it keeps its input (never written over)."""
    w, dtype = _work(x)
    return (w * _sigmoid(w)).astype(dtype, copy=False), x


def silu_backward(gy, x):
    w, dtype = _work(x)
    s = _sigmoid(w)
    gx = 1.0 - s
    gx *= w
    gx += 1.0
    gx *= s
    gx *= gy
    return gx.astype(dtype, copy=False)


def _gelu_tanh_inner(w):
    xp = backend.array_module(w)
    return xp.tanh(SQRT_2_OVER_PI * (w + GELU_TANH * w * w * w))


def gelu_forward(x, approximate="none", inplace=False):
    """``(y, x)``: exact (``approximate: none``) or PyTorch's tanh approximation; it keeps its input."""
    w, dtype = _work(x)
    if approximate == "tanh":
        y = 0.5 * w * (1.0 + _gelu_tanh_inner(w))
    elif backend.on_device(w):
        y = _gelu(w)
    else:
        y = _by_chunks(_gelu, backend.array_module(w).empty(w.shape, w.dtype), w)
    return y.astype(dtype, copy=False), x


def _gelu(w):
    y = erf(w * (1.0 / math.sqrt(2.0)))
    y += 1.0
    y *= w
    y *= 0.5
    return y


def _gelu_gradient(w, gy):
    xp = backend.array_module(w)
    gx = erf(w * (1.0 / math.sqrt(2.0)))
    gx += 1.0
    gx *= 0.5
    density = w * w
    density *= -0.5
    gx += w * INV_SQRT_2PI * xp.exp(density, out=density)
    gx *= gy
    return gx


def gelu_backward(gy, x, approximate="none"):
    xp = backend.array_module(gy)
    w, dtype = _work(x)
    if approximate == "tanh":
        t = _gelu_tanh_inner(w)
        gx = 0.5 * (1.0 + t) + 0.5 * w * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_TANH * w * w)
        gx *= gy
    elif backend.on_device(w):
        gx = _gelu_gradient(w, gy)
    else:
        gy = xp.ascontiguousarray(gy).astype(w.dtype, copy=False)
        gx = _by_chunks(_gelu_gradient, xp.empty(w.shape, w.dtype), xp.ascontiguousarray(w), gy)
    return gx.astype(dtype, copy=False)


def hardswish_forward(x, inplace=False):
    """``(y, x)``: it keeps its input."""
    xp = backend.array_module(x)
    w, dtype = _work(x)
    y = xp.clip(w + 3.0, 0.0, 6.0)
    y *= w
    y *= 1.0 / 6.0
    return y.astype(dtype, copy=False), x


def hardswish_backward(gy, x):
    xp = backend.array_module(gy)
    w, dtype = _work(x)
    # PyTorch's: 0 up to -3, (2x + 3) / 6 inside (-3, 3), 1 from 3
    gx = xp.where(w <= -3.0, 0.0, xp.where(w < 3.0, (2.0 * w + 3.0) * (1.0 / 6.0), 1.0)).astype(w.dtype)
    gx *= gy
    return gx.astype(dtype, copy=False)


def _clamped(x, low, high, scale, shift, inplace):
    """``(clip(x * scale + shift, low, high), the mask of the open interval where its gradient passes)``."""
    xp = backend.array_module(x)
    w, dtype = _work(x)
    inside = ((w * scale + shift) > low) & ((w * scale + shift) < high)
    if inplace and dtype.name != "bfloat16":
        y = x
        if scale != 1.0:
            y *= scale
        if shift:
            y += shift
        xp.clip(y, low, high, out=y)
        return y, inside
    y = xp.clip(w * scale + shift if (scale != 1.0 or shift) else w, low, high)
    return y.astype(dtype, copy=False), inside


def hardsigmoid_forward(x, inplace=False):
    """``(y, mask)``: it keeps the one-byte mask of (-3, 3)."""
    return _clamped(x, 0.0, 1.0, 1.0 / 6.0, 0.5, inplace)


def hardsigmoid_backward(gy, inside):
    gx = gy * inside
    gx *= 1.0 / 6.0
    return gx


def relu6_forward(x, inplace=False):
    """``(y, mask)``: it keeps the one-byte mask of (0, 6)."""
    return _clamped(x, 0.0, 6.0, 1.0, 0.0, inplace)


def relu6_backward(gy, inside):
    return gy * inside


def elu_forward(x, alpha=1.0, gain=1.0, input_scale=1.0, inplace=False):
    """``(y, x)``: PyTorch's ``elu`` with its ``scale`` (``gain``) and ``input_scale``, ``gain * x`` where ``x > 0``,
    else ``gain * alpha * (exp(input_scale * x) - 1)`` (SELU: alpha 1.6733, gain 1.0507); it keeps its input."""
    xp = backend.array_module(x)
    w, dtype = _work(x)
    negative = xp.expm1(xp.minimum(w, 0) * input_scale)
    negative *= gain * alpha
    return xp.where(w > 0, w * gain, negative).astype(dtype, copy=False), x


def elu_backward(gy, x, alpha=1.0, gain=1.0, input_scale=1.0):
    xp = backend.array_module(gy)
    w, dtype = _work(x)
    slope = xp.exp(xp.minimum(w, 0) * input_scale)
    slope *= gain * alpha * input_scale
    return (xp.where(w > 0, gain, slope) * gy).astype(dtype, copy=False)


def mish_forward(x, inplace=False):
    """``(y, x)``: ``x * tanh(softplus(x))``; it keeps its input."""
    xp = backend.array_module(x)
    w, dtype = _work(x)
    return (w * xp.tanh(xp.logaddexp(0.0, w))).astype(dtype, copy=False), x


def mish_backward(gy, x):
    """PyTorch's: ``gy * (tanh(softplus(x)) + x * sigmoid(x) * (1 - tanh(softplus(x))^2))``."""
    xp = backend.array_module(gy)
    w, dtype = _work(x)
    t = xp.tanh(xp.logaddexp(0.0, w))
    gx = 1.0 - t * t
    gx *= w * _sigmoid(w)
    gx += t
    gx *= gy
    return gx.astype(dtype, copy=False)


def hardtanh_forward(x, min_val=-1.0, max_val=1.0, inplace=False):
    """``(y, mask)``: ``x`` clamped to [min_val, max_val]; it keeps the one-byte mask of the open interval."""
    return _clamped(x, min_val, max_val, 1.0, 0.0, inplace)


def hardtanh_backward(gy, inside, min_val=-1.0, max_val=1.0):
    return gy * inside


def clamp_forward(x, low=None, high=None, inplace=False):
    """``(y, mask)``: ``x`` clamped to [low, high] (either None: unbounded that side); it keeps the one-byte mask
    of the closed interval, where PyTorch's clamp passes the gradient (hardtanh's open one does not at the
    bounds)."""
    xp = backend.array_module(x)
    w, dtype = _work(x)
    inside = xp.ones(w.shape, dtype=bool)
    if low is not None:
        inside &= w >= low
    if high is not None:
        inside &= w <= high
    if inplace and dtype.name != "bfloat16":
        return xp.clip(x, low, high, out=x), inside
    return xp.clip(w, low, high).astype(dtype, copy=False), inside


def clamp_backward(gy, inside, low=None, high=None):
    return gy * inside
