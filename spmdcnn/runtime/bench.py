"""``spmdcnn bench``: time whole training iterations (forward, backward, SGD update) on synthetic data, on one
process or on MPI ranks under a plan, with the time split into compute, transfer and sync."""

import resource
import statistics

import numpy as np

from .. import backend
from ..comm import World, choose_transport
from ..cost.buckets import SyncOptions
from ..cost.machine import load_machine
from ..graph import load_model
from ..io.augment import Augment
from ..io.dataset import open_checked
from ..io.prefetch import Loader
from ..io.workers import CLOSE_GRACE_S
from ..tiling.plan import load_plan
from .autoplan import auto_plan
from ..io.trace import write_trace
from ..ops import blas, compiled, onednn
from .insitu import training_step
from .trials import timed_steps


def peak_rss_bytes():
    """The process's peak resident memory so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def blas_info():
    """Which BLAS library, kernel and thread count NumPy uses: threadpoolctl's view of the loaded library when it
    is installed, else the library NumPy was built against (its build information: no kernel, no threads)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return _built_blas()
    return [{k: info.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
            for info in threadpool_info() if info.get("user_api") == "blas"]


def _built_blas():
    """The BLAS in NumPy's build information, marked as such (an empty list where NumPy does not say)."""
    try:
        built = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except (TypeError, KeyError, AttributeError):       # a NumPy older than 1.26 prints, and returns nothing
        return []
    return [{"internal_api": built.get("name"), "version": built.get("version"), "architecture": None,
             "num_threads": None, "source": "NumPy's build; pip install threadpoolctl for the kernel and threads"}]


def describe_blas(found):
    """``found`` (:func:`blas_info`) as the words ``bench`` prints."""
    if not found:
        return "unknown: install threadpoolctl to see it"
    words = []
    for info in found:
        text = " ".join(str(info[k]) for k in ("internal_api", "version", "architecture") if info.get(k))
        text += f" x{info['num_threads']}" if info.get("num_threads") else ""
        words.append(text + (f" ({info['source']})" if info.get("source") else ""))
    return ", ".join(words)


def describe_host():
    """This process's host kernels in words: its BLAS (:func:`describe_blas`), the compiled kernels
    (``ops/compiled.py``: numba's version, or off), what runs the float32 convolutions (``ops/onednn.py``: oneDNN's
    version, threading and instructions, or NumPy's paths and why) and the implicit-GEMM convolutions
    (``ops/implicit.py``: the library whose GEMM they call, or off)."""
    return (f"{describe_blas(blas_info())}; compiled kernels {compiled.describe()}; float32 convolutions "
            f"{onednn.describe()}; implicit-GEMM convolutions {blas.describe()}")


def blas_of_ranks(world, host=True):
    """What BLAS (library, version, kernel, threads) and compiled kernels each rank of ``world`` runs, in words, each
    once with its ranks; ``host``: whether this rank computes on the host (a GPU rank's host kernels are not said).
    Collective."""
    everyone = world.allgather(describe_host() if host else None)
    ranks = {}
    for rank, text in enumerate(everyone):
        if text is not None:
            ranks.setdefault(text, []).append(rank)
    if len(ranks) == 1 and len(everyone) > 1 and None not in everyone:
        return f"{next(iter(ranks))} on every rank"
    return "; ".join(text + (f" on rank{'s' * (len(where) > 1)} {', '.join(map(str, where))}"
                             if len(everyone) > 1 else "") for text, where in ranks.items())


class _Fed:
    """``bench --data``'s batches: called with the executor (:func:`~spmdcnn.runtime.insitu.training_step`'s
    ``feed``), it starts a loader of this rank's reads and gives the function of the step index that takes them,
    noting the time each timed step waited."""

    def __init__(self, source, batch, dtype, warmup, steps, workers, prefetch, local_ranks):
        self.source, self.batch, self.dtype, self.warmup, self.steps = source, batch, dtype, warmup, steps
        self.workers, self.prefetch, self.local_ranks = workers, prefetch, local_ranks
        self.loader, self.waits = None, []

    def __call__(self, executor):
        self.loader = Loader(self.source, executor.data_reads(), self.batch, self.dtype,
                             self.source.batches_per_epoch(self.batch), 0, self.warmup + self.steps, self.workers,
                             self.prefetch, local_ranks=self.local_ranks)

        def batch_of(index):
            got, waited = self.loader.next(index)
            if index >= self.warmup:
                self.waits.append(waited)
            return got
        return batch_of

    def close(self, failed=False):
        if self.loader is not None:
            self.loader.close(grace=0 if failed else CLOSE_GRACE_S)
        if self.source is not None:
            self.source.close()

    def summary(self, steps):
        """This rank's ``data_wait_s`` (mean per timed step), ``workers`` and ``worker_peak_bytes``."""
        loader = self.loader
        return {"data_wait_s": sum(self.waits) / steps if steps else 0.0,
                "workers": loader.started if loader else 0,
                "worker_peak_bytes": max(loader.peaks) if loader and loader.peaks else None}


def bench(model_path, batch, steps=10, warmup=2, dtype="float32", backend_name="auto", seed=0, plan="data",
          world=None, machine=None, verbose=False, tf32=False, transport="auto", share_gpus=False, data=None,
          augment=None, workers="auto", prefetch="auto", sync=None, batchnorm=None, trace=None, memory=None):
    """Time ``steps`` training iterations after ``warmup`` on the ranks of ``world`` under ``plan``.

    Every iteration starts after a barrier and lasts until the slowest rank is done. The breakdown per rank:
    ``transfer_s`` (redistribution between layers, including waiting for the peer), ``sync_s`` (gradient
    allreduces from start to completion, batchnorm statistics, loss), ``sync_exposed_s`` (the part of it the rank
    waited for: not hidden behind backward), ``compute_s`` (the rest); bytes are totals over all ranks per
    iteration. ``sync``: the job's ``sync`` mapping (bucket size, overlap), the ``machine`` file's ``sync`` its
    mode; ``batchnorm`` and ``memory`` (for ``plan`` auto): the job's keys.
    ``trace``: a path to write the last timed iteration to, every rank's, as Chrome trace-event JSON.
    The iterations train on one fixed synthetic batch, or with ``data`` (an HDF5 dataset path) on its shuffled
    batches as training reads them (``augment``: a ``data.augment`` mapping; ``workers``, ``prefetch``: as the job
    keys), and ``data_wait_s`` is the time a step waited for its batch (the slowest rank's, mean per step).
    """
    world = world or World.create()
    node_ranks = world.node_ranks()

    def load():
        graph = load_model(model_path)
        chosen = None if plan in (None, "auto") else load_plan(plan, graph, batch, world.size)
        xp = backend.rank_module(backend_name, node_ranks, share_gpus, tf32)
        source = None if data is None else open_checked(data, graph, seed, augment=Augment.from_spec(
            augment, "--augment"), batch=batch, crop_key="--augment '{{crop: {crop}}}'", scan_masks=world.rank == 0)
        options = SyncOptions.of(sync, load_machine(machine).sync if machine else None)
        return graph, chosen, xp, backend.resolve_dtype(dtype, xp), source, options
    graph, plan_spec, xp, dtype, source, sync = world.agree(load)
    world.use(choose_transport(world, xp, transport, print if world.rank == 0 and verbose else None))
    plan = plan_spec or auto_plan(graph, batch, world, machine, xp, dtype,
                                  print if world.rank == 0 and verbose else (lambda line: None), sync, batchnorm,
                                  memory)
    fed = _Fed(source, batch, backend.master_dtype(dtype), warmup, steps, workers, prefetch, node_ranks[1])
    failed = True
    try:
        run = training_step(graph, batch, xp, dtype, world, plan, seed, fed if source is not None else None, sync,
                            batchnorm)
        times, events = timed_steps(run, world, backend.synchronizer(xp), warmup, steps, trace)
        failed = False
    finally:
        fed.close(failed)
    if trace:
        everyone = world.gather(events)
        if world.rank == 0:
            write_trace(trace, [e for mine in everyone for e in mine],
                        f"measured: {graph.name}, batch {batch}, {world.size} ranks, {plan.source}")
    counters = world.counters
    total = sum(times)
    own = [counters.transfer_s / steps, counters.sync_exposed_s / steps]
    per_rank = world.allgather({"rank": world.rank, "compute_s": total / steps - sum(own), "transfer_s": own[0],
                                "sync_s": counters.sync_s / steps, "sync_exposed_s": own[1],
                                "bytes_transferred": counters.bytes_transferred // steps,
                                "bytes_synced": counters.bytes_synced // steps, "peak_memory_bytes": peak_rss_bytes(),
                                **fed.summary(steps)})
    return {"model": graph.name, "batch": batch, "steps": steps, "warmup": warmup, "dtype": dtype.name,
            "backend": xp.__name__, "ranks": world.size, "plan": plan.source,
            "images_per_s": batch * steps / total if total else float("nan"),
            "step_s_mean": total / steps if steps else float("nan"),
            "step_s_median": statistics.median(times) if times else float("nan"),
            "compute_s": statistics.mean(r["compute_s"] for r in per_rank),
            "transfer_s": statistics.mean(r["transfer_s"] for r in per_rank),
            "sync_s": statistics.mean(r["sync_s"] for r in per_rank),
            "sync_exposed_s": statistics.mean(r["sync_exposed_s"] for r in per_rank),
            "bytes_transferred": sum(r["bytes_transferred"] for r in per_rank),
            "bytes_synced": sum(r["bytes_synced"] for r in per_rank),
            "peak_memory_bytes": max(r["peak_memory_bytes"] for r in per_rank), "per_rank": per_rank,
            "predicted_s": plan.predicted_s, "params": graph.num_params, "batchnorm": batchnorm or "global",
            "sync": vars(sync), "trace": trace,
            "data": data, "augment": augment,
            "data_wait_s": max(r["data_wait_s"] for r in per_rank) if data else None,
            "workers": per_rank[0]["workers"] if data else None,
            "worker_peak_bytes": max((r["worker_peak_bytes"] or 0 for r in per_rank), default=0) or None,
            "forward_gflops_per_step": graph.flops(batch) / 1e9, "blas": blas_info(),
            "compiled": compiled.describe(), "convolutions": onednn.describe()}
