"""The op table: every fact about an op that more than one part of spmdcnn reads, one row per op.

The runtime reads how a kernel may reuse memory and which parameter gradients leave the layer already summed;
tiling reads which output dimensions a configuration may split and what an output tile reads of its inputs; the
planner reads which layers take their input's configuration; the cost and memory models read what a tile keeps
for backward, which attributes its kernel uses and which layers sum inside themselves; initialisation and PyTorch
state dicts read which layers normalise. Adding an op means a module in ``ops/``, its kernel binding in
``runtime/kernels.py`` and one row here (``tests/graph/test_optable.py`` checks that every part covers every row).

Ops over spatial axes are written once for every spatial rank: ``conv1d``, ``conv2d`` and ``conv3d`` are rows of
one ``family`` (``conv``), which the other tables (keys, shape inference, kernels, work) are keyed by, and differ
only in the ``spatial`` rank of input they take (a sequence (C, W), an image (C, H, W), a volume (C, D, H, W)).

Which tensors need a gradient is a property of the graph, not of an op: :func:`needs_gradient` says it once
for the runtime, the profiler and the cost model.
"""

from dataclasses import dataclass
from typing import NamedTuple

from ..io.samples import AXES, described
from ..ops.window import ceil_extra, ntuple, sides

# what an output tile reads of its inputs (tiling/fields.py)
READS_WINDOW = "window"                 # a window over the spatial axes, the input channels of the output's groups
                                        # (all of them without groups: convolution)
READS_CHANNEL_WINDOW = "channel window"  # a window over the spatial axes, the output's channels (pooling)
READS_TRANSPOSED = "transposed window"  # the inputs whose windows reach the output's box, every input channel
READS_INTERPOLATED = "interpolated"     # the inputs the output's box interpolates between, the output's channels
READS_PLANE = "plane"                   # every position of the spatial axes, the output's channels
READS_SAMPLE = "sample"                 # every feature of the output's samples
READS_POSITIONS = "positions"           # every channel at the output's positions (a loss per sample or pixel)
READS_CHANNEL_PARTS = "channel parts"   # from each input the part of the output's channels it supplies (concat)
READS_CHANNEL_SLICE = "channel slice"   # the output's box moved along the channels by the layer's start (slice)
READS_BOX = "box"                       # the output's own box (element-wise)
READS_BROADCAST = "broadcast"           # the output's box, one element along an input's axes of size 1 (mul)

# what a kernel keeps from forward to backward (cost/memory.py)
KEEPS_INPUT = "input"                   # its input tile, in the activations' type
KEEPS_MASK = "mask"                     # one byte per output element
KEEPS_INDICES = "indices"               # the argmax of each window (one byte, or four for a window over 256)
KEEPS_OUTPUT = "output"                 # its output tile (no later layer may write over it: runtime.executor)
KEEPS_NOTHING = None

# the statistics a normalisation sums over the tiles that share them (tiling/statistics.py)
STATISTICS_GROUPS = "groups"            # per sample and group of channels, over the group's channels and positions
STATISTICS_CHANNELS = "channels"        # per sample and position, over the channels (layer norm)

# what the loss compares the network's output with (io/dataset.py: /labels or /targets)
ANSWERS_LABELS = "labels"               # an integer class per sample, or per position (a mask)
ANSWERS_TARGETS = "targets"             # K real values per sample

SPATIAL_RANKS = (1, 2, 3)
SPATIAL_NAMES = {rank: described(rank, plural=False) for rank in SPATIAL_RANKS}   # "a volume (C, D, H, W)"


