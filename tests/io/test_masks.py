"""Segmentation data: masks as /labels (N, S...) read in boxes, cropped and flipped with their images, padded in
evaluation, checked against the model; ``spmdcnn data shapes``; the held-out metrics (pixel accuracy, IoU, Dice)."""

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from spmdcnn.graph.graph import parse_model
from spmdcnn.io.augment import Augment
from spmdcnn.io.dataset import DataError, HDF5Dataset, open_checked, write_dataset
from spmdcnn.io.prefetch import Loader, evaluation_batches
from spmdcnn.io.synthetic import SyntheticData
from spmdcnn.runtime.evaluate import class_means, evaluate
from spmdcnn.runtime.executor import Executor

H, W = 9, 7


def segmenter(classes=3, shape=(1, 6, 5), ignore_index=-1):
    """A one-convolution segmenter over images of ``shape``: logits (classes, H, W) per pixel."""
    return parse_model({"name": "seg", "input": list(shape), "layers": [
        {"name": "conv", "op": "conv2d", "out_channels": classes, "kernel": 3, "padding": 1},
        {"name": "loss", "op": "softmax_cross_entropy", "ignore_index": ignore_index}]})


def coded(path, count=5, shape=(H, W)):
    """Images whose one channel holds each pixel's code (sample * 1000 + its flat position) and masks of the same
    codes: whatever crop and flip a read applies, a mask read alike equals its image."""
    codes = np.arange(count)[:, None, None] * 1000 + np.arange(np.prod(shape)).reshape(shape)
    write_dataset(path, codes[:, None].astype(np.float32), codes.astype(np.int32))
    return str(path)


def test_masks_are_cropped_and_flipped_with_their_images(tmp_path):
    data = HDF5Dataset(coded(tmp_path / "d.h5"), augment=Augment(crop=(6, 5), flip=("h", "w")))
    assert data.dense and data.sample_shape == (1, 6, 5)
    indices = np.array([4, 0, 3, 1])
    for epoch in (None, 0, 1, 2, 7):
        images, masks = data.read(indices, np.float64, epoch=epoch)
        np.testing.assert_array_equal(masks, images[:, 0].astype(np.int64))
        for region in ([(1, 4), (0, 5)], [(0, 6), (2, 3)]):         # a tile's box of them
            box = (slice(None),) + tuple(slice(lo, hi) for lo, hi in region)
            np.testing.assert_array_equal(data.read_answers(indices, region, epoch), masks[box])
    data.close()


def test_a_tiles_image_read_reads_no_mask(tmp_path, monkeypatch):
    """Images read for a tile (the trainer's and the workers' reads) leave the masks alone: those are read as the
    loss's tiles ask (read_answers), never whole beside every image box."""
    from spmdcnn.io.dataset import reading_batch
    from spmdcnn.io.prefetch import Layout, read_batch
    data = HDF5Dataset(coded(tmp_path / "d.h5"), shuffle=False)
    called = []
    monkeypatch.setattr(data, "read_answers", lambda *a, **k: called.append(a) or np.zeros(0))
    box = ((0, 2), (0, 1), (1, 4), (0, W))
    reading_batch(data, np.array([3, 1]), np.float32).images(box, None)
    layout = Layout([(box, None)], np.float32)
    read_batch(data, layout, np.array([3, 1]), None, {(box, None): np.empty((2, 1, 3, W), np.float32)})
    assert not called
    data.close()


def test_a_loader_reads_masks_as_each_tile_asks_and_pads_them(tmp_path):
    """Evaluation's last batch: the padding samples' masks are -1 (ignored), with workers or without."""
    data = HDF5Dataset(coded(tmp_path / "d.h5"), shuffle=False)
    reads = [(((0, 4), (0, 1), (0, H), (0, W)), None)]
    for workers in (0, 1):
        loader = Loader(data, reads, 4, np.float32, None, 0, 2, workers, batches=evaluation_batches(5, 4))
        try:
            loader.next(0)
            batch, _ = loader.next(1)
            masks = batch.answers(((0, 4), (2, 5), (1, 3)))
            np.testing.assert_array_equal(masks[0], (4000 + np.arange(H * W).reshape(H, W))[2:5, 1:3])
            assert (masks[1:] == -1).all()
        finally:
            loader.close()
    data.close()


