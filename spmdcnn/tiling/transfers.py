"""Who sends which box to whom: the intersections between producer tiles and the input boxes consumer tiles need.

Every element of a needed box lies in exactly one producer tile (the tiles of a tensor partition it), so the
transfers into one consumer tile cover its needed box exactly once. Backward runs the same transfers the other
way and *adds* what arrives into the producer's gradient tile: the adjoint of the forward copy.
"""

from dataclasses import dataclass

from ..graph.blocks import DATA
from .boxes import intersect
from .config import output_shape
from .fields import needs


@dataclass(frozen=True)
class Transfer:
    """The box ``box`` (global coordinates of the producer's output) moves from ``src`` to ``dst`` for input
    ``slot`` of the consumer. ``src_box`` is the producer tile it is cut from; ``dst_box`` the needed box it
    lands in."""

    slot: int
    src: int
    dst: int
    box: tuple
    src_box: tuple
    dst_box: tuple
    steps: tuple = None      # the needed box's steps: ``box`` holds every step-th element from its start


def input_shapes(plan, layer):
    """Global shapes (batch first) of ``layer``'s inputs."""
    return [(plan.batch,) + tuple(shape) for shape in layer.in_shapes]


def tile_needs(plan, layer):
    """``{device: [Need per input]}`` for every tile of ``layer``."""
    shapes = input_shapes(plan, layer)
    return {device: needs(layer, box, shapes)
            for device, box in plan[layer.name].tiles(output_shape(layer, plan.batch))}


def layer_transfers(plan, layer, needs=None):
    """All transfers feeding ``layer``'s tiles from its producers' tiles (inputs read from the data excluded),
    ordered by (slot, destination, source): the same list on every rank. ``needs``: :func:`tile_needs`, when
    the caller has it already."""
    result = []
    for device, need_list in sorted((tile_needs(plan, layer) if needs is None else needs).items()):
        for slot, (ref, need) in enumerate(zip(layer.inputs, need_list)):
            if ref == DATA:
                continue
            for src, src_box in plan[ref].tiles(plan.shape(ref)):
                box = intersect(src_box, need.box, need.steps)
                if box is not None:
                    result.append(Transfer(slot, src, device, box, src_box, need.box, need.steps))
    result.sort(key=lambda t: (t.slot, t.dst, t.src))
    return result
