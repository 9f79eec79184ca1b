"""Progress of a long loop: a bar redrawn in place on a terminal, a plain line every few per cent elsewhere.

::

    with Progress(len(files), "convert", unit="images") as progress:
        for block in blocks:
            ...
            progress.advance(len(block))         # or progress.update(done), update(done, note="loss 0.41")
            progress.write("a log line")         # printed above the bar

On a terminal (``setting="auto"`` and the stream is one, or ``setting=True``) one line is redrawn in place, at most
once every ``INTERVAL`` seconds (and always when the last item is done)::

    convert [########............] 800/2,000 images  380 images/s  3 s left

Elsewhere (a pipe, a batch log) a plain line is printed each time another ``STEP`` per cent is done, and at the end::

    convert: 40 % (800 of 2,000 images), 380 images/s, 3 s left
    convert: 100 % (2,000 of 2,000 images), 380 images/s, done in 5 s

``delay``: show nothing until the work has run that many seconds (work that ends sooner needs no progress; the
profile of a small model takes a second or two). ``setting=False`` shows no progress. The rate is the mean since
the start (the items done since ``initial``, over the time since the Progress was made); the time left is what
remains at that rate. A leaf module: it imports only the standard library, so that any command can use it.
"""

import os
import sys
import time

CLEAR = "\r\x1b[K"      # back to the start of the line, and erase it


def format_rate(rate):
    """``rate`` (per second) in three significant digits, or whole with thousands separators from 100 on."""
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"


def format_duration(seconds):
    """``seconds`` as ``<1 s``, ``42 s``, ``3 min 05 s`` or ``2 h 07 min`` (rounded to the unit shown last)."""
    if seconds < 1:
        return "<1 s"
    if seconds < 59.5:
        return f"{round(seconds)} s"
    if seconds < 3600 - 0.5:
        whole = round(seconds)
        return f"{whole // 60} min {whole % 60:02d} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min"


def is_terminal(stream):
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):        # no isatty, or a closed file
        return False


