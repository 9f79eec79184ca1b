"""``spmdcnn model import``: a PyTorch network as a model YAML (and its weights as a checkpoint), through torch.fx.

The source is ``torchvision:NAME`` (a classification model of torchvision's zoo) or ``FILE.py:CALLABLE`` (a function or
class whose call returns a ``torch.nn.Module``). The module is traced (``torch.fx.symbolic_trace``: its forward
with symbolic inputs, so a forward that branches on a tensor's values cannot be imported), its shapes propagated
from an input of the given size, and every node mapped to one spmdcnn layer (``_MODULES`` and ``_FUNCTIONS`` below)
or to none (``nn.Identity``, a permute):

- layers keep PyTorch's names: a module's layer is named by the module's path (``features.1.0.block.0``), so its
  tensors are PyTorch's keys (``features.1.0.block.0.weight``); a function's layer takes the node's name (``add_3``);
- channels-last stretches (ConvNeXt's block: permute to (N, H, W, C), ``LayerNorm``, ``Linear``, GELU, ``Linear``,
  permute back; its ``LayerNorm2d``: permute, ``layer_norm``, permute) become channel ops: ``layernorm`` over the
  channels, 1x1 convolutions for the linear layers (their ``(out, in)`` weights in the model's ``torch_shapes``);
- a parameter multiplied into a tensor (ConvNeXt's ``layer_scale``) becomes a ``layer_scale`` layer whose weight
  is that parameter (``torch_names`` gives its key, ``torch_shapes`` its shape);
- the network's output (logits) is followed by a ``softmax_cross_entropy`` loss.

Anything else stops the import with one message naming the node (its module path), its type and what spmdcnn has
instead; nothing is written then. PyTorch is needed only here (and torchvision for its models).
"""

import importlib.util
import math
import operator
import re
import sys
from pathlib import Path

import yaml

from .yamlfile import FormatError


class ImportFailure(FormatError):
    """A network that cannot be imported: one message naming the module or function and why."""


def _torch():
    try:
        import torch
        import torch.fx  # noqa: F401
    except ImportError:
        raise ImportFailure("importing a PyTorch model needs PyTorch: pip install torch (and torchvision for "
                            "torchvision's models)") from None
    return torch


def load_torchvision():
    """torchvision, imported for its models. Where its compiled operators do not load against the installed
    PyTorch (a CPU-only torch beside a torchvision built for CUDA), its import stops at registering them; the
    models need none of them, so they are declared empty and the import retried."""
    torch = _torch()
    declared = None
    for _ in range(32):
        try:
            import torchvision
            return torchvision
        except ImportError:
            raise ImportFailure("torchvision:NAME needs torchvision: pip install torchvision") from None
        except RuntimeError as error:
            missing = re.search(r"operator torchvision::(\w+) does not exist", str(error))
            if missing is None:
                raise
            declared = declared or torch.library.Library("torchvision", "DEF")
            declared.define(f"{missing.group(1)}(Tensor x) -> Tensor")
            for name in [name for name in sys.modules if name == "torchvision" or name.startswith("torchvision.")]:
                del sys.modules[name]
    raise ImportFailure("torchvision does not import with this PyTorch")


def load_module(source):
    """``(module, name)`` of ``torchvision:NAME`` or ``FILE.py:CALLABLE``."""
    torch = _torch()
    kind, _, rest = source.partition(":")
    if kind == "torchvision" and rest:
        torchvision = load_torchvision()
        names = torchvision.models.list_models(module=torchvision.models)
        if rest not in names:
            raise ImportFailure(f"{source}: torchvision has no classification model '{rest}' (it has "
                                f"{', '.join(sorted(names))})")
        return torchvision.models.get_model(rest), rest
    path, _, attribute = source.rpartition(":")
    if not path.endswith(".py") or not attribute:
        raise ImportFailure(f"{source}: expected torchvision:NAME or FILE.py:CALLABLE")
    if not Path(path).is_file():
        raise ImportFailure(f"{path}: file not found")
    spec = importlib.util.spec_from_file_location(f"spmdcnn_import_{Path(path).stem}", path)
    code = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(code)
    except Exception as error:
        raise ImportFailure(f"{path}: running it failed: {type(error).__name__}: {error}") from None
    if not callable(getattr(code, attribute, None)):
        raise ImportFailure(f"{path}: has no function or class '{attribute}'")
    module = getattr(code, attribute)()
    if not isinstance(module, torch.nn.Module):
        raise ImportFailure(f"{source}: returned {type(module).__name__}, not a torch.nn.Module")
    return module, Path(path).stem if attribute[0].isupper() else attribute


