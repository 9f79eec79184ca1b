"""How :meth:`~spmdcnn.cost.transfer.EdgeTraffic.table` lays out two lists of configurations (their degrees, padded
to the tensor's rank) on a machine's nodes: dimensions in groups (pairs; :class:`_Group`), each group's table of
overlaps indexed by the tiles of every degree combination of either side, each configuration's tiles per node as
boxes of tile indices (:func:`tile_boxes`), and the lookups of each device of each configuration against every
configuration of the other side (:class:`_Side`), in chunks of about ``CHUNK`` devices times pairs. It depends on
the degrees and the node size alone, so it is kept (:func:`layout_of`) for every edge with the same lists.
"""

import functools
from dataclasses import dataclass
from math import prod

import numpy as np


CHUNK = 1 << 14          # devices times configuration pairs per step of EdgeTraffic.table
KEPT = 1 << 20           # the most of them whose lookups a layout keeps


def _pairs_of_axes(rank):
    """The dimensions in groups of two consecutive ones (the last alone when ``rank`` is odd)."""
    return [tuple(range(k, min(k + 2, rank))) for k in range(0, rank, 2)]


@functools.lru_cache(maxsize=16)
def layout_of(rows, cols, per_node):
    """The :class:`_Layout` of producer degrees ``rows`` and consumer degrees ``cols`` (tuples), kept."""
    return _Layout(np.array(rows, dtype=np.int64).reshape(len(rows), -1),
                   np.array(cols, dtype=np.int64).reshape(len(cols), -1), per_node)


