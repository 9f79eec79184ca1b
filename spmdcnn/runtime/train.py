"""The training loop of ``spmdcnn train``: data, steps, logging, metrics and checkpoints (DESIGN.md §3.3-3.5)."""

import json
import os
import time
import uuid

import numpy as np

from .. import backend
from ..graph import load_model
from ..io.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ..io.dataset import HDF5Dataset, SyntheticData
from .executor import Executor
from .optimizer import SGD
from .resume import check_resumable, state_for, trim_metrics


def make_data(job, graph):
    spec = job["data"]
    if spec["kind"] == "hdf5":
        data = HDF5Dataset(spec["path"], seed=spec["seed"], shuffle=spec["shuffle"])
        try:
            data.check_model(graph)
        except BaseException:
            data.close()
            raise
        return data
    return SyntheticData(graph.input_shape, graph.num_classes, spec["num_samples"], seed=spec["seed"],
                         signal=spec["signal"], shuffle=spec["shuffle"])


def make_optimizer(job, graph, xp, dtype):
    spec = job["optimizer"]
    return SGD(graph.param_shapes(), dtype, xp, lr=spec["lr"], momentum=spec["momentum"],
               weight_decay=spec["weight_decay"], nesterov=spec["nesterov"])


def restore(executor, optimizer, ckpt, weights_only=False):
    """Copy a checkpoint's global arrays into the executor (and the optimizer's momentum)."""
    xp = executor.xp
    ckpt.check_model(executor.graph)
    for name, array in ckpt.params.items():
        executor.params[name][...] = xp.asarray(array, dtype=executor.dtype)
    for name, array in ckpt.buffers.items():
        executor.buffers[name][...] = xp.asarray(array, dtype=executor.dtype)
    if weights_only or optimizer.velocity is None:
        return
    for name in optimizer.velocity:
        if name in ckpt.momentum:
            optimizer.velocity[name][...] = xp.asarray(ckpt.momentum[name], dtype=executor.dtype)


TRIVIAL_PLAN = "format: spmdcnn-plan/1\ndevices: 1\ndefault: {n: 1}\n"


def write_checkpoint(path, executor, optimizer, state, graph):
    host = backend.to_numpy
    try:
        save_checkpoint(
            path, model_text=graph.text,
            params={name: host(v) for name, v in executor.params.items()},
            buffers={name: host(v) for name, v in executor.buffers.items()},
            momentum={name: host(v) for name, v in optimizer.velocity.items()} if optimizer.velocity else {},
            step=state["step"], epoch=state["epoch"], plan_text=TRIVIAL_PLAN, state=state)
    except (OSError, TypeError, ValueError) as error:
        raise CheckpointError(f"checkpoint.path {path}: cannot write the checkpoint: {error}") from None


def _check_writable(path, what):
    """Fail before training, not hours later, when an output path cannot be written."""
    if os.path.isdir(path):
        raise CheckpointError(f"{what} {path}: is a directory; give a file path")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise CheckpointError(f"{what} {path}: the file exists and is not writable")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".spmdcnn-write-test-{uuid.uuid4().hex}")
        with open(probe, "w", encoding="utf-8"):
            pass
        os.unlink(probe)
    except OSError as error:
        raise CheckpointError(f"{what} {path}: cannot write there: {error}") from None


