"""A layer's tiles as the cost model sees them: their distinct :class:`TileShape` under a configuration.

A tile's work is fixed by its shape: the op, the shapes of the (padded) inputs it reads, its output box's shape,
its parameter shard, whether it runs backward at all and whether it computes a gradient for its input (the graph's
rule, ``graph.optable.needs_gradient``: not for the data, nor for what only the data reaches). Tiles of one
layer differ only where a split is uneven, so a configuration has one to a few distinct shapes: what a tile reads
along one axis depends only on its part along that axis, so each axis has a few kinds of part
(:class:`LayerClasses`) and a tile's shape combines one kind per axis (:func:`combine`).
"""

from dataclasses import dataclass
from itertools import product
from typing import NamedTuple

import numpy as np

from ..graph.optable import (OPS, READS_CHANNEL_PARTS, READS_INTERPOLATED, READS_TRANSPOSED, STATISTICS_GROUPS,
                             group_channels)
from ..ops.window import padded_extents
from ..tiling.boxes import full, part, shape_of
from ..tiling.config import output_shape
from ..tiling.fields import needs as tile_needs, spatial_reach


@dataclass(frozen=True)
class TileShape:
    """What one tile computes: enough to run it alone (the profiler does) and to count its work."""

    op: str
    attrs: tuple            # sorted (key, value) pairs the kernel uses (the stride after strided reads)
    inputs: tuple           # per input: its shape including the padding the tile adds
    output: tuple
    params: tuple           # (name, shard shape) pairs
    input_grad: bool        # computes the gradient of its input (Layer.input_grad)
    backward: bool = True   # runs backward at all (Layer.needs_grad: not a pooling of the data)

    @property
    def key(self):
        attrs = ",".join(f"{k}={v}" for k, v in self.attrs)
        ins = ";".join("x".join(map(str, s)) for s in self.inputs)
        params = ";".join(f"{n}:{'x'.join(map(str, s))}" for n, s in self.params)
        return f"{self.op}[{attrs}] in={ins} out={'x'.join(map(str, self.output))} p={params} " \
               f"dx={int(self.input_grad)}{'' if self.backward else ' forward only'}"

    def to_json(self):
        data = {"op": self.op, "attrs": [list(a) for a in self.attrs], "inputs": [list(s) for s in self.inputs],
                "output": list(self.output), "params": [[n, list(s)] for n, s in self.params],
                "input_grad": self.input_grad}
        if not self.backward:
            data["backward"] = False
        return data

    @classmethod
    def from_json(cls, data):
        return cls(data["op"], tuple((k, _tuple(v)) for k, v in data["attrs"]),
                   tuple(tuple(s) for s in data["inputs"]), tuple(data["output"]),
                   tuple((n, tuple(s)) for n, s in data["params"]), bool(data["input_grad"]),
                   bool(data.get("backward", True)))


def _tuple(value):
    return tuple(value) if isinstance(value, list) else value


def tile_shapes(layer, config, batch):
    """The distinct :class:`TileShape` of ``layer``'s tiles under ``config``.

    What a tile reads along one dimension depends only on its part along that dimension, so the distinct tiles
    are the combinations of each dimension's distinct parts (at most a few: balanced splits differ by one in
    size, and a window's tile reads, padding included, as many rows as its part's size fixes)."""
    result = []
    for kinds in product(*(c.every for c in layer_classes(layer, batch).of(config.degrees))):
        shape = combine(kinds)
        if shape not in result:
            result.append(shape)
    return result


_CLASSES = {}


def clear_caches():
    """Forget the tile shapes worked out so far (they are kept per layer signature for the whole process)."""
    _CLASSES.clear()


def layer_classes(layer, batch):
    """The :class:`LayerClasses` of ``layer`` at ``batch`` (remembered per layer signature)."""
    key = (layer.signature, batch)
    if key not in _CLASSES:
        _CLASSES[key] = LayerClasses(layer, batch)
    return _CLASSES[key]


class Classes(NamedTuple):
    """The kinds of part along one axis split some number of ways, each as the :class:`TileShape` of a tile with
    such a part along that axis (whatever its parts along the others: :func:`combine` takes only that axis)."""

    every: tuple
    largest: tuple      # the kinds no other one outgrows (:func:`_outgrows`): only they may hold the slowest tile


