"""What a long search is doing, on a terminal: ``spmdcnn plan`` passes a :class:`SearchProgress` to the planner.

The planner reports its stages as ``progress(stage, done, total)`` (``done`` and ``total`` None for a stage
without parts). Nothing is shown during the first ``DELAY`` seconds (most searches end by then) nor when the
stream is not a terminal (a pipe, a log, ``--json``); after that one line is redrawn in place, at most every
``INTERVAL`` seconds, and erased at the end::

    plan: lower bounds over 2 devices [######..............] 12/39 tables  14 s

A leaf module (standard library only), like :mod:`spmdcnn.progress`, whose helpers it uses.
"""

import sys
import threading
import time

from .progress import CLEAR, format_duration, is_terminal

STAGES = {      # the planner's stage names, as people read them
    "configurations": "costing every configuration",
    "screen": "screening the configurations",
    "tables": "exact transfer tables",
    "search": "searching",
    "scoring": "scoring the candidate plans on the timeline",
}


class SearchProgress:
    """``progress(stage, done=None, total=None)`` for the planner, drawing on ``stream`` (default standard error,
    so that standard output stays the plan) when it is a terminal or ``setting`` is True (False: never)."""

    DELAY = 1.0         # seconds before anything is shown
    INTERVAL = 0.1      # least seconds between two redraws
    WIDTH = 20          # characters of the bar

    def __init__(self, stream=None, setting="auto", clock=time.monotonic):
        self.stream = sys.stderr if stream is None else stream
        self.shows = setting is True or (setting == "auto" and is_terminal(self.stream))
        self.clock, self.start = clock, clock()
        self.shown, self.drawn_at, self.last = "", None, None
        self.lock = threading.Lock()        # the planner's worker threads report too

    def __call__(self, stage, done=None, total=None):
        with self.lock:
            self._show(stage, done, total)

    def _show(self, stage, done, total):
        if not self.shows:
            return
        now = self.clock()
        changed = (stage, total) != self.last
        self.last = (stage, total)
        if now - self.start < self.DELAY:
            return
        if not changed and self.drawn_at is not None and now - self.drawn_at < self.INTERVAL and done != total:
            return
        self.drawn_at = now
        self.shown = self.text(stage, done, total, now - self.start)
        self.stream.write(CLEAR + self.shown)
        self.stream.flush()

    def text(self, stage, done, total, elapsed):
        """The line: ``plan: what [bar] done/total unit  elapsed``."""
        what = STAGES.get(stage, stage)
        unit = "tables" if stage.startswith(("bounds", "tables")) else "plans" if stage == "scoring" else ""
        if stage.startswith("bounds"):
            what = "lower " + stage
        if total:
            filled = self.WIDTH * min(done or 0, total) // total
            what += f" [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done or 0}/{total} {unit}".rstrip()
        return f"plan: {what}  {format_duration(elapsed)}"

    def close(self):
        """Erase the line (the plan is printed next)."""
        with self.lock:
            self._erase()

    def _erase(self):
        if self.shown:
            self.stream.write(CLEAR)
            self.stream.flush()
            self.shown = ""
        self.shows = False