def test_masks_are_checked_against_the_model(tmp_path):
    path = coded(tmp_path / "d.h5", shape=(6, 5))
    with pytest.raises(DataError, match=r"masks range over \[0, 4029\]: 3 is not one of model 'seg''s 3 "
                       r"classes.*\[0, 2\]"):
        open_checked(path, segmenter())
    masks = np.random.default_rng(0).integers(0, 3, (4, 6, 5))
    masks[0, 0, 0] = 255
    write_dataset(tmp_path / "i.h5", np.zeros((4, 1, 6, 5), np.float32), masks)
    with pytest.raises(DataError, match=r"masks range over \[0, 255\]: 255 is not one of model 'seg''s 3 classes "
                       r"\(labels must lie in \[0, 2\]\)"):
        open_checked(tmp_path / "i.h5", segmenter())
    with pytest.raises(DataError, match="2 is not one of model 'seg''s 2 classes .* or 255, the loss's ignore_index"):
        open_checked(tmp_path / "i.h5", segmenter(classes=2, ignore_index=255))
    open_checked(tmp_path / "i.h5", segmenter(ignore_index=255)).close()
    with pytest.raises(DataError, match="has masks as /labels.*loss per position"):
        open_checked(tmp_path / "i.h5", parse_model({"name": "cls", "input": [1, 6, 5], "layers": [
            {"name": "f", "op": "flatten"}, {"name": "fc", "op": "linear", "out_features": 3},
            {"name": "loss", "op": "softmax_cross_entropy"}]}))
    write_dataset(tmp_path / "p.h5", np.zeros((4, 1, 6, 5), np.float32), np.arange(4))
    with pytest.raises(DataError, match=r"per-sample /labels.*mask per sample: /labels \(N, 6, 5\)"):
        open_checked(tmp_path / "p.h5", segmenter())


def test_a_mask_of_another_shape_than_its_image_is_refused(tmp_path):
    with h5py.File(tmp_path / "bad.h5", "w") as f:
        f["images"] = np.zeros((3, 1, 6, 5), np.uint8)
        f["labels"] = np.zeros((3, 6, 4), np.uint8)
    with pytest.raises(DataError, match=r"integer masks \(3, 6, 5\) of the images' spatial shape.*\(3, 6, 4\)"):
        HDF5Dataset(tmp_path / "bad.h5")


def test_synthetic_masks_are_learnable_and_cut_as_asked():
    data = SyntheticData((2, 8, 12), 3, 50, dense=True)
    images, masks = data.read(np.array([7, 3]))
    assert masks.shape == (2, 8, 12) and set(np.unique(masks)) <= {0, 1, 2}
    np.testing.assert_array_equal(data.read_answers(np.array([7, 3]), [(2, 6), (3, 9)]), masks[:, 2:6, 3:9])
    # a cell's colour tells its class: the mean image over the cells of one class differs from another's
    means = [images.transpose(1, 0, 2, 3)[:, masks == k].mean(axis=1) for k in range(3) if (masks == k).any()]
    assert len(means) >= 2 and np.abs(means[0] - means[1]).max() > 0.1


def test_data_shapes_writes_images_and_masks_of_every_class(tmp_path):
    out = tmp_path / "shapes"
    done = subprocess.run([sys.executable, "-m", "spmdcnn.cli", "data", "shapes", "-o", str(out), "--size", "24",
                           "--samples", "12", "--val-samples", "4"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "masks of 4 classes: background, disc, box, ring" in done.stdout
    train = HDF5Dataset(out / "train.h5")
    assert train.dense and train.num_samples == 12 and train.classes == ["background", "disc", "box", "ring"]
    images, masks = train.read(np.arange(12))
    assert images.shape == (12, 1, 24, 24) and set(np.unique(masks)) == {0, 1, 2, 3}
    train.close()
    info = subprocess.run([sys.executable, "-m", "spmdcnn.cli", "data", "info", str(out / "val.h5")],
                          capture_output=True, text=True, timeout=120)
    assert "masks of 4 classes" in info.stdout and "pixels per class: 0:" in info.stdout
    volumes = subprocess.run([sys.executable, "-m", "spmdcnn.cli", "data", "shapes", "-o", str(tmp_path / "v"),
                              "--volumes", "--size", "12", "--samples", "3", "--val-samples", "1"],
                             capture_output=True, text=True, timeout=120)
    assert volumes.returncode == 0 and "volumes of 1x12x12x12" in volumes.stdout


def test_class_means_over_the_classes_that_occur():
    # class 0: 3 right of 4 predicted and 5 labelled; class 1: never right; class 2: neither predicted nor labelled
    iou, dice = class_means([[3, 0, 0], [4, 2, 0], [5, 1, 0]])
    assert iou == pytest.approx((3 / 6 + 0) / 2) and dice == pytest.approx((6 / 9 + 0) / 2)
    assert class_means(np.zeros((3, 2))) == (None, None)


def test_evaluation_scores_pixels_and_classes_as_the_predictions_give(tmp_path):
    """Pixel accuracy, mean IoU and Dice of an evaluation in padded batches equal those counted from one forward
    of every sample, the ignored pixels left out."""
    rng = np.random.default_rng(5)
    masks = rng.integers(0, 3, (7, 6, 5))
    masks[:, 0] = 9                                                  # the first row of every mask ignored
    write_dataset(tmp_path / "v.h5", rng.standard_normal((7, 1, 6, 5)).astype(np.float32), masks)
    graph = segmenter(ignore_index=9)
    val = open_checked(tmp_path / "v.h5", graph, shuffle=False)
    executor = Executor(graph, dtype=np.float64, seed=1)
    images, labels = val.read(np.arange(7), np.float64)
    _, _, kept = executor.forward(images, labels, training=False, keep=["conv"])
    predicted, counted = kept["conv"].argmax(axis=1), labels != 9
    right = (predicted == labels) & counted
    table = np.array([[np.sum(right & (labels == k)), np.sum(counted & (predicted == k)),
                       np.sum(counted & (labels == k))] for k in range(3)]).T
    for batch in (3, 7):
        result = evaluate(executor, val, batch, np.float64)
        assert result.score == pytest.approx(right.sum() / counted.sum(), rel=1e-14)
        assert (result.mean_iou, result.mean_dice) == pytest.approx(class_means(table), rel=1e-14)
    val.close()


def mask_folder(tmp_path, count=4, size=(20, 30), mode="P"):
    """Images and masks of the same names (jpg and png): a square of class 1 (or 2 in odd images), 255 on the
    first row (VOC's void); ``mode`` the masks' PNG mode, ``RGB`` colouring class k as (40 k, 0, 255 - 40 k)."""
    from PIL import Image
    images, masks = tmp_path / "images", tmp_path / "masks"
    images.mkdir()
    masks.mkdir()
    rng = np.random.default_rng(0)
    expected = []
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, size + (3,), dtype=np.uint8)).save(images / f"s{i}.jpg")
        mask = np.zeros(size, np.uint8)
        mask[4:12, 8 + i:20 + i] = 1 + i % 2
        mask[0] = 255
        expected.append(mask)
        if mode == "RGB":
            wide = mask.astype(np.int64)
            colours = np.stack([40 * wide % 256, np.zeros_like(wide), (255 - 40 * wide) % 256], axis=-1)
            Image.fromarray(colours.astype(np.uint8), mode="RGB").save(masks / f"s{i}.png")
        else:
            Image.fromarray(mask, mode="L").convert(mode).save(masks / f"s{i}.png")
    return str(images), str(masks), np.stack(expected)


