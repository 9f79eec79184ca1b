"""Any plan on any number of ranks computes what one process computes (docs/formats.md#training-semantics): the loss, every layer's
output and output gradient, every parameter gradient, and the weights, running statistics and momentum after
three SGD steps, for random per-layer plans (uneven splits, n/c/d/h/w and mixes, strided, dilated and padded
windows split over d, h and w, batchnorm over n, d and h, concat, add, dropout, permuted and partial device lists,
idle ranks), on images and volumes, and for the named strategies."""

import os

import numpy as np
import pytest

from conftest import agree
from decoder_models import (DECODER, DECODER_SEQUENCE, DECODER_VOLUME, IDIOMS, IDIOMS_VOLUME, SEGMENTER,
                            SEGMENTER_VOLUME)
from imported_networks import NETWORKS as IMPORTED_NETWORKS
from imported_networks import path as imported_path
from plans import answers, random_plan, uniform_plan
from spmdcnn.backend import to_numpy
from spmdcnn.graph import load_model
from spmdcnn.runtime.executor import Executor
from spmdcnn.runtime.optimizer import SGD
from spmdcnn.tiling.plan import from_mapping, named

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
BATCH = 5              # odd: splits over n are uneven
STEPS = 3
HYPER = dict(lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=False)
_REFERENCES = {}


# 1-wide windows that stride (their tiles read every s-th row or column only): on the data, with padding (up to
# tiles that read nothing but padding), mixed with a 3-wide window along the other axis, and pooling
STRIDED = {"name": "strided", "input": [3, 11, 10], "layers": [
    {"name": "c1", "op": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1},
    {"name": "down", "op": "conv2d", "out_channels": 5, "kernel": 1, "stride": 2},
    {"name": "padded", "op": "conv2d", "out_channels": 4, "kernel": 1, "stride": [2, 3], "padding": 1,
     "inputs": ["c1"]},
    {"name": "pool", "op": "maxpool2d", "kernel": 1, "stride": 2, "inputs": ["c1"]},
    {"name": "on_data", "op": "conv2d", "out_channels": 2, "kernel": 1, "stride": 2, "padding": [1, 2],
     "inputs": ["data"]},
    {"name": "mostly_padding", "op": "conv2d", "out_channels": 2, "kernel": 1, "stride": 2, "padding": 3,
     "inputs": ["c1"]},
    {"name": "mixed", "op": "conv2d", "out_channels": 3, "kernel": [1, 3], "stride": [2, 1], "padding": [1, 1],
     "inputs": ["c1"]}]
    + [{"name": f"f_{ref}", "op": "flatten", "inputs": [ref]}
       for ref in ("down", "padded", "pool", "on_data", "mostly_padding", "mixed")]
    + [{"name": f"l_{ref}", "op": "linear", "out_features": 6, "inputs": [f"f_{ref}"]}
       for ref in ("down", "padded", "pool", "on_data", "mostly_padding", "mixed")]
    + [{"name": "sum", "op": "add", "inputs": [f"l_{ref}" for ref in ("down", "padded", "pool", "on_data",
                                                                       "mostly_padding", "mixed")]},
       {"name": "loss", "op": "softmax_cross_entropy"}]}


# the same over volumes: kernel-1 windows striding over depth, height and width (with padding, on the data), an
# even kernel with padding 'same', a dilated window, batch norm, and a regression loss
STRIDED_VOLUME = {"name": "strided_volume", "input": [2, 9, 8, 7], "layers": [
    {"name": "c1", "op": "conv3d", "out_channels": 3, "kernel": 2, "padding": "same"},
    {"name": "bn", "op": "batchnorm3d"},
    {"name": "down", "op": "conv3d", "out_channels": 3, "kernel": 1, "stride": [2, 3, 2]},
    {"name": "on_data", "op": "conv3d", "out_channels": 2, "kernel": 1, "stride": 2, "padding": [1, 0, 2],
     "inputs": ["data"]},
    {"name": "dilated", "op": "conv3d", "out_channels": 2, "kernel": [2, 3, 1], "dilation": [3, 1, 1],
     "stride": [1, 2, 1], "padding": [[1, 2], [0, 1], [0, 0]], "inputs": ["bn"]},
    {"name": "pool", "op": "avgpool3d", "kernel": [1, 2, 2], "stride": 2, "inputs": ["c1"]}]
    + [{"name": f"f_{ref}", "op": "flatten", "inputs": [ref]} for ref in ("down", "on_data", "dilated", "pool")]
    + [{"name": f"l_{ref}", "op": "linear", "out_features": 2, "inputs": [f"f_{ref}"]}
       for ref in ("down", "on_data", "dilated", "pool")]
    + [{"name": "sum", "op": "add", "inputs": [f"l_{ref}" for ref in ("down", "on_data", "dilated", "pool")]},
       {"name": "loss", "op": "mse_loss"}]}


