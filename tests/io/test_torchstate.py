"""``spmdcnn checkpoint export --torch`` and ``import``: weights to and from PyTorch state dicts."""

import os

import numpy as np
import pytest
import torch

from spmdcnn.cli import main
from spmdcnn.graph import load_model
from spmdcnn.io.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from spmdcnn.io.torchstate import export_torch, import_torch, state_dict
from spmdcnn.runtime.executor import Executor

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")


def weights(graph, seed=0):
    executor = Executor(graph, dtype=np.float32, seed=seed)
    params = {name: executor.params[name].copy() for name in graph.param_shapes()}
    rng = np.random.default_rng(seed)
    buffers = {name: np.abs(rng.standard_normal(shape)).astype(np.float32) + 0.5
               for name, shape in graph.buffer_shapes().items()}
    return executor, params, buffers


def torchvision_alexnet():
    """torchvision.models.AlexNet's modules, without torchvision (its avgpool is the identity at 224x224)."""
    nn = torch.nn
    features = nn.Sequential(
        nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(), nn.MaxPool2d(3, 2), nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(),
        nn.MaxPool2d(3, 2), nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(), nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2))
    classifier = nn.Sequential(nn.Dropout(), nn.Linear(9216, 4096), nn.ReLU(), nn.Dropout(), nn.Linear(4096, 4096),
                               nn.ReLU(), nn.Linear(4096, 1000))
    model = nn.Module()
    model.features, model.classifier = features, classifier
    model.forward = lambda x: classifier(torch.flatten(features(x), 1))
    return model


def test_alexnet_weights_load_into_torchvisions_alexnet_and_compute_the_same():
    graph = load_model(os.path.join(MODELS, "alexnet.yaml"))
    executor, params, buffers = weights(graph)
    model = torchvision_alexnet().eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state_dict(graph, params, buffers).items()}, strict=True)
    image = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    _, _, kept = executor.forward(image, np.array([0]), training=False, keep=("fc8",))
    with torch.no_grad():
        expected = model(torch.from_numpy(image)).numpy()
    np.testing.assert_allclose(kept["fc8"], expected, rtol=1e-4, atol=1e-5)


def test_vgg16_names_are_torchvisions():
    graph = load_model(os.path.join(MODELS, "vgg16.yaml"))
    keys = state_dict(graph, {n: np.zeros(s) for n, s in graph.param_shapes().items()}, {})
    convs = [0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28]
    assert list(keys) == [f"{m}.{t}" for m in [f"features.{i}" for i in convs] + ["classifier.0", "classifier.3",
                                                                                     "classifier.6"]
                          for t in ("weight", "bias")]
    assert keys["classifier.0.weight"].shape == (4096, 25088)


def test_export_then_import_gives_the_same_weights(tmp_path, capsys):
    graph = load_model(os.path.join(MODELS, "digits_cnn.yaml"))
    _, params, buffers = weights(graph)
    save_checkpoint(tmp_path / "run.h5", model_text=graph.text, params=params, buffers=buffers, step=7)
    assert main(["checkpoint", "export", str(tmp_path / "run.h5"), "--torch", str(tmp_path / "w.pt")]) == 0
    assert "22 tensors of model 'digits_cnn'" in capsys.readouterr().out
    loaded = torch.load(tmp_path / "w.pt", weights_only=True)
    assert loaded["conv1.bn.num_batches_tracked"].item() == 7 and loaded["conv1.bn.num_batches_tracked"].dtype == torch.int64
    np.testing.assert_array_equal(loaded["fc1.weight"].numpy(), params["fc1.weight"])
    np.testing.assert_array_equal(loaded["conv2.bn.running_var"].numpy(), buffers["conv2.bn.running_var"])
    assert main(["checkpoint", "import", str(tmp_path / "w.pt"), "--model", os.path.join(MODELS, "digits_cnn.yaml"),
                 "-o", str(tmp_path / "back.h5")]) == 0
    back = load_checkpoint(tmp_path / "back.h5")
    assert back.step == 0 and not back.momentum
    for name in params:
        np.testing.assert_array_equal(back.params[name], params[name])
    for name in buffers:
        np.testing.assert_array_equal(back.buffers[name], buffers[name])


def test_torchvision_layouts_import_with_bfloat16_and_extra_heads_dropped(tmp_path):
    graph = load_model(os.path.join(MODELS, "alexnet.yaml"))
    model = torchvision_alexnet()
    state = {key: value.to(torch.bfloat16) for key, value in model.state_dict().items()}
    torch.save({**state, "AuxLogits.fc.weight": torch.zeros(3)}, tmp_path / "a.pt")
    with pytest.raises(CheckpointError, match="unexpected AuxLogits.fc.weight"):
        import_torch(tmp_path / "a.pt", graph, tmp_path / "a.h5")
    import_torch(tmp_path / "a.pt", graph, tmp_path / "a.h5", drop=["AuxLogits."])
    ckpt = load_checkpoint(tmp_path / "a.h5")
    assert ckpt.params["conv2.weight"].dtype == np.float32
    np.testing.assert_array_equal(ckpt.params["conv2.weight"], state["features.3.weight"].float().numpy())
    torch.save(torch.nn.Linear(2, 2), tmp_path / "whole.pt")          # a whole module, pickled
    with pytest.raises(CheckpointError, match=r"save model.state_dict\(\), not the model"):
        import_torch(tmp_path / "whole.pt", graph, tmp_path / "w.h5")


def test_state_dicts_that_do_not_fit_are_refused(tmp_path):
    graph = load_model(os.path.join(MODELS, "digits_cnn.yaml"))
    _, params, buffers = weights(graph)
    good = {k: torch.from_numpy(np.asarray(v)) for k, v in state_dict(graph, params, buffers).items()}
    cases = [({k: v for k, v in good.items() if k != "fc2.bias"}, "missing fc2.bias"),
             ({**good, "fc3.weight": torch.zeros(2)}, "unexpected fc3.weight"),
             ({**good, "fc2.bias": torch.zeros(11)}, "fc2.bias has shape (11,), the model needs (10,)"),
             ({**good, "fc2.num_batches_tracked": torch.tensor(3)}, "unexpected fc2.num_batches_tracked"),
             ({**good, "fc2.bias": torch.zeros(10, dtype=torch.int64)}, "fc2.bias holds torch.int64")]
    for state, message in cases:
        torch.save(state, tmp_path / "x.pt")
        with pytest.raises(CheckpointError, match=message.replace("(", "\\(").replace(")", "\\)")):
            import_torch(tmp_path / "x.pt", graph, tmp_path / "x.h5")
    (tmp_path / "junk.pt").write_bytes(b"not a zip file")
    with pytest.raises(CheckpointError, match="not a PyTorch state dict"):
        import_torch(tmp_path / "junk.pt", graph, tmp_path / "x.h5")
    with pytest.raises(CheckpointError, match="absent.pt: file not found"):
        import_torch(tmp_path / "absent.pt", graph, tmp_path / "x.h5")
    assert not (tmp_path / "x.h5").exists()
    save_checkpoint(tmp_path / "run.h5", model_text=graph.text, params=params, buffers=buffers)
    with pytest.raises(CheckpointError, match="does not fit model 'alexnet'"):
        export_torch(tmp_path / "run.h5", tmp_path / "y.pt", load_model(os.path.join(MODELS, "alexnet.yaml")))
