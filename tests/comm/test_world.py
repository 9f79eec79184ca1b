"""The world (comm/world.py) in one process: the one-rank world a process started alone gets, whether a launcher
started this process, and the collective checks, against a stand-in communicator of several ranks."""

import numpy as np
import pytest

from fake_mpi import FakeComm, FakeMPI
from spmdcnn import comm
from spmdcnn.comm import errors, world as world_module
from spmdcnn.comm.transport import HostTransport
from spmdcnn.comm.world import World, launched, slurm_tasks


def _raising(error):
    def fail():
        raise error
    return fail


@pytest.fixture
def no_launcher(monkeypatch):
    for variable in world_module.LAUNCHER_VARIABLES + ("SPMDCNN_MPI", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


class Recording(HostTransport):
    """Notes the communicators it is attached to and reduces over, and whether it was closed."""

    name = "recording"

    def __init__(self):
        self.attached, self.reduced, self.closed = [], [], False

    def attach(self, comm):
        self.attached.append(comm)

    def allreduce(self, array, comm):
        self.reduced.append((comm, array.flags.c_contiguous))
        array *= comm.Get_size()
        return array

    def close(self):
        self.closed = True


def test_a_process_started_alone_is_a_world_of_one_rank(no_launcher):
    assert not launched() and slurm_tasks() == 1
    world = World.create()
    assert world.comm is None and (world.rank, world.size) == (0, 1)
    assert isinstance(world.transport, HostTransport)
    array = np.arange(3.0)
    assert world.allreduce(array) is array and list(array) == [0.0, 1.0, 2.0]
    assert world.counters.sync_s == 0 and world.counters.bytes_synced == 0
    assert world.sum_scalars(1.5, 2) == (1.5, 2.0)
    assert world.bcast({"a": 1}) == {"a": 1} and world.gather(4) == [4] and world.allgather(5) == [5]
    assert world.bcast_array(array) is array
    world.barrier()
    world.check_same({"plan": "text"})


def test_one_rank_lets_errors_pass_unchanged():
    with pytest.raises(ValueError, match="^bad value$"):
        World(None).agree(_raising(ValueError("bad value")))
    assert World(None).agree(lambda: 7) == 7


def test_the_launcher_is_recognised_from_the_environment(no_launcher):
    no_launcher.setenv("PMI_RANK", "0")
    assert launched()
    no_launcher.setenv("SPMDCNN_MPI", "0")
    assert not launched()
    no_launcher.delenv("PMI_RANK")
    no_launcher.setenv("SPMDCNN_MPI", "1")
    assert launched()
    no_launcher.delenv("SPMDCNN_MPI")
    no_launcher.setenv("SLURM_STEP_NUM_TASKS", "4")
    assert slurm_tasks() == 4 and launched()
    no_launcher.setenv("SLURM_STEP_NUM_TASKS", "four")
    assert slurm_tasks() == 1 and not launched()


def test_srun_tasks_that_each_see_one_rank_are_refused(no_launcher):
    no_launcher.setenv("SLURM_STEP_NUM_TASKS", "4")
    no_launcher.setattr(world_module, "mpi", FakeMPI(FakeComm(size=1)))
    with pytest.raises(RuntimeError, match="srun started 4 tasks but MPI sees one rank in each"):
        World.create()


def test_the_node_index_of_a_lone_process_is_the_launchers(no_launcher):
    from spmdcnn.backend import _LOCAL_RANK_VARIABLES
    for variable in _LOCAL_RANK_VARIABLES:
        no_launcher.delenv(variable, raising=False)
    no_launcher.setenv("SLURM_LOCALID", "3")
    assert World(None).node_ranks() == (3, 1) and World(None).local_rank() == 3


def test_one_failing_rank_fails_every_rank_with_its_message():
    def rank_1_fails(message):
        return [message, "disk full"]
    world = World(FakeComm(rank=0, size=2, gathered=rank_1_fails))
    with pytest.raises(errors.CollectiveError, match=r"^disk full \(on rank 1\)$"):
        world.agree(lambda: 1)


def test_every_rank_failing_names_no_rank():
    world = World(FakeComm(rank=1, size=2))
    with pytest.raises(errors.CollectiveError, match="^no such file$") as caught:
        world.agree(_raising(FileNotFoundError("no such file")))
    assert isinstance(caught.value.__cause__, FileNotFoundError)


def test_errors_agree_does_not_catch_reach_the_guard_unchanged():
    """A KeyError is a bug, not a setup problem: it is not gathered (the guard aborts the job on it)."""
    comm = FakeComm(size=2, gathered=lambda obj: pytest.fail("gathered"))
    with pytest.raises(KeyError):
        World(comm).agree(_raising(KeyError("missing")))


def test_ranks_holding_different_files_are_told_which():
    def rank_1_differs(digests):
        return [digests, {**digests, "plan": "another digest"}]
    world = World(FakeComm(size=2, gathered=rank_1_differs))
    with pytest.raises(errors.CollectiveError, match=r"the ranks do not hold the same plan: rank 1 differs from "
                                                     r"rank 0 \(1 of 2 ranks differ\)"):
        world.check_same({"model": "m", "plan": "p"})
    World(FakeComm(size=2)).check_same({"model": "m", "plan": "p"})


def test_allreduce_goes_through_the_transport_and_is_counted():
    fake = FakeComm(size=2)
    world = World(fake)
    world.transport, transport = Recording(), Recording()
    old = world.transport
    world.subcomms = {(0, 1): "sub", (1, 2): None}
    world.use(transport)
    assert old.closed and world.transport is transport and transport.attached == [fake, "sub"]
    array = np.ones(4)
    assert world.allreduce(array) is array and list(array) == [2.0] * 4
    assert transport.reduced == [(fake, True)] and not old.reduced
    assert world.counters.bytes_synced == array.nbytes
    world.reset()
    assert world.counters.bytes_synced == 0


def test_the_collective_error_has_one_home_and_the_old_names():
    assert comm.CollectiveError is errors.CollectiveError is world_module.CollectiveError
    assert issubclass(errors.CollectiveError, RuntimeError) and errors.CollectiveError.collective


def test_the_allreduce_time_is_the_union_and_a_long_run_keeps_little():
    from spmdcnn.comm.world import Counters
    counters = Counters()
    counters.busy(0.0, 4.0, "gradients")
    counters.busy(1.0, 2.0, "batchnorm")        # inside the bucket's flight: counted once
    counters.busy(5.0, 6.0, "loss")
    assert counters.sync_s == pytest.approx(5.0)
    for k in range(3 * Counters.KEEP):          # training never resets the counters
        counters.busy(10.0 + 2 * k, 11.0 + 2 * k)
    assert len(counters.intervals) <= Counters.KEEP
    assert counters.sync_s == pytest.approx(5.0 + 3 * Counters.KEEP)
