"""The op table: every fact about an op that more than one part of spmdcnn reads, one row per op.

The runtime reads how a kernel may reuse memory and which parameter gradients leave the layer already summed;
tiling reads which output dimensions a configuration may split and what an output tile reads of its inputs; the
planner reads which layers take their input's configuration; the cost and memory models read what a tile keeps
for backward, which attributes its kernel uses and which layers sum inside themselves; initialisation and PyTorch
state dicts read which layers normalise. Adding an op means a module in ``ops/``, its kernel binding in
``runtime/kernels.py`` and one row here (``tests/graph/test_optable.py`` checks that every part covers every row).

Which tensors need a gradient is a property of the graph, not of an op: :func:`needs_gradient` says it once
for the runtime, the profiler and the cost model.
"""

from dataclasses import dataclass
from typing import NamedTuple

from ..ops.window import pair

# what an output tile reads of its inputs (tiling/fields.py)
READS_WINDOW = "window"                 # a window over rows and columns, every input channel (convolution)
READS_CHANNEL_WINDOW = "channel window"  # a window over rows and columns, the output's channels (pooling)
READS_PLANE = "plane"                   # the whole rows and columns of the output's channels
READS_SAMPLE = "sample"                 # every feature of the output's samples
READS_CHANNEL_PARTS = "channel parts"   # from each input the part of the output's channels it supplies (concat)
READS_BOX = "box"                       # the output's own box (element-wise)

# what a kernel keeps from forward to backward (cost/memory.py)
KEEPS_INPUT = "input"                   # its input tile, in the activations' type
KEEPS_MASK = "mask"                     # one byte per output element
KEEPS_INDICES = "indices"               # the argmax of each window (one byte, or four for a window over 256)
KEEPS_NOTHING = None


@dataclass(frozen=True)
class OpSpec:
    """One op's row. ``splits`` names the output dimensions a configuration may split (None: all of them)."""

    name: str
    reads: str
    keeps: str = KEEPS_NOTHING
    splits: tuple = None
    multi_input: bool = False
    inplace: bool = False       # may write its output over an input no one else reads
    view: bool = False          # may return its input's memory (flatten's reshape; dropout in eval or p = 0)
    inherits: bool = False      # a plan that leaves it out gives it its input's configuration
    reduced_in_layer: bool = False  # its parameter gradients come out summed over the replica group
    dense: bool = False         # fully connected: the "one weird trick" plan splits its features
    normalization: bool = False  # weight 1 and bias 0 at first, running statistics (PyTorch counts its batches)
    loss: bool = False          # the network's loss: one value per sample
    tile_attrs: tuple = ()      # attributes its kernel reads, besides a window's geometry (cost/tiles.py)

    @property
    def window(self):
        """Whether a tile reads a window over rows and columns (halos, padding and stride)."""
        return self.reads in (READS_WINDOW, READS_CHANNEL_WINDOW)


OPS = {spec.name: spec for spec in (
    OpSpec("conv2d", READS_WINDOW, KEEPS_INPUT),
    OpSpec("maxpool2d", READS_CHANNEL_WINDOW, KEEPS_INDICES),
    OpSpec("avgpool2d", READS_CHANNEL_WINDOW),
    OpSpec("global_avgpool", READS_PLANE),
    OpSpec("relu", READS_BOX, KEEPS_MASK, inplace=True, inherits=True),
    OpSpec("batchnorm2d", READS_BOX, KEEPS_INPUT, reduced_in_layer=True, normalization=True,
           tile_attrs=("eps", "momentum")),
    OpSpec("dropout", READS_BOX, KEEPS_MASK, inplace=True, view=True, inherits=True, tile_attrs=("p",)),
    OpSpec("flatten", READS_SAMPLE, splits=("n",), view=True),
    OpSpec("linear", READS_SAMPLE, KEEPS_INPUT, dense=True),
    OpSpec("concat", READS_CHANNEL_PARTS, multi_input=True),
    OpSpec("add", READS_BOX, multi_input=True, inplace=True),
    OpSpec("softmax_cross_entropy", READS_SAMPLE, KEEPS_INPUT, splits=("n",), loss=True),
)}


class Window(NamedTuple):
    """A window op's geometry, each an ``(h, w)`` pair."""

    kernel: tuple
    stride: tuple
    padding: tuple
    dilation: tuple


def window(attrs):
    """The :class:`Window` of a convolution's or pooling's attributes: a stride left out (``None``) is the kernel's
    size, as PyTorch's pooling has it, and a dilation left out is 1 (pooling has none)."""
    kernel = pair(attrs["kernel"])
    stride = kernel if attrs.get("stride") is None else pair(attrs["stride"])
    return Window(kernel, stride, pair(attrs.get("padding", 0)), pair(attrs.get("dilation", 1)))


def needs_gradient(has_params, inputs_need):
    """Whether a layer's output needs a gradient, so that its backward runs: it has parameters, or one of its
    inputs needs a gradient (``inputs_need``: one bool per input; the data never needs one). An input needs a
    gradient exactly when its producer's output does, so a layer computes the gradient of input ``i`` only when
    ``inputs_need[i]``: a convolution reading the data, or reading a pooling of it, computes no data gradient."""
    return bool(has_params) or any(inputs_need)
