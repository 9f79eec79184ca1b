"""The training loop of ``spmdcnn train``: data, steps, logging, metrics and checkpoints (docs/formats.md#job-files,
#training-semantics, #checkpoint-files)."""

import json
import os
import signal
import time
from functools import cached_property

import numpy as np

from .. import backend, cores_per_rank
from ..comm import World, choose_transport
from ..comm.watchdog import Settings as WatchdogSettings
from ..comm.transport import check as check_transport
from ..cost.buckets import SyncOptions
from ..cost.machine import load_machine
from ..sizes import format_bytes
from ..graph import load_model
from ..io.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ..io.augment import Augment
from ..io.dataset import DataError, held_out_problems, open_checked
from ..io.synthetic import SYNTHETIC_SAMPLES, SyntheticData
from ..io.prefetch import AUTO_MIN_READ_S, Loader
from ..io.workers import CLOSE_GRACE_S
from ..tiling.plan import load_plan, named
from .autoplan import auto_plan
from .bench import blas_of_ranks
from .insitu import JobReads
from .trials import TrialSettings
from .evaluate import evaluate, evaluation_loader
from .executor import Executor
from .optimizer import SGD
from .paths import check_inputs, check_outputs, data_to_make, prepare_outputs
from .metrics import STRAGGLER, Interval, open_metrics, stragglers, training_progress
from .resume import check_resumable, state_for
from .schedule import learning_rate
from .shards import gather_global, restore, share_checkpoint
from .signals import Interrupted, Signals


def make_data(job, graph, scan_masks=True):
    """The training data; ``scan_masks``: whether to read every mask to check its values (one rank does)."""
    spec = job["data"]
    if spec["kind"] == "hdf5":
        return open_checked(spec["path"], graph, spec["seed"], spec["shuffle"], Augment.from_spec(spec["augment"]),
                            scan_masks=scan_masks)
    return SyntheticData.for_model(graph, spec["num_samples"] or SYNTHETIC_SAMPLES, seed=spec["seed"],
                                   signal=spec["signal"], shuffle=spec["shuffle"])


def make_val(job, graph, scan_masks=True):
    """The held-out dataset ``data.val`` (read in order), or None; ``scan_masks``: as :func:`make_data`'s."""
    if not job["data"]["val"]:
        return None
    crop = job["data"]["augment"]["crop"]     # the center crop of the training crops' size, never flipped
    data = open_checked(job["data"]["val"], graph, 0, False, Augment(tuple(crop) if crop else None),
                        scan_masks=scan_masks)
    if not data.num_samples:
        data.close()
        raise DataError(f"data.val {job['data']['val']}: the held-out dataset has no samples")
    return data


def make_optimizer(job, executor):
    spec = job["optimizer"]
    return SGD(executor.params.shapes, executor.param_dtype, executor.xp, lr=spec["lr"], momentum=spec["momentum"],
               weight_decay=spec["weight_decay"], nesterov=spec["nesterov"])


