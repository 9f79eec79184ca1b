"""Sub-communicators of replica groups: the ranks holding the same parameter shard (or batchnorm channels).

They are made in the same order on every rank (``Split`` is collective over the world), one per distinct set of
ranks, and kept by the world: executors built one after the other (tests, benchmarks, a planner trying plans)
reuse them instead of using up MPI's communicator ids. A set of one rank needs none.
"""

from .world import mpi


class ReplicaGroups:
    def __init__(self, world, rank_sets):
        """``rank_sets``: tuples of ranks, the same collection on every rank."""
        self.world = world
        self.comms = {}
        made = world.subcomms
        for ranks in sorted({tuple(sorted(r)) for r in rank_sets if len(r) > 1}):
            if ranks not in made:
                member = world.rank in ranks
                sub = world.comm.Split(0 if member else mpi().UNDEFINED, key=world.rank)
                made[ranks] = sub if member else None
                if member:
                    world.transport.attach(sub)
                    # a twin for the gradient buckets, whose allreduces may run on the communication thread
                    # while batchnorm sums on the group's own (collectives of two threads must not share one)
                    world.lanecomms[ranks] = sub.Dup()
                    world.transport.attach(world.lanecomms[ranks])
            if made[ranks] is not None:
                self.comms[ranks] = made[ranks]

    def reducer(self, ranks):
        """A function summing an array over the group ``ranks`` (which holds this rank); the identity for one."""
        ranks = tuple(sorted(ranks))
        if len(ranks) < 2:
            return _identity
        if ranks not in self.comms:
            raise ValueError(f"rank {self.world.rank} is not in the replica group {list(ranks)}")
        comm = self.comms[ranks]
        world = self.world

        def reduce(array):
            return world.allreduce(array if array.flags.c_contiguous else array.copy(), comm, "batchnorm")
        return reduce

    def gatherer(self, ranks):
        """A function stacking an array of every rank of the group ``ranks`` in rank order (``(len(ranks),) +
        shape``); for one rank, the array with a leading axis of one."""
        ranks = tuple(sorted(ranks))
        if len(ranks) < 2:
            return _alone
        if ranks not in self.comms:
            raise ValueError(f"rank {self.world.rank} is not in the replica group {list(ranks)}")
        comm, world = self.comms[ranks], self.world
        return lambda array: world.allgather_array(array, comm)

    def starter(self, ranks):
        """A function starting the sum of a contiguous array over the group ``ranks`` (which holds this rank, with
        at least one other) without waiting: it returns the :class:`~spmdcnn.comm.world.InFlight`."""
        ranks = tuple(sorted(ranks))
        if ranks not in self.comms:
            raise ValueError(f"rank {self.world.rank} is not in the replica group {list(ranks)}")
        comm, world = self.world.lanecomms[ranks], self.world
        return lambda array: world.start_allreduce(array, comm)

    def server(self, ranks, nodes, index):
        """A function summing a contiguous array over the group ``ranks`` (which holds this rank, with at least one
        other) through its parameter server (:mod:`.server`; ``nodes``: the node of every rank of the world,
        :meth:`~spmdcnn.comm.world.World.node_ids`; ``index``: this sum's place among the group's, the same on
        every member): it pushes the array, waiting, and returns the pull of the sum as a
        :class:`~spmdcnn.comm.world.Served` to test and wait on."""
        ranks = tuple(sorted(ranks))
        if ranks not in self.comms:
            raise ValueError(f"rank {self.world.rank} is not in the replica group {list(ranks)}")
        comm, world, members = self.comms[ranks], self.world, [nodes[rank] for rank in ranks]
        return lambda array: world.serve(array, comm, members, index)

    def allreduce(self, ranks, array):
        """Sum the contiguous ``array`` over the group ``ranks`` in place."""
        return self.reducer(ranks)(array)


def _identity(array):
    return array


def _alone(array):
    return array[None]
