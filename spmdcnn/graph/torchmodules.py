"""The PyTorch modules ``spmdcnn model import`` maps (``graph/torchops.py``): a handler per module type, appending the
layer entry its node becomes through the converter (or passing the value on, or refusing the node)."""


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
    channel_norm(converter, node, inputs, module.normalized_shape, module.eps,
                  module.weight is not None, module.bias is not None or module.weight is None, node.target)


def channel_norm(converter, node, inputs, normalized, eps, affine, has_bias, name):
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
        pool(converter, node, kind, inputs[0], module.kernel_size, module.stride, module.padding,
             getattr(module, "dilation", 1), module.ceil_mode, getattr(module, "return_indices", False),
             getattr(module, "count_include_pad", True), getattr(module, "divisor_override", None))
    return handle


def pool(converter, node, kind, value, kernel, stride, padding, dilation, ceil_mode, return_indices,
         count_include_pad, divisor_override):
    """A max (``kind`` max) or average pooling, of a module or a function (``F.max_pool2d``, ``F.avg_pool3d``):
    ``stride`` None (or empty) is the kernel's size, as PyTorch has it."""
    rank = _spatial_rank(converter, node, value)
    if kind == "max" and (_pair_list(dilation) != 1 or return_indices):
        converter.refuse(node, "dilates its window or returns indices; spmdcnn's maxpool does neither")
    if kind == "avg" and (not count_include_pad or divisor_override is not None):
        converter.refuse(node, "leaves the padding out of its divisor (or overrides it); spmdcnn's avgpool "
                               "counts the padding, as PyTorch's default does")
    entry = {"op": f"{kind}pool{rank}d", "kernel": _pair_list(kernel)}
    stride = stride if stride not in (None, [], ()) else kernel
    if _pair_list(stride) != entry["kernel"]:
        entry["stride"] = _pair_list(stride)
    if _pair_list(padding) != 0:
        entry["padding"] = _pair_list(padding)
    if ceil_mode:
        entry["ceil_mode"] = True
    converter.add(node, entry, [value])


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
    if module.start_dim != 1 or module.end_dim not in (-1, len(converter.shape(node.args[0])) - 1):
        converter.refuse(node, "flattens other axes than all but the batch; spmdcnn's flatten keeps the batch axis "
                               "alone")
    flatten_value(converter, node, inputs[0])


def flatten_value(converter, node, value):
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


MODULES = {
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