@dataclass(frozen=True)
class OpSpec:
    """One op's row. ``splits`` names the output dimensions a configuration may split (None: all of them)."""

    name: str
    reads: str
    keeps: str = KEEPS_NOTHING
    splits: tuple = None        # the dimensions it may split, of those its output has (None: all of them)
    multi_input: bool = False
    inplace: bool = False       # may write its output over an input no one else reads
    view: bool = False          # may return its input's memory (flatten's reshape; dropout in eval or p = 0)
    inherits: bool = False      # a plan that leaves it out gives it its input's configuration
    reduced_in_layer: bool = False  # its parameter gradients come out summed over the replica group
    dense: bool = False         # fully connected: the "one weird trick" plan splits its features
    normalization: bool = False  # running statistics over the batch (PyTorch counts its batches)
    statistics: str = None      # statistics summed over the tiles that share them (STATISTICS_GROUPS, _CHANNELS)
    unit_init: bool = False     # weight 1 and bias 0 at first (a normalisation's affine parameters)
    loss: bool = False          # the network's loss: one value per sample (or per position of a sample)
    tile_attrs: tuple = ()      # attributes its kernel reads, besides a window's geometry (cost/tiles.py)
    group: str = None           # the family the other tables know it by (None: its own name)
    spatial: int = None         # the spatial rank of input it takes (None: any)
    answers: str = None         # a loss: what it compares the output with (ANSWERS_LABELS or ANSWERS_TARGETS)
    param_axes: tuple = ()      # (parameter, axis) where a parameter's output channels are not its first axis
    class_sums: int = 0         # a loss: numbers per sample and class its tiles add up over the batch (Dice's I, P, T)
    grouped: bool = False       # attrs 'groups' split its channels: c splits in whole groups, read their inputs

    @property
    def family(self):
        """The key of its entry in the other tables: ``conv`` for conv1d, conv2d and conv3d."""
        return self.group or self.name

    def param_axis(self, name):
        """The axis of parameter ``name`` that holds the output channels (its first, but where ``param_axes``
        says otherwise)."""
        return dict(self.param_axes).get(name, 0)

    @property
    def window(self):
        """Whether a tile reads a window over the spatial axes (halos, padding and stride)."""
        return self.reads in (READS_WINDOW, READS_CHANNEL_WINDOW, READS_TRANSPOSED)


def _ranked(family, *args, **kwargs):
    """The rows ``<family>1d``, ``<family>2d`` and ``<family>3d`` of one op written for every spatial rank."""
    return [OpSpec(f"{family}{rank}d", *args, group=family, spatial=rank, **kwargs) for rank in SPATIAL_RANKS]


