"""The training loop: checkpoints, metrics, resume and init (docs/formats.md: jobs, training semantics, checkpoints)."""

import json
import os

import h5py
import numpy as np
import pytest

from spmdcnn.graph import load_model
from spmdcnn.io.checkpoint import CheckpointError, load_checkpoint
from spmdcnn.io.job import parse_job
from spmdcnn.runtime.executor import Executor
from spmdcnn.runtime.train import Trainer

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")


def make_job(tmp_path, **overrides):
    job = {"model": os.path.join(MODELS, "tiny_cnn.yaml"), "batch_size": 8, "steps": 6,
           "data": {"kind": "synthetic", "num_samples": 32, "seed": 3},
           "optimizer": {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4},
           "checkpoint": {"path": str(tmp_path / "run.h5"), "every": 2},
           "log": {"every": 1, "metrics": str(tmp_path / "metrics.jsonl")}, "dtype": "float64", "seed": 5}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(job.get(key), dict):
            job[key] = {**job[key], **value}
        else:
            job[key] = value
    return parse_job(job, "test-job")


def quiet(_line):
    pass


def test_training_writes_checkpoint_and_metrics(tmp_path):
    result = Trainer(make_job(tmp_path), log=quiet).run()
    assert result["steps"] == 6 and len(result["losses"]) == 6
    ckpt = load_checkpoint(tmp_path / "run.h5")
    assert ckpt.step == 6 and ckpt.epoch == 1           # 4 batches of 8 per epoch of 32 samples
    assert set(ckpt.params) == set(load_model(os.path.join(MODELS, "tiny_cnn.yaml")).param_shapes())
    assert ckpt.momentum and ckpt.buffers
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5, 6]
    assert all({"loss", "images_per_s", "accuracy"} <= set(line) for line in lines)
    assert [line["loss"] for line in lines] == result["losses"]
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_training_reduces_the_loss(tmp_path):
    job = make_job(tmp_path, steps=40, data={"num_samples": 320, "signal": 2.0},
                   checkpoint={"path": None, "every": None}, log={"every": 40, "metrics": None})
    losses = Trainer(job, log=quiet).run()["losses"]
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])


