"""The paper's evaluation (Jia et al., ICML 2018, section 6) under spmdcnn's cost model: under the paper's own
assumptions and under today's, side by side (:mod:`settings` says what each set assumes).

    python benchmarks/paper/reproduce.py [--assumptions paper|modern|both] [--models alexnet vgg16 inception_v3
        resnet50] [--devices 1 2 4 8 16 64] [--out DIR]

For each set of assumptions, each network and device count (32 images per device on the paper's machine: nodes of
4 P100; the paper's networks on the paper's 1-16 GPUs under its assumptions, ResNet-50 and 64 devices too under
today's), the data, model, owt and layer-wise plans are predicted, their throughput next to the paper's Figure 7,
the layer-wise gain and scaling at 16 GPUs against the paper's, the search time on 4 GPUs against its Table 3, the
VGG-16 plan on 4 GPUs against its Table 5, the data moved per step as its Figure 8 counts it, the gain and scaling
with one of the paper's assumptions switched to today's at a time, and under today's assumptions the layers where
layer-wise parallelism still wins. Written as ``table.md``, ``results.json``, ``throughput.png``,
``communication.png`` and the VGG-16 plans, in a new folder (``paper-results``, or ``paper-results-2``, ... if that
exists) unless ``--out`` names one; ``--out benchmarks/paper/results`` updates the committed copy.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(os.path.dirname(HERE)))

import paper_data  # noqa: E402
import report  # noqa: E402
import settings  # noqa: E402
from settings import MODERN, PAPER, PER_DEVICE, SETTINGS, SWITCHES  # noqa: E402
from spmdcnn.planner import make_plan  # noqa: E402
from spmdcnn.tiling.plan import named  # noqa: E402


def new_folder(base="paper-results"):
    """``base``, or the first of ``base-2``, ``base-3``, ... that does not exist yet."""
    candidate, number = base, 1
    while os.path.exists(candidate):
        number += 1
        candidate = f"{base}-{number}"
    return candidate


def scope(setting, models, devices):
    """The networks and device counts a setting covers: the paper's assumptions only the paper's networks and
    GPU counts; today's any."""
    if setting is PAPER:
        return [m for m in models if m in paper_data.MODELS], [d for d in devices if d in paper_data.DEVICES]
    return list(models), list(devices)


def table5_section(chosen, factors):
    """Table 5 against the VGG-16 plan found on 4 GPUs under each setting: Markdown, and the plans found."""
    graph = PAPER.graph("vgg16")
    searched = [layer.name for layer in graph.layers if layer.op not in ("relu", "dropout")]
    found, lines = {}, []
    for name in chosen:
        paper_plan, paper_cost, result = settings.table5(SETTINGS[name], factors[name]["vgg16"])
        found[name] = result
        same = all(paper_plan[layer] == result.plan[layer] for layer in searched if layer != "flat")
        excess = paper_cost.iteration_s / result.prediction.iteration_s - 1
        lines.append(f"- {name} assumptions: the paper's plan {paper_cost.iteration_s * 1e3:.1f} ms, the plan found "
                     f"{result.prediction.iteration_s * 1e3:.1f} ms: "
                     + ("the same plan." if same else f"another plan; the paper's costs {excess * 100:+.1f} % "
                        f"under the model ({'within' if excess <= 0.02 else '**not within**'} 2 %)."))
    head = ["| layer | " + " | ".join(f"found, {name} assumptions" for name in chosen) + " |",
            "|---|" + "---|" * len(chosen)]
    body = [f"| {layer} | " + " | ".join(report.config(found[name].plan[layer].describe(short=True))
                                         for name in chosen) + " |" for layer in searched]
    paper = ["| layers | Table 5 |", "|---|---|"] + [f"| {what} | {config} |" for what, config in paper_data.VGG16_4]
    return "\n".join(paper + [""] + head + body + [""] + lines) + "\n", found


