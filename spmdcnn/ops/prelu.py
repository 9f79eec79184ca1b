"""A parametric ReLU (PyTorch's ``nn.PReLU``, MONAI's default activation): ``y = x`` where ``x > 0``, else
``weight * x``, with one learned slope shared by every channel (``nn.PReLU()``) or one per channel
(``nn.PReLU(C)``). ``gx = gy`` where ``x > 0``, else ``weight * gy``; the slopes' gradient sums ``x * gy`` where
``x <= 0`` (over every channel for a shared one). Forward keeps its input; written once for every array module
(NumPy and CuPy alike) and every spatial rank."""

from .. import backend


def _slopes(weight, x):
    return weight.astype(x.dtype, copy=False).reshape((1, -1) + (1,) * (x.ndim - 2))


def prelu_forward(x, weight):
    """``(y, x)``."""
    xp = backend.array_module(x)
    return xp.where(x > 0, x, x * _slopes(weight, x)), x


def prelu_backward(gy, x, weight):
    """``(gx, gweight)``, ``gweight`` in float64 sums (float32 for float32 and narrower) cast to the slopes' type."""
    xp = backend.array_module(gy)
    positive = x > 0
    gx = xp.where(positive, gy, gy * _slopes(weight, gy))
    over = (0,) + tuple(range(2, gy.ndim)) if weight.size > 1 else None
    gweight = xp.where(positive, 0, x * gy).sum(axis=over, dtype=xp.float64 if gy.dtype == xp.float64 else xp.float32)
    return gx, xp.reshape(gweight, weight.shape).astype(weight.dtype, copy=False)
