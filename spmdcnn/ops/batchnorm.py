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
from .saved import BatchNormSaved
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
                        reduce=None, count=None):
    """Returns ``y, saved``; in training also updates ``running_mean`` and ``running_var`` in place. On the GPU
    the sums and the element-wise passes are fused kernels (ops/cuda); parameters and statistics may be float32
    under bfloat16 activations. ``reduce`` sums the per-channel statistics over the tiles of the same channels
    (None: this tile holds all of them)."""
    reduce = reduce or _identity
    xp = backend.array_module(x)
    device = backend.on_device(x)
    N, C, H, W = x.shape
    x3 = x.reshape(N, C, H * W)
    if not training:
        inv_std = 1.0 / xp.sqrt(running_var + eps)
        scale = (gamma * inv_std).astype(gamma.dtype)
        shift = (beta - running_mean * gamma * inv_std).astype(gamma.dtype)
        return _affine(xp, x3, scale, shift, device).reshape(x.shape), BatchNormSaved("eval", scale)
    M = N * H * W if count is None else count
    if M <= 1:
        raise ValueError(f"batchnorm2d: training needs more than one value per channel, got {M} "
                         f"(batch {N}, {H}x{W}); use a larger batch")
    sums = cuda.bn_sums(x3) if device else _sums(xp, x3)
    mean = reduce(sums) / M
    # sum((x - mean) * (x - mean)), since sum(x - mean) = 0
    var = reduce(cuda.bn_centred_dot(x3, x3, mean) if device else _centred_dots(xp, x3, x3, mean)) / M
    inv_std = 1.0 / xp.sqrt(var + eps)
    scale = gamma * inv_std.astype(gamma.dtype)
    y = _affine(xp, x3, scale, (beta - mean * scale).astype(gamma.dtype), device)
    running_mean *= 1.0 - momentum
    running_mean += (momentum * mean).astype(running_mean.dtype)
    running_var *= 1.0 - momentum
    running_var += (momentum * var * (M / max(M - 1, 1))).astype(running_var.dtype)
    return y.reshape(x.shape), BatchNormSaved("train", None, x3, mean, gamma, inv_std, M, reduce)


def _affine(xp, x3, scale, shift, device):
    """``x * scale + shift`` per channel."""
    if device:
        return cuda.bn_affine(x3, scale, shift)
    y = x3 * _per_channel(scale.astype(x3.dtype, copy=False))
    y += _per_channel(shift.astype(x3.dtype, copy=False))
    return y


def batchnorm2d_backward(gy, saved):
    """Gradients ``gx, ggamma, gbeta``; ``ggamma`` and ``gbeta`` are already summed by ``reduce``.

    With xhat = (x - mean) * inv_std: gx = gamma*inv_std * (gy - gbeta/M) - gamma*inv_std^2*ggamma/M * (x - mean).
    """
    xp = backend.array_module(gy)
    device = backend.on_device(gy)
    if saved.mode == "eval":
        scale = saved.scale
        N, C = gy.shape[:2]
        return _affine(xp, gy.reshape(N, C, -1), scale, xp.zeros_like(scale), device).reshape(gy.shape), None, None
    x3, mean, gamma, inv_std, M, reduce = saved.x3, saved.mean, saved.gamma, saved.inv_std, saved.count, saved.reduce
    gy3 = gy.reshape(x3.shape)
    if device:
        partial = xp.stack([cuda.bn_sums(gy3), cuda.bn_centred_dot(gy3, x3, mean)])
    else:
        partial = xp.stack([_sums(xp, gy3), _centred_dots(xp, gy3, x3, mean)])
    gbeta, dot = reduce(partial)                 # one reduction for both
    ggamma = dot * inv_std
    k1 = gamma * inv_std
    k2 = gamma * inv_std * inv_std * ggamma / M
    k3 = gamma * inv_std * gbeta / M
    if device:
        gx = cuda.bn_backward(gy3, x3, mean, k1, k2, k3)
    else:
        gx = _backward(xp, gy3, x3, mean, k1, k2, k3)
    return gx.reshape(gy.shape), ggamma.astype(gamma.dtype), gbeta.astype(gamma.dtype)


def _backward(xp, gy3, x3, mean, k1, k2, k3):
    """``gy * k1 - (x - mean) * k2 - k3`` per channel, a sample at a time (the centred sample stays in cache)."""
    dtype = gy3.dtype
    k1, k2, k3 = (_per_channel(k.astype(dtype)) for k in (k1, k2, k3))
    shift = _per_channel(mean.astype(dtype))
    gx = xp.empty_like(gy3)

    def run(n0, n1):
        centred = scratch(xp, "batchnorm.centred", (1,) + x3.shape[1:], dtype)
        for n in range(n0, n1):
            block = gx[n:n + 1]
            xp.multiply(gy3[n:n + 1], k1, out=block)
            xp.subtract(x3[n:n + 1], shift, out=centred)   # (x - mean) first: no cancellation when |mean| >> std
            centred *= k2
            block -= centred
            block -= k3
    over_samples(xp, run, gy3.shape[0])
    return gx
