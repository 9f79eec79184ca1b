"""The ATen operators ``spmdcnn model import`` maps (``graph/torchops.py``): a handler per operator of
``torch.export``'s training graph, appending the layer entry its node becomes through the converter (or passing the
value on, or refusing the node), and the module types whose whole forward is one spmdcnn layer (``MODULES``:
stochastic depth, which the graph spells as a Bernoulli draw and a product).

A handler reads its node's arguments by name (:func:`arguments`: the operator's schema, defaults filled in), so
``aten.conv2d(x, w, None, [2, 2])`` and its keyword spellings read alike.
"""

from .torchargs import arguments, first_input, opname, pair_list, spatial_rank
from .torchshapes import SHAPES, grouped_layer


# -- layers with parameters ---------------------------------------------------------------------------------------

def _weight_and_bias(converter, node, a):
    """``{"weight": key, "bias": key}`` of the parameters the node reads, None for one it has not."""
    return {key: converter.parameter(node, a[key]) if a[key] is not None else None for key in ("weight", "bias")}


def _conv(converter, node):
    """``aten.conv{1,2,3}d`` (a padding of numbers or 'same'/'valid'), ``aten.conv_transpose{1,2,3}d`` and
    ``aten.convolution``."""
    a = arguments(node)
    transposed = bool(a.get("transposed")) or "transpose" in opname(node)
    value = first_input(converter, node)
    rank = spatial_rank(converter, node, value)
    tensors = _weight_and_bias(converter, node, a)
    shape = converter.shape(a["weight"])
    entry = {"op": f"conv{'_transpose' if transposed else ''}{rank}d", "out_channels": converter.shape(node)[1],
             "kernel": pair_list(shape[2:])}
    if pair_list(a["stride"]) != 1:
        entry["stride"] = pair_list(a["stride"])
    padding = a["padding"]
    if padding == "same":
        entry["padding"] = "same"
    elif padding != "valid" and pair_list(padding) != 0:
        entry["padding"] = pair_list(padding)
    if transposed and pair_list(a.get("output_padding", 0)) != 0:
        entry["output_padding"] = pair_list(a["output_padding"])
    if pair_list(a["dilation"]) != 1:
        entry["dilation"] = pair_list(a["dilation"])
    if a["groups"] != 1:
        entry["groups"] = a["groups"]
    if tensors["bias"] is None:
        entry["bias"] = False
    converter.add(node, entry, [value], tensors=tensors)


def _linear(converter, node):
    a = arguments(node)
    value = first_input(converter, node)
    shape = converter.shape(a["input"])
    tensors = _weight_and_bias(converter, node, a)
    out = converter.shape(node)[-1]
    if value.last:                  # over channels last: a 1x1 convolution, PyTorch's (out, in) weight kept
        entry = {"op": f"conv{len(shape) - 2}d", "out_channels": out, "kernel": 1}
        if tensors["bias"] is None:
            entry["bias"] = False
        name = converter.add(node, entry, [value], tensors=tensors, last=True)
        converter.torch_shapes[f"{name}.weight"] = list(converter.shape(a["weight"]))
        return
    if len(shape) != 2:
        converter.refuse(node, f"runs on shape {shape}; spmdcnn's linear takes features (N, F) (flatten first), "
                               "or channels last")
    entry = {"op": "linear", "out_features": out}
    if tensors["bias"] is None:
        entry["bias"] = False
    converter.add(node, entry, [value], tensors=tensors)


def _batch_norm(converter, node):
    """Over channels (N, C, S...), or over features (N, F): ``batchnorm1d`` (RepViT's head)."""
    a = arguments(node)
    value = first_input(converter, node)
    features = len(converter.shape(a["input"])) == 2 and not value.last
    rank = 1 if features else spatial_rank(converter, node, value)
    if a["weight"] is None or a["running_mean"] is None:
        converter.refuse(node, "keeps no affine parameters or no running statistics; spmdcnn's batchnorm has both")
    if not a["training"]:
        converter.refuse(node, "normalises with its running statistics while the network trains (frozen "
                               "statistics); spmdcnn's batchnorm uses the batch's")
    tensors = {key: converter.parameter(node, a[key], buffer=key.startswith("running"))
               for key in ("weight", "bias", "running_mean", "running_var")}
    owner = converter.owner_module(tensors["weight"])
    if owner is not None and getattr(owner, "momentum", 0.1) is None:
        converter.refuse(node, "averages its statistics cumulatively (momentum None); spmdcnn's batchnorm keeps a "
                               "running average with a momentum")
    entry = {"op": f"batchnorm{rank}d"}
    if a["eps"] != 1e-5:
        entry["eps"] = a["eps"]
    if a["momentum"] != 0.1:
        entry["momentum"] = a["momentum"]
    converter.add(node, entry, [value], tensors=tensors)


