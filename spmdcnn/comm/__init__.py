"""Communication between ranks: the only package that imports mpi4py (docs/architecture.md#communication).

- :class:`World` wraps the communicator: timing and byte counters, reductions, agreement checks.
- :class:`Exchange` moves the boxes between one layer's producers and its tiles, and back (adjoint, summed).
- :class:`ReplicaGroups` makes the sub-communicators of ranks that share a parameter shard or batchnorm channels.
- :mod:`.transport` moves the bytes: host staging, CUDA-aware MPI or NCCL (``choose`` picks one).
- :mod:`.guard` turns an exception on one rank into the end of the whole job, with that rank's message.
"""

from .errors import CollectiveError
from .exchange import Exchange
from .groups import ReplicaGroups
from .transport import choose as choose_transport
from .world import World

__all__ = ["CollectiveError", "Exchange", "ReplicaGroups", "World", "choose_transport"]
