"""Large samples at scale, predicted: the planner's plans against data parallelism and the spatial splits users of
LBANN/Distconv write, on 16 to 1,024 devices of a cluster machine (jobs/machines/cluster-4x256-fat-tree.yaml by
default): CosmoFlow, and the segmentation networks (U-Net 3D at 128^3, U-Net 2D at DeepCAM's input size).

Every number here is a **prediction** of spmdcnn's cost model (the machine file's analytic device model, its links
and switches, the memory model with the device's memory as the limit), not a measurement: no cluster was used.

For each model (models/cosmoflow.yaml at 128^3, models/cosmoflow_512.yaml at 512^3 by default; any of models/, at
another input with ``--input``) and device count:

- weak scaling: a fixed batch per device (``--weak``, default 4 at 128^3, and at 512^3 one sample per 4 devices, as
  LBANN split each sample over 4 GPUs: one sample needs 42.7 GiB, more than a 40 GB device holds);
- strong scaling: a fixed global batch (``--strong``, default 64), so that beyond 64 devices only splitting a
  sample can use more devices;

it prints the predicted images/s of data parallelism (where it fits the device's memory; on fewer devices than
samples when the batch is smaller), of the hand-chosen plans users of spatial-parallel tools write (every layer
with spatial axes split over the first, depth for volumes and height for images, 2, 4, ... devices per sample, the
dense layers data parallel, as LBANN/Distconv's CosmoFlow runs are configured), of the best of those, and of the
planner's plan, with each one's memory per device, and the planner's search time and peak memory.

    python benchmarks/volumes_scaling.py                    # both CosmoFlows, 16 to 1,024 devices
    python benchmarks/volumes_scaling.py --models cosmoflow --devices 16 64
    python benchmarks/volumes_scaling.py --models unet3d --devices 8 16 32 64 128 256 --strong 2 --weak 0.25
    python benchmarks/volumes_scaling.py --models unet2d --input 16 768 1152 --strong 2 --weak 0.25   # DeepCAM's
"""

import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from spmdcnn.cost.machine import load_machine  # noqa: E402
from spmdcnn.cost.memory import plan_memory  # noqa: E402
from spmdcnn.sizes import format_bytes, parse_size  # noqa: E402
from spmdcnn.graph import load_model  # noqa: E402
from spmdcnn.graph.graph import parse_model  # noqa: E402
from spmdcnn.io.yamlfile import read_yaml  # noqa: E402
from spmdcnn.planner import make_plan  # noqa: E402
from spmdcnn.planner.service import cost_model  # noqa: E402
from spmdcnn.tiling.config import dims_of, names_of, output_shape  # noqa: E402
from spmdcnn.tiling.plan import from_mapping, named  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODELS = {"cosmoflow": 4, "cosmoflow_512": 0.25}     # model: samples per device of weak scaling


