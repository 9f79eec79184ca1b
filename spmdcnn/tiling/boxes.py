"""Boxes: a ``(start, stop)`` range per dimension of a global tensor, and balanced splits.

Part ``i`` of an extent ``E`` split ``d`` ways is ``[floor(i*E/d), floor((i+1)*E/d))`` (DESIGN.md §3.2): parts
differ in size by at most one and cover the extent exactly once.
"""

Box = tuple     # ((start, stop), ...), one pair per dimension; stop > start for a non-empty box


def part(extent, degree, index):
    """The range of part ``index`` of ``extent`` split into ``degree`` balanced parts."""
    return index * extent // degree, (index + 1) * extent // degree


def full(shape):
    return tuple((0, extent) for extent in shape)


def shape_of(box):
    return tuple(stop - start for start, stop in box)


def volume(box):
    count = 1
    for start, stop in box:
        count *= max(stop - start, 0)
    return count


def is_empty(box):
    return any(stop <= start for start, stop in box)


def intersect(a, b):
    """The common part of two boxes, or None when they do not overlap."""
    box = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b))
    return None if is_empty(box) else box


def relative(box, origin):
    """Slices selecting ``box`` inside an array that holds the box ``origin``."""
    return tuple(slice(start - o, stop - o) for (start, stop), (o, _) in zip(box, origin))


def contains(outer, inner):
    return all(o0 <= i0 and i1 <= o1 for (o0, o1), (i0, i1) in zip(outer, inner))