class Trainer:
    """One training run of a validated job (see :func:`spmdcnn.io.job.load_job`)."""

    def __init__(self, job, log=None):
        self.job = job
        self.log = log or (lambda line: print(line, flush=True))
        self.graph = load_model(job["model"])
        self.xp = backend.get_array_module(job["backend"])
        self.dtype = backend.resolve_dtype(job["dtype"])
        for key, what in ((("checkpoint", "path"), "checkpoint.path"), (("log", "metrics"), "log.metrics")):
            if job[key[0]][key[1]]:
                _check_writable(job[key[0]][key[1]], what)
        self.data = make_data(job, self.graph)
        try:
            self.batch = job["batch_size"]
            self.steps_per_epoch = self.data.batches_per_epoch(self.batch)
            self.total_steps = job["steps"] if job["steps"] is not None else job["epochs"] * self.steps_per_epoch
            self.executor = Executor(self.graph, self.xp, self.dtype, seed=job["seed"])
            self.optimizer = make_optimizer(job, self.graph, self.xp, self.dtype)
            self.start_step = self._load_start()
        except BaseException:
            self.data.close()
            raise

    def _load_start(self):
        job = self.job
        path = job["checkpoint"]["path"]
        resume = job["resume"]
        if resume is True and not (path and os.path.exists(path)):
            raise CheckpointError(f"resume: true, but there is no checkpoint at checkpoint.path ({path!r})")
        if resume in ("auto", True) and path and os.path.exists(path):
            ckpt = load_checkpoint(path)
            ckpt.check_model(self.graph)
            check_resumable(ckpt, job, self.data, self.graph)
            restore(self.executor, self.optimizer, ckpt)
            self.log(f"resumed from {path} at step {ckpt.step}")
            return ckpt.step
        if job["init"]:
            restore(self.executor, self.optimizer, load_checkpoint(job["init"]), weights_only=True)
            self.log(f"initial weights from {job['init']}")
        return 0

    def run(self):
        """Train from ``start_step`` to the end; returns ``{"steps", "losses"}`` (losses of this run's steps)."""
        job, graph = self.job, self.graph
        metrics = None
        self.log(f"model {graph.name}: {len(graph.layers)} layers, {graph.num_params:,} parameters; "
                 f"batch {self.batch}, {self.total_steps} steps ({self.steps_per_epoch} per epoch); "
                 f"backend {self.xp.__name__}, {self.dtype.name}; one process")
        history = []
        interval = _Interval()
        step = self.start_step
        ckpt_path, ckpt_every = job["checkpoint"]["path"], job["checkpoint"]["every"]
        try:
            metrics = _open_metrics(job["log"]["metrics"], self.start_step)
            while step < self.total_steps:
                loss, correct = self._step(step)
                step += 1
                history.append(loss)
                interval.add(loss, correct)
                if step % job["log"]["every"] == 0 or step == self.total_steps:
                    self._report(step, loss, interval, metrics)
                    interval = _Interval()
                if ckpt_path and ckpt_every and step % ckpt_every == 0 and step < self.total_steps:
                    self._checkpoint(step)
            if ckpt_path:
                self._checkpoint(step)
                self.log(f"checkpoint written to {ckpt_path} (step {step})")
        finally:
            if metrics:
                metrics.close()
            self.data.close()
        return {"steps": step, "losses": history}

    def _step(self, step):
        xp, executor = self.xp, self.executor
        epoch, s = divmod(step, self.steps_per_epoch)
        images, labels = self.data.batch(epoch, s, self.batch, self.dtype)
        loss, correct, _ = executor.forward(xp.asarray(images), xp.asarray(labels), step=step)
        executor.backward()
        self.optimizer.step(executor.params.flat, executor.grads.flat)
        if not np.isfinite(loss):
            raise FloatingPointError(f"step {step + 1}: the loss is {loss}; lower optimizer.lr?")
        return loss, correct

    def _report(self, step, loss, interval, metrics):
        elapsed = time.perf_counter() - interval.start
        count = len(interval.losses)
        record = {"step": step, "epoch": (step - 1) // self.steps_per_epoch, "loss": loss,
                  "loss_avg": float(np.mean(interval.losses)), "accuracy": interval.correct / (count * self.batch),
                  "images_per_s": count * self.batch / elapsed, "lr": self.optimizer.lr}
        self.log(f"step {step:>6}/{self.total_steps}  epoch {record['epoch']}  loss {loss:.4f}  "
                 f"(avg {record['loss_avg']:.4f})  acc {record['accuracy']:.3f}  "
                 f"{record['images_per_s']:.1f} images/s")
        if metrics:
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()

    def _checkpoint(self, step):
        state = state_for(self.job, self.data, step, step // self.steps_per_epoch)
        write_checkpoint(self.job["checkpoint"]["path"], self.executor, self.optimizer, state, self.graph)


class _Interval:
    """Losses and right answers since the last log line."""

    def __init__(self):
        self.start, self.losses, self.correct = time.perf_counter(), [], 0

    def add(self, loss, correct):
        self.losses.append(loss)
        self.correct += correct


def _open_metrics(path, start_step):
    """The metrics file: new for a new run; on resume, kept up to ``start_step`` and appended to."""
    if not path:
        return None
    if start_step and os.path.exists(path):
        trim_metrics(path, start_step)
        return open(path, "a", encoding="utf-8")
    return open(path, "w", encoding="utf-8")


def train(job, log=None):
    return Trainer(job, log).run()
