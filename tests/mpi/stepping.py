"""Training steps shared by the multi-rank tests of gradient sync (test_buckets.py, test_parameter_server.py)."""

import numpy as np

from spmdcnn.runtime.executor import Executor
from spmdcnn.runtime.optimizer import SGD


def train(graph, plan, world, sync, batch=4, steps=3):
    """``steps`` SGD steps in float64, each slice of the flat gradient array updated as backward makes it final
    (the local slices, then each bucket as its sum completes); the executor and the slices updated in the last."""
    executor = Executor(graph, np, np.float64, seed=5, plan=plan, world=world, sync=sync)
    optimizer = SGD(executor.params.shapes, np.float64, np, lr=0.05, momentum=0.9, weight_decay=1e-3)
    rng = np.random.default_rng(3)
    calls = []

    def update(start, stop):
        calls.append((start, stop))
        optimizer.step(executor.params.flat, executor.grads.flat, None, start, stop)
    for step in range(steps):
        images = rng.standard_normal((batch,) + graph.input_shape)
        labels = rng.integers(0, graph.num_classes, batch)
        executor.forward(images, labels, step=step)
        calls.clear()
        executor.backward(update=update)
    return executor, calls
