"""Forward and backward of every shipped model against PyTorch on the same weights
(docs/formats.md#training-semantics).

float64: spmdcnn and PyTorch agree to 1e-10 (small models) and 1e-9 (large ones) relative to each tensor's scale.

float32: spmdcnn is compared with the exact computation its float32 approximates, within a bound derived from
that computation (tests/float32_bounds.py), not with another float32 implementation within a tolerance that one
BLAS build happens to meet:

- the reference is PyTorch in float64 on spmdcnn's float32 weights and images, *following spmdcnn's discrete
  choices*: which relu units pass, which element wins each max-pooling window (torch_reference.py). A choice
  between values within rounding of each other goes either way with the BLAS kernel and routes a whole gradient
  (under OpenBLAS's Haswell kernel one relu7 unit of AlexNet flips, and fc7 gradients change by half). With the
  choices followed, the difference is continuous in the rounding errors and can be bounded;
- every value must lie within ``u * S * max M`` of the reference: ``u = 2**-24``; ``S`` the sum of ``sqrt(K)``
  over the sums of K terms on the value's way through the network (the probabilistic error of a sum, Higham &
  Mary 2019, added over the path), counted from the graph; ``M`` the magnitude (sum of ``|terms|``) of the
  value's own last sum, computed in float64 from the reference's recorded layer inputs and output gradients.

No summation order, kernel or thread count comes near the bound: the largest error / bound measured under
OpenBLAS's SkylakeX, Haswell, Sandybridge and Prescott kernels, with 1 or 2 threads, is 0.04. A real loss of
precision exceeds it: activations rounded to bfloat16 (8 bits) or to 12 bits before each conv2d and linear,
their outputs rounded to float16, one term left out of a sum, a gradient routed against spmdcnn's own choice.

Batch norm over 2 samples amplifies rounding in the reference as much as here (errors ~1000 u M in Inception-v3
and ResNet-50): those networks are compared in float64 only.

The large networks run at smaller images than they were made for: AlexNet at 127^2 and VGG-16 at 64^2 (3x3 and 2x2
maps before the fully connected layers, instead of 6x6 and 7x7; every layer and parameter as shipped but fc6's
input width), Inception-v3 at 139^2 and ResNet-50 at 112^2 (global pooling over 2x2 and 4x4 maps), at a tenth to a
quarter of the arithmetic. The parsed model works out every shape from the input, as it does for any size.
"""

import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from float32_bounds import UNIT_ROUNDOFF, budget, forward_budget, gradient_budgets, layer_sums
from decoder_models import (DECODER, DECODER_SEQUENCE, DECODER_VOLUME, IDIOMS, IDIOMS_VOLUME, SEGMENTER,
                            SEGMENTER_VOLUME, answers)
from spmdcnn.graph import load_model
from spmdcnn.graph.graph import parse_model
from spmdcnn.runtime.executor import Executor
from torch_reference import TorchNet, padded, spmdcnn_decisions, spmdcnn_masks

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
SMALL = ["tiny_cnn", "small_inception", "small_resnet", "cifar_cnn"]
VOLUMES = ["tiny_volume"]
LARGE = ["alexnet", "vgg16", "inception_v3", "resnet50"]
DECODERS = {model["name"]: model for model in (DECODER, DECODER_VOLUME, DECODER_SEQUENCE, SEGMENTER,
                                                SEGMENTER_VOLUME, IDIOMS, IDIOMS_VOLUME)}
SOFTMAX_JACOBIAN_L1 = 2    # d loss / d logits = (softmax - onehot) / N: each row's absolute values sum to <= 2


SMALLER_INPUT = {"alexnet": [3, 127, 127], "vgg16": [3, 64, 64], "inception_v3": [3, 139, 139],
                 "resnet50": [3, 112, 112]}


def _graph(name):
    if name in DECODERS:
        return parse_model(DECODERS[name])
    path = os.path.join(MODELS, f"{name}.yaml")
    if name in SMALLER_INPUT:
        from spmdcnn.io.yamlfile import read_yaml
        data, text = read_yaml(path, "model file")
        return parse_model({**data, "input": SMALLER_INPUT[name]}, path, text)
    return load_model(path)


