"""Iteration traces as Chrome trace-event JSON (docs/formats.md#trace-files): what ``spmdcnn bench --trace`` measured
and ``spmdcnn simulate --trace`` predicted, one process per rank, one thread per lane (compute, communication),
which Perfetto (ui.perfetto.dev) and chrome://tracing open and ``spmdcnn plot --trace`` draws.
"""

import json
from typing import NamedTuple

from .atomic import written_aside

LANES = ("compute", "communication")
KINDS = ("forward", "backward", "exchange", "batchnorm", "allreduce", "update", "loss")


class Event(NamedTuple):
    """One span of a rank's iteration: ``kind`` (one of :data:`KINDS`), in seconds from the iteration's start."""

    name: str
    kind: str
    rank: int
    lane: str
    start: float
    end: float


def to_chrome(events, title):
    """The trace-event document of ``events``: complete events (``ph: X``) in microseconds, rank ``r`` as process
    ``r`` and each lane as a thread of it, named."""
    trace = []
    for rank in sorted({e.rank for e in events}):
        trace.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        for tid, lane in enumerate(LANES):
            trace.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": lane}})
    for e in events:
        trace.append({"name": e.name, "cat": e.kind, "ph": "X", "pid": e.rank, "tid": LANES.index(e.lane),
                      "ts": round(e.start * 1e6, 3), "dur": round(max(e.end - e.start, 0.0) * 1e6, 3)})
    return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": {"title": title, "format": "spmdcnn-trace/1"}}


MAX_RANKS = 8       # ranks a picture draws one by one (plot --trace); more are summarised (:func:`summarize`)


class Drawn(NamedTuple):
    """A rank a picture draws: its ``label`` (the ranks it stands for) and ``rank`` (whose events are drawn)."""

    label: str
    rank: int


def _ranges(ranks):
    """``0-15, 32-47``: sorted ranks as runs."""
    runs, start, last = [], None, None
    for rank in sorted(ranks):
        if start is not None and rank == last + 1:
            last = rank
            continue
        if start is not None:
            runs.append(f"{start}-{last}" if last > start else f"{start}")
        start = last = rank
    runs.append(f"{start}-{last}" if last > start else f"{start}")
    return ", ".join(runs if len(runs) <= 4 else runs[:3] + ["..."])


def summarize(events, limit=MAX_RANKS):
    """``([Drawn], note)``: the ranks of ``events`` a picture draws, at most ``limit``, and what it left out (None:
    nothing). Every rank when there are no more than ``limit``; else one row per group of ranks whose timelines are
    identical (the same events at the same microseconds: a symmetric plan's prediction), and when the groups are
    still more than ``limit``, ``limit`` of them by when they finish: the fastest, the slowest and evenly between
    (the median among them)."""
    by_rank = {}
    for e in events:
        by_rank.setdefault(e.rank, []).append(e)
    if len(by_rank) <= limit:
        return [Drawn(f"rank {rank}", rank) for rank in sorted(by_rank)], None
    groups = {}
    for rank, mine in sorted(by_rank.items()):
        key = tuple(sorted((e.lane, e.kind, e.name, round(e.start * 1e6), round(e.end * 1e6)) for e in mine))
        groups.setdefault(key, []).append(rank)
    finish = {ranks[0]: max(e.end for e in by_rank[ranks[0]]) for ranks in groups.values()}
    ordered = sorted(groups.values(), key=lambda ranks: (finish[ranks[0]], ranks[0]))
    note = None
    if len(ordered) > limit:
        picks = sorted({round(i * (len(ordered) - 1) / (limit - 1)) for i in range(limit)})
        left = [ranks for i, ranks in enumerate(ordered) if i not in picks]
        times = [finish[ranks[0]] * 1e3 for ranks in left]
        count = sum(map(len, left))
        note = (f"{len(by_rank)} ranks in {len(ordered)} different timelines: drew {len(picks)} by when they "
                f"finish (the fastest, the slowest and evenly between); {count} rank{'s' * (count != 1)} left out, "
                f"finishing between {min(times):.2f} and {max(times):.2f} ms")
        ordered = [ordered[i] for i in picks]
    elif len(ordered) == 1:
        note = f"all {len(by_rank)} ranks have the same timeline: drawn once"
    elif len(ordered) < len(by_rank):
        note = f"{len(by_rank)} ranks in {len(ordered)} different timelines: one row each"
    drawn = []
    for ranks in ordered:
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranges(ranks)} ({len(ranks)} alike)"
        drawn.append(Drawn(f"{label}, ends {finish[ranks[0]] * 1e3:.2f} ms", ranks[0]))
    return drawn, note


def write_trace(path, events, title):
    """Write ``events`` to ``path`` (whole or not at all)."""
    with written_aside(path) as temporary, open(temporary, "w", encoding="utf-8") as handle:
        json.dump(to_chrome(events, title), handle)


def read_trace(path):
    """``(title, [Event])`` of a trace file this module wrote (or any trace-event JSON of complete events)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise ValueError(f"{path}: trace not found (write one with spmdcnn bench --trace or simulate --trace)") \
            from None
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable trace: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{path}: not a trace-event JSON document (no traceEvents list)")
    events = []
    for item in data["traceEvents"]:
        if not isinstance(item, dict) or item.get("ph") != "X":
            continue
        try:
            tid = int(item.get("tid", 0))
            start = float(item["ts"]) / 1e6
            events.append(Event(str(item["name"]), str(item.get("cat", "")), int(item["pid"]),
                                LANES[tid] if 0 <= tid < len(LANES) else str(tid), start,
                                start + float(item.get("dur", 0)) / 1e6))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}: a trace event without a name, pid and ts: {item!r} ({error})") from None
    title = (data.get("otherData") or {}).get("title", path) if isinstance(data.get("otherData"), dict) else path
    return str(title), events