def trace(module, source, input_shape):
    """The module traced by torch.fx, with each node's output shape (``node.meta['shape']``) for a batch of two
    inputs of ``input_shape``."""
    torch = _torch()
    try:
        graph = torch.fx.symbolic_trace(module)
    except Exception as error:
        raise ImportFailure(f"{source}: torch.fx cannot trace its forward: {type(error).__name__}: "
                            f"{str(error).splitlines()[0]} (spmdcnn imports networks whose forward does not branch "
                            "on tensor values; make such a choice a constructor argument)") from None
    class Shapes(torch.fx.Interpreter):
        """Runs the traced network, keeping each node's output shape (``node.meta['shape']``, None for what is
        not a tensor) and naming the node where the input does not fit."""

        def run_node(self, node):
            try:
                result = super().run_node(node)
            except Exception as error:
                where = node.target if node.op == "call_module" else node.name
                raise ImportFailure(f"{source}: the network cannot take an input of "
                                    f"{'x'.join(map(str, input_shape))}: at '{where}': {type(error).__name__}: "
                                    f"{str(error).splitlines()[0]}") from None
            node.meta["shape"] = tuple(result.shape) if isinstance(result, torch.Tensor) else None
            return result
    training = module.training
    graph.eval()
    try:
        with torch.no_grad():
            shapes = Shapes(graph)
            shapes.extra_traceback = False          # the message names the node already
            shapes.run(torch.zeros((2,) + tuple(input_shape)))
    finally:
        graph.train(training)
    return graph


class _Value:
    """What a traced node stands for: an spmdcnn layer's output (``name``; ``last``: its channels are the last axis,
    after a permute), or a parameter (``param``: its qualified name)."""

    def __init__(self, name=None, last=False, param=None):
        self.name, self.last, self.param = name, last, param


