"""The ATen operators of shape, pooling and resampling ``spmdcnn model import`` maps (``graph/torchaten.py`` holds
the table): permutes, flattens and reshapes, concatenation, pooling, interpolation, and attention (refused)."""

from math import prod

from .torchargs import arguments, first_input, opname, pair_list, spatial_rank


# -- shapes -------------------------------------------------------------------------------------------------------

def _permute(converter, node):
    a = arguments(node)
    rank = len(converter.shape(a["self"]))
    if opname(node) == "transpose":
        dims = list(range(rank))
        dims[a["dim0"] % rank], dims[a["dim1"] % rank] = dims[a["dim1"] % rank], dims[a["dim0"] % rank]
    else:
        dims = [dim % rank for dim in a["dims"]]
    value = first_input(converter, node, grouped=True)
    if value.grouped:                                   # ShuffleNet's transpose of the groups and their channels
        if dims != [0, 2, 1] + list(range(3, rank)):
            converter.refuse(node, f"permutes the axes {dims} of channels viewed as groups; spmdcnn follows only "
                                   "the swap of the groups and their channels (a channel shuffle)")
        first, second, swapped = value.grouped
        converter.alias(node, value, grouped=(second, first, not swapped))
        return
    last = [0] + list(range(2, rank)) + [1]             # channels to the end
    first = [0, rank - 1] + list(range(1, rank - 1))    # and back
    if dims == list(range(rank)):
        converter.alias(node, value)
    elif dims == last and not value.last:
        converter.alias(node, value, last=True)
    elif dims == first and value.last:
        converter.alias(node, value, last=False)
    else:
        converter.refuse(node, f"permutes the axes {dims}; spmdcnn follows only a permute of the channels to the "
                               "last axis and back")


def _flatten(converter, node):
    a = arguments(node)
    value = first_input(converter, node, grouped=True)
    rank = len(converter.shape(a["self"]))
    if value.grouped:
        if (a["start_dim"] % rank, a["end_dim"] % rank) != (1, 2):
            converter.refuse(node, "flattens channels viewed as groups with other axes; spmdcnn follows only their "
                                   "flattening back into channels")
        _ungrouped(converter, node, value)
        return
    if a["start_dim"] % rank != 1 or a["end_dim"] % rank != rank - 1:
        converter.refuse(node, "flattens other axes than all but the batch; spmdcnn's flatten keeps the batch axis "
                               "alone")
    flatten_value(converter, node, value, a["self"])


def _reshape(converter, node):
    """``view``/``reshape`` to the shape it has (an identity), to (N, features) (a flatten), of the channels into
    (groups, channels per group) on an axis of their own and back (ShuffleNet's channel shuffle, with the
    transpose between); of a parameter, that parameter seen in the new shape (as a layer scale's factors)."""
    a = arguments(node)
    source = converter.value(node, a["self"], grouped=True)
    if source.param:                                    # a parameter shaped to broadcast (a layer scale's)
        converter.viewed(node, source, converter.shape(node))
        return
    value = first_input(converter, node, grouped=True)
    before, after = converter.shape(a["self"]), converter.shape(node)
    if value.grouped:
        if tuple(after) != (before[0], before[1] * before[2]) + tuple(before[3:]):
            converter.refuse(node, f"reshapes channels viewed as groups {tuple(before)} to {tuple(after)}; spmdcnn "
                                   "follows only their reshape back into channels")
        _ungrouped(converter, node, value)
        return
    if tuple(before) == tuple(after) or converter.shapes.get(value.name) == tuple(after[1:]):
        converter.alias(node, value)        # the shape it has, in spmdcnn too (a flattened module's, given back)
        return
    if not value.last and len(before) >= 3 and len(after) == len(before) + 1 and after[0] == before[0] and \
            after[1] * after[2] == before[1] and tuple(after[3:]) == tuple(before[2:]):
        converter.alias(node, value, grouped=(after[1], after[2], False))
        return
    if len(after) != 2 or after[0] != before[0]:
        converter.refuse(node, f"reshapes {tuple(before)} to {tuple(after)}; spmdcnn reshapes only to flatten all "
                               "but the batch axis, or the channels into groups for a channel shuffle")
    flatten_value(converter, node, value, a["self"])


