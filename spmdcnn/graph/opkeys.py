"""What each op accepts: its keys and their defaults (``KEYS``, by the op table's ``family``), the checks of their
values (:func:`normalise`), and the ops written as others (``ALIASES``: ``adaptive_avgpool<rank>d`` to a size that
divides the input's is average pooling). The shape each op gives is ``graph/opspec.py``'s.
"""

from ..io.samples import axis_names
from ..io.yamlfile import FormatError
from ..ops.conv_transpose import output_padding_error
from ..ops.upsample import MODES as UPSAMPLE_MODES
from ..ops.window import ntuple
from .optable import OPS, SPATIAL_NAMES, window

_NO_DEFAULT = object()
_WINDOW = {"kernel": _NO_DEFAULT, "stride": None, "padding": 0}

# family -> {key: default}; a key whose default is _NO_DEFAULT is required.
KEYS = {
    "conv": {"out_channels": _NO_DEFAULT, "kernel": _NO_DEFAULT, "stride": 1, "padding": 0, "dilation": 1,
             "groups": 1, "bias": True},
    "conv_transpose": {"out_channels": _NO_DEFAULT, "kernel": _NO_DEFAULT, "stride": 1, "padding": 0,
                       "output_padding": 0, "dilation": 1, "groups": 1, "bias": True},
    "maxpool": {**_WINDOW, "ceil_mode": False},
    "avgpool": {**_WINDOW, "ceil_mode": False, "count_include_pad": True},
    "adaptive_avgpool": {"output_size": _NO_DEFAULT},
    "global_avgpool": {},
    "upsample": {"scale": _NO_DEFAULT, "mode": "nearest", "align_corners": False},
    "relu": {},
    "leaky_relu": {"negative_slope": 0.01},
    "tanh": {},
    "sigmoid": {},
    "silu": {},
    "gelu": {"approximate": "none"},
    "hardswish": {},
    "hardsigmoid": {},
    "relu6": {},
    "hardtanh": {"min_val": -1.0, "max_val": 1.0},
    "clamp": {"min": None, "max": None},
    "elu": {"alpha": 1.0, "gain": 1.0, "input_scale": 1.0},
    "mish": {},
    "scale": {"factor": _NO_DEFAULT, "shift": 0.0},
    "batchnorm": {"eps": 1e-5, "momentum": 0.1},
    "groupnorm": {"groups": _NO_DEFAULT, "eps": 1e-5, "affine": True},
    "instancenorm": {"eps": 1e-5, "affine": False},
    "layernorm": {"eps": 1e-5, "affine": True, "bias": True, "center": True, "correction": 0},
    "dropout": {"p": 0.5},
    "stochastic_depth": {"p": _NO_DEFAULT},
    "layer_scale": {"init": 1e-6, "shared": False},
    "bias": {"shared": False},
    "prelu": {"init": 0.25, "shared": True},
    "flatten": {},
    "slice": {"start": _NO_DEFAULT, "stop": _NO_DEFAULT},
    "channel_shuffle": {"groups": _NO_DEFAULT},
    "group_softmax": {"groups": _NO_DEFAULT},
    "space_to_depth": {"size": _NO_DEFAULT, "order": "channels"},
    "pad": {"padding": _NO_DEFAULT, "value": 0.0},
    "linear": {"out_features": _NO_DEFAULT, "bias": True},
    "concat": {},
    "add": {},
    "mul": {},
    "softmax_cross_entropy": {"ignore_index": -1},
    "dice_loss": {"dice": 1.0, "cross_entropy": 0.0, "include_background": True, "smooth": 1e-5, "batch": False,
                  "ignore_index": -1},
    "mse_loss": {},
}


class LayerError(FormatError):
    pass


