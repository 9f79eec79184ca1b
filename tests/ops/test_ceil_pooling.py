"""Pooling with ``ceil_mode`` against PyTorch's (float64, forward and backward, 1 to 3 spatial axes): floor mode over
the extra padding ``graph/optable.window`` adds, average pooling's last windows divided by what they hold inside
the padded input (``count_include_pad=True``)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from spmdcnn.graph.optable import window
from spmdcnn.ops.pool import PoolGeometry, avgpool_backward, avgpool_forward, maxpool_backward, maxpool_forward
from spmdcnn.ops.pool import window_counts
from spmdcnn.ops.window import ceil_extra

# input (N, C, S...), kernel, stride, padding (symmetric, as PyTorch takes it)
CASES = {
    "odd_3s2": ((2, 3, 9, 10), 3, 2, 0),
    "padded_3s2": ((2, 2, 4, 5), 3, 2, 1),
    "squeezenet": ((1, 2, 13, 13), 3, 2, 0),
    "last_window_would_start_in_padding": ((1, 2, 5, 6), 2, 2, 1),
    "rect": ((2, 2, 7, 8), [3, 2], [2, 3], [1, 0]),
    "volume": ((1, 2, 5, 4, 7), 2, 2, 0),
    "sequence": ((3, 2, 11), 4, 3, 2),
}


def geometry_of(case):
    x_shape, kernel, stride, padding = CASES[case]
    rank = len(x_shape) - 2
    attrs = {"kernel": kernel, "stride": stride, "padding": padding, "ceil_mode": True}
    written, ceil = window(attrs, rank), window(attrs, rank, x_shape[2:])
    out = [(size + before + after - k) // s + 1 for size, k, s, (before, after) in
           zip(x_shape[2:], ceil.kernel, ceil.stride, ceil.padding)]
    counts = tuple(window_counts(0, o, k, s, 0, size + before + after) for o, k, s, (before, after), size
                   in zip(out, written.kernel, written.stride, written.padding, x_shape[2:]))
    return PoolGeometry(ceil.kernel, ceil.stride, ceil.padding, counts=counts), written


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_ceil_mode_pooling_against_pytorch(case, kind):
    x_shape = CASES[case][0]
    geometry, written = geometry_of(case)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(x_shape)
    forward, backward = (maxpool_forward, maxpool_backward) if kind == "max" else (avgpool_forward, avgpool_backward)
    y, saved = forward(x, geometry)
    tx = torch.tensor(x, requires_grad=True)
    ty = getattr(F, f"{kind}_pool{len(x_shape) - 2}d")(tx, written.kernel, written.stride,
                                                       padding=[before for before, _ in written.padding],
                                                       ceil_mode=True)
    assert y.shape == tuple(ty.shape)
    gy = rng.standard_normal(y.shape)
    ty.backward(torch.tensor(gy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(backward(gy, saved), tx.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_ceil_mode_adds_a_window_only_where_the_floor_leaves_input_unread():
    assert ceil_extra(9, 3, 2, 0, 0) == 0           # floor reads all 9
    assert ceil_extra(10, 3, 2, 0, 0) == 1          # floor leaves the 10th: one more window, 1 past the end
    assert ceil_extra(5, 2, 2, 1, 1) == 0           # the window it would add starts in the padding after
    assert window({"kernel": 3, "stride": 2, "ceil_mode": True}, 2, (10, 9)).padding == ((0, 1), (0, 0))
    assert window({"kernel": 3, "stride": 2}, 2, (10, 9)).padding == ((0, 0), (0, 0))


def test_window_counts_leave_out_what_lies_past_the_padded_input():
    assert window_counts(0, 4, 3, 2, 0, 8) == (3, 3, 3, 2)
    assert window_counts(2, 4, 3, 2, 0, 8) == (3, 2)
