"""Memory per device: what a plan asks of a device, as the runtime holds it through an iteration.

A device's memory is what it **keeps** from forward to backward, summed over the layers, plus the largest of what
the layers hold only while they run, their **transients**:

- kept, per layer, by the device holding its heaviest tile: what the layer's kernel saves for backward, and its
  shard of the layer's parameters three times (weights, gradients, momentum) with its batch-norm statistics;
  parameters are split along ``c`` like the output. What the kernels save (``ops/``): a convolution or linear
  layer its input box (all input channels, whatever its own split), batch norm its input, softmax
  cross-entropy its probabilities and the mean squared error its differences, tanh its output, each in the
  model's dtype; relu, leaky relu and dropout a one-byte mask per output element; max pooling the index of each
  window's maximum (one byte, four for windows of more than 256 positions); pooling by average, add, concat,
  scale and flatten nothing (the op table's ``keeps``); a layer whose backward never runs (a pooling of the data)
  nothing;
- transient, per layer, while its tile runs: the input boxes it reads (gathered anew by the exchange, or read
  from the data), its output tile (in backward, as many: its output's gradient and its inputs'), and its
  kernel's workspace (a convolution's im2col columns, their product and the padded input block, ``ops/conv.py``,
  or where oneDNN runs the host's float32 convolutions its blocked copies of them, ``ops/onednn.py``; a padded
  pooling's padded input).

A volume's activations are what a device cannot hold: CosmoFlow's first convolution at 512^3 outputs 16 GiB per
sample, which is a transient, not a kept, tensor. Left out: outputs waiting for a consumer further on (the other
branch of a skip connection), the exchanges' message buffers, and the runtime and library themselves. A tensor
several layers read whole (Inception's branches) is counted once per reader, where the runtime may keep one array
for them all.

A plan's memory, :func:`plan_memory`, is the sum over its layers of their heaviest tile's kept bytes plus the
largest transient among the layers: an upper bound on what any device holds, reached by device 0 when the
splits are even (every configuration puts its tiles on devices ``0 .. count-1``, so device 0 holds a tile of
every layer; with uneven splits a later device holds the larger parts). It is the model the planner's memory limit
uses (``planner/memory.py``); ``benchmarks/memory_model.py`` measures it against the ranks' peak.
"""

from itertools import product
from math import ceil, prod

from ..graph.optable import ANSWERS_LABELS, KEEPS_INDICES, KEEPS_INPUT, KEEPS_MASK, KEEPS_OUTPUT, tile_groups
from ..ops.conv import ConvGeometry, workspace_elements
from ..ops.conv_transpose import full_extents
from ..ops.window import is_padded, padded_extents
from ..tiling.boxes import part, shape_of
from ..tiling.config import output_shape
from ..tiling.fields import needs
from .tiles import distinct_parts


def _tiles(layer, degrees, batch):
    """The output boxes of ``layer``'s tiles that may differ under ``degrees``: the parts along every dimension
    whose tiles may read differently (``cost.tiles.distinct_parts``: one of each size, and for a window the first
    and last parts, whose reads meet the tensor's edges)."""
    shape = output_shape(layer, batch)
    in_shapes = [(batch,) + tuple(s) for s in layer.in_shapes]
    parts = [[part(extent, degree, i) for i in distinct_parts(layer, in_shapes, axis, extent, degree)]
             for axis, (extent, degree) in enumerate(zip(shape, degrees))]
    return product(*parts)


def layer_memory(layer, degrees, batch, itemsize=4):
    """Bytes the device with ``layer``'s heaviest tile keeps for it from forward to backward under a
    configuration of ``degrees`` (module docstring): the most over the tiles that may differ."""
    split = degrees[1] if len(degrees) > 1 else 1       # c: output channels or features
    channels = (0, ceil(layer.out_shape[0] / split)) if layer.out_shape else (0, 1)     # the largest part's

    def shard(names):
        return sum(prod(layer.shard_shape(name, channels)) for name in names)
    saved = max(_saved(layer, box, batch, itemsize) for box in _tiles(layer, degrees, batch))
    return saved + itemsize * (3 * shard(layer.params) + shard(layer.buffers))


