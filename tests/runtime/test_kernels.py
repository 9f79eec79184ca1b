import pytest

from spmdcnn.graph.opkeys import KEYS
from spmdcnn.runtime import kernels


def test_every_model_op_has_a_forward_and_a_backward():
    assert set(kernels.BIND) == set(KEYS)


def test_in_place_layers_give_the_same_results_as_out_of_place():
    """relu, dropout and add may overwrite an input nobody else reads; the numbers must not change."""
    import os

    import numpy as np

    from spmdcnn.graph import load_model
    from spmdcnn.runtime import executor as executor_module

    models = os.path.join(os.path.dirname(__file__), "..", "..", "models")
    for name in ("small_resnet", "tiny_cnn", "small_inception"):
        graph = load_model(os.path.join(models, f"{name}.yaml"))
        rng = np.random.default_rng(0)
        images = rng.standard_normal((4,) + graph.input_shape)
        labels = rng.integers(0, graph.num_classes, 4)
        results = []
        for inplace in (True, False):
            ex = executor_module.Executor(graph, np, np.float64, seed=1, overwrite=inplace)
            assert any(v is not None for v in ex.overwritable.values()) == inplace
            images_before = images.copy()
            loss, _, _ = ex.forward(images, labels, step=3)
            ex.backward()
            assert np.array_equal(images, images_before)          # the caller's batch is never overwritten
            results.append((loss, ex.grads.flat.copy(), ex.buffers.flat.copy()))
        assert results[0][0] == results[1][0]
        assert np.array_equal(results[0][1], results[1][1]) and np.array_equal(results[0][2], results[1][2])


ALIASING = {
    # c1 feeds c2 and a dropout; in evaluation (or with p = 0) dropout returns c1's memory, relu must not write it
    "dropout": [{"name": "c1", "op": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1},
                {"name": "drop", "op": "dropout", "p": 0.0},
                {"name": "relu", "op": "relu"},
                {"name": "c2", "op": "conv2d", "out_channels": 4, "kernel": 1, "inputs": ["c1"]},
                {"name": "sum", "op": "add", "inputs": ["relu", "c2"]}],
    # flatten is a reshape: its output is c1's memory, which c2 still reads
    "flatten": [{"name": "c1", "op": "conv2d", "out_channels": 2, "kernel": 3, "padding": 1},
                {"name": "flat", "op": "flatten"},
                {"name": "relu", "op": "relu"},
                {"name": "c2", "op": "conv2d", "out_channels": 2, "kernel": 1, "inputs": ["c1"]},
                {"name": "flat2", "op": "flatten"},
                {"name": "sum", "op": "add", "inputs": ["relu", "flat2"]}],
    # the data belongs to the caller
    "data": [{"name": "flat", "op": "flatten"}, {"name": "relu", "op": "relu"}],
}


def _aliasing_graph(name):
    from spmdcnn.graph.graph import parse_model
    head = [{"name": "flat_out", "op": "flatten"}] if name == "dropout" else []     # the others end flat
    tail = [{"name": "fc", "op": "linear", "out_features": 3}, {"name": "loss", "op": "softmax_cross_entropy"}]
    return parse_model({"name": name, "input": [2, 5, 4], "layers": ALIASING[name] + head + tail})


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("name", sorted(ALIASING))
def test_in_place_layers_never_write_memory_another_layer_reads(name, training):
    """relu, dropout and add may overwrite only memory no one else sees, also through flatten's reshape and
    dropout's pass-through (evaluation, p = 0), and never the caller's batch."""
    import numpy as np

    from spmdcnn.runtime import executor as executor_module
    graph = _aliasing_graph(name)
    rng = np.random.default_rng(1)
    images = rng.standard_normal((3, 2, 5, 4))
    labels = rng.integers(0, 3, 3)
    results = []
    for inplace in (True, False):
        ex = executor_module.Executor(graph, np, np.float64, seed=2, overwrite=inplace)
        before = images.copy()
        loss, _, _ = ex.forward(images, labels, step=0, training=training)
        assert np.array_equal(images, before)
        results.append(loss)
    assert results[0] == results[1]