def depth_split(graph, batch, devices, depth):
    """The plan LBANN/Distconv users write: every layer with spatial axes over ``n`` and the first of them (depth
    for volumes, height for images: ``depth`` devices per sample, capped by the layer's extent), the rest (flatten,
    dense layers, a loss per sample) data parallel; None where ``depth`` does not divide the devices."""
    if devices % depth:
        return None
    samples = min(batch, devices // depth)
    axis = names_of(len(graph.input_shape) + 1)[2]
    layers = {}
    for layer in graph.layers:
        shape = output_shape(layer, batch)
        if axis in dims_of(layer):
            d = min(depth, shape[names_of(len(shape)).index(axis)])
            layers[layer.name] = {"n": samples, axis: d, "devices": list(range(samples * d))}
        else:
            n = min(batch, devices)
            layers[layer.name] = {"n": n, "devices": list(range(n))}
    return from_mapping({"format": "spmdcnn-plan/1", "devices": devices, "layers": layers}, graph, batch, devices,
                        f"depth split {depth}")


def row(cost, graph, plan, limit):
    """``(images/s, memory, fits)`` of ``plan``."""
    used = plan_memory(graph, plan, cost.itemsize, cost.machine.device.im2col)
    return cost.batch / cost.simulate(plan).iteration_s, used, limit is None or used <= limit


def case(graph, machine, devices, batch, limit):
    nodes = max(1, -(-devices // machine.devices_per_node))
    cost = cost_model(graph, batch, devices, machine, None, 4, nodes=nodes)
    data = row(cost, graph, named("data", graph, batch, devices), limit)
    splits = {}
    depth = 2
    while depth <= devices and depth <= graph.input_shape[1]:       # the first spatial axis
        plan = depth_split(graph, batch, devices, depth)
        if plan is not None:
            splits[depth] = row(cost, graph, plan, limit)
        depth *= 2
    start = time.perf_counter()
    try:
        best = make_plan(graph, devices, cost, "optimal", memory=limit)
        planned = row(cost, graph, best.plan, limit)
        convs = [best.plan[layer.name].describe(short=True) for layer in graph.layers if layer.spec.family == "conv"]
    except ValueError as error:
        best, planned, convs = None, None, [str(error)]
    return data, splits, planned, convs, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--devices", nargs="*", type=int, default=[16, 64, 256, 1024])
    parser.add_argument("--machine", default=os.path.join(ROOT, "jobs", "machines", "cluster-4x256-fat-tree.yaml"))
    parser.add_argument("--memory", help="the device memory limit (default: the machine file's)")
    parser.add_argument("--strong", type=int, default=64, help="the global batch of strong scaling (default 64)")
    parser.add_argument("--weak", type=float, help="samples per device of weak scaling (default: 4 at 128^3, 0.25 at "
                        "512^3, else 1)")
    parser.add_argument("--input", type=int, nargs="+", metavar="E", help="the models' input (C, S...) instead of "
                        "their files' (a U-Net 2D at DeepCAM's 16 768 1152)")
    args = parser.parse_args()
    machine = load_machine(args.machine)
    limit = parse_size(args.memory) if args.memory else machine.device.memory
    print(f"PREDICTED by spmdcnn's cost model on machine {machine.name} (device {machine.device.name}, memory limit "
          f"{format_bytes(limit) if limit else 'none'}), float32; images/s, and memory per device")
    for name in args.models:
        path = os.path.join(ROOT, "models", f"{name}.yaml")
        if args.input:
            spec, _ = read_yaml(path)
            spec["input"] = list(args.input)
            graph = parse_model(spec, path)
        else:
            graph = load_model(path)
        for kind, per in (("weak", args.weak or MODELS.get(name, 1)), ("strong", None)):
            print(f"\n{name} ({'x'.join(map(str, graph.input_shape))}), {kind} scaling"
                  + (f", {per:g} sample{'s' * (per != 1)} per device" if per else f", global batch {args.strong}"))
            axis = names_of(len(graph.input_shape) + 1)[2]
            print(f"{'devices':>7} {'batch':>6}  {'data parallel':>22}  {f'best {axis} split':>26}  "
                  f"{'planner':>22} {'vs data':>8} {'vs depth':>8}  {'search s':>8}  planner's convolutions")
            for devices in args.devices:
                batch = max(1, int(per * devices)) if per else args.strong
                data, splits, planned, convs, seconds = case(graph, machine, devices, batch, limit)
                fitting = {d: r for d, r in splits.items() if r[2]}
                depth = max(fitting, key=lambda d: fitting[d][0]) if fitting else None

                def cell(r, label=""):
                    if r is None:
                        return "-"
                    text = f"{r[0]:,.1f} ({format_bytes(r[1], 0)})"
                    return f"{label}{text}" if r[2] else f"does not fit ({format_bytes(r[1], 0)})"
                best_split = cell(fitting[depth], f"{axis}={depth}: ") if depth else "none fits"
                ratio_data = f"{planned[0] / data[0]:.2f}x" if planned and data[2] else "-"
                ratio_split = f"{planned[0] / fitting[depth][0]:.2f}x" if planned and depth else "-"
                layout = "; ".join(sorted(set(convs), key=convs.index)) if convs else ""
                print(f"{devices:>7} {batch:>6}  {cell(data):>22}  {best_split:>26}  {cell(planned):>22} "
                      f"{ratio_data:>8} {ratio_split:>8}  {seconds:>8.2f}  {layout}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    print(f"\npeak memory of this process (the planner's largest search included): {format_bytes(peak)}")


if __name__ == "__main__":
    main()