def _group_norm(converter, node):
    a = arguments(node)
    value = first_input(converter, node)
    spatial_rank(converter, node, value)
    tensors = _weight_and_bias(converter, node, a)
    if (tensors["weight"] is None) != (tensors["bias"] is None):
        converter.refuse(node, "has a weight but no bias (or a bias alone); spmdcnn's groupnorm has both or neither")
    entry = {"op": "groupnorm", "groups": a["num_groups"]}
    if a["eps"] != 1e-5:
        entry["eps"] = a["eps"]
    if tensors["weight"] is None:
        entry["affine"] = False
    converter.add(node, entry, [value], tensors=tensors)


def _instance_norm(converter, node):
    a = arguments(node)
    value = first_input(converter, node)
    spatial_rank(converter, node, value)
    if a["running_mean"] is not None or not a["use_input_stats"]:
        converter.refuse(node, "keeps running statistics; spmdcnn's instancenorm normalises each sample alone")
    tensors = _weight_and_bias(converter, node, a)
    if (tensors["weight"] is None) != (tensors["bias"] is None):
        converter.refuse(node, "has a weight but no bias (or a bias alone); spmdcnn's instancenorm has both or "
                               "neither")
    entry = {"op": "instancenorm"}
    if a["eps"] != 1e-5:
        entry["eps"] = a["eps"]
    if tensors["weight"] is not None:
        entry["affine"] = True
    converter.add(node, entry, [value], tensors=tensors)


def _layer_norm(converter, node):
    a = arguments(node)
    value = first_input(converter, node)
    shape = converter.shape(a["input"])
    channels = shape[-1] if value.last else (shape[1] if len(shape) == 2 else None)
    if tuple(a["normalized_shape"]) != (channels,):
        converter.refuse(node, f"normalises over {tuple(a['normalized_shape'])} of shape {shape}; spmdcnn's "
                               "layernorm normalises over the channels (after a permute to channels last, or of "
                               "features)")
    tensors = _weight_and_bias(converter, node, a)
    if tensors["weight"] is not None and tensors["bias"] is None:
        converter.refuse(node, "has a weight but no bias; spmdcnn's layernorm has both or neither")
    if tensors["weight"] is None and tensors["bias"] is not None:
        converter.refuse(node, "has a bias but no weight; spmdcnn's layernorm has both or neither")
    entry = {"op": "layernorm"}
    if a["eps"] != 1e-5:
        entry["eps"] = a["eps"]
    if tensors["weight"] is None:
        entry["affine"] = False
    converter.add(node, entry, [value], tensors=tensors, last=value.last)


# -- element-wise -------------------------------------------------------------------------------------------------

def _activation(op, **keys):
    """An element-wise op; ``keys``: the attributes it takes from the node's arguments (``{attr: (argument,
    default)}``), written where they differ from spmdcnn's default."""
    def handle(converter, node):
        a = arguments(node)
        first = next(iter(a))
        (value,) = converter.tensors(node, [a[first]])
        entry = {"op": op}
        for key, (argument, default) in keys.items():
            if a[argument] != default:
                entry[key] = a[argument]
        converter.add(node, entry, [value], last=value.last)
    return handle


def _hardtanh(converter, node):
    """[0, 6]: relu6; any other interval: hardtanh."""
    a = arguments(node)
    if (a["min_val"], a["max_val"]) == (0, 6):
        _activation("relu6")(converter, node)
        return
    (value,) = converter.tensors(node, [a["self"]])
    converter.add(node, {"op": "hardtanh", "min_val": float(a["min_val"]), "max_val": float(a["max_val"])}, [value],
                  last=value.last)


def _clamp(converter, node):
    """``aten.clamp`` by numbers (either may be None): clamp, whose gradient passes at the bounds."""
    a = arguments(node)
    if any(hasattr(a[key], "op") for key in ("min", "max")):
        converter.refuse(node, "clamps by tensors; spmdcnn clamps by numbers")
    (value,) = converter.tensors(node, [a["self"]])
    entry = {"op": "clamp", **{key: float(a[key]) for key in ("min", "max") if a[key] is not None}}
    converter.add(node, entry, [value], last=value.last)


SELU = {"alpha": 1.6732632423543772, "gain": 1.0507009873554805}       # PyTorch's selu constants


