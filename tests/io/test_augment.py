"""Augmentation (docs/formats.md#augmentation): random crops and flips as functions of (seed, epoch, sample), the
parts of them a tile reads, evaluation's center crop, and the errors of bad settings."""

import h5py
import numpy as np
import pytest

from spmdcnn.io.augment import Augment
from spmdcnn.io.dataset import DataError, HDF5Dataset
from spmdcnn.io.job import parse_job
from spmdcnn.io.yamlfile import FormatError

N, C, H, W = 40, 3, 11, 9
CROP = (7, 6)


@pytest.fixture
def stored(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (N, C, H, W), dtype=np.uint8)
    path = str(tmp_path / "data.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=images, chunks=(1, C, H, W))
        f.create_dataset("labels", data=np.arange(N) % 10)
        f["images"].attrs.update({"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.3, 0.25]})
    return path, images


@pytest.fixture
def opened():
    handles = []

    def open_(*args, **kwargs):
        handles.append(HDF5Dataset(*args, **kwargs))
        return handles[-1]
    yield open_
    for handle in handles:
        handle.close()


def normalised(pixels):
    """(..., C, H, W) uint8 as training reads them: over 255, less the mean, over the std."""
    mean, std = np.array([0.5, 0.4, 0.3]), np.array([0.2, 0.3, 0.25])
    out = pixels.astype(np.float64) / 255
    return (out - mean.reshape(-1, 1, 1)) / std.reshape(-1, 1, 1)


@pytest.mark.parametrize("crop", [CROP, (7, 8), (11, 9)])      # parts of rows read; whole rows
def test_each_sample_is_a_crop_of_its_stored_image_at_its_window_mirrored_when_flipped(stored, opened, crop):
    path, images = stored
    data = opened(path, augment=Augment(crop, True), seed=3)
    indices = np.arange(N)
    got, _ = data.read(indices, np.float64, epoch=2)
    windows = data.augment.windows(data.stored_shape, 3, 2, indices)
    assert not windows.flips[:, 0].any()                   # flip: true is the horizontal flip alone
    for k in indices:
        r, c = windows.starts[k]
        pixels = images[k, :, r:r + crop[0], c:c + crop[1]]
        expected = normalised(pixels[:, :, ::-1] if windows.flips[k, 1] else pixels)
        np.testing.assert_allclose(got[k], expected, rtol=1e-12)
    # the windows are spread over every offset and about half the samples are flipped
    assert set(windows.starts[:, 0]) == set(range(H - crop[0] + 1))
    assert set(windows.starts[:, 1]) == set(range(W - crop[1] + 1))
    assert 10 < windows.flips.sum() < 30


def test_crops_and_flips_are_a_fixed_function_of_seed_epoch_and_sample(stored, opened):
    path, _ = stored
    augment = Augment(CROP, True)
    first = opened(path, augment=augment, seed=3)
    second = opened(path, augment=augment, seed=3)
    # the same sample in another batch, another order, another reader: the same pixels
    a = first.read([5, 17, 2], epoch=1)[0]
    b = second.read([2, 5, 30, 17], epoch=1)[0]
    np.testing.assert_array_equal(a, b[[1, 3, 0]])
    # another epoch or another seed: other windows
    for other in (first.read([5, 17, 2], epoch=2)[0], opened(path, augment=augment, seed=4).read([5, 17, 2],
                                                                                               epoch=1)[0]):
        assert not np.array_equal(a, other)


@pytest.mark.parametrize("crop", [CROP, (7, 8), (11, 9)])        # parts of rows read; whole rows (8 of 9 and more)
@pytest.mark.parametrize("region, steps", [
    ([(0, 3), (0, 7), (0, 6)], None), ([(1, 3), (2, 6), (0, 4)], None), ([(0, 3), (0, 7), (3, 6)], None),
    ([(0, 2), (1, 7), (1, 6)], (1, 2, 2)), ([(2, 3), (0, 7), (0, 5)], (1, 3, 2)), ([(0, 3), (4, 4), (0, 6)], None),
    ([(0, 3), (0, 7), (5, 6)], None), ([(0, 3), (6, 7), (0, 1)], (1, 1, 3))])
def test_a_tile_s_box_of_an_augmented_sample_is_that_box_of_the_whole_crop(stored, opened, region, steps, crop):
    """What each rank reads: a box of the crop (with a strided window's steps), mirrored under a flip, taken from
    the stored image alone, equals that box cut from the whole augmented sample."""
    path, _ = stored
    data = opened(path, augment=Augment(crop, True), seed=1)
    indices = np.arange(0, N, 3)
    whole = data.read(indices, epoch=0)[0]
    part = data.read(indices, region=region, steps=steps, epoch=0)[0]
    steps = steps or (1, 1, 1)
    np.testing.assert_array_equal(part, whole[(slice(None),) + tuple(slice(lo, hi, s) for (lo, hi), s in
                                                                      zip(region, steps))])


def test_a_rank_reads_only_the_rows_and_the_column_span_its_box_needs(stored, opened, monkeypatch):
    """The hyperslabs asked of HDF5: the box's rows, and its columns from the first to the last (whole rows only
    when those are three quarters of a row or more)."""
    path, _ = stored
    data = opened(path, augment=Augment(CROP, True), seed=1)
    asked = []
    read_parts = data._read_parts
    monkeypatch.setattr(data, "_read_parts", lambda indices, parts: asked.extend(parts) or read_parts(indices, parts))
    data.read(np.arange(N), region=[(0, 3), (2, 5), (0, 3)], epoch=0)
    windows = data.augment.windows(data.stored_shape, 1, 0, np.arange(N))
    flips = windows.flips[:, 1]
    assert len(asked) == N and flips.any() and not flips.all()
    for k, part in enumerate(asked):
        first = windows.starts[k, 1] + (CROP[1] - 3 if flips[k] else 0)     # crop columns 0-2, or 3-5 mirrored
        assert part.start == (0, windows.starts[k, 0] + 2, first) and part.count == (3, 3, 3), (k, part)
    asked.clear()
    data.read(np.arange(N), region=[(0, 3), (2, 5), (0, 6)], epoch=0)       # 6 of 9 columns: still a span
    assert all(part.count == (3, 3, 6) for part in asked)
    wide = opened(path, augment=Augment((7, 7), True), seed=1)
    monkeypatch.setattr(wide, "_read_parts", lambda indices, parts: asked.extend(parts) or [][0])
    asked.clear()
    with pytest.raises(IndexError):
        wide.read(np.arange(2), region=[(0, 3), (2, 5), (0, 7)], epoch=0)   # 7 of 9 columns: whole rows
    assert len(asked) == 2 and all(part.start[2] == 0 and part.count == (3, 3, W) for part in asked)


def test_evaluation_reads_the_center_crop_unflipped(stored, opened):
    path, images = stored
    data = opened(path, augment=Augment(CROP, True))
    got = data.read(np.arange(N), np.float64)[0]          # no epoch: evaluation
    top, left = (H - CROP[0]) // 2, (W - CROP[1]) // 2
    np.testing.assert_allclose(got, normalised(images[:, :, top:top + CROP[0], left:left + CROP[1]]), rtol=1e-12)


def test_flips_alone_keep_the_stored_size_and_mirror_about_half(stored, opened):
    path, images = stored
    data = opened(path, augment=Augment(None, True))
    assert data.sample_shape == (C, H, W)
    got = data.read(np.arange(N), np.float64, epoch=0)[0]
    plain = normalised(images)
    flipped = [k for k in range(N) if not np.allclose(got[k], plain[k])]
    np.testing.assert_allclose(got[flipped], plain[flipped][..., ::-1], rtol=1e-12)
    assert 10 < len(flipped) < 30


def test_the_model_sees_the_crop(stored, opened):
    path, _ = stored
    assert opened(path, augment=Augment(CROP)).sample_shape == (C,) + CROP
    assert opened(path).sample_shape == (C, H, W)


def test_augmentation_is_part_of_what_a_resumed_run_must_share(stored, opened):
    path, _ = stored
    assert opened(path).identity()["data.augment"] == "none"
    assert opened(path, augment=Augment(CROP, True)).identity()["data.augment"] == "crop 7x6, flip"


# --- volumes --------------------------------------------------------------------------------------------------------

VOLUME = (12, 2, 9, 8, 7)           # samples, channels, D, H, W


@pytest.fixture
def volumes(tmp_path):
    data = np.random.default_rng(5).standard_normal((12,) + VOLUME[1:]).astype(np.float32)
    path = str(tmp_path / "volumes.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=data, chunks=(1,) + VOLUME[1:])
        f.create_dataset("targets", data=np.random.default_rng(6).uniform(-1, 1, (12, 3)).astype(np.float32))
    return path, data


@pytest.mark.parametrize("flip", [["d", "h", "w"], ["d"], ["h", "w"], True])
def test_a_volume_is_cropped_along_every_axis_and_flipped_along_the_axes_named(volumes, opened, flip):
    path, stored = volumes
    crop = (6, 5, 7)
    augment = Augment.from_spec({"crop": list(crop), "flip": flip})
    data = opened(path, augment=augment, seed=2)
    assert data.sample_shape == (2,) + crop and data.answers == "targets"
    indices = np.arange(12)
    got, targets = data.read(indices, np.float64, epoch=1)
    np.testing.assert_array_equal(targets, data.all_targets)
    windows = augment.windows(data.stored_shape, 2, 1, indices)
    named = ["d", "h", "w"] if flip is True else flip
    for axis, name in enumerate("dhw"):
        assert windows.flips[:, axis].any() == (name in named if flip is not True else name == "w")
    for k in indices:
        box = stored[k][(slice(None),) + tuple(slice(x, x + c) for x, c in zip(windows.starts[k], crop))]
        for axis in np.flatnonzero(windows.flips[k]):
            box = np.flip(box, axis=axis + 1)
        np.testing.assert_allclose(got[k], box, rtol=1e-6)


@pytest.mark.parametrize("region, steps", [
    ([(0, 2), (0, 6), (0, 5), (0, 7)], None), ([(1, 2), (2, 5), (1, 4), (3, 7)], None),
    ([(0, 2), (1, 6), (0, 5), (1, 7)], (1, 2, 2, 3)), ([(0, 1), (5, 6), (4, 5), (0, 7)], (1, 1, 1, 2))])
def test_a_tile_s_box_of_an_augmented_volume_is_that_box_of_the_whole_crop(volumes, opened, region, steps):
    path, _ = volumes
    data = opened(path, augment=Augment.from_spec({"crop": [6, 5, 7], "flip": ["d", "h", "w"]}), seed=4)
    indices = np.arange(12)
    whole = data.read(indices, epoch=3)[0]
    part = data.read(indices, region=region, steps=steps, epoch=3)[0]
    steps = steps or (1,) * 4
    np.testing.assert_array_equal(part, whole[(slice(None),) + tuple(slice(lo, hi, s) for (lo, hi), s in
                                                                      zip(region, steps))])


def test_a_crop_or_flip_the_volumes_do_not_have_is_refused(volumes):
    path, _ = volumes
    with pytest.raises(DataError, match="data.augment.crop \\[5, 5\\] has 2 extents, but the stored volumes have 3"):
        HDF5Dataset(path, augment=Augment((5, 5)))
    with pytest.raises(DataError, match="larger than the stored volumes, 9 x 8 x 7"):
        HDF5Dataset(path, augment=Augment((10, 5, 5)))


def test_an_image_has_no_depth_to_flip(stored):
    path, _ = stored
    with pytest.raises(DataError, match="data.augment.flip: the stored images have no axis d"):
        HDF5Dataset(path, augment=Augment.from_spec({"flip": ["d", "w"]}))


# --- bad input ------------------------------------------------------------------------------------------------------

def test_a_crop_larger_than_the_stored_images_names_the_file_and_the_key(stored):
    path, _ = stored
    with pytest.raises(DataError) as info:
        HDF5Dataset(path, augment=Augment((12, 6)))
    message = str(info.value)
    assert path in message and "data.augment.crop 12 x 6" in message and "11 x 9" in message


@pytest.mark.parametrize("augment, fragment", [
    ({"crop": [224, 224, 224, 3]}, "'data.augment.crop' must be [H, W] (images) or [D, H, W]"),
    ({"crop": [0, 5]}, "'data.augment.crop' must be"), ({"flip": ["x"]}, "'data.augment.flip' must be true, false or"),
    ({"crop": "224x224"}, "'data.augment.crop' must be a list or null"),
    ({"flop": True}, "unknown key 'data.augment.flop' (did you mean 'data.augment.flip'?)"),
    ({"flip": "yes"}, "'data.augment.flip' must be")])
def test_odd_augment_settings_name_the_key(augment, fragment):
    with pytest.raises(FormatError) as info:
        parse_job({"model": "m.yaml", "batch_size": 2, "steps": 1, "data": {"kind": "hdf5", "path": "d.h5",
                                                                           "augment": augment}}, "job.yaml")
    assert fragment in str(info.value) and "job.yaml" in str(info.value)


def test_augmenting_synthetic_data_is_refused():
    with pytest.raises(FormatError, match="'data.augment' applies to stored samples: it needs data.kind hdf5"):
        parse_job({"model": "m.yaml", "batch_size": 2, "steps": 1, "data": {"augment": {"flip": True}}})


def test_augment_from_spec_refuses_what_the_job_schema_would():
    for spec in ({"crop": [3, 3], "scale": 2}, {"crop": (3, 3, 3, 3)}, {"flip": 1}, {"flip": ["w", "w"]}, [3, 3]):
        with pytest.raises(FormatError):
            Augment.from_spec(spec)
    assert Augment.from_spec(None) == Augment() and not Augment()
    assert Augment.from_spec({"crop": [3, 4], "flip": True}) == Augment((3, 4), True)
