"""Batch normalisation per channel over the samples and every spatial axis (PyTorch's BatchNorm1d/2d/3d on
(N, C, S...)), training and evaluation; one implementation for every spatial rank.

Training:  mean = sum(x) / M,  var = sum((x - mean)^2) / M,  M = N*prod(S) over the *global* batch,
           y = gamma * (x - mean) / sqrt(var + eps) + beta,
           running_mean <- (1 - momentum) * running_mean + momentum * mean,
           running_var  <- (1 - momentum) * running_var  + momentum * var * M / (M - 1)   (unbiased, as PyTorch).
Backward:  gbeta = sum(gy), ggamma = sum(gy * xhat),
           gx = gamma / sqrt(var + eps) * (gy - gbeta / M - xhat * ggamma / M).

When a tensor is split over N or a spatial axis, the tiles holding the same channels combine their statistics, so they
are those of the global batch whatever the split. Forward communicates once: each tile computes its count, mean
and M2 (the sum of squared deviations from its own mean, two passes: accurate whatever the mean), ``gather``
stacks those of every tile, and each combines them in the same order as Chan et al.'s parallel variance,
``M2 = sum M2_i + sum n_i (mean_i - mean)^2``. Backward sums its two per-channel sums at once through
``reduce``, stacked as (2, C). ``count`` is the global M.
"""

from .. import backend
from .cuda import kernels as cuda
from .parallel import over_samples
from .saved import BatchNormSaved, GhostSaved
from .scratch import scratch

ROW_ELEMENTS = 1 << 16          # elements a NumPy call of the host's per-sample passes touches at least


def _identity(partial):
    return partial


def _per_channel(v):
    return v.reshape(1, -1, 1)


def _sums(xp, a):
    """Per-channel sums of a (N, C, HW) array: a BLAS product with ones per (n, c), then float64 over N."""
    return (a @ xp.ones(a.shape[2], dtype=a.dtype)).sum(axis=0, dtype=xp.float64)