def _elu(converter, node):
    """``aten.elu`` (its scale is the op's ``gain``), ``aten.selu`` (SELU's constants)."""
    a = arguments(node)
    (value,) = converter.tensors(node, [a["self"]])
    given = dict(SELU) if opname(node) == "selu" else {"alpha": float(a["alpha"]), "gain": float(a["scale"]),
                                                        "input_scale": float(a["input_scale"])}
    entry = {"op": "elu", **{key: v for key, v in given.items() if v != 1.0}}
    converter.add(node, entry, [value], last=value.last)


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _add(converter, node, sign=1):
    """``a + b`` (``sign`` -1: ``a - b``, ``aten.sub``): of two values, an ``add`` (the second negated by a
    ``scale`` for a difference); of a value and a number, a ``scale`` that shifts (none for 0: MobileOne's
    branches that are none); of a value and a parameter, a ``bias``."""
    a = arguments(node)
    if a.get("alpha", 1) == 1 and (_number(a["self"]) or _number(a["other"])):
        number, tensor = (a["self"], a["other"]) if _number(a["self"]) else (a["other"], a["self"])
        (value,) = converter.tensors(node, [tensor])
        negated = sign < 0 and tensor is a["other"]             # number - x
        shift = float(number) * (sign if tensor is a["self"] else 1)
        if shift == 0 and not negated:
            converter.alias(node, value)
            return
        converter.add(node, {"op": "scale", "factor": -1.0 if negated else 1.0, "shift": shift}, [value],
                      last=value.last)
        return
    if sign < 0 and hasattr(a["other"], "op") and a.get("alpha", 1) == 1 and converter.computed(a["self"]) \
            and converter.computed(a["other"]):
        values = converter.tensors(node, [a["self"], a["other"]])
        converter.add(node, {"op": "scale", "factor": -1.0}, [values[1]], name=f"{converter.node_name(node)}.negated",
                      last=values[1].last)
        negated = converter.values[node]
        if values[0].last != negated.last or converter.shape(a["self"]) != converter.shape(a["other"]):
            converter.refuse(node, "subtracts values of other shapes or layouts; spmdcnn's add sums tensors of one "
                                   "shape")
        converter.add(node, {"op": "add"}, [values[0], negated], last=values[0].last)
        return
    if not (hasattr(a["self"], "op") and hasattr(a["other"], "op")) or a.get("alpha", 1) != 1:
        converter.refuse(node, "adds a number (or scales a term); spmdcnn's add sums tensors")
    one, two = converter.value(node, a["self"]), converter.value(node, a["other"])
    if one.param or two.param:                          # a learned shift
        if one.param and two.param:
            converter.refuse(node, "adds two parameters")
        _bias(converter, node, *((one, two) if one.param else (two, one)))
        return
    values = converter.tensors(node, [a["self"], a["other"]])
    if values[0].last != values[1].last:
        converter.refuse(node, "adds a channels-last value to a channels-first one")
    if converter.shape(a["self"]) != converter.shape(a["other"]):
        converter.refuse(node, f"adds shapes {converter.shape(a['self'])} and {converter.shape(a['other'])}; "
                               "spmdcnn's add sums tensors of one shape")
    converter.add(node, {"op": "add"}, values, last=values[0].last)


def _rsub(converter, node):
    """``number - x``: a ``scale`` by -1 that shifts by the number."""
    a = arguments(node)
    if not _number(a["other"]) or a.get("alpha", 1) != 1:
        converter.refuse(node, "subtracts a value from a tensor; spmdcnn subtracts values with aten.sub")
    (value,) = converter.tensors(node, [a["self"]])
    converter.add(node, {"op": "scale", "factor": -1.0, "shift": float(a["other"])}, [value], last=value.last)


def _scale(converter, node, value, factor):
    entry = {"op": "scale", "factor": float(factor)}
    converter.add(node, entry, [value], last=value.last)


def _mul(converter, node):
    a = arguments(node)
    first, second = a["self"], a["other"]
    if _number(first) or _number(second):               # a constant factor
        tensor, factor = (second, first) if _number(first) else (first, second)
        _scale(converter, node, converter.tensors(node, [tensor])[0], factor)
        return
    one, two = converter.value(node, first, grouped=True), converter.value(node, second, grouped=True)
    if one.grouped or two.grouped:                      # split attention's weights times its paths
        if one.grouped != two.grouped:
            converter.refuse(node, f"multiplies values grouped as {one.grouped} and {two.grouped}; spmdcnn "
                                   "multiplies groups of channels by weights grouped alike")
        grouped_layer(converter, node, {"op": "mul"}, [one, two], one.grouped)
        return
    if one.param or two.param:                          # a learned factor per channel: a layer scale
        if one.param and two.param:
            converter.refuse(node, "multiplies two parameters")
        param, value = (one, two) if one.param else (two, one)
        _layer_scale(converter, node, param, value)
        return
    if one.last != two.last:
        converter.refuse(node, "multiplies a channels-last value by a channels-first one")
    converter.add(node, {"op": "mul"}, [one, two], last=one.last)


