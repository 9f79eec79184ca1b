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


def _identity(partial):
    return partial


def _channel_sum(xp, a):
    # float64 accumulation keeps the statistics of large batches accurate in float32.
    return a.sum(axis=(0, 2, 3), dtype=xp.float64)


def _per_channel(v):
    return v.reshape(1, -1, 1, 1)


def batchnorm2d_forward(x, gamma, beta, running_mean, running_var, eps=1e-5, momentum=0.1, training=True,
                        reduce=_identity, count=None):
    """Returns ``y, saved``; in training also updates ``running_mean`` and ``running_var`` in place."""
    xp = backend.array_module(x)
    N, C, H, W = x.shape
    if not training:
        inv_std = 1.0 / xp.sqrt(running_var + eps)
        scale = (gamma * inv_std).astype(x.dtype)
        y = x * _per_channel(scale) + _per_channel((beta - running_mean * gamma * inv_std).astype(x.dtype))
        return y, ("eval", scale)
    M = N * H * W if count is None else count
    if M <= 1:
        raise ValueError(f"batchnorm2d: training needs more than one value per channel, got {M} "
                         f"(batch {N}, {H}x{W}); use a larger batch")
    mean = reduce(_channel_sum(xp, x)) / M
    centred = x - _per_channel(mean.astype(x.dtype))
    var = reduce(_channel_sum(xp, centred * centred)) / M
    inv_std = 1.0 / xp.sqrt(var + eps)
    xhat = centred
    xhat *= _per_channel(inv_std.astype(x.dtype))
    y = xhat * _per_channel(gamma) + _per_channel(beta)
    running_mean *= 1.0 - momentum
    running_mean += (momentum * mean).astype(running_mean.dtype)
    running_var *= 1.0 - momentum
    running_var += (momentum * var * (M / max(M - 1, 1))).astype(running_var.dtype)
    return y, ("train", xhat, gamma, inv_std.astype(x.dtype), M, reduce)


def batchnorm2d_backward(gy, saved):
    """Gradients ``gx, ggamma, gbeta``; ``ggamma`` and ``gbeta`` are already summed by ``reduce``."""
    xp = backend.array_module(gy)
    if saved[0] == "eval":
        scale = saved[1]
        return gy * _per_channel(scale), None, None
    _, xhat, gamma, inv_std, M, reduce = saved
    gbeta, ggamma = reduce(xp.stack([_channel_sum(xp, gy), _channel_sum(xp, gy * xhat)]))   # one reduction
    gx = gy - _per_channel((gbeta / M).astype(gy.dtype))
    gx -= xhat * _per_channel((ggamma / M).astype(gy.dtype))
    gx *= _per_channel(gamma * inv_std)
    assert gx.shape == gy.shape
    return gx, ggamma.astype(gy.dtype), gbeta.astype(gy.dtype)
