"""Memory per device: what a plan asks of the device that holds the most.

For a layer under a configuration, the device holding its largest tile keeps, through an iteration, that output
tile (saved for backward: the product over its dimensions of ``ceil(extent / degree)`` elements) and its shard of
the layer's parameters three times (weights, gradients, momentum) plus its batch-norm statistics; parameters split
along ``c`` like the output. Every configuration puts its tiles on devices ``0 .. count-1``, so device 0 holds a
tile of every layer: a plan's memory is the sum over its layers. It leaves out what lives only for a moment (the
input boxes gathered for one layer, the workspace of a kernel), and is the model the planner's memory limit uses.
"""

from math import ceil, prod

from ..tiling.config import output_shape


def layer_memory(layer, degrees, batch, itemsize=4):
    """Bytes the device with ``layer``'s largest tile keeps for it under a configuration of ``degrees``."""
    shape = output_shape(layer, batch)
    tile = prod(ceil(extent / degree) for extent, degree in zip(shape, degrees))
    split = degrees[1] if len(degrees) > 1 else 1       # c: output channels or features

    def shard(shapes):
        return sum(ceil(s[0] / split) * prod(s[1:]) for s in shapes)
    return itemsize * (tile + 3 * shard(layer.params.values()) + shard(layer.buffers.values()))


def plan_memory(graph, plan, itemsize=4):
    """Bytes device 0 keeps under ``plan``: the sum of :func:`layer_memory` over the layers."""
    return sum(layer_memory(layer, plan[layer.name].degrees, plan.batch, itemsize) for layer in graph.layers)


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
    if value <= 0:
        raise ValueError(f"a size must be positive, got {text!r}")
    return value
