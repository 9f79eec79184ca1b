"""What a training run reports as it goes (docs/formats.md#metrics-files): its progress bar, the metrics file, the
losses and waits of each log interval, and the ranks' spread of work per step (the straggler report)."""

import os
import sys
import time

import numpy as np

from ..progress import Progress, is_terminal
from .resume import trim_metrics

STRAGGLER = 0.25        # a log line names the slowest rank when its work per step is this much above the others'


def training_progress(setting, total, start, stream=None):
    """The bar of a training run on rank 0 (``log.progress``: ``auto`` draws it when standard output is a
    terminal, ``true`` always, ``false`` never), or None. In a batch log the log lines say how far it is."""
    stream = stream or sys.stdout
    if setting == "auto":
        setting = is_terminal(stream)
    return Progress(total, "train", unit="steps", stream=stream, setting=True, initial=start) if setting else None


def stragglers(work, steps):
    """The metrics of the ranks' ``work`` (seconds each spent not waiting for the others, in rank order) over
    ``steps`` steps: which rank is the slowest, its work per step and the median of the others' (None on one
    rank)."""
    if not steps or len(work) < 2:
        return {"slowest_rank": None, "work_slowest_s": None, "work_others_s": None}
    slowest = max(range(len(work)), key=work.__getitem__)
    others = work[:slowest] + work[slowest + 1:]
    return {"slowest_rank": slowest, "work_slowest_s": work[slowest] / steps,
            "work_others_s": float(np.median(others)) / steps}


class Interval:
    """Losses and right answers since the last log line; ``waits``: the rank's waits for the others so far."""

    def __init__(self, waits=0.0):
        self.start, self.losses, self.correct, self.counted, self.waited = time.perf_counter(), [], 0, 0.0, 0.0
        self.waits = waits

    def add(self, loss, correct, waited=0.0, counted=0.0):
        """``counted``: what the loss averaged over (labelled samples or positions, target values)."""
        self.losses.append(loss)
        self.correct += correct
        self.counted += counted
        self.waited += waited


def open_metrics(path, start_step):
    """The metrics file: new for a new run; on resume, kept up to ``start_step`` and appended to."""
    if not path:
        return None
    if start_step and os.path.exists(path):
        trim_metrics(path, start_step)
        return open(path, "a", encoding="utf-8")
    return open(path, "w", encoding="utf-8")
