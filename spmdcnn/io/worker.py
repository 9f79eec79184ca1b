"""The program a worker process runs (``python -m spmdcnn.io.worker FD PARENT``; :mod:`spmdcnn.io.workers`).

It reads its setup ``(module, function, kwargs)`` from the connection on descriptor ``FD``, makes its handler
``function(**kwargs)``, and answers each message with ``("ok", handler(message))`` or ``("error", text)``, in
order, until the message None (answered with ``("closed", peak resident bytes)``) or the connection's end. On
Linux the kernel also ends the worker when its parent (pid PARENT) dies, however it dies.
"""

import ctypes
import importlib
import os
import resource
import signal
import sys
from multiprocessing.connection import Connection

PEAK_UNIT = 1 if sys.platform == "darwin" else 1024     # ru_maxrss: bytes on macOS, kilobytes on Linux


def peak_bytes():
    """This process's peak resident memory: Linux's VmHWM (its own since the exec; ru_maxrss would also count the
    parent it was spawned from, kept across exec), else ru_maxrss."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * PEAK_UNIT


def _describe(error):
    text = str(error)
    return text if type(error).__name__.endswith("Error") and text else f"{type(error).__name__}: {text}"


def _end_with_parent(parent):
    """Have the kernel send SIGKILL when the parent dies (Linux's PR_SET_PDEATHSIG); end now if it has already."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)     # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):       # not Linux: the connection's end still stops the worker
        return
    if os.getppid() != parent:
        os._exit(0)


def main(argv):
    if len(argv) > 2:
        _end_with_parent(int(argv[2]))
    for name in ("SIGINT", "SIGTERM", "SIGUSR1"):      # the parent decides when to stop
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    connection = Connection(int(argv[1]))
    try:
        module, function, kwargs = connection.recv()
        handler = getattr(importlib.import_module(module), function)(**kwargs)
    except EOFError:
        return 0
    except Exception as error:          # reported at the parent's first receive
        connection.send(("error", _describe(error)))
        return 1
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):     # the parent ended
            return 0
        if message is None:
            connection.send(("closed", peak_bytes()))
            return 0
        try:
            answer = ("ok", handler(message))
        except Exception as error:
            answer = ("error", _describe(error))
        try:
            connection.send(answer)
        except OSError:
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