def compare_float64(name, batch, rtol, seed=3, step=5):
    """spmdcnn and PyTorch, both in float64, within ``rtol`` of each tensor's scale."""
    graph = _graph(name)
    executor = Executor(graph, np, np.float64, seed=seed)
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((batch,) + graph.input_shape)
    labels = answers(graph, rng, batch)
    net = TorchNet(graph, dict(executor.params.items()), {k: v.copy() for k, v in executor.buffers.items()},
                   dtype=torch.float64, dropout_masks=spmdcnn_masks(seed))
    net.train()
    loss, _, _ = executor.forward(images, labels, step=step)
    executor.backward()
    ref_loss, _ = net(torch.from_numpy(images), torch.from_numpy(labels), step)
    ref_loss.backward()
    assert loss == pytest.approx(ref_loss.item(), rel=rtol)
    # A gradient that is zero in exact arithmetic (a conv bias before batch norm) is rounding noise in both:
    # compare against the tensor's own scale, floored by a small fraction of the largest gradient.
    floor = 1e-3 * max(np.abs(p.grad.numpy()).max() for p in net.named().values())
    for pname, parameter in net.named().items():
        ours, theirs = executor.grads[pname], parameter.grad.numpy()
        scale = max(np.abs(theirs).max(), floor)
        assert np.abs(ours - theirs).max() <= rtol * scale * 10, pname
    for bname, value in net.state.items():
        np.testing.assert_allclose(executor.buffers[bname], value.numpy(), rtol=rtol, atol=rtol, err_msg=bname)


# ----------------------------------------------------------------------------------- float32: magnitudes

def output_magnitude(net, name):
    """``M`` of each output element of a recorded layer: ``|W| |x| + |b|`` for conv2d and linear (the sum of
    ``|terms|`` of the dot product behind it), ``|y|`` otherwise."""
    layer = net.graph.by_name[name]
    x, y = net.records[name]
    x, y = x.detach().abs(), y.detach()
    w, b = (net.param(f"{name}.{kind}") for kind in ("weight", "bias"))
    b = None if b is None else b.detach().abs()
    if layer.spec.family == "conv":
        g = layer.window
        return getattr(F, f"conv{layer.spatial_rank}d")(padded(x, g.padding), w.detach().abs(), b, stride=g.stride,
                                                         dilation=g.dilation)
    if layer.op == "linear":
        return F.linear(x, w.detach().abs(), b)
    return y.abs()


def input_magnitude(net, name):
    """``M`` of the input of a recorded layer: its producer's output magnitude where that is recorded, else
    the input's own absolute value."""
    ref = net.graph.by_name[name].inputs[0]
    return output_magnitude(net, ref) if ref in net.records else net.records[name][0].detach().abs()


def normalised(x, eps):
    """Batch norm's ``xhat = (x - mean) / sqrt(var + eps)`` over (N, H, W)."""
    return F.batch_norm(x, None, None, training=True, eps=eps)


def gradient_magnitudes(net):
    """``{param: M}``, per element, the sum of ``|terms|`` of the last sum behind its gradient, from each layer's
    recorded input ``x`` and output gradient ``gy``:

    conv2d ``gw = sum over (n, i, j) of gy x`` (``conv2d_weight(|x|, |gy|)``), linear ``gw = |gy|^T |x|``,
    batch norm ``ggamma = sum |gy xhat|``, every bias ``sum |gy|`` over N (and H, W)."""
    magnitudes = {}
    for name, (x, y) in net.records.items():
        layer = net.graph.by_name[name]
        a = layer.attrs
        x, gy = x.detach(), y.grad.abs()
        spatial = (0,) + tuple(range(2, gy.dim()))
        if layer.spec.family == "conv":
            weight, g = net.param(f"{name}.weight"), layer.window
            magnitudes[f"{name}.weight"] = getattr(torch.nn.grad, f"conv{layer.spatial_rank}d_weight")(
                padded(x.abs(), g.padding), weight.shape, gy, stride=g.stride, dilation=g.dilation)
        elif layer.op == "linear":
            magnitudes[f"{name}.weight"] = gy.t() @ x.abs()
        else:
            magnitudes[f"{name}.weight"] = (gy * normalised(x, a["eps"]).abs()).sum(spatial)
        if f"{name}.bias" in net.index:
            magnitudes[f"{name}.bias"] = gy.sum(spatial)
    return magnitudes


