"""Rectified linear unit: ``y = max(x, 0)``; ``gx = gy * (x > 0)``. Forward keeps the one-byte mask ``x > 0``.

On the host each direction is one pass over cache-sized chunks split between threads (``parallel.over_chunks``):
the mask is made from the chunk just read, and backward writes ``gx`` as it reads ``gy``."""

from .. import backend
from .cuda import kernels as cuda
from .parallel import over_chunks


def relu_forward(x, inplace=False):
    """``inplace=True`` writes ``y`` over ``x`` (the caller guarantees nothing else reads ``x``)."""
    if backend.on_device(x):
        return cuda.relu_forward(x, inplace)
    xp = backend.array_module(x)
    return with_mask(x, inplace, lambda chunk, positive, out: xp.maximum(chunk, 0, out=out))


def with_mask(x, inplace, compute):
    """``(y, x > 0)`` on the host, ``compute(chunk, positive, out)`` writing each chunk of ``y`` from that of ``x``
    and of its mask, in one pass over cache-sized chunks split between threads; ``y`` is ``x`` when ``inplace``."""
    xp = backend.array_module(x)
    x = xp.ascontiguousarray(x)
    y = x if inplace else xp.empty_like(x)
    positive = xp.empty(x.shape, dtype=bool)
    xs, ys, ps = x.reshape(-1), y.reshape(-1), positive.reshape(-1)

    def run(part):
        xp.greater(xs[part], 0, out=ps[part])       # before y is written: it may be x
        compute(xs[part], ps[part], ys[part])
    over_chunks(run, x.size)
    return y, positive


def relu_backward(gy, positive):
    if backend.on_device(gy):
        return cuda.relu_backward(gy, positive)
    return masked(gy, positive, 0.0)


def masked(gy, positive, slope):
    """``gy`` where ``positive``, ``slope * gy`` elsewhere (the gradient of ReLU and of leaky ReLU), in one pass."""
    xp = backend.array_module(gy)
    gy = xp.ascontiguousarray(gy)
    gx = xp.empty_like(gy)
    gys, gxs, ps = gy.reshape(-1), gx.reshape(-1), positive.reshape(-1)
    bits = xp.dtype(f"u{gy.itemsize}")                 # an unsigned integer as wide as the gradient's type
    base = xp.asarray(slope, dtype=gy.dtype).view(bits)
    step = xp.asarray(1, dtype=gy.dtype).view(bits) - base

    def scaled(part):   # gy times 1 or the slope, exactly: the factor's bits are the slope's plus the mask times
        # (1's - the slope's), in wrapping integers (a masked copy, NumPy's where or copyto, is 4x slower)
        factor = xp.multiply(ps[part], step, dtype=bits)
        factor += base
        xp.multiply(gys[part], factor.view(gy.dtype), out=gxs[part])

    def kept(part):
        xp.multiply(gys[part], ps[part], out=gxs[part])
    over_chunks(scaled if slope else kept, gy.size)
    return gx
