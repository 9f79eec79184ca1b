"""Ending a job cleanly when something fails on some rank.

An error every rank raises at the same point (marked ``collective``: setup problems found by
:meth:`World.agree`, a different plan on some rank, a non-finite loss) is printed once, by rank 0, and every
rank exits with status 2. Any other error may leave the other ranks waiting for a message that will never
come, so the failing rank prints its message with its rank and calls ``MPI_Abort``, which ends every process of
the job: ``mpiexec`` exits non-zero within seconds instead of hanging.
"""

import sys
import time

from .world import launched, mpi

ABORT_GRACE_S = 0.5     # between printing a rank's message and MPI_Abort (without it a full test run here once lost the message)
POLL_S = 0.05           # how often a rank waiting for rank 0's serial command looks for its status
_STATUS_TAG = 7201      # the message that carries a serial command's exit status


def world_size():
    """The number of ranks of this job (1 without an MPI launcher), without initialising MPI needlessly."""
    return mpi().COMM_WORLD.Get_size() if launched() else 1


def fail(message, error, status=2):
    """Report ``message`` for ``error`` and end the job (returns ``status`` when the process may just exit)."""
    if not launched() or world_size() == 1:
        print(message, file=sys.stderr, flush=True)
        return status
    comm = mpi().COMM_WORLD
    if getattr(error, "collective", False):
        if comm.Get_rank() == 0:
            print(message, file=sys.stderr, flush=True)
        return status
    print(message.replace("spmdcnn: error:", f"spmdcnn: error: rank {comm.Get_rank()}:", 1), file=sys.stderr,
          flush=True)
    sys.stdout.flush()
    time.sleep(ABORT_GRACE_S)       # the launcher forwards output through its proxies: let it pass before the kill
    comm.Abort(status)
    return status


def serial(run):
    """Run ``run()`` (a command that needs no other rank; it returns an exit status and reports its own errors) on
    rank 0 alone: under ``mpiexec -n K`` the command prints once, and every rank exits with rank 0's status,
    without MPI_Abort. The other ranks wait for that status without spinning on the cores rank 0 works on."""
    if not launched() or world_size() == 1:
        return run()
    comm = mpi().COMM_WORLD
    if comm.Get_rank() == 0:
        status = 1
        try:
            status = run()
        finally:
            requests = [comm.isend(status, dest=rank, tag=_STATUS_TAG) for rank in range(1, comm.Get_size())]
            mpi().Request.waitall(requests)
        return status
    request = comm.irecv(source=0, tag=_STATUS_TAG)
    while True:
        done, status = request.test()
        if done:
            return status
        time.sleep(POLL_S)
