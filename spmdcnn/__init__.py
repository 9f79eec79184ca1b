"""spmdcnn: layer-wise parallel training of convolutional networks on MPI ranks."""

import ctypes
import os
import sys

__version__ = "0.2.0"

# spmdcnn runs its own threads (copies, pooling, the optimizer) between BLAS calls. OpenBLAS's worker threads
# spin for up to ~2**28 cycles after each call before they sleep, taking the cores those threads need; 2**4
# cycles makes them sleep at once (measured: AlexNet iterations 15-20 % faster). It must be set before NumPy
# loads OpenBLAS, so it is set here, and only where the user has not set it.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")


def keep_freed_memory():
    """Keep the memory NumPy frees for the next arrays instead of handing it back to the system (glibc's malloc,
    Linux); the ``spmdcnn`` command calls it first. A training step allocates and frees the same large arrays
    (activations, gradients, the columns of a convolution) every step; by default glibc maps each array above its
    mmap threshold (at most 32 MiB) anew and unmaps it when freed, and trims the heap's free top, so every step
    faults every page of them in again, the kernel zeroing each (ResNet-50 at batch 16: 79,000 page faults a step
    on this project's VM; 2,110-2,228 against 2,434-2,548 ms per step without them, the same peak memory). With
    ``mmap`` off for allocations and trimming off, freed blocks go back to malloc's own free lists and the next
    step's arrays take them; the process's resident memory stays at its peak until it ends, as a training job's
    does anyway. Not at import: a long-lived process that builds many models (a test run, a notebook) would keep
    the largest its fragmented heap ever grew. Where the user set any ``MALLOC_`` variable, or
    ``SPMDCNN_MALLOC=system``, malloc is left as it is."""
    if not sys.platform.startswith("linux") or os.environ.get("SPMDCNN_MALLOC") == "system" or any(
            name.startswith("MALLOC_") for name in os.environ):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt         # glibc's (musl has none: its malloc is left alone)
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_max = -1, -4           # glibc's malloc.h
    mallopt(m_mmap_max, 0)
    mallopt(m_trim_threshold, -1)                   # -1: never trim

# how many ranks of this job share the node, as MPICH, Open MPI, MVAPICH and Slurm announce it
_LOCAL_SIZE_VARIABLES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE",
                         "PMI_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")
_THREAD_VARIABLES = ("SPMDCNN_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def usable_cores():
    """The cores this process may run on (its affinity where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(local):
    """The threads each of ``local`` ranks sharing this node gets (the BLAS's, and spmdcnn's own pool's): the
    count the user set in a thread variable, else all the cores the launcher bound this rank to, else its share
    of the usable cores (at least one)."""
    for variable in _THREAD_VARIABLES:
        value = os.environ.get(variable, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return cores_per_rank(local)


def cores_per_rank(local):
    """The cores each of ``local`` ranks sharing this node may use: all the cores the launcher bound this rank to,
    else its share of the usable cores (at least one)."""
    usable = usable_cores()
    bound = usable < (os.cpu_count() or usable)
    return usable if bound or local <= 1 else max(1, usable // local)


def _share_cores():
    """Ranks on one node share its cores: without this, each rank's BLAS would start a thread per core and
    ``mpiexec -n 4`` on 4 cores would run 16 threads. Where the user set no thread count, each rank gets its
    share of the cores it may run on (all of its cores when the launcher bound it to some)."""
    if any(variable in os.environ for variable in _THREAD_VARIABLES):
        return
    local = next((int(os.environ[v]) for v in _LOCAL_SIZE_VARIABLES if os.environ.get(v, "").isdigit()), 1)
    if local <= 1:
        return
    threads = str(threads_per_rank(local))
    for variable in _THREAD_VARIABLES:
        os.environ[variable] = threads


_share_cores()
