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
PAIR_ENTRIES = 1 << 22   # the most entries of a pair of dimensions' table (:func:`_groups_of_axes`)
SAMPLED_PAIR_ENTRIES = 1 << 20   # the same when a few devices are looked at (their lookups are few)


def _groups_of_axes(rows, cols, limit):
    """The dimensions in groups of two consecutive ones (the last alone when the rank is odd), a pair split in
    two where its table (every tile of every degree combination of either side) would hold more than
    ``limit`` entries: on many devices the pairs' tables grow as the square of the tile count, the lookups only
    twice."""
    rank, groups = rows.shape[1], []
    for k in range(0, rank, 2):
        axes = tuple(range(k, min(k + 2, rank)))
        tiles = [np.unique(side[:, axes], axis=0).prod(axis=1).sum() for side in (rows, cols)]
        groups += [axes] if len(axes) == 1 or tiles[0] * tiles[1] <= limit else [(k,), (k + 1,)]
    return groups


@functools.lru_cache(maxsize=16)
def layout_of(rows, cols, blocks, sample=None):
    """The :class:`_Layout` of producer degrees ``rows`` and consumer degrees ``cols`` (tuples) on a machine whose
    levels group ``blocks`` devices (a tuple, innermost first: a node's, then a switch's), kept; with ``sample``
    (a tuple of device numbers), only those devices are looked at."""
    return _Layout(np.array(rows, dtype=np.int64).reshape(len(rows), -1),
                   np.array(cols, dtype=np.int64).reshape(len(cols), -1), blocks, sample)