class Converter:
    """Maps one traced network to layer entries (module docstring)."""

    def __init__(self, graph, source):
        self.graph, self.source = graph, source
        self.modules = dict(graph.named_modules())
        self.layers, self.values, self.names = [], {}, set()
        self.torch_names, self.torch_shapes = {}, {}
        self.used_modules = set()

    # -- names and layers --------------------------------------------------------------------------------------

    def fresh(self, base):
        """``base``, or ``base_1``, ``base_2``... where a layer has it already (a module called twice)."""
        name, count = base, 0
        while name in self.names or name == "data" or name == "loss":
            count += 1
            name = f"{base}_{count}"
        self.names.add(name)
        return name

    def add(self, node, entry, inputs, name=None, last=False):
        """Append layer ``entry`` (op and attributes) named ``name`` (or the node's) reading ``inputs`` (values);
        the node then stands for it."""
        name = self.fresh(name or self._node_name(node))
        layer = {"name": name, **entry}
        names = [value.name for value in inputs]
        previous = self.layers[-1]["name"] if self.layers else "data"
        if names != [previous]:
            layer["inputs"] = names
        self.layers.append(layer)
        self.values[node] = _Value(name, last)
        return name

    def _node_name(self, node):
        """A module's path; for a function, the path of the module whose forward calls it and the function's name
        (``features.2.0.add``), or the node's name at the top level."""
        if node.op == "call_module":
            return node.target
        base = re.sub(r"_\d+$", "", node.name)
        stack = node.meta.get("nn_module_stack") or {}
        path = next(reversed(stack.values()))[0] if stack else ""
        if path.rsplit(".", 1)[-1] == base:         # a module that calls its function of the same name
            return path
        return f"{path}.{base}" if path else base

    def where(self, node):
        if node.op == "call_module":
            return f"module '{node.target}' ({type(self.modules[node.target]).__name__})"
        target = getattr(node.target, "__name__", str(node.target))
        return f"{node.op.replace('_', ' ')} '{target}' (node '{node.name}')"

    def refuse(self, node, why):
        raise ImportFailure(f"{self.source}: {self.where(node)}: {why}")

    def shape(self, node):
        shape = node.meta.get("shape")
        if shape is None:
            self.refuse(node, "gives no single tensor (spmdcnn layers give one)")
        return shape

    def value(self, node, arg):
        if not hasattr(arg, "op") or arg not in self.values:
            self.refuse(node, f"takes {arg!r}, which is not a tensor spmdcnn computes")
        return self.values[arg]

    def tensors(self, node, args):
        values = [self.value(node, arg) for arg in args]
        if any(value.param for value in values):
            self.refuse(node, "reads a parameter directly; spmdcnn takes a parameter only as a layer scale")
        return values

    # -- the walk ------------------------------------------------------------------------------------------------

    def run(self):
        output = None
        for node in self.graph.graph.nodes:
            if node.op == "placeholder":
                if self.values:
                    self.refuse(node, "is a second input; spmdcnn models take one")
                self.values[node] = _Value("data")
            elif node.op == "get_attr":
                self.values[node] = _Value(param=node.target)
            elif node.op == "call_module":
                self._module(node)
            elif node.op in ("call_function", "call_method"):
                self._function(node)
            elif node.op == "output":
                output = node
        result = output.args[0]
        if not hasattr(result, "op"):
            self.refuse(output, "the network returns more than one tensor (a classifier returns its logits)")
        value = self.value(output, result)
        if value.last or len(self.shape(result)) != 2:
            self.refuse(output, f"the network returns shape {self.shape(result)}; spmdcnn imports classifiers "
                                "returning logits (N, classes), followed by a cross-entropy loss")
        loss = {"name": "loss", "op": "softmax_cross_entropy"}
        if value.name != self.layers[-1]["name"]:
            loss["inputs"] = [value.name]
        self.layers.append(loss)
        return self.layers

    def _module(self, node):
        module = self.modules[node.target]
        kind = type(module).__name__
        handler = _MODULES.get(kind)
        if handler is None:
            self.refuse(node, f"maps to no spmdcnn op; spmdcnn imports the modules {', '.join(sorted(_MODULES))} "
                              "and the functions " + ", ".join(sorted(_FUNCTION_NAMES)))
        if any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False)):
            if node.target in self.used_modules:
                self.refuse(node, "is called twice; spmdcnn layers do not share parameters")
            self.used_modules.add(node.target)
        handler(self, node, module, self.tensors(node, node.args[:1]))

    def _function(self, node):
        target = node.target
        name = target if isinstance(target, str) else getattr(target, "__name__", str(target))
        handler = _FUNCTIONS.get(name)
        if handler is None:
            self.refuse(node, "maps to no spmdcnn op; spmdcnn imports the functions "
                              + ", ".join(sorted(_FUNCTION_NAMES)))
        handler(self, node)

    def alias(self, node, value, last=None):
        self.values[node] = _Value(value.name, value.last if last is None else last)


# -- modules ----------------------------------------------------------------------------------------------------

def _pair_list(values):
    values = list(values) if isinstance(values, (tuple, list)) else [values]
    return values[0] if len(set(values)) == 1 else values


def _spatial_rank(converter, node, value):
    shape = converter.shape(node.args[0])
    rank = len(shape) - 2
    if value.last or rank not in (1, 2, 3):
        converter.refuse(node, f"runs on shape {shape}; spmdcnn takes (N, C, W), (N, C, H, W) or (N, C, D, H, W) "
                               "with the channels second")
    return rank


