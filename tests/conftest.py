import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")
REPORTED = ("numpy", "mpi4py", "h5py", "PyYAML", "torch", "torchvision", "timm", "monai",
            "segmentation-models-pytorch", "mpich", "numba", "onednn-cpu-gomp", "threadpoolctl")


def pytest_configure(config):
    """The suite changes nothing outside its temporary folders: profiles a test measures without naming a cache
    are cached in one of the session's (the commands it starts inherit it), not in the user's ~/.cache/spmdcnn."""
    if "SPMDCNN_CACHE" not in os.environ:
        import shutil
        import tempfile
        folder = os.environ["SPMDCNN_CACHE"] = tempfile.mkdtemp(prefix="spmdcnn-test-cache-")
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def pytest_collection_finish(session):
    """The multi-rank suites this session checks start now, beside the single-process tests
    (tests/test_mpi.py: start_ahead)."""
    if any(item.path.name == "test_mpi.py" for item in session.items):
        import shutil
        import tempfile
        import test_mpi
        folder = tempfile.mkdtemp(prefix="spmdcnn-multi-rank-")
        session.config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
        session.config.add_cleanup(test_mpi.stop_ahead)         # cleanups run last first: this one first
        test_mpi.start_ahead(session.items, folder)


def pytest_report_header(config):
    """The versions of what the suite runs on, for a failure report (a dependency's new release is a suspect)."""
    from importlib import metadata

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "absent"
    return "spmdcnn runs on " + ", ".join(f"{name} {version(name)}" for name in REPORTED)


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