class _Layout:
    """What :meth:`EdgeTraffic.table` needs of the configuration lists alone (degrees ``rows`` of the producers,
    ``cols`` of the consumers, padded to the tensor's rank) and the machine's levels: the groups of dimensions,
    and for each side (0: producers, 1: consumers) its configurations in chunks and, per level, how many boxes of
    the other side's tiles one block of it holds at most (``boxes[level][side]``). ``blocks``: the devices of one
    block of each level that the configurations span, innermost first (a node's, then a switch's; the levels
    whose one block holds every tile are left out: empty when every configuration fits on one node).
    ``sample``: the devices looked at (None: all), in :meth:`devices`."""

    def __init__(self, rows, cols, blocks, sample=None):
        count = int(max(rows.prod(axis=1).max(), cols.prod(axis=1).max()))
        self.blocks = tuple(size for size in blocks if size < count)
        node = self.blocks[0] if self.blocks else count
        pad = -(-count // node) * node                  # devices, in whole nodes
        sample = None if sample is None else np.unique(np.array(sample, dtype=np.int64))
        self.sample = None if sample is None else sample[sample < pad]
        looked = np.arange(pad) if self.sample is None else self.sample      # the devices looked at
        levels = []                     # per level: (boxes of each side per block looked at, each device's block)
        for size in self.blocks:
            found = np.unique(looked // size)                                # the blocks looked at
            levels.append(([_node_boxes(d, size, pad, found) for d in (rows, cols)],
                           np.searchsorted(found, looked // size)))
        limit = PAIR_ENTRIES if sample is None else SAMPLED_PAIR_ENTRIES
        self.groups = [_Group(axes, rows, cols, looked, levels, self.sample is not None)
                       for axes in _groups_of_axes(rows, cols, limit)]
        self.chunks = [_chunks(rows, node, pad, len(cols), self.devices), _chunks(cols, node, pad, len(rows),
                                                                                self.devices)]
        self.boxes = [[b.shape[2] for b in reversed(boxes)] for boxes, _ in levels]
        self._indices = {} if len(rows) * len(looked) * len(cols) <= KEPT else None

    def indices(self, side, number):
        """Per group, the lookups of chunk ``number`` of ``side`` (:meth:`_Side.indices`), kept when small."""
        key = (side, number)
        if self._indices is not None and key in self._indices:
            return self._indices[key]
        chunk, reach = self.chunks[side][number]
        found = [group.sides[side].indices(chunk, self.devices(reach)) for group in self.groups]
        if self._indices is not None:
            self._indices[key] = found
        return found

    def devices(self, reach):
        """Where the devices looked at below ``reach`` are among those looked at: all (a slice), or those of the
        sample (an index array)."""
        return slice(0, reach) if self.sample is None else np.flatnonzero(self.sample < reach)


def _chunks(degrees, node, pad, others, devices):
    """The configurations (rows of ``degrees``) in chunks of about ``CHUNK`` devices looked at (``devices(reach)``)
    times ``others``, each chunk of configurations whose tiles end below one node boundary ``reach``:
    ``[(indices, reach)]``."""
    reaches = np.minimum(-(-degrees.prod(axis=1) // node) * node, pad)
    chunks = []
    for reach in np.unique(reaches).tolist():
        members = np.flatnonzero(reaches == reach)
        looked = len(range(reach)[devices(reach)]) if isinstance(devices(reach), slice) else devices(reach).size
        step = max(1, CHUNK // (others * max(1, looked)))
        chunks += [(members[i:i + step], reach) for i in range(0, len(members), step)]
    return chunks


class _Group:
    """A group of consecutive dimensions ``axes``. Its table's rows are the producer tiles of each degree
    combination in turn (a row of ``rows[j]`` per dimension: the row of the dimension's overlap table, degree by
    degree, then its zero row), its columns likewise the consumer tiles (``cols[j]``), and ``entries[j]`` is
    where each of its entries sits in the dimension's table, flat. Per level of blocks (nodes, switches), the
    windows of consumer tiles (``send_ends[level]``: per dimension, ``(lo, hi)`` of each window in the running
    sums along the dimension's rows; ``send_lo``, ``send_hi``: the same with the row) and of producer tiles
    (``recv_ends``, ``recv_lo``, ``recv_hi``: along its columns). ``sides``: the producers' :class:`_Side`, the
    consumers'. With ``sampled`` (a sample of the devices is looked at), the sides number the rows and columns
    of the tiles those devices hold anew, in the order of ``sampled_rows`` and ``sampled_cols``."""

    def __init__(self, axes, rows, cols, looked, levels, sampled=False):
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
        whole = not sampled     # the lookups into whole tables: not needed for a sample's (transfer's _sampled_numbers)
        self.entries = [r[:, None] * w + c for r, c, w in zip(self.rows, self.cols, widths)] if whole else None
        row_pos = _positions(rows, axes, row_starts[row_kind.reshape(-1)], len(self.rows[0]) - 1, looked)
        col_pos = _positions(cols, axes, col_starts[col_kind.reshape(-1)], len(self.cols[0]) - 1, looked)
        self.send_ends, self.send_lo, self.send_hi = [], [], []
        self.recv_ends, self.recv_lo, self.recv_hi = [], [], []
        windows = [[], []]      # per side, per level: (windows of each box, each device's block)
        for boxes, place in levels:     # running sums: a zero column (row) first, so tile i's ends are i and i + 1
            lo, hi, found = _windows(boxes[1], cols, axes, self.parts)
            self.send_ends.append((lo, hi))
            if whole:
                self.send_lo.append([r[:, None] * (w + 1) + e for r, e, w in zip(self.rows, lo, widths)])
                self.send_hi.append([r[:, None] * (w + 1) + e for r, e, w in zip(self.rows, hi, widths)])
            windows[0].append((found, place))
            lo, hi, found = _windows(boxes[0], rows, axes, self.degrees)
            self.recv_ends.append((lo, hi))
            if whole:
                self.recv_lo.append([e[:, None] * w + c for c, e, w in zip(self.cols, lo, widths)])
                self.recv_hi.append([e[:, None] * w + c for c, e, w in zip(self.cols, hi, widths)])
            windows[1].append((found, place))
        width = len(self.cols[0])
        self.sampled_rows = self.sampled_cols = None
        if sampled:             # only the tiles the devices looked at hold: their rows and columns, numbered anew
            self.sampled_rows, row_pos = _renumbered(row_pos)
            self.sampled_cols, col_pos = _renumbered(col_pos)
            width = len(self.sampled_cols)
        self.sides = (_Side(row_pos, col_kind.reshape(-1), len(col_kinds), col_pos, width, windows[0]),
                      _Side(col_pos, row_kind.reshape(-1), len(row_kinds), row_pos, width, windows[1], True))


class _Side:
    """A group's table seen from one side, at the devices looked at (all, or a sample): ``pos`` (n, looked) the
    rows of this side's tiles (the zero row past a configuration's tiles), ``kind`` each configuration of the
    other side's degree combination, ``other`` (looked, m) the columns of the other side's tiles (the table is
    the producers' rows by ``width`` consumers' columns, read the other way round from the consumers' side,
    ``flipped``),
    and per level ``windows[level][k]`` (looked, m) the window holding box ``k`` of the other side's tiles in the
    device's block of that level (``levels``: per level, each box's window per block looked at, and each
    device's place among those blocks), of ``counts[level]`` windows."""

    def __init__(self, pos, kind, kinds, other, width, levels, flipped=False):
        self.pos, self.kind, self.kinds, self.width, self.flipped = pos, kind, kinds, width, flipped
        self.other = np.ascontiguousarray(other.T)
        self.windows = [[np.ascontiguousarray(found[:, place, k].T) for k in range(found.shape[2])]
                        for found, place in levels]
        self.counts = [int(found.max()) + 1 for found, _ in levels]

    def indices(self, chunk, devices):
        """Where the configurations ``chunk`` and their ``devices`` (a slice or an index array) look up, against
        every configuration of the other side: in the row sums, the table, the windows (per level, one per
        box)."""
        rows = self.pos[chunk][:, devices, None]               # (n, devices, 1)
        other = self.other[devices]
        return _Index(rows * self.kinds + self.kind,
                      other * self.width + rows if self.flipped else rows * self.width + other,
                      [[rows * count + w[devices] for w in windows]
                       for count, windows in zip(self.counts, self.windows)])


@dataclass(frozen=True)
class _Index:
    sums: np.ndarray        # (n, reach, m)
    table: np.ndarray       # (n, reach, m)
    windows: list           # per level, of (n, reach, m)


def _first(values, degrees):
    """Where the tiles of each of ``degrees`` begin when those of every value of ``values`` (sorted) come in
    turn."""
    return (np.cumsum(values) - values)[np.searchsorted(values, degrees)]


def _windows(boxes, degrees, axes, values):
    """The distinct windows of ``boxes`` (n, nodes, M, r, 2) over ``axes``: per dimension their ``lo`` and
    ``hi`` among the rows (or columns) of the dimension's overlap table (degree values ``values``), and each
    box's window ``(n, nodes, M)``."""
    ends = [_first(v, degrees[:, k])[:, None, None, None] + boxes[:, :, :, k] for k, v in zip(axes, values)]
    found, ids = _unique_rows(np.concatenate(ends, axis=3).reshape(-1, 2 * len(axes)))
    return list(found[:, 0::2].T), list(found[:, 1::2].T), ids.reshape(boxes.shape[:3])


def _renumbered(positions):
    """``(found, renumbered)``: the distinct ``positions`` (sorted), and ``positions`` as places among them."""
    found, places = np.unique(positions, return_inverse=True)
    return found, places.reshape(positions.shape)


def _unique_rows(rows):
    """``np.unique(rows, axis=0, return_inverse=True)`` of small non-negative integers, each row read as one
    number (sorting numbers is many times quicker than sorting rows)."""
    radix = rows.max(axis=0) + 1
    if float(np.prod(radix.astype(float))) >= 2.0 ** 62:
        found, ids = np.unique(rows, axis=0, return_inverse=True)
        return found, ids.reshape(-1)
    weights = np.cumprod(np.append(radix[1:], 1)[::-1])[::-1]
    keys, ids = np.unique(rows @ weights, return_inverse=True)
    return keys[:, None] // weights % radix, ids.reshape(-1)


def _node_boxes(degrees, per_node, pad, nodes):
    """``(n, len(nodes), M, r, 2)``: each configuration's tiles on each of the blocks ``nodes`` (of ``per_node``
    devices: a node, or a switch's nodes; devices ``0 .. pad-1``) as ``M`` boxes of tile indices, ``(lo, hi)`` per
    dimension; empty boxes fill in."""
    counts = degrees.prod(axis=1).tolist()
    found = [[tile_boxes(tuple(d), min(b * per_node, c), min((b + 1) * per_node, c)) for b in nodes.tolist()]
             for d, c in zip(degrees.tolist(), counts)]
    most = max(1, max(len(boxes) for nodes in found for boxes in nodes))
    result = np.zeros((len(degrees), len(nodes), most, degrees.shape[1], 2), dtype=np.int64)
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


def _positions(degrees, axes, starts, zero, looked):
    """``(n, len(looked))``: for each configuration (a row of ``degrees``) and tile ``t`` among ``looked``
    (row-major), ``starts`` of the configuration plus the tile's row-major index over the consecutive dimensions
    ``axes``; ``zero`` for ``t`` past its tile count."""
    count = degrees.prod(axis=1)
    stride = degrees[:, axes[-1] + 1:].prod(axis=1)
    tile = looked[None, :]
    index = starts[:, None] + tile // stride[:, None] % degrees[:, axes].prod(axis=1)[:, None]
    return np.where(tile < count[:, None], index, zero)
