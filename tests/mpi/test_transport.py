"""The transports (comm/transport.py): every one that can run here trains random plans exactly as one process
does. On NumPy that is host MPI under both MPI transports' code; with a GPU (the GPU check,
benchmarks/gpu_check.sh), CuPy arrays through host staging, CUDA-aware MPI and NCCL where each can work."""

import os

import numpy as np
import pytest

from conftest import agree
from plans import random_plan
from spmdcnn.backend import gpus
from spmdcnn.comm import CollectiveError, choose_transport
from spmdcnn.comm.transport import CudaMpiTransport, HostTransport, cuda_aware_mpi
from test_equivalence import _graph, check_plan


def _plans(world, name, count, seed):
    return [random_plan(_graph(name), 5, world.size, seed=seed + k) for k in range(count)]


@pytest.mark.parametrize("transport", [HostTransport, CudaMpiTransport])
def test_the_mpi_transports_move_host_arrays(world, transport):
    world.use(transport())
    try:
        problems = []
        for plan in _plans(world, "small_resnet", 2, 300 * world.size):
            problems += check_plan(world, "small_resnet", plan)[0]
        agree(world, problems)
    finally:
        world.use(HostTransport())


def test_numpy_jobs_use_host_mpi(world):
    assert isinstance(choose_transport(world, np, "auto"), HostTransport)
    assert isinstance(choose_transport(world, np, "host"), HostTransport)
    with pytest.raises(CollectiveError, match="needs backend: cupy"):
        choose_transport(world, np, "nccl")
    with pytest.raises(CollectiveError, match="unknown transport 'ucx'"):
        choose_transport(world, np, "ucx")


def test_cuda_awareness_is_asked_not_assumed(world, monkeypatch):
    aware, why = cuda_aware_mpi()
    assert isinstance(aware, bool) and why
    monkeypatch.setenv("SPMDCNN_CUDA_AWARE_MPI", "1")
    assert cuda_aware_mpi() == (True, "SPMDCNN_CUDA_AWARE_MPI=1")
    monkeypatch.setenv("SPMDCNN_CUDA_AWARE_MPI", "0")
    assert cuda_aware_mpi() == (False, "SPMDCNN_CUDA_AWARE_MPI=0")


@pytest.mark.skipif(gpus()[1] == 0 and not os.environ.get("SPMDCNN_REQUIRE_GPU"),
                    reason="needs CuPy and a GPU (run by benchmarks/gpu_check.sh)")
@pytest.mark.parametrize("name", ["host", "cuda-mpi", "nccl"])
def test_cupy_arrays_through_each_transport(world, name):
    """CuPy float64 on random plans against one NumPy process (on one GPU shared by the ranks, only host staging
    can work: CUDA-aware MPI is absent there and NCCL refuses two ranks on one GPU)."""
    cupy, _ = gpus()
    try:
        transport = choose_transport(world, cupy, name, log=print if world.rank == 0 else None)
    except CollectiveError as error:
        pytest.skip(str(error))
    world.use(transport)
    try:
        problems = []
        for plan in _plans(world, "small_inception", 2, 40 * world.size):
            problems += check_plan(world, "small_inception", plan, xp=cupy)[0]
        agree(world, problems)
    finally:
        world.use(HostTransport())


def test_bfloat16_travels_as_16_bit_words(world):
    """MPI has no bfloat16 type (mpi4py cannot even take the buffer): the transports send its bits."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if world.size < 2:
        pytest.skip("needs two ranks")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    values = (np.arange(12, dtype=np.float32) / 3).astype(bf16)
    transport, peer = HostTransport(), world.rank ^ 1
    if peer >= world.size:
        transport.exchange(world.comm, [], [])
        return agree(world, [])
    received = transport.recv_buffer(np.empty(12, dtype=bf16))
    transport.exchange(world.comm, [(received, peer, 7)], [(transport.send_buffer(values + world.rank), peer, 7)])
    expected = (values + peer)
    agree(world, [] if np.array_equal(received.view(np.uint16), expected.view(np.uint16)) else ["bits differ"])


def test_calibration_exchanges_go_through_the_transport(world):
    """``spmdcnn calibrate`` times the transport training uses: every timed exchange is the transport's."""
    from spmdcnn.comm.calibrate import intra_node_partners, measure_link, placement
    if world.size < 2:
        pytest.skip("needs two ranks")

    class Counting(HostTransport):
        calls = 0

        def exchange(self, comm, recvs, sends):
            Counting.calls += 1
            super().exchange(comm, recvs, sends)
    world.use(Counting())
    try:
        partner = intra_node_partners(placement(world).node_of)
        link = measure_link(world, "intra_node", partner, (8, 1 << 16), repeats=2, warmup=1, max_batch=2)
    finally:
        world.use(HostTransport())
    expected = 0 if partner[world.rank] is None else 2 * 3 * 2       # sizes x (warmup + repeats) x batch
    agree(world, [] if Counting.calls == expected and link.bandwidth > 0 else
          [f"{Counting.calls} exchanges through the transport, expected {expected}"])
