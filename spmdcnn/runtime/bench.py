"""``spmdcnn bench``: time whole training iterations (forward, backward, SGD update) on synthetic data."""

import resource
import statistics
import time

import numpy as np

from .. import backend
from ..graph import load_model
from ..io.dataset import SyntheticData
from .executor import Executor
from .optimizer import SGD


def peak_rss_bytes():
    """The process's peak resident memory so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def blas_info():
    """Which BLAS library, kernel and thread count NumPy uses (threadpoolctl, when installed)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [{k: info.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
            for info in threadpool_info() if info.get("user_api") == "blas"]


def bench(model_path, batch, steps=10, warmup=2, dtype="float32", backend_name="auto", seed=0):
    graph = load_model(model_path)
    xp = backend.get_array_module(backend_name)
    dtype = backend.resolve_dtype(dtype)
    executor = Executor(graph, xp, dtype, seed=seed)
    optimizer = SGD(executor.params.shapes, dtype, xp, lr=1e-3, momentum=0.9, weight_decay=5e-4)
    images, labels = SyntheticData(graph.input_shape, graph.num_classes, batch, seed=seed).batch(0, 0, batch, dtype)
    images, labels = xp.asarray(images), xp.asarray(labels)
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        executor.forward(images, labels, step=step)
        executor.backward()
        optimizer.step(executor.params.flat, executor.grads.flat)
        if xp is not np:
            xp.cuda.get_current_stream().synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    total = sum(times)
    return {"model": graph.name, "batch": batch, "steps": steps, "warmup": warmup, "dtype": dtype.name,
            "backend": xp.__name__, "images_per_s": batch * steps / total if total else float("nan"),
            "step_s_mean": total / steps if steps else float("nan"),
            "step_s_median": statistics.median(times) if times else float("nan"),
            "peak_memory_bytes": peak_rss_bytes(), "params": graph.num_params,
            "forward_gflops_per_step": graph.flops(batch) / 1e9, "blas": blas_info()}
