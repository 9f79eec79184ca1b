"""spmdcnn: layer-wise parallel training of convolutional networks on MPI ranks."""

import os

__version__ = "0.1.0"

# spmdcnn runs its own threads (copies, pooling, the optimizer) between BLAS calls. OpenBLAS's worker threads
# spin for up to ~2**28 cycles after each call before they sleep, taking the cores those threads need; 2**4
# cycles makes them sleep at once (measured: AlexNet iterations 15-20 % faster). It must be set before NumPy
# loads OpenBLAS, so it is set here, and only where the user has not set it.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
