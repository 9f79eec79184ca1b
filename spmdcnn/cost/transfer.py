"""``t_x``: the time to move a tensor between a producer's tiles and the input boxes its consumer's tiles read.

The runtime moves, for each (producer tile, consumer tile) pair on different devices, the intersection of the
producer tile with the consumer's needed box (``tiling.transfers``); backward sends the same boxes back. Here
the element counts of all those intersections come at once as a ``(P, Q)`` matrix (producer tiles by consumer
tiles): along each dimension of the producer's tensor the overlaps of its parts with every consumer tile's range
form a small matrix, and an intersection's volume is the product over dimensions. The exchange posts every
message at once, so a device's time is the sum over the messages it receives (latency plus bytes over the
link's bandwidth), or over those it sends, whichever is larger; the exchange lasts as long as its busiest device.
Forward and backward move the same bytes the other way: ``t_x`` is twice the forward time.

The planner needs that time for every pair of configurations of an edge: :meth:`EdgeTraffic.table` computes the
whole table at once. Its configurations put their tiles on devices ``0 .. count-1``, and along every dimension a
consumer tile's range depends only on the tile's own part of that dimension (receptive fields act dimension by
dimension; dimensions the consumer lacks are read whole). The counts matrix is then a Kronecker product of the
per-dimension overlap matrices, and so are its row and column sums and its numbers of nonzero entries. What a
device sends to (or receives from) its own node is such a sum over the node's tiles, which form one box of tile
indices or a few (``_boxes``), and what it keeps is a product of single entries. Dimensions go in pairs
(``_pairs_of_axes``), each pair with one table, so every quantity is a product of one lookup per pair.
"""

import functools
import operator
from dataclasses import dataclass
from itertools import product
from math import prod

import numpy as np

from ..tiling.boxes import part
from ..tiling.config import output_shape
from ..tiling.fields import needs as tile_needs


@dataclass(frozen=True)
class Traffic:
    """One exchange (forward) between two configurations: its time and the bytes crossing devices."""

    seconds: float
    bytes: float
    messages: int


