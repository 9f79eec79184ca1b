"""Signals that ask a training run to stop (docs/training.md#pre-emption and docs/training.md#ctrl-c): the ranks
agree to stop after the same step and write its checkpoint."""

import os
import signal
import threading
import time

import numpy as np


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a training run after a step, with its checkpoint (:class:`Signals`): raised once the run
    has ended cleanly, so that Python code around it (a script's loop over runs, a notebook, a test runner) stops
    as a Ctrl-C stops any Python code. ``result``: what the run returns otherwise (``Trainer.run``)."""

    def __init__(self, message, result):
        super().__init__(message)
        self.result = result


class Signals:
    """SIGTERM (Slurm's pre-emption signal, and what ``scancel`` and MPICH's ``mpiexec`` pass on), SIGUSR1 (what
    ``sbatch --signal`` is usually set to send ahead of a time limit, and what Open MPI's ``mpirun`` passes on)
    and SIGINT (Ctrl-C: a terminal sends it to the launcher and the ranks, and MPICH's ``mpiexec`` passes it on
    too) ask the run to stop: the handler notes the signal, and in each step the ranks agree whether any of them
    got one before the step's loss was summed (the flags ride on that sum), so that they all stop after the same
    step and write its checkpoint together, with no evaluation first. A second signal ends the run at once, unless
    it comes within ``DUPLICATE_S`` of the first: a rank may get one request twice at once (the scheduler or the
    terminal signals every process, and the launcher it also signalled passes it on), and that is still one
    request. A second Ctrl-C raises KeyboardInterrupt saying what stopping then loses (``lost()``); a second
    SIGTERM or SIGUSR1 ends the process as the signal would. A run a first Ctrl-C stopped raises
    :class:`Interrupted` once it has ended. ``say``: where the first Ctrl-C's notice goes (rank
    0's log). Outside the main thread nothing is installed."""

    NAMES = ("SIGTERM", "SIGUSR1", "SIGINT")
    WORDS = {"SIGTERM": "SIGTERM", "SIGUSR1": "SIGUSR1", "SIGINT": "Ctrl-C (SIGINT)"}
    DUPLICATE_S = 1.0

    def __init__(self, say=None, lost=None):
        self.got, self.previous, self.first_at = 0, {}, None
        self.say, self.lost = say, lost
        if threading.current_thread() is threading.main_thread():
            for name in self.NAMES:
                number = getattr(signal, name, None)
                if number is not None:
                    self.previous[number] = signal.signal(number, self._note)

    def _note(self, number, frame):
        if self.got:
            if time.monotonic() - self.first_at < self.DUPLICATE_S:
                return          # the same request delivered twice
            self.restore()      # a second request: the run did not stop in time
            if number == signal.SIGINT:
                raise KeyboardInterrupt(self.lost() if self.lost else "")
            os.kill(os.getpid(), number)        # end as the signal would
            return
        self.got, self.first_at = number, time.monotonic()
        if number == signal.SIGINT and self.say:
            self.say("Ctrl-C: stopping after this step, with a checkpoint (Ctrl-C again stops at once, losing the "
                     "steps since the last checkpoint)")

    def flags(self):
        """This rank's flags, one per signal of :attr:`NAMES` (float64): summed over the ranks with the step's loss
        (:meth:`Executor.forward`'s ``also``), which costs no meeting of its own."""
        return np.array([float(self.got == getattr(signal, name, None)) for name in self.NAMES])

    def received(self, flags):
        """The name of a signal some rank received, from the :meth:`flags` summed over the ranks (every rank gets
        the same answer), or None."""
        return next((name for name, flag in zip(self.NAMES, flags) if flag), None)

    def restore(self):
        for number, handler in self.previous.items():
            signal.signal(number, handler)
        self.previous = {}
