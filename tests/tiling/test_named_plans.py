"""Named strategies (plan.py): ``data`` splits every layer over n, ``model`` every layer over c (flatten and the
loss over n), ``owt`` data for image layers and model for linear layers; a dimension shorter than the device
count is split over as many devices as it has elements; ``auto`` belongs to the planner, not to plan files."""

import pytest
import yaml

from tiling_cases import SMALL_MODELS, handmade, model
from spmdcnn.tiling import ParallelConfig, load_plan
from spmdcnn.tiling.config import output_shape
from spmdcnn.tiling.plan import PlanError, from_mapping

BATCH = 8


def split(shape, axis, devices):
    degree = min(devices, shape[axis])
    return ParallelConfig(tuple(degree if i == axis else 1 for i in range(len(shape))), tuple(range(degree)))


@pytest.mark.parametrize("model_name", SMALL_MODELS)
@pytest.mark.parametrize("devices", [1, 3, 4, 16])
def test_data_splits_every_layer_over_the_batch(model_name, devices):
    graph = model(model_name)
    plan = load_plan("data", graph, BATCH, devices)
    for layer in graph.layers:
        assert plan[layer.name] == split(output_shape(layer, BATCH), 0, devices), layer.name
    assert plan.devices == devices and "data" in plan.source


@pytest.mark.parametrize("model_name", SMALL_MODELS)
@pytest.mark.parametrize("devices", [1, 3, 4, 16])
def test_model_splits_channels_and_features_and_the_batch_of_flatten_and_loss(model_name, devices):
    graph = model(model_name)
    plan = load_plan("model", graph, BATCH, devices)
    axes = {}
    for layer in graph.layers:
        axes[layer.name] = axis = 0 if layer.op == "flatten" or layer.spec.loss else 1
        if layer.spec.inherits:
            axes[layer.name] = axis = axes[layer.inputs[0]]                # e.g. a dropout after flatten: n
        assert plan[layer.name] == split(output_shape(layer, BATCH), axis, devices), layer.name


@pytest.mark.parametrize("model_name", SMALL_MODELS)
@pytest.mark.parametrize("devices", [2, 4, 16])
def test_owt_is_data_for_image_layers_and_model_for_linear_layers(model_name, devices):
    graph = model(model_name)
    plan = load_plan("owt", graph, BATCH, devices)
    linear_like = set()
    for layer in graph.layers:
        if layer.op == "linear" or (layer.spec.inherits and layer.inputs[0] in linear_like):
            linear_like.add(layer.name)
        axis = 1 if layer.name in linear_like else 0
        assert plan[layer.name] == split(output_shape(layer, BATCH), axis, devices), layer.name


def test_model_plan_caps_a_degree_at_the_extent():
    graph = handmade([{"name": "conv", "op": "conv2d", "out_channels": 6, "kernel": 3}])     # fc: 3 outputs
    plan = load_plan("model", graph, BATCH, 4)
    assert plan["fc"] == ParallelConfig((1, 3), (0, 1, 2))
    assert plan["conv"] == ParallelConfig((1, 4, 1, 1), (0, 1, 2, 3))
    assert plan["flat"] == ParallelConfig((4, 1), (0, 1, 2, 3))
    assert plan["loss"] == ParallelConfig((4,), (0, 1, 2, 3))
    assert plan["fc"].tile_of(3, plan.shape("fc")) is None


def test_model_plan_splits_a_grouped_convolution_in_whole_groups():
    graph = handmade([{"name": "grouped", "op": "conv2d", "out_channels": 6, "kernel": 3, "groups": 3}])
    plan = load_plan("model", graph, BATCH, 4)
    assert plan["grouped"] == ParallelConfig((1, 3, 1, 1), (0, 1, 2))      # 4 would cut a group of 2


def test_data_plan_caps_the_batch_degree():
    plan = load_plan("data", model("tiny_cnn"), 2, 4)
    assert plan["conv1"] == ParallelConfig((2, 1, 1, 1), (0, 1))
    assert plan["loss"] == ParallelConfig((2,), (0, 1))


@pytest.mark.parametrize("spec", ["auto", None])
def test_auto_is_left_to_the_planner(spec):
    with pytest.raises(PlanError, match="planner"):
        load_plan(spec, model("small_resnet"), BATCH, 4)


@pytest.mark.parametrize("strategy", ["data", "model", "owt"])
@pytest.mark.parametrize("model_name", SMALL_MODELS)
def test_named_plans_are_valid_plans_and_round_trip(strategy, model_name):
    graph = model(model_name)
    plan = load_plan(strategy, graph, BATCH, 4)
    again = from_mapping(yaml.safe_load(plan.text), graph, BATCH, 4, "again")
    assert again.configs == plan.configs
    assert again.digest() == plan.digest()


def test_different_plans_have_different_digests():
    graph = model("tiny_cnn")
    digests = {load_plan(s, graph, BATCH, 4).digest() for s in ("data", "model", "owt")}
    assert len(digests) == 3
