"""What each op accepts, the shape it produces, its parameters and its forward FLOPs.

Shapes here are per sample (no batch dimension): (C, H, W) for images, (F,) for features, () for the loss.
FLOPs count a multiply-add as two: conv ``2*K*C*kH*kW*oH*oW`` (+ ``K*oH*oW`` for the bias), linear
``2*F_in*F_out`` (+ ``F_out``), pooling one per window element, batchnorm 4 and the other element-wise ops
one per output element, the loss 4 per logit; flatten and concat move data and count zero.
"""

from ..io.yamlfile import FormatError
from ..ops.window import output_extent, pair, sides
from .optable import OPS, window

_NO_DEFAULT = object()

# op -> {key: default}; a key whose default is _NO_DEFAULT is required.
KEYS = {
    "conv2d": {"out_channels": _NO_DEFAULT, "kernel": _NO_DEFAULT, "stride": 1, "padding": 0, "dilation": 1,
               "bias": True},
    "maxpool2d": {"kernel": _NO_DEFAULT, "stride": None, "padding": 0},
    "avgpool2d": {"kernel": _NO_DEFAULT, "stride": None, "padding": 0},
    "global_avgpool": {},
    "relu": {},
    "batchnorm2d": {"eps": 1e-5, "momentum": 0.1},
    "dropout": {"p": 0.5},
    "flatten": {},
    "linear": {"out_features": _NO_DEFAULT, "bias": True},
    "concat": {},
    "add": {},
    "softmax_cross_entropy": {},
}


class LayerError(FormatError):
    pass


