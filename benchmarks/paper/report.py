"""reproduce.py's tables (Markdown) and figures (PNG, with matplotlib): the predictions under each set of assumptions
next to the paper's measurements (:mod:`paper_data`)."""

import os
import re
import statistics

import paper_data

GIB = 2 ** 30
LABELS = {"data": "data", "model": "model", "owt": "owt", "optimal": "layer-wise"}
COLORS = {"data": "#4878a8", "model": "#d08040", "owt": "#60a060", "optimal": "#c03030"}


def grid(rows):
    """``{setting: {model: {devices: {strategy: row}}}}``."""
    table = {}
    for row in rows:
        table.setdefault(row["setting"], {}).setdefault(row["model"], {}).setdefault(row["devices"], {})[
            row["strategy"]] = row
    return table


def gain_and_scaling(cells, devices=16):
    """Layer-wise over the best other strategy at ``devices``, and layer-wise there over one device (None without
    a one-device run)."""
    at = cells[devices]
    over = at["optimal"]["images_per_s"] / max(at[s]["images_per_s"] for s in ("data", "model", "owt"))
    scaling = at["optimal"]["images_per_s"] / cells[1]["optimal"]["images_per_s"] if 1 in cells else None
    return over, scaling


def within(value, target, band=0.25):
    """"yes" when ``value`` is within ``band`` of ``target`` (as a fraction of it), else a bold "no"."""
    return "yes" if value is not None and abs(value / target - 1) <= band else "**no**"


def ratios(cells):
    """Predicted over measured for every Figure 7 cell this run covers (one device left out: calibrated)."""
    found = []
    for model, by_devices in cells.items():
        for devices, by_strategy in by_devices.items():
            if model in paper_data.THROUGHPUT and devices in paper_data.DEVICES[1:]:
                index = paper_data.DEVICES.index(devices)
                found += [row["images_per_s"] / paper_data.THROUGHPUT[model][s][index]
                          for s, row in by_strategy.items()]
    return found