@pytest.mark.parametrize("mode", ["P", "L"])
def test_convert_takes_a_folder_of_masks_beside_the_images(tmp_path, mode):
    from spmdcnn.io.convert import convert_folder
    images, masks, expected = mask_folder(tmp_path, mode=mode)
    count, shape, _ = convert_folder(images, tmp_path / "out.h5", masks=masks)
    data = HDF5Dataset(tmp_path / "out.h5")
    assert (count, shape) == (4, (3, 20, 30)) and data.dense
    np.testing.assert_array_equal(data.read_answers(np.arange(4)), expected)
    data.close()
    # fitted as the images are, by nearest neighbour: every value a class, none a blend
    convert_folder(images, tmp_path / "small.h5", size=(10, 12), fit="crop", masks=masks)
    small = HDF5Dataset(tmp_path / "small.h5")
    assert small.read_answers(np.arange(4)).shape == (4, 10, 12)
    assert set(np.unique(small.read_answers(np.arange(4)))) <= {0, 1, 2, 255}
    small.close()


def test_colour_masks_go_through_a_value_map(tmp_path):
    from spmdcnn.io.convert import convert_folder
    images, masks, expected = mask_folder(tmp_path, mode="RGB")
    values = tmp_path / "values.txt"
    values.write_text("# colour -> class\n0 0 255 0\n40 0 215 1\n80 0 175 2\n" + "216 0 39 -1   # void\n")
    convert_folder(images, tmp_path / "out.h5", masks=masks, mask_values=str(values))
    data = HDF5Dataset(tmp_path / "out.h5")
    np.testing.assert_array_equal(data.read_answers(np.arange(4)), np.where(expected == 255, -1, expected.astype(np.int64)))
    data.close()
    values.write_text("0 0 255 0\n40 0 215 1\n")
    with pytest.raises(DataError, match=r"s0.png: the value \((216|80), 0, (39|175)\) is not in the value map"):
        convert_folder(images, tmp_path / "bad.h5", masks=masks, mask_values=str(values))


@pytest.mark.parametrize("change,message", [
    ("missing", r"no mask for the image .*s3.jpg"),
    ("extra", r"the mask extra.png has no image"),
    ("size", r"s1.png: the mask is 10 x 30 \(H x W\), its image .*s1.jpg 20 x 30"),
])
def test_masks_that_do_not_fit_their_images_are_refused(tmp_path, change, message):
    from PIL import Image
    from spmdcnn.io.convert import convert_folder
    images, masks, _ = mask_folder(tmp_path)
    if change == "missing":
        os.remove(os.path.join(masks, "s3.png"))
    elif change == "extra":
        Image.fromarray(np.zeros((20, 30), np.uint8)).save(os.path.join(masks, "extra.png"))
    else:
        Image.fromarray(np.zeros((10, 30), np.uint8)).save(os.path.join(masks, "s1.png"))
    with pytest.raises(DataError, match=message):
        convert_folder(images, tmp_path / "out.h5", masks=masks)
    assert not os.path.exists(tmp_path / "out.h5")