# sequences (N, C, W): the same ops over one spatial axis
SEQUENCE = {"name": "sequence", "input": [3, 17], "layers": [
    {"name": "c1", "op": "conv1d", "out_channels": 4, "kernel": 3, "padding": [[2, 0]], "dilation": 2},
    {"name": "bn", "op": "batchnorm1d"}, {"name": "act", "op": "leaky_relu"},
    {"name": "pool", "op": "maxpool1d", "kernel": 3, "stride": 2, "padding": 1},
    {"name": "c2", "op": "conv1d", "out_channels": 5, "kernel": 2, "padding": "same"},
    {"name": "avg", "op": "avgpool1d", "kernel": 2},
    {"name": "flat", "op": "flatten"}, {"name": "fc", "op": "linear", "out_features": 3},
    {"name": "loss", "op": "softmax_cross_entropy"}]}


INLINE = {model["name"]: model for model in (STRIDED, STRIDED_VOLUME, SEQUENCE, DECODER, DECODER_VOLUME,
                                             DECODER_SEQUENCE, SEGMENTER, SEGMENTER_VOLUME, IDIOMS, IDIOMS_VOLUME)}


# torchvision's modern CNNs as model import wrote them, one of each kind of block: ResNeXt-50's grouped bottlenecks
# are RegNetY's without its squeeze and excitation (tests/graph/test_torchimport.py still imports it and checks it
# against torchvision)
IMPORTED = ["efficientnet_b0", "convnext_tiny", "regnet_y_400mf", "mobilenet_v3_large"]
SMALL_INPUT = [3, 32, 32]      # the imported models at a size their strides take down to 1x1


# MONAI's and smp's networks as model import writes them (tests/imported_networks.py; tests/graph/test_torchimport.py
# checks each file is the importer's output today): residual units of convolutions, instance, group and batch norm,
# PReLU (one slope shared by every channel: its channels are never split), strided and transposed convolutions,
# upsampling, concatenations, dense blocks, a ResNet encoder
IMPORTED_ELSEWHERE = {name: imported_path(name) for name in IMPORTED_NETWORKS}


def _graph(name):
    from spmdcnn.graph.graph import parse_model
    from spmdcnn.io.yamlfile import read_yaml
    if name in IMPORTED_ELSEWHERE:
        return load_model(IMPORTED_ELSEWHERE[name])
    if name in INLINE:
        return parse_model(INLINE[name])
    path = os.path.join(MODELS, f"{name}.yaml")
    if name in IMPORTED:
        data, text = read_yaml(path, "model file")
        return parse_model({**data, "input": SMALL_INPUT}, path, text)
    return load_model(path)


def _batches(graph, dtype):
    rng = np.random.default_rng(11)
    images = rng.standard_normal((STEPS, BATCH) + graph.input_shape).astype(dtype)
    labels = answers(graph, rng, STEPS * BATCH)
    return images, labels.reshape((STEPS, BATCH) + labels.shape[1:])


def _run(graph, dtype, plan=None, world=None, xp=np):
    """Three SGD steps; returns losses, first-step outputs, output gradients and parameter gradients, and the
    executor and optimizer at the end (NumPy copies of CuPy arrays)."""
    executor = Executor(graph, xp, dtype, seed=5, plan=plan, world=world)
    optimizer = SGD(executor.params.shapes, dtype, xp, **HYPER)
    images, labels = _batches(graph, dtype)
    names = [layer.name for layer in graph.layers if layer is not graph.loss]
    losses, outputs, out_grads, grads = [], {}, {}, {}
    for step in range(STEPS):
        keep = names if step == 0 else ()
        loss, _, kept = executor.forward(images[step], labels[step], step=step, keep=keep)
        back = executor.backward(keep=keep)
        if step == 0:
            outputs = {k: to_numpy(v).copy() for k, v in kept.items()}
            out_grads = {k: np.array(to_numpy(v), copy=True) for k, v in back.items()}
            grads = {k: to_numpy(v).copy() for k, v in executor.grads.items()}
        optimizer.step(executor.params.flat, executor.grads.flat)
        losses.append(loss)
    evaluation, _, _ = executor.forward(images[0], labels[0], step=STEPS, training=False)
    losses.append(evaluation)        # evaluation mode: running statistics, no dropout, in-place layers
    return losses, outputs, out_grads, grads, executor, optimizer


def _reference(name, dtype):
    key = (name, np.dtype(dtype).name)
    if key not in _REFERENCES:
        _REFERENCES[key] = _run(_graph(name), dtype)
    return _REFERENCES[key]


