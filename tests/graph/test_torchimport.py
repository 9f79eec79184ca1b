"""``spmdcnn model import``: torchvision's modern CNNs and a network written here evaluate, through the imported model
and its imported weights, to PyTorch's loss (float64, evaluation mode); the shipped models are the importer's output
and move torchvision's state dicts both ways strictly; what cannot be imported is refused in one message, with
nothing written."""

import os

import numpy as np
import pytest
import torch

from spmdcnn.cli import main
from spmdcnn.graph import load_model
from spmdcnn.graph.torchimport import (ImportFailure, import_model, import_module, load_module, load_torchvision,
                                      randomized)
from spmdcnn.graph.torchops import main_output
from spmdcnn.io.checkpoint import CheckpointError, load_checkpoint
from spmdcnn.io.torchstate import export_torch, import_torch
from spmdcnn.runtime.executor import Executor
from spmdcnn.runtime.torchcheck import check_import

try:
    load_torchvision()
except ImportFailure as missing:        # CI installs it (the test extra); elsewhere these tests say what is missing
    pytest.skip(f"spmdcnn model import's tests need torchvision: {missing}", allow_module_level=True)

from imported_networks import NETWORKS as IMPORTED_NETWORKS  # noqa: E402
from imported_networks import build as build_imported  # noqa: E402
from imported_networks import path as imported_path  # noqa: E402
from torch_networks import ZOO  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NETWORKS = os.path.join(HERE, "torch_networks.py")
MODELS = os.path.join(HERE, "..", "..", "models")
TORCHVISION_PARAMS = {"efficientnet_b0": 5_288_548, "convnext_tiny": 28_589_128, "resnext50_32x4d": 25_028_904,
                      "regnet_y_400mf": 4_344_144, "mobilenet_v3_large": 5_483_032}


def evaluate(graph, checkpoint, images, labels):
    """spmdcnn's loss of ``graph`` with the checkpoint's weights, one process, float64, evaluation mode."""
    executor = Executor(graph, np, np.float64, seed=0)
    ckpt = load_checkpoint(checkpoint)
    for name, value in {**ckpt.params, **ckpt.buffers}.items():
        (executor.params if name in ckpt.params else executor.buffers)[name][...] = value
    loss, *_ = executor.forward(images, labels, training=False)
    return loss


def reference(source, images, labels):
    module, _ = load_module(source)
    module = module.double().eval()
    with torch.no_grad():
        logits, _ = main_output(module(torch.from_numpy(images)))
        return torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels)).item()


def assert_matches(source, graph, weights, images, labels):
    """The imported ``graph`` with its ``weights`` evaluates to the network's own loss on these samples."""
    assert evaluate(graph, weights, images, labels) == pytest.approx(reference(source, images, labels), rel=1e-10)


def checked(module, graph, arrays, input_shape):
    """:func:`check_import` held to 1e-10: one SGD step's loss, and the evaluation loss after it, are PyTorch's."""
    step, after = check_import(module, graph, arrays, input_shape)
    assert step <= 1e-10 and after <= 1e-10, (step, after)


@pytest.mark.parametrize("name", ZOO)
def test_a_torchvision_model_takes_one_training_step_as_torchvision_does(tmp_path, name):
    source = f"{NETWORKS}:{name}"           # torchvision's model with random weights and statistics
    graph = import_model(source, tmp_path / "model.yaml", (3, 40, 40), weights=tmp_path / "weights.h5",
                         check=checked)
    assert graph.num_params == TORCHVISION_PARAMS[name]


def test_an_imported_network_trains_as_the_network_does(tmp_path, capsys):
    """Given in evaluation mode, the network is imported as it trains: its dropouts (a module's and a function's)
    and stochastic depth with their probabilities, its batch norm with its momentum; the module keeps its mode."""
    source = f"{NETWORKS}:stochastic"
    code = main(["model", "import", source, "--input", "2", "6", "6", "-o", str(tmp_path / "s.yaml"), "--check"])
    assert code == 0
    assert "model import: checked against the network: one SGD step in float64" in capsys.readouterr().out
    graph = load_model(tmp_path / "s.yaml")
    kept = {layer.name: (layer.op, layer.attrs.get("p", layer.attrs.get("momentum"))) for layer in graph.layers
            if layer.op in ("dropout", "stochastic_depth", "batchnorm2d")}
    assert kept == {"norm": ("batchnorm2d", 0.3), "drop": ("dropout", 0.25), "depth": ("stochastic_depth", 0.2),
                    "dropout": ("dropout", 0.1)}
    module, _ = load_module(source)
    state = {key: value.clone() for key, value in module.state_dict().items()}
    import_module(module, tmp_path / "again.yaml", (2, 6, 6), source=source)
    assert not module.training and all(torch.equal(value, state[key]) for key, value in module.state_dict().items())