class _Layout:
    """What :meth:`EdgeTraffic.table` needs of the configuration lists alone (degrees ``rows`` of the producers,
    ``cols`` of the consumers, padded to the tensor's rank) and the node size: the groups of dimensions, and for
    each side (0: producers, 1: consumers) its configurations in chunks and how many boxes of the other side's
    tiles a node holds at most. ``per_node`` None: every configuration fits on one node."""

    def __init__(self, rows, cols, per_node):
        count = int(max(rows.prod(axis=1).max(), cols.prod(axis=1).max()))
        self.per_node = per_node if count > per_node else None
        node = self.per_node or count
        pad = -(-count // node) * node                  # devices, in whole nodes
        boxes = [_node_boxes(d, node, pad) if self.per_node else None for d in (rows, cols)]
        self.groups = [_Group(axes, rows, cols, pad, self.per_node, boxes)
                       for axes in _pairs_of_axes(rows.shape[1])]
        self.chunks = [_chunks(rows, node, pad, len(cols)), _chunks(cols, node, pad, len(rows))]
        self.boxes = [0 if b is None else b.shape[2] for b in reversed(boxes)]
        self._indices = {} if len(rows) * pad * len(cols) <= KEPT else None

    def indices(self, side, number):
        """Per group, the lookups of chunk ``number`` of ``side`` (:meth:`_Side.indices`), kept when small."""
        key = (side, number)
        if self._indices is not None and key in self._indices:
            return self._indices[key]
        found = [group.sides[side].indices(*self.chunks[side][number]) for group in self.groups]
        if self._indices is not None:
            self._indices[key] = found
        return found


def _chunks(degrees, node, pad, others):
    """The configurations (rows of ``degrees``) in chunks of about ``CHUNK`` devices times ``others``, each chunk
    of configurations whose tiles end below one node boundary ``reach``: ``[(indices, reach)]``."""
    reaches = np.minimum(-(-degrees.prod(axis=1) // node) * node, pad)
    chunks = []
    for reach in np.unique(reaches).tolist():
        members = np.flatnonzero(reaches == reach)
        step = max(1, CHUNK // (others * reach))
        chunks += [(members[i:i + step], reach) for i in range(0, len(members), step)]
    return chunks


class _Group:
    """A group of consecutive dimensions ``axes``. Its table's rows are the producer tiles of each degree
    combination in turn (a row of ``rows[j]`` per dimension: the row of the dimension's overlap table, degree by
    degree, then its zero row), its columns likewise the consumer tiles (``cols[j]``), and ``entries[j]`` is
    where each of its entries sits in the dimension's table, flat. With several nodes, the windows of consumer
    tiles (``send_lo``, ``send_hi``: per dimension, where each window's ends sit in the running sums along the
    dimension's rows) and of producer tiles (``recv_lo``, ``recv_hi``: along its columns). ``sides``: the
    producers' :class:`_Side`, the consumers'."""

    def __init__(self, axes, rows, cols, pad, per_node, boxes):
        self.axes = axes
        self.degrees = [np.unique(rows[:, k]) for k in axes]
        self.parts = [np.unique(cols[:, k]) for k in axes]
        row_kinds, row_kind = np.unique(rows[:, axes], axis=0, return_inverse=True)
        col_kinds, col_kind = np.unique(cols[:, axes], axis=0, return_inverse=True)
        row_tiles, row_starts = _tiles_of(row_kinds)
        col_tiles, col_starts = _tiles_of(col_kinds)
        self.row_starts, self.col_starts = row_starts[:-1], col_starts[:-1]
        self.rows = [np.append(_first(d, row_kinds[row_tiles[0], j]) + row_tiles[j + 1], d.sum())
                     for j, d in enumerate(self.degrees)]
        self.cols = [np.append(_first(e, col_kinds[col_tiles[0], j]) + col_tiles[j + 1], e.sum())
                     for j, e in enumerate(self.parts)]
        widths = [e.sum() + 1 for e in self.parts]           # of the dimensions' overlap tables
        self.entries = [r[:, None] * w + c for r, c, w in zip(self.rows, self.cols, widths)]
        row_pos = _positions(rows, axes, row_starts[row_kind.reshape(-1)], len(self.rows[0]) - 1, pad)
        col_pos = _positions(cols, axes, col_starts[col_kind.reshape(-1)], len(self.cols[0]) - 1, pad)
        self.send_lo = self.recv_lo = None
        windows = [None, None]
        if per_node:            # running sums: a zero column (row) first, so tile i's ends are i and i + 1
            lo, hi, windows[0] = _windows(boxes[1], cols, axes, self.parts)
            self.send_lo, self.send_hi = ([r[:, None] * (w + 1) + e for r, e, w in zip(self.rows, ends, widths)]
                                          for ends in (lo, hi))
            lo, hi, windows[1] = _windows(boxes[0], rows, axes, self.degrees)
            self.recv_lo, self.recv_hi = ([e[:, None] * w + c for c, e, w in zip(self.cols, ends, widths)]
                                          for ends in (lo, hi))
        node = np.arange(pad) // (per_node or pad)
        self.sides = (_Side(row_pos, col_kind.reshape(-1), len(col_kinds), col_pos, len(self.cols[0]), windows[0],
                            node),
                      _Side(col_pos, row_kind.reshape(-1), len(row_kinds), row_pos, len(self.rows[0]), windows[1],
                            node))


class _Side:
    """A group's table seen from one side: ``pos`` (n, pad) the rows of this side's tiles (the zero row past a
    configuration's tiles), ``kind`` each configuration of the other side's degree combination, ``other`` (pad,
    m) the columns of the other side's tiles (of ``width``), and with several nodes ``windows[k]`` (pad, m) the
    window holding box ``k`` of the other side's tiles on the node of device ``t``."""

    def __init__(self, pos, kind, kinds, other, width, windows, node):
        self.pos, self.kind, self.kinds, self.width = pos, kind, kinds, width
        self.other = np.ascontiguousarray(other.T)
        self.windows = [] if windows is None else [np.ascontiguousarray(windows[:, node, k].T)
                                                  for k in range(windows.shape[2])]
        self.count = 0 if windows is None else int(windows.max()) + 1

    def indices(self, chunk, reach):
        """Where the configurations ``chunk`` and their devices below ``reach`` look up, against every
        configuration of the other side: in the row sums, the table, the windows (one per box)."""
        rows = self.pos[chunk, :reach, None]                   # (n, reach, 1)
        return _Index(rows * self.kinds + self.kind, rows * self.width + self.other[:reach],
                      [rows * self.count + w[:reach] for w in self.windows])


@dataclass(frozen=True)
class _Index:
    sums: np.ndarray        # (n, reach, m)
    table: np.ndarray       # (n, reach, m)
    windows: list           # of (n, reach, m)


def _first(values, degrees):
    """Where the tiles of each of ``degrees`` begin when those of every value of ``values`` (sorted) come in
    turn."""
    return (np.cumsum(values) - values)[np.searchsorted(values, degrees)]


def _windows(boxes, degrees, axes, values):
    """The distinct windows of ``boxes`` (n, nodes, M, r, 2) over ``axes``: per dimension their ``lo`` and
    ``hi`` among the rows (or columns) of the dimension's overlap table (degree values ``values``), and each
    box's window ``(n, nodes, M)``."""
    ends = [_first(v, degrees[:, k])[:, None, None, None] + boxes[:, :, :, k] for k, v in zip(axes, values)]
    found, ids = np.unique(np.concatenate(ends, axis=3).reshape(-1, 2 * len(axes)), axis=0, return_inverse=True)
    return list(found[:, 0::2].T), list(found[:, 1::2].T), ids.reshape(boxes.shape[:3])


def _node_boxes(degrees, per_node, pad):
    """``(n, nodes, M, r, 2)``: each configuration's tiles on each node of ``per_node`` devices (devices
    ``0 .. pad-1``) as ``M`` boxes of tile indices, ``(lo, hi)`` per dimension; empty boxes fill in."""
    counts = degrees.prod(axis=1).tolist()
    found = [[tile_boxes(tuple(d), min(b * per_node, c), min((b + 1) * per_node, c)) for b in range(pad // per_node)]
             for d, c in zip(degrees.tolist(), counts)]
    most = max(1, max(len(boxes) for nodes in found for boxes in nodes))
    result = np.zeros((len(degrees), pad // per_node, most, degrees.shape[1], 2), dtype=np.int64)
    for i, nodes in enumerate(found):
        for b, boxes in enumerate(nodes):
            if boxes:
                result[i, b, :len(boxes)] = boxes
    return result


@functools.lru_cache(maxsize=4096)
def tile_boxes(degrees, start, stop):
    """The row-major tile indices ``[start, stop)`` of a configuration of ``degrees`` as boxes, ``(lo, hi)``
    per dimension: at most ``2 len(degrees) - 1`` of them."""
    if start >= stop:
        return ()
    if not degrees:
        return ((),)
    inner = prod(degrees[1:])           # tiles per index along the first dimension
    (first, x), (last, y) = divmod(start, inner), divmod(stop, inner)
    if first == last:
        return tuple(((first, first + 1),) + box for box in tile_boxes(degrees[1:], x, y))
    whole = first + (x > 0)
    head = tuple(((first, first + 1),) + box for box in tile_boxes(degrees[1:], x, inner)) if x else ()
    middle = (((whole, last),) + tuple((0, d) for d in degrees[1:]),) if last > whole else ()
    tail = tuple(((last, last + 1),) + box for box in tile_boxes(degrees[1:], 0, y))
    return head + middle + tail


def _tiles_of(kinds):
    """For degree combinations ``kinds`` (rows), all their tiles in turn: ``(index, starts)`` where ``index``
    holds the combination, then the tile's index along each dimension, and ``starts`` where each combination's
    tiles begin (and the total last)."""
    counts = kinds.prod(axis=1)
    starts = np.append(np.cumsum(counts) - counts, counts.sum())
    kind = np.repeat(np.arange(len(kinds)), counts)
    tile = np.arange(counts.sum()) - starts[kind]
    strides = np.cumprod(kinds[:, ::-1], axis=1)[:, ::-1] // kinds        # the product of the later degrees
    return np.vstack([kind, tile[None, :] // strides[kind].T % kinds[kind].T]), starts


def _positions(degrees, axes, starts, zero, pad):
    """``(n, pad)``: for each configuration (a row of ``degrees``) and tile ``t`` (row-major), ``starts`` of the
    configuration plus the tile's row-major index over the consecutive dimensions ``axes``; ``zero`` for ``t``
    past its tile count."""
    count = degrees.prod(axis=1)
    stride = degrees[:, axes[-1] + 1:].prod(axis=1)
    tile = np.arange(pad)[None, :]
    index = starts[:, None] + tile // stride[:, None] % degrees[:, axes].prod(axis=1)[:, None]
    return np.where(tile < count[:, None], index, zero)
