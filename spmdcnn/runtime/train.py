"""The training loop of ``spmdcnn train``: data, steps, logging, metrics and checkpoints (DESIGN.md §3.3-3.5)."""

import json
import os
import time

import numpy as np

from .. import backend
from ..graph import load_model
from ..io.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ..io.dataset import HDF5Dataset, SyntheticData
from .executor import Executor
from .optimizer import SGD


def make_data(job, graph):
    spec = job["data"]
    if spec["kind"] == "hdf5":
        data = HDF5Dataset(spec["path"], seed=spec["seed"], shuffle=spec["shuffle"])
        data.check_model(graph)
        return data
    return SyntheticData(graph.input_shape, graph.num_classes, spec["num_samples"], seed=spec["seed"])


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


def write_checkpoint(path, executor, optimizer, step, epoch, job, graph):
    host = backend.to_numpy
    save_checkpoint(
        path, model_text=graph.text,
        params={name: host(v) for name, v in executor.params.items()},
        buffers={name: host(v) for name, v in executor.buffers.items()},
        momentum={name: host(v) for name, v in optimizer.velocity.items()} if optimizer.velocity else {},
        step=step, epoch=epoch, plan_text="",
        state={"step": step, "epoch": epoch, "seed": job["seed"], "data_seed": job["data"]["seed"],
               "shuffle": job["data"]["shuffle"]})


class Trainer:
    """One training run of a validated job (see :func:`spmdcnn.io.job.load_job`)."""

    def __init__(self, job, log=None):
        self.job = job
        self.log = log or (lambda line: print(line, flush=True))
        self.graph = load_model(job["model"])
        self.xp = backend.get_array_module(job["backend"])
        self.dtype = backend.resolve_dtype(job["dtype"])
        self.data = make_data(job, self.graph)
        self.batch = job["batch_size"]
        self.steps_per_epoch = self.data.batches_per_epoch(self.batch)
        self.total_steps = job["steps"] if job["steps"] is not None else job["epochs"] * self.steps_per_epoch
        self.executor = Executor(self.graph, self.xp, self.dtype, seed=job["seed"])
        self.optimizer = make_optimizer(job, self.graph, self.xp, self.dtype)
        self.start_step = self._load_start()

    def _load_start(self):
        job = self.job
        path = job["checkpoint"]["path"]
        resume = job["resume"]
        if resume is True and not (path and os.path.exists(path)):
            raise CheckpointError(f"resume: true, but there is no checkpoint at checkpoint.path ({path!r})")
        if resume in ("auto", True) and path and os.path.exists(path):
            ckpt = load_checkpoint(path)
            restore(self.executor, self.optimizer, ckpt)
            self.log(f"resumed from {path} at step {ckpt.step}")
            return ckpt.step
        if job["init"]:
            restore(self.executor, self.optimizer, load_checkpoint(job["init"]), weights_only=True)
            self.log(f"initial weights from {job['init']}")
        return 0

    def run(self):
        job, graph, executor, xp = self.job, self.graph, self.executor, self.xp
        every = job["log"]["every"]
        metrics = _open_metrics(job["log"]["metrics"], resumed=self.start_step > 0)
        self.log(f"model {graph.name}: {len(graph.layers)} layers, {graph.num_params:,} parameters; "
                 f"batch {self.batch}, {self.total_steps} steps ({self.steps_per_epoch} per epoch); "
                 f"backend {xp.__name__}, {self.dtype.name}; one process")
        history = []
        interval_start, interval_losses, interval_correct = time.perf_counter(), [], 0
        step = self.start_step
        ckpt_path, ckpt_every = job["checkpoint"]["path"], job["checkpoint"]["every"]
        try:
            while step < self.total_steps:
                epoch, s = divmod(step, self.steps_per_epoch)
                images, labels = self.data.batch(epoch, s, self.batch, self.dtype)
                loss, correct, _ = executor.forward(xp.asarray(images), xp.asarray(labels), step=step)
                executor.backward()
                self.optimizer.step(executor.params.flat, executor.grads.flat)
                if not np.isfinite(loss):
                    raise FloatingPointError(f"step {step + 1}: the loss is {loss}; lower optimizer.lr?")
                step += 1
                history.append(loss)
                interval_losses.append(loss)
                interval_correct += correct
                if step % every == 0 or step == self.total_steps:
                    elapsed = time.perf_counter() - interval_start
                    record = {"step": step, "epoch": epoch, "loss": loss,
                              "loss_avg": float(np.mean(interval_losses)),
                              "accuracy": interval_correct / (len(interval_losses) * self.batch),
                              "images_per_s": len(interval_losses) * self.batch / elapsed,
                              "lr": self.optimizer.lr}
                    self.log(f"step {step:>6}/{self.total_steps}  epoch {epoch}  loss {loss:.4f}  "
                             f"(avg {record['loss_avg']:.4f})  acc {record['accuracy']:.3f}  "
                             f"{record['images_per_s']:.1f} images/s")
                    if metrics:
                        metrics.write(json.dumps(record) + "\n")
                        metrics.flush()
                    interval_start, interval_losses, interval_correct = time.perf_counter(), [], 0
                if ckpt_path and ckpt_every and step % ckpt_every == 0 and step < self.total_steps:
                    write_checkpoint(ckpt_path, executor, self.optimizer, step, step // self.steps_per_epoch,
                                     job, graph)
            if ckpt_path:
                write_checkpoint(ckpt_path, executor, self.optimizer, step, step // self.steps_per_epoch, job, graph)
                self.log(f"checkpoint written to {ckpt_path} (step {step})")
        finally:
            if metrics:
                metrics.close()
        return {"steps": step, "losses": history}


def _open_metrics(path, resumed):
    if not path:
        return None
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    return open(path, "a" if resumed else "w", encoding="utf-8")


def train(job, log=None):
    return Trainer(job, log).run()