# The scale below which a tensor is rounding noise around an exact zero (the gradient of a bias followed by
# batchnorm, and the momentum it feeds): errors are measured against this scale instead of the tensor's own.
FLOOR = {np.dtype(np.float64): 1e-6, np.dtype(np.float32): 1e-2}


def _compare(what, actual, expected, rtol, floor=None):
    """A problem message when ``actual`` differs from ``expected`` by more than ``rtol`` of its largest value
    (or of ``floor``, FLOOR by default, when that is larger)."""
    expected, actual = np.asarray(expected), to_numpy(actual)
    if actual.shape != expected.shape:
        return [f"{what}: shape {actual.shape} != {expected.shape}"]
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    error = float(np.max(np.abs(actual - expected))) if expected.size else 0.0
    if error > rtol * max(scale, FLOOR[actual.dtype] if floor is None else floor):
        return [f"{what}: max error {error:.3g} > {rtol:g} x {scale:.3g}"]
    return []


def check_plan(world, name, plan, dtype=np.float64, rtol=1e-10, xp=np, later=None, floor=None):
    """Problems found running ``plan`` on ``xp`` in ``dtype`` against one NumPy process in ``dtype``: the first
    step's loss, outputs and gradients within ``rtol``, what the later steps give within ``later`` (``rtol``);
    ``floor``: the scale below which a parameter gradient (and the momentum it feeds) is rounding noise around an
    exact zero (FLOOR)."""
    later = rtol if later is None else later
    graph = plan.graph
    ref_losses, ref_outputs, ref_out_grads, ref_grads, ref_exec, ref_opt = _reference(name, dtype)
    losses, outputs, out_grads, grads, executor, optimizer = _run(graph, dtype, plan, world, xp)
    problems = []
    if executor.tally.counted != ref_exec.tally.counted or (graph.classes_scored and not np.array_equal(
            executor.tally.classes, ref_exec.tally.classes)):
        problems.append(f"{plan.source}: the evaluation's counts {executor.tally} != {ref_exec.tally}")
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        if abs(a - b) > (rtol if step == 0 else later) * abs(b):
            what = f"step {step}" if step < STEPS else "evaluation"
            problems.append(f"{plan.source}: loss of {what}: {a!r} != {b!r}")
    for layer in graph.layers:
        site = executor.site(layer)
        if site.box is None or layer is graph.loss:
            continue
        box = tuple(slice(lo, hi) for lo, hi in site.box)
        problems += _compare(f"{plan.source}: output of {layer.name}", outputs[layer.name],
                             ref_outputs[layer.name][box], rtol)
        if layer.name in ref_out_grads:
            problems += _compare(f"{plan.source}: output gradient of {layer.name}", out_grads[layer.name],
                                 ref_out_grads[layer.name][box], rtol)
    for tensor, index in executor.shards.items():
        if tensor in executor.params:
            problems += _compare(f"{plan.source}: gradient of {tensor}", grads[tensor], ref_grads[tensor][index], rtol,
                                 floor)
            problems += _compare(f"{plan.source}: {tensor} after {STEPS} steps", executor.params[tensor],
                                 ref_exec.params[tensor][index], later)
            problems += _compare(f"{plan.source}: momentum of {tensor}", optimizer.velocity[tensor],
                                 ref_opt.velocity[tensor][index], later, floor)
        else:
            problems += _compare(f"{plan.source}: {tensor} after {STEPS} steps", executor.buffers[tensor],
                                 ref_exec.buffers[tensor][index], later)
    held = sum(executor.site(layer).box is not None for layer in graph.layers)
    return problems, held


MODELS_UNDER_TEST = ["tiny_cnn", "small_inception", "small_resnet", "cifar_cnn", "strided", "tiny_volume",
                     "strided_volume", "sequence", "decoder", "decoder_volume", "decoder_sequence", "segmenter",
                     "segmenter_volume", "idioms", "idioms_volume"]


@pytest.mark.parametrize("name", MODELS_UNDER_TEST)
def test_random_plans_float64(world, name):
    graph = _graph(name)
    problems = []
    for seed in range(6 if name != "cifar_cnn" else 3):
        found, _ = check_plan(world, name, random_plan(graph, BATCH, world.size, seed=1000 * world.size + seed))
        problems += found
    agree(world, problems)