# ----------------------------------------------------------------------------------- float32: the bounds

def check(what, error, bound, failures, ratios):
    """Note ``error / bound`` and, where it exceeds 1, a line naming the tensor, the error, the bound, the ratio."""
    ratio = error / bound if bound > 0 else (0.0 if error == 0 else math.inf)
    ratios[what] = ratio
    if not ratio <= 1:
        failures.append(f"{what}: error {error:.3e} > bound {bound:.3e} (ratio {ratio:.2f})")


def check_gradients(executor, net, batch, failures, ratios):
    """Every parameter gradient: ``max |g - g_ref| <= u * S_p * max M_p``."""
    budgets, magnitudes = gradient_budgets(net.graph, batch), gradient_magnitudes(net)
    for pname, parameter in net.named().items():
        error = float(np.abs(executor.grads[pname] - parameter.grad.numpy()).max())
        bound = UNIT_ROUNDOFF * budgets[pname] * float(magnitudes[pname].max())
        check(pname, error, bound, failures, ratios)


def check_loss(loss, ref_loss, net, batch, failures, ratios):
    """The loss: ``|loss - loss_ref| <= u * (2 S_z max M_z + S_loss (1 + loss))``.

    The logits ``z`` carry at most ``u S_z M_z`` (``S_z`` the forward budget up to them, ``M_z = |W| |x| + |b|``
    of the last linear), which the mean of cross entropies passes on at most doubled (SOFTMAX_JACOBIAN_L1). The
    loss's own sums, of the exponentials (their sum is >= 1, so its relative error is the log's absolute one:
    the 1) and of the batch (the per-sample terms are >= 0: the loss is their magnitude), budget ``S_loss``."""
    graph = net.graph
    logits = graph.loss.inputs[0]
    S_z = forward_budget(graph, batch, logits)
    S_loss = budget(layer_sums(graph.loss, batch)[0])
    M_z = float(output_magnitude(net, logits).max())
    bound = UNIT_ROUNDOFF * (SOFTMAX_JACOBIAN_L1 * S_z * M_z + S_loss * (1 + ref_loss))
    check("loss", abs(loss - ref_loss), bound, failures, ratios)


def check_running_statistics(executor, net, initial, batch, failures, ratios):
    """Batch norm's running statistics, per channel ``r' = (1 - m) r + m s``, ``s`` the batch mean or the
    unbiased batch variance of the layer's input ``x``, within ``u * S * max M``: ``S`` the forward budget up to
    and including the layer's sums, and ``M = (1 - m) |r| + m M_s`` with

    mean: ``M_s = mean of M_x`` (an error of ``u S M_x`` in each ``x`` moves the mean by their mean);
    variance: ``M_s = c (2 mean(|x - mean| M_x) + var)``, ``c = count / (count - 1)`` (the variance moves by
    ``2 mean((x - mean) dx)``; its own sum has non-negative terms: ``var`` is their magnitude).

    ``M_x`` is the input's magnitude (that of the convolution producing it). The update's own roundings, a few
    ``u |r'|``, lie well inside."""
    graph = net.graph
    for name, (x, _) in net.records.items():
        layer = graph.by_name[name]
        if layer.spec.family != "batchnorm":
            continue
        m = layer.attrs["momentum"]
        x = x.detach()
        M_x = input_magnitude(net, name)
        count = x.numel() // x.shape[1]
        over = (0,) + tuple(range(2, x.dim()))               # a channel's values: N and the spatial axes
        centred = (x - x.mean(over, keepdim=True)).abs()
        statistics = {"running_mean": M_x.mean(over),
                      "running_var": count / (count - 1) * (2 * (centred * M_x).mean(over)
                                                            + (centred ** 2).mean(over))}
        S = forward_budget(graph, batch, name)
        for kind, M_s in statistics.items():
            bname = f"{name}.{kind}"
            before = torch.from_numpy(np.asarray(initial[bname], dtype=np.float64)).abs()
            M = float(((1 - m) * before + m * M_s).max())
            error = float(np.abs(executor.buffers[bname] - net.state[bname].numpy()).max())
            check(bname, error, UNIT_ROUNDOFF * S * M, failures, ratios)