def test_a_plain_network_imports_and_matches(tmp_path, capsys):
    source = f"{NETWORKS}:plain"
    code = main(["model", "import", source, "--input", "2", "10", "10", "-o", str(tmp_path / "plain.yaml"),
                 "--weights", str(tmp_path / "plain.h5")])
    assert code == 0
    assert "wrote" in capsys.readouterr().out
    graph = load_model(tmp_path / "plain.yaml")
    ops = {layer.op for layer in graph.layers}
    assert {"layernorm", "layer_scale", "mul", "concat", "gelu", "silu", "sigmoid", "global_avgpool"} <= ops
    assert graph.by_name["expand"].op == "conv2d" and graph.torch_shapes["expand.weight"] == (16, 8)
    assert graph.by_name["pool"].attrs["ceil_mode"] and graph.by_name["depthwise"].attrs["groups"] == 8
    assert graph.by_name["up"].attrs["groups"] == 4
    rng = np.random.default_rng(2)
    images, labels = rng.standard_normal((3, 2, 10, 10)), rng.integers(0, 5, 3)
    assert_matches(source, graph, tmp_path / "plain.h5", images, labels)


def test_a_sequence_network_imports_and_matches(tmp_path):
    source = f"{NETWORKS}:sequence"
    graph = import_model(source, tmp_path / "sequence.yaml", (2, 12), weights=tmp_path / "sequence.h5")
    assert graph.name == "sequence"
    assert [layer.op for layer in graph.layers] == ["conv1d", "batchnorm1d", "leaky_relu", "avgpool1d", "flatten",
                                                    "linear", "softmax_cross_entropy"]     # dropout(training=False)
    assert graph.by_name["leaky_relu"].attrs["negative_slope"] == 0.2
    rng = np.random.default_rng(6)
    images, labels = rng.standard_normal((3, 2, 12)), rng.integers(0, 3, 3)
    assert_matches(source, graph, tmp_path / "sequence.h5", images, labels)


@pytest.mark.parametrize("callable_, left_out", [("segmenter", "output 'aux'"), ("segmenter_tuple", "output 1"),
                                                ("named_outputs", "output 1")])
def test_a_segmenter_imports_its_main_output_with_a_loss_per_pixel(tmp_path, capsys, callable_, left_out):
    """Per-pixel logits (N, K, H, W) get the per-position cross-entropy (PyTorch's F.cross_entropy over the
    pixels); the auxiliary head is left out, said in one line, its weights not in the checkpoint; a mean over
    both spatial axes is a global average pooling, a concatenation of one tensor is that tensor."""
    source = f"{NETWORKS}:{callable_}"
    code = main(["model", "import", source, "--input", "2", "8", "8", "-o", str(tmp_path / "seg.yaml"),
                 "--weights", str(tmp_path / "seg.h5")])
    out = capsys.readouterr().out
    left = 15 if callable_ == "named_outputs" else 21
    assert code == 0 and f"the model leaves out {left_out} (the layers only they read: {left} parameters)" in out, out
    graph = load_model(tmp_path / "seg.yaml")
    assert graph.layers[-1].op == "softmax_cross_entropy" and not {"aux_head", "aux"} & set(graph.by_name)
    assert graph.by_name["mean"].op == "global_avgpool"
    module, _ = load_module(source)
    assert graph.num_params == sum(p.numel() for p in module.parameters()) - left
    assert sorted(load_checkpoint(tmp_path / "seg.h5").params) == sorted(graph.param_shapes())
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 3, 2 if callable_ == "named_outputs" else (2, 8, 8))
    images = rng.standard_normal((2, 2, 8, 8))
    assert_matches(source, graph, tmp_path / "seg.h5", images, labels)


