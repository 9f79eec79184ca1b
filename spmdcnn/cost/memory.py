"""Memory per device: what a plan asks of a device, as the runtime keeps it through an iteration.

For a layer under a configuration, the device holding its heaviest tile keeps, from forward to backward, what the
layer's kernel saves for backward, and its shard of the layer's parameters three times (weights, gradients,
momentum) with its batch-norm statistics; parameters are split along ``c`` like the output. What the kernels
save (``ops/``): a convolution or linear layer its input box (all input channels, whatever its own split), batch
norm its normalized input, softmax cross-entropy its probabilities, tanh its output, each in the model's dtype;
relu, leaky relu and dropout a
one-byte mask per output element; max pooling the index of each window's maximum (one byte, four for windows of
more than 256 positions); pooling by average, add, concat and flatten nothing (the op table's ``keeps``); a layer
whose backward never runs (a pooling of the data) nothing. The outputs themselves live only
until their consumers have read them, and are left out, as are the input boxes gathered for one layer and the
workspace of a kernel. A tensor several layers read whole (Inception's branches) is counted once per reader,
where the runtime may keep one array for them all.

A plan's memory is the sum over its layers of their heaviest tile's: an upper bound on what any device keeps,
reached by device 0 when the splits are even (every configuration puts its tiles on devices ``0 .. count-1``, so
device 0 holds a tile of every layer; with uneven splits a later device holds the larger parts). It is the model
the planner's memory limit uses.
"""

import math
from itertools import product
from math import ceil, prod

from ..tiling.boxes import part, shape_of
from ..tiling.config import output_shape
from ..tiling.fields import needs
from ..graph.optable import KEEPS_INDICES, KEEPS_INPUT, KEEPS_MASK, KEEPS_OUTPUT
from .tiles import candidates



def layer_memory(layer, degrees, batch, itemsize=4):
    """Bytes the device with ``layer``'s heaviest tile keeps for it under a configuration of ``degrees``: the most
    over the tiles that may differ (one part of each size along every dimension, and for a window the first and
    last parts, whose reads meet the tensor's edges)."""
    split = degrees[1] if len(degrees) > 1 else 1       # c: output channels or features

    def shard(shapes):
        return sum(ceil(s[0] / split) * prod(s[1:]) for s in shapes)
    shape = output_shape(layer, batch)
    windows = layer.spec.window                 # an interior tile reads a halo on both sides
    parts = [[part(extent, degree, i) for i in candidates(extent, degree, windows and axis >= 2)]
             for axis, (extent, degree) in enumerate(zip(shape, degrees))]
    saved = max(_saved(layer, box, batch, itemsize) for box in product(*parts))
    return saved + itemsize * (3 * shard(layer.params.values()) + shard(layer.buffers.values()))


def _saved(layer, box, batch, itemsize):
    """Bytes the kernel of ``layer`` keeps from forward to backward for its output tile ``box`` (module
    docstring)."""
    keeps = layer.spec.keeps if layer.needs_grad else None
    if keeps == KEEPS_INPUT:
        need = needs(layer, box, [(batch,) + tuple(s) for s in layer.in_shapes])[0]
        return itemsize * prod(shape_of(need.box, need.steps))
    if keeps == KEEPS_OUTPUT:
        return itemsize * prod(shape_of(box))
    if keeps == KEEPS_MASK:
        return prod(shape_of(box))
    if keeps == KEEPS_INDICES:
        return prod(shape_of(box)) * (1 if prod(layer.window.kernel) <= 256 else 4)
    return 0


def plan_memory(graph, plan, itemsize=4):
    """Bytes device 0 keeps under ``plan``: the sum of :func:`layer_memory` over the layers."""
    return sum(layer_memory(layer, plan[layer.name].degrees, plan.batch, itemsize) for layer in graph.layers)


_UNITS = ("B", "KiB", "MiB", "GiB")


def _unit(count):
    """The index of the unit ``count`` bytes read best in."""
    index = 0
    while index < len(_UNITS) - 1 and count >= 1024 ** (index + 1):
        index += 1
    return index


def format_bytes(count, digits=1, unit=None):
    """``count`` bytes as people read them: ``512 B``, ``1.5 KiB``, ``3.8 GiB`` (``digits`` after the point;
    ``unit`` an index into B, KiB, MiB, GiB, else the one that suits ``count``)."""
    index = _unit(count) if unit is None else unit
    if index == 0:
        return f"{count:.0f} B"
    return f"{count / 1024 ** index:.{digits}f} {_UNITS[index]}"


def format_against(used, limit, most=4):
    """``(used, limit)`` as text in one unit, with the fewest digits (at most ``most``) that tell them apart, so
    that a limit's effect shows: ``1.85 GiB`` against ``1.87 GiB``, not ``1.9`` against ``1.9``."""
    index = _unit(max(used, limit))
    for digits in range(1, most + 1):
        pair = format_bytes(used, digits, index), format_bytes(limit, digits, index)
        if pair[0] != pair[1] or used == limit:
            break
    return pair


def parse_size(text):
    """``"12GiB"``, ``"1.5e9"``, ``"800 MB"``: bytes (GiB, MiB, KiB are powers of 1024; GB, MB, kB of 1000)."""
    units = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2 ** 10, "mib": 2 ** 20,
             "gib": 2 ** 30, "tib": 2 ** 40}
    cleaned = str(text).strip().lower().replace(" ", "")
    number = cleaned.rstrip("kmgtib")
    unit = cleaned[len(number):]
    try:
        value = float(number) * units[unit]
    except (KeyError, ValueError):
        raise ValueError(f"not a size: {text!r} (say 16GiB, 800MB or 1.5e9)") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"a size must be positive, got {text!r}")
    return value
