"""The shape each op produces, its parameters and its forward FLOPs (what it accepts: ``graph/opkeys.py``).

Shapes here are per sample (no batch dimension): (C, S...) for tensors with spatial axes (a sequence (C, W), an
image (C, H, W), a volume (C, D, H, W)), (F,) for features, () for the loss. FLOPs count a multiply-add as two:
conv ``2*K*(C/groups)*prod(k)*prod(O)`` (+ ``K*prod(O)`` for the bias), a transposed convolution
``2*K*C*prod(k)*prod(S)`` over its input's positions S, linear ``2*F_in*F_out`` (+ ``F_out``), pooling one per
window element, upsampling one per output element (nearest) or three per axis (linear), batchnorm 4, group
and instance normalisation 8 and the other element-wise ops one per output element, softmax cross-entropy 4 per
logit and the mean squared error 3 per output; flatten and concat move data and count zero.

The tables here are keyed by the op table's ``family`` (``conv`` for conv1d, conv2d and conv3d): an op over
spatial axes is specified once for every spatial rank, and its row's ``spatial`` says which rank it takes.
"""

from math import prod

from ..ops.conv_transpose import transposed_extents
from ..ops.window import ntuple, output_extents, padded_extents
from .opkeys import LayerError, describe_shape, positive_int
from .optable import ANSWERS_LABELS, OPS, SPATIAL_NAMES, window

def _spatial(shape, op, where):
    """``shape`` checked to be what ``op`` takes: the spatial rank of its row, or any tensor with spatial axes."""
    rank = OPS[op].spatial
    if rank is not None and len(shape) != rank + 1:
        hint = ""
        if len(shape) - 1 in SPATIAL_NAMES:
            hint = f": use {OPS[op].family}{len(shape) - 1}d"
        raise LayerError(f"{where}: op '{op}' needs {SPATIAL_NAMES[rank]} input, got {describe_shape(shape)}{hint}")
    if rank is None and len(shape) - 1 not in SPATIAL_NAMES:
        raise LayerError(f"{where}: op '{op}' needs an input with 1 to 3 spatial axes ((C, W), (C, H, W) or "
                         f"(C, D, H, W)), got {describe_shape(shape)}")
    return shape


def _window_out(shape, attrs, where, what):
    geometry = window(attrs, len(shape) - 1)
    if what == "pooling" and any(2 * before > k or 2 * after > k
                                 for (before, after), k in zip(geometry.padding, geometry.kernel)):
        raise LayerError(f"{where}: padding {attrs['padding']} must be at most half the kernel {attrs['kernel']} "
                         "(as in PyTorch)")
    geometry = window(attrs, len(shape) - 1, shape[1:])        # ceil mode's extra padding after
    out = output_extents(shape[1:], geometry.kernel, geometry.stride, geometry.padding, geometry.dilation)
    if min(out) <= 0:
        raise LayerError(f"{where}: {what} of kernel {attrs['kernel']} over input {'x'.join(map(str, shape[1:]))} "
                         f"gives an empty output {'x'.join(map(str, out))}")
    return out, geometry


def _groups(attrs, C, K, where):
    """A convolution's ``groups`` (1 where it has none), refused unless it divides both channel counts."""
    groups = attrs.get("groups", 1)
    for count, what in ((C, "input channels"), (K, "out_channels")):
        if count % groups:
            raise LayerError(f"{where}: 'groups' {groups} must divide its {count} {what} (as in PyTorch)")
    return groups