def _columns(stream):
    """The width of the terminal ``stream`` writes to, or None when it has none (a fake or redirected stream) or
    says 0 (a pseudo-terminal whose size was never set)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, OSError, ValueError):
        return None


class Progress:
    """The progress of ``total`` items (``unit``: their name, plural) under ``label``, on ``stream`` (default
    standard output). ``setting``: ``"auto"`` (a bar on a terminal, lines elsewhere), True (always the bar) or
    False (nothing). ``suffix``: a function whose text is shown after the numbers at every redraw. ``clock``: the
    time in seconds (injectable for tests). ``initial``: items already done (a resumed run); the rate counts only
    those done since. ``delay``: seconds before anything is shown (module docstring). A context manager: leaving it
    closes the Progress."""

    WIDTH = 20          # characters of the bar
    INTERVAL = 0.1      # least seconds between two redraws on a terminal
    STEP = 5            # per cent between two lines elsewhere

    def __init__(self, total, label, unit="items", stream=None, setting="auto", clock=time.monotonic, suffix=None,
                 initial=0, delay=0.0):
        if not (setting is True or setting is False or setting == "auto"):
            raise ValueError(f"progress '{label}': setting must be 'auto', True or False, got {setting!r}")
        if not 0 <= initial <= total:
            raise ValueError(f"progress '{label}': expected 0 <= initial <= total, got initial {initial} and "
                             f"total {total}")
        self.total, self.label, self.unit = total, label, unit
        self.stream = sys.stdout if stream is None else stream
        terminal = setting is True or (setting == "auto" and is_terminal(self.stream))
        self.mode = "terminal" if terminal else "lines" if setting == "auto" else None
        self.clock, self.suffix = clock, suffix
        self.start, self.initial, self.done, self.note = clock(), initial, initial, None
        self.shown = ""                 # the bar as drawn now (terminal)
        self.drawn_at = None            # when it was drawn
        self.logged = self._percent() // self.STEP      # the last STEP printed as a line (elsewhere)
        self.ended = False              # the line of the end printed
        self.delay = delay

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def update(self, done, note=None):
        """``done`` of ``total`` items are done now; show it as the mode says. ``note``: text shown after the
        numbers (such as ``"loss 0.41"``), kept until another note replaces it."""
        self.done = done
        if note is not None:
            self.note = note
        if self.delay and self.clock() - self.start < self.delay:
            return                      # too soon to need it (the lines' per cent steps are taken up after)
        if self.mode == "terminal":
            self._redraw()
        elif self.mode == "lines":
            self._print_line()

    def advance(self, count=1, note=None):
        """``count`` more items are done: :meth:`update` with ``done + count``."""
        self.update(self.done + count, note)

    def write(self, line):
        """Print ``line`` (a log line) on the stream, in any mode; on a terminal above the bar, redrawn under it."""
        if self.shown:
            self.stream.write(CLEAR)
        print(line, file=self.stream, flush=True)
        if self.shown:
            self._redraw(force=True)

    def close(self):
        """Erase the bar from the terminal; later updates show nothing. (Lines printed elsewhere stay.)"""
        if self.shown:
            self.stream.write(CLEAR)
            self.stream.flush()
            self.shown = ""
        self.mode = None

    def _redraw(self, force=False):
        """Draw the bar over the line, unless it was drawn less than INTERVAL ago (the first and the last state
        are always drawn)."""
        now = self.clock()
        recent = self.drawn_at is not None and now - self.drawn_at < self.INTERVAL
        if recent and not force and self.done < self.total:
            return
        self.drawn_at = now
        self.shown = self._bar_text(now, _columns(self.stream))
        self.stream.write(CLEAR + self.shown)
        self.stream.flush()

    def _print_line(self):
        """Print a line when another STEP per cent is done, and once when all are."""
        if self.ended:
            return
        step = self._percent() // self.STEP
        if self.done >= self.total:
            self.ended = True
        elif step <= self.logged:
            return
        self.logged = step
        print(self._line_text(self.clock()), file=self.stream, flush=True)

    def _percent(self):
        """Whole per cent done (rounded down: 100 only when all are)."""
        return 100 if self.total <= 0 else min(100, 100 * self.done // self.total)

    def _bar_text(self, now, columns=None):
        """``label [####......] done/total unit  rate  time left  note``, shorter than ``columns`` when given (a
        line that wraps cannot be redrawn in place): the bar narrowed down to a quarter, then the end cut."""
        details = "".join("  " + part for part in self._details(now))
        numbers = f"{self.done:,}/{self.total:,} {self.unit}"
        width = self.WIDTH
        if columns is not None:
            width = max(self.WIDTH // 4, min(width, columns - 1 - len(f"{self.label} [] {numbers}{details}")))
        filled = width if self.total <= 0 else min(width, width * self.done // self.total)
        line = f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {numbers}{details}"
        return line if columns is None else line[:columns - 1]

    def _line_text(self, now):
        """``label: P % (done of total unit), rate, time left, note``."""
        return (f"{self.label}: {self._percent()} % ({self.done:,} of {self.total:,} {self.unit})"
                + "".join(", " + part for part in self._details(now)))

    def _details(self, now):
        """The rate and time left (or taken, at the end) once known, then the note and the suffix's text."""
        elapsed, count = now - self.start, self.done - self.initial
        rate = count / elapsed if elapsed > 0 and count > 0 else None
        parts = [f"{format_rate(rate)} {self.unit}/s"] if rate else []
        if self.done >= self.total:
            parts.append(f"done in {format_duration(elapsed)}")
        elif rate:
            parts.append(f"{format_duration((self.total - self.done) / rate)} left")
        return parts + [text for text in (self.note, self.suffix() if self.suffix else None) if text]
