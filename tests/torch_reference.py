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
- ``record=True``: ``records[name] = (x, y)`` for every convolution, linear and batch norm layer, its input and its
  output (whose ``.grad`` is retained), from which the magnitudes of the sums behind each value are computed.
"""

import numpy as np
import torch
import torch.nn.functional as F

from spmdcnn.graph.optable import window

RECORDED_OPS = ("conv", "linear", "batchnorm")        # families


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
            recorded = self.record and layer.spec.family in RECORDED_OPS
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
        family, rank = layer.spec.family, layer.spatial_rank
        if family == "conv":
            g = layer.window
            return getattr(F, f"conv{rank}d")(padded(x, g.padding), self.param(f"{name}.weight"),
                                              self.param(f"{name}.bias"), stride=g.stride, dilation=g.dilation,
                                              groups=a["groups"])
        if family == "conv_transpose":      # the full extent the input fills, cropped (or extended) per side
            g = layer.window
            full = getattr(F, f"conv_transpose{rank}d")(x, self.param(f"{name}.weight"), None, stride=g.stride,
                                                         dilation=g.dilation, groups=a["groups"])
            extra = a["output_padding"] if isinstance(a["output_padding"], list) else [a["output_padding"]] * rank
            sides = [v for (before, after), o in reversed(list(zip(g.padding, extra))) for v in (-before, o - after)]
            y = F.pad(full, sides)
            bias = self.param(f"{name}.bias")
            return y if bias is None else y + bias.view((1, -1) + (1,) * rank)
        if family == "upsample":
            linear = {1: "linear", 2: "bilinear", 3: "trilinear"}[rank]
            mode = "nearest" if a["mode"] == "nearest" else linear
            scale = a["scale"] if isinstance(a["scale"], list) else [a["scale"]] * rank
            return F.interpolate(x, scale_factor=[float(s) for s in scale], mode=mode,
                                 align_corners=a["align_corners"] if mode != "nearest" else None)
        if family in ("maxpool", "avgpool") and (a.get("ceil_mode") or not a.get("count_include_pad", True)) \
                and decision is None:
            g = window(a, rank)         # PyTorch's own ceil mode and divisors, over the padding as written
            assert all(before == after for before, after in g.padding), "PyTorch pads both sides alike"
            if family == "maxpool":
                return getattr(F, f"max_pool{rank}d")(x, g.kernel, g.stride, [b for b, _ in g.padding],
                                                      ceil_mode=a["ceil_mode"])
            return getattr(F, f"avg_pool{rank}d")(x, g.kernel, g.stride, [b for b, _ in g.padding],
                                                  ceil_mode=a["ceil_mode"], count_include_pad=a["count_include_pad"])
        if family == "maxpool":
            g = layer.window
            x = padded(x, g.padding, -float("inf"))
            if decision is not None:     # the winners' flat indices into each padded plane (or volume)
                return x.flatten(2).gather(2, decision.flatten(2)).view(decision.shape)
            return getattr(F, f"max_pool{rank}d")(x, g.kernel, g.stride)
        if family == "avgpool":
            g = layer.window
            return getattr(F, f"avg_pool{rank}d")(padded(x, g.padding), g.kernel, g.stride)
        if family == "adaptive_avgpool":
            return getattr(F, f"adaptive_avg_pool{rank}d")(x, a["output_size"])
        if family == "global_avgpool":
            return getattr(F, f"adaptive_avg_pool{rank}d")(x, 1)
        if family == "relu":
            if decision is not None:     # the units spmdcnn found positive pass, whatever their sign here
                return x * decision.to(x.dtype)
            return F.relu(x)
        if family == "leaky_relu":
            if decision is not None:     # the slope where spmdcnn found the unit not positive
                return x * torch.where(decision, 1.0, a["negative_slope"]).to(x.dtype)
            return F.leaky_relu(x, a["negative_slope"])
        if family == "sigmoid":
            return torch.sigmoid(x)
        if family == "elu":
            negative = a["gain"] * a["alpha"] * torch.expm1(torch.clamp(x, max=0) * a["input_scale"])
            return torch.where(x > 0, a["gain"] * x, negative)
        if family == "mish":
            return F.mish(x)
        if family == "clamp":
            return torch.clamp(x, a["min"], a["max"])
        if family == "hardtanh":
            return F.hardtanh(x, a["min_val"], a["max_val"])
        if family == "hardsigmoid":     # F.hardsigmoid's backward takes 1/6 in float32 even in float64
            return F.relu6(x + 3) / 6
        if family in ("silu", "hardswish", "relu6"):
            return getattr(F, family)(x)
        if family == "gelu":
            return F.gelu(x, approximate=a["approximate"])
        if family == "tanh":
            return torch.tanh(x)
        if family == "scale":
            return x * a["factor"] + a["shift"]
        if family == "batchnorm":
            return F.batch_norm(x, self.state[f"{name}.running_mean"], self.state[f"{name}.running_var"],
                                self.param(f"{name}.weight"), self.param(f"{name}.bias"), training=self.training,
                                momentum=a["momentum"], eps=a["eps"])
        if family == "groupnorm":
            return F.group_norm(x, a["groups"], self.param(f"{name}.weight"), self.param(f"{name}.bias"), a["eps"])
        if family == "instancenorm":
            return F.instance_norm(x, weight=self.param(f"{name}.weight"), bias=self.param(f"{name}.bias"),
                                   eps=a["eps"])
        if family == "layernorm" and (not a["center"] or a["correction"]):     # timm's simple_norm, over channels
            v = torch.var(x, dim=1, keepdim=True, correction=a["correction"])
            y = (x if not a["center"] else x - x.mean(1, keepdim=True)) * torch.rsqrt(v + a["eps"])
            shape = (1, -1) + (1,) * (x.dim() - 2)
            if a["affine"]:
                y = y * self.param(f"{name}.weight").reshape(shape)
                if a["bias"]:
                    y = y + self.param(f"{name}.bias").reshape(shape)
            return y
        if family == "layernorm":        # over the channels at each position: F.layer_norm with them last
            moved = x.movedim(1, -1)
            y = F.layer_norm(moved, moved.shape[-1:], self.param(f"{name}.weight"), self.param(f"{name}.bias"),
                             a["eps"])
            return y.movedim(-1, 1)
        if family == "prelu":
            return F.prelu(x, self.param(f"{name}.weight"))
        if family == "layer_scale":
            return x * self.param(f"{name}.weight").reshape((1, -1) + (1,) * (x.dim() - 2))
        if family == "bias":
            return x + self.param(f"{name}.bias").reshape((1, -1) + (1,) * (x.dim() - 2))
        if family == "stochastic_depth":     # torchvision's StochasticDepth(p, "row"), with spmdcnn's samples kept
            if not self.training or a["p"] == 0:
                return x
            if self.dropout_masks is None:
                keep = torch.empty((x.shape[0],) + (1,) * (x.dim() - 1), dtype=x.dtype).bernoulli_(1 - a["p"])
            else:
                keep = torch.tensor(self.dropout_masks(layer, (x.shape[0],), step), dtype=x.dtype)
                keep = keep.reshape((-1,) + (1,) * (x.dim() - 1))
            return x * keep / (1.0 - a["p"]) if a["p"] < 1 else x * 0
        if family == "dropout":
            if not self.training:
                return x
            if self.dropout_masks is None:
                return F.dropout(x, a["p"], training=True)
            mask = torch.tensor(self.dropout_masks(layer, tuple(x.shape), step), dtype=x.dtype)
            return x * mask / (1.0 - a["p"]) if a["p"] < 1 else x * 0
        if family == "flatten":
            return torch.flatten(x, 1)
        if family == "slice":
            return x[:, a["start"]:a["stop"]]
        if family == "group_softmax":        # SKNet's, over the groups at each channel of a group
            n, c = x.shape[:2]
            return x.view((n, a["groups"], c // a["groups"]) + tuple(x.shape[2:])).softmax(1).reshape(x.shape)
        if family == "channel_shuffle":     # ShuffleNet's, as torchvision writes it
            n, c = x.shape[:2]
            return x.view((n, a["groups"], c // a["groups"]) + tuple(x.shape[2:])).transpose(1, 2).reshape(x.shape)
        if family == "space_to_depth":
            n, c, *spatial = x.shape
            b, r = a["size"], len(spatial)
            split = x.reshape([n, c] + [v for size in spatial for v in (size // b, b)])
            inner, outer = [3 + 2 * k for k in range(r)], [2 + 2 * k for k in range(r)]
            order = [0] + ([1] + inner if a["order"] == "channels" else inner + [1]) + outer
            return split.permute(order).reshape([n, c * b ** r] + [size // b for size in spatial])
        if family == "pad":
            g = layer.window
            return F.pad(x, [v for pair in reversed(g.padding) for v in pair], value=a["value"])
        if family == "linear":
            return F.linear(x, self.param(f"{name}.weight"), self.param(f"{name}.bias"))
        if family == "concat":
            return torch.cat(xs, dim=1)
        if family == "mul":
            return xs[0] * xs[1]
        if family == "add":
            return sum(xs[1:], xs[0])
        if family == "softmax_cross_entropy":
            return F.cross_entropy(x, labels, ignore_index=a["ignore_index"])
        if family == "dice_loss":
            return dice_ce(x, labels, **a)
        if family == "mse_loss":
            return F.mse_loss(x, labels.to(x.dtype))
        raise NotImplementedError(layer.op)


def dice_ce(logits, labels, dice=1.0, cross_entropy=0.0, include_background=True, smooth=1e-5, batch=False,
            ignore_index=-1):
    """MONAI's DiceCELoss (softmax, one-hot labels, mean) in PyTorch, with spmdcnn's ignore label: positions
    whose label is ``ignore_index`` or negative count in neither term, nor do samples with no labelled
    position."""
    K = logits.shape[1]
    spatial = tuple(range(2, logits.dim()))
    labelled = (labels >= 0) & (labels != ignore_index)
    ce = F.cross_entropy(logits, torch.where(labelled, labels, -100)) if labelled.any() else logits.sum() * 0
    p = logits.softmax(1)
    mask = labelled.unsqueeze(1).to(p.dtype)
    onehot = F.one_hot(torch.where(labelled, labels, 0), K).movedim(-1, 1).to(p.dtype) * mask
    I, P, T = ((p * onehot).sum(spatial), (p * mask).sum(spatial), onehot.sum(spatial))
    real = T.sum(1) > 0
    if batch:
        I, P, T = (t[real].sum(0, keepdim=True) for t in (I, P, T))
        real = real.any().reshape(1)
    score = (2 * I + smooth) / (P + T + smooth)
    terms = (1 - score)[:, 0 if include_background else 1:][real]
    value = terms.mean() if terms.numel() else logits.sum() * 0
    return dice * value + cross_entropy * ce


def padded(x, padding, value=0.0):
    """``x`` padded per side along its spatial axes (``padding``: a ``(before, after)`` pair per axis; F.pad
    lists the last axis first): every window op's padding, PyTorch's symmetric one and spmdcnn's per-side and
    ``same`` alike, as an explicit pad before an unpadded op."""
    if not any(before or after for before, after in padding):
        return x
    return F.pad(x, tuple(p for pair in reversed(padding) for p in pair), value=value)


def spmdcnn_masks(seed):
    """Dropout masks exactly as spmdcnn draws them for a whole tensor."""
    from spmdcnn.ops import dropout

    def masks(layer, shape, step):
        key = dropout.stream_key(seed, step, layer.name)
        return dropout.dropout_mask(np, shape, layer.attrs["p"], key)
    return masks


def decision_inputs(graph):
    """The tensors spmdcnn's discrete choices are read from: every relu's (and leaky relu's) output and every max
    pooling's input."""
    relus = [layer.name for layer in graph.layers if layer.spec.family in ("relu", "leaky_relu")]
    pooled = [layer.inputs[0] for layer in graph.layers if layer.spec.family == "maxpool"]
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
        if layer.spec.family in ("relu", "leaky_relu"):
            decisions[layer.name] = torch.from_numpy(np.asarray(kept[layer.name]) > 0)
        elif layer.spec.family == "maxpool":
            g = layer.window
            pooled = padded(torch.from_numpy(np.ascontiguousarray(kept[layer.inputs[0]])), g.padding, -float("inf"))
            _, decisions[layer.name] = getattr(F, f"max_pool{layer.spatial_rank}d")(pooled, g.kernel, g.stride,
                                                                                   return_indices=True)
    return loss, decisions