class LayerClasses:
    """The kinds of part of one layer's tiles along each axis, per degree.

    What a tile reads and computes along one axis depends only on its part along that axis (``tiling.fields``):
    its output's and inputs' extents there with their padding, along a window's rows or columns the stride a
    strided read leaves, and along the channel axis its parameter shard. So a tile split along every axis at
    once shows a part along each, and :meth:`build` looks at a few such tiles for many degrees."""

    def __init__(self, layer, batch):
        self.layer = layer
        self.in_shapes = [(batch,) + tuple(s) for s in layer.in_shapes]
        self.extents = output_shape(layer, batch)
        whole = full(self.extents)
        self.whole = tile_shape(layer, whole, tile_needs(layer, whole, self.in_shapes))
        self._found = [{} for _ in self.extents]     # per axis: {degree: Classes}
        self._tables = None

    def of(self, degrees):
        """Each axis's :class:`Classes` under ``degrees``."""
        try:
            return [found[degree] for found, degree in zip(self._found, degrees)]
        except KeyError:
            self.build([degrees])
            return [found[degree] for found, degree in zip(self._found, degrees)]

    def build(self, configs):
        """Work out the :class:`Classes` of every axis and degree of ``configs`` (degrees) not known yet: the
        ``j``-th tile looked at has the ``j``-th part wanted along every axis."""
        todo = {}
        for axis, found in enumerate(self._found):
            for degree in sorted({degrees[axis] for degrees in configs} - found.keys()):
                todo[axis, degree] = self._parts(axis, degree)
        wanted = [[] for _ in self.extents]          # per axis: (degree, index) of each part to look at
        for (axis, degree), parts in todo.items():
            wanted[axis].extend((degree, index) for index in parts)
        tiles = {}
        for j in range(max(map(len, wanted))):
            box = tuple(part(extent, *parts[j]) if j < len(parts) else (0, extent)
                        for extent, parts in zip(self.extents, wanted))
            shape = tile_shape(self.layer, box, tile_needs(self.layer, box, self.in_shapes))
            for axis, parts in enumerate(wanted):
                if j < len(parts):
                    tiles[axis, parts[j]] = shape
        for (axis, degree), parts in todo.items():
            shapes = [tiles[axis, (degree, index)] for index in parts]
            if len(shapes) == 1:
                self._found[axis][degree] = Classes((shapes[0],), (shapes[0],))
                continue
            kinds = {}
            for shape in shapes:
                kinds.setdefault(_along(shape, axis), shape)
            largest = []
            for kind in kinds:
                if not any(_outgrows(kept, kind) for kept in largest):
                    largest = [kept for kept in largest if not _outgrows(kind, kept)] + [kind]
            self._found[axis][degree] = Classes(tuple(kinds.values()), tuple(kinds[kind] for kind in largest))
        self._tables = None

    def _parts(self, axis, degree):
        """The parts along ``axis`` split ``degree`` ways whose tiles may differ in what they read."""
        return distinct_parts(self.layer, self.in_shapes, axis, self.extents[axis], degree)

    def largest_tiles(self, configs):
        """Every combination of each axis's largest kinds of part, for the configurations among ``configs``
        (degrees, all known) whose largest kinds keep the whole tile's stride (all but those where a strided read
        is left with one row or column): the indices of those configurations, where each one's combinations
        start, and :func:`combine` of them all at once, a :class:`TileShape` whose extents are arrays (of Python
        integers) over them."""
        if self._tables is None:
            self._tables = [self._table(axis) for axis in range(len(self.extents))]
        tables, axes = self._tables, len(self.extents)
        degrees = np.array(configs, dtype=np.int64).reshape(len(configs), axes)
        found = [np.searchsorted(table.degrees, degrees[:, axis]) for axis, table in enumerate(tables)]
        chosen = np.flatnonzero(np.logical_and.reduce([table.plain[f] for f, table in zip(found, tables)]))
        found = [f[chosen] for f in found]
        if all(table.single for table in tables):       # one combination per configuration
            starts = np.arange(len(chosen))
            rows = [table.start[f] for f, table in zip(found, tables)]
        else:
            counts = [table.count[f] for f, table in zip(found, tables)]
            sizes = np.prod(counts, axis=0)
            starts = np.cumsum(sizes) - sizes
            owner = np.repeat(np.arange(len(chosen)), sizes)
            within = np.arange(len(owner)) - starts[owner]      # which of its configuration's, in row-major order
            rows = [None] * axes
            for axis in reversed(range(axes)):
                count = counts[axis][owner]
                rows[axis] = tables[axis].start[found[axis]][owner] + within % count
                within //= count
        columns = [table.values[row].T for row, table in zip(rows, tables)]     # per axis: (values, tiles)
        return chosen, starts, _assemble(self.whole, columns, self.whole.attrs)

    def _table(self, axis):
        """The :class:`_Table` of the degrees known along ``axis``."""
        known = sorted(self._found[axis])
        stride = _along(self.whole, axis)[1]
        start, count, plain, values = [], [], [], []
        for degree in known:
            largest = self._found[axis][degree].largest
            start.append(len(values))
            count.append(len(largest))
            plain.append(stride is None or all(_along(shape, axis)[1] == stride for shape in largest))
            values.extend(_values(shape, axis) for shape in largest)
        table = np.empty((len(values), len(values[0])), dtype=object)
        table[...] = values
        return _Table(np.array(known, dtype=np.int64), np.array(start, dtype=np.int64),
                      np.array(count, dtype=np.int64), np.array(plain, dtype=bool), table, max(count) == 1)


