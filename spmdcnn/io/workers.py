"""Worker processes that read and decode data beside a rank (:mod:`spmdcnn.io.prefetch`, ``data convert``).

A worker is a fresh interpreter running :mod:`spmdcnn.io.worker`, started with :mod:`subprocess` and talking to
its parent over a socket pair (:class:`multiprocessing.connection.Connection`); shared memory is passed to it as a
file descriptor (:class:`SharedBuffer`). Not :mod:`multiprocessing`'s own processes: a rank has initialised MPI,
after which ``fork`` is unsafe (MPI libraries keep threads, pinned memory and network state a child must not
touch), and the ``spawn`` and ``forkserver`` methods run the parent's main module again in the child, which under
``mpiexec`` would initialise MPI there too. A worker imports only NumPy, h5py (or Pillow) and ``spmdcnn.io``.

A worker never hangs its parent: :meth:`Worker.receive` waits in short polls, and a worker that died (killed,
out of memory) or that sent nothing within the timeout is a :class:`WorkerError` naming what it was doing. A
worker ends when its parent closes the connection, or when the parent dies (the connection reaches its end), and
ignores the signals that ask the parent to stop (SIGINT, SIGTERM, SIGUSR1): the parent decides when it is done.
"""

import mmap
import os
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_connections

from .yamlfile import FormatError

POLL_S = 0.1            # how often a waiting parent checks that its worker is alive
CLOSE_GRACE_S = 5.0     # how long a closing worker may take to finish before it is killed
KILLED_WAIT_S = 2.0     # how long a killed worker is waited for (one stuck in the kernel is left)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))    # holds spmdcnn/


class WorkerError(FormatError):
    """A worker failed, died or fell silent; the message names the worker and what it was reading."""


def _environment():
    """The worker's environment: the parent's, one BLAS/OpenMP thread (a worker copies and converts; it does no
    matrix products), and spmdcnn importable from where the parent imported it: a source tree the parent had on its
    path is put on the worker's (an installed package's folder is not: ahead of the standard library it could
    shadow it)."""
    env = dict(os.environ)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[variable] = "1"
    installed = {os.path.realpath(path) for path in (sysconfig.get_paths()["purelib"],
                                                     sysconfig.get_paths()["platlib"], *_site_folders())}
    if os.path.realpath(_ROOT) not in installed:
        env["PYTHONPATH"] = os.pathsep.join([_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _site_folders():
    try:
        return site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:      # an old virtualenv's site module
        return []


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class Worker:
    """One worker process: ``setup`` ``(module, function, kwargs)`` makes its handler (``function(**kwargs)``,
    in the worker), which then answers every message :meth:`send` gives it, in order. ``fds``: file descriptors
    the worker inherits (shared memory); ``what``: what it does, for messages (``data worker 1 of 2 reading
    data/train.h5``)."""

    def __init__(self, setup, what, fds=()):
        self.what = what
        parent, child = socket.socketpair()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "spmdcnn.io.worker", str(child.fileno()), str(os.getpid())],
                pass_fds=(child.fileno(),) + tuple(fds), env=_environment(), stdin=subprocess.DEVNULL)
        except OSError as error:
            parent.close()
            raise WorkerError(f"{what}: cannot start the process: {error}") from None
        finally:
            child.close()
        self.connection = Connection(parent.detach())
        try:
            self.send(setup)            # answered only by an error, at the first receive
        except WorkerError:
            close_all([self], grace=0)
            raise

    @property
    def pid(self):
        return self.process.pid

    def send(self, message):
        try:
            self.connection.send(message)
        except OSError:
            raise self._dead() from None

    def receive(self, timeout, stalled="a worker that takes longer may be stuck"):
        """The answer to the oldest message not yet answered; WorkerError if the worker reported an error, died,
        or sent nothing within ``timeout`` seconds (the message then ends with ``stalled``: what to do)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.connection.poll(POLL_S):
                return self._answer()
            if self.process.poll() is not None:
                raise self._dead()
            if time.monotonic() > deadline:
                raise WorkerError(f"{self.what}: nothing read in {timeout:g} s (the file system is slow or stuck, "
                                  f"or the worker hangs; pid {self.pid}): {stalled}")

    def _answer(self):
        try:
            kind, value = self.connection.recv()
        except (EOFError, OSError):
            raise self._dead() from None
        if kind == "error":
            raise WorkerError(f"{self.what}: {value}")
        return value

    def _dead(self):
        """The error of a worker that ended: what it said last (an error at its setup) if it said anything, else
        how it ended."""
        try:
            kind, value = self.connection.recv() if self.connection.poll(0) else (None, None)
        except (EOFError, OSError):
            kind = value = None
        if kind == "error":
            return WorkerError(f"{self.what}: {value}")
        try:
            code = self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return WorkerError(f"{self.what}: the worker (pid {self.pid}) closed its connection")
        how = (f"was killed by {_signal_name(-code)}"
               + (" (out of memory, or killed by hand?)" if -code == signal.SIGKILL else "")
               if code < 0 else f"exited with status {code}")
        return WorkerError(f"{self.what}: the worker (pid {self.pid}) {how}")


def close_all(workers, grace=CLOSE_GRACE_S):
    """End ``workers`` together: each is asked to end and may finish the reads it has queued for ``grace``
    seconds in all (0: killed at once, after an error), then is killed. Returns the peak resident bytes of those
    that said. A killed worker stuck in the kernel (a hung network file system) is left after KILLED_WAIT_S: the
    rank ends without waiting for it."""
    peaks, waiting = [], []
    for worker in workers:
        try:
            if grace > 0:
                worker.connection.send(None)
                waiting.append(worker)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while waiting and time.monotonic() < deadline:
        ready = wait_connections([w.connection for w in waiting], timeout=POLL_S)
        for worker in [w for w in waiting if w.connection in ready]:
            try:
                kind, value = worker.connection.recv()
            except (EOFError, OSError):
                kind, value = "closed", None
            if kind == "closed":
                waiting.remove(worker)
                if value:
                    peaks.append(value)
    for worker in workers:
        worker.connection.close()
    end = time.monotonic() + (min(1.0, grace) if grace > 0 else 0)     # those that said goodbye are ending
    for worker in workers:
        try:
            worker.process.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.process.kill()
    end = time.monotonic() + KILLED_WAIT_S            # one wait for them all
    for worker in workers:
        try:
            worker.process.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    return peaks


class SharedBuffer:
    """``nbytes`` of memory shared with worker processes: an anonymous file (``memfd`` on Linux, an unlinked
    temporary file elsewhere) mapped here; a worker maps the same file from the descriptor it inherits
    (:func:`attach`). Nothing is left behind when the processes end."""

    def __init__(self, nbytes):
        self.nbytes = max(1, int(nbytes))
        if hasattr(os, "memfd_create"):
            self.fd = os.memfd_create("spmdcnn-prefetch")
        else:
            handle, path = tempfile.mkstemp(prefix="spmdcnn-prefetch-")
            os.unlink(path)
            self.fd = handle
        try:
            os.ftruncate(self.fd, self.nbytes)
            self.map = mmap.mmap(self.fd, self.nbytes)
        except OSError:
            os.close(self.fd)
            raise

    def close(self):
        try:
            self.map.close()
        except BufferError:     # arrays still view it (a batch the caller holds): unmapped when they go
            pass
        os.close(self.fd)


def attach(fd, nbytes):
    """In a worker: the shared memory of the descriptor ``fd`` (:class:`SharedBuffer`)."""
    return mmap.mmap(fd, nbytes)