def layer_transient(layer, degrees, batch, itemsize=4, im2col=True):
    """Bytes the device with ``layer``'s heaviest tile holds only while the layer runs under a configuration of
    ``degrees`` (module docstring): its input boxes, its output tile and its kernel's workspace (``im2col``: the
    device's convolutions build columns, as NumPy's do; not on GPUs, where cuDNN runs them)."""
    return max(_transient(layer, box, batch, itemsize, im2col) for box in _tiles(layer, degrees, batch))


def _needs(layer, box, batch):
    return needs(layer, box, [(batch,) + tuple(s) for s in layer.in_shapes])


def _saved(layer, box, batch, itemsize):
    """Bytes the kernel of ``layer`` keeps from forward to backward for its output tile ``box`` (module
    docstring)."""
    keeps = layer.spec.keeps if layer.needs_grad else None
    if keeps == KEEPS_INPUT:                 # its input (both of mul's)
        kept = itemsize * sum(prod(shape_of(need.box, need.steps)) for need in _needs(layer, box, batch))
        if layer.spec.answers == ANSWERS_LABELS:    # the cross-entropy: each element's label and whether it counts
            kept += 9 * prod(shape_of(box))
        return kept
    if keeps == KEEPS_OUTPUT:
        return itemsize * prod(shape_of(box))
    if keeps == KEEPS_MASK:
        return prod(shape_of(box))
    if keeps == KEEPS_INDICES:
        return prod(shape_of(box)) * (1 if prod(layer.window.kernel) <= 256 else 4)
    return 0


def _transient(layer, box, batch, itemsize, im2col=True):
    """Bytes the tile ``box`` of ``layer`` holds while it runs: the boxes it reads, its output and the workspace
    of its kernel (a convolution's columns, their product and the padded block; a padded pooling's copy)."""
    tile_needs = _needs(layer, box, batch)
    elements = sum(prod(shape_of(need.box, need.steps)) for need in tile_needs) + prod(shape_of(box))
    if layer.spec.window:
        need = tile_needs[0]
        x_shape = shape_of(need.box, need.steps)
        if layer.spec.family == "conv":
            if im2col:
                geometry = layer.window
                tile = ConvGeometry(need.stride(geometry.stride), need.pads, geometry.dilation, rank=len(x_shape) - 2,
                                    groups=tile_groups(layer, box[1]))
                elements += workspace_elements(x_shape, geometry.kernel, layer.attrs["out_channels"], tile, itemsize)
        elif layer.spec.family == "conv_transpose":
            # the full extent its input fills (computed, then cropped), and the convolution it is the adjoint of
            geometry = layer.window
            full = full_extents(x_shape[2:], geometry.kernel, geometry.stride, geometry.dilation)
            filled = (x_shape[0], layer.attrs["out_channels"]) + full
            elements += prod(filled)
            if im2col:
                inner = ConvGeometry(geometry.stride, 0, geometry.dilation, rank=len(full))
                elements += workspace_elements(filled, geometry.kernel, x_shape[1], inner, itemsize)
        elif is_padded(need.pads):
            elements += prod(x_shape[:2]) * prod(padded_extents(x_shape[2:], need.pads))   # pooling pads a copy
    elif layer.spec.class_sums:     # Dice's backward: the gradient of the probabilities, and its product with them
        elements += 2 * prod(shape_of(tile_needs[0].box, tile_needs[0].steps))
    return itemsize * elements


def kept_memory(graph, plan, itemsize=4):
    """Bytes device 0 keeps from forward to backward under ``plan``: :func:`layer_memory` summed over the layers."""
    return sum(layer_memory(layer, plan[layer.name].degrees, plan.batch, itemsize) for layer in graph.layers)


def peak_transient(graph, plan, itemsize=4, im2col=True):
    """``(bytes, layer)``: the largest :func:`layer_transient` under ``plan``, and its layer's name."""
    return max((layer_transient(layer, plan[layer.name].degrees, plan.batch, itemsize, im2col), layer.name)
               for layer in graph.layers)


def plan_memory(graph, plan, itemsize=4, im2col=True):
    """Bytes device 0 holds under ``plan`` (module docstring): what it keeps, :func:`kept_memory`, plus the largest
    transient, :func:`peak_transient` (``im2col``: as :func:`layer_transient`)."""
    return kept_memory(graph, plan, itemsize) + peak_transient(graph, plan, itemsize, im2col)[0]