def test_resumed_run_equals_uninterrupted_run_bit_for_bit(tmp_path):
    whole = tmp_path / "whole"
    parts = tmp_path / "parts"
    whole.mkdir()
    parts.mkdir()
    uninterrupted = Trainer(make_job(whole), log=quiet).run()["losses"]
    first = Trainer(make_job(parts, steps=3), log=quiet).run()["losses"]
    assert load_checkpoint(parts / "run.h5").step == 3
    second = Trainer(make_job(parts), log=quiet)
    assert second.start_step == 3
    rest = second.run()["losses"]
    assert first + rest == uninterrupted
    a, b = load_checkpoint(whole / "run.h5"), load_checkpoint(parts / "run.h5")
    for name in a.params:
        assert np.array_equal(a.params[name], b.params[name]), name
        assert np.array_equal(a.momentum[name], b.momentum[name]), name
    for name in a.buffers:
        assert np.array_equal(a.buffers[name], b.buffers[name]), name
    steps = [json.loads(line)["step"] for line in (parts / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_init_loads_weights_only(tmp_path):
    Trainer(make_job(tmp_path, steps=2), log=quiet).run()
    source = load_checkpoint(tmp_path / "run.h5")
    other = tmp_path / "other"
    other.mkdir()
    trainer = Trainer(make_job(other, steps=0, init=str(tmp_path / "run.h5")), log=quiet)
    assert trainer.start_step == 0
    for name, value in source.params.items():
        assert np.array_equal(trainer.executor.params[name], value)
    assert not trainer.optimizer.velocity.flat.any()


def test_resume_wins_over_init(tmp_path):
    Trainer(make_job(tmp_path, steps=2), log=quiet).run()
    trainer = Trainer(make_job(tmp_path, init="/nonexistent.h5"), log=quiet)
    assert trainer.start_step == 2


def test_resume_true_needs_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        Trainer(make_job(tmp_path, resume=True), log=quiet)


def test_resume_false_starts_over(tmp_path):
    Trainer(make_job(tmp_path, steps=2), log=quiet).run()
    assert Trainer(make_job(tmp_path, resume=False), log=quiet).start_step == 0


def test_checkpoint_of_another_model_is_refused(tmp_path):
    Trainer(make_job(tmp_path, steps=1), log=quiet).run()
    with pytest.raises(CheckpointError, match="does not fit model"):
        Trainer(make_job(tmp_path, model=os.path.join(MODELS, "small_resnet.yaml")), log=quiet)


def write_dataset(path, samples, **attrs):
    """A random uint8 dataset of tiny_cnn's input shape with 10 classes; ``attrs`` go on ``/images``."""
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f["images"] = rng.integers(0, 256, (samples, 3, 15, 13), dtype=np.uint8)
        f["labels"] = rng.integers(0, 10, samples)
        f["images"].attrs.update(attrs)


def test_epochs_and_hdf5_data(tmp_path):
    path = tmp_path / "train.h5"
    write_dataset(path, 20, mean=[0.5, 0.4, 0.3], std=[0.2, 0.25, 0.3])
    job = make_job(tmp_path, steps=None, epochs=2, batch_size=6,
                   data={"kind": "hdf5", "path": str(path), "shuffle": True})
    result = Trainer(job, log=quiet).run()
    assert result["steps"] == 2 * (20 // 6)


def test_first_layer_computes_no_input_gradient():
    graph = load_model(os.path.join(MODELS, "alexnet.yaml"))
    executor = Executor(graph)
    assert not executor.site(graph.layers[0]).kernel.input_grad
    assert executor.site(graph.by_name["conv2"]).kernel.input_grad


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nonfinite_loss_stops_the_run(tmp_path):
    job = make_job(tmp_path, optimizer={"lr": 1e30}, steps=6, checkpoint={"path": None, "every": None})
    with pytest.raises(FloatingPointError, match="loss"):
        Trainer(job, log=quiet).run()


def test_resume_refuses_a_job_that_would_read_other_batches(tmp_path):
    Trainer(make_job(tmp_path, steps=2), log=quiet).run()
    with pytest.raises(CheckpointError, match="batch_size 8 -> 4"):
        Trainer(make_job(tmp_path, batch_size=4), log=quiet)
    with pytest.raises(CheckpointError, match="data.seed"):
        Trainer(make_job(tmp_path, data={"seed": 99}), log=quiet)
    # the optimizer's settings may change on resume (a new learning rate, say)
    assert Trainer(make_job(tmp_path, optimizer={"lr": 0.01}), log=quiet).start_step == 2


def test_metrics_of_a_crashed_run_are_trimmed_on_resume(tmp_path):
    Trainer(make_job(tmp_path, steps=2), log=quiet).run()
    metrics = tmp_path / "metrics.jsonl"
    # a crash after step 3 was logged but before its checkpoint, with a torn last line
    metrics.write_text(metrics.read_text() + json.dumps({"step": 3, "loss": 1.0}) + "\n" + '{"step": 4, "lo')
    Trainer(make_job(tmp_path, steps=5), log=quiet).run()
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]


def test_an_unwritable_checkpoint_path_fails_before_training(tmp_path):
    (tmp_path / "blocker").write_text("a file where a directory should be")
    with pytest.raises(CheckpointError, match="checkpoint.path"):
        Trainer(make_job(tmp_path, checkpoint={"path": str(tmp_path / "blocker" / "run.h5")}), log=quiet)
    with pytest.raises(CheckpointError, match="log.metrics"):
        Trainer(make_job(tmp_path, log={"metrics": str(tmp_path / "blocker" / "m.jsonl")}), log=quiet)


def test_checkpoint_records_the_trivial_plan_and_the_data_cursor(tmp_path):
    Trainer(make_job(tmp_path, steps=2), log=quiet).run()
    ckpt = load_checkpoint(tmp_path / "run.h5")
    assert "format: spmdcnn-plan/1" in ckpt.plan_text and "devices: 1" in ckpt.plan_text
    assert ckpt.state["batch_size"] == 8 and ckpt.state["data.kind"] == "synthetic"
    assert ckpt.state["step"] == 2


def test_the_dataset_is_closed_after_the_run(tmp_path):
    path = tmp_path / "train.h5"
    write_dataset(path, 16)
    trainer = Trainer(make_job(tmp_path, steps=2, data={"kind": "hdf5", "path": str(path)}), log=quiet)
    trainer.run()
    with h5py.File(path, "w"):          # would fail if the run still held the file open
        pass


def test_labels_outside_the_model_classes_are_refused_before_training(tmp_path):
    path = tmp_path / "train.h5"
    with h5py.File(path, "w") as f:
        f["images"] = np.zeros((16, 3, 15, 13), dtype=np.uint8)
        f["labels"] = np.arange(16)                    # tiny_cnn has 10 classes
    with pytest.raises(Exception, match=r"labels range over \[0, 15\]"):
        Trainer(make_job(tmp_path, data={"kind": "hdf5", "path": str(path)}), log=quiet)


def test_a_dataset_copied_elsewhere_resumes_but_a_changed_one_does_not(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (16, 3, 15, 13), dtype=np.uint8)
    labels = rng.integers(0, 10, 16)
    for name, stored in (("a.h5", labels), ("copy.h5", labels), ("other.h5", (labels + 1) % 10)):
        with h5py.File(tmp_path / name, "w") as f:
            f["images"], f["labels"] = images, stored
    data = {"kind": "hdf5"}
    Trainer(make_job(tmp_path, steps=2, data={**data, "path": str(tmp_path / "a.h5")}), log=quiet).run()
    moved = Trainer(make_job(tmp_path, steps=4, data={**data, "path": str(tmp_path / "copy.h5")}), log=quiet)
    assert moved.start_step == 2
    moved.data.close()
    with pytest.raises(CheckpointError, match="data.labels_crc32"):
        Trainer(make_job(tmp_path, data={**data, "path": str(tmp_path / "other.h5")}), log=quiet)


def test_resume_refuses_other_synthetic_data_and_another_model(tmp_path):
    Trainer(make_job(tmp_path, steps=2), log=quiet).run()
    with pytest.raises(CheckpointError, match="data.signal"):
        Trainer(make_job(tmp_path, data={"signal": 2.0}), log=quiet)
    changed = tmp_path / "tiny_changed.yaml"
    changed.write_text(open(os.path.join(MODELS, "tiny_cnn.yaml")).read().replace("p: 0.25", "p: 0.5"))
    with pytest.raises(CheckpointError, match="model's layers"):
        Trainer(make_job(tmp_path, model=str(changed)), log=quiet)
    # an unused data.path in a synthetic job is no part of the run
    assert Trainer(make_job(tmp_path, data={"path": "/nowhere.h5"}), log=quiet).start_step == 2


def test_a_directory_as_checkpoint_path_is_refused_before_training(tmp_path):
    (tmp_path / "ckdir").mkdir()
    with pytest.raises(CheckpointError, match="is a directory"):
        Trainer(make_job(tmp_path, resume=False, checkpoint={"path": str(tmp_path / "ckdir")}), log=quiet)


def test_odd_metrics_lines_do_not_block_a_resume(tmp_path):
    Trainer(make_job(tmp_path, steps=2), log=quiet).run()
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + "[1, 2]\n" + '{"step": null}\n' + '{"step": 9}\n')
    Trainer(make_job(tmp_path, steps=3), log=quiet).run()
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3]


