"""Group and instance normalisation against PyTorch in float64, forward and backward, over 1, 2 and 3 spatial
axes; and split outputs: tiles that read the whole of their samples' groups and write their own box give the
whole op's values and, added up, its gradients (the input's over the blocks read, gamma's and beta's over the
tiles' channels)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from spmdcnn.ops import groupnorm as gn

CASES = {   # x shape, groups, affine
    "image_two_groups": ((2, 6, 5, 4), 3, True),
    "sequence_instance": ((3, 4, 7), 4, False),
    "volume_two_groups": ((2, 6, 3, 4, 2), 2, True),
    "image_instance_affine": ((2, 6, 5, 4), 6, True),
    "one_group": ((2, 4, 3, 3), 1, True),
}


def _arrays(case, seed=0):
    shape, _, affine = CASES[case]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 3 + 1
    gamma = rng.standard_normal(shape[1]) if affine else None
    beta = rng.standard_normal(shape[1]) if affine else None
    return x, gamma, beta


@pytest.mark.parametrize("case", CASES)
def test_groupnorm_equals_pytorch(case):
    x, gamma, beta = _arrays(case)
    groups = CASES[case][1]
    y, saved = gn.groupnorm_forward(x, gamma, beta, groups, eps=1e-5)
    tx = torch.tensor(x, requires_grad=True)
    tg = None if gamma is None else torch.tensor(gamma, requires_grad=True)
    tb = None if beta is None else torch.tensor(beta, requires_grad=True)
    if groups == x.shape[1]:
        ty = F.instance_norm(tx, weight=tg, bias=tb, eps=1e-5)
    else:
        ty = F.group_norm(tx, groups, tg, tb, 1e-5)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    gy = np.random.default_rng(1).standard_normal(y.shape)
    ty.backward(torch.tensor(gy))
    gx, ggamma, gbeta = gn.groupnorm_backward(gy, saved)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-11, atol=1e-11)
    if gamma is not None:
        np.testing.assert_allclose(ggamma, tg.grad.numpy(), rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(gbeta, tb.grad.numpy(), rtol=1e-11, atol=1e-11)
    else:
        assert ggamma is None and gbeta is None


@pytest.mark.parametrize("case", CASES)
def test_tiles_read_whole_groups_and_write_their_box(case):
    x, gamma, beta = _arrays(case)
    groups = CASES[case][1]
    y, saved = gn.groupnorm_forward(x, gamma, beta, groups)
    gy = np.random.default_rng(2).standard_normal(y.shape)
    gx, ggamma, gbeta = gn.groupnorm_backward(gy, saved)
    C, W = x.shape[1], x.shape[-1]
    per = C // groups
    inner = (slice(None),) * (x.ndim - 3)
    total, gsum = np.zeros_like(gx), np.zeros(C)
    for c0, c1 in ((0, C // 2 - 1 if C > 2 else 1), (C // 2 - 1 if C > 2 else 1, C)):      # splits inside a group
        g0, g1 = c0 // per * per, -(-c1 // per) * per
        for w0, w1 in ((0, W // 2), (W // 2, W)):
            box = (slice(c0 - g0, c1 - g0),) + inner + (slice(w0, w1),)
            tile = (slice(None), slice(c0, c1)) + inner + (slice(w0, w1),)
            ty, tsaved = gn.groupnorm_forward(x[:, g0:g1], None if gamma is None else gamma[c0:c1],
                                              None if beta is None else beta[c0:c1], (g1 - g0) // per, box=box)
            np.testing.assert_allclose(ty, y[tile], rtol=1e-12, atol=1e-12)
            tgx, tgg, _ = gn.groupnorm_backward(gy[tile], tsaved)
            total[:, g0:g1] += tgx
            if gamma is not None:
                gsum[c0:c1] += tgg
    np.testing.assert_allclose(total, gx, rtol=1e-11, atol=1e-11)
    if gamma is not None:
        np.testing.assert_allclose(gsum, ggamma, rtol=1e-11, atol=1e-11)


def test_groups_must_divide_the_channels():
    with pytest.raises(ValueError, match="6 channels do not split into 4 groups"):
        gn.groupnorm_forward(np.zeros((1, 6, 2, 2)), None, None, 4)
