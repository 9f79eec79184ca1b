"""Initial weights follow PyTorch's defaults and depend only on (seed, tensor name)."""

import os

import numpy as np
import pytest
import torch

from spmdcnn.graph import load_model
from spmdcnn.runtime.executor import Executor

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")


def executor(seed=0, name="small_resnet", dtype=np.float64):
    return Executor(load_model(os.path.join(MODELS, f"{name}.yaml")), np, dtype, seed=seed)


def test_bounds_and_constants_match_pytorch_defaults():
    ex = executor(name="cifar_cnn")
    reference = {"conv": torch.nn.Conv2d(3, 32, 3, bias=False), "fc1": torch.nn.Linear(2048, 256)}
    conv = ex.params["conv1.conv.weight"]
    bound = 1 / np.sqrt(3 * 3 * 3)
    assert np.abs(conv).max() <= bound and np.abs(conv).max() > 0.9 * bound
    assert abs(reference["conv"].weight.detach().abs().max().item() - bound) < 0.1 * bound
    fc = ex.params["fc1.weight"]
    assert np.abs(fc).max() <= 1 / np.sqrt(2048)
    assert np.abs(ex.params["fc1.bias"]).max() <= 1 / np.sqrt(2048)
    assert abs(fc.std() - reference["fc1"].weight.detach().std().item()) < 0.02 * reference["fc1"].weight.detach().std().item()
    assert np.all(ex.params["conv1.bn.weight"] == 1) and np.all(ex.params["conv1.bn.bias"] == 0)
    assert np.all(ex.buffers["conv1.bn.running_mean"] == 0) and np.all(ex.buffers["conv1.bn.running_var"] == 1)


def test_seeded_and_independent_of_dtype():
    a, b, c = executor(1), executor(1), executor(2)
    assert np.array_equal(a.params.flat, b.params.flat)
    assert not np.array_equal(a.params.flat, c.params.flat)
    single = executor(1, dtype=np.float32)
    np.testing.assert_allclose(single.params.flat, a.params.flat.astype(np.float32))


def test_each_tensor_depends_only_on_its_name():
    """The same layer in two different models gets the same initial weights (plans and shards rely on it)."""
    resnet = executor(3, "small_resnet")
    graph = load_model(os.path.join(MODELS, "small_resnet.yaml"))
    layer = graph.by_name["layer2.0.conv1"]
    from spmdcnn.runtime.params import initial_value
    assert np.array_equal(initial_value(layer, "weight", 3), resnet.params["layer2.0.conv1.weight"])


def test_views_share_the_flat_arrays():
    ex = executor()
    ex.params["fc.weight"][...] = 7
    start, stop = ex.params.offsets["fc.weight"]
    assert np.all(ex.params.flat[start:stop] == 7)
    assert ex.params.size == ex.graph.num_params


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtypes_propagate(dtype):
    ex = executor(dtype=dtype)
    graph = ex.graph
    images = np.zeros((2,) + graph.input_shape, dtype=dtype)
    _, _, kept = ex.forward(images, np.array([0, 1]), keep=("fc",))
    assert kept["fc"].dtype == dtype
    ex.backward()
    assert ex.grads.flat.dtype == dtype


@pytest.mark.parametrize("rows", [(0, 3), (2, 5), (7, 8), (0, 8)])
def test_a_shard_of_an_initial_value_is_those_rows_of_the_whole(rows):
    """A rank draws only its rows, and they are the rows of the tensor one process would draw."""
    from spmdcnn.runtime.params import initial_value
    graph = load_model(os.path.join(MODELS, "tiny_cnn.yaml"))
    conv = graph.by_name["conv1"]
    for kind in ("weight", "bias"):
        whole = initial_value(conv, kind, 4)
        np.testing.assert_array_equal(initial_value(conv, kind, 4, rows), whole[rows[0]:rows[1]])
    bn = graph.by_name["bn1"]
    assert initial_value(bn, "running_var", 4, rows).shape == (rows[1] - rows[0],)
