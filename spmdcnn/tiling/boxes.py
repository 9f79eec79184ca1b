"""Boxes: a ``(start, stop)`` range per dimension of a global tensor, and balanced splits.

Part ``i`` of an extent ``E`` split ``d`` ways is ``[floor(i*E/d), floor((i+1)*E/d))`` (docs/formats.md#plan-files):
parts differ in size by at most one and cover the extent exactly once.

A box read with ``steps`` holds every ``step``-th element of each range from its start: what a strided 1x1 window
reads. Tiles are always dense (steps of 1); only the boxes a tile reads may be strided.
"""

Box = tuple     # ((start, stop), ...), one pair per dimension; stop > start for a non-empty box


def part(extent, degree, index):
    """The range of part ``index`` of ``extent`` split into ``degree`` balanced parts."""
    return index * extent // degree, (index + 1) * extent // degree


def full(shape):
    return tuple((0, extent) for extent in shape)


def _ones(box, steps):
    return steps or (1,) * len(box)


def shape_of(box, steps=None):
    return tuple(max(0, -(-(stop - start) // step)) for (start, stop), step in zip(box, _ones(box, steps)))


def volume(box):
    count = 1
    for start, stop in box:
        count *= max(stop - start, 0)
    return count


def is_empty(box):
    return any(stop <= start for start, stop in box)


def intersect(a, b, steps=None):
    """The common part of box ``a`` and box ``b`` read with ``steps`` (as a box read with the same steps: from
    its first element to just past its last), or None when they share no element."""
    box = []
    for (a0, a1), (b0, b1), step in zip(a, b, _ones(b, steps)):
        first = b0 + -(-(max(a0, b0) - b0) // step) * step
        end = min(a1, b1)
        if first >= end:
            return None
        box.append((first, first + (end - 1 - first) // step * step + 1))
    return tuple(box)


def relative(box, origin, steps=None):
    """Slices selecting ``box`` (read with ``steps``) inside an array that holds the dense box ``origin``."""
    return tuple(slice(start - o, stop - o, step) for (start, stop), (o, _), step in zip(box, origin,
                                                                                        _ones(box, steps)))


def packed(box, origin, steps=None):
    """Slices selecting ``box`` inside an array that holds ``origin`` read with ``steps`` (``box`` lies on the
    same progression): where a strided read lands in the compact array it fills."""
    return tuple(slice((start - o) // step, (start - o) // step + -(-(stop - start) // step))
                 for (start, stop), (o, _), step in zip(box, origin, _ones(box, steps)))


def contains(outer, inner):
    return all(o0 <= i0 and i1 <= o1 for (o0, o1), (i0, i1) in zip(outer, inner))