OPS = {spec.name: spec for spec in (
    *_ranked("conv", READS_WINDOW, KEEPS_INPUT, grouped=True),
    # its weight is PyTorch's (C_in, C_out / groups, k...): a tile of some output channels holds those along axis 1
    # (with groups, a tile's weight would be its groups' rows of axis 0 instead: its channels are not split)
    *_ranked("conv_transpose", READS_TRANSPOSED, KEEPS_INPUT, param_axes=(("weight", 1),), grouped=True),
    *_ranked("maxpool", READS_CHANNEL_WINDOW, KEEPS_INDICES),
    *_ranked("avgpool", READS_CHANNEL_WINDOW),
    # PyTorch's windows where the output size does not divide the input's: uneven, overlapping
    *_ranked("adaptive_avgpool", READS_PLANE, splits=("n", "c"), tile_attrs=("output_size",)),
    OpSpec("global_avgpool", READS_PLANE),
    OpSpec("upsample", READS_INTERPOLATED, tile_attrs=("align_corners", "mode", "scale")),
    OpSpec("relu", READS_BOX, KEEPS_MASK, inplace=True, inherits=True),
    OpSpec("leaky_relu", READS_BOX, KEEPS_MASK, inplace=True, inherits=True, tile_attrs=("negative_slope",)),
    OpSpec("tanh", READS_BOX, KEEPS_OUTPUT, inplace=True, inherits=True),
    OpSpec("sigmoid", READS_BOX, KEEPS_OUTPUT, inplace=True, inherits=True),
    OpSpec("silu", READS_BOX, KEEPS_INPUT, inherits=True),
    OpSpec("gelu", READS_BOX, KEEPS_INPUT, inherits=True, tile_attrs=("approximate",)),
    OpSpec("hardswish", READS_BOX, KEEPS_INPUT, inherits=True),
    OpSpec("hardsigmoid", READS_BOX, KEEPS_MASK, inplace=True, inherits=True),
    OpSpec("relu6", READS_BOX, KEEPS_MASK, inplace=True, inherits=True),
    OpSpec("hardtanh", READS_BOX, KEEPS_MASK, inplace=True, inherits=True, tile_attrs=("min_val", "max_val")),
    OpSpec("clamp", READS_BOX, KEEPS_MASK, inplace=True, inherits=True, tile_attrs=("min", "max")),
    OpSpec("elu", READS_BOX, KEEPS_INPUT, inherits=True, tile_attrs=("alpha", "gain", "input_scale")),
    OpSpec("mish", READS_BOX, KEEPS_INPUT, inherits=True),
    OpSpec("scale", READS_BOX, inplace=True, inherits=True, tile_attrs=("factor", "shift")),
    *_ranked("batchnorm", READS_BOX, KEEPS_INPUT, reduced_in_layer=True, normalization=True, unit_init=True,
             tile_attrs=("eps", "momentum")),
    OpSpec("groupnorm", READS_BOX, KEEPS_INPUT, unit_init=True, statistics=STATISTICS_GROUPS, tile_attrs=("eps",)),
    OpSpec("instancenorm", READS_BOX, KEEPS_INPUT, unit_init=True, statistics=STATISTICS_GROUPS, tile_attrs=("eps",)),
    OpSpec("layernorm", READS_BOX, KEEPS_INPUT, unit_init=True, statistics=STATISTICS_CHANNELS,
           tile_attrs=("eps", "center", "correction")),
    OpSpec("dropout", READS_BOX, KEEPS_MASK, inplace=True, view=True, inherits=True, tile_attrs=("p",)),
    OpSpec("stochastic_depth", READS_BOX, KEEPS_MASK, inplace=True, view=True, inherits=True, tile_attrs=("p",)),
    OpSpec("layer_scale", READS_BOX, KEEPS_INPUT, unit_init=True, tile_attrs=("init", "shared")),
    OpSpec("bias", READS_BOX, unit_init=True, tile_attrs=("shared",)),
    # one slope (a layer scale's factor, a bias) shared by every channel (shared: true) holds no row per channel:
    # its channels are never split
    OpSpec("prelu", READS_BOX, KEEPS_INPUT, unit_init=True, tile_attrs=("init", "shared")),
    OpSpec("flatten", READS_SAMPLE, splits=("n",), view=True),
    OpSpec("slice", READS_CHANNEL_SLICE, view=True),
    # any output channels read channels of every group: its channels are never split
    OpSpec("channel_shuffle", READS_POSITIONS, splits=("n",) + AXES, tile_attrs=("groups",)),
    OpSpec("group_softmax", READS_POSITIONS, KEEPS_OUTPUT, splits=("n",) + AXES, tile_attrs=("groups",)),
    # a window of the block's size and stride reading every channel: any output channels read every input channel
    OpSpec("space_to_depth", READS_WINDOW, splits=("n",) + AXES, tile_attrs=("size", "order")),
    # a window of kernel 1 whose padding is the pad's: a tile pads where it meets the tensor's sides
    OpSpec("pad", READS_CHANNEL_WINDOW, view=True, tile_attrs=("value",)),
    OpSpec("linear", READS_SAMPLE, KEEPS_INPUT, dense=True),
    OpSpec("concat", READS_CHANNEL_PARTS, multi_input=True),
    OpSpec("add", READS_BOX, multi_input=True, inplace=True),
    OpSpec("mul", READS_BROADCAST, KEEPS_INPUT, multi_input=True),
    OpSpec("softmax_cross_entropy", READS_POSITIONS, KEEPS_INPUT, splits=("n",) + AXES, loss=True,
           answers=ANSWERS_LABELS, tile_attrs=("ignore_index",)),
    OpSpec("dice_loss", READS_POSITIONS, KEEPS_INPUT, splits=("n",) + AXES, loss=True, answers=ANSWERS_LABELS,
           class_sums=3, tile_attrs=("ignore_index", "dice", "cross_entropy", "include_background", "smooth",
                                     "batch")),
    OpSpec("mse_loss", READS_SAMPLE, KEEPS_INPUT, splits=("n",), loss=True, answers=ANSWERS_TARGETS),
)}

