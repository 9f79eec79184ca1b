"""``spmdcnn`` with one rank slower than the others: ``python slow_rank.py RANK SECONDS spmdcnn-args...``.

Rank RANK sleeps SECONDS in the forward pass of every training step, as a rank on a slower or busier node runs: the
job must complete, and its log and metrics name that rank as the slowest.
"""

import sys
import time

from spmdcnn import cli
from spmdcnn.runtime import executor

RANK, SECONDS = int(sys.argv[1]), float(sys.argv[2])
_forward = executor.Executor.forward


def forward(self, *args, training=True, **keys):
    if training and self.world.rank == RANK:
        time.sleep(SECONDS)
    return _forward(self, *args, training=training, **keys)


executor.Executor.forward = forward
sys.exit(cli.main(sys.argv[3:]))