def _div(converter, node):
    a = arguments(node)
    if not _number(a["other"]) or a.get("rounding_mode") is not None:
        converter.refuse(node, "divides by a tensor; spmdcnn divides only by a number (a scale)")
    _scale(converter, node, converter.tensors(node, [a["self"]])[0], 1.0 / a["other"])


def _layer_scale(converter, node, param, value):
    if param.buffer:
        converter.refuse(node, f"multiplies by '{param.param}', which is a buffer, not a parameter; spmdcnn learns a "
                               "layer scale's factors")
    tensor = converter.tensor(param.param)
    shape = converter.shape(node)
    axis = len(shape) - 1 if value.last else 1
    shared = _per_channel(converter, node, param, value, "multiplies by", "a factor")
    values = tensor.detach().reshape(-1)
    entry = {"op": "layer_scale"}
    if shared:
        entry["shared"] = True
    # its value at construction where all channels share one (as written: 1e-06, not float32's 9.99999997e-07)
    first = float(f"{float(values[0]):.7g}") if bool((values == values[0]).all()) else 1e-6
    if first != 1e-6:
        entry["init"] = first
    name = converter.add(node, entry, [value], tensors={"weight": param.param}, name=param.param, last=value.last)
    if tuple(tensor.shape) != ((1,) if shared else (shape[axis],)):
        converter.torch_shapes[f"{name}.weight"] = list(tensor.shape)


def _per_channel(converter, node, param, value, verb, what):
    """Whether parameter ``param``, read by ``node`` with ``value``, is one number shared by every channel (else
    it holds one per channel, or the node is refused)."""
    tensor = converter.tensor(param.param)
    shape = converter.shape(node)
    axis = len(shape) - 1 if value.last else 1
    seen = param.view or tuple(tensor.shape)            # as the graph reshaped it
    aligned = (1,) * (len(shape) - len(seen)) + seen    # as it broadcasts against the value
    channels = shape[axis]
    if tensor.numel() == 1 and len(seen) <= len(shape):
        return True
    if len(seen) > len(shape) or aligned[axis] != channels or tensor.numel() != channels:
        converter.refuse(node, f"{verb} parameter '{param.param}' of shape {seen}; spmdcnn takes {what} per channel "
                               f"({channels}) or one for all")
    return False


def _bias(converter, node, param, value):
    """A value plus a learned shift per channel, or one for every channel (HGNetV2's learnable affine)."""
    if param.buffer:
        converter.refuse(node, f"adds '{param.param}', which is a buffer, not a parameter; spmdcnn learns a bias")
    shared = _per_channel(converter, node, param, value, "adds", "a shift")
    name = converter.add(node, {"op": "bias", **({"shared": True} if shared else {})}, [value],
                         tensors={"bias": param.param}, name=param.param, last=value.last)
    tensor = converter.tensor(param.param)
    if tuple(tensor.shape) != ((1,) if shared else (converter.shape(node)[-1 if value.last else 1],)):
        converter.torch_shapes[f"{name}.bias"] = list(tensor.shape)


def _prelu(converter, node):
    """``aten.prelu``: one slope shared by every channel (``nn.PReLU()``) or one per channel (``nn.PReLU(C)``)."""
    a = arguments(node)
    value = first_input(converter, node)
    shape = converter.shape(a["self"])
    if value.last or len(shape) < 2:
        converter.refuse(node, f"runs on shape {shape}; spmdcnn's prelu takes its channels second")
    key = converter.parameter(node, a["weight"])
    slopes = converter.tensor(key).detach().reshape(-1)
    entry = {"op": "prelu"}
    if slopes.numel() != 1:
        entry["shared"] = False
    first = float(f"{float(slopes[0]):.7g}") if bool((slopes == slopes[0]).all()) else 0.25   # at construction
    if first != 0.25:
        entry["init"] = first
    converter.add(node, entry, [value], tensors={"weight": key})


