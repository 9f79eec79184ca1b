"""The guard (comm/guard.py) in one process: alone it prints and returns; as one rank of several (a stand-in
MPI) it prints a collective error once, aborts the job on any other, and shares a serial command's status.
tests/test_mpi.py runs the same under mpiexec."""

import pytest

from fake_mpi import FakeComm, FakeMPI
from spmdcnn.comm import guard
from spmdcnn.comm.errors import CollectiveError


@pytest.fixture
def alone(monkeypatch):
    monkeypatch.setenv("SPMDCNN_MPI", "0")


def ranks(monkeypatch, rank, size=3, polls=()):
    """This process as rank ``rank`` of ``size`` (the MPI module a stand-in); returns its communicator."""
    comm = FakeComm(rank=rank, size=size, polls=polls)
    mpi = FakeMPI(comm)
    monkeypatch.setattr(guard, "launched", lambda: True)
    monkeypatch.setattr(guard, "mpi", mpi)
    monkeypatch.setattr(guard, "ABORT_GRACE_S", 0)
    monkeypatch.setattr(guard, "POLL_S", 0)
    return comm, mpi


def test_alone_an_error_is_printed_and_its_status_returned(alone, capsys):
    assert guard.world_size() == 1
    assert guard.fail("spmdcnn: error: boom", RuntimeError("boom")) == 2
    assert guard.fail("spmdcnn: error: usage", ValueError("usage"), status=1) == 1
    assert capsys.readouterr().err == "spmdcnn: error: boom\nspmdcnn: error: usage\n"


def test_alone_a_serial_command_just_runs(alone):
    calls = []
    assert guard.serial(lambda: calls.append(1) or 5) == 5
    assert calls == [1]


def test_any_other_error_aborts_the_job_with_the_ranks_message(monkeypatch, capsys):
    comm, _ = ranks(monkeypatch, rank=1)
    assert guard.world_size() == 3
    assert guard.fail("spmdcnn: error: boom", KeyError("boom")) == 2
    assert comm.aborted == 2
    assert capsys.readouterr().err == "spmdcnn: error: rank 1: boom\n"


@pytest.mark.parametrize("rank,printed", [(0, "spmdcnn: error: the plans differ\n"), (1, "")])
def test_a_collective_error_is_printed_once_without_abort(monkeypatch, capsys, rank, printed):
    comm, _ = ranks(monkeypatch, rank=rank)
    assert guard.fail("spmdcnn: error: the plans differ", CollectiveError("the plans differ")) == 2
    assert comm.aborted is None
    assert capsys.readouterr().err == printed


def test_rank_0_runs_a_serial_command_and_sends_every_rank_its_status(monkeypatch):
    comm, mpi = ranks(monkeypatch, rank=0)
    assert guard.serial(lambda: 3) == 3
    assert [(status, dest) for status, dest, _ in comm.sent] == [(3, 1), (3, 2)]
    assert mpi.waited == [[("send", 1), ("send", 2)]]


def test_a_failing_serial_command_still_releases_the_other_ranks(monkeypatch):
    comm, _ = ranks(monkeypatch, rank=0)

    def broken():
        raise OSError("disk full")
    with pytest.raises(OSError):
        guard.serial(broken)
    assert [(status, dest) for status, dest, _ in comm.sent] == [(1, 1), (1, 2)]


def test_the_other_ranks_wait_for_rank_0s_status_without_running_the_command(monkeypatch):
    comm, _ = ranks(monkeypatch, rank=2, polls=[(False, None), (False, None), (True, 4)])
    assert guard.serial(lambda: pytest.fail("ran on rank 2")) == 4
    assert comm.polls == [] and comm.sent == []
