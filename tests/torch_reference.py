"""A PyTorch execution of an spmdcnn Graph, for tests and benchmarks (PyTorch is never a runtime dependency).

``TorchNet(graph, params, buffers)`` runs the same layers with ``torch.nn.functional`` on the same weights, so
outputs, gradients and optimizer steps can be compared with spmdcnn's. Dropout takes its mask from spmdcnn's
counter-based generator when ``dropout_masks`` is given (the masks are part of spmdcnn's contract, not
PyTorch's), and uses ``F.dropout`` otherwise.
"""

import numpy as np
import torch
import torch.nn.functional as F

from spmdcnn.ops.window import pair


class TorchNet(torch.nn.Module):
    def __init__(self, graph, params, buffers, dtype=torch.float64, dropout_masks=None):
        super().__init__()
        self.graph = graph
        self.names = list(params)
        self.weights = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.tensor(np.asarray(params[n]), dtype=dtype)) for n in self.names])
        self.index = {name: i for i, name in enumerate(self.names)}
        self.state = {n: torch.tensor(np.asarray(v), dtype=dtype) for n, v in buffers.items()}
        self.dropout_masks = dropout_masks

    def param(self, name):
        i = self.index.get(name)
        return None if i is None else self.weights[i]

    def named(self):
        return {name: self.weights[i] for name, i in self.index.items()}

    def forward(self, images, labels, step=0, keep=()):
        outputs = {"data": images}
        kept = {}
        for layer in self.graph.layers:
            xs = [outputs[ref] for ref in layer.inputs]
            outputs[layer.name] = y = self._layer(layer, xs, labels, step)
            if layer.name in keep:
                y.retain_grad()
                kept[layer.name] = y
        return outputs[self.graph.loss.name], kept

    def _layer(self, layer, xs, labels, step):
        a, x, name = layer.attrs, xs[0], layer.name
        if layer.op == "conv2d":
            return F.conv2d(x, self.param(f"{name}.weight"), self.param(f"{name}.bias"), stride=pair(a["stride"]),
                            padding=pair(a["padding"]), dilation=pair(a["dilation"]))
        if layer.op == "maxpool2d":
            return F.max_pool2d(x, pair(a["kernel"]), pair(a["stride"] or a["kernel"]), pair(a["padding"]))
        if layer.op == "avgpool2d":
            return F.avg_pool2d(x, pair(a["kernel"]), pair(a["stride"] or a["kernel"]), pair(a["padding"]),
                                count_include_pad=True)
        if layer.op == "global_avgpool":
            return F.adaptive_avg_pool2d(x, 1)
        if layer.op == "relu":
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
