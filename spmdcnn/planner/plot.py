"""``spmdcnn plot``: a plan as a picture. One row per layer (the relu and dropout layers that take their input's
configuration are drawn with that layer, their times added to its row): on the left its configuration, as a bar of its degrees over n, c, h and w on a log
scale (one colour per dimension), on the right its predicted compute, transfer and sync time, stacked.

matplotlib draws it (``pip install matplotlib``, or ``spmdcnn[plot]``); it is imported only here.
"""

import copy
import math

from ..tiling.plan import inherits

COLOURS = {"n": "#4878a8", "c": "#c03030", "d": "#8060b0", "h": "#60a060", "w": "#d0a030"}
# the time panel's colours are none of the dimensions': one meaning per colour in the figure
TIMES = (("compute_s", "compute", "#404040"), ("transfer_s", "transfer", "#e08000"), ("sync_s", "sync", "#b0b0b0"))


def _inherits(layer, plan):
    """A relu or dropout layer with its input's configuration (drawn with its input)."""
    return inherits(layer, plan.configs) and plan[layer.name] == plan[layer.inputs[0]]


def draw_plan(graph, plan, prediction, output, title):
    """Write the picture of ``plan`` (of ``graph``) under ``prediction`` to ``output`` (PNG, SVG or PDF by its
    extension)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("spmdcnn plot needs matplotlib: pip install matplotlib (or spmdcnn[plot])") from None
    rows, owner = [], {}
    for layer, cost in zip(graph.layers, prediction.layers):
        if _inherits(layer, plan):          # drawn with the layer whose configuration it takes: add its times
            row = owner[layer.inputs[0]]
            owner[layer.name] = row
            for key, _, _ in TIMES:
                setattr(rows[row][2], key, getattr(rows[row][2], key) + getattr(cost, key))
        else:
            owner[layer.name] = len(rows)
            rows.append((layer, plan[layer.name], copy.copy(cost)))
    height = max(3.0, 0.22 * len(rows) + 1.4)
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, height), sharey=True,
                                         gridspec_kw={"width_ratios": [1, 1.6]})
    y = list(range(len(rows)))[::-1]
    top = max(1, math.ceil(math.log2(max(max(config.degrees) for _, config, _ in rows) or 1)))
    for row, (layer, config, _) in zip(y, rows):
        start = 0.0
        for name, degree in zip(config.names, config.degrees):
            if degree > 1:
                width = math.log2(degree)
                left.barh(row, width, left=start, color=COLOURS[name], height=0.7)
                left.text(start + width / 2, row, f"{name}{degree}", ha="center", va="center", fontsize=7,
                          color="white")
                start += width
        if start == 0:
            left.text(0.05, row, "whole", va="center", fontsize=7, color="#555555")
    left.set_xlim(0, max(top, math.log2(plan.devices) if plan.devices > 1 else 1))
    left.set_xlabel("log2 of the degrees (product: devices used)")
    left.set_yticks(y, [layer.name for layer, _, _ in rows], fontsize=7)
    left.set_title("configuration")
    base = [0.0] * len(rows)
    for key, label, colour in TIMES:
        values = [getattr(cost, key) * 1e3 for _, _, cost in rows]
        right.barh(y, values, left=base, color=colour, height=0.7, label=label)
        base = [b + v for b, v in zip(base, values)]
    right.set_xlabel("predicted ms per iteration")
    right.legend(fontsize=8, loc="lower right")
    right.grid(True, axis="x", alpha=0.3)
    summary = prediction.summary()
    right.set_title(f"{summary['iteration_s'] * 1e3:.1f} ms per iteration, {plan.batch / summary['iteration_s']:.0f} "
                    "images/s")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(output, dpi=110)
    plt.close(figure)


TRACE_COLOURS = {"forward": "#4878a8", "backward": "#9ab4d4", "exchange": "#c03030", "batchnorm": "#d0a030",
                 "allreduce": "#888888", "update": "#60a060", "loss": "#a060a0"}


def draw_traces(traces, output):
    """Write a picture of ``traces`` (``[(title, [Event])]``: measured by ``bench --trace``, predicted by
    ``simulate --trace``) to ``output``: one panel each, on a common time axis, a row per rank and lane, a bar per
    event coloured by its kind. A trace of more than :data:`~spmdcnn.io.trace.MAX_RANKS` ranks draws a summary
    (:func:`~spmdcnn.io.trace.summarize`: ranks of identical timelines once, then the fastest, slowest and ranks
    between). Returns the notes of what each panel left out (``[(title, note)]``)."""
    from ..io.trace import summarize
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise RuntimeError("spmdcnn plot needs matplotlib: pip install matplotlib (or spmdcnn[plot])") from None
    longest = max((e.end for _, events in traces for e in events), default=1.0) * 1e3
    rows_of, notes = [], []
    for title, events in traces:
        drawn, note = summarize(events)
        lanes = {}
        for e in events:
            lanes.setdefault(e.rank, set()).add(e.lane)
        rows_of.append([(d.rank, lane, d.label) for d in drawn for lane in sorted(lanes[d.rank])])
        notes.append((title, note))
    figure, axes = plt.subplots(len(traces), 1, squeeze=False, figsize=(12, 1.2 + 0.5 * sum(map(len, rows_of))),
                                height_ratios=[max(len(rows), 1) for rows in rows_of])
    for (title, events), rows, (_, note), (axis,) in zip(traces, rows_of, notes, axes):
        index = {(rank, lane): i for i, (rank, lane, _) in enumerate(rows)}
        for kind, colour in TRACE_COLOURS.items():
            spans = {}
            for e in events:
                if e.kind == kind and (e.rank, e.lane) in index:
                    spans.setdefault(index[e.rank, e.lane], []).append((e.start * 1e3, (e.end - e.start) * 1e3))
            for row, bars in spans.items():
                axis.broken_barh(bars, (row - 0.4, 0.8), facecolors=colour, edgecolors="none")
        axis.set_yticks(range(len(rows)), [f"{label}: {lane}" for _, lane, label in rows], fontsize=8)
        axis.invert_yaxis()
        axis.set_xlim(0, longest)
        axis.set_title(title if note is None else f"{title}\n{note}", fontsize=9)
    axes[-1][0].set_xlabel("ms from the iteration's start")
    figure.legend(handles=[Patch(color=c, label=k) for k, c in TRACE_COLOURS.items()], loc="upper right",
                  ncol=len(TRACE_COLOURS), fontsize=8)
    figure.tight_layout(rect=(0, 0, 1, 0.95))
    figure.savefig(output, dpi=110)
    plt.close(figure)
    return [(title, note) for title, note in notes if note is not None]
