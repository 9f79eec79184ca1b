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
indices or a few (``layout.tile_boxes``), and what it keeps is a product of single entries. Dimensions go in pairs
(``cost/layout.py``), each pair with one table, so every quantity is a product of one lookup per pair.
"""

import functools
import operator
from dataclasses import dataclass
from itertools import product
from math import prod

import numpy as np

from ..tiling.boxes import full, part
from ..tiling.config import device_range, output_shape
from ..tiling.fields import needs as tile_needs
from .layout import layout_of


TABLED = 512      # devices from which one pair is quicker the tables' way (a lookup per device, not per tile pair)


@dataclass(frozen=True)
class Traffic:
    """One exchange (forward) between two configurations: its time and the bytes crossing devices."""

    seconds: float
    bytes: float


class EdgeTraffic:
    """Transfers along one edge: ``producer``'s output (global ``shape``) into input ``slot`` of ``consumer``."""

    def __init__(self, consumer, slot, shape, batch, itemsize, machine):
        self.consumer, self.slot, self.shape, self.batch = consumer, slot, tuple(shape), batch
        self.itemsize, self.machine = itemsize, machine
        self._ranges = {}
        self._overlaps = {}
        self._links = {}
        self._forward = {}
        self._axis_ranges = {}
        self._separable_result = None
        self._reads = {}
        self._reads_key = None

    def ranges(self, config):
        """``(start, stop, step)`` arrays of shape ``(ndim, Q)``: what each consumer tile reads of the tensor."""
        key = (config.degrees,)
        if key not in self._ranges:
            out_shape = output_shape(self.consumer, self.batch)
            if len(config.degrees) == len(out_shape) and self._separable():
                # a tile's range along a dimension is its part's (_separable): one read per part, not per tile
                index = np.array(list(config.indices())).reshape(-1, len(out_shape)).T
                whole = self._read(full(out_shape))
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
            if max(len(producer.devices), len(consumer.devices)) >= TABLED and self._tabled([producer], [consumer]):
                seconds, nbytes = self.table([producer], [consumer])
                self._forward[key] = Traffic(float(seconds[0, 0]), float(nbytes[0, 0]))
            else:
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
        return Traffic(float(busiest), float(remote.sum() * self.itemsize))

    # The table of every pair of configurations (the planner's edge costs).

    def table(self, producers, consumers, sample=None):
        """``(seconds, nbytes)``: two ``(len(producers), len(consumers))`` arrays holding :meth:`forward`'s
        ``seconds`` and ``bytes`` for every pair, computed for all pairs at once (module docstring). Lists with a
        configuration on other devices than ``0 .. count-1``, or a consumer whose reads do not go dimension by
        dimension, are done pair by pair.

        With ``sample`` (device numbers; device 0 is always added), only those devices are looked at: ``seconds``
        is then the busiest of them, at most the exchange's (a lower bound, for the planner's screening), and
        ``nbytes`` what they send."""
        producers, consumers = list(producers), list(consumers)
        rank = len(self.shape)
        if not self._tabled(producers, consumers):
            return self._table_by_pairs(producers, consumers)
        count = max(len(c.devices) for c in producers + consumers)
        tiers = self.machine.tiers(count)
        layout = layout_of(tuple(p.degrees for p in producers),
                           tuple(q.degrees + (1,) * (rank - len(q.degrees)) for q in consumers),
                           tuple(size for size, _ in tiers[:-1]),
                           None if sample is None else tuple(sorted({0, *map(int, sample)})))
        prices = [np.array([self.itemsize / link.bandwidth, link.latency]) for _, link in tiers]
        overlaps = {}       # this call's overlap tables (large on many devices; worker threads share self)
        numbers = [self._group_numbers(group, overlaps) if layout.sample is None else self._sampled_numbers(group)
                   for group in layout.groups]
        seconds, nbytes = np.empty((2, len(producers), len(consumers)))
        for number, (chunk, _) in enumerate(layout.chunks[0]):          # the producers' devices send
            seconds[chunk], nbytes[chunk] = self._busiest(layout, [n[0] for n in numbers], 0, number, prices)
        for number, (chunk, _) in enumerate(layout.chunks[1]):          # the consumers' devices receive
            received, _ = self._busiest(layout, [n[1] for n in numbers], 1, number, prices)
            seconds[:, chunk] = np.maximum(seconds[:, chunk], received.T)
        return seconds, nbytes

    def _tabled(self, producers, consumers):
        """Whether :meth:`table` can do ``producers`` against ``consumers`` all at once (module docstring)."""
        return bool(producers and consumers and _contiguous(producers, len(self.shape))
                    and _contiguous(consumers, len(output_shape(self.consumer, self.batch))) and self._separable())

    def reads_key(self, consumers):
        """What :meth:`table` depends on besides the producers, or None where it goes pair by pair: edges whose
        keys are equal have equal tables (a 1x1 convolution reads a tensor the same way whatever its channels).
        Kept for the last list asked about (the planner asks for each list several times)."""
        if self._reads_key is not None and self._reads_key[0] is consumers:
            return self._reads_key[1]
        key = self._new_reads_key(consumers)
        self._reads_key = (consumers, key)
        return key

    def _new_reads_key(self, consumers):
        out_shape = output_shape(self.consumer, self.batch)
        if not (consumers and _contiguous(consumers, len(out_shape)) and self._separable()):
            return None
        whole = self._read(full(out_shape))[len(out_shape):]
        reads = tuple(tuple((degree, tuple(map(tuple, self._axis_range(axis, degree))))
                            for degree in sorted({q.degrees[axis] for q in consumers}))
                      for axis in range(len(out_shape)))
        return self.shape, self.itemsize, tuple(whole), reads, tuple(q.degrees for q in consumers)

    def _table_by_pairs(self, producers, consumers):
        traffic = [[self._exchange(p, q) for q in consumers] for p in producers]
        shape = (len(producers), len(consumers))
        return (np.array([[t.seconds for t in row] for row in traffic]).reshape(shape),
                np.array([[t.bytes for t in row] for row in traffic]).reshape(shape))

    def _busiest(self, layout, numbers, side, number, prices):
        """``(seconds, nbytes)`` of the configurations of chunk ``number`` on ``side`` (0: the producers, whose
        devices send; 1: the consumers, whose devices receive) against every configuration of the other side:
        the time of their busiest device in that direction, and the bytes they send (side 0). Per device below
        ``reach``, arrays ``(n, device, other, 2)`` of elements and messages (nonzero entries), each a product
        over the groups of dimensions of one lookup: all it sends (receives), what of that stays in its block of
        each level (a sum over the block's boxes of the other side's tiles: its node, then its switches) and what
        stays on the device (with its own tile). What crosses a level's block but not the next one's goes at that
        level's ``prices`` (seconds per element and per message: the machine's tiers)."""
        levels = [[[] for _ in range(boxes[side])] for boxes in layout.boxes]
        total, kept = [], []
        for (table, sums, windows), index in zip(numbers, layout.indices(side, number)):
            total.append(np.take(sums, index.sums, axis=0))
            kept.append(np.take(table, index.table, axis=0))
            for boxes, level_windows, level_index in zip(levels, windows, index.windows):
                for factors, box in zip(boxes, level_index):
                    factors.append(np.take(level_windows, box, axis=0))
        total, kept = _product(total), _product(kept)
        kept = np.stack([kept, kept > 0], axis=-1)      # a product of overlaps is nonzero where every one is
        moved = (total[..., 0].sum(axis=1) - kept[..., 0].sum(axis=1)) * self.itemsize if side == 0 else None
        within = [kept] + [_product(map(_product, boxes), operator.iadd) for boxes in levels] + [total]
        seconds = None          # from exact differences of integers, in place, the outermost level first
        for level in reversed(range(len(within) - 1)):
            crossing = within[level + 1]
            crossing -= within[level]
            crossing *= prices[level]
            seconds = crossing if seconds is None else _product([seconds, crossing], operator.iadd)
        return (seconds[..., 0] + seconds[..., 1]).max(axis=1), moved

    def _group_numbers(self, group, overlaps):
        """The tables of one group of dimensions (:class:`_Group`), for the producers' side and for the
        consumers' (rows and columns swapped): ``(table, sums, windows)``, each flat with ``[elements, nonzero
        entries]`` along its last axis: the overlaps; their row sums per degree combination of the other side;
        their sums over the other side's windows, a list with one per level of blocks (none on one node)."""
        levels = len(group.send_ends)
        sends, receives = [[] for _ in range(levels)], [[] for _ in range(levels)]     # a factor per dimension
        for j, axis in enumerate(group.axes):
            found = self._overlap_table(axis, group.degrees[j], group.parts[j], overlaps)
            if levels:                      # a window [lo, hi) sums to the running sums' hi - lo
                across = [_running(x, 1).reshape(-1) for x in (found, found > 0)]
                down = [_running(x, 0).reshape(-1) for x in (found, found > 0)]
            for level in range(levels):
                sends[level].append(_window_sums(across, group.send_lo[level][j], group.send_hi[level][j]))
                receives[level].append(_window_sums(down, group.recv_lo[level][j], group.recv_hi[level][j]))
        table = self._group_table(group, overlaps)                                  # (rows, cols)
        nonzero = table > 0
        row_sums = np.stack([np.add.reduceat(x[:, :-1], group.col_starts, axis=1) for x in (table, nonzero)], -1)
        col_sums = np.stack([np.add.reduceat(x[:-1], group.row_starts, axis=0) for x in (table, nonzero)], -1)
        sends = [_product(factors) for factors in sends]                            # (rows, windows, 2)
        receives = [_product(factors).transpose(1, 0, 2) for factors in receives]   # (cols, windows, 2)
        table = table.reshape(-1)           # read the other way round from the consumers' side (layout's _Side)
        return [(table, _flat(sums), [_flat(x) for x in windows])
                for sums, windows in ((row_sums, sends), (col_sums.transpose(1, 0, 2), receives))]

    def _sampled_numbers(self, group):
        """:meth:`_group_numbers` where only a sample of devices is looked at: only the rows of the producer tiles
        those devices hold (``group.sampled_rows``) and the columns of the consumer tiles they hold
        (``sampled_cols``), in the sides' new numbering; every lookup of :meth:`_busiest` lands there. Each
        dimension's overlaps are worked out for those rows and columns alone, so the work grows with the tile
        count, not its square."""
        rows, cols = group.sampled_rows, group.sampled_cols
        levels = len(group.send_ends)
        block, every_col, every_row = [], [], []
        sends, receives = [[] for _ in range(levels)], [[] for _ in range(levels)]
        for j, axis in enumerate(group.axes):
            lines = self._overlap_lines(axis, group.degrees[j], group.parts[j], group.rows[j][rows], None)
            columns = self._overlap_lines(axis, group.degrees[j], group.parts[j], None, group.cols[j][cols])
            block.append(lines[:, group.cols[j][cols]])                         # (rows, cols): the kept
            every_col.append(lines[:, group.cols[j]])                           # (rows, all cols)
            every_row.append(columns[group.rows[j]])                            # (all rows, cols)
            if levels:
                both = np.stack([lines, lines > 0], axis=-1)                    # (rows, C + 1, 2)
                across = np.cumsum(np.concatenate([np.zeros_like(both[:, :1]), both], axis=1), axis=1)
                both = np.stack([columns, columns > 0], axis=-1)                # (R + 1, cols, 2)
                down = np.cumsum(np.concatenate([np.zeros_like(both[:1]), both], axis=0), axis=0)
            for level in range(levels):
                lo, hi = group.send_ends[level]
                sends[level].append(across[:, hi[j]] - across[:, lo[j]])        # (rows, windows, 2)
                lo, hi = group.recv_ends[level]
                receives[level].append(down[hi[j]] - down[lo[j]])               # (windows, cols, 2)
        block, every_col, every_row = _product(block), _product(every_col), _product(every_row)
        table = block.reshape(-1)           # read the other way round from the consumers' side (layout's _Side)
        row_sums = np.add.reduceat(np.stack([every_col, every_col > 0], axis=-1)[:, :-1], group.col_starts, axis=1)
        col_sums = np.add.reduceat(np.stack([every_row, every_row > 0], axis=-1)[:-1], group.row_starts, axis=0)
        send = [_product(factors) for factors in sends]                         # (rows, windows, 2)
        receive = [_product(factors).transpose(1, 0, 2) for factors in receives]    # (cols, windows, 2)
        return [(table, _flat(sums), [_flat(x) for x in windows])
                for sums, windows in ((row_sums, send), (col_sums.transpose(1, 0, 2), receive))]

    def _overlap_lines(self, axis, degrees, splits, rows, cols):
        """Rows ``rows`` (or columns ``cols``) of :meth:`_overlap_table` (which takes them all), worked out alone."""
        extent = self.shape[axis]
        degree = np.repeat(degrees, degrees)
        index = np.arange(len(degree)) - np.repeat(np.cumsum(degrees) - degrees, degrees)
        start, stop, step = (np.concatenate(a) for a in zip(*(self._axis_range(axis, e) for e in splits)))
        lo, hi = np.append(index * extent // degree, 0), np.append((index + 1) * extent // degree, 0)  # zero last
        start, stop, step = np.append(start, 0), np.append(stop, 0), np.append(step, 1)
        if rows is not None:
            return _inside(lo[rows], hi[rows], start, stop, step).astype(np.float64)
        return _inside(lo, hi, start[cols], stop[cols], step[cols]).astype(np.float64)

    def _group_table(self, group, overlaps):
        """``(rows, cols)``: the elements of the overlaps of one group of dimensions."""
        return _product([np.take(self._overlap_table(axis, group.degrees[j], group.parts[j], overlaps),
                                 group.entries[j]) for j, axis in enumerate(group.axes)])

    def _overlap_table(self, axis, degrees, splits, kept):
        """``(R + 1, C + 1)`` elements of consumer tile ranges (columns: ``splits[0]`` tiles, then ``splits[1]``,
        ...) inside producer parts (rows: the ``degrees[0]`` parts, then ...) along ``axis``; a zero row and
        column last. Kept in ``kept`` (one call's dict)."""
        key = (axis, tuple(degrees.tolist()), tuple(splits.tolist()))
        if key not in kept:
            kept[key] = self._overlap_lines(axis, degrees, splits, np.arange(degrees.sum() + 1), None)
        return kept[key]

    def _axis_range(self, axis, degree):
        """``(start, stop, step)``, arrays of length ``degree``: what the consumer tiles read of the tensor along
        ``axis`` when the consumer splits that dimension ``degree`` ways. Its other dimensions do not matter
        (``_separable``), so one read per part serves every dimension split as many ways."""
        if (axis, degree) not in self._axis_ranges:
            out_shape = output_shape(self.consumer, self.batch)
            split = [k for k, extent in enumerate(out_shape) if degree <= extent or k == axis]
            if split == [0] and degree > 1 and self._reads_samples():     # only the batch splits so many ways
                bounds = np.arange(degree + 1) * out_shape[0] // degree
                self._axis_ranges[0, degree] = (bounds[:-1], bounds[1:], np.ones(degree, dtype=np.int64))
                return self._axis_ranges[axis, degree]
            reads = [self._read(tuple(part(extent, degree, t) if k in split else (0, extent)
                                      for k, extent in enumerate(out_shape))) for t in range(degree)]
            for k in split if degree > 1 else range(len(self.shape)):
                self._axis_ranges.setdefault((k, degree), tuple(np.array(a) for a in zip(*(r[k] for r in reads))))
        return self._axis_ranges[axis, degree]

    def _reads_samples(self):
        """Whether a consumer tile reads exactly its own samples (every op does, ``tiling.fields.needs``): checked
        on the second half of the batch, so that :meth:`_axis_range` may skip reading part by part."""
        out_shape = output_shape(self.consumer, self.batch)
        lo, hi = part(out_shape[0], 2, 1)
        return self._read(((lo, hi),) + tuple((0, extent) for extent in out_shape[1:]))[0] == (lo, hi, 1)

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
            whole = self._read(full(out_shape))
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


def _running(values, axis):
    """Running sums of ``values`` (2-D) along ``axis`` from a zero first: window ``[lo, hi)`` sums to ``hi - lo``."""
    values = np.asarray(values, dtype=np.float64)
    padded = np.zeros((values.shape[0] + (axis == 0), values.shape[1] + (axis == 1)))
    np.cumsum(values, axis=axis, out=padded[1:] if axis == 0 else padded[:, 1:])
    return padded


def _window_sums(running, lo, hi):
    """``(..., 2)``: the sums of the windows ``[lo, hi)`` (flat places) of the elements' and the nonzero entries'
    running sums."""
    return np.stack([np.take(r, hi) - np.take(r, lo) for r in running], axis=-1)


def _flat(numbers):
    """``numbers`` with ``[elements, nonzero entries]`` along the last axis, as rows of two."""
    return np.ascontiguousarray(numbers).reshape(-1, 2)


def _contiguous(configs, rank):
    """Whether every configuration has ``rank`` degrees and its tiles on devices ``0 .. count-1`` (the planner's
    share one tuple per count: found by identity, not item by item)."""
    return all(len(c.degrees) == rank and (c.devices is device_range(len(c.devices)) or
                                           c.devices == device_range(prod(c.degrees))) for c in configs)


def _product(factors, combine=operator.imul):
    """The product (or with ``operator.iadd`` the sum) of ``factors``, arrays freshly made: into the first."""
    return functools.reduce(combine, factors)