def _conv(converter, node, module, inputs):
    (value,) = inputs
    rank = _spatial_rank(converter, node, value)
    if module.padding_mode != "zeros":
        converter.refuse(node, f"pads with '{module.padding_mode}'; spmdcnn pads with zeros")
    transposed = "Transpose" in type(module).__name__
    entry = {"op": f"conv{'_transpose' if transposed else ''}{rank}d", "out_channels": module.out_channels,
             "kernel": _pair_list(module.kernel_size)}
    if _pair_list(module.stride) != 1:
        entry["stride"] = _pair_list(module.stride)
    padding = module.padding
    if isinstance(padding, str):
        padding = 0 if padding == "valid" else "same"
    if padding != "same" and _pair_list(padding) != 0:
        entry["padding"] = _pair_list(padding)
    elif padding == "same":
        entry["padding"] = "same"
    if transposed and _pair_list(module.output_padding) != 0:
        entry["output_padding"] = _pair_list(module.output_padding)
    if _pair_list(module.dilation) != 1:
        entry["dilation"] = _pair_list(module.dilation)
    if module.groups != 1:
        if transposed:
            converter.refuse(node, "is a grouped transposed convolution; spmdcnn groups ordinary convolutions only")
        entry["groups"] = module.groups
    if module.bias is None:
        entry["bias"] = False
    converter.add(node, entry, inputs)


def _batchnorm(converter, node, module, inputs):
    (value,) = inputs
    rank = _spatial_rank(converter, node, value)
    if not module.affine or not module.track_running_stats or module.momentum is None:
        converter.refuse(node, "keeps no affine parameters or running statistics (or averages them cumulatively); "
                               "spmdcnn's batchnorm has both, with a momentum")
    entry = {"op": f"batchnorm{rank}d"}
    if module.eps != 1e-5:
        entry["eps"] = module.eps
    if module.momentum != 0.1:
        entry["momentum"] = module.momentum
    converter.add(node, entry, inputs)


def _groupnorm(converter, node, module, inputs):
    (value,) = inputs
    _spatial_rank(converter, node, value)
    entry = {"op": "groupnorm", "groups": module.num_groups}
    if module.eps != 1e-5:
        entry["eps"] = module.eps
    if not module.affine:
        entry["affine"] = False
    converter.add(node, entry, inputs)


def _instancenorm(converter, node, module, inputs):
    (value,) = inputs
    _spatial_rank(converter, node, value)
    if module.track_running_stats:
        converter.refuse(node, "keeps running statistics; spmdcnn's instancenorm normalises each sample alone")
    entry = {"op": "instancenorm"}
    if module.eps != 1e-5:
        entry["eps"] = module.eps
    if module.affine:
        entry["affine"] = True
    converter.add(node, entry, inputs)


def _layernorm(converter, node, module, inputs):
    _channel_norm(converter, node, inputs, module.normalized_shape, module.eps,
                  module.weight is not None, module.bias is not None or module.weight is None, node.target)


def _channel_norm(converter, node, inputs, normalized, eps, affine, has_bias, name):
    (value,) = inputs
    shape = converter.shape(node.args[0])
    channels = shape[-1] if value.last else (shape[1] if len(shape) == 2 else None)
    if tuple(normalized) != (channels,):
        converter.refuse(node, f"normalises over {tuple(normalized)} of shape {shape}; spmdcnn's layernorm "
                               "normalises over the channels (after a permute to channels last, or of features)")
    if not has_bias:
        converter.refuse(node, "has a weight but no bias; spmdcnn's layernorm has both or neither")
    entry = {"op": "layernorm"}
    if eps != 1e-5:
        entry["eps"] = eps
    if not affine:
        entry["affine"] = False
    converter.add(node, entry, inputs, name=name, last=value.last)