def _ungrouped(converter, node, value):
    """Channels viewed as (groups, per group) back into channels: themselves, or after the swap of the two axes, a
    channel shuffle of the first view's groups."""
    first, second, swapped = value.grouped
    if not swapped:
        converter.alias(node, value)
        return
    converter.add(node, {"op": "channel_shuffle", "groups": second}, [value])


def flatten_value(converter, node, value, tensor):
    if value.last:
        converter.refuse(node, "flattens channels-last values; permute back first")
    if len(converter.shape(tensor)) == 2:
        converter.alias(node, value)
        return
    converter.add(node, {"op": "flatten"}, [value])


def _same(converter, node):
    """``contiguous``, ``clone``, ``alias``: the value itself."""
    value = first_input(converter, node, grouped=True)
    converter.alias(node, value, grouped=value.grouped)


def _pad(converter, node):
    """``F.pad`` with a constant (``aten.pad`` in mode 'constant', ``aten.constant_pad_nd``) of the spatial axes,
    cropping where negative (NASNet's shift by a row and a column): a ``pad`` layer (none where it pads by
    nothing: MONAI's ``UpCat`` pads a skip connection to its partner's size, which it mostly has)."""
    a = arguments(node)
    value = first_input(converter, node)
    sizes, shape = list(a["pad"]), converter.shape(a["self"])
    mode = a.get("mode") or "constant"
    if not any(sizes):
        converter.alias(node, value)
        return
    if mode != "constant":
        converter.refuse(node, f"pads in mode '{mode}'; spmdcnn pads with a constant")
    rank = spatial_rank(converter, node, value)
    padding = [[0, 0] for _ in range(rank)]
    for index in range(0, len(sizes), 2):           # PyTorch's pairs run from the last axis back
        axis = len(shape) - 1 - index // 2
        if axis < 2 and (sizes[index] or sizes[index + 1]):
            converter.refuse(node, f"pads axis {axis} of shape {shape}; spmdcnn pads the spatial axes")
        if axis >= 2:
            padding[axis - 2] = [sizes[index], sizes[index + 1]]
    entry = {"op": "pad", "padding": padding}
    if len({side for pair in padding for side in pair}) == 1 and padding[0][0] >= 0:
        entry["padding"] = padding[0][0]
    if a.get("value"):
        entry["value"] = float(a["value"])
    converter.add(node, entry, [value])


def _slice_of(converter, node, value, tensor, dim, start, stop, name=None):
    """``tensor[..., start:stop]`` along ``dim`` (Python's rules: None, negative, past the end): a ``slice`` layer
    along the channels (or features), the value itself for the whole of any axis."""
    shape = converter.shape(tensor)
    dim %= len(shape)
    start, stop, _ = slice(start, stop).indices(shape[dim])
    if (start, stop) == (0, shape[dim]):
        converter.alias(node, value)
        return
    channels = len(shape) - 1 if value.last else 1
    if dim != channels:
        converter.refuse(node, f"slices [{start}:{stop}] of axis {dim} of shape {tuple(shape)}; spmdcnn slices the "
                               "channels")
    if stop <= start:
        converter.refuse(node, f"slices [{start}:{stop}] of the channels, which holds none")
    converter.add(node, {"op": "slice", "start": start, "stop": stop}, [value], last=value.last, name=name)


def _slice(converter, node):
    """``x[:, a:b]`` (``aten.slice``; a step of 1), ``x.narrow(1, start, length)``."""
    a = arguments(node)
    value = first_input(converter, node)
    if opname(node) == "narrow":
        _slice_of(converter, node, value, a["self"], a["dim"], a["start"], a["start"] + a["length"])
        return
    if a["step"] != 1:
        converter.refuse(node, f"slices with a step of {a['step']}; spmdcnn slices consecutive channels")
    _slice_of(converter, node, value, a["self"], a["dim"], a["start"], a["end"])


class _Piece:
    """One part of a split, made a ``slice`` layer where a node reads it (``getitem``)."""

    def __init__(self, value, tensor, dim, start, stop):
        self.value, self.tensor, self.dim, self.start, self.stop = value, tensor, dim, start, stop


