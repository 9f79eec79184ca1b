"""Choosing a transport (comm/transport.py) in one process: the checks made while a job loads, what one rank
gets, and, against a stand-in world of two ranks, the order ``auto`` tries, the reasons it logs and the errors
of an explicit choice that cannot work. tests/mpi/test_transport.py moves bytes with each transport on real
ranks (and checks NumPy's choice there)."""

import numpy as np
import pytest

from fake_mpi import FakeComm
from spmdcnn.comm import World, transport
from spmdcnn.comm.errors import CollectiveError
from spmdcnn.comm.transport import CudaMpiTransport, HostTransport, check, choose

DEVICE = object()            # an array module other than NumPy: choose only compares it with numpy


def test_a_transport_that_cannot_work_is_refused_while_loading():
    with pytest.raises(ValueError, match=r"^transport: unknown transport 'ucx'; expected one of auto, host, "
                                         r"cuda-mpi, nccl$"):
        check("ucx", DEVICE)
    for name in ("cuda-mpi", "nccl"):
        with pytest.raises(ValueError, match=f"^transport: '{name}' moves device arrays; it needs backend: cupy$"):
            check(name, np)
    for name in transport.TRANSPORTS:
        check(name, DEVICE)


def test_one_rank_moves_nothing_and_gets_host_staging_whatever_was_asked():
    logged = []
    for name in ("auto", "host", "cuda-mpi", "nccl"):
        assert type(choose(World(None), DEVICE, name, log=logged.append)) is HostTransport
    assert logged == []
    with pytest.raises(CollectiveError, match="unknown transport 'ucx'"):
        choose(World(None), DEVICE, "ucx")


@pytest.fixture
def two_ranks(monkeypatch):
    """A two-rank world on GPUs; NCCL as ``nccl_verdict`` says, CUDA-aware MPI as ``SPMDCNN_CUDA_AWARE_MPI``."""
    def make(cuda_aware, nccl_verdict=(False, "CuPy has no NCCL"), gathered=None):
        monkeypatch.setenv("SPMDCNN_CUDA_AWARE_MPI", cuda_aware)
        monkeypatch.setattr(transport, "_nccl_possible", lambda world, xp: nccl_verdict)
        return World(FakeComm(rank=0, size=2, gathered=gathered))
    return make


def test_auto_falls_back_to_host_staging_and_says_why(two_ranks):
    logged = []
    chosen = choose(two_ranks("0"), DEVICE, "auto", log=logged.append)
    assert type(chosen) is HostTransport
    assert logged == ["transport host (always works); not nccl: CuPy has no NCCL; cuda-mpi: "
                      "SPMDCNN_CUDA_AWARE_MPI=0 (rank 0)"]


def test_auto_takes_cuda_aware_mpi_before_host_staging(two_ranks):
    logged = []
    assert type(choose(two_ranks("1"), DEVICE, "auto", log=logged.append)) is CudaMpiTransport
    assert logged == ["transport cuda-mpi (SPMDCNN_CUDA_AWARE_MPI=1); not nccl: CuPy has no NCCL; host: always works"]


def test_an_explicit_choice_logs_no_alternatives(two_ranks):
    logged = []
    assert type(choose(two_ranks("1"), DEVICE, "cuda-mpi", log=logged.append)) is CudaMpiTransport
    assert logged == ["transport cuda-mpi (SPMDCNN_CUDA_AWARE_MPI=1)"]


def test_an_explicit_choice_that_cannot_work_is_one_error_with_the_reason(two_ranks):
    with pytest.raises(CollectiveError, match=r"^transport: 'cuda-mpi' cannot work here: SPMDCNN_CUDA_AWARE_MPI=0 "
                                              r"\(rank 0\)$"):
        choose(two_ranks("0"), DEVICE, "cuda-mpi")
    with pytest.raises(CollectiveError, match=r"^transport: 'nccl' cannot work here: ranks share a GPU"):
        choose(two_ranks("1", (False, "ranks share a GPU, which NCCL refuses")), DEVICE, "nccl")


def test_a_transport_must_work_on_every_rank(two_ranks):
    def rank_1_is_not_aware(answer):
        return [answer, (False, "the MPI library has no CUDA-awareness query")] if isinstance(answer, tuple) \
            else [answer, answer]
    with pytest.raises(CollectiveError, match=r"cannot work here: the MPI library has no CUDA-awareness query "
                                              r"\(rank 1\)$"):
        choose(two_ranks("1", gathered=rank_1_is_not_aware), DEVICE, "cuda-mpi")


@pytest.mark.parametrize("identities,verdict", [
    ([(True, ("node", b"gpu0")), (True, ("node", b"gpu1"))], (True, "every rank has a GPU of its own")),
    ([(True, ("node", b"gpu0")), (True, ("node", b"gpu0"))], (False, "ranks share a GPU, which NCCL refuses")),
    ([(True, ("a", b"gpu0")), (True, ("b", b"gpu0"))], (True, "every rank has a GPU of its own")),
    ([(True, ("node", b"gpu0")), (False, ("node", b"gpu1"))], (False, "CuPy has no NCCL")),
])
def test_nccl_needs_it_everywhere_and_a_gpu_per_rank(monkeypatch, identities, verdict):
    monkeypatch.setattr(transport, "_gpu_identity", lambda xp: identities[0])
    world = World(FakeComm(size=2, gathered=lambda mine: [mine, mine] if mine is None else identities))
    assert transport._nccl_possible(world, DEVICE) == verdict


def test_host_buffers_are_the_arrays_themselves_where_mpi_can_use_them():
    host = HostTransport()
    array = np.arange(12.0).reshape(3, 4)
    assert host.recv_buffer(array) is array and CudaMpiTransport().recv_buffer(array) is array
    column = array[:, 1]
    buffer = host.recv_buffer(column)
    assert buffer is not column and buffer.shape == column.shape and buffer.flags.c_contiguous
    sent = host.send_buffer(column)
    assert sent.flags.c_contiguous and list(sent) == [1.0, 5.0, 9.0]
    host.exchange(None, [], [])               # nothing to move: MPI is not touched


def test_bfloat16_goes_to_mpi_as_16_bit_words():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16)
    words = transport._bytes(values)
    assert words.dtype == np.uint16 and np.shares_memory(words, values)
    floats = np.arange(4.0)
    assert transport._bytes(floats) is floats