def _adaptive_avgpool(rank):
    """``adaptive_avgpool<rank>d {output_size}``: PyTorch's ``AdaptiveAvgPool``; where the output size divides the
    input's, average pooling of kernel and stride input / output (the same windows, the same sums, and every split
    a window op takes), else the op ``adaptive_avgpool<rank>d`` itself (windows of uneven sizes that may overlap:
    split over samples and channels only)."""
    def rewrite(given, in_shapes, where):
        unknown = sorted(set(given) - {"output_size"})
        if unknown or "output_size" not in given:
            raise LayerError(f"{where}: adaptive_avgpool{rank}d takes one key, 'output_size' (an int or one per "
                             f"axis), got {', '.join(map(repr, unknown)) or 'none'}")
        shape = in_shapes[0]
        if len(shape) != rank + 1:
            hint = f": use adaptive_avgpool{len(shape) - 1}d" if len(shape) - 1 in SPATIAL_NAMES else ""
            raise LayerError(f"{where}: op 'adaptive_avgpool{rank}d' needs {SPATIAL_NAMES[rank]} input, got "
                             f"{describe_shape(shape)}{hint}")
        out = _per_axis(given["output_size"], "output_size", where, rank)
        out = ntuple(out, rank, "output_size")
        if any(size % o for size, o in zip(shape[1:], out)):      # PyTorch's uneven windows: the op itself
            return f"adaptive_avgpool{rank}d", {"output_size": list(out)}
        kernel = [size // o for size, o in zip(shape[1:], out)]
        return f"avgpool{rank}d", {"kernel": kernel, "stride": kernel}
    return rewrite


ALIASES = {f"adaptive_avgpool{rank}d": _adaptive_avgpool(rank) for rank in (1, 2, 3)}


def unaliased(op, given, in_shapes, where):
    """``(op, keys)`` of a layer, an alias (``ALIASES``) written as the op it is."""
    if isinstance(op, str) and op in ALIASES:
        return ALIASES[op](given, in_shapes, where)
    return op, given


def keys_of(op):
    """``{key: default}`` of ``op`` (its family's)."""
    return KEYS[OPS[op].family]


def _int(value, key, where):
    if isinstance(value, bool) or not isinstance(value, int):
        raise LayerError(f"{where}: '{key}' must be an integer, got {value!r}")
    return value


def positive_int(value, key, where, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        kind = "a non-negative" if allow_zero else "a positive"
        raise LayerError(f"{where}: '{key}' must be {kind} integer, got {value!r}")
    return value


def _axes_words(rank):
    return f"[{', '.join(axis_names(rank))}]"


def _per_axis(value, key, where, rank, allow_zero=False):
    """An int, or one int per spatial axis."""
    if isinstance(value, (list, tuple)):
        if len(value) != rank:
            raise LayerError(f"{where}: '{key}' must be an int or {_axes_words(rank)} ({rank} value"
                             f"{'s' * (rank != 1)}, one per spatial axis), got {value!r}")
        return [positive_int(v, key, where, allow_zero) for v in value]
    return positive_int(value, key, where, allow_zero)


def _padding(value, where, rank, same, crops=False):
    """An int, one int per axis, one ``[before, after]`` pair per axis, or (convolutions) ``same``; ``crops``: a
    side may be negative (a pad's, cropping it)."""
    if value == "same" and same:
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (list, tuple)) for v in value):
        if len(value) != rank or any(len(v) != 2 for v in value):
            raise LayerError(f"{where}: 'padding' per side must be {rank} [before, after] pair"
                             f"{'s' * (rank != 1)} (one per spatial axis), got {value!r}")
        if crops:
            return [[_int(v, "padding", where) for v in pair] for pair in value]
        return [[positive_int(v, "padding", where, True) for v in pair] for pair in value]
    if isinstance(value, str):
        allowed = "'same', " if same else ""
        raise LayerError(f"{where}: 'padding' must be {allowed}an int, one per spatial axis or [before, after] "
                         f"pairs, got {value!r}")
    return _per_axis(value, "padding", where, rank, allow_zero=True)


