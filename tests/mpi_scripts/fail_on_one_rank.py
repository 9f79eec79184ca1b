"""``spmdcnn`` with a failure injected on one rank: ``python fail_on_one_rank.py RANK EXCEPTION spmdcnn-args...``.

Rank RANK raises EXCEPTION (a builtin exception's name) in the backward pass of step 2 while the other ranks go on
into the next collective: the job must end with that rank's message instead of hanging.
"""

import builtins
import sys

from spmdcnn import cli
from spmdcnn.runtime import executor

RANK, EXCEPTION = int(sys.argv[1]), getattr(builtins, sys.argv[2])
_backward = executor.Executor.backward


def backward(self, keep=()):
    if self.world.rank == RANK and self.step == 1:
        raise EXCEPTION(f"injected failure on rank {RANK}")
    return _backward(self, keep)


executor.Executor.backward = backward
sys.exit(cli.main(sys.argv[3:]))
