import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")


@pytest.fixture
def model_path():
    return lambda name: os.path.join(MODELS, f"{name}.yaml")