def _conv(op, attrs, in_shapes, where):
    shape = _spatial(in_shapes[0], op, where)
    K, C = attrs["out_channels"], shape[0]
    groups = _groups(attrs, C, K, where)
    out, geometry = _window_out(shape, attrs, where, "convolution")
    params = {"weight": (K, C // groups) + geometry.kernel}
    flops = 2 * K * (C // groups) * prod(geometry.kernel) * prod(out)
    if attrs["bias"]:
        params["bias"] = (K,)
        flops += K * prod(out)
    return (K,) + out, params, {}, flops


def _conv_transpose(op, attrs, in_shapes, where):
    shape = _spatial(in_shapes[0], op, where)
    K, C = attrs["out_channels"], shape[0]
    rank = len(shape) - 1
    geometry = window(attrs, rank)
    extra = ntuple(attrs["output_padding"], rank)
    out = transposed_extents(shape[1:], geometry.kernel, geometry.stride, geometry.padding, extra,
                             geometry.dilation)
    if min(out) <= 0:
        raise LayerError(f"{where}: transposed convolution of kernel {attrs['kernel']} with padding "
                         f"{attrs['padding']} over input {'x'.join(map(str, shape[1:]))} gives an empty output "
                         f"{'x'.join(map(str, out))}")
    groups = _groups(attrs, C, K, where)
    params = {"weight": (C, K // groups) + geometry.kernel}     # PyTorch's layout: (C_in, C_out / groups, k...)
    flops = 2 * (K // groups) * C * prod(geometry.kernel) * prod(shape[1:])
    if attrs["bias"]:
        params["bias"] = (K,)
        flops += K * prod(out)
    return (K,) + out, params, {}, flops


def _pool(op, attrs, in_shapes, where):
    shape = _spatial(in_shapes[0], op, where)
    out, geometry = _window_out(shape, attrs, where, "pooling")
    return (shape[0],) + out, {}, {}, shape[0] * prod(out) * prod(geometry.kernel)


def _adaptive(op, attrs, in_shapes, where):
    shape = _spatial(in_shapes[0], op, where)
    out = ntuple(attrs["output_size"], len(shape) - 1, "output_size")
    return (shape[0],) + out, {}, {}, prod(shape)


def _global_avgpool(op, attrs, in_shapes, where):
    shape = _spatial(in_shapes[0], op, where)
    return (shape[0],) + (1,) * (len(shape) - 1), {}, {}, prod(shape)


def _upsample(op, attrs, in_shapes, where):
    shape = _spatial(in_shapes[0], op, where)
    scale = ntuple(attrs["scale"], len(shape) - 1, "scale")
    out = (shape[0],) + tuple(size * s for size, s in zip(shape[1:], scale))
    per_element = 1 if attrs["mode"] == "nearest" else 3 * len(scale)
    return out, {}, {}, per_element * prod(out)


def _batchnorm(op, attrs, in_shapes, where):
    """Over (C, S...) of its rank; ``batchnorm1d`` also over features (F,) (PyTorch's ``BatchNorm1d`` of (N, F))."""
    shape = in_shapes[0]
    if not (OPS[op].spatial == 1 and len(shape) == 1):
        shape = _spatial(shape, op, where)
    C = shape[0]
    return shape, {"weight": (C,), "bias": (C,)}, {"running_mean": (C,), "running_var": (C,)}, 4 * prod(shape)


def _groupnorm(op, attrs, in_shapes, where):
    shape = _spatial(in_shapes[0], op, where)
    C = shape[0]
    if C % attrs.get("groups", C):
        raise LayerError(f"{where}: 'groups' {attrs['groups']} must divide the {C} channels of its input")
    params = {"weight": (C,), "bias": (C,)} if attrs["affine"] else {}
    return shape, params, {}, 8 * prod(shape)


def _elementwise(op, attrs, in_shapes, where):
    return in_shapes[0], {}, {}, prod(in_shapes[0])


def _layernorm(op, attrs, in_shapes, where):
    """Over the channels (or features) at each position: ``weight`` and ``bias`` of (C,) when affine."""
    shape = in_shapes[0]
    if not len(shape):
        raise LayerError(f"{where}: layernorm needs channels or features, got a scalar")
    params = {"weight": (shape[0],), "bias": (shape[0],)} if attrs["affine"] else {}
    if not attrs["bias"]:
        params.pop("bias", None)
    if attrs["correction"] not in (0, 1) or isinstance(attrs["correction"], bool):
        raise LayerError(f"{where}: 'correction' must be 0 (the variance over C) or 1 (over C - 1), got "
                         f"{attrs['correction']!r}")
    return shape, params, {}, 8 * prod(shape)


def _layer_scale(op, attrs, in_shapes, where):
    """A factor per channel (or feature), ``weight`` of (C,), or one shared by every channel (of (1,)); a bias
    likewise (``bias``)."""
    shape = in_shapes[0]
    if not len(shape):
        raise LayerError(f"{where}: {op} needs channels or features, got a scalar")
    name = "bias" if op == "bias" else "weight"
    return shape, {name: (1,) if attrs["shared"] else (shape[0],)}, {}, prod(shape)


def _prelu(op, attrs, in_shapes, where):
    """Slopes: ``weight`` of (1,), one shared by every channel, or of (C,), one per channel (or feature)."""
    shape = in_shapes[0]
    if not len(shape):
        raise LayerError(f"{where}: prelu needs channels or features, got a scalar")
    return shape, {"weight": (1,) if attrs["shared"] else (shape[0],)}, {}, 2 * prod(shape)


def _flatten(op, attrs, in_shapes, where):
    if len(in_shapes[0]) < 1:
        raise LayerError(f"{where}: flatten needs a tensor input, got a scalar")
    return (prod(in_shapes[0]),), {}, {}, 0


def _slice(op, attrs, in_shapes, where):
    """Channels (or features) ``[start, stop)`` of its input."""
    shape = in_shapes[0]
    start, stop = attrs["start"], attrs["stop"]
    if not len(shape) or not 0 <= start < stop <= shape[0]:
        count = shape[0] if len(shape) else 0
        raise LayerError(f"{where}: slice [{start}, {stop}) must hold at least one of the {count} channels of its "
                         "input (0 <= start < stop <= channels)")
    return (stop - start,) + tuple(shape[1:]), {}, {}, 0


def _channel_shuffle(op, attrs, in_shapes, where):
    """Groups of the channels (a shuffle's, a softmax across groups'): the input's shape."""
    shape = _spatial(in_shapes[0], op, where)
    if shape[0] % attrs["groups"]:
        raise LayerError(f"{where}: 'groups' {attrs['groups']} must divide the {shape[0]} channels of its input")
    return shape, {}, {}, 0


def _space_to_depth(op, attrs, in_shapes, where):
    shape = _spatial(in_shapes[0], op, where)
    block = positive_int(attrs["size"], "size", where)
    if any(size % block for size in shape[1:]):
        raise LayerError(f"{where}: 'size' {block} must divide every spatial extent of its input "
                         f"{'x'.join(map(str, shape[1:]))}")
    return (shape[0] * block ** (len(shape) - 1),) + tuple(size // block for size in shape[1:]), {}, {}, 0


def _pad(op, attrs, in_shapes, where):
    """The spatial extents grown by the padding before and after along each axis (shrunk where negative)."""
    shape = _spatial(in_shapes[0], op, where)
    geometry = window(attrs, len(shape) - 1)
    out = padded_extents(shape[1:], geometry.padding)
    if min(out) <= 0:
        raise LayerError(f"{where}: padding {attrs['padding']} crops all of input {'x'.join(map(str, shape[1:]))}")
    return (shape[0],) + out, {}, {}, 0


def _linear(op, attrs, in_shapes, where):
    x = in_shapes[0]
    if len(x) != 1:
        raise LayerError(f"{where}: linear needs a flat input (F,), got shape {tuple(x)}; add a flatten layer "
                         "before it")
    F = attrs["out_features"]
    params = {"weight": (F, x[0])}
    flops = 2 * F * x[0]
    if attrs["bias"]:
        params["bias"] = (F,)
        flops += F
    return (F,), params, {}, flops


def _concat(op, attrs, in_shapes, where):
    for shape in in_shapes:
        _spatial(shape, op, where)
    if len({shape[1:] for shape in in_shapes}) != 1:
        raise LayerError(f"{where}: concat inputs must agree in every spatial extent, got "
                         f"{', '.join(str(tuple(s)) for s in in_shapes)}")
    return (sum(s[0] for s in in_shapes),) + tuple(in_shapes[0][1:]), {}, {}, 0


def _mul(op, attrs, in_shapes, where):
    """Two inputs of one rank whose extents agree or are 1 in one of them: the output takes the longer."""
    if len(in_shapes) != 2 or len(in_shapes[0]) != len(in_shapes[1]) or any(
            a != b and 1 not in (a, b) for a, b in zip(*in_shapes)):
        raise LayerError(f"{where}: mul takes two inputs of one rank whose extents agree or are 1 in one of them "
                         f"(a gate (C, 1, 1) over (C, H, W)), got {', '.join(str(tuple(s)) for s in in_shapes)}")
    shape = tuple(max(a, b) for a, b in zip(*in_shapes))
    return shape, {}, {}, prod(shape)


def _add(op, attrs, in_shapes, where):
    if len(set(in_shapes)) != 1:
        raise LayerError(f"{where}: add inputs must have the same shape, got "
                         f"{', '.join(str(tuple(s)) for s in in_shapes)}")
    return in_shapes[0], {}, {}, (len(in_shapes) - 1) * prod(in_shapes[0])


def _loss(op, attrs, in_shapes, where):
    """A loss of labels (cross-entropy, Dice) takes logits per sample (K,), giving one loss per sample (shape
    ()), or per position (K, S...), giving one per position (1, S...); mse_loss takes predictions per sample
    (F,)."""
    shape = in_shapes[0]
    labels = OPS[op].answers == ANSWERS_LABELS
    flops = (4 + 6 * bool(OPS[op].class_sums)) if labels else 3
    if attrs.get("include_background") is False and shape[0] < 2:
        raise LayerError(f"{where}: include_background false leaves no class of the {shape[0]} to score")
    if labels and len(shape) - 1 in SPATIAL_NAMES:
        return (1,) + tuple(shape[1:]), {}, {}, flops * prod(shape)
    if len(shape) != 1:
        what = "logits (K,) per sample or (K, S...) per position" if labels else "predictions (F,)"
        raise LayerError(f"{where}: {op} needs {what}, got shape {tuple(shape)}; add a flatten and a linear layer "
                         "before it")
    return (), {}, {}, flops * shape[0]


INFER = {"conv": _conv, "conv_transpose": _conv_transpose, "maxpool": _pool, "avgpool": _pool,
         "adaptive_avgpool": _adaptive, "global_avgpool": _global_avgpool, "upsample": _upsample,
         "batchnorm": _batchnorm, "groupnorm": _groupnorm, "instancenorm": _groupnorm, "layernorm": _layernorm,
         "relu": _elementwise, "leaky_relu": _elementwise, "tanh": _elementwise, "sigmoid": _elementwise,
         "silu": _elementwise, "gelu": _elementwise, "hardswish": _elementwise, "hardsigmoid": _elementwise,
         "relu6": _elementwise, "hardtanh": _elementwise, "clamp": _elementwise, "elu": _elementwise, "mish": _elementwise,
         "scale": _elementwise, "dropout": _elementwise, "stochastic_depth": _elementwise,
         "layer_scale": _layer_scale, "bias": _layer_scale, "prelu": _prelu, "flatten": _flatten, "slice": _slice,
         "channel_shuffle": _channel_shuffle, "group_softmax": _channel_shuffle, "pad": _pad,
         "space_to_depth": _space_to_depth, "linear": _linear, "concat": _concat, "add": _add, "mul": _mul,
         "softmax_cross_entropy": _loss, "dice_loss": _loss, "mse_loss": _loss}


def infer(op, attrs, in_shapes, where):
    """``(out_shape, params, buffers, flops)`` of one layer; params and buffers map name -> shape."""
    if op not in OPS:
        raise LayerError(f"{where}: unknown op '{op}'")
    if OPS[op].multi_input:
        if len(in_shapes) < 2:
            raise LayerError(f"{where}: op '{op}' needs at least two inputs, got {len(in_shapes)}")
    elif len(in_shapes) != 1:
        raise LayerError(f"{where}: op '{op}' takes one input, got {len(in_shapes)}")
    return INFER[OPS[op].family](op, attrs, [tuple(shape) for shape in in_shapes], where)
