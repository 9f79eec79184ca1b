"""The functions and tensor methods ``spmdcnn model import`` maps (``graph/torchops.py``): a handler per name,
appending the layer entry its node becomes through the converter (or passing the value on, or refusing it)."""

from .torchmodules import channel_norm, flatten_value, pool


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
    try:
        tensor = converter.graph.get_parameter(param)
    except AttributeError:
        converter.refuse(node, f"multiplies by '{param}', which is not a parameter (a buffer or a constant); "
                               "spmdcnn learns a layer scale's factors")
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
    channel_norm(converter, node, [value], normalized, eps, weight is not None, bias is not None or weight is None,
                  name)


def _flatten_function(converter, node):
    (value,) = converter.tensors(node, node.args[:1])
    start, end = _argument(node, 1, "start_dim", 0), _argument(node, 2, "end_dim", -1)
    rank = len(converter.shape(node.args[0]))
    if start != 1 or end not in (-1, rank - 1):
        converter.refuse(node, "flattens other axes than all but the batch; spmdcnn's flatten keeps the batch axis "
                               "alone")
    flatten_value(converter, node, value)


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
    if not _argument(node, 3, "training", True):        # PyTorch's identity then
        converter.alias(node, value)
        return
    if mode != "row":
        converter.refuse(node, f"drops in mode '{mode}'; spmdcnn's stochastic_depth drops whole samples (mode row)")
    converter.add(node, {"op": "stochastic_depth", "p": p}, [value], last=value.last)


def _adaptive_avg_pool_function(converter, node):
    (value,) = converter.tensors(node, node.args[:1])
    if value.last or len(converter.shape(node.args[0])) not in (3, 4, 5):
        converter.refuse(node, "pools a value whose channels are not second; spmdcnn pools (N, C, spatial...)")
    out = converter.shape(node)[2:]
    if not all(size == 1 for size in out):
        converter.refuse(node, "pools to more than one position; use nn.AdaptiveAvgPool (a module)")
    converter.add(node, {"op": "global_avgpool"}, [value])


def _cat(converter, node):
    tensors, dim = _argument(node, 0, "tensors"), _argument(node, 1, "dim", 0)
    values = converter.tensors(node, list(tensors))
    if len(values) == 1:                # a concatenation of one tensor is that tensor (DenseNet's first layer)
        converter.alias(node, values[0])
        return
    rank = len(converter.shape(node))
    if dim not in (1, 1 - rank) or any(value.last for value in values):
        converter.refuse(node, f"concatenates along axis {dim}; spmdcnn's concat joins channels (axis 1)")
    converter.add(node, {"op": "concat"}, values)


def _mean(converter, node):
    """``x.mean((2, 3))``, ``torch.mean(x, dim=[-2, -1], keepdim=True)``: a mean over every spatial axis is a
    global average pooling (and a flatten of its (C, 1, ...) without ``keepdim``)."""
    (value,) = converter.tensors(node, node.args[:1])
    shape = converter.shape(node.args[0])
    dims = _argument(node, 1, "dim")
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    keepdim = _argument(node, 2, "keepdim", False)
    spatial = set(range(2, len(shape)))
    if value.last or {dim % len(shape) for dim in dims} != spatial or not spatial or \
            node.kwargs.get("dtype") is not None:
        converter.refuse(node, f"averages over the axes {dims} of shape {shape}; spmdcnn averages over every "
                               "spatial axis at once (a global average pooling)")
    if keepdim:
        converter.add(node, {"op": "global_avgpool"}, [value])
        return
    pooled = converter.add(node, {"op": "global_avgpool"}, [value])
    converter.shapes[pooled] = (shape[1],) + (1,) * len(spatial)
    converter.add(node, {"op": "flatten"}, [converter.values[node]], name=f"{pooled}_flatten")


def _pool_function(kind):
    """``F.max_pool2d(x, 3, 2)``, ``F.avg_pool2d(x, kernel_size=3, stride=1, padding=1)`` (Inception-v3's)."""
    keys = (("stride", None), ("padding", 0), ("dilation", 1), ("ceil_mode", False), ("return_indices", False)) \
        if kind == "max" else (("stride", None), ("padding", 0), ("ceil_mode", False), ("count_include_pad", True),
                               ("divisor_override", None))

    def handle(converter, node):
        (value,) = converter.tensors(node, node.args[:1])
        got = {key: _argument(node, index, key, default) for index, (key, default) in enumerate(keys, 2)}
        pool(converter, node, kind, value, _argument(node, 1, "kernel_size"), got["stride"], got["padding"],
             got.get("dilation", 1), got["ceil_mode"], got.get("return_indices", False),
             got.get("count_include_pad", True), got.get("divisor_override"))
    return handle


def _dropout_function(converter, node):
    (value,) = converter.tensors(node, node.args[:1])
    if not _argument(node, 2, "training", True):        # PyTorch's identity then
        converter.alias(node, value)
        return
    converter.add(node, {"op": "dropout", "p": _argument(node, 1, "p", 0.5)}, [value], last=value.last)


def _contiguous(converter, node):
    converter.alias(node, converter.value(node, node.args[0]))


FUNCTIONS = {
    "add": _add, "iadd": _add, "add_": _add, "__add__": _add, "__iadd__": _add,
    "mul": _mul, "imul": _mul, "mul_": _mul, "__mul__": _mul, "__imul__": _mul,
    "permute": _permute, "layer_norm": _layer_norm, "flatten": _flatten_function,
    "relu": _activation("relu"), "relu_": _activation("relu"), "relu6": _activation("relu6"),
    "silu": _activation("silu"), "gelu": _activation("gelu", approximate=(1, "none")),
    "hardswish": _activation("hardswish"), "hardsigmoid": _activation("hardsigmoid"),
    "sigmoid": _activation("sigmoid"), "tanh": _activation("tanh"),
    "leaky_relu": _activation("leaky_relu", negative_slope=(1, 0.01)),
    "leaky_relu_": _activation("leaky_relu", negative_slope=(1, 0.01)),
    "stochastic_depth": _stochastic_depth, "adaptive_avg_pool2d": _adaptive_avg_pool_function,
    "adaptive_avg_pool1d": _adaptive_avg_pool_function, "adaptive_avg_pool3d": _adaptive_avg_pool_function,
    "cat": _cat, "dropout": _dropout_function, "contiguous": _contiguous, "mean": _mean,
    **{f"{kind}_pool{rank}d": _pool_function(kind) for kind in ("max", "avg") for rank in (1, 2, 3)},
}
FUNCTION_NAMES = sorted({name.strip("_") for name in FUNCTIONS})
