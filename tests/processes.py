"""The processes of this machine, from /proc (Linux): what the tests that kill ranks and data workers look for."""

import os
import signal
import time


def process_table():
    """``{pid: (parent pid, state letter, command line)}`` of every process that can be read."""
    table = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:                 # ended meanwhile
            continue
        table[int(entry)] = (int(fields[1]), fields[0], command)
    return table


def data_workers(parents):
    """The pids of the data workers (``spmdcnn.io.worker``) whose parent is one of ``parents``."""
    return [pid for pid, (parent, _, command) in process_table().items()
            if parent in parents and "spmdcnn.io.worker" in command]


def running(pid):
    """Whether process ``pid`` exists and has not ended (a zombie, dead but not yet reaped by init, has)."""
    found = process_table().get(pid)
    return found is not None and found[1] != "Z"


def kill_a_data_worker(process, workers_of, count, which, within):
    """Wait for ``process`` (a training run with text pipes) to log its first step, SIGKILL data worker ``which``
    of the ``count`` that ``workers_of()`` finds, and return the run's standard error once it has ended, which
    must be within ``within`` seconds of the kill (the process is killed in any case)."""
    try:
        while not process.stdout.readline().startswith("step"):
            assert process.poll() is None, process.stderr.read()
        workers = workers_of()
        assert len(workers) == count, workers
        os.kill(workers[which], signal.SIGKILL)
        killed = time.monotonic()
        _, err = process.communicate(timeout=within + 30)
        assert time.monotonic() - killed < within
    finally:
        process.kill()
        process.wait()
    return err
