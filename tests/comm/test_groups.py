"""Replica groups (comm/groups.py) in one process: which sub-communicators rank 1 of 3 makes, in which order,
that it keeps them for the next executor, and how it reduces over them (a stand-in communicator and transport).
tests/mpi/test_adjoint.py checks the sums on real ranks."""

import numpy as np
import pytest

from fake_mpi import FakeComm, FakeMPI
from spmdcnn.comm import ReplicaGroups, World, groups
from spmdcnn.comm.transport import HostTransport


class Recording(HostTransport):
    def __init__(self):
        self.attached, self.reduced = [], []

    def attach(self, comm):
        self.attached.append(comm)

    def allreduce(self, array, comm):
        self.reduced.append((comm, array.flags.c_contiguous))
        return array


@pytest.fixture
def rank_1_of_3(monkeypatch):
    monkeypatch.setattr(groups, "mpi", FakeMPI())
    world = World(FakeComm(rank=1, size=3))
    world.transport = Recording()
    return world


def test_one_sub_communicator_per_distinct_set_in_the_same_order_everywhere(rank_1_of_3):
    world = rank_1_of_3
    made = ReplicaGroups(world, [(2, 1), (0, 1, 2), (1,), (0, 2), (1, 2)])
    assert world.comm.splits == [(0, 1), (FakeMPI.UNDEFINED, 1), (0, 1)]      # (0, 1, 2), (0, 2), (1, 2)
    assert sorted(made.comms) == [(0, 1, 2), (1, 2)]
    assert world.subcomms[(0, 2)] is None
    lanes = world.lanecomms
    assert sorted(lanes) == [(0, 1, 2), (1, 2)] and not set(lanes.values()) & set(made.comms.values())
    assert world.transport.attached == [made.comms[(0, 1, 2)], lanes[(0, 1, 2)], made.comms[(1, 2)], lanes[(1, 2)]]


def test_the_next_executor_reuses_the_sub_communicators(rank_1_of_3):
    world = rank_1_of_3
    first = ReplicaGroups(world, [(0, 1, 2), (1, 2)])
    again = ReplicaGroups(world, [(1, 2)])
    assert len(world.comm.splits) == 2 and again.comms[(1, 2)] is first.comms[(1, 2)]


def test_a_group_of_one_needs_no_reduction(rank_1_of_3):
    array = np.arange(4.0)
    assert ReplicaGroups(rank_1_of_3, [(1,)]).allreduce((1,), array) is array
    assert rank_1_of_3.transport.reduced == []


def test_reducing_over_a_group_goes_through_the_worlds_transport(rank_1_of_3):
    world = rank_1_of_3
    made = ReplicaGroups(world, [(1, 2)])
    reduce = made.reducer((2, 1))
    strided = np.arange(8.0)[::2]
    reduced = reduce(strided)
    assert world.transport.reduced == [(made.comms[(1, 2)], True)]        # a contiguous copy of a strided array
    assert reduced is not strided and list(reduced) == [0.0, 2.0, 4.0, 6.0]
    assert world.counters.bytes_synced == strided.nbytes


def test_a_group_without_this_rank_is_an_error(rank_1_of_3):
    made = ReplicaGroups(rank_1_of_3, [(0, 2)])
    with pytest.raises(ValueError, match=r"rank 1 is not in the replica group \[0, 2\]"):
        made.reducer((2, 0))
