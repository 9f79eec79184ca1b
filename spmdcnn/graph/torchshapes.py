"""The ATen operators of shape, pooling and resampling ``spmdcnn model import`` maps (``graph/torchaten.py`` holds
the table): permutes, flattens and reshapes, concatenation, pooling, interpolation, and attention (refused)."""

from .torchargs import arguments, first_input, opname, pair_list, spatial_rank


# -- shapes -------------------------------------------------------------------------------------------------------

def _permute(converter, node):
    a = arguments(node)
    value = first_input(converter, node)
    dims = list(a["dims"])
    rank = len(converter.shape(a["self"]))
    dims = [dim % rank for dim in dims]
    last = [0] + list(range(2, rank)) + [1]             # channels to the end
    first = [0, rank - 1] + list(range(1, rank - 1))    # and back
    if dims == last and not value.last:
        converter.alias(node, value, last=True)
    elif dims == first and value.last:
        converter.alias(node, value, last=False)
    else:
        converter.refuse(node, f"permutes the axes {dims}; spmdcnn follows only a permute of the channels to the "
                               "last axis and back")


def _flatten(converter, node):
    a = arguments(node)
    value = first_input(converter, node)
    rank = len(converter.shape(a["self"]))
    if a["start_dim"] % rank != 1 or a["end_dim"] % rank != rank - 1:
        converter.refuse(node, "flattens other axes than all but the batch; spmdcnn's flatten keeps the batch axis "
                               "alone")
    flatten_value(converter, node, value, a["self"])


def _reshape(converter, node):
    """``view``/``reshape`` to the shape it has (an identity) or to (N, features) (a flatten)."""
    a = arguments(node)
    value = first_input(converter, node)
    before, after = converter.shape(a["self"]), converter.shape(node)
    if tuple(before) == tuple(after):
        converter.alias(node, value)
        return
    if len(after) != 2 or after[0] != before[0]:
        converter.refuse(node, f"reshapes {tuple(before)} to {tuple(after)}; spmdcnn reshapes only to flatten all "
                               "but the batch axis")
    flatten_value(converter, node, value, a["self"])


def flatten_value(converter, node, value, tensor):
    if value.last:
        converter.refuse(node, "flattens channels-last values; permute back first")
    if len(converter.shape(tensor)) == 2:
        converter.alias(node, value)
        return
    converter.add(node, {"op": "flatten"}, [value])


def _same(converter, node):
    """``contiguous``, ``clone``, ``alias``: the value itself."""
    converter.alias(node, first_input(converter, node))


def _pad(converter, node):
    """``aten.pad`` of nothing (MONAI's ``UpCat`` pads a skip connection to its partner's size, which is the same
    at most sizes): the value itself."""
    a = arguments(node)
    value = first_input(converter, node)
    if any(a["pad"]):
        converter.refuse(node, f"pads by {list(a['pad'])} ('{a['mode']}'); spmdcnn pads inside its convolutions and "
                               "poolings")
    converter.alias(node, value)


def _cat(converter, node):
    a = arguments(node)
    values = converter.tensors(node, list(a["tensors"]))
    if len(values) == 1:                # a concatenation of one tensor is that tensor (DenseNet's first layer)
        converter.alias(node, values[0])
        return
    rank = len(converter.shape(node))
    if a["dim"] % rank != 1 or any(value.last for value in values):
        converter.refuse(node, f"concatenates along axis {a['dim']}; spmdcnn's concat joins channels (axis 1)")
    converter.add(node, {"op": "concat"}, values)


def _getitem(converter, node):
    """One output of an operator giving several (a max pooling's values, not its indices)."""
    source, index = node.args
    values = converter.value(node, source, several=True)
    if not isinstance(values, tuple) or values[index] is None:
        converter.refuse(node, f"reads output {index} of '{source}'; spmdcnn takes only its first")
    converter.values[node] = values[index]


# -- pooling and resampling ---------------------------------------------------------------------------------------

def _pool(kind):
    """``aten.max_pool{1,2,3}d`` (with indices: its values), ``aten.avg_pool{1,2,3}d``."""
    def handle(converter, node):
        a = arguments(node)
        value = first_input(converter, node)
        rank = spatial_rank(converter, node, value)
        if kind == "max" and pair_list(a["dilation"]) != 1:
            converter.refuse(node, "dilates its window; spmdcnn's maxpool does not")
        if kind == "avg" and (not a["count_include_pad"] or a.get("divisor_override") is not None):
            converter.refuse(node, "leaves the padding out of its divisor (or overrides it); spmdcnn's avgpool "
                                   "counts the padding, as PyTorch's default does")
        entry = {"op": f"{kind}pool{rank}d", "kernel": pair_list(a["kernel_size"])}
        stride = a["stride"] if a["stride"] not in (None, [], ()) else a["kernel_size"]
        if pair_list(stride) != entry["kernel"]:
            entry["stride"] = pair_list(stride)
        if pair_list(a["padding"]) != 0:
            entry["padding"] = pair_list(a["padding"])
        if a["ceil_mode"]:
            entry["ceil_mode"] = True
        converter.add(node, entry, [value])
        if "with_indices" in opname(node):
            converter.values[node] = (converter.values[node], None)
    return handle


