"""The runtime's own time per training step, without the kernels: what a GPU step cannot hide behind its kernels.

    python benchmarks/runtime_overhead.py models/inception_v3.yaml [--batch 2] [--steps 20] [--rounds 9]

Every op is bound to stubs (``runtime/kernels.py``'s ``BIND``) whose forward and backward return a zero array of
the right shape at once, so
what is timed is the executor (the order of layers, the saved state, the gradients of tensors read twice), the
exchanges' bookkeeping, the parameter-gradient sums and their allreduce calls, on one process with NumPy. The
zero arrays are cached per shape; adding gradients at branches is real work and is included. The figure is the
median over ``rounds`` rounds of ``steps`` steps each (the machine's speed drifts from round to round).
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from spmdcnn.graph import load_model  # noqa: E402
from spmdcnn.runtime import kernels  # noqa: E402
from spmdcnn.runtime.executor import Executor  # noqa: E402
from spmdcnn.tiling.boxes import shape_of  # noqa: E402


def stub_kernels():
    """Bind every op to stubs (for this process; before the executor binds its kernels)."""
    zeros = {}

    def zero(shape):
        shape = tuple(shape)
        if shape not in zeros:
            zeros[shape] = np.zeros(shape, np.float32)
        return zeros[shape]

    def bind(kernel):
        loss = kernel.layer.spec.loss
        out = None if loss else zero(shape_of(kernel.tile.box))

        def forward(xs, run):
            if loss:        # its sum, the count it averages over (and no table)
                return kernels.LossShare(0.0, 1), [xs[0].shape]
            return out, [x.shape for x in xs]

        def backward(gy, saved):
            return [zero(shape) for shape in saved]
        return forward, backward
    for op in list(kernels.BIND):
        kernels.BIND[op] = bind


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    graph = load_model(args.model)
    stub_kernels()
    executor = Executor(graph, np, np.float32)
    images = np.zeros((args.batch,) + graph.input_shape, np.float32)
    labels = np.zeros(args.batch, np.int64)
    for step in range(3):
        executor.forward(images, labels, step=step)
        executor.backward()
    rounds = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for step in range(args.steps):
            executor.forward(images, labels, step=step)
            executor.backward()
        rounds.append((time.perf_counter() - start) / args.steps)
    seconds = statistics.median(rounds)
    layers = len(graph.layers)
    print(f"{graph.name}: {layers} layers, {seconds * 1e3:.2f} ms of runtime per training step "
          f"({seconds / (2 * layers) * 1e6:.1f} us per layer and direction), batch {args.batch}")


if __name__ == "__main__":
    main()