def test_a_transposed_convolution_told_its_output_size_imports_with_its_output_padding(tmp_path):
    source = f"{NETWORKS}:sized"        # torch.export resolves output_size to the output padding it means
    graph = import_model(source, tmp_path / "sized.yaml", (2, 3, 3), weights=tmp_path / "sized.h5")
    assert graph.by_name["up"].attrs["output_padding"] == 1
    rng = np.random.default_rng(7)
    images, labels = rng.standard_normal((2, 2, 3, 3)), rng.integers(0, 2, 2)
    assert_matches(source, graph, tmp_path / "sized.h5", images, labels)


def test_the_loss_is_chosen_with_loss(tmp_path):
    graph = import_model(f"{NETWORKS}:segmenter", tmp_path / "dice.yaml", (2, 8, 8), loss="dice_ce")
    loss = graph.layers[-1]
    assert loss.op == "dice_loss" and loss.attrs["dice"] == 1.0 and loss.attrs["cross_entropy"] == 1.0
    assert loss.attrs["include_background"] and loss.attrs["smooth"] == 1e-5      # MONAI's DiceCELoss defaults
    graph = import_model(f"{NETWORKS}:pooled", tmp_path / "mse.yaml", (2, 6, 6), loss="mse")
    assert graph.layers[-1].op == "mse_loss"
    with pytest.raises(ImportFailure, match="--loss mse compares values per sample"):
        import_model(f"{NETWORKS}:segmenter", tmp_path / "no.yaml", (2, 8, 8), loss="mse")
    assert not (tmp_path / "no.yaml").exists()


def test_pooling_written_as_functions_imports_as_pooling(tmp_path):
    source = f"{NETWORKS}:functional_pools"
    graph = import_model(source, tmp_path / "pools.yaml", (2, 11, 11), weights=tmp_path / "pools.h5")
    pools = [layer for layer in graph.layers if "pool" in layer.op]
    assert [(layer.op, layer.attrs.get("stride"), layer.attrs.get("ceil_mode", False)) for layer in pools] == [
        ("maxpool2d", None, False), ("avgpool2d", 1, False), ("maxpool2d", None, True)]
    rng = np.random.default_rng(5)
    images, labels = rng.standard_normal((3, 2, 11, 11)), rng.integers(0, 3, 3)
    assert_matches(source, graph, tmp_path / "pools.h5", images, labels)


def test_a_mean_over_the_spatial_axes_is_a_global_average_pooling(tmp_path):
    source = f"{NETWORKS}:pooled"
    graph = import_model(source, tmp_path / "pooled.yaml", (2, 6, 6), weights=tmp_path / "pooled.h5")
    assert [layer.op for layer in graph.layers] == ["conv2d", "global_avgpool", "flatten", "linear",
                                                    "softmax_cross_entropy"]
    rng = np.random.default_rng(4)
    images, labels = rng.standard_normal((3, 2, 6, 6)), rng.integers(0, 3, 3)
    assert_matches(source, graph, tmp_path / "pooled.h5", images, labels)


def test_the_command_line_routes_model_import_after_options():
    from spmdcnn.cli import routed
    assert routed(["--debug", "model", "import", "x.py:f"]) == ["--debug", "model-import", "x.py:f"]
    assert routed(["model", "models/alexnet.yaml"]) == ["model", "models/alexnet.yaml"]


@pytest.mark.parametrize("name", ZOO)
def test_the_shipped_models_are_the_importers_and_move_torchvision_weights_both_ways(tmp_path, name):
    written = tmp_path / f"{name}.yaml"
    import_model(f"torchvision:{name}", written)
    shipped = os.path.join(MODELS, f"{name}.yaml")
    with open(shipped) as file:
        assert written.read_text() == file.read(), f"models/{name}.yaml is not what the importer writes today"
    assert "\nblocks:\n" in written.read_text(), "its repeated modules are written once, as blocks"
    graph = load_model(shipped)
    assert graph.num_params == TORCHVISION_PARAMS[name]
    module, _ = load_module(f"{NETWORKS}:{name}")
    torch.save(module.state_dict(), tmp_path / "state.pt")
    import_torch(tmp_path / "state.pt", graph, tmp_path / "ckpt.h5")
    export_torch(tmp_path / "ckpt.h5", tmp_path / "back.pt", graph)
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    fresh, _ = load_module(f"torchvision:{name}")
    fresh.load_state_dict(back, strict=True)
    for key, value in module.state_dict().items():
        if value.is_floating_point():
            assert torch.equal(fresh.state_dict()[key], value), key


