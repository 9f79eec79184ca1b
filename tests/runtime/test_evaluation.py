"""Held-out evaluation (``data.val``, ``eval.every``), learning-rate schedules and the progress bar."""

import io
import json
import math
import os

import h5py
import numpy as np
import pytest

from spmdcnn.graph import load_model
from spmdcnn.io.dataset import HDF5Dataset, write_dataset
from spmdcnn.io.job import parse_job
from spmdcnn.io.yamlfile import FormatError
from spmdcnn.runtime.evaluate import evaluate
from spmdcnn.runtime.executor import Executor
from spmdcnn.runtime.schedule import learning_rate
from spmdcnn.runtime.train import Trainer, training_progress

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")


def dataset(path, count, seed=0, shape=(3, 15, 13)):
    rng = np.random.default_rng(seed)
    write_dataset(path, rng.integers(0, 256, (count,) + shape, dtype=np.uint8), rng.integers(0, 10, count),
                  mean=[0.5, 0.4, 0.3][:shape[0]], std=[0.3] * shape[0])
    return str(path)


def job(tmp_path, **overrides):
    values = {"model": os.path.join(MODELS, "tiny_cnn.yaml"), "batch_size": 8, "steps": 6, "dtype": "float64",
              "data": {"kind": "hdf5", "path": dataset(tmp_path / "train.h5", 40),
                       "val": dataset(tmp_path / "val.h5", 21, seed=1)},
              "optimizer": {"lr": 0.05, "momentum": 0.9}, "eval": {"every": 4},
              "log": {"every": 1, "metrics": str(tmp_path / "metrics.jsonl")}, "seed": 2}
    values.update(overrides)
    return parse_job(values, "test-job")


def test_evaluation_counts_every_sample_once_whatever_the_batch():
    """21 samples in batches of 8: the last batch padded; the same loss and accuracy as one batch of all 21
    (batch normalization from running statistics set away from their defaults), with or without workers."""
    graph = load_model(os.path.join(MODELS, "tiny_cnn.yaml"))
    executor = Executor(graph, dtype=np.float64, seed=3)
    executor.buffers.flat[...] = np.abs(np.random.default_rng(1).standard_normal(executor.buffers.flat.shape))
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        val = HDF5Dataset(dataset(os.path.join(folder, "val.h5"), 21, seed=1), shuffle=False)
        images, labels = val.read(np.arange(21), np.float64)
        whole, right, _ = executor.forward(images, labels, training=False)
        for batch, workers in ((8, 0), (21, 0), (5, 0), (8, 2), (5, 1)):      # read in the rank, or ahead
            loss, accuracy, iou, dice = evaluate(executor, val, batch, np.float64, workers)
            assert iou is None and dice is None
            assert loss == pytest.approx(whole, rel=1e-12) and accuracy == right / 21
        val.close()


def test_padding_labels_add_nothing_to_the_loss_or_its_gradient():
    from spmdcnn.ops.loss import softmax_cross_entropy_backward, softmax_cross_entropy_forward
    logits = np.random.default_rng(0).standard_normal((5, 4))
    labels = np.array([1, -1, 3, -1, 0])
    loss, saved = softmax_cross_entropy_forward(logits, labels, total=5)
    real, real_saved = softmax_cross_entropy_forward(logits[[0, 2, 4]], labels[[0, 2, 4]], total=5)
    assert loss == pytest.approx(real, rel=1e-14)
    grad = softmax_cross_entropy_backward(1.0, saved)
    assert not grad[[1, 3]].any()
    np.testing.assert_allclose(grad[[0, 2, 4]], softmax_cross_entropy_backward(1.0, real_saved), rtol=1e-14)
    with pytest.raises(ValueError, match="or be -1"):
        softmax_cross_entropy_forward(logits, np.array([1, -2, 3, 0, 0]))


def test_a_run_evaluates_every_n_steps_and_at_the_end(tmp_path):
    result = Trainer(job(tmp_path), log=lambda line: None).run()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in records if "val_accuracy" in r]
    assert [r["step"] for r in evaluated] == [4, 6]
    assert result["val"][:2] == (evaluated[-1]["val_loss"], evaluated[-1]["val_accuracy"])
    assert all({"step", "loss", "images_per_s", "step_s", "lr"} <= set(r) for r in records)
    assert 0 <= evaluated[-1]["val_accuracy"] <= 1 and evaluated[-1]["val_accuracy"] * 21 % 1 == 0


