"""The GPU side of ``ops/``: what CuPy arrays take instead of the NumPy formulations.

- :mod:`.kernels`: fused CuPy kernels (pooling, batchnorm, dropout, the SGD update);
- :mod:`.conv`: convolution forward, data gradient and weight gradient as cuDNN graphs (``nvidia-cudnn-frontend``),
  built once per shape and cached.

The ops in ``ops/`` dispatch here when their input is a CuPy array (:func:`spmdcnn.backend.on_device`); the
results are the NumPy ops' up to float rounding. Nothing here imports CuPy or cuDNN until a kernel is first used.
"""
