"""``spmdcnn`` whose checkpoint write fails on rank 0 (a full disk, say): ``python fail_checkpoint_write.py ARGS``.

Only rank 0 writes; every rank must learn of the failure and stop with one message, not wait for rank 0.
"""

import sys

from spmdcnn import cli
from spmdcnn.runtime import train


def save_checkpoint(path, **arrays):
    raise OSError(28, "No space left on device")


train.save_checkpoint = save_checkpoint
sys.exit(cli.main(sys.argv[1:]))
