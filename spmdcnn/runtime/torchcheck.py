"""An imported model against the PyTorch network it came from (``spmdcnn model import --check``, the importer's
tests, ``benchmarks/import_coverage.py``): both take one SGD step from the same weights on the same random samples
in float64, then evaluate; the check gives how far spmdcnn's two losses are from PyTorch's.

The step is taken with dropout and stochastic depth at probability 0 on both sides (their random draws differ
between the two frameworks; that the model keeps them, with their probabilities, the importer's tests check), so
what it compares is everything else a training step does: batch norm over the batch and its running statistics
with their momentum, every gradient, the update; the evaluation after it reads the updated statistics.
PyTorch is needed only here, when it is called.
"""

import copy

import numpy as np

from .executor import Executor
from .optimizer import SGD

_CHECKED_LOSSES = ("softmax_cross_entropy", "dice_loss", "mse_loss")
TOLERANCE = 1e-8                # the relative error within which the model computes what the network does


def _quiet_torch_function_mode(torch):
    """A torch function mode under which every functional dropout is an identity (timm's classifiers call
    ``F.dropout`` with a rate the module holds; ``nn.Dropout`` calls it too)."""
    functional = torch.nn.functional
    dropouts = {functional.dropout, functional.dropout1d, functional.dropout2d, functional.dropout3d,
                functional.alpha_dropout, functional.feature_alpha_dropout}

    class NoDropout(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in dropouts:
                return args[0] if args else kwargs["input"]
            return func(*args, **(kwargs or {}))
    return NoDropout()


def _dice_ce(torch, logits, labels, attrs):
    """spmdcnn's ``dice_loss`` (MONAI's ``DiceCELoss(softmax=True, to_onehot_y=True)`` with its weights) in
    PyTorch, every position labelled."""
    functional = torch.nn.functional
    spatial = tuple(range(2, logits.dim()))
    p = logits.softmax(1)
    onehot = functional.one_hot(labels, logits.shape[1]).movedim(-1, 1).to(p.dtype)
    sums = (p * onehot).sum(spatial), p.sum(spatial), onehot.sum(spatial)
    if attrs["batch"]:
        sums = tuple(t.sum(0, keepdim=True) for t in sums)
    intersection, predicted, labelled = sums
    score = (2 * intersection + attrs["smooth"]) / (predicted + labelled + attrs["smooth"])
    dice = (1 - score)[:, 0 if attrs["include_background"] else 1:].mean()
    return attrs["dice"] * dice + attrs["cross_entropy"] * functional.cross_entropy(logits, labels)


def _without_stochastic_depth(module):
    """``module`` with its stochastic depths (torchvision's ``StochasticDepth``, timm's ``DropPath``) at 0."""
    for child in module.modules():
        kind = type(child).__name__
        if kind == "StochasticDepth":
            child.p = 0.0
        elif kind == "DropPath":
            child.drop_prob = 0.0
    return module


def check_import(module, graph, arrays, input_shape, lr=0.01, seed=1):
    """``(step, after)``: the relative errors of spmdcnn's training loss of one SGD step (``lr``, two random
    samples of ``input_shape``, float64) and of its evaluation loss after that step, against the network
    ``module``'s (left as it was). A step of 0.01 moves the loss of a wrongly computed gradient far past the
    tolerance, and keeps deep networks at random weights from amplifying rounding past it: MobileOne-S1's loss
    after a step of 0.1 differs by 7e-8 from its own, of 0.01 by 7e-13, its training loss by 3e-12 either way. ``arrays``: the model's tensors as :func:`~spmdcnn.io.torchstate.
    checkpoint_arrays` gives them."""
    import torch

    from ..graph.torchops import main_output
    loss_op = graph.layers[-1].op
    if loss_op not in _CHECKED_LOSSES:
        raise ValueError(f"the check compares a cross-entropy, a Dice loss or a mean squared error; this model ends "
                         f"in {loss_op}")
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((2,) + tuple(input_shape))

    net = _without_stochastic_depth(copy.deepcopy(module)).double().train()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    with _quiet_torch_function_mode(torch):
        output, _ = main_output(net(torch.from_numpy(images)))
    if loss_op == "mse_loss":
        answers = rng.standard_normal(tuple(output.shape))
        score = lambda out: torch.nn.functional.mse_loss(out, torch.from_numpy(answers))  # noqa: E731
    else:
        answers = rng.integers(0, output.shape[1], (2,) + tuple(output.shape[2:]))
        if loss_op == "dice_loss":
            attrs = graph.layers[-1].attrs
            score = lambda out: _dice_ce(torch, out, torch.from_numpy(answers), attrs)  # noqa: E731
        else:
            score = lambda out: torch.nn.functional.cross_entropy(out, torch.from_numpy(answers))  # noqa: E731
    loss = score(output)
    loss.backward()
    optimizer.step()
    net.eval()
    with torch.no_grad():
        after = score(main_output(net(torch.from_numpy(images)))[0]).item()

    graph = copy.deepcopy(graph)
    for layer in graph.layers:
        if layer.op in ("dropout", "stochastic_depth"):
            layer.attrs["p"] = 0.0
    executor = Executor(graph, np, np.float64, seed=0)
    for name, value in arrays.items():
        (executor.params if name in executor.params.shapes else executor.buffers)[name][...] = value
    ours, *_ = executor.forward(images, answers, step=0, training=True)
    executor.backward()
    SGD(executor.params.shapes, np.float64, np, lr=lr).step(executor.params.flat, executor.grads.flat)
    ours_after, *_ = executor.forward(images, answers, training=False)
    return abs(ours - loss.item()) / abs(loss.item()), abs(ours_after - after) / abs(after)