def figure7(table, settings):
    """Per network, images/s of each strategy and device count: measured, then predicted under each setting."""
    lines = []
    for model in paper_data.MODELS:
        if not all(model in table.get(s, {}) for s in settings):
            continue
        devices = sorted(set.intersection(*(set(table[s][model]) for s in settings)) & set(paper_data.DEVICES))
        lines += [f"**{model}** (images/s: the paper / {' / '.join(settings)} assumptions)", "",
                  "| strategy | " + " | ".join(f"{d} GPUs" for d in devices) + " |",
                  "|---|" + "---:|" * len(devices)]
        for strategy in paper_data.STRATEGIES:
            cells = []
            for d in devices:
                measured = paper_data.THROUGHPUT[model][strategy][paper_data.DEVICES.index(d)]
                cells.append(" / ".join([f"{measured}"] + [f"{table[s][model][d][strategy]['images_per_s']:.0f}"
                                                           for s in settings]))
            lines.append(f"| {LABELS[strategy]} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def at_sixteen(table, settings):
    """The 16-GPU gain and scaling against the paper's, with the targets (within 25 %)."""
    lines = ["| model | over best: paper | " + " | ".join(f"{s} (within 25 %)" for s in settings)
             + " | scaling: paper | " + " | ".join(f"{s} (within 25 %)" for s in settings) + " |",
             "|---|---:|" + "---:|" * len(settings) + "---:|" + "---:|" * len(settings)]
    for model in paper_data.MODELS:
        if not all(16 in table.get(s, {}).get(model, {}) for s in settings):
            continue
        over, scale = paper_data.over_best(model), paper_data.scaling(model)
        mine = [gain_and_scaling(table[s][model]) for s in settings]
        lines.append(f"| {model} | {over:.2f}x | " + " | ".join(f"{g:.2f}x ({within(g, over)})" for g, _ in mine)
                     + f" | {scale:.1f}x | " + " | ".join("" if c is None else f"{c:.1f}x ({within(c, scale)})"
                                                          for _, c in mine) + " |")
    return "\n".join(lines) + "\n"


def cell_ratios(table, settings):
    """The median, middle half and extremes of predicted over measured Figure 7 cells under each setting."""
    lines = ["| assumptions | cells | median predicted / paper | middle half | lowest | highest |",
             "|---|---:|---:|---|---:|---:|"]
    for s in settings:
        found = sorted(ratios(table.get(s, {})))
        if not found:
            continue
        q = statistics.quantiles(found, n=4) if len(found) > 1 else [found[0]] * 3
        lines.append(f"| {s} | {len(found)} | {statistics.median(found):.2f} | {q[0]:.2f}-{q[2]:.2f} | "
                     f"{found[0]:.2f} | {found[-1]:.2f} |")
    return "\n".join(lines) + "\n"


def search_times(table, settings, devices=4):
    """The time each layer-wise search took on ``devices`` devices (tables included) against the paper's Table 3."""
    lines = ["| model | the paper (Algorithm 1) | " + " | ".join(f"here, {s} assumptions" for s in settings) + " |",
             "|---|---:|" + "---:|" * len(settings)]
    for model in paper_data.MODELS:
        if all(devices in table.get(s, {}).get(model, {}) for s in settings):
            lines.append(f"| {model} | {paper_data.SEARCH_S[model]} s | " + " | ".join(
                f"{table[s][model][devices]['optimal']['search_s']:.3f} s" for s in settings) + " |")
    return "\n".join(lines) + "\n"


def paper_bytes(row):
    """GiB of a row as Figure 8 counts them: activations moved forward and parameter traffic."""
    b = row["paper_bytes"]
    return (b["activations"] + b["parameters"]) / GIB


def figure8(table, settings, devices=16):
    """Data moved per step as the paper counts it (activations forward, every replica's gradients pushed and
    parameters pulled), at ``devices`` GPUs."""
    lines = [f"| model | strategy | the paper, {devices} GPUs (GiB) | "
             + " | ".join(f"{s} assumptions" for s in settings) + " |", "|---|---|---:|" + "---:|" * len(settings)]
    for model in paper_data.MODELS:
        if not all(devices in table.get(s, {}).get(model, {}) for s in settings):
            continue
        for strategy in paper_data.STRATEGIES:
            measured = paper_data.TRANSFERRED_GIB[model][strategy][paper_data.DEVICES.index(devices)]
            lines.append(f"| {model} | {LABELS[strategy]} | {measured:.2f} | " + " | ".join(
                f"{paper_bytes(table[s][model][devices][strategy]):.2f}" for s in settings) + " |")
    return "\n".join(lines) + "\n"


def switches(rows_by_setting, devices=16):
    """Gain and scaling at ``devices`` under each setting of the switch study, one row each."""
    models = [m for m in paper_data.MODELS if all(m in grid(rows)[name] for name, rows in rows_by_setting)]
    lines = ["| assumptions | " + " | ".join(f"{m}: over best, scaling" for m in models) + " |",
             "|---|" + "---|" * len(models)]
    for name, rows in rows_by_setting:
        cells = grid(rows)[name]
        parts = []
        for model in models:
            over, scale = gain_and_scaling(cells[model], devices)
            parts.append(f"{over:.2f}x, " + ("" if scale is None else f"{scale:.1f}x"))
        lines.append(f"| {name} | " + " | ".join(parts) + " |")
    return "\n".join(lines) + "\n"


def config(text):
    """A configuration as a table shows it: without its device list."""
    return re.sub(r", devices: \[[^]]*\]", "", text)


def transfer_readings(found, devices=16):
    """``found`` from settings.transfer_readings, against the paper's Figure 7."""
    index = paper_data.DEVICES.index(devices)
    lines = ["| model | strategy | the paper | the busiest device's exchanges (the model) | every transfer one after "
             "another |", "|---|---|---:|---:|---:|"]
    for name, strategy, parallel, serial in found:
        lines.append(f"| {name} | {LABELS[strategy]} | {paper_data.THROUGHPUT[name][strategy][index]} | "
                     f"{parallel:.0f} | {serial:.0f} |")
    return "\n".join(lines) + "\n"


def layerwise_wins(found):
    """``found``: ``[(model, devices, (other, gain, changed))]`` from settings.where_layerwise_wins."""
    lines = []
    for model, devices, (other, gain, changed) in found:
        lines.append(f"- **{model}, {devices} GPUs**: layer-wise is {gain:.2f}x the best other strategy ({other}).")
        for name, was, now, (dc, dx, ds, da) in changed:
            lines.append(f"  - `{name}`: {config(was)} -> {config(now)}: compute {dc * 1e3:+.2f} ms, transfer "
                         f"{dx * 1e3:+.2f} ms, exposed sync {ds * 1e3:+.2f} ms (allreduce time, hidden or not, "
                         f"{da * 1e3:+.2f} ms)")
        if not changed:
            lines.append(f"  - no layer differs from {other}")
    return "\n".join(lines) + "\n"


def plots(table, settings, out):
    """Figure 7 (images/s against GPUs; the paper's measurements as crosses) and Figure 8 (data per step at 16
    GPUs, as the paper counts it) under each setting. Returns the files written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install matplotlib)")
        return []
    models = [m for m in paper_data.MODELS if all(m in table.get(s, {}) for s in settings)]
    if not models:
        return []
    figure, axes = plt.subplots(len(settings), len(models), figsize=(4.2 * len(models), 3.4 * len(settings)),
                                squeeze=False)
    for row, setting in enumerate(settings):
        for ax, model in zip(axes[row], models):
            devices = sorted(table[setting][model])
            for strategy in paper_data.STRATEGIES:
                ax.plot(devices, [table[setting][model][d][strategy]["images_per_s"] for d in devices], "o-",
                        ms=3, color=COLORS[strategy], label=f"{LABELS[strategy]}, predicted")
                ax.plot(paper_data.DEVICES, paper_data.THROUGHPUT[model][strategy], "x", ms=7,
                        color=COLORS[strategy])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(devices, [str(d) for d in devices])
            ax.set_title(f"{model}, {setting} assumptions", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
        axes[row][0].set_ylabel("images/s (x: the paper)")
    axes[0][0].legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("GPUs (P100, 4 per node)")
    written = [_save(plt, figure, os.path.join(out, "throughput.png"))]
    figure, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.4), squeeze=False)
    width = 0.8 / (len(settings) + 1)
    for ax, model in zip(axes[0], models):
        x = range(len(paper_data.STRATEGIES))
        ax.bar([i - 0.4 + width / 2 for i in x], [paper_data.TRANSFERRED_GIB[model][s][-1]
                                                  for s in paper_data.STRATEGIES], width, color="#444444",
               label="the paper")
        for k, setting in enumerate(settings):
            if 16 in table[setting][model]:
                ax.bar([i - 0.4 + width * (k + 1.5) for i in x], [paper_bytes(table[setting][model][16][s])
                                                                  for s in paper_data.STRATEGIES], width,
                       color=("#c03030", "#4878a8", "#60a060")[k % 3], label=f"{setting} assumptions")
        ax.set_xticks(list(x), [LABELS[s] for s in paper_data.STRATEGIES])
        ax.set_yscale("log")
        ax.set_title(f"{model}, 16 GPUs", fontsize=10)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0][0].set_ylabel("GiB per step, as the paper counts")
    axes[0][0].legend(fontsize=7)
    written.append(_save(plt, figure, os.path.join(out, "communication.png")))
    return written


def _save(plt, figure, path):
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