def switch_study(models):
    """The gain and scaling at 16 GPUs under the paper's assumptions, with each switched alone, and today's."""
    studied = [(PAPER.name, None)] + [(what, setting) for what, setting in SWITCHES] + [(MODERN.name, None)]
    rows_by_setting = []
    for what, setting in studied:
        setting = setting or SETTINGS[what]
        rows = settings.run(setting, [m for m in models if m in paper_data.MODELS], [1, 16], log=lambda line: None)
        for row in rows:
            row["setting"] = what
        rows_by_setting.append((what, rows))
    return report.switches(rows_by_setting)


def memory_example(factor, devices=16):
    """Beyond the paper (today's assumptions): VGG-16 on ``devices`` devices with a per-device memory limit halfway
    between the lightest plan and the unlimited optimum (spmdcnn/cost/memory.py), as Markdown."""
    from spmdcnn.cost.memory import plan_memory
    from spmdcnn.planner import Problem
    from spmdcnn.planner import memory as planned_memory
    graph = MODERN.graph("vgg16")
    cost = settings.calibrated_cost(MODERN, graph, devices, factor)
    free = make_plan(graph, devices, cost, "optimal")
    problem = Problem(graph, devices, cost)
    lightest = planned_memory.lightest(problem.memory(cost.itemsize), problem.transients(cost.itemsize))
    used = plan_memory(graph, free.plan, cost.itemsize, cost.machine.device.im2col)
    limit = (lightest + used) / 2
    limited = make_plan(graph, devices, cost, "optimal", memory=limit)
    gib = 2 ** 30
    lines = [f"VGG-16 on {devices} devices, batch {PER_DEVICE * devices}: the optimum keeps {used / gib:.2f} GiB on "
             f"its busiest device (the lightest plan {lightest / gib:.2f} GiB); with a limit of {limit / gib:.2f} "
             f"GiB the search finds a plan of "
             f"{plan_memory(graph, limited.plan, cost.itemsize, cost.machine.device.im2col) / gib:.2f} GiB at "
             f"{PER_DEVICE * devices / limited.prediction.iteration_s:.0f} images/s, against "
             f"{PER_DEVICE * devices / free.prediction.iteration_s:.0f} unlimited. The layers that change:", "",
             "| layer | unlimited | within the limit |", "|---|---|---|"]
    for layer in graph.layers:
        a, b = free.plan[layer.name], limited.plan[layer.name]
        if a != b and layer.op not in ("relu", "dropout"):
            lines.append(f"| {layer.name} | {report.config(a.describe(short=True))} | "
                         f"{report.config(b.describe(short=True))} |")
    return "\n".join(lines) + "\n"


def synchronization_ablation(models, factors, devices=16):
    """Data parallelism on ``devices`` devices under today's assumptions, as the additive model (the search's
    surrogate) charges it, as data-parallel frameworks of 2018 synchronized (batch-norm statistics per device, then
    all gradients fused into one allreduce), and as spmdcnn runs it (the timeline: buckets overlapped with
    backward), as Markdown."""
    lines = ["| model | data parallelism on 16 devices | sync (ms) | iteration (ms) | images/s | scaling from 1 |",
             "|---|---|---:|---:|---:|---:|"]
    for name in models:
        graph = MODERN.graph(name)
        one = settings.calibrated_cost(MODERN, graph, 1, factors[name]).simulate(
            named("data", graph, PER_DEVICE, 1)).iteration_s
        cost = settings.calibrated_cost(MODERN, graph, devices, factors[name])
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
        variants.append(("as spmdcnn runs it: buckets overlapped", cost.simulate(plan).iteration_s - rest))
        for label, sync in variants:
            iteration = rest + sync
            lines.append(f"| {name} | {label} | {sync * 1e3:.1f} | {iteration * 1e3:.1f} | "
                         f"{PER_DEVICE * devices / iteration:.0f} | {devices * one / iteration:.1f}x |")
    return "\n".join(lines) + "\n"


