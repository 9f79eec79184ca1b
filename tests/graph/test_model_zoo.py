"""The shipped models: exact parameter counts (docs/formats.md#model-files), shapes, FLOPs and torchvision names."""

import os

import pytest

from spmdcnn.graph import load_model

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")

TORCHVISION_PARAMS = {
    "alexnet": 61_100_840,
    "vgg16": 138_357_544,
    "inception_v3": 23_834_568,
    "resnet50": 25_557_032,
    # written by spmdcnn model import (tests/graph/test_torchimport.py checks they are its output today)
    "efficientnet_b0": 5_288_548,
    "convnext_tiny": 28_589_128,
    "resnext50_32x4d": 25_028_904,
    "regnet_y_400mf": 4_344_144,
    "mobilenet_v3_large": 5_483_032,
}


def load(name):
    return load_model(os.path.join(MODELS, f"{name}.yaml"))


@pytest.mark.parametrize("name,count", sorted(TORCHVISION_PARAMS.items()))
def test_parameter_counts_match_torchvision(name, count):
    assert load(name).num_params == count


def test_every_shipped_model_loads():
    names = sorted(f[:-5] for f in os.listdir(MODELS) if f.endswith(".yaml"))
    assert set(TORCHVISION_PARAMS) <= set(names)
    for name in names:
        graph = load(name)
        assert graph.loss.spec.loss and graph.loss is graph.layers[-1]
        assert graph.num_params > 0


def test_alexnet_shapes_and_flops():
    graph = load("alexnet")
    shapes = {layer.name: layer.out_shape for layer in graph.layers}
    assert shapes["conv1"] == (64, 55, 55)
    assert shapes["pool5"] == (256, 6, 6)
    assert shapes["flat"] == (9216,)
    assert shapes["fc8"] == (1000,)
    # AlexNet (torchvision) is 0.71 GMACs per image; FLOPs count a multiply-add as two.
    assert 1.40e9 < graph.flops(1) < 1.46e9
    assert graph.flops(32) == 32 * graph.flops(1)


def test_resnet50_uses_torchvision_parameter_names():
    names = set(load("resnet50").param_shapes())
    for expected in ("conv1.weight", "bn1.bias", "layer1.0.conv1.weight", "layer1.0.downsample.0.weight",
                     "layer1.0.downsample.1.weight", "layer4.2.bn3.weight", "fc.weight", "fc.bias"):
        assert expected in names
    assert load("resnet50").param_shapes()["layer3.0.downsample.0.weight"] == (1024, 512, 1, 1)


def test_inception_v3_uses_torchvision_parameter_names():
    graph = load("inception_v3")
    shapes = graph.param_shapes()
    assert shapes["Conv2d_1a_3x3.conv.weight"] == (32, 3, 3, 3)
    assert shapes["Mixed_6b.branch7x7_2.conv.weight"] == (128, 128, 1, 7)
    assert shapes["Mixed_7c.branch3x3_2b.conv.weight"] == (384, 384, 3, 1)
    assert shapes["fc.weight"] == (1000, 2048)
    assert graph.by_name["Mixed_7c.concat"].out_shape == (2048, 8, 8)
    assert graph.by_name["Mixed_5b.branch1x1.bn"].attrs["eps"] == 0.001


def test_inception_v3_without_batch_norm_is_torchvisions_with_a_bias_for_each_batch_norm():
    """The paper's Inception-v3 (no batch norm): the same layers and shapes, every convolution with a bias, no
    batchnorm layer; the parameters are torchvision's less each batch norm's gamma (its beta becomes the bias)."""
    with_bn, without = load("inception_v3"), load("inception_v3_nobn")
    assert not any(layer.op == "batchnorm2d" for layer in without.layers)
    batchnorm = [layer for layer in with_bn.layers if layer.op == "batchnorm2d"]
    assert without.num_params == with_bn.num_params - sum(layer.out_shape[0] for layer in batchnorm) == 23_817_352
    convs = {layer.name: layer.out_shape for layer in with_bn.layers if layer.op == "conv2d"}
    assert {layer.name: layer.out_shape for layer in without.layers if layer.op == "conv2d"} == convs
    assert all("bias" in without.by_name[name].params for name in convs)
    assert without.by_name["Mixed_7c.concat"].out_shape == (2048, 8, 8)


def test_groups_name_the_top_level_entries():
    graph = load("resnet50")
    assert graph.by_name["layer2.0.conv2"].group == "layer2.0"
    assert graph.by_name["fc"].group == "fc"


def test_execution_order_puts_producers_first():
    for name in ("inception_v3", "resnet50", "small_inception", "small_resnet"):
        seen = {"data"}
        for layer in load(name).layers:
            assert all(ref in seen for ref in layer.inputs), layer.name
            seen.add(layer.name)