def test_a_run_resumed_at_its_end_still_evaluates(tmp_path):
    first = Trainer(job(tmp_path, checkpoint={"path": str(tmp_path / "run.h5")}), log=lambda line: None).run()
    lines = []
    again = Trainer(job(tmp_path, checkpoint={"path": str(tmp_path / "run.h5")}), log=lines.append).run()
    assert again["steps"] == 6 and again["losses"] == []
    val, before = again["val"], first["val"]
    assert (val.loss, val.score) == pytest.approx((before.loss, before.score), rel=1e-12)
    assert val.mean_iou is before.mean_iou is None and val.mean_dice is before.mean_dice is None   # a classifier
    assert any("val acc" in line for line in lines)


def test_a_held_out_set_of_other_images_is_refused_before_training(tmp_path):
    bad = dataset(tmp_path / "bad.h5", 5, shape=(1, 8, 8))
    with pytest.raises(ValueError, match="bad.h5: images are \\[1, 8, 8\\]"):
        Trainer(job(tmp_path, data={"kind": "hdf5", "path": dataset(tmp_path / "t.h5", 40), "val": bad}),
                log=lambda line: None)


def test_the_learning_rate_schedules():
    spec = {"lr": 0.1, "warmup_steps": 4, "schedule": "constant", "decay_every": None, "gamma": 0.1,
            "min_lr": 0.0}
    assert [learning_rate(spec, s, 10) for s in range(6)] == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])
    step = {**spec, "warmup_steps": 0, "schedule": "step", "decay_every": 3, "gamma": 0.5}
    assert [learning_rate(step, s, 10) for s in range(7)] == pytest.approx([0.1] * 3 + [0.05] * 3 + [0.025])
    cosine = {**spec, "schedule": "cosine", "min_lr": 0.01}
    rates = [learning_rate(cosine, s, 14) for s in range(14)]
    assert rates[4] == pytest.approx(0.1) and rates[-1] > 0.01
    assert rates[9] == pytest.approx(0.01 + 0.09 * (1 + math.cos(math.pi * 5 / 10)) / 2)
    assert all(a >= b for a, b in zip(rates[4:], rates[5:]))
    assert learning_rate(cosine, 14, 14) == pytest.approx(0.01)