def write_plans(found, out, written):
    """The VGG-16 plans found on 4 GPUs, as plan files and (with matplotlib) pictures."""
    for name, result in found.items():
        with open(os.path.join(out, f"vgg16-4-{name}.yaml"), "w", encoding="utf-8") as f:
            f.write(result.plan.text)
        if written:                 # matplotlib is there
            from spmdcnn.planner.plot import draw_plan
            picture = os.path.join(out, f"vgg16-4-{name}.png")
            draw_plan(result.plan.graph, result.plan, result.prediction, picture,
                      f"VGG-16, 4 P100 of one node, batch 128: the layer-wise optimum, {name} assumptions")
            written.append(picture)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--assumptions", choices=("paper", "modern", "both"), default="both")
    parser.add_argument("--models", nargs="+", default=["alexnet", "vgg16", "inception_v3", "resnet50"])
    parser.add_argument("--devices", nargs="+", type=int, default=[1, 2, 4, 8, 16, 64])
    parser.add_argument("--out", help="folder to write (default: a new one, paper-results or paper-results-N; "
                                      "--out benchmarks/paper/results updates the committed results)")
    args = parser.parse_args()
    chosen = ["paper", "modern"] if args.assumptions == "both" else [args.assumptions]
    out = args.out or new_folder()
    os.makedirs(out, exist_ok=True)
    rows, factors = [], {}
    for name in chosen:
        networks, devices = scope(SETTINGS[name], args.models, args.devices)
        factors[name] = settings.factors(SETTINGS[name], networks)
        rows += settings.run(SETTINGS[name], networks, devices)
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
    table = report.grid(rows)
    sections = [("The assumptions", "\n".join(f"- **{name}**: {SETTINGS[name].what}." for name in chosen) + "\n"),
                ("Figure 7: images/s", report.figure7(table, chosen)),
                ("At 16 GPUs: layer-wise over the best other strategy, and its scaling from 1 GPU",
                 report.at_sixteen(table, chosen)),
                ("Predicted over measured, every Figure 7 cell from 2 GPUs", report.cell_ratios(table, chosen)),
                ("Table 3: time to find the layer-wise plan on 4 GPUs", report.search_times(table, chosen)),
                ("Figure 8: data moved per step at 16 GPUs, as the paper counts it (activations forward, every "
                 "replica's gradients pushed and parameters pulled)", report.figure8(table, chosen))]
    found = {}
    if "vgg16" in args.models and 4 in args.devices:
        text, found = table5_section(chosen, factors)
        sections.append(("Table 5: VGG-16 on 4 GPUs of one node", text))
    if args.assumptions == "both" and 1 in args.devices and 16 in args.devices:
        sections.append(("One of the paper's assumptions switched to today's at a time (16 GPUs)",
                         switch_study(args.models)))
    if "paper" in chosen and 16 in args.devices:
        networks = [m for m in args.models if m in paper_data.MODELS]
        sections.append(("Under the paper's assumptions, two readings of t_x at 16 GPUs (images/s)",
                         report.transfer_readings(settings.transfer_readings(PAPER, networks, 16, factors["paper"]))))
    if "modern" in chosen:
        networks = [m for m in args.models if m in paper_data.MODELS + ("resnet50",)]
        top = 16 if 16 in args.devices else max(args.devices)
        sections.append((f"Today's assumptions: where layer-wise parallelism still wins ({top} GPUs)",
                         report.layerwise_wins([(m, top, settings.where_layerwise_wins(MODERN, m, top,
                                                                                       factors["modern"][m]))
                                                for m in networks])))
    if "modern" in chosen and 16 in args.devices:
        if "vgg16" in args.models:
            sections.append(("Beyond the paper: a memory limit per device (today's assumptions)",
                             memory_example(factors["modern"]["vgg16"])))
        sections.append(("Data parallelism's synchronization on 16 devices, as spmdcnn runs it and as 2018's "
                         "frameworks did (today's assumptions)", synchronization_ablation(networks, factors["modern"])))
    written = report.plots(table, chosen, out)
    write_plans(found, out, written)
    text = "\n".join(f"## {title}\n\n{body}" for title, body in sections)
    with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    print("wrote", ", ".join([os.path.join(out, name) for name in ("table.md", "results.json")] + written))


if __name__ == "__main__":
    main()
