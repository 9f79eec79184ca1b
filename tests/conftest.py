import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")


@pytest.fixture
def model_path():
    return lambda name: os.path.join(MODELS, f"{name}.yaml")


@pytest.fixture(params=["compiled", "numpy"])
def host_kernels(request, monkeypatch):
    """Runs a test with the compiled host kernels (numba, the ``numba`` extra; the test extra installs it) and with
    NumPy's, which run wherever numba is missing."""
    from spmdcnn.ops import compiled
    if request.param == "compiled" and not compiled.INSTALLED:
        pytest.skip("numba is not installed (pip install -e '.[test]' installs it)")
    monkeypatch.setattr(compiled, "ENABLED", request.param == "compiled")
    monkeypatch.setattr(compiled, "MIN_ELEMENTS", 0)        # the tests' small arrays too
    return request.param


@pytest.fixture
def numpy_convolutions(monkeypatch):
    """NumPy's convolution paths (``ops/conv.py``) for float32 too, where oneDNN (the ``onednn`` extra) would
    otherwise run them: for the tests of those paths."""
    from spmdcnn.ops import onednn
    monkeypatch.setattr(onednn, "ENABLED", False)
