"""The optional compiled host kernels (ops/compiled.py): when they run, and that they give NumPy's results."""

import os
import subprocess
import sys

import numpy as np
import pytest

from spmdcnn.ops import batchnorm, compiled, pool

needs_numba = pytest.mark.skipif(not compiled.INSTALLED, reason="numba is not installed (the test extra installs it)")


def test_they_run_on_large_float32_and_float64_host_arrays_only(monkeypatch):
    monkeypatch.setattr(compiled, "ENABLED", True)
    large = compiled.MIN_ELEMENTS
    assert compiled.available(np.zeros(large, np.float32), np.zeros(large, np.float64))
    assert not compiled.available(np.zeros(large - 1, np.float32))                  # small: NumPy's passes
    assert not compiled.available(np.zeros(large, np.float16))
    assert not compiled.available(np.zeros(large, np.float32), np.zeros(large, np.float16))
    monkeypatch.setattr(compiled, "ENABLED", False)
    assert not compiled.available(np.zeros(large, np.float32))


@pytest.mark.parametrize("setting, expected", [("off", "off (SPMDCNN_COMPILED=off)"), ("", None)])
def test_the_switch_and_what_a_run_says(setting, expected):
    env = {**os.environ, "SPMDCNN_COMPILED": setting}
    said = subprocess.run([sys.executable, "-c", "from spmdcnn.ops import compiled; print(compiled.describe())"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()
    if expected is None:
        import importlib.metadata
        expected = f"numba {importlib.metadata.version('numba')}" if compiled.INSTALLED else "off (numba not installed)"
    assert said == expected


@needs_numba
@pytest.mark.parametrize("dtype, tolerance", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_batch_norm_and_max_pooling_give_numpys_results_on_a_large_tensor(monkeypatch, dtype, tolerance):
    """Above MIN_ELEMENTS, as a training step meets them: the compiled and NumPy kernels agree to the type's
    rounding (their sums are grouped differently)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 8, 96, 96)) * 3 + 5).astype(dtype)
    gy = rng.standard_normal(x.shape).astype(dtype)
    gamma, beta = rng.standard_normal(8).astype(dtype), rng.standard_normal(8).astype(dtype)
    geometry = pool.PoolGeometry(3, 2, 1)
    monkeypatch.setattr(compiled, "ENABLED", True)
    assert compiled.available(x)

    def run(enabled):
        monkeypatch.setattr(compiled, "ENABLED", enabled)
        stats = np.zeros(8, dtype), np.ones(8, dtype)
        y, saved = batchnorm.batchnorm_forward(x, gamma, beta, *stats)
        p, psaved = pool.maxpool_forward(x, geometry)
        return (y, *stats, *batchnorm.batchnorm_backward(gy, saved), pool.maxpool_backward(p * p, psaved))
    for got, expected in zip(run(True), run(False)):
        np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)