def _linear(converter, node, module, inputs):
    (value,) = inputs
    shape = converter.shape(node.args[0])
    bias = module.bias is not None
    if value.last:                  # over channels last: a 1x1 convolution, PyTorch's (out, in) weight kept
        rank = len(shape) - 2
        entry = {"op": f"conv{rank}d", "out_channels": module.out_features, "kernel": 1}
        if not bias:
            entry["bias"] = False
        name = converter.add(node, entry, inputs, last=True)
        converter.torch_shapes[f"{name}.weight"] = list(module.weight.shape)
        return
    if len(shape) != 2:
        converter.refuse(node, f"runs on shape {shape}; spmdcnn's linear takes features (N, F) (flatten first), "
                               "or channels last")
    entry = {"op": "linear", "out_features": module.out_features}
    if not bias:
        entry["bias"] = False
    converter.add(node, entry, inputs)


def _elementwise(op, **attrs):
    def handle(converter, node, module, inputs):
        entry = {"op": op}
        for key, (field, default) in attrs.items():
            got = getattr(module, field)
            if got != default:
                entry[key] = got
        converter.add(node, entry, inputs, last=inputs[0].last)
    return handle


def _pool(kind):
    def handle(converter, node, module, inputs):
        (value,) = inputs
        rank = _spatial_rank(converter, node, value)
        if kind == "max" and (_pair_list(module.dilation) != 1 or module.return_indices):
            converter.refuse(node, "dilates its window or returns indices; spmdcnn's maxpool does neither")
        if kind == "avg" and (not module.count_include_pad or module.divisor_override is not None):
            converter.refuse(node, "leaves the padding out of its divisor (or overrides it); spmdcnn's avgpool "
                                   "counts the padding, as PyTorch's default does")
        entry = {"op": f"{kind}pool{rank}d", "kernel": _pair_list(module.kernel_size)}
        stride = module.stride if module.stride is not None else module.kernel_size
        if _pair_list(stride) != entry["kernel"]:
            entry["stride"] = _pair_list(stride)
        if _pair_list(module.padding) != 0:
            entry["padding"] = _pair_list(module.padding)
        if module.ceil_mode:
            entry["ceil_mode"] = True
        converter.add(node, entry, inputs)
    return handle


def _adaptive_avgpool(converter, node, module, inputs):
    (value,) = inputs
    rank = _spatial_rank(converter, node, value)
    out = converter.shape(node)[2:]
    if all(size == 1 for size in out):
        converter.add(node, {"op": "global_avgpool"}, inputs)
        return
    entry = {"op": f"adaptive_avgpool{rank}d", "output_size": _pair_list(out)}
    converter.add(node, entry, inputs)


def _flatten_module(converter, node, module, inputs):
    if module.start_dim != 1 or module.end_dim != -1:
        converter.refuse(node, "flattens other axes than all but the batch; spmdcnn's flatten keeps the batch axis "
                               "alone")
    _flatten_value(converter, node, inputs[0])


def _flatten_value(converter, node, value):
    if value.last:
        converter.refuse(node, "flattens channels-last values; permute back first")
    if len(converter.shape(node.args[0])) == 2:
        converter.alias(node, value)
        return
    converter.add(node, {"op": "flatten"}, [value])


def _dropout(converter, node, module, inputs):
    converter.add(node, {"op": "dropout", "p": module.p}, inputs, last=inputs[0].last)


def _identity(converter, node, module, inputs):
    converter.alias(node, inputs[0])


def _upsample(converter, node, module, inputs):
    (value,) = inputs
    rank = _spatial_rank(converter, node, value)
    scale = module.scale_factor
    scales = list(scale) if isinstance(scale, (tuple, list)) else [scale] * rank
    if module.size is not None or any(float(s) != int(s) for s in scales):
        converter.refuse(node, "resizes to a size or by a fractional factor; spmdcnn upsamples by integer factors")
    entry = {"op": "upsample", "scale": _pair_list([int(s) for s in scales])}
    if module.mode != "nearest":
        if module.mode not in ("linear", "bilinear", "trilinear"):
            converter.refuse(node, f"interpolates '{module.mode}'; spmdcnn has nearest and (bi/tri)linear")
        entry["mode"] = "linear"
        if module.align_corners:
            entry["align_corners"] = True
    converter.add(node, entry, inputs)


