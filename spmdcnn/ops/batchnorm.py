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
from . import compiled
from .parallel import over_samples
from .saved import BatchNormSaved, GhostSaved

ROW_ELEMENTS = 1 << 18          # elements of each operand a NumPy call of the host's passes touches (a block)


def _identity(partial):
    return partial


def _per_channel(v):
    return v.reshape(1, -1, 1)


def _sums(xp, a):
    """Per-channel sums of a (N, C, HW) array: a BLAS product with ones per (n, c), then float64 over N."""
    return (a @ xp.ones(a.shape[2], dtype=a.dtype)).sum(axis=0, dtype=xp.float64)


class _Blocks:
    """The host's passes over a (N, C, HW) array in blocks of about :data:`ROW_ELEMENTS`: a few whole samples
    where a sample is smaller (a call on one small sample spends more in Python than in the loop, and two threads
    then wait on each other for the GIL), else some channels of one sample, so that every operand's block stays in
    the core's cache through the few calls a pass makes on it. Fixed by the shape alone, so that the sums are
    grouped alike however the blocks are shared out between threads. ``rows``: the blocks of samples (a block of
    channels is in the row of its sample)."""

    def __init__(self, shape):
        N, C, HW = shape
        if C * HW <= ROW_ELEMENTS:
            per = max(1, min(N, ROW_ELEMENTS // max(C * HW, 1)))
            self.list = [(n // per, slice(n, min(N, n + per)), slice(None)) for n in range(0, N, per)]
        else:
            per = max(1, ROW_ELEMENTS // max(HW, 1))
            self.list = [(n, slice(n, n + 1), slice(c, min(C, c + per))) for n in range(N) for c in range(0, C, per)]
        self.rows = self.list[-1][0] + 1 if self.list else 0
        self.elements = N * C * HW

    def run(self, xp, body):
        """``body(row, samples, channels)`` for every block, the blocks shared out between threads."""
        def run(b0, b1):
            for row, n, c in self.list[b0:b1]:
                body(row, n, c)
        over_samples(xp, run, len(self.list), self.elements)


def _centred_dots(xp, a, x, mean):
    """Per-channel ``sum(a * (x - mean))`` over (N, HW), two-pass accurate, without a full-size temporary."""
    if compiled.available(a, x):
        return compiled.centred_dots(a, x, mean)
    blocks = _Blocks(x.shape)
    partial = xp.zeros((blocks.rows, x.shape[1]), dtype=xp.float64)
    shift = _per_channel(mean.astype(x.dtype))

    def run(row, n, c):
        centred = xp.subtract(x[n, c], shift[:, c])      # a block: it stays in cache
        partial[row, c] = xp.einsum("ncp,ncp->c", a[n, c], centred)
    blocks.run(xp, run)
    return partial.sum(axis=0)


def _gradient_sums(xp, gy, x, mean):
    """Backward's per-channel ``sum(gy)`` and ``sum(gy * (x - mean))`` as (2, C) float64, in one pass over both."""
    if compiled.available(gy, x):
        return compiled.gradient_sums(gy, x, mean)
    blocks = _Blocks(x.shape)
    partial = xp.zeros((2, blocks.rows, x.shape[1]), dtype=xp.float64)
    shift = _per_channel(mean.astype(x.dtype))
    ones = xp.ones(x.shape[2], dtype=x.dtype)

    def run(row, n, c):
        g = gy[n, c]
        partial[0, row, c] = (g @ ones).sum(axis=0, dtype=xp.float64)
        centred = xp.subtract(x[n, c], shift[:, c])
        partial[1, row, c] = xp.einsum("ncp,ncp->c", g, centred)
    blocks.run(xp, run)
    return partial.sum(axis=1)


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
    """``x * scale + shift`` per channel (on the host block by block, :class:`_Blocks`: the product is still in
    cache when the shift is added)."""
    if device:
        return cuda.bn_affine(x3, scale, shift)
    if compiled.available(x3):
        return compiled.affine(x3, scale, shift)
    scale, shift = (_per_channel(v.astype(x3.dtype, copy=False)) for v in (scale, shift))
    y = xp.empty_like(x3)

    def run(_, n, c):
        block = y[n, c]
        xp.multiply(x3[n, c], scale[:, c], out=block)
        block += shift[:, c]
    _Blocks(x3.shape).run(xp, run)
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
        partial = _gradient_sums(xp, gy3, x3, mean)
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
    """``gy * k1 - (x - mean) * k2 - k3`` per channel, block by block (:class:`_Blocks`: the centred block stays in
    cache)."""
    if compiled.available(gy3, x3):
        return compiled.input_gradient(gy3, x3, mean, k1, k2, k3)
    dtype = gy3.dtype
    k1, k2, k3 = (_per_channel(k.astype(dtype)) for k in (k1, k2, k3))
    shift = _per_channel(mean.astype(dtype))
    gx = xp.empty_like(gy3)

    def run(_, n, c):
        block = gx[n, c]
        xp.multiply(gy3[n, c], k1[:, c], out=block)
        centred = xp.subtract(x3[n, c], shift[:, c])   # (x - mean) first: no cancellation when |mean| >> std
        centred *= k2[:, c]
        block -= centred
        block -= k3[:, c]
    _Blocks(x3.shape).run(xp, run)
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
            if device:
                partial[0, g], partial[1, g] = cuda.bn_sums(a), cuda.bn_centred_dot(a, b, mean[g])
            else:
                partial[:, g] = _gradient_sums(xp, a, b, mean[g])
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
