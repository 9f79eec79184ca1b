"""``spmdcnn`` with one rank stopped (SIGSTOP) at a given place: ``python stall_one_rank.py RANK KIND NOTE STEP
spmdcnn-args...``.

Rank RANK stops itself, as a rank stuck in a hung file system read, a wedged GPU or a lost node looks to the others,
when its watchdog board (comm/watchdog.py) first says KIND (``forward``, ``gradients``, ``checkpoint``, ...) with a
note starting with NOTE (``-``: any) at step STEP or later (``-``: any step), or, with KIND ``writing``, halfway
through writing checkpoint file number NOTE (its parameters written, the rest not; rank 0 writes them): the job
must end with the watchdog's message naming it.
"""

import os
import signal
import sys
import time

from spmdcnn import cli
from spmdcnn.comm import watchdog
from spmdcnn.io import checkpoint

RANK, KIND, NOTE, STEP = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
_at, _note, _stage = watchdog.Board.at, watchdog.Board.note, watchdog.Board.stage
_stopped, _written = [], []
SETTLE_S = 2.0          # beats of the watchdog (at most a second each) before the rank stops


def _stop_here(board):
    _, _, step, kind, _, note, _, _ = board.where
    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
    if (rank == RANK and not _stopped and kind == KIND and (NOTE == "-" or (note or "").startswith(NOTE))
            and (STEP == "-" or (step is not None and step >= int(STEP)))):
        _stopped.append(True)
        time.sleep(SETTLE_S)        # hangs there long enough for its watchdog to send where it is, then stops
        print(f"stall_one_rank: rank {rank} stops at {board.where[2:6]} at {time.time():.3f}", file=sys.stderr,
              flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)


def at(self, *args, **keys):
    _at(self, *args, **keys)
    _stop_here(self)


def note(self, *args, **keys):
    _note(self, *args, **keys)
    _stop_here(self)


def stage(self, *args, **keys):
    _stage(self, *args, **keys)
    _stop_here(self)


def write_group(group, arrays):
    _write_group(group, arrays)
    _written.append(group.name)
    if KIND == "writing" and not _stopped and _written.count("/params") == int(NOTE):
        group.file.flush()
        time.sleep(SETTLE_S)
        _stopped.append(True)
        print(f"stall_one_rank: stops halfway through writing a checkpoint at {time.time():.3f}", file=sys.stderr,
              flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)


_write_group = checkpoint._write_group
watchdog.Board.at, watchdog.Board.note, watchdog.Board.stage = at, note, stage
checkpoint._write_group = write_group
sys.exit(cli.main(sys.argv[5:]))