def _pixel_unshuffle(converter, node):
    """``nn.PixelUnshuffle``: each channel's block positions together."""
    a = arguments(node)
    value = first_input(converter, node)
    spatial_rank(converter, node, value)
    converter.add(node, {"op": "space_to_depth", "size": a["downscale_factor"]}, [value])


def _dropout(converter, node):
    a = arguments(node)
    value = first_input(converter, node)
    if not a["train"]:                                  # PyTorch's identity then
        converter.alias(node, value)
        return
    converter.add(node, {"op": "dropout", "p": a["p"]}, [value], last=value.last)


# -- whole modules ------------------------------------------------------------------------------------------------

def _stochastic_depth(converter, path, module, value):
    """torchvision's ``StochasticDepth`` (mode 'row': whole samples), timm's ``DropPath`` (its ``scale_by_keep``)."""
    p = getattr(module, "p", None)
    if p is None:
        p = module.drop_prob
    if getattr(module, "mode", "row") != "row":
        return f"drops in mode '{module.mode}'; spmdcnn's stochastic_depth drops whole samples (mode row)"
    if not getattr(module, "scale_by_keep", True):
        return "does not scale the samples it keeps; spmdcnn's stochastic_depth scales them by 1 / (1 - p)"
    return {"op": "stochastic_depth", "p": p}


def _space_to_depth(converter, path, module, value):
    """timm's ``SpaceToDepth`` (TResNet's stem): each block position's channels together."""
    return {"op": "space_to_depth", "size": module.bs, "order": "blocks"}


def _simple_norm(converter, path, module, value):
    """timm's ``SimpleNorm2d`` (over the channels, moved last inside) and ``SimpleNorm`` (over the last axis:
    channels last, or features): ``x / sqrt(var + eps) * weight``, the variance ``torch.var``'s (over C - 1), ``x``
    not centred."""
    shape = converter.shape(converter.collapsed_output[path])
    over_last = type(module).__name__ == "SimpleNorm"
    if over_last != value.last and not (over_last and len(shape) == 2):
        return "normalises an axis other than the channels; spmdcnn's layernorm normalises the channels"
    if tuple(module.normalized_shape) != (shape[-1 if over_last else 1],):
        return f"normalises over {tuple(module.normalized_shape)}; spmdcnn's layernorm normalises the channels"
    entry = {"op": "layernorm", "center": False, "correction": 1, "bias": False}
    if module.eps != 1e-5:
        entry["eps"] = module.eps
    if module.weight is None:
        entry["affine"] = False
    return entry


def _radix_softmax(converter, path, module, value):
    """timm's ``RadixSoftmax`` (ResNeSt's split attention): a softmax across its radix groups of channels (a
    sigmoid for a radix of 1), given (and flattened to) (N, C) of a (N, C, 1, 1)."""
    if module.radix == 1:
        return {"op": "sigmoid"}
    if module.cardinality != 1:
        return (f"takes a softmax across {module.radix} groups within each of {module.cardinality} cardinal groups; "
                "spmdcnn's group_softmax takes groups of consecutive channels")
    return {"op": "group_softmax", "groups": module.radix}


MODULES = {"StochasticDepth": _stochastic_depth, "DropPath": _stochastic_depth, "SpaceToDepth": _space_to_depth,
           "SimpleNorm2d": _simple_norm, "SimpleNorm": _simple_norm, "RadixSoftmax": _radix_softmax}

ATEN = {
    **{f"conv{rank}d": _conv for rank in (1, 2, 3)}, **{f"conv_transpose{rank}d": _conv for rank in (1, 2, 3)},
    "convolution": _conv, "linear": _linear,
    "batch_norm": _batch_norm, "group_norm": _group_norm, "instance_norm": _instance_norm,
    "layer_norm": _layer_norm,
    "relu": _activation("relu"), "relu6": _activation("relu6"), "hardtanh": _hardtanh,
    "silu": _activation("silu"), "gelu": _activation("gelu", approximate=("approximate", "none")),
    "hardswish": _activation("hardswish"), "hardsigmoid": _activation("hardsigmoid"),
    "sigmoid": _activation("sigmoid"), "tanh": _activation("tanh"),
    "leaky_relu": _activation("leaky_relu", negative_slope=("negative_slope", 0.01)),
    "elu": _elu, "selu": _elu, "mish": _activation("mish"), "clamp": _clamp,
    "prelu": _prelu, "pixel_unshuffle": _pixel_unshuffle, "add": _add,
    "sub": lambda converter, node: _add(converter, node, -1), "rsub": _rsub, "mul": _mul, "div": _div,
    "dropout": _dropout,
    **SHAPES,
}
