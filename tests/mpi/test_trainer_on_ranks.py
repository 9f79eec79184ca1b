"""The training loop on ranks: per-rank reads of an HDF5 dataset (only the samples, rows and columns of a rank's
first-layer tiles) and the same losses as one process."""

import os
import shutil
import tempfile

import h5py
import numpy as np

from conftest import agree
from plans import uniform_plan
from spmdcnn.comm import World
from spmdcnn.graph import load_model
from spmdcnn.io import dataset
from spmdcnn.io.job import parse_job

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "models", "tiny_cnn.yaml")


def _dataset(world, shape=(15, 13)):
    """An HDF5 dataset written by rank 0 in a directory every rank sees, of images ``shape`` (H, W)."""
    path = None
    if world.rank == 0:
        path = os.path.join(tempfile.mkdtemp(prefix="spmdcnn-mpi-"), "data.h5")
        rng = np.random.default_rng(0)
        with h5py.File(path, "w") as f:
            f.create_dataset("images", data=rng.integers(0, 256, (40, 3) + tuple(shape), dtype=np.uint8))
            f.create_dataset("labels", data=rng.integers(0, 10, 40))
            f["images"].attrs.update({"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.3, 0.25]})
    return world.bcast(path)


def _job(data, plan, **data_keys):
    return parse_job({"model": MODEL, "batch_size": 6, "steps": 4, "dtype": "float64", "plan": plan,
                      "data": {"kind": "hdf5", "path": data, "shuffle": True, "seed": 1, **data_keys},
                      "optimizer": {"lr": 0.05, "momentum": 0.9}, "log": {"every": 100}})


def test_ranks_read_only_their_boxes_and_train_as_one_process(world, monkeypatch, tmp_path):
    from spmdcnn.runtime.train import Trainer
    data = _dataset(world)
    plan_path = None
    if world.rank == 0:
        plan_path = os.path.join(os.path.dirname(data), "plan.yaml")
        with open(plan_path, "w", encoding="utf-8") as f:
            f.write(uniform_plan(load_model(MODEL), 6, world.size, {"n": 2, "h": 2}).text)
    plan_path = world.bcast(plan_path)
    reference = Trainer(_job(data, "data"), log=lambda line: None, world=World(None)).run()["losses"]
    regions = []
    read = dataset.HDF5Dataset.read

    def recording(self, indices, dtype=np.float32, region=None, steps=None, **keys):
        regions.append((len(indices), region))
        return read(self, indices, dtype, region, steps, **keys)
    monkeypatch.setattr(dataset.HDF5Dataset, "read", recording)
    # read in the step, so that this process's reads are all the reads (workers read the same: the next test)
    trainer = Trainer(_job(data, plan_path, workers=0), log=lambda line: None, world=world)
    losses = trainer.run()["losses"]
    problems = []
    if not np.allclose(losses, reference, rtol=1e-10, atol=0):
        problems.append(f"losses {losses} != one process's {reference}")
    site = trainer.executor.site(trainer.graph.layers[0])
    if site.box is None:
        if regions:
            problems.append(f"a rank without first-layer tiles read {regions}")
    else:
        (n0, n1), *region = site.needs[0].box
        expected = (n1 - n0, [tuple(r) for r in region])
        if not regions or any((count, [tuple(r) for r in got]) != expected for count, got in regions):
            problems.append(f"reads {regions[:2]}, expected {expected} at every step")
    agree(world, problems)
    world.barrier()
    if world.rank == 0:
        shutil.rmtree(os.path.dirname(data))


def test_evaluation_under_random_plans_equals_one_process(world):
    """The held-out set (21 samples, batches of 6: the last one padded) under plans that split the samples, rows
    and channels every way: the same loss and accuracy as one process, after the same training."""
    from plans import random_plan
    from spmdcnn.runtime.train import Trainer
    data = _dataset(world)
    val, plans = None, []
    if world.rank == 0:
        val = os.path.join(os.path.dirname(data), "val.h5")
        rng = np.random.default_rng(1)
        dataset.write_dataset(val, rng.integers(0, 256, (21, 3, 15, 13), dtype=np.uint8), rng.integers(0, 10, 21),
                              mean=[0.5, 0.4, 0.3], std=[0.2, 0.3, 0.25])
        for seed in range(3):
            plans.append(os.path.join(os.path.dirname(data), f"plan{seed}.yaml"))
            with open(plans[-1], "w", encoding="utf-8") as f:
                f.write(random_plan(load_model(MODEL), 6, world.size, seed).text)
    val, plans = world.bcast((val, plans))

    def job(plan):
        spec = _job(data, plan)
        spec["data"]["val"], spec["eval"]["every"] = val, 2
        return spec
    reference = Trainer(job("data"), log=lambda line: None, world=World(None)).run()["val"]
    problems = []
    for plan in plans:
        got = Trainer(job(plan), log=lambda line: None, world=world).run()["val"]
        if not (np.isclose(got[0], reference[0], rtol=1e-10, atol=0) and got[1] == reference[1]):
            problems.append(f"{plan}: val {got} != one process's {reference}")
    agree(world, problems)
    world.barrier()
    if world.rank == 0:
        shutil.rmtree(os.path.dirname(data))


def test_augmented_training_read_ahead_under_random_plans_equals_one_process(world):
    """Random crops and flips, read ahead by worker processes (none, one, two), under plans that split the
    samples, rows, columns and channels every way: the same losses and held-out result as one process reading
    in the step. Each rank's workers read only its boxes: the crops' parts its tiles need, mirrored under flips."""
    from plans import random_plan
    from spmdcnn.runtime.train import Trainer
    data = _dataset(world, shape=(19, 18))
    val, plans = None, []
    if world.rank == 0:
        val = os.path.join(os.path.dirname(data), "val.h5")
        rng = np.random.default_rng(1)
        dataset.write_dataset(val, rng.integers(0, 256, (9, 3, 17, 16), dtype=np.uint8), rng.integers(0, 10, 9))
        for seed in range(3):
            plans.append(os.path.join(os.path.dirname(data), f"plan{seed}.yaml"))
            with open(plans[-1], "w", encoding="utf-8") as f:
                f.write(random_plan(load_model(MODEL), 6, world.size, 10 + seed).text)
    val, plans = world.bcast((val, plans))

    def job(plan, workers):
        spec = _job(data, plan, workers=workers, augment={"crop": [15, 13], "flip": True})
        spec["data"]["val"], spec["eval"]["every"], spec["steps"] = val, 5, 10    # 10 steps: two epochs
        return spec
    reference = Trainer(job("data", 0), log=lambda line: None, world=World(None)).run()
    problems = []
    for plan, workers in zip(plans, (0, 1, 2)):
        got = Trainer(job(plan, workers), log=lambda line: None, world=world).run()
        if not np.allclose(got["losses"], reference["losses"], rtol=1e-10, atol=0):
            problems.append(f"{plan}, {workers} workers: losses {got['losses']} != one process's "
                            f"{reference['losses']}")
        if not (np.isclose(got["val"][0], reference["val"][0], rtol=1e-10) and got["val"][1] == reference["val"][1]):
            problems.append(f"{plan}: val {got['val']} != one process's {reference['val']}")
    agree(world, problems)
    world.barrier()
    if world.rank == 0:
        shutil.rmtree(os.path.dirname(data))


VOLUME_MODEL = os.path.join(os.path.dirname(MODEL), "tiny_volume.yaml")


def test_a_volume_regression_read_ahead_under_random_plans_equals_one_process(world):
    """Volumes (N, C, D, H, W) with targets: random crops along every axis and flips of d, h and w, read ahead by
    workers under plans that split the samples, channels, depth, rows and columns every way; the same losses and
    held-out mean absolute error as one process reading in the step."""
    root = None
    plans = []
    if world.rank == 0:
        root = tempfile.mkdtemp(prefix="spmdcnn-mpi-")
        rng = np.random.default_rng(2)
        for name, count, shape in (("train", 30, (2, 13, 10, 9)), ("val", 7, (2, 12, 10, 8))):
            dataset.write_dataset(os.path.join(root, f"{name}.h5"), rng.standard_normal((count,) + shape)
                                  .astype(np.float32), rng.uniform(-1, 1, (count, 3)).astype(np.float32))
        plans = _random_plans(root, load_model(VOLUME_MODEL), world.size, 20)
    root, plans = world.bcast((root, plans))

    def job(plan, workers):
        return parse_job({"model": VOLUME_MODEL, "batch_size": 6, "steps": 8, "dtype": "float64", "plan": plan,
                          "data": {"kind": "hdf5", "path": os.path.join(root, "train.h5"), "shuffle": True,
                                   "seed": 1, "workers": workers, "val": os.path.join(root, "val.h5"),
                                   "augment": {"crop": [11, 9, 8], "flip": ["d", "h", "w"]}},
                          "eval": {"every": 4}, "optimizer": {"lr": 0.05, "momentum": 0.9}, "log": {"every": 100}})
    reference, problems = _runs_against_one_process(world, job, plans, whole_val=False)
    if not 0 < reference["val"][1] < 2:
        problems.append(f"one process's held-out MAE {reference['val'][1]}")
    agree(world, problems)
    world.barrier()
    if world.rank == 0:
        shutil.rmtree(root)


def test_segmentation_read_ahead_under_random_plans_equals_one_process(world):
    """Masks (N, H, W) with an ignore label: random crops and flips of images and masks together, read ahead by
    workers under plans that split the samples, channels, rows and columns of every layer, the loss per pixel
    included; the same losses, held-out pixel accuracy, mean IoU and Dice as one process reading in the step."""
    from decoder_models import SEGMENTER
    from spmdcnn.graph.graph import parse_model
    import yaml
    root = None
    plans = []
    if world.rank == 0:
        root = tempfile.mkdtemp(prefix="spmdcnn-mpi-")
        rng = np.random.default_rng(3)
        for name, count, shape in (("train", 24, (12, 11)), ("val", 7, (11, 9))):
            masks = rng.integers(0, 3, (count,) + shape)
            masks[rng.random(masks.shape) < 0.1] = 7
            dataset.write_dataset(os.path.join(root, f"{name}.h5"), rng.integers(0, 256, (count, 3) + shape,
                                                                                  dtype=np.uint8), masks)
        with open(os.path.join(root, "model.yaml"), "w", encoding="utf-8") as f:
            yaml.safe_dump(SEGMENTER, f)
        plans = _random_plans(root, parse_model(SEGMENTER), world.size, 30)
    root, plans = world.bcast((root, plans))

    def job(plan, workers):
        return parse_job({"model": os.path.join(root, "model.yaml"), "batch_size": 6, "steps": 6, "dtype": "float64",
                          "plan": plan, "data": {"kind": "hdf5", "path": os.path.join(root, "train.h5"),
                                                 "shuffle": True, "seed": 1, "workers": workers,
                                                 "val": os.path.join(root, "val.h5"),
                                                 "augment": {"crop": [10, 8], "flip": ["h", "w"]}},
                          "eval": {"every": 3}, "optimizer": {"lr": 0.05, "momentum": 0.9}, "log": {"every": 100}})
    reference, problems = _runs_against_one_process(world, job, plans)
    if not 0 < reference["val"].mean_iou < 1:
        problems.append(f"one process's held-out {reference['val']}")
    agree(world, problems)
    world.barrier()
    if world.rank == 0:
        shutil.rmtree(root)


def _runs_against_one_process(world, job, plans, whole_val=True):
    """``(reference, problems)``: one process's run of ``job(plan, workers)`` under data parallelism reading in the
    step, and what differs from it in the runs on ``world`` under each of ``plans`` with 0, 1 and 2 workers: the
    losses, and the held-out scores (all of them, or with ``whole_val`` False the loss and the first score)."""
    from spmdcnn.runtime.train import Trainer
    reference = Trainer(job("data", 0), log=lambda line: None, world=World(None)).run()
    problems = []
    shown = slice(None) if whole_val else slice(0, 2)
    for plan, workers in zip(plans, (0, 1, 2)):
        got = Trainer(job(plan, workers), log=lambda line: None, world=world).run()
        if not np.allclose(got["losses"], reference["losses"], rtol=1e-10, atol=0):
            problems.append(f"{plan}, {workers} workers: losses {got['losses']} != one process's "
                            f"{reference['losses']}")
        if not np.allclose(got["val"][shown], reference["val"][shown], rtol=1e-10, atol=0):
            problems.append(f"{plan}: val {got['val']} != one process's {reference['val']}")
    return reference, problems


def _random_plans(root, graph, devices, first_seed, batch=6):
    """The paths of three random plans of ``graph`` for ``devices`` written in ``root`` (seeds from
    ``first_seed``)."""
    from plans import random_plan
    paths = []
    for seed in range(3):
        paths.append(os.path.join(root, f"plan{seed}.yaml"))
        with open(paths[-1], "w", encoding="utf-8") as f:
            f.write(random_plan(graph, batch, devices, first_seed + seed).text)
    return paths


def test_masks_outside_the_classes_are_found_by_rank_0_alone_and_stop_every_rank(world):
    """Every value of every mask is read once, by rank 0 (not by every rank); its finding stops them all."""
    import pytest
    import yaml
    from decoder_models import SEGMENTER
    from spmdcnn.runtime.train import Trainer
    root = None
    if world.rank == 0:
        root = tempfile.mkdtemp(prefix="spmdcnn-mpi-")
        masks = np.zeros((12, 10, 8), dtype=np.int64)
        masks[11, 9, 7] = 5                                      # SEGMENTER has 3 classes and ignores 7
        dataset.write_dataset(os.path.join(root, "train.h5"), np.zeros((12, 3, 10, 8), np.uint8), masks)
        with open(os.path.join(root, "model.yaml"), "w", encoding="utf-8") as f:
            yaml.safe_dump(SEGMENTER, f)
    root = world.bcast(root)
    job = parse_job({"model": os.path.join(root, "model.yaml"), "batch_size": 6, "steps": 2, "plan": "data",
                     "data": {"kind": "hdf5", "path": os.path.join(root, "train.h5")}, "log": {"every": 100}})
    with pytest.raises(Exception) as info:
        Trainer(job, log=lambda line: None, world=world)
    message = str(info.value)
    problems = [] if "the masks range over [0, 5]: 5 is not one of model 'segmenter''s 3 classes" in message \
        else [f"rank {world.rank}: {message}"]
    if world.size > 1 and "(on rank 0)" not in message:
        problems.append(f"rank {world.rank}: not rank 0's finding alone: {message}")
    agree(world, problems)
    world.barrier()
    if world.rank == 0:
        shutil.rmtree(root)