def _split(converter, node):
    """``torch.split`` (``aten.split`` by a size, ``aten.split_with_sizes``), ``torch.chunk``: its parts."""
    a = arguments(node)
    value = first_input(converter, node)
    dim = a["dim"] % len(converter.shape(a["self"]))
    size = converter.shape(a["self"])[dim]
    if opname(node) == "split_with_sizes":
        sizes = list(a["split_sizes"])
    else:
        step = a["split_size"] if opname(node) == "split" else -(-size // a["chunks"])
        sizes = [min(step, size - start) for start in range(0, size, step)]
    starts = [sum(sizes[:index]) for index in range(len(sizes))]
    converter.values[node] = tuple(_Piece(value, a["self"], dim, start, start + count)
                                   for start, count in zip(starts, sizes))


def _repeat(converter, node):
    """``x.repeat(1, k, 1, ...)`` and ``x.expand(N, k, ...)`` of one channel: ``k`` copies of the channels side by
    side, a ``concat`` of the value ``k`` times (a repeat or expand of nothing: the value)."""
    a = arguments(node)
    value = first_input(converter, node)
    before, after = converter.shape(a["self"]), converter.shape(node)
    channels = len(before) - 1 if value.last else 1
    if len(after) != len(before) or any(b != c for axis, (b, c) in enumerate(zip(before, after)) if axis != channels):
        converter.refuse(node, f"repeats {tuple(before)} as {tuple(after)}; spmdcnn repeats the channels alone")
    copies = after[channels] // before[channels]
    if copies == 1:
        converter.alias(node, value)
        return
    converter.add(node, {"op": "concat"}, [value] * copies, last=value.last)


def _cat(converter, node):
    a = arguments(node)
    values = converter.tensors(node, list(a["tensors"]))
    if len(values) == 1:                # a concatenation of one tensor is that tensor (DenseNet's first layer)
        converter.alias(node, values[0])
        return
    rank = len(converter.shape(node))
    last = values[0].last
    if any(value.last != last for value in values):
        converter.refuse(node, "concatenates channels-last values with channels-first ones")
    if a["dim"] % rank != (rank - 1 if last else 1):
        converter.refuse(node, f"concatenates along axis {a['dim']}; spmdcnn's concat joins channels (axis 1, or "
                               "the last axis of channels-last values)")
    converter.add(node, {"op": "concat"}, values, last=last)


def _stack(converter, node):
    """``torch.stack`` of values of one shape along axis 1 (SKNet's paths): their channels joined, seen as
    (paths, channels) on an axis of their own (a sum or a softmax over the paths reads them)."""
    a = arguments(node)
    values = converter.tensors(node, list(a["tensors"]))
    rank = len(converter.shape(node))
    if a["dim"] % rank != 1 or any(value.last for value in values):
        converter.refuse(node, f"stacks along axis {a['dim']}; spmdcnn stacks values as groups of channels (axis 1)")
    channels = converter.shape(list(a["tensors"])[0])[1]
    if len(values) == 1:
        converter.alias(node, values[0], grouped=(1, channels, False))
        return
    grouped_layer(converter, node, {"op": "concat"}, values, (len(values), channels, False))


def _sum(converter, node):
    """A sum over the groups of channels seen on an axis of their own (SKNet's and ResNeSt's paths): the groups'
    slices added; over every spatial axis, a global pooling's (:func:`_reduction`)."""
    a = arguments(node)
    value = first_input(converter, node, grouped=True)
    dims = [dim % len(converter.shape(a["self"])) for dim in (a.get("dim") or [])]
    if not value.grouped and dims != [1]:               # over the spatial axes
        _reduction("sum")(converter, node)
        return
    if not value.grouped or dims != [1] or a.get("keepdim") or value.grouped[2]:
        converter.refuse(node, f"sums over the axes {dims or 'all'}; spmdcnn sums only groups of channels (a "
                               "reshape or stack of them, then a sum over that axis)")
    groups, channels, _ = value.grouped
    parts = [_part(converter, node, value, index * channels, (index + 1) * channels) for index in range(groups)]
    if len(parts) == 1:
        converter.alias(node, parts[0])
        return
    converter.add(node, {"op": "add"}, parts)


def _part(converter, node, value, start, stop):
    """A ``slice`` of ``value``'s channels for ``node`` (a layer of its own, named after it)."""
    converter.add(node, {"op": "slice", "start": start, "stop": stop}, [value],
                  name=f"{converter.node_name(node)}.part")
    return converter.values[node]


def grouped_layer(converter, node, entry, values, grouped):
    """Append layer ``entry`` for ``node``, whose PyTorch value holds its channels as ``grouped`` on two axes (a
    softmax or a product of split attention's): the layer's channels are their product, and the node stands for it
    seen grouped again."""
    name = converter.add(node, entry, values)
    shape = converter.shape(node)
    converter.shapes[name] = (shape[1] * shape[2],) + tuple(shape[3:])
    converter.alias(node, converter.values[node], grouped=grouped)


def _softmax(converter, node):
    """A softmax over groups of channels seen on an axis of their own (split attention's weights)."""
    a = arguments(node)
    value = first_input(converter, node, grouped=True)
    if not value.grouped or a["dim"] % len(converter.shape(a["self"])) != 1 or value.grouped[2]:
        converter.refuse(node, f"takes a softmax over axis {a['dim']}; spmdcnn's group_softmax normalises across "
                               "groups of channels (reshaped onto an axis of their own), and losses take their own")
    grouped_layer(converter, node, {"op": "group_softmax", "groups": value.grouped[0]}, [value], value.grouped)


def _getitem(converter, node):
    """One output of an operator giving several (a max pooling's values, not its indices; a part of a split)."""
    source, index = node.args
    values = converter.value(node, source, several=True)
    if not isinstance(values, tuple) or values[index] is None:
        converter.refuse(node, f"reads output {index} of '{source}'; spmdcnn takes only its first")
    piece = values[index]
    if isinstance(piece, _Piece):
        _slice_of(converter, node, piece.value, piece.tensor, piece.dim, piece.start, piece.stop,
                  name=converter.node_name(source))         # named as the split is
        return
    converter.values[node] = piece


# -- pooling and resampling ---------------------------------------------------------------------------------------

def _pool(kind):
    """``aten.max_pool{1,2,3}d`` (with indices: its values), ``aten.avg_pool{1,2,3}d``."""
    def handle(converter, node):
        a = arguments(node)
        value = first_input(converter, node)
        rank = spatial_rank(converter, node, value)
        if kind == "max" and pair_list(a["dilation"]) != 1:
            converter.refuse(node, "dilates its window; spmdcnn's maxpool does not")
        if kind == "avg" and a.get("divisor_override") is not None:
            converter.refuse(node, "divides by a number of its own (divisor_override); spmdcnn's avgpool divides by "
                                   "the positions it counts")
        entry = {"op": f"{kind}pool{rank}d", "kernel": pair_list(a["kernel_size"])}
        stride = a["stride"] if a["stride"] not in (None, [], ()) else a["kernel_size"]
        if pair_list(stride) != entry["kernel"]:
            entry["stride"] = pair_list(stride)
        if pair_list(a["padding"]) != 0:
            entry["padding"] = pair_list(a["padding"])
        if a["ceil_mode"]:
            entry["ceil_mode"] = True
        if kind == "avg" and not a["count_include_pad"] and pair_list(a["padding"]) != 0:
            entry["count_include_pad"] = False
        converter.add(node, entry, [value])
        if "with_indices" in opname(node):
            converter.values[node] = (converter.values[node], None)
    return handle


def _adaptive_avg_pool(converter, node):
    """To one position: a global average pooling; to the input's own size: the value itself (AlexNet's and VGG's
    at 224x224); to a size that divides the input's along every axis: an average pooling of that window; to any
    other size: an adaptive average pooling of PyTorch's uneven windows."""
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
    else:                           # PyTorch's uneven windows (VGG's 7x7 from a smaller input)
        converter.add(node, {"op": f"adaptive_avgpool{rank}d", "output_size": pair_list(list(out))}, [value])


def _adaptive_max_pool(converter, node):
    """To one position: a max pooling of the whole extent (its values; not its indices)."""
    a = arguments(node)
    value = first_input(converter, node)
    rank = spatial_rank(converter, node, value)
    before = converter.shape(a["self"])[2:]
    sizes = a["output_size"]
    if any(size != 1 for size in (sizes if isinstance(sizes, (list, tuple)) else [sizes])):
        converter.refuse(node, f"max-pools {tuple(before)} to {a['output_size']} positions; spmdcnn max-pools "
                               "adaptively to one position")
    converter.add(node, {"op": f"maxpool{rank}d", "kernel": pair_list(list(before))}, [value])
    converter.values[node] = (converter.values[node], None)


ATTENTION = "is attention over activations; spmdcnn imports convolutional networks (no op of it computes attention)"


def _attention(converter, node):
    """``aten.scaled_dot_product_attention``, a product of two activations (``q @ k.transpose(-2, -1)``,
    ``bmm``): a transformer's attention, refused as such."""
    tensors = [arg for arg in node.all_input_nodes if converter.computed(arg)]
    if opname(node) == "scaled_dot_product_attention" or len(tensors) >= 2:
        converter.refuse(node, ATTENTION)
    converter.refuse(node, "multiplies matrices of an activation; spmdcnn's linear and convolutions take a "
                           "layer's weight")


def _reduction(kind):
    """``x.mean((2, 3))``, ``x.sum((2, 3))``, ``x.amax((2, 3))``, with ``keepdim`` or not, over every spatial axis
    (or over the axes between the batch and channels last): a global average pooling (times the positions, for a
    sum) or a max pooling of the whole extent, and a flatten of its (C, 1, ...) without ``keepdim``."""
    def handle(converter, node):
        a = arguments(node)
        value = first_input(converter, node)
        shape = converter.shape(a["self"])
        dims = list(a["dim"] or [])
        spatial = set(range(1, len(shape) - 1)) if value.last else set(range(2, len(shape)))
        if {dim % len(shape) for dim in dims} != spatial or not spatial or a.get("dtype") is not None:
            converter.refuse(node, f"reduces over the axes {dims} of shape {shape}; spmdcnn reduces over every "
                                   "spatial axis at once (a global pooling)")
        extents = [shape[axis] for axis in sorted(spatial)]
        rank = len(extents)
        entry = {"op": f"maxpool{rank}d", "kernel": pair_list(extents)} if kind == "amax" else \
            {"op": "global_avgpool"}
        pooled = converter.add(node, entry, [value], last=value.last and a["keepdim"])
        channels = shape[-1 if value.last else 1]
        converter.shapes[pooled] = (channels,) + (1,) * rank
        if kind == "sum":
            converter.add(node, {"op": "scale", "factor": float(prod(extents))}, [converter.values[node]],
                          name=f"{pooled}_sum", last=value.last and a["keepdim"])
            converter.shapes[converter.values[node].name] = (channels,) + (1,) * rank
        if not a["keepdim"]:
            converter.add(node, {"op": "flatten"}, [converter.values[node]], name=f"{pooled}_flatten")
    return handle


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
    "contiguous": _same, "pad": _pad, "constant_pad_nd": _pad,
    "slice": _slice, "narrow": _slice, "split": _split, "split_with_sizes": _split, "chunk": _split,
    "transpose": _permute, "repeat": _repeat, "expand": _repeat, "stack": _stack, "sum": _sum, "softmax": _softmax, "_softmax": _softmax,
    "clone": _same, "alias": _same, "cat": _cat, "getitem": _getitem,
    **{f"{kind}_pool{rank}d": _pool(kind) for kind in ("max", "avg") for rank in (1, 2, 3)},
    **{f"max_pool{rank}d_with_indices": _pool("max") for rank in (1, 2, 3)},
    **{f"adaptive_avg_pool{rank}d": _adaptive_avg_pool for rank in (1, 2, 3)},
    **{f"adaptive_max_pool{rank}d": _adaptive_max_pool for rank in (1, 2, 3)},
    "mean": _reduction("mean"), "amax": _reduction("amax"),
    **{name: _attention for name in ("scaled_dot_product_attention", "matmul", "bmm", "baddbmm", "einsum",
                                     "_native_multi_head_attention")},
    **{f"upsample_nearest{rank}d": _upsample("nearest") for rank in (1, 2, 3)},
    "upsample_linear1d": _upsample("linear"), "upsample_bilinear2d": _upsample("linear"),
    "upsample_trilinear3d": _upsample("linear"),
}