@pytest.mark.ranks(2)      # the ops' splits over 3 and 4 ranks: the decoders' random plans (decoder_models.py)
@pytest.mark.parametrize("name", IMPORTED)
def test_imported_models_under_a_random_plan(world, name):
    """torchvision's modern CNNs as spmdcnn model import wrote them (grouped and depthwise convolutions, squeeze
    and excitation, layer norm over channels, layer scale, stochastic depth): one random plan, three steps. The
    first step (loss, every output and gradient) agrees to 1e-10 as every model's does; through 50 to 130 layers
    of batch norm over 5 samples at random weights and a learning rate of 0.05, the updates amplify its rounding
    (step 2's loss differs by about 1e-10, RegNet's momentum by up to 1e-6 of its scale), so what the later
    steps give is held to 1e-4. A batch
    norm's bias whose gradient is zero in exact arithmetic (a residual sum feeding another batch norm) shows
    rounding noise of a few 1e-15 in both: gradients are floored at 1e-4."""
    found, _ = check_plan(world, name, random_plan(_graph(name), BATCH, world.size, seed=31 * world.size),
                          later=1e-4, floor=1e-4)
    agree(world, found)


@pytest.mark.parametrize("name", sorted(IMPORTED_NETWORKS))
def test_imported_segmenters_and_classifiers_under_random_plans(world, name):
    """MONAI's 3D networks and smp's U-Net as imported (tests/graph/test_torchimport.py checks each import against
    its library): a random plan over n, c, d, h, w on each rank count, three steps, equal to one process. A batch
    norm's bias whose gradient is zero in exact arithmetic (DenseNet's first, shifts that the dense layers' batch
    norms take out) shows rounding noise of a few 1e-16 in both: gradients and momenta are floored at 1e-4."""
    graph = _graph(name)
    found, _ = check_plan(world, name, random_plan(graph, BATCH, world.size, seed=53 * world.size), floor=1e-4)
    agree(world, found)


@pytest.mark.parametrize("name", ["tiny_cnn", "small_inception", "small_resnet", "tiny_volume"])
def test_random_plans_float32(world, name):
    graph = _graph(name)
    problems = []
    for seed in range(2):
        plan = random_plan(graph, BATCH, world.size, seed=77 + seed)
        found, _ = check_plan(world, name, plan, np.float32, rtol=1e-5)
        problems += found
    agree(world, problems)


@pytest.mark.parametrize("strategy", ["data", "model", "owt"])
@pytest.mark.parametrize("name", ["tiny_cnn", "small_inception", "small_resnet", "tiny_volume"])
def test_named_strategies(world, name, strategy):
    found, _ = check_plan(world, name, named(strategy, _graph(name), BATCH, world.size))
    agree(world, found)


@pytest.mark.parametrize("spec", [{"h": 2, "w": 2}, {"h": 4}, {"w": 3}, {"n": 2, "h": 2}, {"c": 2, "h": 2}])
@pytest.mark.parametrize("name", ["tiny_cnn", "small_inception", "small_resnet", "strided"])
def test_spatial_splits(world, name, spec):
    """Windows with stride, padding, dilation and rectangular kernels split over height and width: halos."""
    found, _ = check_plan(world, name, uniform_plan(_graph(name), BATCH, world.size, spec))
    agree(world, found)


@pytest.mark.parametrize("spec", [{"d": 2, "h": 2}, {"d": 4}, {"w": 3}, {"n": 2, "d": 2}, {"c": 2, "d": 2},
                                  {"d": 2, "h": 2, "w": 2}])
@pytest.mark.parametrize("name", ["tiny_volume", "strided_volume"])
def test_spatial_splits_of_volumes(world, name, spec):
    """Volumes split over depth, height and width at once: halos along every axis, corners included."""
    found, _ = check_plan(world, name, uniform_plan(_graph(name), BATCH, world.size, spec))
    agree(world, found)


def test_idle_ranks_and_reversed_devices(world):
    """Every layer on the last rank only, then on all ranks in reverse order: ranks hold no tile of many layers."""
    graph = _graph("small_resnet")
    last = world.size - 1
    lonely = from_mapping({"format": "spmdcnn-plan/1", "devices": world.size, "default": {"devices": [last]}},
                          graph, BATCH, world.size, "plan on the last rank")
    found, held = check_plan(world, "small_resnet", lonely)
    if world.rank != last and held:
        found.append(f"rank {world.rank} holds {held} tiles, expected none")
    reverse = list(range(world.size))[::-1]
    spread = from_mapping({"format": "spmdcnn-plan/1", "devices": world.size,
                           "default": {"n": min(world.size, BATCH), "devices": reverse[:min(world.size, BATCH)]}},
                          graph, BATCH, world.size, "plan on reversed devices")
    more, _ = check_plan(world, "small_resnet", spread)
    agree(world, found + more)


def test_a_batch_of_another_size_than_the_plan_is_refused(world):
    graph = _graph("tiny_cnn")
    executor = Executor(graph, np, np.float64, plan=named("data", graph, BATCH, world.size), world=world)
    images, labels = _batches(graph, np.float64)
    with pytest.raises(ValueError, match=f"the plan is for batch {BATCH}, got a batch of 4"):
        executor.forward(images[0][:4], labels[0][:4])
