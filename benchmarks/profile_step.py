"""Where one training iteration's time goes, per layer and per op, with the GEMM floor for comparison.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/profile_step.py models/alexnet.yaml --batch 32

Times every layer's forward and backward and the SGD update over a few iterations (after one warm-up) and
prints the slowest layers, a per-op summary, and the time a GEMM at this machine's measured rate would need
for the network's matrix products (convolutions and linear layers, forward and backward): the part of the
step that no im2col-based runtime can go below on this BLAS.
"""

import argparse
import collections
import time

import spmdcnn  # (first: it tunes OpenBLAS before NumPy loads it)
spmdcnn.keep_freed_memory()     # as the spmdcnn command does (SPMDCNN_MALLOC=system: malloc as it is)
import numpy as np

from spmdcnn.graph import load_model
from spmdcnn.io.synthetic import SyntheticData
from spmdcnn.runtime import kernels
from spmdcnn.runtime.bench import blas_info
from spmdcnn.runtime.executor import Executor
from spmdcnn.runtime.optimizer import SGD


def gemm_rate(size=2048, reps=5):
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    a @ a
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best


def matmul_flops(graph, batch, executor):
    """FLOPs of the network's matrix products in one iteration (forward, input and weight gradients)."""
    total = 0
    for layer in graph.layers:
        if layer.op not in ("conv2d", "linear"):
            continue
        products = 2 if layer.input_grad else 1      # weight gradient, input gradient
        total += batch * layer.flops * (1 + products)
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    graph = load_model(args.model)
    spent = collections.Counter()
    def timed(layer, phase, function):
        def run(*args):
            start = time.perf_counter()
            result = function(*args)
            spent[(layer.name, layer.op, phase)] += time.perf_counter() - start
            return result
        return run

    for op, bind in list(kernels.BIND.items()):
        def bind_timed(kernel, _bind=bind):
            forward, backward = _bind(kernel)
            return timed(kernel.layer, "forward", forward), timed(kernel.layer, "backward", backward)
        kernels.BIND[op] = bind_timed
    executor = Executor(graph, np, np.float32)
    optimizer = SGD(executor.params.shapes, np.float32, np, lr=1e-3, momentum=0.9, weight_decay=5e-4)
    images, labels = SyntheticData.for_model(graph, args.batch).batch(0, 0, args.batch)
    for step in range(args.steps + 1):
        if step == 1:
            spent.clear()
            begin = time.perf_counter()
        executor.forward(images, labels, step=step)
        executor.backward()
        start = time.perf_counter()
        optimizer.step(executor.params.flat, executor.grads.flat)
        spent[("(all)", "sgd update", "update")] += time.perf_counter() - start
    per_step = (time.perf_counter() - begin) / args.steps
    scale = 1e3 / args.steps
    print(f"{graph.name}, batch {args.batch}: {per_step * 1e3:.0f} ms per iteration "
          f"({args.batch / per_step:.1f} images/s); BLAS {blas_info()}")
    print("\nslowest layers (ms per iteration):")
    for (name, op, phase), seconds in spent.most_common(args.top):
        print(f"  {name:<28} {op:<22} {phase:<9} {seconds * scale:8.1f}")
    by_op = collections.Counter()
    for (name, op, phase), seconds in spent.items():
        by_op[(op, phase)] += seconds
    print("\nper op (ms per iteration):")
    for (op, phase), seconds in by_op.most_common():
        print(f"  {op:<22} {phase:<9} {seconds * scale:8.1f}")
    rate = gemm_rate()
    flops = matmul_flops(graph, args.batch, executor)
    print(f"\nmatrix products: {flops / 1e9:.1f} GFLOP per iteration; at this machine's SGEMM rate "
          f"({rate / 1e9:.0f} GFLOP/s, 2048^2) they need at least {flops / rate * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
