"""The paper's evaluation (Jia et al., ICML 2018, section 6) under spmdcnn's cost model.

The machine is the paper's (``jobs/machines/paper-p100-4x4.yaml``: nodes of 4 P100 on NVLink, 100 Gb/s EDR
InfiniBand between nodes; more nodes of the same kind beyond 16 devices). Compute times come from the analytic
model, scaled per network by one factor so that one device at batch 32 runs at the paper's single-GPU throughput
(AlexNet 745, VGG-16 184, Inception-v3 157 images/s; ResNet-50, which the paper does not run, takes the median of
the three factors, which is Inception-v3's: the closest kind of network, batch norm and 1x1 convolutions). Every
device holds a batch of 32. For each network and device count the data, model and owt
plans are simulated and the layer-wise optimum is searched; the predicted throughput and the bytes moved per step
(between layers, and allreduced) are written as a table (Markdown), JSON and two plots (PNG, with matplotlib), next
to the paper's results.

    python benchmarks/paper/reproduce.py [--models alexnet vgg16 inception_v3 resnet50] [--devices 1 2 4 8 16 64]
        [--out DIR]

The results go to ``paper-results/`` in the current folder, so that a run never overwrites the committed ones in
``benchmarks/paper/results/`` unless asked (``--out benchmarks/paper/results``).
"""

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from spmdcnn.graph import load_model  # noqa: E402
from spmdcnn.planner import make_plan  # noqa: E402
from spmdcnn.planner.service import cost_model  # noqa: E402
from spmdcnn.tiling.plan import named  # noqa: E402

MACHINE = os.path.join(ROOT, "jobs", "machines", "paper-p100-4x4.yaml")
PER_DEVICE = 32
STRATEGIES = ("data", "model", "owt", "optimal")
# the paper's measurements (Figures 7 and 8, section 6.2): one GPU at batch 32, images/s; layer-wise over the best
# other strategy on 16 GPUs; layer-wise on 16 GPUs over one GPU
PAPER_SINGLE = {"alexnet": 745.0, "vgg16": 184.0, "inception_v3": 157.0}
PAPER_OVER_BEST = {"alexnet": 2.12, "vgg16": 1.36, "inception_v3": 1.39}
PAPER_SCALING = {"alexnet": 12.1, "vgg16": 14.8, "inception_v3": 15.5}
# the paper's VGG-16 plan on 4 GPUs of one node (Figure 6)
PAPER_VGG16_4 = [("conv blocks 1-4", "{n: 4}"), ("conv block 5", "{h: 2, w: 2}"), ("fc6, fc7", "{c: 4}"),
                 ("fc8", "{c: 2}"), ("softmax", "unsplit")]