def normalise(op, given, where, rank=2):
    """The layer's attributes with defaults filled in and types checked; ``rank``: the spatial rank of its input
    (how many values ``kernel``, ``stride``, ``padding`` and ``dilation`` may list)."""
    spec = keys_of(op)
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
    for key in ("out_channels", "out_features", "groups"):
        if key in attrs:
            positive_int(attrs[key], key, where)
    if "order" in attrs and attrs["order"] not in ("channels", "blocks"):
        raise LayerError(f"{where}: 'order' must be channels (PyTorch's PixelUnshuffle: each channel's block "
                         f"positions together) or blocks (TResNet's: each block position's channels together), "
                         f"got {attrs['order']!r}")
    rank = max(rank, 1)
    for key in ("kernel", "dilation"):
        if key in attrs:
            attrs[key] = _per_axis(attrs[key], key, where, rank)
    if attrs.get("stride") is not None:
        attrs["stride"] = _per_axis(attrs["stride"], "stride", where, rank)
    if "output_padding" in attrs:
        attrs["output_padding"] = _per_axis(attrs["output_padding"], "output_padding", where, rank, allow_zero=True)
        geometry = window(attrs, rank)
        error = output_padding_error(ntuple(attrs["output_padding"], rank), geometry.stride, geometry.dilation)
        if error:
            raise LayerError(f"{where}: {error} (as in PyTorch)")
    if "padding" in attrs:
        attrs["padding"] = _padding(attrs["padding"], where, rank, same=OPS[op].family == "conv",
                                    crops=OPS[op].family == "pad")
        if attrs["padding"] == "same" and any(s != 1 for s in window(attrs, rank).stride):
            raise LayerError(f"{where}: padding 'same' needs stride 1 (as in PyTorch), got stride {attrs['stride']}")
    for key in ("bias", "align_corners", "affine", "include_background", "batch", "ceil_mode", "count_include_pad",
                "shared", "center"):
        if key in attrs and not isinstance(attrs[key], bool):
            raise LayerError(f"{where}: '{key}' must be true or false, got {attrs[key]!r}")
    if "scale" in attrs and OPS[op].family == "upsample":
        attrs["scale"] = _per_axis(attrs["scale"], "scale", where, rank)
        if attrs["mode"] not in UPSAMPLE_MODES:
            raise LayerError(f"{where}: 'mode' must be one of {', '.join(UPSAMPLE_MODES)} (linear is bilinear on "
                             f"images and trilinear on volumes), got {attrs['mode']!r}")
        if attrs["align_corners"] and attrs["mode"] == "nearest":
            raise LayerError(f"{where}: 'align_corners' applies to mode linear only (as in PyTorch)")
    if "approximate" in attrs and attrs["approximate"] not in ("none", "tanh"):
        raise LayerError(f"{where}: 'approximate' must be none or tanh (as in PyTorch), got {attrs['approximate']!r}")
    if "ignore_index" in attrs and (isinstance(attrs["ignore_index"], bool)
                                    or not isinstance(attrs["ignore_index"], int)):
        raise LayerError(f"{where}: 'ignore_index' must be an integer (a label that counts for nothing), got "
                         f"{attrs['ignore_index']!r}")
    for key in ("start", "stop"):
        if key in attrs:
            positive_int(attrs[key], key, where, allow_zero=True)
    _numbers(op, attrs, where)
    if op in ("dropout", "stochastic_depth") and not 0.0 <= attrs["p"] <= 1.0:
        raise LayerError(f"{where}: {op} 'p' must lie in [0, 1], got {attrs['p']}")
    if "eps" in attrs and not 0 < attrs["eps"] < float("inf"):
        raise LayerError(f"{where}: 'eps' must be a positive number, got {attrs['eps']}")
    if OPS[op].family == "batchnorm" and not 0.0 <= attrs["momentum"] <= 1.0:
        raise LayerError(f"{where}: 'momentum' must lie in [0, 1], got {attrs['momentum']}")
    if OPS[op].family == "dice_loss":
        _dice_weights(attrs, where)
    return attrs


def _numbers(op, attrs, where):
    """The attributes that are real numbers, as floats: finite (a pad's value may be infinite), a clamp's bounds
    finite or null, an interval's ends in order."""
    for key in ("eps", "momentum", "p", "negative_slope", "factor", "dice", "cross_entropy", "smooth", "init",
                "value", "alpha", "gain", "input_scale", "min_val", "max_val", "shift", "min", "max"):
        value = attrs.get(key)
        if value is None and key in ("min", "max"):     # a clamp's bound: None is unbounded that side
            continue
        if key in attrs:
            infinite = key == "value"       # a pad's may be -inf or inf (before a max pooling: timm's 'same')
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
                    or (abs(value) == float("inf") and not infinite):
                unbounded = " or null (unbounded)" if key in ("min", "max") else ""
                raise LayerError(f"{where}: '{key}' must be a {'' if infinite else 'finite '}number{unbounded}, "
                                 f"got {value!r}")
            attrs[key] = float(value)
    if op == "clamp" and None not in (attrs["min"], attrs["max"]) and attrs["min"] > attrs["max"]:
        raise LayerError(f"{where}: 'min' {attrs['min']} must not exceed 'max' {attrs['max']}")
    if attrs.get("min_val", -1.0) >= attrs.get("max_val", 1.0):
        raise LayerError(f"{where}: 'min_val' {attrs['min_val']} must be below 'max_val' {attrs['max_val']}")


def _dice_weights(attrs, where):
    """The Dice loss's weights are not negative, not both 0, and its smoothing is not negative."""
    for key in ("dice", "cross_entropy", "smooth"):
        if attrs[key] < 0:
            raise LayerError(f"{where}: '{key}' must not be negative, got {attrs[key]}")
    if not attrs["dice"] and not attrs["cross_entropy"]:
        raise LayerError(f"{where}: 'dice' and 'cross_entropy' (the weights of the two terms) are both 0")
    return attrs


def describe_shape(shape):
    """How people call a per-sample shape: ``a volume (C, D, H, W) (4, 16, 16, 16)``."""
    spatial = len(shape) - 1
    kind = SPATIAL_NAMES[spatial] if spatial in SPATIAL_NAMES else ("features (F,)" if len(shape) == 1 else
                                                                    "a tensor")
    return f"{kind} {tuple(shape)}"