def _positive_int(value, key, where, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        kind = "a non-negative" if allow_zero else "a positive"
        raise LayerError(f"{where}: '{key}' must be {kind} integer, got {value!r}")
    return value


def _int_pair(value, key, where, allow_zero=False):
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise LayerError(f"{where}: '{key}' must be an int or [h, w], got {value!r}")
        for v in value:
            _positive_int(v, key, where, allow_zero)
        return [int(value[0]), int(value[1])]
    return _positive_int(value, key, where, allow_zero)


def normalise(op, given, where):
    """The layer's attributes with defaults filled in and types checked."""
    spec = KEYS[op]
    unknown = sorted(set(given) - set(spec))
    if unknown:
        allowed = ", ".join(sorted(set(spec) | {"name", "op", "inputs"}))
        raise LayerError(f"{where}: unknown key {', '.join(map(repr, unknown))} for op '{op}'; allowed: {allowed}")
    attrs = {}
    for key, default in spec.items():
        if key in given:
            attrs[key] = given[key]
        elif default is _NO_DEFAULT:
            raise LayerError(f"{where}: op '{op}' needs the key '{key}'")
        else:
            attrs[key] = default
    for key in ("out_channels", "out_features"):
        if key in attrs:
            _positive_int(attrs[key], key, where)
    for key in ("kernel", "dilation"):
        if key in attrs:
            attrs[key] = _int_pair(attrs[key], key, where)
    if attrs.get("stride") is not None:
        attrs["stride"] = _int_pair(attrs["stride"], "stride", where)
    if "padding" in attrs:
        attrs["padding"] = _int_pair(attrs["padding"], "padding", where, allow_zero=True)
    for key in ("bias",):
        if key in attrs and not isinstance(attrs[key], bool):
            raise LayerError(f"{where}: '{key}' must be true or false, got {attrs[key]!r}")
    for key in ("eps", "momentum", "p"):
        if key in attrs:
            value = attrs[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise LayerError(f"{where}: '{key}' must be a number, got {value!r}")
            attrs[key] = float(value)
    if op == "dropout" and not 0.0 <= attrs["p"] <= 1.0:
        raise LayerError(f"{where}: dropout 'p' must lie in [0, 1], got {attrs['p']}")
    if op == "batchnorm2d" and not 0 < attrs["eps"] < float("inf"):
        raise LayerError(f"{where}: 'eps' must be a positive number, got {attrs['eps']}")
    if op == "batchnorm2d" and not 0.0 <= attrs["momentum"] <= 1.0:
        raise LayerError(f"{where}: 'momentum' must lie in [0, 1], got {attrs['momentum']}")
    return attrs


def _image(shape, op, where):
    if len(shape) != 3:
        raise LayerError(f"{where}: op '{op}' needs an image input (C, H, W), got shape {tuple(shape)}")
    return shape


def _window_out(H, W, kernel, stride, padding, dilation, where, what):
    (kH, kW), (sh, sw), (dh, dw) = pair(kernel), pair(stride), pair(dilation)
    (top, bottom), (left, right) = sides(padding)
    if what == "pooling" and (2 * top > kH or 2 * left > kW):
        raise LayerError(f"{where}: padding {padding} must be at most half the kernel {kernel} (as in PyTorch)")
    oH = output_extent(H, kH, sh, top, bottom, dh)
    oW = output_extent(W, kW, sw, left, right, dw)
    if oH <= 0 or oW <= 0:
        raise LayerError(f"{where}: {what} of kernel {kernel} over input {H}x{W} gives an empty output "
                         f"{oH}x{oW}")
    return oH, oW


def _conv2d(attrs, in_shapes, where):
    C, H, W = _image(in_shapes[0], "conv2d", where)
    K = attrs["out_channels"]
    kH, kW = pair(attrs["kernel"])
    oH, oW = _window_out(H, W, attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"], where,
                         "convolution")
    params = {"weight": (K, C, kH, kW)}
    flops = 2 * K * C * kH * kW * oH * oW
    if attrs["bias"]:
        params["bias"] = (K,)
        flops += K * oH * oW
    return (K, oH, oW), params, {}, flops


def _pool(attrs, in_shapes, where, op):
    C, H, W = _image(in_shapes[0], op, where)
    oH, oW = _window_out(H, W, attrs["kernel"], window(attrs).stride, attrs["padding"], 1, where, "pooling")
    kH, kW = pair(attrs["kernel"])
    return (C, oH, oW), {}, {}, C * oH * oW * kH * kW


def _global_avgpool(attrs, in_shapes, where):
    C, H, W = _image(in_shapes[0], "global_avgpool", where)
    return (C, 1, 1), {}, {}, C * H * W


def _batchnorm2d(attrs, in_shapes, where):
    C, H, W = _image(in_shapes[0], "batchnorm2d", where)
    return in_shapes[0], {"weight": (C,), "bias": (C,)}, {"running_mean": (C,), "running_var": (C,)}, 4 * C * H * W


def _elementwise(attrs, in_shapes, where):
    return in_shapes[0], {}, {}, _size(in_shapes[0])


def _flatten(attrs, in_shapes, where):
    if len(in_shapes[0]) < 1:
        raise LayerError(f"{where}: flatten needs a tensor input, got a scalar")
    return (_size(in_shapes[0]),), {}, {}, 0


def _linear(attrs, in_shapes, where):
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


def _concat(attrs, in_shapes, where):
    for shape in in_shapes:
        _image(shape, "concat", where)
    if len({shape[1:] for shape in in_shapes}) != 1:
        raise LayerError(f"{where}: concat inputs must agree in height and width, got "
                         f"{', '.join(str(tuple(s)) for s in in_shapes)}")
    return (sum(s[0] for s in in_shapes),) + tuple(in_shapes[0][1:]), {}, {}, 0


def _add(attrs, in_shapes, where):
    if len(set(in_shapes)) != 1:
        raise LayerError(f"{where}: add inputs must have the same shape, got "
                         f"{', '.join(str(tuple(s)) for s in in_shapes)}")
    return in_shapes[0], {}, {}, (len(in_shapes) - 1) * _size(in_shapes[0])


def _loss(attrs, in_shapes, where):
    if len(in_shapes[0]) != 1:
        raise LayerError(f"{where}: softmax_cross_entropy needs logits (F,), got shape {tuple(in_shapes[0])}")
    return (), {}, {}, 4 * in_shapes[0][0]


INFER = {"conv2d": _conv2d, "maxpool2d": lambda *args: _pool(*args, "maxpool2d"),
         "avgpool2d": lambda *args: _pool(*args, "avgpool2d"), "global_avgpool": _global_avgpool,
         "batchnorm2d": _batchnorm2d, "relu": _elementwise, "dropout": _elementwise, "flatten": _flatten,
         "linear": _linear, "concat": _concat, "add": _add, "softmax_cross_entropy": _loss}


def infer(op, attrs, in_shapes, where):
    """``(out_shape, params, buffers, flops)`` of one layer; params and buffers map name -> shape."""
    if op not in INFER:
        raise LayerError(f"{where}: unknown op '{op}'")
    if OPS[op].multi_input:
        if len(in_shapes) < 2:
            raise LayerError(f"{where}: op '{op}' needs at least two inputs, got {len(in_shapes)}")
    elif len(in_shapes) != 1:
        raise LayerError(f"{where}: op '{op}' takes one input, got {len(in_shapes)}")
    return INFER[op](attrs, [tuple(shape) for shape in in_shapes], where)


def _size(shape):
    size = 1
    for extent in shape:
        size *= extent
    return size
