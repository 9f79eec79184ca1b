"""A softmax across groups of channels (SKNet's and ResNeSt's split attention: each channel's weight over the
paths it is one of): channel ``g * P + p`` of ``G`` groups of ``P`` is normalised with channels ``g' * P + p`` of
every group ``g'``, at each sample and position:

    y[g, p] = exp(x[g, p]) / sum_g' exp(x[g', p]),    gx = y * (gy - sum_g' gy[g'] * y[g'])

It keeps its output; its tiles read every channel at their positions (they are never split over channels). Written
once for every array module (NumPy and CuPy alike) and every spatial rank; bfloat16 computes in float32.
"""

from .. import backend


def _grouped(a, groups):
    return a.reshape((a.shape[0], groups, a.shape[1] // groups) + a.shape[2:])


def group_softmax_forward(x, groups):
    """``(y, (y, groups))``: it keeps its output."""
    xp = backend.array_module(x)
    work = xp.float32 if x.dtype.name == "bfloat16" else x.dtype
    grouped = _grouped(x.astype(work, copy=False), groups)
    shifted = grouped - grouped.max(axis=1, keepdims=True)
    e = xp.exp(shifted)
    e /= e.sum(axis=1, keepdims=True)
    y = e.reshape(x.shape).astype(x.dtype, copy=False)
    return y, (y, groups)


def group_softmax_backward(gy, saved):
    y, groups = saved
    xp = backend.array_module(gy)
    work = xp.float32 if gy.dtype.name == "bfloat16" else gy.dtype
    g, s = (_grouped(a.astype(work, copy=False), groups) for a in (gy, y))
    gx = s * (g - (g * s).sum(axis=1, keepdims=True))
    return gx.reshape(gy.shape).astype(gy.dtype, copy=False)
