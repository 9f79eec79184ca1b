"""Time PyTorch (CPU) training iterations of an spmdcnn model YAML, the same way ``spmdcnn bench`` does.

The network is the spmdcnn Graph executed with torch.nn.functional (tests/torch_reference.py): the same layers,
shapes and initial weights; forward, backward and torch.optim.SGD (momentum 0.9, weight decay 5e-4) per
iteration, on the same synthetic batch. Prints JSON like ``spmdcnn bench --json``.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from torch_reference import TorchNet  # noqa: E402

import spmdcnn  # noqa: E402
if os.environ.get("SPMDCNN_MALLOC") == "spmdcnn":
    spmdcnn.keep_freed_memory()     # vs_pytorch.py --torch-malloc spmdcnn: freed memory kept, as spmdcnn's command
from spmdcnn.graph import load_model  # noqa: E402
from spmdcnn.io.synthetic import SyntheticData  # noqa: E402
from spmdcnn.runtime.executor import Executor  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    graph = load_model(args.model)
    executor = Executor(graph, np, np.float32)
    net = TorchNet(graph, {k: v for k, v in executor.params.items()}, {k: v for k, v in executor.buffers.items()},
                   dtype=torch.float32)
    del executor
    net.train()
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)
    images, labels = SyntheticData.for_model(graph, args.batch).batch(0, 0, args.batch)
    images, labels = torch.from_numpy(images), torch.from_numpy(labels)
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss, _ = net(images, labels, step)
        loss.backward()
        optimizer.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    total = sum(times)
    print(json.dumps({"model": graph.name, "batch": args.batch, "steps": args.steps, "framework": "pytorch",
                      "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "images_per_s": args.batch * args.steps / total, "step_s_mean": total / args.steps,
                      "step_s_median": statistics.median(times),
                      "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


if __name__ == "__main__":
    main()
