"""Recording one training iteration as it runs, for ``spmdcnn bench --trace`` (docs/formats.md#trace-files).

While a step is traced, the executor notes each layer's exchange and kernel, forward and backward, and each update
of a slice of the parameters on the compute lane; the world's counters note every allreduce (gradient buckets from
start to completion, batch norm's gathers and sums, the loss's sum), which go on the communication lane. Times
are seconds from the step's start on each rank; the step starts after a barrier, so the ranks' clocks line up to
within the barrier's skew.
"""

from time import perf_counter

from ..io.trace import Event

_SYNC_KINDS = {"gradients": "allreduce", "batchnorm": "batchnorm", "loss": "loss"}


class Tracer:
    """The events of one rank's traced step, from ``origin`` (a ``perf_counter`` time)."""

    def __init__(self, rank, origin):
        self.rank, self.origin = rank, origin
        self.events = []

    def span(self, name, kind, started, lane="compute"):
        """An event of ``kind`` from ``started`` until now."""
        self.events.append(Event(name, kind, self.rank, lane, started - self.origin, perf_counter() - self.origin))

    def timed(self, function, kind):
        """``function(start, stop)`` (an update of a slice of the parameters), each call an event."""
        def call(start, stop):
            started = perf_counter()
            function(start, stop)
            self.span(f"[{start}, {stop})", kind, started)
        return call

    def communication(self, counters, end):
        """The allreduces ``counters`` recorded from the origin to ``end`` on the communication lane."""
        for start, stop, what in counters.intervals:
            if start >= self.origin and stop <= end:
                self.events.append(Event(what, _SYNC_KINDS.get(what, "allreduce"), self.rank, "communication",
                                         start - self.origin, stop - self.origin))


def traced_step(run, executor, world):
    """Run ``run()`` (one training step of ``executor``) traced: this rank's events."""
    tracer = Tracer(world.rank, perf_counter())
    executor.trace = tracer
    try:
        run()
    finally:
        executor.trace = None
    tracer.communication(world.counters, perf_counter())
    return tracer.events