_MODULES = {
    "Conv1d": _conv, "Conv2d": _conv, "Conv3d": _conv,
    "ConvTranspose1d": _conv, "ConvTranspose2d": _conv, "ConvTranspose3d": _conv,
    "BatchNorm1d": _batchnorm, "BatchNorm2d": _batchnorm, "BatchNorm3d": _batchnorm,
    "GroupNorm": _groupnorm,
    "InstanceNorm1d": _instancenorm, "InstanceNorm2d": _instancenorm, "InstanceNorm3d": _instancenorm,
    "LayerNorm": _layernorm, "Linear": _linear,
    "ReLU": _elementwise("relu"), "ReLU6": _elementwise("relu6"), "SiLU": _elementwise("silu"),
    "GELU": _elementwise("gelu", approximate=("approximate", "none")), "Hardswish": _elementwise("hardswish"),
    "Hardsigmoid": _elementwise("hardsigmoid"), "Sigmoid": _elementwise("sigmoid"), "Tanh": _elementwise("tanh"),
    "LeakyReLU": _elementwise("leaky_relu", negative_slope=("negative_slope", 0.01)),
    "MaxPool1d": _pool("max"), "MaxPool2d": _pool("max"), "MaxPool3d": _pool("max"),
    "AvgPool1d": _pool("avg"), "AvgPool2d": _pool("avg"), "AvgPool3d": _pool("avg"),
    "AdaptiveAvgPool1d": _adaptive_avgpool, "AdaptiveAvgPool2d": _adaptive_avgpool,
    "AdaptiveAvgPool3d": _adaptive_avgpool,
    "Flatten": _flatten_module, "Dropout": _dropout, "Identity": _identity, "Upsample": _upsample,
}


# -- functions and methods ----------------------------------------------------------------------------------------

