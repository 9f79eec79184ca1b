"""Dataset HDF5 (docs/formats.md#dataset-files) and the synthetic source: scaling, normalisation, batch order, errors."""

import os

import h5py
import numpy as np
import pytest

from spmdcnn.graph import load_model
from spmdcnn.io.dataset import DataError, HDF5Dataset, sample_order
from spmdcnn.io.synthetic import SyntheticData
from spmdcnn.io.yamlfile import FormatError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "models", "tiny_cnn.yaml")

N, C, H, W = 23, 3, 5, 4


def write_dataset(path, images, labels=None, image_attrs=None, file_attrs=None):
    with h5py.File(path, "w") as f:
        if images is not None:
            f.create_dataset("images", data=images)
            f["images"].attrs.update(image_attrs or {})
        if labels is not None:
            f.create_dataset("labels", data=labels)
        f.attrs.update(file_attrs or {})
    return str(path)


def uint8_images(n=N, shape=(C, H, W), seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(n, *shape), dtype=np.uint8)


def float_images(n=N, shape=(C, H, W), seed=0):
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)


def labels_for(n=N):
    # Label i identifies sample i, so every batch says which samples it holds.
    return np.arange(n, dtype=np.int64)


@pytest.fixture
def opened():
    handles = []

    def open_(*args, **kwargs):
        dataset = HDF5Dataset(*args, **kwargs)
        handles.append(dataset)
        return dataset

    yield open_
    for dataset in handles:
        dataset.close()


def expect_error(path, *fragments, **kwargs):
    with pytest.raises(DataError) as info:
        dataset = HDF5Dataset(path, **kwargs)
        dataset.close()
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message
    return message


# --- values -------------------------------------------------------------------------------------------------------

def test_uint8_images_are_scaled_then_normalised_per_channel(tmp_path, opened):
    images = uint8_images()
    mean, std = np.array([0.4, 0.5, 0.6]), np.array([0.2, 0.25, 0.3])
    path = write_dataset(tmp_path / "d.h5", images, labels_for(), {"mean": mean, "std": std})
    dataset = opened(path, shuffle=False)
    x, y = dataset.read(np.arange(N))
    expected = (images.astype(np.float64) / 255 - mean[None, :, None, None]) / std[None, :, None, None]
    assert x.dtype == np.float32 and x.shape == (N, C, H, W)
    np.testing.assert_allclose(x, expected, rtol=1e-5, atol=1e-6)
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, labels_for())


def test_uint8_images_without_attributes_are_only_scaled(tmp_path, opened):
    images = uint8_images()
    images[0, 0, 0, 0], images[1, 0, 0, 0] = 0, 255
    path = write_dataset(tmp_path / "d.h5", images, labels_for())
    x, _ = opened(path, shuffle=False).read(np.arange(N))
    np.testing.assert_allclose(x, images / 255.0, rtol=1e-6)
    assert x[0, 0, 0, 0] == 0 and x[1, 0, 0, 0] == pytest.approx(1.0)


def test_float32_images_without_attributes_are_unchanged(tmp_path, opened):
    images = float_images() * 300  # values far outside [0, 1]: nothing may divide by 255
    path = write_dataset(tmp_path / "d.h5", images, labels_for())
    x, _ = opened(path, shuffle=False).read(np.arange(N))
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x, images)


def test_float32_images_are_normalised_but_not_scaled(tmp_path, opened):
    images = float_images()
    mean, std = np.array([1.0, -2.0, 0.5]), np.array([2.0, 4.0, 0.5])
    path = write_dataset(tmp_path / "d.h5", images, labels_for(), {"mean": mean, "std": std})
    x, _ = opened(path, shuffle=False).read(np.arange(N))
    np.testing.assert_allclose(x, (images - mean[None, :, None, None]) / std[None, :, None, None], rtol=1e-5,
                               atol=1e-6)


def test_read_as_float64(tmp_path, opened):
    images = uint8_images()
    path = write_dataset(tmp_path / "d.h5", images, labels_for())
    x, _ = opened(path).read([3, 1], dtype=np.float64)
    assert x.dtype == np.float64
    np.testing.assert_array_equal(x, images[[3, 1]] / 255.0)