class _Table(NamedTuple):
    """The largest kinds of part along one axis, per degree (sorted): ``values[start:start + count]`` are their
    :func:`_values`; ``plain``: they all keep the whole tile's stride."""

    degrees: np.ndarray
    start: np.ndarray
    count: np.ndarray
    plain: np.ndarray
    values: np.ndarray
    single: bool        # one largest kind for every degree


def _along(shape, axis):
    """What the tile ``shape`` does along ``axis``: its extents there (:func:`_values`) and its stride there (None
    but along a window's rows or columns)."""
    stride = None
    if axis >= 2:
        for key, value in shape.attrs:
            if key == "stride":
                stride = value[axis - 2]
    return _values(shape, axis), stride


def _values(shape, axis):
    """The extents of the tile ``shape`` along ``axis``: its output's, then each input's that has the axis, then
    (along the channel axis) its parameter shards' rows."""
    return ((shape.output[axis],) + tuple([s[axis] for s in shape.inputs if axis < len(s)])
            + (tuple([s[OPS[shape.op].param_axis(n)] for n, s in shape.params]) if axis == 1 else ()))


def _outgrows(a, b):
    """Whether a part of kind ``a`` (:func:`_along`) does the same work as one of kind ``b`` (the same stride) on
    extents at least as large, every one of them."""
    return a[1] == b[1] and all(x >= y for x, y in zip(a[0], b[0]))


def combine(kinds):
    """The :class:`TileShape` of the tile whose part along each axis ``a`` is that of the tile ``kinds[a]`` (as
    :class:`LayerClasses` gives them).

    It takes from ``kinds[a]`` what depends on the part along ``a`` (``tiling.fields.needs``): the output's and
    each input's extent along ``a`` (with its padding), the stride a strided read along a spatial axis leaves,
    and, from the channel axis, the parameter shard. Input dimensions past the output's rank are whole."""
    values = [_values(shape, axis) for axis, shape in enumerate(kinds)]
    return _assemble(kinds[0], values, _combined_attrs(kinds))


def _assemble(template, values, attrs):
    """The :class:`TileShape` of ``template``'s op whose extents along each axis ``a`` are ``values[a]`` (in
    :func:`_values`' order; each one a number, or an array of them for many tiles), ``template``'s elsewhere:
    input dimensions past the output's rank, and the parameter shards' but along the channel axis."""
    axes = len(values)
    taken = [1] * axes          # per axis, the next value: the output's comes first
    inputs = []
    for shape in template.inputs:
        dims = []
        for d, extent in enumerate(shape):
            if d < axes:
                dims.append(values[d][taken[d]])
                taken[d] += 1
            else:
                dims.append(extent)
        inputs.append(tuple(dims))
    params = template.params
    if axes > 1:
        params = tuple((name, _with(shape, OPS[template.op].param_axis(name), values[1][taken[1] + j]))
                       for j, (name, shape) in enumerate(params))
    return TileShape(template.op, attrs, tuple(inputs), tuple(v[0] for v in values), params, template.input_grad,
                     template.backward)


def _with(shape, axis, extent):
    return tuple(shape[:axis]) + (extent,) + tuple(shape[axis + 1:])