def write_checkpoint(path, executor, optimizer, state, plan_text, keep=1):
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
                            state=state, keep=keep)
        except (OSError, TypeError, ValueError) as error:
            raise CheckpointError(f"checkpoint.path {path}: cannot write the checkpoint: {error}") from None
    executor.world.agree(write)


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
        self.node_ranks = self.world.node_ranks()           # collective: before anything may fail on one rank
        say = log or (lambda line: print(line, flush=True))
        self.log = say if self.rank == 0 else (lambda line: None)
        self.data = self.val = self.loader = self.val_loader = None
        self.progress, self.read_s = None, 0.0
        self.reported = False       # whether a log line has measured the steps
        self.bar = self.rank == 0 and log is None         # a progress bar while training (log.progress)
        board = self.world.board                    # where this rank is, for the watchdog (comm/watchdog.py)
        board.stage("setup", slow=True)
        board.typical = board.saved = None
        try:
            self.world.agree(self._check)             # the whole job, before anything is written
            self.world.watch(WatchdogSettings.of(job["watchdog"]))     # a stalled rank named, the job ended
            self.world.agree(lambda: prepare_outputs(job, self.log, self.graph) if self.rank == 0 else None)
            ckpt = self.world.agree(self._open)
            self.complete = self.world.bcast(self._complete(ckpt))
            self.world.use(choose_transport(self.world, self.xp, job["transport"], self.log))
            if self.plan is None and self.complete:     # nothing to train: no need to profile and search
                self.plan = named("data", self.graph, self.batch, self.world.size)
                self.plan.source = "plan data (to evaluate a complete run)"
            elif self.plan is None:
                self.plan = auto_plan(self.graph, self.batch, self.world, job.get("machine"), self.xp, self.dtype,
                                      self.log, self.sync, job["batchnorm"], job["memory"],
                                      TrialSettings.of(job["trials"]), self.data, self.total_steps, job["seed"],
                                      self.read_dtype, JobReads(self.data, self.read_dtype,
                                                                job["data"]["workers"], job["data"]["prefetch"],
                                                                self.total_steps, self.node_ranks[1]))
            self.world.check_same({"model": self.graph.text, "plan": self.plan.text,
                                   "job": json.dumps(job, sort_keys=True, default=str),
                                   "data (sample count, shape, labels)": json.dumps(
                                       {**self.data.identity(), "steps": self.total_steps,
                                        "val": None if self.val is None else self.val.identity()},
                                       sort_keys=True)})
            self.executor = Executor(self.graph, self.xp, self.dtype, seed=job["seed"], plan=self.plan,
                                     world=self.world, sync=self.sync, batchnorm=job["batchnorm"])
            self.optimizer = make_optimizer(job, self.executor)
            self.start_step = self._restore(share_checkpoint(self.world, ckpt))
        except BaseException:
            self._close()
            raise

    def _complete(self, ckpt):
        """On rank 0: whether the checkpoint it resumes from ends the run already (said, with what to do)."""
        if ckpt is None or ckpt[0] != "resume" or ckpt[1].step < self.total_steps:
            return False
        job, step = self.job, ckpt[1].step
        path = job["checkpoint"]["path"]
        length = "steps" if job["steps"] is not None else "epochs"
        self.log(f"{path}: this run is already complete (step {step} of {self.total_steps}): nothing to train; "
                 f"it is evaluated and the job ends. To train again, start over with --set resume=false (which "
                 f"overwrites {path}), or start another run with --set checkpoint.path=OTHER.h5 (and log.metrics), "
                 f"or continue this one for longer with a larger --set {length}=N")
        return True

    def _check(self):
        """Phase one, without communication and without writing anything: the model, backend, plan, machine,
        the files the job reads and (rank 0) the paths it writes."""
        job = self.job
        check_inputs(job)
        self.graph = load_model(job["model"])
        self.xp = backend.rank_module(job["backend"], self.node_ranks, job["share_gpus"], job["tf32"])
        self.dtype = backend.resolve_dtype(job["dtype"], self.xp)
        check_transport(job["transport"], self.xp)
        # images are scaled and normalised in float32 under bfloat16, and rounded when they reach the device
        self.read_dtype = backend.master_dtype(self.dtype)
        self.batch = job["batch_size"]
        self.plan = None if job["plan"] in (None, "auto") else load_plan(job["plan"], self.graph, self.batch,
                                                                           self.world.size)
        machine = load_machine(job["machine"]) if job.get("machine") else None
        if machine is not None and job["plan"] in (None, "auto"):
            machine.check_devices(self.world.size)
        # the machine says how replica groups sum gradients (sync: allreduce or parameter-server)
        self.sync = SyncOptions.of(job["sync"], machine.sync if machine is not None else None)
        if self.rank == 0:
            check_outputs(job)
        if not data_to_make(job):
            self._open_data()

    def _open_data(self):
        if self.data is None:
            # rank 0 alone reads every mask to check it (inside world.agree: its finding stops every rank)
            self.data = make_data(self.job, self.graph, scan_masks=self.rank == 0)
            self.val = make_val(self.job, self.graph, scan_masks=self.rank == 0)
            if self.val is not None:
                error, warning = held_out_problems(self.data, self.val)
                if error:
                    raise DataError(error)
                if warning:
                    self.log(f"warning: {warning}")
        job = self.job
        self.steps_per_epoch = self.data.batches_per_epoch(self.batch)
        self.total_steps = job["steps"] if job["steps"] is not None else job["epochs"] * self.steps_per_epoch

    def _open(self):
        """Phase two, once the data exists: returns ``(kind, checkpoint)`` read on rank 0 (None elsewhere)."""
        self._open_data()
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
        self.world.board.saved = f"{path} (step {step})"
        return step

    def run(self):
        """Train from ``start_step`` to the end; returns ``{"steps", "losses", "val"}`` (losses of this run's
        steps; the last evaluation's ``(loss, accuracy)`` of ``data.val``, or ``(loss, mean absolute error)`` for a
        regression loss, or None)."""
        job = self.job
        metrics = None
        self._announce()
        history, evaluated, stopped, signalled, failed = [], None, None, None, True
        written = self.start_step or None       # a resumed run starts from a checkpoint of this step
        interval = Interval(self._waits())
        step = self.start_step
        ckpt_path, ckpt_every = job["checkpoint"]["path"], job["checkpoint"]["every"]
        every, eval_every = job["log"]["every"], job["eval"]["every"]

        signals = Signals(say=self.log if self.rank == 0 else None,
                          lost=lambda: self._lost(step, written, ckpt_path))
        plain_log = self.log
        if self.bar and step < self.total_steps:
            self.progress = training_progress(job["log"]["progress"], self.total_steps, step)
            if self.progress:
                self.log = self.progress.write
        try:
            if self.rank == 0:
                metrics = open_metrics(job["log"]["metrics"], self.start_step)
            self.world.board.stage("data", step, slow=True, name="starting its readers")
            self.loader = self._loader(step)
            while step < self.total_steps:
                self.optimizer.lr = learning_rate(job["optimizer"], step, self.total_steps)
                loss, correct, waited, flags = self._step(step, signals)
                step += 1
                history.append(loss)
                interval.add(loss, correct, waited, self.executor.tally.counted)
                if self.progress:
                    self.progress.update(step, note=f"loss {loss:.4f}")
                signalled = signals.received(flags)     # every rank the same: all stop after this step
                end = step == self.total_steps
                evaluate_now = (not signalled and self.val is not None
                                and (end or (eval_every and step % eval_every == 0)))
                if step % every == 0 or end or evaluate_now or signalled:
                    elapsed = time.perf_counter() - interval.start
                    work = elapsed - (self._waits() - interval.waits)      # the time it did not wait for others
                    evaluated = self._evaluate() if evaluate_now else None
                    self._report(step, loss, interval, elapsed, work, evaluated, metrics)
                    interval = Interval(self._waits())
                if signalled:
                    stopped = None if end else signalled
                    if end:
                        self.log(f"{signalled} during the last step: the run is complete, without its final "
                                 "evaluation")
                    break
                if ckpt_path and ckpt_every and step % ckpt_every == 0 and not end:
                    self._checkpoint(step)
                    written = step
            if self.val is not None and evaluated is None and step == self.total_steps and not signals.got:
                evaluated = self._evaluate()        # a run resumed at its end, or of no steps
                self.log(f"step {step:>6}/{self.total_steps}  {self._held_out(evaluated)}")
            self._finish(step, written, stopped)
            failed = False
        finally:
            signals.restore()
            if self.progress:
                self.progress.close()
                self.progress, self.log = None, plain_log
            if metrics:
                metrics.close()
            self._close(failed)
        result = {"steps": step, "losses": history, "val": evaluated, "stopped": stopped}
        if signalled == "SIGINT" or (self.world.size == 1 and signals.got == signal.SIGINT):
            # the ranks agreed on a Ctrl-C (or one process got it after its last step): Python code around the
            # run stops as at any Ctrl-C, once the checkpoint is written
            raise Interrupted(f"stopped after step {step} of {self.total_steps}", result)
        return result

    def _announce(self):
        """The run's first lines: the model, batch, steps, backend and plan; the BLAS each rank computes with."""
        graph = self.graph
        where = "one process" if self.world.size == 1 else f"{self.world.size} ranks"
        self.log(f"model {graph.name}: {len(graph.layers)} layers, {graph.num_params:,} parameters; "
                 f"batch {self.batch}, {self.total_steps} steps ({self.steps_per_epoch} per epoch); "
                 f"backend {self.xp.__name__}, {self.dtype.name}; {where}; {self.plan.source}")
        blas = blas_of_ranks(self.world, host=self.xp is np)     # collective
        if blas:
            self.log(f"BLAS: {blas}")
        self.world.board.typical = self.step_predicted_s       # until the first log line measures it

    def _finish(self, step, written, stopped):
        """The last checkpoint (unless ``written`` at ``step`` already) and what the run's end says."""
        ckpt_path = self.job["checkpoint"]["path"]
        final = ckpt_path and written != step
        if final:
            self._checkpoint(step)
        if stopped:
            self.log(f"{Signals.WORDS[stopped]}: stopped after step {step} of {self.total_steps}"
                     + (f"; checkpoint written to {ckpt_path}: the next run resumes from step {step}"
                        if ckpt_path else "; no checkpoint.path: the next run starts over"))
        elif final:
            self.log(f"checkpoint written to {ckpt_path} (step {step})")

    def _lost(self, step, written, ckpt_path):
        """What stopping at once at ``step`` loses (the last checkpoint of this run or the one it resumed from at
        step ``written``, or none), for the message of a second Ctrl-C."""
        kept = written or 0
        where = (f"the checkpoint of step {kept}" if written and ckpt_path else "step 0: no checkpoint yet"
                 if ckpt_path else "step 0 (no checkpoint.path)")
        return (f"at step {step} of {self.total_steps}: the {step - kept} steps since {where} are lost; the next "
                f"run resumes from step {kept}")

    def _loader(self, start):
        """The loader of this run's batches from ``start`` on, its workers started (said on rank 0)."""
        spec = self.job["data"]
        loader = Loader(self.data, self.executor.data_reads(), self.batch, self.read_dtype, self.steps_per_epoch,
                        start, self.total_steps, spec["workers"], spec["prefetch"], spec["timeout"],
                        local_ranks=self.node_ranks[1])
        augment = getattr(self.data, "augment", None)
        cores = cores_per_rank(self.node_ranks[1])
        crowded = f", more than the rank's {cores} core{'s' * (cores != 1)}" if len(loader.workers) > cores else ""
        how = (f"{len(loader.workers)} worker{'s' * (len(loader.workers) != 1)} per rank reading up to "
               f"{loader.prefetch} batches ahead ({format_bytes(loader.buffer.nbytes)} of shared memory on rank 0"
               f"{crowded})" if loader.workers else
               "no steps left to read" if loader.first >= loader.stop else "read in each step (" + (
                   f"data.workers auto: a batch read in {loader.probe_s * 1e3:.2f} ms, the run's would take "
                   f"under {AUTO_MIN_READ_S:g} s" if loader.probe_s is not None else "data.workers 0") + ")")
        read = loader.probe_s if loader.probe_s is not None and not loader.workers else 0.0
        self.read_s = max(self.world.allgather(read)) if self.world.size > 1 else read
        if getattr(self.plan, "reads_included", False):
            self.read_s = 0.0           # the profile's calibration read the job's batches as this run reads them
        elif self.plan.predicted_s and self.read_s:
            how += (f"; the slowest rank's read, {self.read_s * 1e3:.2f} ms, is part of each step's prediction: "
                    f"{self.plan.predicted_s * 1e3:.1f} ms the plan, {self.step_predicted_s * 1e3:.1f} ms in all")
        self.log(f"data: {self.data.path}, {self.data.num_samples:,} samples "
                 f"{'shuffled' if self.data.shuffle else 'in order'}"
                 + (f", {augment.describe()}" if augment else "") + f"; {how}")
        return loader

    @property
    def step_predicted_s(self):
        """The step the plan's prediction gives with reading its batch (where a step reads its own), or None."""
        return self.plan.predicted_s + self.read_s if self.plan.predicted_s else None

    def _waits(self):
        """Seconds this rank has spent waiting for the others so far: in exchanges and in sums."""
        counters = self.world.counters
        return counters.transfer_s + counters.sync_exposed_s

    def _close(self, failed=True):
        """Close the data (after an error, the workers are killed without finishing their reads) and stop the
        watchdog."""
        self.world.board.stage("done")
        self.world.unwatch()
        for loader in (self.loader, self.val_loader):
            if loader is not None:
                loader.close(grace=0 if failed else CLOSE_GRACE_S)
        self.loader = self.val_loader = None
        for source in (self.data, self.val):
            if source is not None:
                source.close()

    def _evaluate(self):
        """The evaluation of ``data.val``; its workers are started at the first and kept for the next ones."""
        self.world.board.stage("evaluation", slow=True)
        if self.val_loader is None:
            spec = self.job["data"]
            self.val_loader = evaluation_loader(self.executor, self.val, self.batch, self.read_dtype,
                                                spec["workers"], spec["prefetch"], spec["timeout"],
                                                self.node_ranks[1])
        return evaluate(self.executor, self.val, self.batch, self.read_dtype, loader=self.val_loader)

    def _step(self, step, signals=None):
        """``(loss, score, seconds waited for the batch, flags)`` of one training step; the ``signals``' flags
        (:meth:`_Signals.flags`, when given) as they were before the loss was summed, summed over the ranks."""
        executor, board = self.executor, self.world.board
        board.stage("data", step, slow=step == self.start_step)     # a first step compiles, fills caches
        started = time.perf_counter()
        batch, waited = self.loader.next(step)
        flags = signals.flags() if signals is not None else None
        loss, correct, _ = executor.forward(batch, step=step, also=flags)
        if not np.isfinite(loss):       # before the update: the weights stay those of the last good step
            executor.program.finish_deferred()      # no collective left running when every rank stops
            raise NonFiniteLoss(f"step {step + 1}: the loss is {loss}; lower optimizer.lr?")
        executor.backward(update=self.optimizer.updater(executor.params.flat, executor.grads.flat))
        if not self.reported:           # the watchdog's step until a log line measures it: the longest so far
            board.typical = max(board.typical or 0.0, time.perf_counter() - started)
        return loss, correct, waited, flags

    def _report(self, step, loss, interval, elapsed, work, evaluated, metrics):
        count = len(interval.losses)
        # each rank's wait for its batches and its work (the time it did not wait for the others)
        ranks = self.world.allgather((interval.waited, work)) if self.world.size > 1 else [(interval.waited, work)]
        waited = max(w for w, _ in ranks)       # the slowest rank's (the others wait for it at the next exchange)
        metric, short = self._metric
        record = {"step": step, "epoch": (step - 1) // self.steps_per_epoch, "loss": loss,
                  "loss_avg": float(np.mean(interval.losses)) if count else loss,
                  metric: interval.correct / interval.counted if interval.counted else None,
                  "images_per_s": count * self.batch / elapsed if count else None, "lr": self.optimizer.lr,
                  "step_s": elapsed / count if count else None,
                  "data_wait_s": waited / count if count else None,
                  "predicted_step_s": self.step_predicted_s, "predicted_plan_s": self.plan.predicted_s,
                  **stragglers([w for _, w in ranks], count)}
        line = (f"step {step:>6}/{self.total_steps}  epoch {record['epoch']}  loss {loss:.4f}  "
                f"(avg {record['loss_avg']:.4f})  {short} {record[metric]:.3f}  "
                f"{record['images_per_s']:.1f} images/s  {record['step_s'] * 1e3:.1f} ms/step")
        if record["predicted_step_s"]:
            line += f" (predicted {record['predicted_step_s'] * 1e3:.1f})"
        if count:
            line += f"  data wait {record['data_wait_s'] * 1e3:.1f} ms/step"
        if record["slowest_rank"] is not None and record["work_slowest_s"] > (1 + STRAGGLER) * record["work_others_s"]:
            line += (f"  slowest rank {record['slowest_rank']}: {record['work_slowest_s'] * 1e3:.1f} ms of work/step, "
                     f"the others {record['work_others_s'] * 1e3:.1f}")
        if evaluated is not None:
            record["val_loss"], record[f"val_{metric}"] = evaluated[:2]
            if getattr(evaluated, "mean_iou", None) is not None:
                record["val_miou"], record["val_dice"] = evaluated.mean_iou, evaluated.mean_dice
            if self.constant_mae is not None:
                record["val_mae_constant"] = self.constant_mae
            line += f"  {self._held_out(evaluated)}"
        self.log(line)
        self.world.board.typical = record["step_s"] or self.world.board.typical
        self.reported = True
        if metrics:
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()

    @property
    def _metric(self):
        """``(metrics key, log word)`` of the score: accuracy (of labelled pixels or voxels for a segmentation),
        or the mean absolute error of a regression."""
        if self.graph.regression:
            return "mae", "mae"
        return ("accuracy", "pixel acc") if self.graph.dense_labels else ("accuracy", "acc")

    def _held_out(self, evaluated):
        """The log's words for an evaluation (:class:`~.evaluate.Evaluation`) of data.val: with a regression's mean
        absolute error, that of the constant guess (the training targets' mean) beside it; with a segmentation's
        pixel accuracy, the mean IoU and Dice."""
        text = f"val loss {evaluated[0]:.4f}  val {self._metric[1]} {evaluated[1]:.4f}"
        if getattr(evaluated, "mean_iou", None) is not None:
            text += f"  val mIoU {evaluated.mean_iou:.4f}  val Dice {evaluated.mean_dice:.4f}"
        if self.constant_mae is not None:
            text += f" (a constant guess, the training targets' mean: {self.constant_mae:.4f})"
        return text

    @cached_property
    def constant_mae(self):
        """The held-out mean absolute error of predicting the training targets' mean for every sample (None
        without targets or held-out data): what a network that learned nothing scores."""
        train, val = self.data, self.val
        if not self.graph.regression or val is None or getattr(train, "all_targets", None) is None:
            return None
        guess = train.all_targets.astype(np.float64).mean(axis=0)
        return float(np.abs(val.all_targets.astype(np.float64) - guess).mean())

    def _checkpoint(self, step):
        state = state_for(self.job, self.data, step, step // self.steps_per_epoch)
        path = self.job["checkpoint"]["path"]
        self.world.board.stage("checkpoint", slow=True, name=path)
        write_checkpoint(path, self.executor, self.optimizer, state, self.plan.text, self.job["checkpoint"]["keep"])
        self.world.board.saved = f"{path} (step {step})"


def train(job, log=None, world=None):
    return Trainer(job, log, world).run()
