"""Batch normalisation over (N, H, W) per channel, training and evaluation.

Training:  mean = sum(x) / M,  var = sum((x - mean)^2) / M,  M = N*H*W over the *global* batch,
           y = gamma * (x - mean) / sqrt(var + eps) + beta,
           running_mean <- (1 - momentum) * running_mean + momentum * mean,
           running_var  <- (1 - momentum) * running_var  + momentum * var * M / (M - 1)   (unbiased, as PyTorch).
Backward:  gbeta = sum(gy), ggamma = sum(gy * xhat),
           gx = gamma / sqrt(var + eps) * (gy - gbeta / M - xhat * ggamma / M).

Every per-channel sum goes through ``reduce`` (identity on one device): when a tensor is split over N, H or W,
the runtime passes a function that adds the partial sums of all tiles holding the same channels, so the
statistics are those of the global batch whatever the split. ``count`` is the global M. Forward reduces twice
(the mean, then the squared deviations from it: two passes keep the variance accurate whatever the mean);
backward reduces its two sums at once, stacked as (2, C).
"""

from .. import backend
from .cuda import kernels as cuda
from .parallel import over_samples
from .scratch import scratch


def _identity(partial):
    return partial


def _per_channel(v):
    return v.reshape(1, -1, 1)


def _sums(xp, a):
    """Per-channel sums of a (N, C, HW) array: a BLAS product with ones per (n, c), then float64 over N."""
    return (a @ xp.ones(a.shape[2], dtype=a.dtype)).sum(axis=0, dtype=xp.float64)


def _centred_dots(xp, a, x, mean):
    """Per-channel ``sum(a * (x - mean))`` over (N, HW), two-pass accurate, without a full-size temporary."""
    N, C, HW = x.shape
    partial = xp.empty((N, C), dtype=xp.float64)
    shift = _per_channel(mean.astype(x.dtype))

    def run(n0, n1):
        centred = scratch(xp, "batchnorm.centred", (1, C, HW), x.dtype)    # one sample: stays in cache
        for n in range(n0, n1):
            xp.subtract(x[n:n + 1], shift, out=centred)
            partial[n] = xp.einsum("ncp,ncp->c", a[n:n + 1], centred)
    over_samples(xp, run, N)
    return partial.sum(axis=0)


def batchnorm2d_forward(x, gamma, beta, running_mean, running_var, eps=1e-5, momentum=0.1, training=True,
                        reduce=_identity, count=None):
    """Returns ``y, saved``; in training also updates ``running_mean`` and ``running_var`` in place."""
    if backend.on_device(x):
        return cuda.batchnorm2d_forward(x, gamma, beta, running_mean, running_var, eps, momentum, training, reduce,
                                        count)
    xp = backend.array_module(x)
    N, C, H, W = x.shape
    x3 = x.reshape(N, C, H * W)
    if not training:
        inv_std = 1.0 / xp.sqrt(running_var + eps)
        scale = (gamma * inv_std).astype(x.dtype)
        shift = (beta - running_mean * gamma * inv_std).astype(x.dtype)
        y = x3 * _per_channel(scale)
        y += _per_channel(shift)
        return y.reshape(x.shape), ("eval", scale)
    M = N * H * W if count is None else count
    if M <= 1:
        raise ValueError(f"batchnorm2d: training needs more than one value per channel, got {M} "
                         f"(batch {N}, {H}x{W}); use a larger batch")
    mean = reduce(_sums(xp, x3)) / M
    var = reduce(_centred_dots(xp, x3, x3, mean)) / M       # sum((x - mean) * (x - mean)), since sum(x - mean) = 0
    inv_std = 1.0 / xp.sqrt(var + eps)
    scale = gamma * inv_std.astype(x.dtype)
    y = x3 * _per_channel(scale)
    y += _per_channel((beta - mean * scale).astype(x.dtype))
    running_mean *= 1.0 - momentum
    running_mean += (momentum * mean).astype(running_mean.dtype)
    running_var *= 1.0 - momentum
    running_var += (momentum * var * (M / max(M - 1, 1))).astype(running_var.dtype)
    return y.reshape(x.shape), ("train", x3, mean, gamma, inv_std, M, reduce)


def batchnorm2d_backward(gy, saved):
    """Gradients ``gx, ggamma, gbeta``; ``ggamma`` and ``gbeta`` are already summed by ``reduce``.

    With xhat = (x - mean) * inv_std: gx = gamma*inv_std * (gy - gbeta/M) - gamma*inv_std^2*ggamma/M * (x - mean).
    """
    if backend.on_device(gy):
        return cuda.batchnorm2d_backward(gy, saved)
    xp = backend.array_module(gy)
    if saved[0] == "eval":
        scale = saved[1]
        return gy * _per_channel(scale).reshape(1, -1, 1, 1), None, None
    _, x3, mean, gamma, inv_std, M, reduce = saved
    gy3 = gy.reshape(x3.shape)
    gbeta, dot = reduce(xp.stack([_sums(xp, gy3), _centred_dots(xp, gy3, x3, mean)]))    # one reduction
    ggamma = dot * inv_std
    k1 = (gamma * inv_std).astype(gy.dtype)
    k2 = _per_channel((gamma * inv_std * inv_std * ggamma / M).astype(gy.dtype))
    k3 = _per_channel((gamma * inv_std * gbeta / M).astype(gy.dtype))
    shift = _per_channel(mean.astype(gy.dtype))
    gx = xp.empty_like(gy3)

    def run(n0, n1):
        centred = scratch(xp, "batchnorm.centred", (1,) + x3.shape[1:], gy.dtype)
        for n in range(n0, n1):
            block = gx[n:n + 1]
            xp.multiply(gy3[n:n + 1], _per_channel(k1), out=block)
            xp.subtract(x3[n:n + 1], shift, out=centred)   # (x - mean) first: no cancellation when |mean| >> std
            centred *= k2
            block -= centred
            block -= k3
    over_samples(xp, run, gy.shape[0])
    return gx.reshape(gy.shape), ggamma.astype(gy.dtype), gbeta.astype(gy.dtype)
