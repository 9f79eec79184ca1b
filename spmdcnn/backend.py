"""The array-module switch: NumPy by default, CuPy when asked for and present.

Nothing here imports CuPy at module import time, so the package imports and tests without it.
"""

import os

import numpy as np

_DTYPES = {"float32": np.float32, "float64": np.float64}
# the MPI launchers' first: under mpiexec inside a Slurm allocation SLURM_LOCALID is the launcher's proxy's (0)
_LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                         "PMI_LOCAL_RANK", "SLURM_LOCALID")
_precision = {"tf32": False}


def _cupy():
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def array_module(x):
    """The module (numpy or cupy) that owns array ``x``."""
    if type(x).__module__.startswith("cupy"):
        return _cupy()
    return np


def on_device(x):
    """Whether ``x`` is a CuPy (GPU) array: ops take their fused CUDA kernels (``ops/cuda``) for it."""
    return type(x).__module__.startswith("cupy")


def gpus():
    """``(cupy, number of GPUs it sees)``: ``(None, 0)`` without CuPy, and 0 GPUs where it has no driver or device."""
    cupy = _cupy()
    if cupy is None:
        return None, 0
    try:
        return cupy, cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver, no device: CuPy imports but cannot run
        return cupy, 0


def get_array_module(name="auto", rank_on_node=None, ranks_on_node=None, share=False):
    """Resolve a job's ``backend`` key ('auto', 'numpy' or 'cupy') to an array module.

    'auto' is NumPy (the GPU runtime is chosen explicitly, with ``backend: cupy``); 'cupy' runs on the GPU
    picked by :func:`bind_device` from ``rank_on_node`` (the rank's index among its node's ranks,
    :meth:`spmdcnn.comm.World.local_rank`; default :func:`local_rank`) and ``ranks_on_node`` (how many ranks
    the node runs; checked against its GPUs unless ``share``).
    """
    if name in ("numpy", "auto"):
        return np
    if name != "cupy":
        raise ValueError(f"backend: unknown backend {name!r}; expected one of auto, numpy, cupy")
    cupy, count = gpus()
    if count == 0:
        raise RuntimeError("backend: 'cupy' was asked for but CuPy is not installed or sees no GPU "
                           "(install spmdcnn[gpu-cuda12] or spmdcnn[gpu-cuda13])")
    bind_device(cupy, count, rank_on_node, ranks_on_node, share)
    return cupy


def bind_device(cupy, count, rank_on_node=None, ranks_on_node=None, share=False):
    """Use GPU ``local rank mod count``: one rank per GPU when a node runs as many ranks as it has GPUs.

    More ranks on a node than it has GPUs is an error (two ranks on one GPU halve its speed and NCCL refuses
    them) unless ``share`` asks for it: then the ranks take the GPUs in turn.
    """
    rank = local_rank() if rank_on_node is None else rank_on_node
    if ranks_on_node is not None and ranks_on_node > count and not share:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise RuntimeError(f"backend: {ranks_on_node} ranks on this node but it has {count} GPU"
                           f"{'s' if count != 1 else ''} (CUDA_VISIBLE_DEVICES={visible!r}); start one rank per "
                           "GPU, or set share_gpus: true to let ranks share them")
    device = rank % count
    cupy.cuda.Device(device).use()
    return device


def resolve_dtype(name, xp=np):
    """The NumPy dtype for a job's ``dtype`` key. ``bfloat16`` (ml_dtypes' type) is for CuPy: activations in
    bfloat16, parameters, gradients and momentum in float32 (:func:`master_dtype`)."""
    if name == "bfloat16":
        if xp is np:
            raise ValueError("dtype: bfloat16 runs on the GPU only (backend: cupy); on the CPU use float32")
        return bfloat16()
    try:
        return np.dtype(_DTYPES[name])
    except KeyError:
        raise ValueError(f"dtype: unsupported dtype {name!r}; expected one of {', '.join(_DTYPES)}, bfloat16") \
            from None


def bfloat16():
    """ml_dtypes' bfloat16, the NumPy dtype CuPy 14 holds bfloat16 arrays in."""
    try:
        import ml_dtypes
    except ImportError:
        raise ValueError("dtype: bfloat16 needs ml_dtypes (pip install spmdcnn[gpu-cuda12] or ml_dtypes)") from None
    return np.dtype(ml_dtypes.bfloat16)


def master_dtype(dtype):
    """The dtype of parameters, gradients, buffers and optimizer state for activations of ``dtype``: float32
    for bfloat16 (mixed precision with a float32 master copy), ``dtype`` itself otherwise. The GPU kernels
    compute and accumulate in it too."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.name == "bfloat16" else dtype


def set_precision(xp, tf32=False):
    """Whether float32 convolutions (cuDNN) and matrix products (cuBLAS) on ``xp`` may round their inputs to
    TF32; nothing to set for NumPy."""
    if xp is np:
        return
    _precision["tf32"] = bool(tf32)
    from cupy._core import _routines_linalg as linalg       # CuPy's per-dtype GEMM compute type
    linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_TF32 if tf32 else linalg.COMPUTE_TYPE_FP32)


def rank_module(name, node_ranks, share=False, tf32=None):
    """The array module of this rank for a job's ``backend`` key, set up as every command sets it up: its GPU bound
    from ``node_ranks`` (``(index on the node, ranks on the node)``, :meth:`spmdcnn.comm.World.node_ranks`;
    :func:`get_array_module`) and TF32 allowed or not (:func:`set_precision`; None leaves CuPy's default)."""
    xp = get_array_module(name, *node_ranks, share=share)
    if tf32 is not None:
        set_precision(xp, tf32)
    return xp


def tf32_allowed():
    """Whether float32 convolutions may round their inputs to TF32 (tensor cores), as PyTorch's
    ``torch.backends.cudnn.allow_tf32``: the last :func:`set_precision` on CuPy said so (ops/cuda/conv reads it)."""
    return _precision["tf32"]


def local_rank():
    """This process's rank among the processes of its node, from the launcher's environment (0 if none)."""
    for variable in _LOCAL_RANK_VARIABLES:
        value = os.environ.get(variable)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def synchronizer(xp):
    """A function that waits for the device's queued work to finish (nothing to wait for with NumPy): timers call
    it before reading the clock."""
    if xp is np:
        return lambda: None
    return lambda: xp.cuda.get_current_stream().synchronize()


def to_numpy(x):
    """A host NumPy copy (or the array itself when it is already on the host)."""
    if isinstance(x, np.ndarray):
        return x
    return x.get()
