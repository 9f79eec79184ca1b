"""The training loop of ``spmdcnn train``: data, steps, logging, metrics and checkpoints (DESIGN.md §3.3-3.5)."""

import json
import os
import time
import uuid

import numpy as np

from .. import backend
from ..comm import World
from ..graph import load_model
from ..io.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ..io.dataset import HDF5Dataset, SyntheticData
from ..cost.machine import load_machine
from ..tiling.plan import load_plan
from .autoplan import auto_plan
from .executor import Executor
from .optimizer import SGD
from .resume import check_resumable, state_for, trim_metrics
from .shards import gather_global, share_checkpoint


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


def make_optimizer(job, executor):
    spec = job["optimizer"]
    return SGD(executor.params.shapes, executor.dtype, executor.xp, lr=spec["lr"], momentum=spec["momentum"],
               weight_decay=spec["weight_decay"], nesterov=spec["nesterov"])


def restore(executor, optimizer, tensors, weights_only=False):
    """Copy this rank's rows of each global ``(group, name, array)`` of a checkpoint into the executor's
    parameters and buffers (``group`` params or buffers) and the optimizer's momentum (momentum)."""
    stores = {"params": executor.params, "buffers": executor.buffers,
              "momentum": None if weights_only else optimizer.velocity}
    for group, name, array in tensors:
        store = stores[group]
        if store is not None and name in store:
            c0, c1 = executor.shards[name]
            store[name][...] = executor.xp.asarray(array[c0:c1], dtype=executor.dtype)


def write_checkpoint(path, executor, optimizer, state, plan_text):
    """Gather the global arrays on rank 0 and write them there; every rank learns whether it worked."""
    params = gather_global(executor, executor.params)
    buffers = gather_global(executor, executor.buffers)
    momentum = gather_global(executor, optimizer.velocity) if optimizer.velocity else {}

    def write():
        if executor.world.rank != 0:
            return
        try:
            save_checkpoint(path, model_text=executor.graph.text, params=params, buffers=buffers,
                            momentum=momentum, step=state["step"], epoch=state["epoch"], plan_text=plan_text,
                            state=state)
        except (OSError, TypeError, ValueError) as error:
            raise CheckpointError(f"checkpoint.path {path}: cannot write the checkpoint: {error}") from None
    executor.world.agree(write)


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


class NonFiniteLoss(FloatingPointError):
    collective = True          # the loss is the same on every rank: each stops at the same step


class Trainer:
    """One training run of a validated job (see :func:`spmdcnn.io.job.load_job`) on the ranks of ``world``.

    Setup runs in two phases. First every rank loads what it needs alone (model, plan, data; rank 0 also checks
    the output paths and reads the checkpoint): an error anywhere stops every rank with one message. Then the
    ranks check they hold the same model, plan and job, build their tiles (collectively) and restore the
    checkpoint rank 0 read.
    """

    def __init__(self, job, log=None, world=None):
        self.job = job
        self.world = world or World.create()
        self.rank = self.world.rank
        say = log or (lambda line: print(line, flush=True))
        self.log = say if self.rank == 0 else (lambda line: None)
        self.data = None
        try:
            ckpt = self.world.agree(self._load)
            if self.plan is None:
                self.plan = auto_plan(self.graph, self.batch, self.world, job.get("machine"), self.xp, self.dtype,
                                      self.log)
            self.world.check_same({"model": self.graph.text, "plan": self.plan.text,
                                   "job": json.dumps(job, sort_keys=True, default=str),
                                   "data (sample count, shape, labels)": json.dumps(
                                       {**self.data.identity(), "steps": self.total_steps}, sort_keys=True)})
            self.executor = Executor(self.graph, self.xp, self.dtype, seed=job["seed"], plan=self.plan,
                                     world=self.world)
            self.optimizer = make_optimizer(job, self.executor)
            self.start_step = self._restore(share_checkpoint(self.world, ckpt))
        except BaseException:
            if self.data is not None:
                self.data.close()
            raise

    def _load(self):
        """Phase one, without communication: returns ``(kind, checkpoint)`` read on rank 0."""
        job = self.job
        self.graph = load_model(job["model"])
        self.xp = backend.get_array_module(job["backend"])
        self.dtype = backend.resolve_dtype(job["dtype"])
        self.batch = job["batch_size"]
        self.plan = None if job["plan"] in (None, "auto") else load_plan(job["plan"], self.graph, self.batch,
                                                                           self.world.size)
        if job.get("machine") and job["plan"] in (None, "auto"):
            load_machine(job["machine"]).check_devices(self.world.size)
        if self.rank == 0:
            for key, what in ((("checkpoint", "path"), "checkpoint.path"), (("log", "metrics"), "log.metrics")):
                if job[key[0]][key[1]]:
                    _check_writable(job[key[0]][key[1]], what)
        self.data = make_data(job, self.graph)
        self.steps_per_epoch = self.data.batches_per_epoch(self.batch)
        self.total_steps = job["steps"] if job["steps"] is not None else job["epochs"] * self.steps_per_epoch
        return self._read_checkpoint() if self.rank == 0 else None

    def _read_checkpoint(self):
        job = self.job
        path = job["checkpoint"]["path"]
        resume = job["resume"]
        if resume is True and not (path and os.path.exists(path)):
            raise CheckpointError(f"resume: true, but there is no checkpoint at checkpoint.path ({path!r})")
        if resume in ("auto", True) and path and os.path.exists(path):
            ckpt = load_checkpoint(path)
            ckpt.check_model(self.graph)
            check_resumable(ckpt, job, self.data, self.graph)
            return "resume", ckpt
        if job["init"]:
            ckpt = load_checkpoint(job["init"])
            ckpt.check_model(self.graph)
            return "init", ckpt
        return None

    def _restore(self, shared):
        """Take this rank's rows of the checkpoint rank 0 read; returns the step to start from."""
        if shared is None:
            return 0
        kind, step, path, tensors = shared
        restore(self.executor, self.optimizer, tensors, weights_only=kind == "init")
        if kind == "init":
            self.log(f"initial weights from {path}")
            return 0
        self.log(f"resumed from {path} at step {step}")
        return step

    def run(self):
        """Train from ``start_step`` to the end; returns ``{"steps", "losses"}`` (losses of this run's steps)."""
        job, graph = self.job, self.graph
        metrics = None
        where = "one process" if self.world.size == 1 else f"{self.world.size} ranks"
        self.log(f"model {graph.name}: {len(graph.layers)} layers, {graph.num_params:,} parameters; "
                 f"batch {self.batch}, {self.total_steps} steps ({self.steps_per_epoch} per epoch); "
                 f"backend {self.xp.__name__}, {self.dtype.name}; {where}; {self.plan.source}")
        history = []
        interval = _Interval()
        step = self.start_step
        ckpt_path, ckpt_every = job["checkpoint"]["path"], job["checkpoint"]["every"]
        try:
            if self.rank == 0:
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
        executor = self.executor
        epoch, s = divmod(step, self.steps_per_epoch)
        loss, correct, _ = executor.forward(self.data.tiles(epoch, s, self.batch, self.dtype), step=step)
        if not np.isfinite(loss):       # before the update: the weights stay those of the last good step
            raise NonFiniteLoss(f"step {step + 1}: the loss is {loss}; lower optimizer.lr?")
        executor.backward()
        self.optimizer.step(executor.params.flat, executor.grads.flat)
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
        write_checkpoint(self.job["checkpoint"]["path"], self.executor, self.optimizer, state, self.plan.text)


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


def train(job, log=None, world=None):
    return Trainer(job, log, world).run()