def test_keep_holds_the_newest_numbered_checkpoints(tmp_path):
    from spmdcnn.io.checkpoint import kept_checkpoints, numbered
    Trainer(make_job(tmp_path, steps=7, checkpoint={"every": 2, "keep": 3}), log=quiet).run()
    kept = kept_checkpoints(tmp_path / "run.h5")
    assert [step for step, _ in kept] == [4, 6, 7]
    assert kept[-1][1] == numbered(tmp_path / "run.h5", 7) == str(tmp_path / "run-step00000007.h5")
    assert os.path.samefile(tmp_path / "run.h5", kept[-1][1])      # the newest, linked: no second copy
    assert load_checkpoint(kept[0][1]).step == 4 and load_checkpoint(tmp_path / "run.h5").step == 7
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_keep_drops_the_numbered_checkpoints_of_a_replaced_run(tmp_path):
    """A new run (or a resume from an older checkpoint) on the same path: the later numbered files of the run it
    replaces go, and its own newest stay."""
    from spmdcnn.io.checkpoint import kept_checkpoints
    Trainer(make_job(tmp_path, steps=8, checkpoint={"every": 2, "keep": 2}), log=quiet).run()
    assert [step for step, _ in kept_checkpoints(tmp_path / "run.h5")] == [6, 8]
    Trainer(make_job(tmp_path, steps=5, resume=False, checkpoint={"every": 2, "keep": 2}), log=quiet).run()
    assert [step for step, _ in kept_checkpoints(tmp_path / "run.h5")] == [4, 5]
    assert load_checkpoint(tmp_path / "run.h5").step == 5


def _signalled_at_step_3(trainer, monkeypatch, *numbers):
    """``trainer``, its process sent ``numbers`` (signals, in turn) as its third step starts."""
    step = trainer._step

    def signalled(index, signals=None):
        if index == 2:
            for number in numbers:
                os.kill(os.getpid(), number)
        return step(index, signals)
    monkeypatch.setattr(trainer, "_step", signalled)
    return trainer