FAMILIES = tuple(dict.fromkeys(spec.family for spec in OPS.values()))     # the other tables' keys, in row order


class Window(NamedTuple):
    """A window op's geometry, one value per spatial axis: ``kernel``, ``stride`` and ``dilation`` tuples, and
    ``padding`` as a ``(before, after)`` pair per axis."""

    kernel: tuple
    stride: tuple
    padding: tuple
    dilation: tuple


def same_padding(kernel, dilation):
    """PyTorch's ``padding='same'`` (stride 1): ``d*(k-1)`` in all along each axis, the odd one after."""
    return tuple((d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for k, d in zip(kernel, dilation))


def window(attrs, rank, spatial=None):
    """The :class:`Window` of a convolution's, pooling's, space to depth's or pad's attributes over ``rank``
    spatial axes: a kernel left out is the block's size (a space to depth's) or 1 (a pad), a stride left out
    (``None``) is the kernel's size, as PyTorch's pooling has it, a dilation left out is 1 (pooling has none), and
    padding ``same`` is :func:`same_padding`. Pooling's ``ceil_mode`` over an input of ``spatial`` extents is
    floor mode with the positions its last windows reach past the padded end added to the padding after
    (``ops/window.ceil_extra``; they count for nothing: -inf for max pooling, left out of average pooling's
    divisors); without ``spatial``, the padding as written."""
    kernel = ntuple(attrs.get("kernel", attrs.get("size", 1)), rank, "kernel")    # a space to depth's size; a pad's 1
    stride = kernel if attrs.get("stride") is None else ntuple(attrs["stride"], rank, "stride")
    dilation = ntuple(attrs.get("dilation", 1), rank, "dilation")
    padding = attrs.get("padding", 0)
    padding = same_padding(kernel, dilation) if padding == "same" else sides(padding, rank)
    if attrs.get("ceil_mode") and spatial is not None:
        padding = tuple((before, after + ceil_extra(size, k, s, before, after, d)) for size, k, s, (before, after), d
                        in zip(spatial, kernel, stride, padding, dilation))
    return Window(kernel, stride, padding, dilation)


def group_channels(layer):
    """Channels per group of a group or instance normalisation (the op table's ``STATISTICS_GROUPS``; 1 for any
    other op, a convolution's ``groups`` included: :func:`layer_groups`)."""
    if layer.spec.statistics != STATISTICS_GROUPS or "groups" not in layer.attrs:
        return 1
    return layer.in_shapes[0][0] // layer.attrs["groups"]


def layer_groups(layer):
    """The groups a grouped op's channels fall in (the op table's ``grouped``), 1 for any other op."""
    return layer.attrs.get("groups", 1) if layer.spec.grouped else 1


def output_grain(layer):
    """Output channels per group of an op with groups (a split of its channels keeps groups whole, so its parts
    hold multiples of this), 1 for any other."""
    groups = layer_groups(layer)
    return layer.out_shape[0] // groups if groups > 1 else 1


def channels_whole(layer):
    """Whether ``layer``'s output channels are never split: a parameter of it holds no row per output channel
    along its channel axis, so a tile of some channels would hold a shard no parameter layout has (a grouped
    transposed convolution's ``(C_in, C_out / groups, k...)``, a PReLU's one slope shared by every channel)."""
    channels = layer.out_shape[0] if layer.out_shape else 1
    return any(shape[layer.spec.param_axis(name)] != channels for name, shape in layer.params.items())


def tile_groups(layer, channels):
    """The groups a tile of output ``channels`` ``(k0, k1)`` holds (whole ones), 1 where the op has none."""
    return (channels[1] - channels[0]) // output_grain(layer) if layer_groups(layer) > 1 else 1


def needs_gradient(has_params, inputs_need):
    """Whether a layer's output needs a gradient, so that its backward runs: it has parameters, or one of its
    inputs needs a gradient (``inputs_need``: one bool per input; the data never needs one). An input needs a
    gradient exactly when its producer's output does, so a layer computes the gradient of input ``i`` only when
    ``inputs_need[i]``: a convolution reading the data, or reading a pooling of it, computes no data gradient."""
    return bool(has_params) or any(inputs_need)