def _rows(x3):
    """Samples per NumPy call in the host's passes: enough for a call to touch :data:`ROW_ELEMENTS` (a call on one
    small sample spends more in Python than in the loop, and two threads then wait on each other for the GIL),
    few enough that the centred block stays in cache. Fixed by the shape alone, so the sums are grouped alike
    however the samples are shared out between threads."""
    return max(1, min(x3.shape[0], ROW_ELEMENTS // max(x3.shape[1] * x3.shape[2], 1)))


def _over_rows(xp, x3, body):
    """``body(block, n0, n1)`` for each block of :func:`_rows` samples, the blocks shared out between threads."""
    N, rows = x3.shape[0], _rows(x3)

    def run(b0, b1):
        for b in range(b0, b1):
            body(b, b * rows, min(N, (b + 1) * rows))
    over_samples(xp, run, -(-N // rows), x3.size)


def _centred_dots(xp, a, x, mean):
    """Per-channel ``sum(a * (x - mean))`` over (N, HW), two-pass accurate, without a full-size temporary."""
    N, C, HW = x.shape
    partial = xp.empty((-(-N // _rows(x)), C), dtype=xp.float64)
    shift = _per_channel(mean.astype(x.dtype))

    def run(b, n0, n1):
        centred = scratch(xp, "batchnorm.centred", (n1 - n0, C, HW), x.dtype)    # a few samples: stay in cache
        xp.subtract(x[n0:n1], shift, out=centred)
        partial[b] = xp.einsum("ncp,ncp->c", a[n0:n1], centred)
    _over_rows(xp, x, run)
    return partial.sum(axis=0)


def combine_moments(stats):
    """The mean and M2 per channel of the values of several parts from each part's ``(count, mean, M2)``:
    ``stats`` is ``(parts, 3, ...)`` float64 (Chan, Golub and LeVeque's pairwise update, summed in part order);
    a part of count 0 adds nothing."""
    counts, means, m2 = stats[:, 0], stats[:, 1], stats[:, 2]
    total = counts.sum(axis=0)
    mean = (counts * means).sum(axis=0) / total
    return mean, m2.sum(axis=0) + (counts * (means - mean) ** 2).sum(axis=0)


def batchnorm_forward(x, gamma, beta, running_mean, running_var, eps=1e-5, momentum=0.1, training=True,
                      reduce=None, gather=None, count=None):
    """Returns ``y, saved``; in training also updates ``running_mean`` and ``running_var`` in place. On the GPU
    the sums and the element-wise passes are fused kernels (ops/cuda); parameters and statistics may be float32
    under bfloat16 activations. Over the tiles of the same channels (None: this tile holds all of them),
    ``gather`` stacks their statistics for the forward and ``reduce`` sums backward's."""
    reduce = reduce or _identity
    xp = backend.array_module(x)
    device = backend.on_device(x)
    N, C = x.shape[:2]
    x3 = x.reshape(N, C, -1)                                # (N, C, S)
    if not training:
        inv_std = 1.0 / xp.sqrt(running_var + eps)
        scale = (gamma * inv_std).astype(gamma.dtype)
        shift = (beta - running_mean * gamma * inv_std).astype(gamma.dtype)
        return _affine(xp, x3, scale, shift, device).reshape(x.shape), BatchNormSaved("eval", scale)
    local = x3.shape[0] * x3.shape[2]
    M = local if count is None else count
    if M <= 1:
        raise ValueError(f"batchnorm: training needs more than one value per channel, got {M} "
                         f"(batch {N}, {'x'.join(map(str, x.shape[2:])) or 'no spatial axes'}); use a larger batch")
    mean = (cuda.bn_sums(x3) if device else _sums(xp, x3)) / local
    # sum((x - mean) * (x - mean)), since sum(x - mean) = 0
    m2 = cuda.bn_centred_dot(x3, x3, mean) if device else _centred_dots(xp, x3, x3, mean)
    if gather is not None:
        mean, m2 = combine_moments(gather(xp.stack([xp.full_like(mean, local), mean, m2])))
    var = m2 / M
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


def batchnorm_backward(gy, saved):
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
    """``gy * k1 - (x - mean) * k2 - k3`` per channel, a few samples at a time (the centred block stays in
    cache)."""
    dtype = gy3.dtype
    k1, k2, k3 = (_per_channel(k.astype(dtype)) for k in (k1, k2, k3))
    shift = _per_channel(mean.astype(dtype))
    gx = xp.empty_like(gy3)

    def run(_, n0, n1):
        centred = scratch(xp, "batchnorm.centred", (n1 - n0,) + x3.shape[1:], dtype)
        block = gx[n0:n1]
        xp.multiply(gy3[n0:n1], k1, out=block)
        xp.subtract(x3[n0:n1], shift, out=centred)   # (x - mean) first: no cancellation when |mean| >> std
        centred *= k2
        block -= centred
        block -= k3
    _over_rows(xp, x3, run)
    return gx


def ghost_batchnorm_forward(x, gamma, beta, spans, count, eps=1e-5, gather=None):
    """Training forward of ghost batch norm: statistics per group of samples. ``spans`` gives, per group, the
    tile's samples ``(s0, s1)`` of it (empty for a group only other tiles hold), ``count`` the values per channel
    of a whole group (G*prod(S)), ``gather`` stacks the ``(groups, 3, C)`` statistics of the tiles sharing these groups
    (None: this tile alone holds them). Returns ``y, saved, (means, unbiased variances)`` per group (rows)."""
    xp = backend.array_module(x)
    device = backend.on_device(x)
    N, C = x.shape[:2]
    x3 = x.reshape(N, C, -1)                                # (N, C, S)
    positions = x3.shape[2]
    if count <= 1:
        raise ValueError(f"batchnorm: training needs more than one value per channel in a group, got {count}")
    stats = xp.zeros((len(spans), 3, C), dtype=xp.float64)
    for g, (s0, s1) in enumerate(spans):
        if s1 > s0:
            part = x3[s0:s1]
            mean = (cuda.bn_sums(part) if device else _sums(xp, part)) / ((s1 - s0) * positions)
            stats[g, 0] = (s1 - s0) * positions
            stats[g, 1] = mean
            stats[g, 2] = cuda.bn_centred_dot(part, part, mean) if device else _centred_dots(xp, part, part, mean)
    stacked = gather(stats) if gather is not None else stats[None]
    mean, m2 = combine_moments(xp.asarray(stacked).transpose(0, 2, 1, 3))
    var = m2 / count
    inv_std = 1.0 / xp.sqrt(var + eps)
    y = xp.empty_like(x3)
    for g, (s0, s1) in enumerate(spans):
        if s1 > s0:
            scale = gamma * inv_std[g].astype(gamma.dtype)
            y[s0:s1] = _affine(xp, x3[s0:s1], scale, (beta - mean[g] * scale).astype(gamma.dtype), device)
    return y.reshape(x.shape), GhostSaved(x3, tuple(spans), mean, gamma, inv_std, count), (mean, var * count / (count - 1))


def ghost_batchnorm_backward(gy, saved, reduce=None):
    """Gradients of ghost batch norm: ``gx`` and, per channel, ``ggamma`` and ``gbeta`` twice: summed over the
    groups' totals (``reduce`` adds the partial sums of the tiles sharing the groups; None: this tile alone), and
    this tile's own part of them (summed over the tiles of a replica group, they give the totals)."""
    xp = backend.array_module(gy)
    device = backend.on_device(gy)
    x3, spans, mean, gamma, inv_std, M = saved.x3, saved.spans, saved.mean, saved.gamma, saved.inv_std, saved.count
    gy3 = gy.reshape(x3.shape)
    partial = xp.zeros((2, len(spans), x3.shape[1]), dtype=xp.float64)
    for g, (s0, s1) in enumerate(spans):
        if s1 > s0:
            a, b = gy3[s0:s1], x3[s0:s1]
            partial[0, g] = cuda.bn_sums(a) if device else _sums(xp, a)
            partial[1, g] = cuda.bn_centred_dot(a, b, mean[g]) if device else _centred_dots(xp, a, b, mean[g])
    own_gbeta, own_ggamma = partial[0].sum(axis=0), (partial[1] * inv_std).sum(axis=0)
    gbeta, dot = reduce(partial) if reduce is not None else partial
    ggamma = dot * inv_std
    gx = xp.empty_like(gy3)
    for g, (s0, s1) in enumerate(spans):
        if s1 > s0:
            k1 = gamma * inv_std[g]
            k2 = gamma * inv_std[g] * inv_std[g] * ggamma[g] / M
            k3 = gamma * inv_std[g] * gbeta[g] / M
            if device:
                gx[s0:s1] = cuda.bn_backward(gy3[s0:s1], x3[s0:s1], mean[g], k1, k2, k3)
            else:
                gx[s0:s1] = _backward(xp, gy3[s0:s1], x3[s0:s1], mean[g], k1, k2, k3)
    dtype = gamma.dtype
    return (gx.reshape(gy.shape), ggamma.sum(axis=0).astype(dtype), gbeta.sum(axis=0).astype(dtype),
            own_ggamma.astype(dtype), own_gbeta.astype(dtype))
