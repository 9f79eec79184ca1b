"""Dropout's counter-based mask: a pure function of (seed, step, layer, global element index).

Whatever the plan, a tile must draw exactly the mask entries that the whole tensor has at its position; kept
values are scaled by 1 / (1 - p).
"""

import numpy as np
import pytest

from spmdcnn.ops.dropout import dropout_backward, dropout_forward, dropout_mask, stream_key

MASK64 = (1 << 64) - 1


def splitmix64_finaliser(z):
    """SplitMix64's output function, written out independently of the package."""
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def random_boxes(rng, global_shape, count):
    for _ in range(count):
        start = [int(rng.integers(0, extent)) for extent in global_shape]
        shape = [int(rng.integers(1, extent - s + 1)) for s, extent in zip(start, global_shape)]
        yield tuple(start), tuple(shape)


@pytest.mark.parametrize("global_shape", [(4, 6, 7, 9), (13, 37)])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_mask_of_a_box_is_the_slice_of_the_whole_mask(global_shape, p):
    key = stream_key(3, 17, "drop6")
    whole = dropout_mask(np, global_shape, p, key)
    assert whole.shape == global_shape and whole.dtype == bool
    assert 0 < whole.sum() < whole.size
    rng = np.random.default_rng(len(global_shape))
    for start, shape in random_boxes(rng, global_shape, 8):
        box = tuple(slice(s, s + e) for s, e in zip(start, shape))
        tile = dropout_mask(np, shape, p, key, start=start, global_shape=global_shape)
        np.testing.assert_array_equal(tile, whole[box], err_msg=f"box start={start} shape={shape}")
        # the same through forward: a tile of x gives the same tile of y
        x = rng.standard_normal(global_shape)
        y_whole, _ = dropout_forward(x, p, key)
        y_tile, _ = dropout_forward(np.ascontiguousarray(x[box]), p, key, start, global_shape)
        np.testing.assert_array_equal(y_tile, y_whole[box])


def test_tiles_of_a_split_cover_the_whole_mask():
    """An uneven 2 x 3 split over (h, w) reassembles to the whole tensor's mask."""
    global_shape, p, key = (3, 2, 7, 10), 0.4, stream_key(0, 1, "drop")
    whole = dropout_mask(np, global_shape, p, key)
    rebuilt = np.zeros(global_shape, dtype=bool)
    rows, cols = [0, 3, 7], [0, 3, 6, 10]
    for h0, h1 in zip(rows, rows[1:]):
        for w0, w1 in zip(cols, cols[1:]):
            rebuilt[:, :, h0:h1, w0:w1] = dropout_mask(np, (3, 2, h1 - h0, w1 - w0), p, key,
                                                       start=(0, 0, h0, w0), global_shape=global_shape)
    np.testing.assert_array_equal(rebuilt, whole)


def test_mask_depends_only_on_the_row_major_global_index():
    key = stream_key(1, 2, "fc_drop")
    four_d = dropout_mask(np, (3, 4, 5, 6), 0.3, key)
    flat = dropout_mask(np, (360,), 0.3, key)
    np.testing.assert_array_equal(four_d.reshape(-1), flat)
    np.testing.assert_array_equal(dropout_mask(np, (12, 30), 0.3, key).reshape(-1), flat)


@pytest.mark.parametrize("p", [0.0, 0.25, 0.5, 0.9])
def test_mask_is_the_documented_hash(p):
    """Element ``i`` is kept when the top 53 bits of finaliser(i ^ key), as a fraction of 2**53, are >= p."""
    key = stream_key(7, 3, "drop7")
    mask = dropout_mask(np, (4, 50), p, key)
    threshold = int(round(p * (1 << 53)))
    expected = [(splitmix64_finaliser(i ^ key) >> 11) >= threshold for i in range(200)]
    np.testing.assert_array_equal(mask.reshape(-1), expected)


def test_stream_key_is_deterministic_and_64_bit():
    key = stream_key(42, 1000, "drop6")
    assert key == stream_key(42, 1000, "drop6")
    assert isinstance(key, int) and 0 <= key <= MASK64


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_keep_rate_is_one_minus_p(p):
    size = 400_000
    mask = dropout_mask(np, (100, 4000), p, stream_key(0, 0, "drop"))
    sigma = np.sqrt(p * (1 - p) / size)
    assert abs(mask.mean() - (1 - p)) < 5 * sigma
    # no structure along rows or columns either
    assert np.all(np.abs(mask.mean(axis=1) - (1 - p)) < 6 * np.sqrt(p * (1 - p) / 4000))


@pytest.mark.parametrize("other", [(0, 1, "drop6"), (0, 0, "drop7"), (1, 0, "drop6"), (0, 100, "drop6"),
                                   (2**40, 0, "drop6")])
def test_step_layer_and_seed_each_change_the_mask(other):
    p, shape = 0.5, (50, 400)
    base = dropout_mask(np, shape, p, stream_key(0, 0, "drop6"))
    changed = dropout_mask(np, shape, p, stream_key(*other))
    agreement = (base == changed).mean()
    # independent masks agree on p^2 + (1-p)^2 = 1/2 of the elements
    assert abs(agreement - 0.5) < 5 * np.sqrt(0.25 / base.size), agreement


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("p", [0.2, 0.5, 0.75])
def test_forward_scales_kept_values_and_zeroes_the_rest(p, dtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 4, 5, 6)) + 3.0).astype(dtype)   # no zeros in x
    x_copy = x.copy()
    key = stream_key(9, 4, "drop")
    y, saved = dropout_forward(x, p, key)
    mask = dropout_mask(np, x.shape, p, key)
    assert y.dtype == dtype and y.shape == x.shape
    np.testing.assert_array_equal(y == 0, ~mask)
    rtol = 1e-15 if dtype == np.float64 else 1e-6
    np.testing.assert_allclose(y[mask], x[mask] / (1 - p), rtol=rtol)
    np.testing.assert_array_equal(x, x_copy, err_msg="dropout changed its input")
    gy = rng.standard_normal(x.shape).astype(dtype)
    gx = dropout_backward(gy, saved)
    assert gx.dtype == dtype
    np.testing.assert_allclose(gx, gy * mask / (1 - p), rtol=rtol, atol=0)


def test_zero_rate_is_the_identity():
    rng = np.random.default_rng(2)
    x, gy = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 4, 5))
    y, saved = dropout_forward(x, 0.0, stream_key(0, 0, "drop"))
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(dropout_backward(gy, saved), gy)
    assert dropout_mask(np, x.shape, 0.0, stream_key(0, 0, "drop")).all()


def test_rate_one_drops_everything():
    rng = np.random.default_rng(3)
    x, gy = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 4, 5))
    y, saved = dropout_forward(x, 1.0, stream_key(0, 0, "drop"))
    np.testing.assert_array_equal(y, np.zeros_like(x))   # zeros, not NaN from 0 * inf
    np.testing.assert_array_equal(dropout_backward(gy, saved), np.zeros_like(gy))
    assert not dropout_mask(np, x.shape, 1.0, stream_key(0, 0, "drop")).any()
