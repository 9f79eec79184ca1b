"""Group, instance and layer normalisation against PyTorch in float64, forward and backward, over 1, 2 and 3
spatial axes; and split outputs: tiles of their own boxes that add their partial sums of each (sample, group) give the
whole op's values and gradients (the input's per tile, gamma's and beta's summed over the tiles' channels)."""

import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from spmdcnn.ops import groupnorm as gn
from spmdcnn.tiling.statistics import touched_groups

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


def _whole(x, gamma, beta, groups, eps=1e-5):
    C = x.shape[1]
    per = C // groups
    members = gn.group_members(np, 0, C, per, 0, groups)
    return gn.groupnorm_forward(x, gamma, beta, members, per * int(np.prod(x.shape[2:])), eps)


@pytest.mark.parametrize("case", CASES)
def test_groupnorm_equals_pytorch(case):
    x, gamma, beta = _arrays(case)
    groups = CASES[case][1]
    y, saved = _whole(x, gamma, beta, groups)
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


class _Tiles:
    """A sum over tiles run in threads, as MPI's allreduce over their ranks: each call waits for every tile's."""

    def __init__(self, count):
        self.barrier, self.parts, self.count = threading.Barrier(count), {}, count

    def reducer(self, index):
        def reduce(array):
            self.parts[index] = array.copy()
            self.barrier.wait()
            total = sum(self.parts[i] for i in range(self.count))
            self.barrier.wait()
            array[...] = total
            return array
        return reduce


@pytest.mark.parametrize("case", CASES)
def test_tiles_of_their_own_boxes_add_their_sums(case):
    """Tiles split over channels (inside a group) and width compute, forward and backward, what the whole op
    computes at their boxes, adding their partial sums over the groups they share."""
    x, gamma, beta = _arrays(case)
    groups = CASES[case][1]
    y, saved = _whole(x, gamma, beta, groups)
    gy = np.random.default_rng(2).standard_normal(y.shape)
    gx, ggamma, gbeta = gn.groupnorm_backward(gy, saved)
    C, W = x.shape[1], x.shape[-1]
    per = C // groups
    count = per * int(np.prod(x.shape[2:]))
    inner = (slice(None),) * (x.ndim - 3)
    cut = C // 2 - 1 if C > 2 else 1
    tiles = [(c, w) for c in ((0, cut), (cut, C)) for w in ((0, W // 2), (W // 2, W))]
    sums = _Tiles(len(tiles))
    out, grads, gsum, failures = {}, {}, np.zeros(C), []

    def run(i, c0, c1, w0, w1):
        try:
            index = (slice(None), slice(c0, c1)) + inner + (slice(w0, w1),)
            members = gn.group_members(np, c0, c1, per, 0, groups)        # one table of every group, for all
            ty, tsaved = gn.groupnorm_forward(x[index], None if gamma is None else gamma[c0:c1],
                                              None if beta is None else beta[c0:c1], members, count,
                                              reduce=sums.reducer(i))
            out[i] = (index, ty)
            grads[i] = (index, c0, c1, gn.groupnorm_backward(gy[index], tsaved))
        except Exception as error:          # noqa: BLE001 - reported below
            failures.append(error)
            sums.barrier.abort()
    threads = [threading.Thread(target=run, args=(i, *c, *w)) for i, (c, w) in enumerate(tiles)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not failures, failures
    for index, ty in out.values():
        np.testing.assert_allclose(ty, y[index], rtol=1e-12, atol=1e-12)
    for index, c0, c1, (tgx, tgg, _) in grads.values():
        np.testing.assert_allclose(tgx, gx[index], rtol=1e-11, atol=1e-11)
        if gamma is not None:
            gsum[c0:c1] += tgg
    if gamma is not None:
        np.testing.assert_allclose(gsum, ggamma, rtol=1e-11, atol=1e-11)


def test_a_tiles_channels_map_to_the_groups_it_shares():
    members = gn.group_members(np, 3, 8, 2, 1, 3)     # channels 3..7, groups of 2 from group 1
    np.testing.assert_array_equal(members.argmax(axis=1), [0, 1, 1, 2, 2])
    assert members.sum() == 5 and touched_groups(3, 8, 2) == (1, 4)


# ------------------------------------------------------------------------------------- layer norm over channels

@pytest.mark.parametrize("shape,affine", [((2, 6, 5, 4), True), ((3, 4, 7), False), ((2, 5, 3, 4, 2), True),
                                          ((4, 6), True)])
def test_layernorm_over_channels_equals_pytorch(shape, affine):
    from spmdcnn.ops import layernorm as ln
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape) * 3 + 1
    gamma, beta = (rng.standard_normal(shape[1]), rng.standard_normal(shape[1])) if affine else (None, None)
    y, saved = ln.layernorm_forward(x, gamma, beta, shape[1], eps=1e-6)
    gy = rng.standard_normal(shape)
    gx, ggamma, gbeta = ln.layernorm_backward(gy, saved)
    tx = torch.tensor(x, requires_grad=True)
    tg, tb = (None, None) if not affine else (torch.tensor(gamma, requires_grad=True),
                                              torch.tensor(beta, requires_grad=True))
    ty = F.layer_norm(tx.movedim(1, -1), (shape[1],), tg, tb, 1e-6).movedim(-1, 1)     # ConvNeXt's LayerNorm2d
    ty.backward(torch.tensor(gy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-11, atol=1e-11)
    if affine:
        np.testing.assert_allclose(ggamma, tg.grad.numpy(), rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(gbeta, tb.grad.numpy(), rtol=1e-11, atol=1e-11)


def test_layernorm_tiles_of_some_channels_add_their_sums():
    """Tiles split over channels (and width) add their per-position sums over the tiles of the same positions."""
    from spmdcnn.ops import layernorm as ln
    rng = np.random.default_rng(4)
    x, gy = rng.standard_normal((2, 6, 3, 4)) * 2 + 1, rng.standard_normal((2, 6, 3, 4))
    gamma, beta = rng.standard_normal(6), rng.standard_normal(6)
    y, saved = ln.layernorm_forward(x, gamma, beta, 6)
    gx, ggamma, gbeta = ln.layernorm_backward(gy, saved)
    for w0, w1 in ((0, 1), (1, 4)):                  # each width part: its 3 channel tiles sum among themselves
        parts = [(0, 1), (1, 4), (4, 6)]
        sums = _Tiles(len(parts))
        out, failures = {}, []

        def run(i, c0, c1):
            try:
                index = (slice(None), slice(c0, c1), slice(None), slice(w0, w1))
                ty, tsaved = ln.layernorm_forward(x[index], gamma[c0:c1], beta[c0:c1], 6, reduce=sums.reducer(i))
                out[i] = (index, ty, ln.layernorm_backward(gy[index], tsaved))
            except Exception as error:          # noqa: BLE001 - reported below
                failures.append(error)
                sums.barrier.abort()
        threads = [threading.Thread(target=run, args=(i, *p)) for i, p in enumerate(parts)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not failures, failures
        for index, ty, (tgx, _, _) in out.values():
            np.testing.assert_allclose(ty, y[index], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(tgx, gx[index], rtol=1e-11, atol=1e-11)