def test_read_returns_unsorted_and_repeated_indices_in_the_requested_order(tmp_path, opened):
    images = uint8_images()
    path = write_dataset(tmp_path / "d.h5", images, labels_for())
    indices = [7, 2, 7, 0, 22, 2, 15]
    x, y = opened(path).read(indices)
    np.testing.assert_array_equal(y, indices)
    np.testing.assert_allclose(x, images[indices] / 255.0, rtol=1e-6)


# --- batch order -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [1, 4, 7])
def test_batches_without_shuffle_are_consecutive_samples(tmp_path, opened, batch):
    images = uint8_images()
    path = write_dataset(tmp_path / "d.h5", images, labels_for())
    dataset = opened(path, seed=5, shuffle=False)
    assert dataset.batches_per_epoch(batch) == N // batch
    for epoch in (0, 3):
        for s in range(N // batch):
            x, y = dataset.batch(epoch, s, batch)
            np.testing.assert_array_equal(y, np.arange(s * batch, (s + 1) * batch))
            np.testing.assert_allclose(x, images[s * batch:(s + 1) * batch] / 255.0, rtol=1e-6)


def test_batches_with_shuffle_follow_the_permutation_of_seed_and_epoch(tmp_path, opened):
    images = uint8_images()
    path = write_dataset(tmp_path / "d.h5", images, labels_for())
    dataset = opened(path, seed=9, shuffle=True)
    B = 5
    for epoch in (0, 1, 2):
        order = sample_order(N, epoch, 9, True)
        assert sorted(order.tolist()) == list(range(N))  # a permutation
        seen = []
        for s in range(dataset.batches_per_epoch(B)):
            x, y = dataset.batch(epoch, s, B)
            np.testing.assert_array_equal(y, order[s * B:(s + 1) * B])
            np.testing.assert_allclose(x, images[order[s * B:(s + 1) * B]] / 255.0, rtol=1e-6)
            seen.extend(y.tolist())
        assert len(set(seen)) == len(seen) == (N // B) * B  # no sample twice in an epoch


def test_sample_order_is_a_fixed_function_of_seed_and_epoch():
    np.testing.assert_array_equal(sample_order(50, 0, 0, False), np.arange(50))
    np.testing.assert_array_equal(sample_order(50, 7, 3, False), np.arange(50))
    a = sample_order(50, 2, 3, True)
    np.testing.assert_array_equal(a, sample_order(50, 2, 3, True))
    assert not np.array_equal(a, np.arange(50))
    assert not np.array_equal(a, sample_order(50, 3, 3, True))   # another epoch
    assert not np.array_equal(a, sample_order(50, 2, 4, True))   # another seed


def test_same_seed_epoch_and_step_give_the_same_batch_in_another_reader(tmp_path, opened):
    path = write_dataset(tmp_path / "d.h5", uint8_images(), labels_for())
    first, second = opened(path, seed=2), opened(path, seed=2)
    for epoch, s in ((0, 0), (1, 3), (4, 2)):
        x1, y1 = first.batch(epoch, s, 4)
        second.batch(epoch, (s + 1) % 5, 4)  # reading something else in between changes nothing
        x2, y2 = second.batch(epoch, s, 4)
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    y0 = [first.batch(0, s, 4)[1] for s in range(5)]
    y1 = [first.batch(1, s, 4)[1] for s in range(5)]
    assert not np.array_equal(np.concatenate(y0), np.concatenate(y1))
    other_seed = opened(path, seed=3)
    assert not np.array_equal(np.concatenate(y0), np.concatenate([other_seed.batch(0, s, 4)[1] for s in range(5)]))


def test_dataset_properties_and_matching_model(tmp_path, opened):
    graph = load_model(TINY)
    path = write_dataset(tmp_path / "d.h5", uint8_images(6, graph.input_shape), labels_for(6))
    dataset = opened(path)
    assert dataset.num_samples == 6
    assert dataset.sample_shape == graph.input_shape
    dataset.check_model(graph)


def test_a_scalar_mean_and_std_apply_to_every_channel(tmp_path, opened):
    images = uint8_images()
    path = write_dataset(tmp_path / "d.h5", images, labels_for(), {"mean": 0.5, "std": 0.25})
    x, _ = opened(path).read(np.arange(N))
    np.testing.assert_allclose(x, (images / 255.0 - 0.5) / 0.25, rtol=1e-5, atol=1e-6)


# --- errors ---------------------------------------------------------------------------------------------------------

def test_data_error_is_a_format_error():
    assert issubclass(DataError, FormatError) and issubclass(DataError, ValueError)


def test_missing_file(tmp_path):
    expect_error(tmp_path / "absent.h5", "not found")


def test_not_hdf5(tmp_path):
    path = tmp_path / "d.h5"
    path.write_text("images,labels\n1,2\n")
    expect_error(path, "not HDF5")


@pytest.mark.parametrize("absent", ["images", "labels"])
def test_missing_array(tmp_path, absent):
    images = uint8_images() if absent != "images" else None
    labels = labels_for() if absent != "labels" else None
    expect_error(write_dataset(tmp_path / "d.h5", images, labels), f"/{absent}")


@pytest.mark.parametrize("shape", [(N, C), (N, C, 4, H, W, 1), (N,)])
def test_images_of_the_wrong_ndim(tmp_path, shape):
    images = np.zeros(shape, dtype=np.uint8)
    expect_error(write_dataset(tmp_path / "d.h5", images, labels_for()), "/images", "(N, C, H, W)",
                 "(N, C, D, H, W)")


def test_images_of_an_unsupported_dtype(tmp_path):
    images = np.zeros((N, C, H, W), dtype=np.int16)
    expect_error(write_dataset(tmp_path / "d.h5", images, labels_for()), "/images", "int16")


@pytest.mark.parametrize("labels", [np.arange(N - 1), np.arange(N + 1), np.zeros((N, 1), dtype=np.int64)])
def test_labels_not_one_per_image(tmp_path, labels):
    expect_error(write_dataset(tmp_path / "d.h5", uint8_images(), labels), "/labels", f"({N},)")


def test_labels_that_are_not_integers(tmp_path):
    expect_error(write_dataset(tmp_path / "d.h5", uint8_images(), labels_for().astype(np.float32)), "/labels")


@pytest.mark.parametrize("std", [[1.0, 0.0, 1.0], [1.0, -0.5, 1.0], 0.0])
def test_non_positive_std(tmp_path, std):
    path = write_dataset(tmp_path / "d.h5", uint8_images(), labels_for(), {"mean": [0.5] * C, "std": std})
    expect_error(path, "'std'")


def test_non_positive_std_in_the_file_attributes(tmp_path):
    path = write_dataset(tmp_path / "d.h5", uint8_images(), labels_for(), file_attrs={"std": [1.0, 1.0, -1.0]})
    expect_error(path, "'std'")


def test_mean_of_the_wrong_length(tmp_path):
    path = write_dataset(tmp_path / "d.h5", uint8_images(), labels_for(), {"mean": [0.5, 0.5]})
    expect_error(path, "'mean'", "3")


def test_images_that_do_not_match_the_model_input(tmp_path, opened):
    graph = load_model(TINY)  # input [3, 15, 13]
    C_, H_, W_ = graph.input_shape
    path = write_dataset(tmp_path / "d.h5", uint8_images(4, (C_, W_, H_)), labels_for(4))
    with pytest.raises(DataError) as info:
        opened(path).check_model(graph)
    message = str(info.value)
    assert path in message and "tiny_cnn" in message
    assert str([C_, W_, H_]) in message and str([C_, H_, W_]) in message


def test_images_with_other_channels_than_the_model(tmp_path, opened):
    graph = load_model(TINY)
    _, H_, W_ = graph.input_shape
    path = write_dataset(tmp_path / "d.h5", uint8_images(4, (1, H_, W_)), labels_for(4))
    with pytest.raises(DataError, match="tiny_cnn") as info:
        opened(path).check_model(graph)
    assert path in str(info.value)


def test_a_batch_bigger_than_the_dataset_is_refused_per_epoch(tmp_path, opened):
    path = write_dataset(tmp_path / "d.h5", uint8_images(), labels_for())
    dataset = opened(path)
    assert dataset.batches_per_epoch(N) == 1
    with pytest.raises(DataError) as info:
        dataset.batches_per_epoch(N + 1)
    assert path in str(info.value) and str(N) in str(info.value)


def test_a_batch_bigger_than_the_dataset_is_refused_when_read(tmp_path, opened):
    """batch() must never hand out an incomplete batch: asking for more samples than the file holds is an error,
    not a silently shorter batch (an epoch has floor(N / B) batches)."""
    path = write_dataset(tmp_path / "d.h5", uint8_images(), labels_for())
    dataset = opened(path, shuffle=False)
    with pytest.raises(DataError) as info:
        dataset.batch(0, 0, N + 1)
    assert path in str(info.value)


def test_a_refused_file_is_closed(tmp_path):
    """After a DataError the reader holds no handle on the file: it can be rewritten at once, even while the
    exception (and its traceback) is still alive."""
    path = write_dataset(tmp_path / "d.h5", uint8_images(), None)
    with pytest.raises(DataError) as info:
        HDF5Dataset(path)
    with h5py.File(path, "w") as f:  # fails with "file is already open" while a handle leaks
        f.create_dataset("images", data=uint8_images())
        f.create_dataset("labels", data=labels_for())
    assert info.value is not None
    dataset = HDF5Dataset(path)
    assert dataset.num_samples == N
    dataset.close()


# --- synthetic data ------------------------------------------------------------------------------------------------

def test_synthetic_batches_are_a_fixed_function_of_seed_epoch_and_step():
    shape = (3, 15, 13)
    a, b = SyntheticData(shape, 10, num_samples=64, seed=4), SyntheticData(shape, 10, num_samples=64, seed=4)
    x1, y1 = a.batch(2, 5, 8)
    b.batch(0, 0, 8)
    x2, y2 = b.batch(2, 5, 8)
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
    for other in (a.batch(3, 5, 8), a.batch(2, 6, 8), SyntheticData(shape, 10, 64, seed=5).batch(2, 5, 8)):
        assert not np.array_equal(x1, other[0])


def test_synthetic_shapes_dtypes_and_label_range():
    data = SyntheticData((2, 7, 9), 5, num_samples=100, seed=0)
    labels = []
    for s in range(20):
        x, y = data.batch(s // 6, s % 6, 16)
        assert x.shape == (16, 2, 7, 9) and x.dtype == np.float32
        assert y.shape == (16,) and y.dtype == np.int64
        assert y.min() >= 0 and y.max() < 5
        assert np.all(np.isfinite(x))
        labels.extend(y.tolist())
    assert set(labels) == set(range(5))
    x64, _ = data.batch(0, 0, 3, dtype=np.float64)
    assert x64.dtype == np.float64
    np.testing.assert_allclose(x64, data.batch(0, 0, 3)[0], rtol=1e-6)


def test_synthetic_batches_per_epoch():
    data = SyntheticData((3, 4, 4), 10, num_samples=100)
    assert data.batches_per_epoch(8) == 12
    with pytest.raises(DataError, match="cannot fill one batch"):
        data.batches_per_epoch(1000)
    with pytest.raises(DataError, match="outside an epoch"):
        data.batch(0, 12, 8)
    assert data.num_samples == 100 and data.sample_shape == (3, 4, 4)
    with pytest.raises(DataError, match="positive"):
        SyntheticData((3, 4, 4), 10, num_samples=0)


def test_synthetic_samples_do_not_depend_on_the_batch_they_are_in():
    """Sample i is a function of (seed, i): any subset, in any order, reads the same values (a tile can make
    its part alone)."""
    data = SyntheticData((3, 5, 6), 7, num_samples=50, seed=2)
    whole, labels = data.read(np.arange(50))
    some = np.array([41, 3, 17, 3])
    part, part_labels = data.read(some)
    np.testing.assert_array_equal(part, whole[some])
    np.testing.assert_array_equal(part_labels, labels[some])
    order = sample_order(50, 4, 2, True)
    x, y = data.batch(4, 1, 10)
    np.testing.assert_array_equal(x, whole[order[10:20]])
    np.testing.assert_array_equal(y, labels[order[10:20]])
    assert abs(float(whole.std()) - np.sqrt(1 + 0.25 * 1.0)) < 0.2     # unit noise plus the class pattern


@pytest.mark.parametrize("region", [((0, 3), (0, 5), (0, 4)), ((1, 2), (2, 5), (1, 3)), ((0, 3), (4, 5), (0, 1)),
                                    ((2, 3), (0, 5), (3, 4))])
def test_a_region_read_is_the_whole_read_cut(tmp_path, opened, region):
    """A tile reads only its channels, rows and columns; normalisation uses its channels' mean and std."""
    path = write_dataset(tmp_path / "d.h5", uint8_images(shape=(3, 5, 4)), labels_for(), image_attrs={
        "mean": [0.2, 0.4, 0.6], "std": [0.5, 0.25, 2.0]})
    data = opened(path, shuffle=False)
    indices = [7, 2, 2, 5]
    whole, labels = data.read(indices)
    part, part_labels = data.read(indices, region=region)
    (c0, c1), (h0, h1), (w0, w1) = region
    np.testing.assert_array_equal(part, whole[:, c0:c1, h0:h1, w0:w1])
    np.testing.assert_array_equal(part_labels, labels)


def test_synthetic_region_reads_and_tiles_of_a_batch():
    data = SyntheticData((3, 6, 5), 4, num_samples=40, seed=2)
    images, labels = data.batch(1, 2, 8)
    batch = data.tiles(1, 2, 8)
    assert batch.size == 8
    box = ((3, 7), (1, 3), (2, 6), (0, 2))
    np.testing.assert_array_equal(batch.images(box), images[3:7, 1:3, 2:6, 0:2])
    np.testing.assert_array_equal(batch.answers(((3, 7),)), labels[3:7])


def test_tiles_of_an_hdf5_batch_follow_the_epoch_order(tmp_path, opened):
    path = write_dataset(tmp_path / "d.h5", float_images(shape=(2, 4, 4)), labels_for())
    data = opened(path, seed=5, shuffle=True)
    images, labels = data.batch(2, 1, 6)
    batch = data.tiles(2, 1, 6)
    box = ((1, 4), (0, 2), (1, 3), (2, 4))
    np.testing.assert_array_equal(batch.images(box), images[1:4, :, 1:3, 2:4])
    np.testing.assert_array_equal(batch.answers(((0, 6),)), labels)


@pytest.mark.parametrize("steps", [(1, 2, 2), (1, 3, 1), (2, 1, 3)])
def test_a_strided_region_read_is_every_step_th_element(tmp_path, opened, steps):
    """A strided 1x1 first layer reads only every s-th row and column (a strided hyperslab)."""
    path = write_dataset(tmp_path / "d.h5", uint8_images(shape=(3, 5, 4)), labels_for(), image_attrs={
        "mean": [0.2, 0.4, 0.6], "std": [0.5, 0.25, 2.0]})
    data = opened(path, shuffle=False)
    indices = [3, 1, 3]
    region = ((0, 3), (1, 5), (0, 4))
    whole, _ = data.read(indices)
    part, _ = data.read(indices, region=region, steps=steps)
    cut = tuple(slice(lo, hi, step) for (lo, hi), step in zip(region, steps))
    np.testing.assert_array_equal(part, whole[(slice(None),) + cut])
    synthetic = SyntheticData((3, 5, 4), 4, num_samples=10, seed=1)
    np.testing.assert_array_equal(synthetic.read(indices, region=region, steps=steps)[0],
                                  synthetic.read(indices)[0][(slice(None),) + cut])
    batch = synthetic.tiles(0, 0, 4)
    box = ((1, 3),) + region
    np.testing.assert_array_equal(batch.images(box, (1,) + steps),
                                  synthetic.batch(0, 0, 4)[0][(slice(1, 3),) + cut])


def test_images_stored_as_a_group_are_refused(tmp_path):
    with h5py.File(tmp_path / "g.h5", "w") as f:
        f.create_group("images")
        f.create_dataset("labels", data=[0])
    with pytest.raises(DataError, match="lacks /images as an array"):
        HDF5Dataset(tmp_path / "g.h5")


# --- volumes and regression targets -------------------------------------------------------------------------------

VOLUME_MODEL = os.path.join(os.path.dirname(TINY), "tiny_volume.yaml")


def write_volumes(path, n=6, shape=(2, 11, 9, 8), targets=3, labels=False):
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=float_images(n, shape))
        if targets:
            f.create_dataset("targets", data=np.random.default_rng(1).uniform(-1, 1, (n, targets)).astype(np.float32))
        if labels:
            f.create_dataset("labels", data=labels_for(n))
    return str(path)


def test_a_volume_dataset_with_targets_fits_a_regression_model(tmp_path, opened):
    graph = load_model(VOLUME_MODEL)
    path = write_volumes(tmp_path / "v.h5")
    data = opened(path)
    data.check_model(graph)
    assert data.answers == "targets" and data.num_targets == 3 and data.sample_shape == graph.input_shape
    x, t = data.read([4, 1], region=[(1, 2), (2, 9), (0, 9), (3, 5)], steps=(1, 2, 1, 1))
    with h5py.File(path) as f:
        np.testing.assert_array_equal(x, f["images"][()][[4, 1], 1:2, 2:9:2, 0:9, 3:5])
        np.testing.assert_array_equal(t, f["targets"][()][[4, 1]])
    assert "data.targets_crc32" in data.identity()


def test_a_dataset_whose_sample_rank_differs_from_the_model_s(tmp_path, opened):
    with pytest.raises(DataError) as info:
        opened(write_dataset(tmp_path / "d.h5", uint8_images(4, (2, 11, 9)), labels_for(4))).check_model(
            load_model(VOLUME_MODEL))
    assert "images are [2, 11, 9] (C, H, W) but model 'tiny_volume' takes volumes [2, 11, 9, 8] (C, D, H, W)" in \
        str(info.value)


def test_targets_missing_for_mse_loss(tmp_path, opened):
    path = write_volumes(tmp_path / "v.h5", targets=0, labels=True)
    with pytest.raises(DataError) as info:
        opened(path).check_model(load_model(VOLUME_MODEL))
    assert path in str(info.value) and "no /targets" in str(info.value) and "mse_loss" in str(info.value)


def test_labels_missing_for_cross_entropy(tmp_path, opened):
    graph = load_model(TINY)
    path = str(tmp_path / "t.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=uint8_images(4, graph.input_shape))
        f.create_dataset("targets", data=np.zeros((4, 2), np.float32))
    with pytest.raises(DataError) as info:
        opened(path).check_model(graph)
    assert "no /labels" in str(info.value) and "softmax_cross_entropy" in str(info.value)


def test_a_target_count_other_than_the_network_s_outputs(tmp_path, opened):
    path = write_volumes(tmp_path / "v.h5", targets=4)
    with pytest.raises(DataError, match="/targets holds 4 values per sample, but model 'tiny_volume' ends in mse_loss "
                                        "over 3 outputs"):
        opened(path).check_model(load_model(VOLUME_MODEL))


@pytest.mark.parametrize("targets,fragment", [(np.zeros((6,), np.float32), "/targets must be (6, K) floats"),
                                              (np.zeros((6, 2), np.int64), "/targets must be (6, K) floats"),
                                              (np.full((6, 2), np.nan, np.float32), "NaN or infinite")])
def test_malformed_targets(tmp_path, targets, fragment):
    path = str(tmp_path / "v.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=float_images(6, (2, 4, 4, 4)))
        f.create_dataset("targets", data=targets)
    expect_error(path, fragment)


def test_a_dataset_with_labels_and_targets_gives_what_the_model_reads(tmp_path, opened):
    path = write_volumes(tmp_path / "v.h5", labels=True)
    data = opened(path)
    assert data.answers == "labels"
    data.check_model(load_model(VOLUME_MODEL))
    assert data.answers == "targets" and data.read_answers([0, 1]).shape == (2, 3)
    again = opened(path, **{k: v for k, v in data.spec().items() if k in ("answers", "seed", "shuffle")})
    assert again.answers == "targets"


def test_synthetic_regression_data_is_a_function_of_seed_and_sample():
    graph = load_model(VOLUME_MODEL)
    data = SyntheticData.for_model(graph, num_samples=10, seed=3)
    assert data.answers == "targets" and data.num_targets == 3
    x, t = data.read([2, 7])
    y, u = data.read([7], region=[(0, 2), (3, 7), (0, 9), (0, 8)])
    np.testing.assert_array_equal(u[0], t[1])
    np.testing.assert_array_equal(y[0], x[1][:, 3:7])
    assert np.all(np.abs(t) <= 1) and not np.array_equal(t[0], t[1])


def test_write_blocks_writes_targets_with_their_names(tmp_path):
    from spmdcnn.io.dataset import dataset_info, write_dataset as write
    path = tmp_path / "w.h5"
    write(path, float_images(5, (1, 3, 4, 5)), np.arange(10, dtype=np.float32).reshape(5, 2), target_names=["a", "b"])
    info = dataset_info(path)
    assert info["shape"] == [1, 3, 4, 5] and info["kind"] == "volumes"
    assert info["targets"]["count"] == 2 and info["targets"]["names"] == ["a", "b"]
    assert info["targets"]["min"] == [0.0, 1.0] and info["targets"]["max"] == [8.0, 9.0] and "classes" not in info
