"""bfloat16 activations under float32 master weights (``dtype: bfloat16``), the parts that do not need a GPU:
the dtype policy, linear and the loss computing in float32 and returning bfloat16, and the executor keeping
float32 parameters. (Convolution, pooling and batchnorm in bfloat16 run on cuDNN and CUDA kernels: see
test_cuda_ops.py.)"""

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")   # a test dependency (spmdcnn[test]); also in the GPU extras

from spmdcnn import backend  # noqa: E402
from spmdcnn.ops import linear, loss  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)


class _FakeCupy:
    __name__ = "cupy"


def test_bfloat16_is_for_the_gpu_with_float32_masters():
    with pytest.raises(ValueError, match="bfloat16 runs on the GPU only"):
        backend.resolve_dtype("bfloat16")
    assert backend.resolve_dtype("bfloat16", _FakeCupy()) == BF16
    assert backend.master_dtype(BF16) == np.float32
    assert backend.master_dtype(np.float64) == np.float64


def test_linear_computes_in_the_weights_type_and_rounds_its_outputs():
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((5, 7)), rng.standard_normal((3, 7)).astype(np.float32), \
        rng.standard_normal(3).astype(np.float32)
    xb = x.astype(BF16)
    y, saved = linear.linear_forward(xb, w, b)
    assert y.dtype == BF16
    exact = xb.astype(np.float32) @ w.T + b
    assert np.allclose(y.astype(np.float32), exact, rtol=1e-2, atol=1e-2)
    gy = rng.standard_normal((5, 3)).astype(BF16)
    gw_out = np.empty_like(w)
    gx, gw, gb = linear.linear_backward(gy, saved, gw_out=gw_out)
    assert gx.dtype == BF16 and gw is gw_out and gb.dtype == np.float32
    assert np.allclose(gw, gy.astype(np.float32).T @ xb.astype(np.float32), rtol=1e-5)


def test_the_loss_of_bfloat16_logits_is_taken_in_float32():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((6, 4)).astype(BF16)
    labels = np.array([0, 1, 2, 3, -1, 2])
    value, saved = loss.softmax_cross_entropy_forward(logits, labels)
    reference, _ = loss.softmax_cross_entropy_forward(logits.astype(np.float32), labels)
    assert value == reference
    assert loss.softmax_cross_entropy_backward(1.0, saved).dtype == BF16


def test_the_executor_keeps_float32_parameters_under_bfloat16():
    import os
    from spmdcnn.graph import load_model
    from spmdcnn.runtime.executor import Executor
    graph = load_model(os.path.join(os.path.dirname(__file__), "..", "..", "models", "tiny_cnn.yaml"))
    executor = Executor(graph, np, BF16)
    assert executor.dtype == BF16
    stores = (executor.params, executor.grads, executor.buffers)
    assert {store.flat.dtype for store in stores} == {np.dtype(np.float32)}