def calibrated_cost(graph, devices, factor, sync=None):
    """The cost model of ``graph`` on ``devices`` devices of the paper's machine, compute scaled by ``factor``;
    ``sync``: the job's ``sync`` keys (default: buckets overlapped with backward, as spmdcnn runs them)."""
    from spmdcnn.cost.machine import load_machine
    machine = load_machine(MACHINE)
    nodes = max(machine.nodes, -(-devices // machine.devices_per_node))
    cost = cost_model(graph, PER_DEVICE * devices, devices, machine, None, 4, nodes, sync)
    cost.compute.scale = {None: factor, "sgd": factor}
    return cost


def calibration(graph, name):
    """The factor that makes one device run at the paper's throughput (None for a network the paper lacks)."""
    if name not in PAPER_SINGLE:
        return None
    modelled = calibrated_cost(graph, 1, 1.0).simulate(named("data", graph, PER_DEVICE, 1)).iteration_s
    return (PER_DEVICE / PAPER_SINGLE[name]) / modelled


def paper_factors():
    """The calibration factor of each network the paper runs, whichever networks this run covers."""
    return {name: calibration(load_model(os.path.join(ROOT, "models", f"{name}.yaml")), name)
            for name in PAPER_SINGLE}


def run(models, device_counts):
    graphs = {name: load_model(os.path.join(ROOT, "models", f"{name}.yaml")) for name in models}
    factors = paper_factors()
    default = statistics.median(factors.values())       # a network the paper does not run (Inception-v3's)
    rows = []
    for name, graph in graphs.items():
        factor = factors.get(name, default)
        for devices in device_counts:
            cost = calibrated_cost(graph, devices, factor)
            for strategy in STRATEGIES:
                start = time.perf_counter()
                result = make_plan(graph, devices, cost, strategy)
                summary = result.prediction.summary()
                rows.append({"model": name, "devices": devices, "strategy": strategy, "factor": factor,
                             "iteration_s": summary["iteration_s"],
                             "images_per_s": PER_DEVICE * devices / summary["iteration_s"],
                             "bytes_transferred": summary["bytes_transferred"],
                             "bytes_synced": summary["bytes_synced"], "compute_s": summary["compute_s"],
                             "transfer_s": summary["transfer_s"], "sync_s": summary["sync_s"],
                             "seconds": time.perf_counter() - start,
                             "plan": result.plan.text if strategy == "optimal" else None})
                print(f"{name:<13} {devices:>3} {strategy:<8} {rows[-1]['images_per_s']:>9.1f} images/s "
                      f"{(summary['bytes_transferred'] + summary['bytes_synced']) / 2 ** 20:>10.1f} MiB/step",
                      flush=True)
    return rows


def summarize(rows):
    """Per network: throughput of each strategy per device count, layer-wise over the best other, scaling."""
    table = {}
    for row in rows:
        table.setdefault(row["model"], {}).setdefault(row["devices"], {})[row["strategy"]] = row
    out = {}
    for name, by_devices in table.items():
        first = min(by_devices)
        one = by_devices[first]["optimal"]["images_per_s"]
        out[name] = {devices: {"over_best": s["optimal"]["images_per_s"] / max(s[k]["images_per_s"]
                                                                             for k in ("data", "model", "owt")),
                               "scaling": s["optimal"]["images_per_s"] / one if first == 1 else None}
                     for devices, s in by_devices.items()}
    return table, out


def markdown(rows):
    table, derived = summarize(rows)
    lines = ["| model | devices | data | model | owt | layer-wise | layer-wise / best other | scaling from 1 | "
             "moved per step: data / owt / layer-wise (MiB) |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, by_devices in table.items():
        for devices, s in sorted(by_devices.items()):
            d = derived[name][devices]
            moved = " / ".join(f"{(s[k]['bytes_transferred'] + s[k]['bytes_synced']) / 2 ** 20:.0f}"
                               for k in ("data", "owt", "optimal"))
            scaling = "" if d["scaling"] is None else f"{d['scaling']:.1f}x"
            lines.append(f"| {name} | {devices} | " + " | ".join(f"{s[k]['images_per_s']:.0f}" for k in STRATEGIES)
                         + f" | {d['over_best']:.2f}x | {scaling} | {moved} |")
    lines += ["", "The paper at 16 GPUs (layer-wise over the best other strategy; layer-wise scaling from 1 GPU) "
              "against these predictions:", "", "| model | paper: over best | here | paper: scaling | here |",
              "|---|---:|---:|---:|---:|"]
    for name in PAPER_OVER_BEST:
        if name in derived and 16 in derived[name]:
            d = derived[name][16]
            scaling = "" if d["scaling"] is None else f"{d['scaling']:.1f}x"
            lines.append(f"| {name} | {PAPER_OVER_BEST[name]:.2f}x | {d['over_best']:.2f}x | "
                         f"{PAPER_SCALING[name]:.1f}x | {scaling} |")
    return "\n".join(lines) + "\n"


def plots(rows, out):
    """Throughput against devices (the paper's Figure 7) and bytes moved per step (its Figure 8)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install matplotlib)")
        return []
    table, _ = summarize(rows)
    names = list(table)
    colors = {"data": "#4878a8", "model": "#d08040", "owt": "#60a060", "optimal": "#c03030"}
    labels = {"data": "data", "model": "model", "owt": "owt", "optimal": "layer-wise"}
    figure, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        devices = sorted(table[name])
        for strategy in STRATEGIES:
            ax.plot(devices, [table[name][d][strategy]["images_per_s"] for d in devices], "o-", ms=4,
                    color=colors[strategy], label=labels[strategy])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(devices, [str(d) for d in devices])
        ax.set_title(name)
        ax.set_xlabel("devices (P100, 4 per node)")
        ax.grid(True, which="both", alpha=0.3)
    throughput = _finish(plt, figure, axes, "images/s (predicted)", os.path.join(out, "throughput.png"))
    count = 16 if all(16 in table[name] for name in names) else max(min(table[name]) for name in names)
    figure, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names):
        s = table[name][count]
        moved = [s[k]["bytes_transferred"] / 2 ** 20 for k in STRATEGIES]
        synced = [s[k]["bytes_synced"] / 2 ** 20 for k in STRATEGIES]
        x = range(len(STRATEGIES))
        ax.bar(x, synced, color="#888888", label="allreduced")
        ax.bar(x, moved, bottom=synced, color="#c03030", label="moved between layers")
        ax.set_xticks(list(x), [labels[k] for k in STRATEGIES])
        ax.set_yscale("log")
        ax.set_title(f"{name}, {count} devices")
        ax.grid(True, axis="y", which="both", alpha=0.3)
    communication = _finish(plt, figure, axes, "MiB per step (predicted)", os.path.join(out, "communication.png"))
    return [throughput, communication]


def _finish(plt, figure, axes, label, path):
    """Label the first panel, add its legend, write ``path``; returns it."""
    axes[0][0].set_ylabel(label)
    axes[0][0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def vgg16_plan_on_one_node(factor):
    """Our VGG-16 plans for 4 devices (one node) next to the paper's, as Markdown: with the gradients summed after
    backward (``sync.overlap: false``, as the paper's runtime did), and overlapped with it (as spmdcnn runs them).
    Returns the Markdown and the first plan's result."""
    graph = load_model(os.path.join(ROOT, "models", "vgg16.yaml"))
    results = [make_plan(graph, 4, calibrated_cost(graph, 4, factor, {"overlap": overlap}), "optimal")
               for overlap in (False, True)]
    lines = ["| layer | spmdcnn, sync after backward | spmdcnn, sync overlapped |", "|---|---|---|"]
    searched = [layer for layer in graph.layers if layer.op not in ("relu", "dropout")]
    for layer in searched:
        configs = [result.plan[layer.name].describe().split(", devices")[0] + "}" for result in results]
        lines.append(f"| {layer.name} | {configs[0]} | {configs[1]} |")
    lines.append(f"| predicted iteration | {results[0].prediction.iteration_s * 1e3:.1f} ms | "
                 f"{results[1].prediction.iteration_s * 1e3:.1f} ms |")
    paper = ["| layers | the paper |", "|---|---|"] + [f"| {what} | {config} |" for what, config in PAPER_VGG16_4]
    return "\n".join(paper) + "\n\n" + "\n".join(lines) + "\n", results[0]


def memory_example(factor, devices=16):
    """Beyond the paper: VGG-16 on ``devices`` devices with a per-device memory limit halfway between the lightest
    plan and the unlimited optimum (spmdcnn/cost/memory.py's model): both plans and what changed, as Markdown."""
    from spmdcnn.cost.memory import plan_memory
    from spmdcnn.planner import Problem
    graph = load_model(os.path.join(ROOT, "models", "vgg16.yaml"))
    cost = calibrated_cost(graph, devices, factor)
    free = make_plan(graph, devices, cost, "optimal")
    lightest = sum(m.min() for m in Problem(graph, devices, cost).memory(4))
    used = plan_memory(graph, free.plan)
    limit = (lightest + used) / 2
    limited = make_plan(graph, devices, cost, "optimal", memory=limit)
    gib = 2 ** 30
    lines = [f"VGG-16 on {devices} devices, batch {PER_DEVICE * devices}: the optimum keeps {used / gib:.2f} GiB on "
             f"its busiest device (the lightest plan {lightest / gib:.2f} GiB); with a limit of {limit / gib:.2f} "
             f"GiB the search finds a plan of {plan_memory(graph, limited.plan) / gib:.2f} GiB at "
             f"{PER_DEVICE * devices / limited.prediction.iteration_s:.0f} images/s, against "
             f"{PER_DEVICE * devices / free.prediction.iteration_s:.0f} unlimited. The layers that change:", "",
             "| layer | unlimited | within the limit |", "|---|---|---|"]
    for layer in graph.layers:
        a, b = free.plan[layer.name], limited.plan[layer.name]
        if a != b and layer.op not in ("relu", "dropout"):
            lines.append(f"| {layer.name} | {a.describe().split(', devices')[0]}}} | "
                         f"{b.describe().split(', devices')[0]}}} |")
    return "\n".join(lines) + "\n"


def synchronization_ablation(models, factors, devices=16):
    """Data parallelism on ``devices`` devices under the additive model (the search's surrogate: global-batch
    batch norm, one allreduce per layer's gradients, all on the critical path), then as data-parallel frameworks
    of 2018 did it: batch-norm statistics per device (only gamma and beta allreduced), then all gradients fused
    into one allreduce; last, as spmdcnn runs it (the timeline: buckets overlapped with backward). Rows of
    ``(model, variant, iteration_s, images_per_s, scaling from one device)`` as Markdown: how much of the gap to
    the paper's scaling each choice makes, under the same calibrated model."""
    lines = ["| model | data parallelism on 16 devices | sync (ms) | iteration (ms) | images/s | scaling from 1 |",
             "|---|---|---:|---:|---:|---:|"]
    default = statistics.median(factors.values())
    for name in models:
        graph = load_model(os.path.join(ROOT, "models", f"{name}.yaml"))
        factor = factors.get(name, default)
        one = calibrated_cost(graph, 1, factor).simulate(named("data", graph, PER_DEVICE, 1)).iteration_s
        cost = calibrated_cost(graph, devices, factor)
        plan = named("data", graph, PER_DEVICE * devices, devices)
        prediction = cost.surrogate(plan)
        layers = {layer.name: layer for layer in graph.layers}
        config = plan[next(layer.name for layer in graph.layers if layer.params)]
        (_, size, regimes, _, _), = cost._sync.groups(config, 1)[1]      # the allreduce over every device
        batchnorm = [row for row in prediction.layers if layers[row.name].op == "batchnorm2d"]
        weights = [row for row in prediction.layers if layers[row.name].op != "batchnorm2d"]
        bn_params = sum(2 * layers[row.name].out_shape[0] for row in batchnorm) * cost.itemsize
        all_params = graph.num_params * cost.itemsize
        rest = prediction.iteration_s - prediction.sync_s + prediction.overhead_s
        variants = [("one allreduce per layer, after backward", prediction.sync_s - prediction.overhead_s),
                    ("batch norm per device", sum(row.sync_s for row in weights)
                     + len(batchnorm) * regimes.allreduce(size, bn_params / max(len(batchnorm), 1))),
                    ("batch norm per device, gradients fused", regimes.allreduce(size, all_params))]
        if not batchnorm:
            variants = [variants[0], ("gradients fused", variants[2][1])]
        timeline = cost.simulate(plan)
        variants.append(("as spmdcnn runs it: buckets overlapped", timeline.iteration_s - rest))
        for label, sync in variants:
            iteration = rest + sync
            lines.append(f"| {name} | {label} | {sync * 1e3:.1f} | {iteration * 1e3:.1f} | "
                         f"{PER_DEVICE * devices / iteration:.0f} | {devices * one / iteration:.1f}x |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["alexnet", "vgg16", "inception_v3", "resnet50"])
    parser.add_argument("--devices", nargs="+", type=int, default=[1, 2, 4, 8, 16, 64])
    parser.add_argument("--out", default="paper-results",
                        help="folder to write (default paper-results; the committed results are in "
                             "benchmarks/paper/results: --out benchmarks/paper/results updates them)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = run(args.models, args.devices)
    text = markdown(rows)
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
    written = plots(rows, args.out)
    factor = next((r["factor"] for r in rows if r["model"] == "vgg16"), None)
    if factor is not None:
        vgg, result = vgg16_plan_on_one_node(factor)
        text += "\nVGG-16 on 4 devices of one node: the paper's plan, then the one found here:\n\n" + vgg
        with open(os.path.join(args.out, "vgg16-4.yaml"), "w", encoding="utf-8") as f:
            f.write(result.plan.text)
        if written:                      # matplotlib is there
            from spmdcnn.planner.plot import draw_plan
            picture = os.path.join(args.out, "vgg16-4.png")
            draw_plan(result.plan.graph, result.plan, result.prediction, picture,
                      "VGG-16, 4 P100 of one node, batch 128: the layer-wise optimum (calibrated analytic model)")
            written.append(picture)
        if 16 in args.devices:
            text += "\nBeyond the paper, a memory limit per device:\n\n" + memory_example(factor)
    if 16 in args.devices:
        text += ("\nData parallelism's synchronization on 16 devices, as spmdcnn does it and as 2018's frameworks "
                 "did:\n\n" + synchronization_ablation(args.models, paper_factors()))
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    print("wrote", ", ".join([os.path.join(args.out, name) for name in ("table.md", "results.json")] + written))


if __name__ == "__main__":
    main()