def _argument(node, index, key, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(key, default)


def _add(converter, node):
    a, b = node.args[:2]
    if not (hasattr(a, "op") and hasattr(b, "op")) or node.kwargs.get("alpha", 1) != 1:
        converter.refuse(node, "adds a number (or scales a term); spmdcnn's add sums tensors")
    values = converter.tensors(node, [a, b])
    if values[0].last != values[1].last:
        converter.refuse(node, "adds a channels-last value to a channels-first one")
    converter.add(node, {"op": "add"}, values, last=values[0].last)


def _mul(converter, node):
    a, b = node.args[:2]
    if not (hasattr(a, "op") and hasattr(b, "op")):
        converter.refuse(node, "multiplies by a number; spmdcnn multiplies tensors (or scales by a layer_scale)")
    first, second = converter.value(node, a), converter.value(node, b)
    if first.param or second.param:                     # a learned factor per channel: a layer scale
        param, value = (first, second) if first.param else (second, first)
        if param.param and value.param:
            converter.refuse(node, "multiplies two parameters")
        _layer_scale(converter, node, param.param, value)
        return
    if first.last != second.last:
        converter.refuse(node, "multiplies a channels-last value by a channels-first one")
    converter.add(node, {"op": "mul"}, [first, second], last=first.last)


def _layer_scale(converter, node, param, value):
    tensor = converter.graph.get_parameter(param)
    shape = converter.shape(node)
    axis = len(shape) - 1 if value.last else 1
    aligned = (1,) * (len(shape) - tensor.dim()) + tuple(tensor.shape)     # as it broadcasts against the value
    channels = shape[axis]
    if tensor.dim() > len(shape) or aligned[axis] != channels or tensor.numel() != channels:
        converter.refuse(node, f"multiplies by parameter '{param}' of shape {tuple(tensor.shape)}; spmdcnn takes a "
                               f"factor per channel ({channels}) as a layer_scale")
    values = tensor.detach().reshape(-1)
    entry = {"op": "layer_scale"}
    # its value at construction where all channels share one (as written: 1e-06, not float32's 9.99999997e-07)
    first = float(f"{float(values[0]):.7g}") if bool((values == values[0]).all()) else 1e-6
    if first != 1e-6:
        entry["init"] = first
    name = converter.add(node, entry, [value], name=param, last=value.last)
    converter.torch_names[name] = {"weight": param}
    if tuple(tensor.shape) != (channels,):
        converter.torch_shapes[f"{name}.weight"] = list(tensor.shape)


def _permute(converter, node):
    (value,) = converter.tensors(node, node.args[:1])
    dims = node.args[1:] if node.op == "call_method" else (_argument(node, 1, "dims"),)
    dims = list(dims[0]) if len(dims) == 1 and isinstance(dims[0], (list, tuple)) else list(dims)
    rank = len(converter.shape(node.args[0]))
    last = [0] + list(range(2, rank)) + [1]             # channels to the end
    first = [0, rank - 1] + list(range(1, rank - 1))    # and back
    if dims == last and not value.last:
        converter.alias(node, value, last=True)
    elif dims == first and value.last:
        converter.alias(node, value, last=False)
    else:
        converter.refuse(node, f"permutes the axes {dims}; spmdcnn follows only a permute of the channels to the "
                               "last axis and back")


def _layer_norm(converter, node):
    (value,) = converter.tensors(node, node.args[:1])
    normalized = _argument(node, 1, "normalized_shape")
    weight, bias = _argument(node, 2, "weight"), _argument(node, 3, "bias")
    eps = _argument(node, 4, "eps", 1e-5)
    params = [converter.value(node, p).param if p is not None else None for p in (weight, bias)]
    if weight is not None and (params[0] is None or not params[0].endswith(".weight")) or \
            bias is not None and (params[1] is None or not params[1].endswith(".bias")):
        converter.refuse(node, "takes a weight or bias that is not a module's 'weight' and 'bias'")
    name = params[0][:-len(".weight")] if params[0] else None
    if params[1] and name and params[1] != f"{name}.bias":
        converter.refuse(node, "takes the weight and bias of two modules")
    _channel_norm(converter, node, [value], normalized, eps, weight is not None, bias is not None or weight is None,
                  name)


def _flatten_function(converter, node):
    (value,) = converter.tensors(node, node.args[:1])
    start, end = _argument(node, 1, "start_dim", 0), _argument(node, 2, "end_dim", -1)
    rank = len(converter.shape(node.args[0]))
    if start != 1 or end not in (-1, rank - 1):
        converter.refuse(node, "flattens other axes than all but the batch; spmdcnn's flatten keeps the batch axis "
                               "alone")
    _flatten_value(converter, node, value)


def _activation(op, **keys):
    def handle(converter, node):
        (value,) = converter.tensors(node, node.args[:1])
        entry = {"op": op}
        for key, (index, default) in keys.items():
            got = _argument(node, index, key, default)
            if got != default:
                entry[key] = got
        converter.add(node, entry, [value], last=value.last)
    return handle


def _stochastic_depth(converter, node):
    (value,) = converter.tensors(node, node.args[:1])
    p, mode = _argument(node, 1, "p"), _argument(node, 2, "mode")
    if mode != "row":
        converter.refuse(node, f"drops in mode '{mode}'; spmdcnn's stochastic_depth drops whole samples (mode row)")
    converter.add(node, {"op": "stochastic_depth", "p": p}, [value], last=value.last)


def _adaptive_avg_pool_function(converter, node):
    (value,) = converter.tensors(node, node.args[:1])
    out = converter.shape(node)[2:]
    if not all(size == 1 for size in out):
        converter.refuse(node, "pools to more than one position; use nn.AdaptiveAvgPool (a module)")
    converter.add(node, {"op": "global_avgpool"}, [value])


def _cat(converter, node):
    tensors, dim = _argument(node, 0, "tensors"), _argument(node, 1, "dim", 0)
    values = converter.tensors(node, list(tensors))
    rank = len(converter.shape(node))
    if dim not in (1, 1 - rank) or any(value.last for value in values):
        converter.refuse(node, f"concatenates along axis {dim}; spmdcnn's concat joins channels (axis 1)")
    converter.add(node, {"op": "concat"}, values)


def _dropout_function(converter, node):
    (value,) = converter.tensors(node, node.args[:1])
    converter.add(node, {"op": "dropout", "p": _argument(node, 1, "p", 0.5)}, [value], last=value.last)


def _contiguous(converter, node):
    converter.alias(node, converter.value(node, node.args[0]))


_FUNCTIONS = {
    "add": _add, "iadd": _add, "add_": _add, "__add__": _add, "__iadd__": _add,
    "mul": _mul, "imul": _mul, "mul_": _mul, "__mul__": _mul, "__imul__": _mul,
    "permute": _permute, "layer_norm": _layer_norm, "flatten": _flatten_function,
    "relu": _activation("relu"), "relu_": _activation("relu"), "relu6": _activation("relu6"),
    "silu": _activation("silu"), "gelu": _activation("gelu", approximate=(1, "none")),
    "hardswish": _activation("hardswish"), "hardsigmoid": _activation("hardsigmoid"),
    "sigmoid": _activation("sigmoid"), "tanh": _activation("tanh"),
    "stochastic_depth": _stochastic_depth, "adaptive_avg_pool2d": _adaptive_avg_pool_function,
    "adaptive_avg_pool1d": _adaptive_avg_pool_function, "adaptive_avg_pool3d": _adaptive_avg_pool_function,
    "cat": _cat, "dropout": _dropout_function, "contiguous": _contiguous,
}
_FUNCTION_NAMES = sorted({name.strip("_") for name in _FUNCTIONS})


# -- the YAML -----------------------------------------------------------------------------------------------------

def _flow(value):
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, sort_keys=False)
    return text[:-len("...\n")].strip() if text.endswith("...\n") else text.strip()