class EdgeTraffic:
    """Transfers along one edge: ``producer``'s output (global ``shape``) into input ``slot`` of ``consumer``."""

    def __init__(self, consumer, slot, shape, batch, itemsize, machine):
        self.consumer, self.slot, self.shape, self.batch = consumer, slot, tuple(shape), batch
        self.itemsize, self.machine = itemsize, machine
        self._ranges = {}
        self._overlaps = {}
        self._links = {}
        self._forward = {}
        self._tables = {}
        self._overlap_tables = {}
        self._axis_ranges = {}
        self._separable_result = None
        self._reads = {}

    def ranges(self, config):
        """``(start, stop, step)`` arrays of shape ``(ndim, Q)``: what each consumer tile reads of the tensor."""
        key = (config.degrees,)
        if key not in self._ranges:
            out_shape = output_shape(self.consumer, self.batch)
            if len(config.degrees) == len(out_shape) and self._separable():
                # a tile's range along a dimension is its part's (_separable): one read per part, not per tile
                index = np.array(list(config.indices())).reshape(-1, len(out_shape)).T
                whole = self._read(tuple((0, extent) for extent in out_shape))
                ranges = [np.array(self._axis_range(k, config.degrees[k]))[:, index[k]] if k < len(out_shape)
                          else np.repeat(np.array(whole[k])[:, None], index.shape[1], axis=1)
                          for k in range(len(self.shape))]
                self._ranges[key] = tuple(np.stack(ranges, axis=1))
            else:
                reads = [self._read(config.box(out_shape, index)) for index in config.indices()]
                # (Q, ndim, 3) -> three (ndim, Q) arrays
                self._ranges[key] = tuple(np.array(reads).transpose(2, 1, 0))
        return self._ranges[key]

    def overlap(self, axis, degree, config):
        """``(degree, Q)``: elements of consumer tile ``j``'s range along ``axis`` inside producer part ``i``."""
        key = (axis, degree, config.degrees)
        if key not in self._overlaps:
            start, stop, step = (a[axis] for a in self.ranges(config))
            bounds = np.arange(degree + 1) * self.shape[axis] // degree
            self._overlaps[key] = _inside(bounds[:-1], bounds[1:], start, stop, step)
        return self._overlaps[key]

    def counts(self, producer, consumer):
        """``(P, Q)`` elements each producer tile sends to each consumer tile."""
        result = np.ones((1,) * len(self.shape) + (len(consumer.devices),))
        for axis, degree in enumerate(producer.degrees):
            factor = self.overlap(axis, degree, consumer)
            shape = [1] * len(self.shape) + [factor.shape[1]]
            shape[axis] = degree
            result = result * factor.reshape(shape)
        return result.reshape(len(producer.devices), len(consumer.devices))

    def links(self, producer, consumer):
        """Seconds per byte, latency, and whether the devices differ, between every producer and consumer tile."""
        key = (producer.devices, consumer.devices)
        if key not in self._links:
            count = max(max(producer.devices), max(consumer.devices)) + 1
            inverse, latency = self.machine.matrices(count)
            index = np.ix_(producer.devices, consumer.devices)
            remote = np.array(producer.devices)[:, None] != np.array(consumer.devices)[None, :]
            self._links[key] = inverse[index], latency[index], remote
        return self._links[key]

    def forward(self, producer, consumer):
        """The :class:`Traffic` of one forward exchange between configurations ``producer`` and ``consumer``
        (kept: plans repeat the same pairs along a network)."""
        key = (producer.degrees, producer.devices, consumer.degrees, consumer.devices)
        if key not in self._forward:
            self._forward[key] = self._exchange(producer, consumer)
        return self._forward[key]

    def _exchange(self, producer, consumer):
        counts = self.counts(producer, consumer)
        inverse, latency, other = self.links(producer, consumer)
        remote = counts * other
        seconds = remote * (self.itemsize * inverse) + latency * (remote > 0)
        send, recv = seconds.sum(axis=1), seconds.sum(axis=0)
        # a device holding a producer tile and a consumer tile both sends and receives: its busiest direction
        busiest = max(send.max(initial=0), recv.max(initial=0))
        return Traffic(float(busiest), float(remote.sum() * self.itemsize), int((remote > 0).sum()))

    # The table of every pair of configurations (the planner's edge costs).

    def table(self, producers, consumers):
        """``(seconds, nbytes)``: two ``(len(producers), len(consumers))`` arrays holding :meth:`forward`'s
        ``seconds`` and ``bytes`` for every pair, computed for all pairs at once (module docstring). Lists with a
        configuration on other devices than ``0 .. count-1``, or a consumer whose reads do not go dimension by
        dimension, are done pair by pair."""
        producers, consumers = list(producers), list(consumers)
        rank = len(self.shape)
        if not (producers and consumers and _contiguous(producers, rank)
                and _contiguous(consumers, len(output_shape(self.consumer, self.batch))) and self._separable()):
            return self._table_by_pairs(producers, consumers)
        layout = _layout(tuple(p.degrees for p in producers),
                         tuple(q.degrees + (1,) * (rank - len(q.degrees)) for q in consumers),
                         self.machine.devices_per_node)
        numbers = [self._group_numbers(group) for group in layout.groups]
        seconds, nbytes = np.empty((2, len(producers), len(consumers)))
        for number, (chunk, _) in enumerate(layout.chunks[0]):          # the producers' devices send
            seconds[chunk], nbytes[chunk] = self._busiest(layout, [n[0] for n in numbers], 0, number)
        for number, (chunk, _) in enumerate(layout.chunks[1]):          # the consumers' devices receive
            received, _ = self._busiest(layout, [n[1] for n in numbers], 1, number)
            seconds[:, chunk] = np.maximum(seconds[:, chunk], received.T)
        return seconds, nbytes

    def reads_key(self, consumers):
        """What :meth:`table` depends on besides the producers, or None where it goes pair by pair: edges whose
        keys are equal have equal tables (a 1x1 convolution reads a tensor the same way whatever its channels)."""
        out_shape = output_shape(self.consumer, self.batch)
        if not (consumers and _contiguous(consumers, len(out_shape)) and self._separable()):
            return None
        whole = self._read(tuple((0, extent) for extent in out_shape))[len(out_shape):]
        reads = tuple(tuple((degree, tuple(map(tuple, self._axis_range(axis, degree))))
                            for degree in sorted({q.degrees[axis] for q in consumers}))
                      for axis in range(len(out_shape)))
        return self.shape, self.itemsize, tuple(whole), reads, tuple(q.degrees for q in consumers)

    def _table_by_pairs(self, producers, consumers):
        traffic = [[self._exchange(p, q) for q in consumers] for p in producers]
        shape = (len(producers), len(consumers))
        return (np.array([[t.seconds for t in row] for row in traffic]).reshape(shape),
                np.array([[t.bytes for t in row] for row in traffic]).reshape(shape))

    def _busiest(self, layout, numbers, side, number):
        """``(seconds, nbytes)`` of the configurations of chunk ``number`` on ``side`` (0: the producers, whose
        devices send; 1: the consumers, whose devices receive) against every configuration of the other side:
        the time of their busiest device in that direction, and the bytes they send (side 0). Per device below
        ``reach``, arrays ``(n, device, other, 2)`` of elements and messages (nonzero entries), each a product
        over the groups of dimensions of one lookup: all it sends (receives), what of that stays on its node (a
        sum over the node's boxes of the other side's tiles) and what stays on the device (with its own tile)."""
        total, kept, on_node = [], [], [[] for _ in range(layout.boxes[side])]
        for (table, sums, windows), index in zip(numbers, layout.indices(side, number)):
            total.append(np.take(sums, index.sums, axis=0))
            kept.append(np.take(table, index.table, axis=0))
            for factors, box in zip(on_node, index.windows):
                factors.append(np.take(windows, box, axis=0))
        total, kept = _product(total), _product(kept)
        intra, inter = self.machine.intra_node, self.machine.inter_node
        near = np.array([self.itemsize / intra.bandwidth, intra.latency])      # per element, per message
        far = np.array([self.itemsize / inter.bandwidth, inter.latency])
        moved = (total[..., 0].sum(axis=1) - kept[..., 0].sum(axis=1)) * self.itemsize if side == 0 else None
        if layout.per_node:         # seconds from exact differences of integers, in place
            on_node = _product(map(_product, on_node), operator.iadd)
            total -= on_node
            total *= far
            on_node -= kept
            on_node *= near
            total += on_node
        else:
            total -= kept
            total *= near
        return (total[..., 0] + total[..., 1]).max(axis=1), moved

    def _group_numbers(self, group):
        """The tables of one group of dimensions (:class:`_Group`), for the producers' side and for the
        consumers' (rows and columns swapped): ``(table, sums, windows)``, each flat with ``[elements, nonzero
        entries]`` along its last axis: the overlaps; their row sums per degree combination of the other side;
        their sums over the other side's windows (None on one node)."""
        sends, receives = [], []            # window sums, a factor per dimension
        for j, axis in enumerate(group.axes):
            overlaps = self._overlap_table(axis, group.degrees[j], group.parts[j])
            if group.send_lo:               # a window [lo, hi) sums to the running sums' hi - lo
                both = np.stack([overlaps, overlaps > 0], axis=-1)                  # (R + 1, C + 1, 2)
                across = np.cumsum(np.concatenate([np.zeros_like(both[:, :1]), both], axis=1), axis=1)
                down = np.cumsum(np.concatenate([np.zeros_like(both[:1]), both], axis=0), axis=0)
                across, down = across.reshape(-1, 2), down.reshape(-1, 2)
                sends.append(np.take(across, group.send_hi[j], axis=0) - np.take(across, group.send_lo[j], axis=0))
                receives.append(np.take(down, group.recv_hi[j], axis=0) - np.take(down, group.recv_lo[j], axis=0))
        both = self._group_table(group)                                             # (rows, cols, 2)
        row_sums = np.add.reduceat(both[:, :-1], group.col_starts, axis=1)          # (rows, col kinds, 2)
        col_sums = np.add.reduceat(both[:-1], group.row_starts, axis=0)             # (row kinds, cols, 2)
        sends = _product(sends) if sends else None                                  # (rows, windows, 2)
        receives = _product(receives) if receives else None                         # (windows, cols, 2)
        return [tuple(None if x is None else np.ascontiguousarray(x).reshape(-1, 2) for x in numbers)
                for numbers in ((both, row_sums, sends),
                                (both.transpose(1, 0, 2), col_sums.transpose(1, 0, 2),
                                 None if receives is None else receives.transpose(1, 0, 2)))]

    def _group_table(self, group):
        """``(rows, cols, 2)``: the elements of the overlaps of one group of dimensions, and whether nonzero."""
        if group not in self._tables:
            table = _product([np.take(self._overlap_table(axis, group.degrees[j], group.parts[j]), group.entries[j])
                              for j, axis in enumerate(group.axes)])
            self._tables[group] = np.stack([table, table > 0], axis=-1)
        return self._tables[group]

    def _overlap_table(self, axis, degrees, splits):
        """``(R + 1, C + 1)`` elements of consumer tile ranges (columns: ``splits[0]`` tiles, then ``splits[1]``,
        ...) inside producer parts (rows: the ``degrees[0]`` parts, then ...) along ``axis``; a zero row and
        column last."""
        key = (axis, tuple(degrees.tolist()), tuple(splits.tolist()))
        if key in self._overlap_tables:
            return self._overlap_tables[key]
        extent = self.shape[axis]
        degree = np.repeat(degrees, degrees)
        index = np.arange(len(degree)) - np.repeat(np.cumsum(degrees) - degrees, degrees)
        start, stop, step = (np.concatenate(a) for a in zip(*(self._axis_range(axis, e) for e in splits)))
        table = np.zeros((len(degree) + 1, len(start) + 1))
        table[:-1, :-1] = _inside(index * extent // degree, (index + 1) * extent // degree, start, stop, step)
        self._overlap_tables[key] = table
        return table

    def _axis_range(self, axis, degree):
        """``(start, stop, step)``, arrays of length ``degree``: what the consumer tiles read of the tensor along
        ``axis`` when the consumer splits that dimension ``degree`` ways. Its other dimensions do not matter
        (``_separable``), so one read per part serves every dimension split as many ways."""
        if (axis, degree) not in self._axis_ranges:
            out_shape = output_shape(self.consumer, self.batch)
            split = [k for k, extent in enumerate(out_shape) if degree <= extent or k == axis]
            reads = [self._read(tuple(part(extent, degree, t) if k in split else (0, extent)
                                      for k, extent in enumerate(out_shape))) for t in range(degree)]
            for k in split if degree > 1 else range(len(self.shape)):
                self._axis_ranges.setdefault((k, degree), tuple(np.array(a) for a in zip(*(r[k] for r in reads))))
        return self._axis_ranges[axis, degree]

    def _read(self, box):
        """``[(start, stop, step)]`` per dimension of the tensor: what the consumer's output ``box`` reads."""
        if box not in self._reads:
            in_shapes = [(self.batch,) + tuple(s) for s in self.consumer.in_shapes]
            need = tile_needs(self.consumer, box, in_shapes)[self.slot]
            steps = need.steps or (1,) * len(need.box)
            self._reads[box] = [(start, max(stop, start), step) for (start, stop), step in zip(need.box, steps)]
        return self._reads[box]

    def _separable(self):
        """Whether the consumer's reads go dimension by dimension (what :meth:`table` relies on), checked on
        every tile of the consumer's output split in two along each dimension: a tile's range along a dimension
        it has must be the one :meth:`_axis_range` gives its part, and along one it lacks (flatten, linear, the
        loss) the whole output's."""
        if self._separable_result is None:
            out_shape = output_shape(self.consumer, self.batch)
            result = len(out_shape) <= len(self.shape)
            whole = self._read(tuple((0, extent) for extent in out_shape))
            for index in (product(*(range(min(2, extent)) for extent in out_shape)) if result else ()):
                box = tuple(part(extent, min(2, extent), i) for extent, i in zip(out_shape, index))
                expected = [tuple(int(a[i]) for a in self._axis_range(k, min(2, extent)))
                            for k, (extent, i) in enumerate(zip(out_shape, index))]
                result = result and self._read(box) == expected + whole[len(out_shape):]
            self._separable_result = result
        return self._separable_result


def _inside(lo, hi, start, stop, step):
    """``(len(lo), len(start))``: elements of each range ``start, start + step, ... < stop`` inside each part
    ``[lo, hi)``."""
    count = -(-(stop - start) // step)

    def below(x):
        return np.clip(-(-(x[:, None] - start[None, :]) // step[None, :]), 0, count[None, :])
    return below(np.asarray(hi)) - below(np.asarray(lo))


def _contiguous(configs, rank):
    """Whether every configuration has ``rank`` degrees and its tiles on devices ``0 .. count-1``."""
    return all(len(c.degrees) == rank and c.devices == tuple(range(prod(c.degrees))) for c in configs)


CHUNK = 1 << 14          # devices times configuration pairs per step of EdgeTraffic.table
KEPT = 1 << 20           # the most of them whose lookups a layout keeps


def _pairs_of_axes(rank):
    """The dimensions in groups of two consecutive ones (the last alone when ``rank`` is odd)."""
    return [tuple(range(k, min(k + 2, rank))) for k in range(0, rank, 2)]


@functools.lru_cache(maxsize=16)
def _layout(rows, cols, per_node):
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


def _product(factors, combine=operator.imul):
    """The product (or with ``operator.iadd`` the sum) of ``factors``, arrays freshly made: into the first."""
    return functools.reduce(combine, factors)


def _node_boxes(degrees, per_node, pad):
    """``(n, nodes, M, r, 2)``: each configuration's tiles on each node of ``per_node`` devices (devices
    ``0 .. pad-1``) as ``M`` boxes of tile indices, ``(lo, hi)`` per dimension; empty boxes fill in."""
    counts = degrees.prod(axis=1).tolist()
    found = [[_boxes(tuple(d), min(b * per_node, c), min((b + 1) * per_node, c)) for b in range(pad // per_node)]
             for d, c in zip(degrees.tolist(), counts)]
    most = max(1, max(len(boxes) for nodes in found for boxes in nodes))
    result = np.zeros((len(degrees), pad // per_node, most, degrees.shape[1], 2), dtype=np.int64)
    for i, nodes in enumerate(found):
        for b, boxes in enumerate(nodes):
            if boxes:
                result[i, b, :len(boxes)] = boxes
    return result


@functools.lru_cache(maxsize=4096)
def _boxes(degrees, start, stop):
    """The row-major tile indices ``[start, stop)`` of a configuration of ``degrees`` as boxes, ``(lo, hi)``
    per dimension: at most ``2 len(degrees) - 1`` of them."""
    if start >= stop:
        return ()
    if not degrees:
        return ((),)
    inner = prod(degrees[1:])           # tiles per index along the first dimension
    (first, x), (last, y) = divmod(start, inner), divmod(stop, inner)
    if first == last:
        return tuple(((first, first + 1),) + box for box in _boxes(degrees[1:], x, y))
    whole = first + (x > 0)
    head = tuple(((first, first + 1),) + box for box in _boxes(degrees[1:], x, inner)) if x else ()
    middle = (((whole, last),) + tuple((0, d) for d in degrees[1:]),) if last > whole else ()
    tail = tuple(((last, last + 1),) + box for box in _boxes(degrees[1:], 0, y))
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