def _combined_attrs(kinds):
    """The attributes of :func:`combine`'s tile: a strided read along a spatial axis changes the stride along it,
    which the kind of part along that axis gives."""
    attrs = kinds[0].attrs
    if len(kinds) > 2 and any(kind.attrs != attrs for kind in kinds[2:]):
        stride = tuple(dict(kind.attrs)["stride"][axis] for axis, kind in enumerate(kinds[2:]))
        attrs = tuple((k, stride if k == "stride" else v) for k, v in attrs)
    return attrs


def distinct_parts(layer, in_shapes, axis, extent, degree):
    """The indices of the parts of ``layer``'s output along ``axis`` (``extent`` split ``degree`` ways) whose tiles
    may differ in what they read (``in_shapes``: the inputs' global shapes, batch first): every channel part of a
    concat (they read different inputs); for a transposed convolution or an upsampling along a spatial axis, one
    part per distinct size and count of inputs read (they pad nothing, so their stride's alignment and the
    tensor's edges, however far a halo reaches, change what a part reads, not only its size); else
    :func:`candidates`."""
    if layer.spec.reads == READS_CHANNEL_PARTS and axis == 1:
        return range(degree)
    if layer.spec.reads in (READS_TRANSPOSED, READS_INTERPOLATED) and axis >= 2:
        return _distinct(extent, degree, lambda o0, o1: spatial_reach(layer, axis, o0, o1, in_shapes[0][axis]))
    return candidates(extent, degree, edges=layer.spec.window and axis >= 2)


def _distinct(extent, degree, reach):
    """The first part of each distinct (size, extent read) of ``extent`` split ``degree`` ways, ``reach(o0, o1)``
    the range a part reads."""
    chosen, seen = [], set()
    for index in range(degree):
        o0, o1 = part(extent, degree, index)
        lo, hi = reach(o0, o1)
        if (o1 - o0, hi - lo) not in seen:
            seen.add((o1 - o0, hi - lo))
            chosen.append(index)
    return chosen


def candidates(extent, degree, edges):
    """Parts that may differ in what their tiles read: one of each size (balanced parts have one size, or two
    when ``degree`` does not divide ``extent``, and what a tile reads depends on its part's size) and, with
    ``edges`` (a window's rows or columns), the first and the last part too. Those meet the padding and the
    tensor's edge; their padded reads still have the extent their size fixes, so this is a guard, not a need."""
    count = 1 if extent % degree == 0 else 2
    if not edges and count == 1:
        return [0]
    chosen, sizes = {0, degree - 1} if edges else set(), set()
    for index in range(1, degree - 1) if edges else range(degree):
        lo, hi = part(extent, degree, index)
        if hi - lo not in sizes:
            sizes.add(hi - lo)
            chosen.add(index)
            if len(sizes) == count:
                break
    return sorted(chosen)


def tile_shape(layer, box, needs):
    """The :class:`TileShape` of the tile of ``layer`` with output ``box`` reading ``needs``."""
    a, window = layer.attrs, layer.spec.window
    inputs = []
    for need in needs:
        shape = _extents(need.box, need.steps)
        if window:
            shape = shape[:2] + padded_extents(shape[2:], need.pads)
        inputs.append(shape)
    attrs = ()              # (key, value) pairs sorted by key
    attrs = tuple((key, _tuple(a[key])) for key in layer.spec.tile_attrs)
    if window:
        geometry = layer.window
        attrs += (("dilation", geometry.dilation), ("kernel", geometry.kernel),
                  ("stride", needs[0].stride(geometry.stride)))
    attrs = tuple(sorted(attrs))
    if layer.spec.statistics == STATISTICS_GROUPS:      # channels per group: the tile's groups, whatever its channels
        attrs = tuple(sorted(attrs + (("group_channels", group_channels(layer)),)))
    channels = box[1] if len(box) > 1 else (0, 1)
    params = tuple((name, layer.shard_shape(name, channels)) for name in layer.params)
    return TileShape(layer.op, attrs, tuple(inputs), _extents(box), params, layer.input_grad, layer.needs_grad)


def _extents(box, steps=None):
    """``shape_of(box, steps)``, quicker for a box read densely."""
    if steps is None:
        return tuple([stop - start if stop > start else 0 for start, stop in box])
    return shape_of(box, steps)
