import os
import subprocess
import sys

import numpy as np
import pytest

from spmdcnn import backend


def test_numpy_is_the_default(monkeypatch):
    monkeypatch.setattr(backend, "_cupy", lambda: None)
    assert backend.get_array_module("auto") is np
    assert backend.get_array_module("numpy") is np


def test_cupy_asked_for_but_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(backend, "_cupy", lambda: None)
    with pytest.raises(RuntimeError, match="CuPy is not installed"):
        backend.get_array_module("cupy")


def fake_cupy(used, count=4):
    """A CuPy whose GPUs note in ``used`` which one was picked."""
    class FakeDevice:
        def __init__(self, index):
            self.index = index

        def use(self):
            used.append(self.index)

    class FakeCupy:
        class cuda:
            Device = FakeDevice

            class runtime:
                @staticmethod
                def getDeviceCount():
                    return count
    return FakeCupy


def test_cupy_binds_the_local_ranks_gpu(monkeypatch):
    used = []
    cupy = fake_cupy(used)
    monkeypatch.setattr(backend, "_cupy", lambda: cupy)
    for name in backend._LOCAL_RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_LOCALID", "6")
    assert backend.get_array_module("cupy") is cupy
    assert used == [2]


def test_unknown_backend_and_dtype():
    with pytest.raises(ValueError, match="unknown backend"):
        backend.get_array_module("tpu")
    with pytest.raises(ValueError, match="unsupported dtype"):
        backend.resolve_dtype("float16")
    assert backend.resolve_dtype("float64") == np.float64


def test_array_module_of_numpy_arrays():
    assert backend.array_module(np.zeros(2)) is np


@pytest.mark.parametrize("variable", ["OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MV2_COMM_WORLD_LOCAL_RANK"])
def test_local_rank_from_the_launcher(monkeypatch, variable):
    for name in backend._LOCAL_RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert backend.local_rank() == 0
    monkeypatch.setenv(variable, "3")
    assert backend.local_rank() == 3


def _threads_seen(**env):
    import subprocess
    import sys
    clean = {k: v for k, v in os.environ.items()
             if k not in ("SPMDCNN_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                          "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE",
                          "PMI_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")}
    code = "import os, spmdcnn; print(os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('SPMDCNN_NUM_THREADS'))"
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                         check=True).stdout.split()
    return out


def test_ranks_on_one_node_share_its_cores():
    cores = len(os.sched_getaffinity(0))
    assert _threads_seen() == ["None", "None"]                      # alone: BLAS decides
    share = str(max(1, cores // 2))
    assert _threads_seen(MPI_LOCALNRANKS="2") == [share, share]
    assert _threads_seen(OMPI_COMM_WORLD_LOCAL_SIZE="64") == ["1", "1"]
    assert _threads_seen(MPI_LOCALNRANKS="2", OMP_NUM_THREADS="3") == ["None", "None"]   # the user's choice wins


def test_the_launchers_local_rank_wins_over_slurms(monkeypatch):
    """mpiexec inside a Slurm allocation: SLURM_LOCALID is its proxy's (0 on every rank), MPI_LOCALRANKID the rank's."""
    for name in backend._LOCAL_RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("MPI_LOCALRANKID", "2")
    assert backend.local_rank() == 2


def test_an_explicit_rank_on_the_node_picks_the_gpu(monkeypatch):
    used = []
    cupy = fake_cupy(used)
    monkeypatch.setattr(backend, "_cupy", lambda: cupy)
    monkeypatch.setenv("MPI_LOCALRANKID", "1")
    assert backend.get_array_module("cupy", rank_on_node=7) is cupy
    assert used == [3]


def test_more_ranks_than_gpus_on_a_node_is_refused_unless_shared(monkeypatch):
    used = []
    cupy = fake_cupy(used, count=2)
    monkeypatch.setattr(backend, "_cupy", lambda: cupy)
    with pytest.raises(RuntimeError, match="3 ranks on this node but it has 2 GPUs.*share_gpus: true"):
        backend.get_array_module("cupy", 2, 3)
    assert backend.get_array_module("cupy", 2, 3, share=True) is cupy
    assert backend.get_array_module("cupy", 1, 2) is cupy
    assert used == [0, 1]


def test_tf32_is_set_for_cupy_only_and_read_by_the_convolutions(monkeypatch):
    """``set_precision`` keeps the TF32 choice the cuDNN graphs read (backend.tf32_allowed) and sets cuBLAS's
    float32 compute type (CuPy's GEMM settings stood in for)."""
    import sys
    import types
    from spmdcnn.ops.cuda import conv
    compute_types = []
    linalg = types.SimpleNamespace(COMPUTE_TYPE_TF32="tf32", COMPUTE_TYPE_FP32="fp32",
                                   set_compute_type=lambda dtype, kind: compute_types.append((dtype, kind)))
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    monkeypatch.setitem(sys.modules, "cupy._core", types.SimpleNamespace(_routines_linalg=linalg))
    monkeypatch.setattr(backend, "_precision", {"tf32": False})
    backend.set_precision(np, tf32=True)
    assert not backend.tf32_allowed() and compute_types == []
    device = object()
    backend.set_precision(device, tf32=True)
    assert backend.tf32_allowed() and conv.tf32_allowed() and compute_types == [(np.float32, "tf32")]
    backend.set_precision(device)
    assert not backend.tf32_allowed() and compute_types[-1] == (np.float32, "fp32")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc (Linux)")
def test_freed_arrays_are_kept_for_the_next_ones_unless_the_user_says_otherwise(monkeypatch):
    """In the ``spmdcnn`` command's process (:func:`spmdcnn.keep_freed_memory`) a large array freed and allocated
    again takes the same memory: no page faults the second time (a training step allocates and frees the same
    arrays every step). ``SPMDCNN_MALLOC=system`` leaves the C library's malloc as it is: each new large array
    faults its pages in again. ``import spmdcnn`` alone leaves it too (a test run or a notebook lives on)."""
    script = ("import resource, spmdcnn, numpy as np\n"
              "spmdcnn.keep_freed_memory()\n"                        # as the spmdcnn command does first
              "np._core.multiarray._set_madvise_hugepage(False)\n"      # pages of 4 KiB, as counted below
              "def faults():\n"
              "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
              "a = np.ones(16 << 20, dtype=np.float32); del a\n"     # 64 MiB, above any mmap threshold
              "before = faults()\n"
              "a = np.ones(16 << 20, dtype=np.float32); del a\n"
              "print(faults() - before)\n")
    kept, system = (int(subprocess.run([sys.executable, "-c", script], env={**os.environ, **extra},
                                       capture_output=True, text=True, check=True, timeout=120).stdout)
                    for extra in ({}, {"SPMDCNN_MALLOC": "system"}))
    assert kept < 1000 and system > 10000, (kept, system)       # 64 MiB is 16,384 pages of 4 KiB
    imported = int(subprocess.run([sys.executable, "-c", script.replace("spmdcnn.keep_freed_memory()\n", "")],
                                  capture_output=True, text=True, check=True, timeout=120).stdout)
    assert imported > 10000, imported
    import spmdcnn
    from spmdcnn import cli
    called = []
    monkeypatch.setattr(spmdcnn, "keep_freed_memory", lambda: called.append(True))
    monkeypatch.setattr(cli, "main", lambda: 0)
    assert cli.command() == 0 and called == [True]          # the console script's entry point
