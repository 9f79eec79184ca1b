"""Ghost batch norm's op: statistics per group of samples, equal to batch norm of each group on its own, and split
over tiles (a tile holding part of a group, combining with the others through ``gather`` and ``reduce``)."""

import numpy as np
import pytest

from spmdcnn.ops.batchnorm import (batchnorm_backward, batchnorm_forward, ghost_batchnorm_backward,
                                   ghost_batchnorm_forward)


def inputs(rng, shape):
    x = rng.standard_normal(shape) * 3 + 5
    C = shape[1]
    return x, rng.standard_normal(C), rng.standard_normal(C)


def per_group(x, gamma, beta, gy, G):
    """Plain batch norm on each group of G samples: outputs, input gradients, summed parameter gradients, and the
    groups' means and unbiased variances."""
    ys, gxs, ggamma, gbeta, means, variances = [], [], 0, 0, [], []
    for g in range(x.shape[0] // G):
        mean, var = np.zeros(x.shape[1]), np.ones(x.shape[1])
        y, saved = batchnorm_forward(x[g * G:(g + 1) * G], gamma, beta, mean, var, momentum=1.0, training=True)
        gx, gg, gb = batchnorm_backward(gy[g * G:(g + 1) * G], saved)
        ys.append(y), gxs.append(gx), means.append(mean), variances.append(var)
        ggamma, gbeta = ggamma + gg, gbeta + gb
    return np.concatenate(ys), np.concatenate(gxs), ggamma, gbeta, np.array(means), np.array(variances)


@pytest.mark.usefixtures("host_kernels")
@pytest.mark.parametrize("G", [1, 2, 3, 6])
def test_one_tile_of_the_whole_batch_is_batch_norm_per_group(G):
    rng = np.random.default_rng(4)
    x, gamma, beta = inputs(rng, (6, 3, 4, 5))
    gy = rng.standard_normal(x.shape)
    if G == 1 and x.shape[2] * x.shape[3] < 2:
        return
    spans = [(g * G, (g + 1) * G) for g in range(6 // G)]
    y, saved, (means, variances) = ghost_batchnorm_forward(x, gamma, beta, spans, G * 4 * 5)
    gx, ggamma, gbeta, own_ggamma, own_gbeta = ghost_batchnorm_backward(gy, saved)
    want = per_group(x, gamma, beta, gy, G)
    for got, expected in zip((y, gx, ggamma, gbeta, means, variances), want):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(own_ggamma, ggamma, rtol=1e-12)       # alone: its own part is the whole
    np.testing.assert_allclose(own_gbeta, gbeta, rtol=1e-12)


@pytest.mark.usefixtures("host_kernels")
def test_tiles_splitting_groups_combine_to_the_whole():
    """Samples 0-2 on one tile, 3-5 on another, groups of 4: group 0 = samples 0-3 spans both tiles."""
    rng = np.random.default_rng(5)
    x, gamma, beta = inputs(rng, (8, 2, 3, 3))
    gy = rng.standard_normal(x.shape)
    G, count = 4, 4 * 9
    whole = per_group(x, gamma, beta, gy, G)
    cuts = ((0, 3), (3, 8))
    spans = [tuple((min(max(g * G - n0, 0), n1 - n0), min(max((g + 1) * G - n0, 0), n1 - n0)) for g in range(2))
             for n0, n1 in cuts]
    # each tile's statistics, then each gathers both (as the component's allgather gives them)
    stats = []
    for (n0, n1), span in zip(cuts, spans):
        captured = {}
        with np.errstate(invalid="ignore"):     # alone, a tile has no statistics of the group it lacks
            ghost_batchnorm_forward(x[n0:n1], gamma, beta, span, count,
                                      gather=lambda s: captured.setdefault("s", s)[None])
        stats.append(captured["s"])
    stacked = np.stack(stats)
    partials = []
    results = []
    for (n0, n1), span in zip(cuts, spans):
        y, saved, (means, variances) = ghost_batchnorm_forward(x[n0:n1], gamma, beta, span, count,
                                                                  gather=lambda s: stacked)
        np.testing.assert_allclose(means, whole[4], rtol=1e-12)
        np.testing.assert_allclose(variances, whole[5], rtol=1e-10)
        np.testing.assert_allclose(y, whole[0][n0:n1], rtol=1e-10, atol=1e-12)
        captured = {}
        ghost_batchnorm_backward(gy[n0:n1], saved, reduce=lambda p: captured.setdefault("p", p))
        partials.append(captured["p"])
        results.append(saved)
    total = partials[0] + partials[1]
    own = [0, 0]
    for (n0, n1), saved in zip(cuts, results):
        gx, ggamma, gbeta, own_ggamma, own_gbeta = ghost_batchnorm_backward(gy[n0:n1], saved,
                                                                              reduce=lambda p: total)
        np.testing.assert_allclose(gx, whole[1][n0:n1], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(ggamma, whole[2], rtol=1e-10)
        np.testing.assert_allclose(gbeta, whole[3], rtol=1e-10)
        own = [own[0] + own_ggamma, own[1] + own_gbeta]
    np.testing.assert_allclose(own[0], whole[2], rtol=1e-10)     # the tiles' own parts sum to the whole
    np.testing.assert_allclose(own[1], whole[3], rtol=1e-10)


def test_a_group_of_one_value_per_channel_is_refused():
    x = np.ones((2, 1, 1, 1))
    with pytest.raises(ValueError, match="more than one value"):
        ghost_batchnorm_forward(x, np.ones(1), np.zeros(1), [(0, 1), (1, 2)], 1)