def model_text(name, input_shape, layers, torch_names, torch_shapes, source, count):
    """The model YAML: one layer a line, in the network's order."""
    lines = [f"# {name} ({count:,} parameters), written by: spmdcnn model import {source} "
             f"--input {' '.join(map(str, input_shape))}",
             "# Layers carry PyTorch's module names, so checkpoint import/export move its state dicts as they are.",
             f"name: {name}", f"input: {_flow(list(input_shape))}", "layers:"]
    lines += [f"  - {_flow(layer)}" for layer in layers]
    if torch_names:
        lines.append("torch_names:")
        lines += [f"  {_flow(key)}: {_flow(value)}" for key, value in torch_names.items()]
    if torch_shapes:
        lines.append("torch_shapes:")
        lines += [f"  {_flow(key)}: {_flow(value)}" for key, value in torch_shapes.items()]
    return "\n".join(lines) + "\n"


def import_model(source, output, input_shape=None, weights=None, name=None):
    """Write the model YAML of ``source`` at ``output`` (and with ``weights``, the module's weights as a checkpoint
    there); returns the parsed :class:`~spmdcnn.graph.graph.Graph`. Nothing is written when anything fails."""
    from ..graph.graph import parse_model
    from .yamlfile import load_yaml_text
    module, stem = load_module(source)
    if input_shape is None:
        if not source.startswith("torchvision:"):
            raise ImportFailure(f"{source}: give the input's shape with --input C H W (or C D H W, C W)")
        input_shape = (3, 299, 299) if stem == "inception_v3" else (3, 224, 224)
    traced = trace(module, source, input_shape)
    converter = Converter(traced, source)
    layers = converter.run()
    model_name = name or stem
    count = sum(p.numel() for p in module.parameters())
    text = model_text(model_name, input_shape, layers, converter.torch_names, converter.torch_shapes, source, count)
    graph = parse_model(load_yaml_text(text, str(output)), str(output), text)
    if graph.num_params != count:
        raise ImportFailure(f"{source}: the model has {graph.num_params:,} parameters, the module {count:,}: "
                            "some of its parameters are used in ways spmdcnn does not import")
    arrays = None
    if weights is not None:
        from .torchstate import checkpoint_arrays, write_checkpoint
        arrays = checkpoint_arrays(dict(module.state_dict()), graph, f"{source}'s weights")
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(text)
    if arrays is not None:
        write_checkpoint(weights, graph, arrays)
    return graph
