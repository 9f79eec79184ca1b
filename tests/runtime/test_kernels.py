from spmdcnn.graph.opspec import KEYS
from spmdcnn.runtime import kernels


def test_every_model_op_has_a_forward_and_a_backward():
    assert set(kernels.FORWARD) == set(KEYS) == set(kernels.BACKWARD)


def test_in_place_layers_give_the_same_results_as_out_of_place(monkeypatch):
    """relu, dropout and add may overwrite an input nobody else reads; the numbers must not change."""
    import os

    import numpy as np

    from spmdcnn.graph import load_model
    from spmdcnn.runtime import executor as executor_module

    models = os.path.join(os.path.dirname(__file__), "..", "..", "models")
    original = executor_module.INPLACE_OPS
    for name in ("small_resnet", "tiny_cnn", "small_inception"):
        graph = load_model(os.path.join(models, f"{name}.yaml"))
        rng = np.random.default_rng(0)
        images = rng.standard_normal((4,) + graph.input_shape)
        labels = rng.integers(0, graph.num_classes, 4)
        results = []
        for inplace in (True, False):
            monkeypatch.setattr(executor_module, "INPLACE_OPS", original if inplace else ())
            ex = executor_module.Executor(graph, np, np.float64, seed=1)
            assert any(v is not None for v in ex._overwritable.values()) == inplace
            images_before = images.copy()
            loss, _, _ = ex.forward(images, labels, step=3)
            ex.backward()
            assert np.array_equal(images, images_before)          # the caller's batch is never overwritten
            results.append((loss, ex.grads.flat.copy(), ex.buffers.flat.copy()))
        assert results[0][0] == results[1][0]
        assert np.array_equal(results[0][1], results[1][1]) and np.array_equal(results[0][2], results[1][2])
