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