def test_a_signal_stops_the_run_after_its_step_with_a_checkpoint(tmp_path, monkeypatch):
    import signal
    whole = Trainer(make_job(tmp_path / "a"), log=quiet).run()["losses"]
    trainer = _signalled_at_step_3(Trainer(make_job(tmp_path / "b"), log=quiet), monkeypatch, signal.SIGTERM)
    before = signal.getsignal(signal.SIGTERM)
    result = trainer.run()
    assert result["stopped"] == "SIGTERM" and result["steps"] == 3
    assert signal.getsignal(signal.SIGTERM) is before
    assert load_checkpoint(tmp_path / "b" / "run.h5").step == 3
    rest = Trainer(make_job(tmp_path / "b"), log=quiet).run()
    assert result["losses"] + rest["losses"] == whole and rest["stopped"] is None


def test_a_ctrl_c_stops_the_run_after_its_step_and_then_the_python_around_it(tmp_path, monkeypatch):
    """In Python (a script's loop of runs, a notebook, pytest), Ctrl-C stops the run after its step with a
    checkpoint, then raises KeyboardInterrupt, as Ctrl-C stops any Python code, with the run's result."""
    import signal
    from spmdcnn.runtime.signals import Interrupted
    trainer = _signalled_at_step_3(Trainer(make_job(tmp_path), log=quiet), monkeypatch, signal.SIGINT)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt, match="stopped after step 3 of 6") as stopped:
        trainer.run()
    assert isinstance(stopped.value, Interrupted) and stopped.value.result["stopped"] == "SIGINT"
    assert stopped.value.result["steps"] == 3 and signal.getsignal(signal.SIGINT) is before
    assert load_checkpoint(tmp_path / "run.h5").step == 3


def test_one_stop_request_delivered_twice_at_once_still_checkpoints(tmp_path, monkeypatch):
    """A scheduler that signals every process of a step, and the launcher it signalled too, which passes the
    signal on: the rank gets it twice within milliseconds, and that is one request."""
    import signal
    trainer = _signalled_at_step_3(Trainer(make_job(tmp_path), log=quiet), monkeypatch, signal.SIGTERM,
                                   signal.SIGTERM)
    result = trainer.run()
    assert result["stopped"] == "SIGTERM" and result["steps"] == 3
    assert load_checkpoint(tmp_path / "run.h5").step == 3


def test_a_second_request_later_ends_the_process_as_the_signal_would(monkeypatch):
    import signal
    import time
    from spmdcnn.runtime import signals as module
    sent = []
    monkeypatch.setattr(module.os, "kill", lambda pid, number: sent.append(number))
    before = signal.getsignal(signal.SIGUSR1)
    signals = module.Signals()
    try:
        signals._note(signal.SIGUSR1, None)
        signals._note(signal.SIGUSR1, None)             # at once: the same request
        assert sent == [] and signals.got == signal.SIGUSR1
        signals.first_at = time.monotonic() - module.Signals.DUPLICATE_S
        signals._note(signal.SIGUSR1, None)             # later: the run did not stop in time
        assert sent == [signal.SIGUSR1] and signal.getsignal(signal.SIGUSR1) is before
    finally:
        signals.restore()


def test_ctrl_c_stops_after_the_step_and_a_second_stops_at_once_saying_what_is_lost():
    import signal
    import time
    from spmdcnn.runtime.signals import Signals
    said = []
    before = signal.getsignal(signal.SIGINT)
    signals = Signals(say=said.append, lost=lambda: "at step 7 of 10: the 2 steps since the checkpoint of step 5 "
                                                    "are lost; the next run resumes from step 5")
    try:
        signals._note(signal.SIGINT, None)
        signals._note(signal.SIGINT, None)              # the terminal's and the launcher's: one request
        assert signals.received(signals.flags()) == "SIGINT" and len(said) == 1
        assert said[0].startswith("Ctrl-C: stopping after this step, with a checkpoint (Ctrl-C again stops at once")
        signals.first_at = time.monotonic() - Signals.DUPLICATE_S
        with pytest.raises(KeyboardInterrupt, match="the 2 steps since the checkpoint of step 5 are lost"):
            signals._note(signal.SIGINT, None)
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        signals.restore()


def test_keep_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="'checkpoint.keep' must be positive"):
        make_job(tmp_path, checkpoint={"keep": 0})


def test_an_output_folder_that_refuses_a_file_fails_before_training(tmp_path, monkeypatch):
    """What os.access cannot see (a read-only mount, root squash): a file written and removed in each output
    folder once the job is checked, before the first step."""
    import builtins
    from spmdcnn.runtime import paths
    real_open = builtins.open

    def refusing(path, *args, **kwargs):
        if ".spmdcnn-write-test-" in str(path):
            raise PermissionError(13, "Read-only file system", str(path))
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(paths, "open", refusing, raising=False)
    with pytest.raises(CheckpointError, match=r"checkpoint.path .*run.h5 \(from test-job\): cannot write there: "
                                              r".*Read-only file system"):
        Trainer(make_job(tmp_path), log=quiet)
