"""Three SGD steps of small networks equal torch.optim.SGD's from the same initial weights (float64)."""

import os

import numpy as np
import pytest
import torch

from spmdcnn.graph import load_model
from spmdcnn.runtime.executor import Executor
from spmdcnn.runtime.optimizer import SGD
from torch_reference import TorchNet, spmdcnn_masks

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")


@pytest.mark.parametrize("name,hyper", [
    ("tiny_cnn", dict(lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=False)),
    ("small_resnet", dict(lr=0.1, momentum=0.9, weight_decay=1e-3, nesterov=True)),
    ("small_inception", dict(lr=0.02, momentum=0.0, weight_decay=0.0, nesterov=False)),
    ("cifar_cnn", dict(lr=0.01, momentum=0.5, weight_decay=0.0, nesterov=False)),
])
def test_three_sgd_steps_match_pytorch(name, hyper):
    graph = load_model(os.path.join(MODELS, f"{name}.yaml"))
    executor = Executor(graph, np, np.float64, seed=7)
    optimizer = SGD(executor.params.shapes, np.float64, np, **hyper)
    net = TorchNet(graph, {k: v.copy() for k, v in executor.params.items()},
                   {k: v.copy() for k, v in executor.buffers.items()}, dropout_masks=spmdcnn_masks(7))
    net.train()
    reference = torch.optim.SGD(net.parameters(), **hyper)
    rng = np.random.default_rng(0)
    for step in range(3):
        images = rng.standard_normal((6,) + graph.input_shape)
        labels = rng.integers(0, graph.num_classes, 6)
        loss, _, _ = executor.forward(images, labels, step=step)
        executor.backward()
        optimizer.step(executor.params.flat, executor.grads.flat)
        reference.zero_grad()
        ref_loss, _ = net(torch.from_numpy(images), torch.from_numpy(labels), step)
        ref_loss.backward()
        reference.step()
        assert loss == pytest.approx(ref_loss.item(), rel=1e-10)
    for pname, parameter in net.named().items():
        np.testing.assert_allclose(executor.params[pname], parameter.detach().numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=pname)
        if hyper["momentum"]:
            buffer = reference.state[parameter]["momentum_buffer"].numpy()
            np.testing.assert_allclose(optimizer.velocity[pname], buffer, rtol=1e-9, atol=1e-12, err_msg=pname)
    for bname, value in net.state.items():
        np.testing.assert_allclose(executor.buffers[bname], value.numpy(), rtol=1e-10, err_msg=bname)


def test_update_is_blockwise_exact_for_large_arrays():
    """The blocked, threaded update gives the same numbers as the textbook formula on > 1 block."""
    rng = np.random.default_rng(1)
    shapes = {"a.weight": (300, 517), "b.weight": (70_001,)}
    optimizer = SGD(shapes, np.float64, np, lr=0.1, momentum=0.9, weight_decay=0.01)
    total = 300 * 517 + 70_001
    w = rng.standard_normal(total)
    expected_w, v = w.copy(), np.zeros(total)
    for _ in range(2):
        g = rng.standard_normal(total)
        optimizer.step(w, g)
        d = g + 0.01 * expected_w
        v = 0.9 * v + d
        expected_w -= 0.1 * v
    np.testing.assert_allclose(w, expected_w, rtol=1e-12, atol=1e-14)


def test_bad_hyperparameters_are_refused():
    with pytest.raises(ValueError, match="non-negative"):
        SGD({"w.weight": (2,)}, np.float32, np, lr=-1)
    with pytest.raises(ValueError, match="nesterov"):
        SGD({"w.weight": (2,)}, np.float32, np, lr=0.1, nesterov=True)
