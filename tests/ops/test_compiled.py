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
    assert compiled.available(np.zeros(large, np.float32), np.zeros(large, np.float64)) == compiled.INSTALLED
    assert not compiled.available(np.zeros(large - 1, np.float32))                  # small: NumPy's passes
    assert not compiled.available(np.zeros(large, np.float16))
    assert not compiled.available(np.zeros(large, np.float32), np.zeros(large, np.float16))
    monkeypatch.setattr(compiled, "ENABLED", False)
    assert not compiled.available(np.zeros(large, np.float32))


def test_numba_failing_to_load_them_leaves_numpys_kernels_with_a_warning(monkeypatch):
    for name, value in (("ENABLED", True), ("INSTALLED", True), ("SWITCHED_OFF", False)):
        monkeypatch.setattr(compiled, name, value)
    monkeypatch.setattr(compiled, "_loops", None)
    monkeypatch.setattr(compiled, "FAILED", None)
    import spmdcnn.ops
    monkeypatch.delattr(spmdcnn.ops, "numba_loops", raising=False)          # imported anew: its "import numba" fails
    monkeypatch.delitem(sys.modules, "spmdcnn.ops.numba_loops", raising=False)
    monkeypatch.setitem(sys.modules, "numba", None)
    x = np.random.default_rng(0).standard_normal((2, 4, 256, 256)).astype(np.float32)
    with pytest.warns(RuntimeWarning, match="numba's kernels failed to load .*NumPy's run instead"):
        y, saved = batchnorm.batchnorm_forward(x, np.ones(4, np.float32), np.zeros(4, np.float32),
                                               np.zeros(4, np.float32), np.ones(4, np.float32))
    assert not compiled.ENABLED and compiled.describe().startswith("off (numba failed to load them: ")
    np.testing.assert_allclose(y.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    batchnorm.batchnorm_backward(y, saved)                                  # no second warning, NumPy's kernels


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
@pytest.mark.parametrize("dtype, tolerance", [(np.float64, 1e-12), (np.float32, 1e-4)])
def test_batch_norm_and_max_pooling_give_numpys_results_on_a_large_tensor(monkeypatch, dtype, tolerance):
    """Above MIN_ELEMENTS, as a training step meets them: the compiled and NumPy kernels agree to the type's
    rounding (their sums are grouped differently, NumPy's per row in float32: a sum of 147 Ki float32 terms that
    nearly cancel differs by about 1e-5 of the largest sum)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 8, 192, 192)) * 3 + 5).astype(dtype)
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
        assert compiled.available(p) == enabled                 # the pooling's backward runs compiled too
        return (y, *stats, *batchnorm.batchnorm_backward(gy, saved), pool.maxpool_backward(p * p, psaved))
    for got, expected in zip(run(True), run(False)):
        np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance * np.abs(expected).max())
