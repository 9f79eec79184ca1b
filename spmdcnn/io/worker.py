"""The program a worker process runs (``python -m spmdcnn.io.worker FD``; :mod:`spmdcnn.io.workers`).

It reads its setup ``(module, function, kwargs)`` from the connection on descriptor ``FD``, makes its handler
``function(**kwargs)``, and answers each message with ``("ok", handler(message))`` or ``("error", text)``, in
order, until the message None (answered with ``("closed", peak resident bytes)``) or the connection's end.
"""

import importlib
import resource
import signal
import sys
from multiprocessing.connection import Connection


def _describe(error):
    text = str(error)
    return text if type(error).__name__.endswith("Error") and text else f"{type(error).__name__}: {text}"


def main(argv):
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
            connection.send(("closed", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
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
