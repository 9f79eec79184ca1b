"""The memory model (spmdcnn/cost/memory.py) against the peak memory of the ranks, on volumes and images.

For each plan, every rank builds its executor and SGD optimizer, runs two training iterations (the first
allocates the kernels' scratch buffers, which then stay) and then a third, and the peak of the arrays it holds
during that third iteration is taken from Python's allocation tracer (tracemalloc, which sees every NumPy array;
started before the executor is made, so that parameters, gradients, momentum and buffers count). Each tile reads
only its box of a synthetic batch, as training reads a dataset. The model's number is ``plan_memory``'s: the
bytes kept from forward to backward summed over the layers plus the largest transient, for the busiest device;
the measured one is the largest rank's peak. Run on 1 or 2 ranks:

    python benchmarks/memory_model.py
    mpiexec -n 2 python benchmarks/memory_model.py
"""

import argparse
import os
import sys
import tracemalloc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import spmdcnn  # noqa: E402,F401  (first: it tunes OpenBLAS before NumPy loads it)
import numpy as np  # noqa: E402

from spmdcnn.comm import World  # noqa: E402
from spmdcnn.cost.memory import kept_memory, peak_transient  # noqa: E402
from spmdcnn.sizes import format_bytes  # noqa: E402
from spmdcnn.graph import load_model  # noqa: E402
from spmdcnn.io.dataset import reading_batch  # noqa: E402
from spmdcnn.io.synthetic import SyntheticData  # noqa: E402
from spmdcnn.ops.scratch import release  # noqa: E402
from spmdcnn.runtime.executor import Executor  # noqa: E402
from spmdcnn.runtime.optimizer import SGD  # noqa: E402
from spmdcnn.tiling.plan import from_mapping, named  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# model, batch, plans: each a named strategy or {dimension: degree} for every layer that can take it
CASES = [
    ("cosmo_small", 8, ["data", {"d": 2}, {"h": 2}, {"c": 2}, "owt", {"d": 2, "h": 2}]),
    ("tiny_volume", 6, ["data", {"d": 2}, {"w": 2}, {"n": 2, "h": 2}]),
    ("cosmoflow", 2, ["data", {"d": 2}, {"h": 2}, {"d": 2, "h": 2}]),
    ("small_resnet", 16, ["data", {"h": 2}, "owt"]),
]


def uniform(graph, batch, devices, spec):
    """``spec`` for every layer that can take it (capped at its extents), the others over n; None when ``spec``
    does not make as many tiles as there are devices."""
    if int(np.prod(list(spec.values()))) != devices:
        return None
    from spmdcnn.tiling.config import dims_of, names_of, output_shape
    layers = {}
    for layer in graph.layers:
        shape = output_shape(layer, batch)
        names = names_of(len(shape))
        degrees = {d: min(k, shape[names.index(d)]) for d, k in spec.items() if d in dims_of(layer)}
        count = int(np.prod(list(degrees.values()), dtype=np.int64)) if degrees else 1
        if count != devices:
            degrees, count = {"n": min(devices, batch)}, min(devices, batch)
        layers[layer.name] = {**degrees, "devices": list(range(count))}
    return from_mapping({"format": "spmdcnn-plan/1", "devices": devices, "layers": layers}, graph, batch, devices,
                        f"plan {spec}")


def measure(graph, plan, world, dtype=np.float32):
    """This rank's peak of traced bytes during the third of three training iterations under ``plan`` (the kernels'
    scratch buffers of earlier plans released first, so that this plan's are made, and traced, anew)."""
    release()
    tracemalloc.start()
    try:
        executor = Executor(graph, np, dtype, seed=0, plan=plan, world=world)
        optimizer = SGD(executor.params.shapes, executor.param_dtype, np, lr=1e-3, momentum=0.9, weight_decay=1e-4)
        source = SyntheticData.for_model(graph, plan.batch, seed=1)
        update = optimizer.updater(executor.params.flat, executor.grads.flat)
        for step in range(3):
            if step == 2:
                tracemalloc.reset_peak()
            batch = reading_batch(source, np.arange(plan.batch), dtype)
            executor.forward(batch, step=step)
            executor.backward(update=update)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", help="run only these models of the built-in cases")
    args = parser.parse_args()
    world = World.create()
    rows = []
    for name, batch, specs in CASES:
        if args.models and name not in args.models:
            continue
        graph = load_model(os.path.join(ROOT, "models", f"{name}.yaml"))
        for spec in specs:
            plan = named(spec, graph, batch, world.size) if isinstance(spec, str) else \
                uniform(graph, batch, world.size, spec)
            if plan is None:
                continue            # a split of another number of devices (one rank: only the named strategies)
            peak = max(world.allgather(measure(graph, plan, world)))
            kept = kept_memory(graph, plan, 4)
            transient, layer = peak_transient(graph, plan, 4)
            predicted = kept + transient            # plan_memory's sum
            rows.append((name, batch, plan.source, predicted, peak, kept, transient, layer))
    if world.rank == 0:
        print(f"memory model against the largest rank's traced peak, {world.size} rank{'s' * (world.size != 1)}, "
              "float32")
        print(f"{'model':<13} {'batch':>5}  {'plan':<24} {'predicted':>10} {'measured':>10} {'error':>7}   "
              "(kept + largest transient)")
        errors = []
        for name, batch, source, predicted, peak, kept, transient, layer in rows:
            error = (predicted - peak) / peak
            errors.append(abs(error))
            print(f"{name:<13} {batch:>5}  {source.replace('plan ', ''):<24} {format_bytes(predicted):>10} "
                  f"{format_bytes(peak):>10} {100 * error:>+6.1f}%   ({format_bytes(kept)} + "
                  f"{format_bytes(transient)} in {layer})")
        print(f"|error|: median {100 * np.median(errors):.1f} %, largest {100 * max(errors):.1f} % over {len(errors)} "
              "plans (positive: the model holds more than measured)")


if __name__ == "__main__":
    main()