@pytest.mark.parametrize("callable_, shape, fragments", [
    ("recurrent", ["2", "10"], ["2 nodes are refused: (1) aten.lstm in module 'lstm' (LSTM): maps to no spmdcnn op",
                                "(2) aten.select (node 'select')", "spmdcnn maps the ATen operators", "conv2d"]),
    ("branching", ["2", "10", "10"], ["torch.export cannot capture its forward at ", "torch_networks.py:85 (if "
                                      "x.sum() > 0:)", "make such a choice a constructor argument"]),
    ("plain", ["2", "6", "6"], ["the network cannot take an input of 2x6x6", "at 'head.2'"]),
    ("absent", ["2", "6", "6"], ["has no function or class 'absent'"]),
    ("pooled_last", ["4", "4", "3"], ["aten.adaptive_avg_pool2d (node 'adaptive_avg_pool2d')",
                                      "channels second"]),
    ("attending", ["2", "4", "4"], ["it is built on attention over activations (", "MultiheadAttention",
                                     "spmdcnn imports convolutional networks"]),
    ("unmapped", ["4", "3", "3"], ["3 nodes are refused: (1) aten.pixel_shuffle in module 'shuffle' (PixelShuffle)",
                                   "(2) aten.softplus in module 'soft' (Softplus)", "(3) aten.logsumexp (node "]),
])
def test_what_cannot_be_imported_is_one_message_and_nothing_is_written(tmp_path, capsys, callable_, shape,
                                                                      fragments):
    output, weights = tmp_path / "model.yaml", tmp_path / "weights.h5"
    code = main(["model", "import", f"{NETWORKS}:{callable_}", "--input", *shape, "-o", str(output),
                 "--weights", str(weights)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("spmdcnn: error:") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err
    assert not output.exists() and not weights.exists()


def test_sources_it_does_not_know(tmp_path):
    with pytest.raises(ImportFailure, match="torchvision has no classification, segmentation or video model "
                                            "'resnet0'"):
        import_model("torchvision:resnet0", tmp_path / "m.yaml")
    with pytest.raises(ImportFailure, match="expected torchvision:NAME or FILE.py:CALLABLE"):
        import_model("resnet50", tmp_path / "m.yaml")
    with pytest.raises(ImportFailure, match="give the input's shape with --input"):
        import_model(f"{NETWORKS}:plain", tmp_path / "m.yaml")
    assert not (tmp_path / "m.yaml").exists()


def test_the_import_table_of_the_docs_lists_every_operator_mapped():
    """docs/formats.md's table names each ATen operator and module the importer maps, and no other."""
    import re

    from spmdcnn.graph.torchaten import ATEN, MODULES
    with open(os.path.join(HERE, "..", "..", "docs", "formats.md")) as file:
        text = file.read()
    table = text[text.index("| ATen operator (training graph) |"):]
    table = table[:table.index("\n\n")]
    listed = set()
    for row in table.splitlines()[2:]:
        first = row.split(" | ")[0]
        for stem, ranks, rest in re.findall(r"`aten\.(\w*?)((?:\dd/)*\dd)?(\w*)`", first):
            ranks = ranks.split("/") if ranks else [""]
            listed |= {f"{stem}{rank}{rest}" for rank in ranks}
        listed |= {name for name in re.findall(r"`(\w+)`", first) if name in MODULES or name == "getitem"}
    assert listed == set(ATEN) | set(MODULES)


def _library(name):
    """timm, MONAI or segmentation-models-pytorch (the test extra installs them), or a skip saying so."""
    import importlib
    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.skip(f"{name} is not installed (pip install -e .[test] installs it)")


@pytest.mark.parametrize("name", sorted(IMPORTED_NETWORKS))
def test_the_mpi_suites_imported_networks_are_the_importers(tmp_path, name):
    """tests/mpi/imported/NAME.yaml (trained under random plans on the ranks) is what the importer writes today, and
    the network takes one SGD step as the import does: MONAI's UNet, BasicUNet, SegResNet, DynUNet, DenseNet and
    ResNet in 3D, smp's U-Net."""
    library, call, shape = IMPORTED_NETWORKS[name]
    _library(library)
    written = tmp_path / f"{name}.yaml"
    import_module(build_imported(name), written, shape, source=call, check=checked)
    with open(imported_path(name)) as file:
        assert written.read_text() == file.read(), f"{imported_path(name)} is not what the importer writes today"


@pytest.mark.parametrize("library, build, shape", [
    ("monai", lambda m: m.networks.nets.UNet(3, 1, 3, (4, 8, 16), (2, 2), num_res_units=2), (1, 16, 16, 16)),
    ("segmentation_models_pytorch", lambda m: m.Unet("resnet18", encoder_weights=None, encoder_depth=3,
                                                     decoder_channels=(16, 8, 4), classes=3), (3, 32, 32)),
    ("timm", lambda m: m.create_model("mobilenetv2_035", num_classes=5), (3, 32, 32)),
], ids=["monai-UNet", "smp-Unet", "timm-mobilenetv2"])
def test_networks_of_other_libraries_take_one_training_step_as_they_do(tmp_path, library, build, shape):
    """MONAI's 3D U-Nets (PReLU, instance norm, transposed convolutions, UpCat's padding), smp's U-Net (its
    decoder's interpolation to its skip's size), timm's MobileNetV2 (its BatchNormAct2d): imported as they train,
    one SGD step in float64 as they take it."""
    package = _library(library)
    torch.manual_seed(0)
    module = randomized(build(package))
    said = []
    graph = import_module(module, tmp_path / "model.yaml", shape, source=library, check=checked, say=said.append)
    unread = sum(p.numel() for name, p in module.named_parameters() if name.startswith(("encoder.layer3.",
                                                                                        "encoder.layer4.")))
    assert graph.num_params == sum(p.numel() for p in module.parameters()) - (library == "segmentation_models_pytorch"
                                                                              and unread)
    if library == "segmentation_models_pytorch":        # its encoder's last stages, unused at encoder_depth 3
        assert len(said) == 1 and said[0].startswith(f"model import: {library} never reads {unread:,} of its "
                                                     "parameters (in encoder.layer3.0.bn1, ") and \
            said[0].endswith(" more modules); the model leaves them out"), said


def test_splits_slices_shuffles_and_pads_import_as_the_network_trains(tmp_path):
    """Res2Net's and CSPNet's channel splits, slices, ShuffleNet's channel shuffle, a constant pad, average pooling
    that leaves the padding out, learned factors and shifts shared by every channel or per channel, batch norm of
    features: the layers they are, one SGD step as the network takes it."""
    module, _ = load_module(f"{NETWORKS}:idioms")
    graph = import_module(module, tmp_path / "idioms.yaml", (2, 9, 9), source="idioms", check=checked)
    kinds = [(layer.op, {key: value for key, value in layer.attrs.items() if key in ("start", "stop", "groups",
                                                                                      "padding", "value",
                                                                                      "count_include_pad")})
             for layer in graph.layers if layer.op in ("slice", "channel_shuffle", "pad", "avgpool2d")]
    assert kinds == [("avgpool2d", {"padding": 1, "count_include_pad": False}),
                     ("slice", {"start": 0, "stop": 4}), ("slice", {"start": 4, "stop": 8}),
                     ("slice", {"start": 0, "stop": 2}), ("slice", {"start": 2, "stop": 4}),
                     ("channel_shuffle", {"groups": 2}),
                     ("pad", {"padding": [[0, 1], [0, 1]], "value": 0.1}),
                     ("slice", {"start": 0, "stop": 6}), ("slice", {"start": 2, "stop": 8})]
    assert [layer.name for layer in graph.layers if layer.op == "slice"] == [
        "split_with_sizes", "split_with_sizes_1", "chunk", "chunk_1", "slice", "narrow"]
    shifts = [(layer.op, layer.name, layer.attrs.get("shared")) for layer in graph.layers
              if layer.op in ("layer_scale", "bias", "batchnorm1d")]
    assert shifts == [("layer_scale", "gain", True), ("bias", "offset", True), ("bias", "channel_bias", False),
                      ("batchnorm1d", "norm", None)]
    assert graph.torch_shapes == {}


def test_space_to_depth_imports_in_either_order(tmp_path):
    module, _ = load_module(f"{NETWORKS}:stems")
    graph = import_module(module, tmp_path / "stems.yaml", (2, 8, 8), source="stems", check=checked)
    assert [(layer.name, layer.attrs["size"], layer.attrs["order"]) for layer in graph.layers
            if layer.op == "space_to_depth"] == [("s2d", 2, "blocks"), ("unshuffle", 2, "channels"),
                                                 ("unshuffle_1", 2, "channels")]


def test_a_module_registered_twice_exports_under_both_paths_and_imports_back(tmp_path):
    """MONAI's DynUNet holds its encoder's blocks in ``skip_layers`` too: the model names the other paths
    (``torch_aliases``), the exported state dict loads into a fresh DynUNet strictly, and the network's own state
    dict imports; copies that differ are refused."""
    _library("monai")
    module = build_imported("monai_dynunet")
    graph = load_model(imported_path("monai_dynunet"))
    assert graph.torch_aliases["skip_layers.downsample"] == ["input_block"]
    torch.save(module.state_dict(), tmp_path / "state.pt")
    import_torch(tmp_path / "state.pt", graph, tmp_path / "ckpt.h5")
    export_torch(tmp_path / "ckpt.h5", tmp_path / "back.pt", graph)
    fresh = build_imported("monai_dynunet")
    for parameter in fresh.parameters():
        parameter.data.zero_()
    fresh.load_state_dict(torch.load(tmp_path / "back.pt", weights_only=True), strict=True)
    for key, value in module.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    state = module.state_dict()
    state["input_block.conv1.conv.weight"] = state["input_block.conv1.conv.weight"] + 1
    torch.save(state, tmp_path / "differ.pt")
    with pytest.raises(CheckpointError, match="input_block.conv1.conv.weight and skip_layers.downsample.conv1.conv."
                                              "weight hold different tensors"):
        import_torch(tmp_path / "differ.pt", graph, tmp_path / "no.h5")


def test_timms_simple_norm_and_selu_mish_elu_hardtanh_import(tmp_path):
    module, _ = load_module(f"{NETWORKS}:simply_normed")
    graph = import_module(module, tmp_path / "normed.yaml", (2, 5, 5), source="normed", check=checked)
    norm = graph.by_name["norm"]
    assert norm.op == "layernorm" and list(norm.params) == ["weight"]
    assert (norm.attrs["center"], norm.attrs["correction"], norm.attrs["eps"]) == (False, 1, 1e-6)
    activations = [(layer.op, {key: layer.attrs[key] for key in ("alpha", "gain", "min_val") if key in layer.attrs})
                   for layer in graph.layers if layer.op in ("elu", "mish", "hardtanh")]
    assert activations == [("elu", {"alpha": 1.6732632423543772, "gain": 1.0507009873554805}), ("mish", {}),
                           ("elu", {"alpha": 0.5, "gain": 1.0}), ("hardtanh", {"min_val": -0.25})]


def test_split_attention_imports_as_slices_sums_and_a_softmax_across_groups(tmp_path):
    """SKNet's stacked paths and ResNeSt's radix groups: a concat, the groups' slices added, a group_softmax (timm's
    RadixSoftmax by its type), products of groups; one SGD step as the network takes it."""
    module, _ = load_module(f"{NETWORKS}:split_attention")
    graph = import_module(module, tmp_path / "split.yaml", (2, 6, 6), source="split", check=checked)
    ops = [layer.op for layer in graph.layers]
    assert ops.count("group_softmax") == 2 and ops.count("concat") == 1 and ops.count("mul") == 2
    assert graph.by_name["rsoftmax"].attrs["groups"] == 2


def test_global_sums_maxima_and_arithmetic_with_numbers_import(tmp_path):
    module, _ = load_module(f"{NETWORKS}:reduced")
    graph = import_module(module, tmp_path / "reduced.yaml", (2, 5, 6), source="reduced", check=checked)
    pooled = [(layer.op, layer.attrs.get("kernel"), layer.attrs.get("factor")) for layer in graph.layers
              if layer.op in ("global_avgpool", "maxpool2d", "scale")]
    assert pooled == [("scale", None, 1.0), ("global_avgpool", None, None), ("scale", None, 30.0),
                      ("scale", None, 0.01), ("scale", None, -1.0), ("scale", None, 1.0), ("scale", None, -1.0),
                      ("maxpool2d", [5, 6], None), ("maxpool2d", [5, 6], None), ("global_avgpool", None, None)]
    assert [layer.attrs["shift"] for layer in graph.layers if layer.op == "scale"] == [-0.25, 0, 0, 1.5, 1, 0]
    assert [layer.inputs for layer in graph.layers if layer.op == "concat"] == [["slice", "slice"], ["slice_1"] * 4]
    assert [(layer.attrs["min"], layer.attrs["max"]) for layer in graph.layers if layer.op == "clamp"] == [(-0.5, None)]
