"""A PyTorch execution of an spmdcnn Graph, for tests and benchmarks (PyTorch is never a runtime dependency).

``TorchNet(graph, params, buffers)`` runs the same layers with ``torch.nn.functional`` on the same weights, so
outputs, gradients and optimizer steps can be compared with spmdcnn's. Dropout takes its mask from spmdcnn's
counter-based generator when ``dropout_masks`` is given (the masks are part of spmdcnn's contract, not
PyTorch's), and uses ``F.dropout`` otherwise.

Two options serve the float32 comparisons (tests/runtime/test_models_vs_torch.py):

- ``decisions`` (from :func:`spmdcnn_decisions`): relu and max pooling take spmdcnn's discrete choices instead
  of making their own. A relu input within rounding of 0, or a pooling window whose two largest values are
  within rounding of each other, can go either way in float32; the choice routes a whole gradient, so two
  float32 implementations (or float32 against float64) then differ by a large amount for no fault of either.
  A float64 network that follows spmdcnn's float32 choices is the exact computation spmdcnn's rounding
  approximates: their difference is continuous in the rounding errors.
- ``record=True``: ``records[name] = (x, y)`` for every conv2d, linear and batchnorm2d layer, its input and its
  output (whose ``.grad`` is retained), from which the magnitudes of the sums behind each value are computed.
"""

import numpy as np
import torch
import torch.nn.functional as F

from spmdcnn.ops.window import pair

RECORDED_OPS = ("conv2d", "linear", "batchnorm2d")


class TorchNet(torch.nn.Module):
    def __init__(self, graph, params, buffers, dtype=torch.float64, dropout_masks=None, decisions=None,
                 record=False):
        super().__init__()
        self.graph = graph
        self.names = list(params)
        self.weights = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.tensor(np.asarray(params[n]), dtype=dtype)) for n in self.names])
        self.index = {name: i for i, name in enumerate(self.names)}
        self.state = {n: torch.tensor(np.asarray(v), dtype=dtype) for n, v in buffers.items()}
        self.dropout_masks = dropout_masks
        self.decisions = dict(decisions or {})
        self.record = record
        self.records = {}

    def param(self, name):
        i = self.index.get(name)
        return None if i is None else self.weights[i]

    def named(self):
        return {name: self.weights[i] for name, i in self.index.items()}

    def forward(self, images, labels, step=0, keep=()):
        outputs = {"data": images}
        kept = {}
        self.records = {}
        for layer in self.graph.layers:
            xs = [outputs[ref] for ref in layer.inputs]
            outputs[layer.name] = y = self._layer(layer, xs, labels, step)
            recorded = self.record and layer.op in RECORDED_OPS
            if layer.name in keep or recorded:
                y.retain_grad()
            if layer.name in keep:
                kept[layer.name] = y
            if recorded:
                self.records[layer.name] = (xs[0], y)
        return outputs[self.graph.loss.name], kept

    def _layer(self, layer, xs, labels, step):
        a, x, name = layer.attrs, xs[0], layer.name
        decision = self.decisions.get(name)
        if layer.op == "conv2d":
            return F.conv2d(x, self.param(f"{name}.weight"), self.param(f"{name}.bias"), stride=pair(a["stride"]),
                            padding=pair(a["padding"]), dilation=pair(a["dilation"]))
        if layer.op == "maxpool2d":
            if decision is not None:     # the winners' flat indices into each (H, W) plane
                return x.flatten(2).gather(2, decision.flatten(2)).view(decision.shape)
            return F.max_pool2d(x, pair(a["kernel"]), pair(a["stride"] or a["kernel"]), pair(a["padding"]))
        if layer.op == "avgpool2d":
            return F.avg_pool2d(x, pair(a["kernel"]), pair(a["stride"] or a["kernel"]), pair(a["padding"]),
                                count_include_pad=True)
        if layer.op == "global_avgpool":
            return F.adaptive_avg_pool2d(x, 1)
        if layer.op == "relu":
            if decision is not None:     # the units spmdcnn found positive pass, whatever their sign here
                return x * decision.to(x.dtype)
            return F.relu(x)
        if layer.op == "batchnorm2d":
            return F.batch_norm(x, self.state[f"{name}.running_mean"], self.state[f"{name}.running_var"],
                                self.param(f"{name}.weight"), self.param(f"{name}.bias"), training=self.training,
                                momentum=a["momentum"], eps=a["eps"])
        if layer.op == "dropout":
            if not self.training:
                return x
            if self.dropout_masks is None:
                return F.dropout(x, a["p"], training=True)
            mask = torch.tensor(self.dropout_masks(layer, tuple(x.shape), step), dtype=x.dtype)
            return x * mask / (1.0 - a["p"]) if a["p"] < 1 else x * 0
        if layer.op == "flatten":
            return torch.flatten(x, 1)
        if layer.op == "linear":
            return F.linear(x, self.param(f"{name}.weight"), self.param(f"{name}.bias"))
        if layer.op == "concat":
            return torch.cat(xs, dim=1)
        if layer.op == "add":
            return sum(xs[1:], xs[0])
        if layer.op == "softmax_cross_entropy":
            return F.cross_entropy(x, labels)
        raise NotImplementedError(layer.op)


def spmdcnn_masks(seed):
    """Dropout masks exactly as spmdcnn draws them for a whole tensor."""
    from spmdcnn.ops import dropout

    def masks(layer, shape, step):
        key = dropout.stream_key(seed, step, layer.name)
        return dropout.dropout_mask(np, shape, layer.attrs["p"], key)
    return masks


def decision_inputs(graph):
    """The tensors spmdcnn's discrete choices are read from: every relu's output and every max pooling's input."""
    relus = [layer.name for layer in graph.layers if layer.op == "relu"]
    pooled = [layer.inputs[0] for layer in graph.layers if layer.op == "maxpool2d"]
    return tuple(dict.fromkeys(relus + pooled))


def spmdcnn_decisions(executor, images, labels, step=0):
    """Run ``executor.forward`` (training, the whole batch in this process) and read off its discrete choices.

    Returns ``(loss, decisions)``, ``decisions`` as :class:`TorchNet` takes them: for each relu, the mask of the
    units spmdcnn's output keeps (``y > 0``, as its backward routes); for each max pooling, the flat index into
    the input plane of each window's winner, found by PyTorch on spmdcnn's own input (both keep the first maximum
    in row-major order; tests/ops/test_ops_vs_torch.py checks the ties). ``executor.backward()`` may follow. Asking
    for kept outputs turns spmdcnn's in-place layers off, so the kept tensors are the ones the layers computed.
    """
    loss, _, kept = executor.forward(images, labels, step=step, keep=decision_inputs(executor.graph))
    kept["data"] = images
    decisions = {}
    for layer in executor.graph.layers:
        if layer.op == "relu":
            decisions[layer.name] = torch.from_numpy(np.asarray(kept[layer.name]) > 0)
        elif layer.op == "maxpool2d":
            a = layer.attrs
            pooled = torch.from_numpy(np.ascontiguousarray(kept[layer.inputs[0]]))
            _, decisions[layer.name] = F.max_pool2d(pooled, pair(a["kernel"]), pair(a["stride"] or a["kernel"]),
                                                    pair(a["padding"]), return_indices=True)
    return loss, decisions