def compare_float32(name, batch, seed=3, step=5):
    """spmdcnn in float32 against the float64 reference that follows its decisions; returns ``{tensor: ratio}``
    (error / bound) and fails naming every tensor beyond its bound."""
    graph = _graph(name)
    executor = Executor(graph, np, np.float32, seed=seed)
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((batch,) + graph.input_shape).astype(np.float32)
    labels = rng.integers(0, graph.num_classes, batch)
    buffers = {k: v.copy() for k, v in executor.buffers.items()}     # before forward updates them
    loss, decisions = spmdcnn_decisions(executor, images, labels, step)
    executor.backward()
    net = TorchNet(graph, dict(executor.params.items()), {k: v.copy() for k, v in buffers.items()},
                   dtype=torch.float64, dropout_masks=spmdcnn_masks(seed), decisions=decisions, record=True)
    net.train()
    ref_loss, _ = net(torch.from_numpy(images.astype(np.float64)), torch.from_numpy(labels), step)
    ref_loss.backward()
    failures, ratios = [], {}
    check_loss(loss, ref_loss.item(), net, batch, failures, ratios)
    check_gradients(executor, net, batch, failures, ratios)
    check_running_statistics(executor, net, buffers, batch, failures, ratios)
    worst = max(ratios, key=ratios.get)
    print(f"{name}: worst error/bound {ratios[worst]:.4f} ({worst})")
    assert not failures, f"{name} float32 beyond its rounding bound:\n" + "\n".join(failures)
    return ratios


@pytest.mark.parametrize("name", SMALL + VOLUMES + list(DECODERS))
def test_small_models_float64(name):
    compare_float64(name, batch=5, rtol=1e-10)


@pytest.mark.parametrize("name", SMALL)
def test_small_models_float32(name):
    compare_float32(name, batch=5)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", LARGE)
def test_large_models_float64(name):
    compare_float64(name, batch=2, rtol=1e-9)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["alexnet", "vgg16"])
def test_large_models_without_batchnorm_float32(name):
    compare_float32(name, batch=2)


def test_eval_mode_matches_pytorch():
    graph = load_model(os.path.join(MODELS, "small_resnet.yaml"))
    executor = Executor(graph, np, np.float64, seed=1)
    rng = np.random.default_rng(1)
    for name in executor.buffers:                      # non-trivial running statistics
        executor.buffers[name][...] = rng.uniform(0.5, 1.5, executor.buffers[name].shape)
    images = rng.standard_normal((3,) + graph.input_shape)
    labels = rng.integers(0, graph.num_classes, 3)
    net = TorchNet(graph, dict(executor.params.items()), {k: v.copy() for k, v in executor.buffers.items()})
    net.eval()
    loss, correct, kept = executor.forward(images, labels, training=False, keep=("fc",))
    ref_loss, ref_kept = net(torch.from_numpy(images), torch.from_numpy(labels), keep=("fc",))
    np.testing.assert_allclose(kept["fc"], ref_kept["fc"].detach().numpy(), rtol=1e-10)
    assert loss == pytest.approx(ref_loss.item(), rel=1e-10)
    assert correct == int((ref_kept["fc"].argmax(1).numpy() == labels).sum())