def test_a_run_follows_its_schedule(tmp_path):
    spec = {"lr": 0.08, "momentum": 0.9, "schedule": "step", "decay_every": 2, "gamma": 0.5, "warmup_steps": 2}
    Trainer(job(tmp_path, optimizer=spec), log=lambda line: None).run()
    rates = [json.loads(line)["lr"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rates == pytest.approx([0.04, 0.08, 0.08, 0.08, 0.04, 0.04])


@pytest.mark.parametrize("overrides, message", [
    ({"eval": {"every": 3}, "data": {"kind": "synthetic"}}, "'eval.every' evaluates data.val"),
    ({"eval": {"every": 0}}, "'eval.every' must be positive"),
    ({"data": {"kind": "hdf5", "path": "t.h5", "make": "digits"}}, "give data.val"),
    ({"data": {"kind": "hdf5", "path": "t.h5", "make": "mnist", "val": "v.h5"}}, "'data.make' must be one of"),
    ({"data": {"kind": "synthetic", "val": "v.h5"}}, "'data.val' needs data.kind hdf5"),
    ({"optimizer": {"schedule": "step"}}, "needs a positive 'optimizer.decay_every'"),
    ({"optimizer": {"schedule": "cosine", "decay_every": 3}}, "applies to schedule: step"),
    ({"optimizer": {"schedule": "linear"}}, "'optimizer.schedule' must be one of constant, step, cosine"),
    ({"optimizer": {"warmup_steps": -1}}, "'optimizer.warmup_steps' must be non-negative"),
    ({"optimizer": {"schedule": "step", "decay_every": 2, "gamma": -0.5}}, "'optimizer.gamma' must lie in"),
    ({"optimizer": {"schedule": "cosine", "lr": 0.1, "min_lr": 0.2}}, "must not exceed 'optimizer.lr'"),
    ({"log": {"progress": "sometimes"}}, "'log.progress' must be auto, true or false"),
])
def test_bad_evaluation_and_schedule_keys_are_named(overrides, message):
    with pytest.raises(FormatError, match=message):
        parse_job({"model": "m.yaml", "batch_size": 2, "steps": 1, **overrides}, "job.yaml")


def test_the_progress_bar_draws_only_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True
    screen = Terminal()
    bar = training_progress("auto", 12, 0, screen)
    bar.update(3, note="loss 0.5000")
    bar.write("step 3")
    bar.close()
    text = screen.getvalue()
    assert "train [#####...............] 3/12 steps" in text and "loss 0.5000" in text and "step 3\n" in text
    assert text.endswith("\r\x1b[K")
    assert training_progress("auto", 12, 0, io.StringIO()) is None          # a batch log: the log lines say it
    assert training_progress(False, 12, 0, screen) is None
    assert training_progress(True, 12, 4, io.StringIO()) is not None


def test_a_run_on_a_terminal_prints_its_log_lines_above_the_bar(tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True
    screen = Terminal()
    monkeypatch.setattr("sys.stdout", screen)
    job = parse_job({"model": os.path.join(MODELS, "tiny_cnn.yaml"), "batch_size": 4, "steps": 4,
                     "data": {"kind": "synthetic", "num_samples": 16}, "log": {"every": 2}}, "job")
    Trainer(job).run()
    text = screen.getvalue()
    assert "train [" in text and "4/4 steps" in text and "\rstep      2/4" in text.replace("\x1b[K", ""), text


def test_the_digits_written_on_first_use(tmp_path):
    from spmdcnn.io.digits import load_digits
    values = {"model": os.path.join(MODELS, "digits_cnn.yaml"), "batch_size": 32, "steps": 2,
              "data": {"kind": "hdf5", "path": str(tmp_path / "d" / "train.h5"), "val": str(tmp_path / "d" / "val.h5"),
                       "make": "digits"}}
    lines = []
    Trainer(parse_job(values, "job"), log=lines.append).run()
    assert any(line.startswith("data: wrote") for line in lines)
    with h5py.File(tmp_path / "d" / "train.h5") as train, h5py.File(tmp_path / "d" / "val.h5") as val:
        assert len(train["labels"]) + len(val["labels"]) == len(load_digits()[1]) == 1797
    lines.clear()
    Trainer(parse_job(values, "job"), log=lines.append).run()
    assert not any(line.startswith("data: wrote") for line in lines)      # there already


def test_a_signal_stops_before_the_evaluation_and_a_signal_at_the_end_completes_the_run(tmp_path, monkeypatch):
    import signal
    events = []
    for at, expected in ((3, "SIGTERM"), (5, None)):       # step 4 would evaluate; step 6 is the last
        trainer = Trainer(job(tmp_path / str(at), checkpoint={"path": str(tmp_path / str(at) / "run.h5")}),
                          log=events.append)
        step, evaluate, done = trainer._step, trainer._evaluate, []

        def signalled(index, signals=None, at=at, step=step, done=done):
            if index == at:
                os.kill(os.getpid(), signal.SIGTERM)
            done.append(index + 1)
            return step(index, signals)
        monkeypatch.setattr(trainer, "_step", signalled)
        monkeypatch.setattr(trainer, "_evaluate",
                            lambda evaluate=evaluate, done=done: events.append(f"eval {done[-1]}") or evaluate())
        result = trainer.run()
        assert result["stopped"] == expected and result["steps"] == at + 1
        assert f"eval {at + 1}" not in events
        from spmdcnn.io.checkpoint import load_checkpoint
        assert load_checkpoint(tmp_path / str(at) / "run.h5").step == at + 1
    assert any("during the last step: the run is complete" in e for e in events)


def test_an_empty_held_out_set_is_refused_before_training(tmp_path):
    write_dataset(tmp_path / "empty.h5", np.zeros((0, 3, 15, 13), np.uint8), np.zeros(0, int))
    with pytest.raises(ValueError, match="empty.h5: the held-out dataset has no samples"):
        Trainer(job(tmp_path, data={"kind": "hdf5", "path": dataset(tmp_path / "t.h5", 40),
                                    "val": str(tmp_path / "empty.h5")}), log=lambda line: None)


def test_zero_steps_evaluate_the_initial_weights(tmp_path):
    result = Trainer(job(tmp_path, steps=0, eval={"every": None}), log=lambda line: None).run()
    assert result["steps"] == 0 and result["val"] is not None


def test_a_plan_files_prediction_is_the_logged_predicted_step_time(tmp_path):
    """``spmdcnn plan -o`` writes ``predicted``; a job under that file logs it beside the measured step time, with
    the time the step takes to read its batch (data.workers auto reads in the step here)."""
    from spmdcnn.planner import make_plan
    from spmdcnn.planner.service import cost_model, plan_document
    from spmdcnn.tiling.plan import PlanError, parse_plan_text
    graph = load_model(os.path.join(MODELS, "tiny_cnn.yaml"))
    result = make_plan(graph, 1, cost_model(graph, 8, 1), "data")
    (tmp_path / "plan.yaml").write_text(plan_document(result))
    Trainer(job(tmp_path, plan=str(tmp_path / "plan.yaml")), log=lambda line: None).run()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["predicted_plan_s"] == pytest.approx(result.prediction.iteration_s, rel=1e-6)
    read = records[-1]["predicted_step_s"] - records[-1]["predicted_plan_s"]    # a step reads its batch
    assert 0 < read < records[-1]["data_wait_s"] * 10 + 0.01
    with pytest.raises(PlanError, match="predicted must hold iteration_s"):
        parse_plan_text(result.plan.text + "predicted: {iteration_s: -1}\n", graph, 8, 1, "bad.yaml")