def _adaptive_avg_pool(converter, node):
    """To one position: a global average pooling; to the input's own size: the value itself (AlexNet's and VGG's
    at 224x224); to a size that divides the input's along every axis: an average pooling of that window."""
    a = arguments(node)
    value = first_input(converter, node)
    rank = spatial_rank(converter, node, value)
    before, out = converter.shape(a["self"])[2:], converter.shape(node)[2:]
    if all(size == 1 for size in out):
        converter.add(node, {"op": "global_avgpool"}, [value])
    elif tuple(out) == tuple(before):
        converter.alias(node, value)
    elif all(size % target == 0 for size, target in zip(before, out)):
        window = pair_list([size // target for size, target in zip(before, out)])
        converter.add(node, {"op": f"avgpool{rank}d", "kernel": window}, [value])
    else:
        converter.refuse(node, f"pools {tuple(before)} to {tuple(out)} positions, windows of uneven sizes; spmdcnn "
                               "pools adaptively to one position or to sizes that divide the input's")


ATTENTION = "is attention over activations; spmdcnn imports convolutional networks (no op of it computes attention)"


def _attention(converter, node):
    """``aten.scaled_dot_product_attention``, a product of two activations (``q @ k.transpose(-2, -1)``,
    ``bmm``): a transformer's attention, refused as such."""
    tensors = [arg for arg in node.all_input_nodes if converter.computed(arg)]
    if opname(node) == "scaled_dot_product_attention" or len(tensors) >= 2:
        converter.refuse(node, ATTENTION)
    converter.refuse(node, "multiplies matrices of an activation; spmdcnn's linear and convolutions take a "
                           "layer's weight")


def _mean(converter, node):
    """``x.mean((2, 3))``, ``torch.mean(x, dim=[-2, -1], keepdim=True)``: a mean over every spatial axis is a
    global average pooling (and a flatten of its (C, 1, ...) without ``keepdim``)."""
    a = arguments(node)
    value = first_input(converter, node)
    shape = converter.shape(a["self"])
    dims = list(a["dim"] or [])
    spatial = set(range(2, len(shape)))
    if value.last or {dim % len(shape) for dim in dims} != spatial or not spatial or a.get("dtype") is not None:
        converter.refuse(node, f"averages over the axes {dims} of shape {shape}; spmdcnn averages over every "
                               "spatial axis at once (a global average pooling)")
    if a["keepdim"]:
        converter.add(node, {"op": "global_avgpool"}, [value])
        return
    pooled = converter.add(node, {"op": "global_avgpool"}, [value])
    converter.shapes[pooled] = (shape[1],) + (1,) * len(spatial)
    converter.add(node, {"op": "flatten"}, [converter.values[node]], name=f"{pooled}_flatten")


def _upsample(mode):
    """``aten.upsample_nearest{1,2,3}d``, ``upsample_linear1d``, ``upsample_bilinear2d``,
    ``upsample_trilinear3d``: by a factor or to a size, where it is a whole multiple of the input's along every
    axis."""
    def handle(converter, node):
        a = arguments(node)
        value = first_input(converter, node)
        spatial_rank(converter, node, value)
        before, after = converter.shape(a["input"])[2:], converter.shape(node)[2:]
        factors = a.get("scale_factors")
        if any(out % size for out, size in zip(after, before)) or \
                factors and any(float(f) != out // size for f, out, size in zip(factors, after, before)):
            converter.refuse(node, f"resizes {tuple(before)} to {tuple(after)}; spmdcnn upsamples by whole factors")
        entry = {"op": "upsample", "scale": pair_list([out // size for out, size in zip(after, before)])}
        if mode == "linear":
            entry["mode"] = "linear"
            if a["align_corners"]:
                entry["align_corners"] = True
        converter.add(node, entry, [value])
    return handle


SHAPES = {      # graph/torchaten.py's table holds these rows
    "permute": _permute, "flatten": _flatten, "view": _reshape, "reshape": _reshape, "_unsafe_view": _reshape,
    "contiguous": _same, "pad": _pad, "clone": _same, "alias": _same, "cat": _cat, "getitem": _getitem,
    **{f"{kind}_pool{rank}d": _pool(kind) for kind in ("max", "avg") for rank in (1, 2, 3)},
    **{f"max_pool{rank}d_with_indices": _pool("max") for rank in (1, 2, 3)},
    **{f"adaptive_avg_pool{rank}d": _adaptive_avg_pool for rank in (1, 2, 3)}, "mean": _mean,
    **{name: _attention for name in ("scaled_dot_product_attention", "matmul", "bmm", "baddbmm", "einsum",
                                     "_native_multi_head_attention")},
    **{f"upsample_nearest{rank}d": _upsample("nearest") for rank in (1, 2, 3)},
    "upsample_linear1d": _upsample("linear"), "upsample_bilinear2d": _upsample("linear"),
    "upsample_trilinear3d": _upsample("linear"),
}
