"""``spmdcnn`` with a failure injected on one rank: ``python fail_on_one_rank.py RANK EXCEPTION spmdcnn-args...``.

Rank RANK raises EXCEPTION (a builtin exception's name) in the backward pass of step 2 while the other ranks go on
into the next collective: the job must end with that rank's message instead of hanging.
"""

import builtins
import sys

from spmdcnn import cli
from spmdcnn.runtime import executor

RANK, EXCEPTION = int(sys.argv[1]), getattr(builtins, sys.argv[2])
_forward, _backward = executor.Executor.forward, executor.Executor.backward


def forward(self, *args, step=0, **keys):
    self.injected_step = step
    return _forward(self, *args, step=step, **keys)


def backward(self, keep=(), update=None):
    if self.world.rank == RANK and self.injected_step == 1:
        raise EXCEPTION(f"injected failure on rank {RANK}")
    return _backward(self, keep, update)


executor.Executor.forward, executor.Executor.backward = forward, backward
sys.exit(cli.main(sys.argv[3:]))
