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

from dataclasses import dataclass
from functools import lru_cache
from math import prod
from itertools import product

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
        self._axis_ranges = {}
        self._separable_result = None

    def ranges(self, config):
        """``(start, stop, step)`` arrays of shape ``(ndim, Q)``: what each consumer tile reads of the tensor."""
        key = (config.degrees,)
        if key not in self._ranges:
            in_shapes = [(self.batch,) + tuple(s) for s in self.consumer.in_shapes]
            out_shape = output_shape(self.consumer, self.batch)
            needs = [tile_needs(self.consumer, box, in_shapes)[self.slot]
                     for box in (config.box(out_shape, index) for index in config.indices())]
            start = np.array([[r[0] for r in need.box] for need in needs]).T
            stop = np.array([[r[1] for r in need.box] for need in needs]).T
            step = np.array([need.steps or (1,) * len(need.box) for need in needs]).T
            self._ranges[key] = (start, np.maximum(stop, start), step)
        return self._ranges[key]

    def overlap(self, axis, degree, config):
        """``(degree, Q)``: elements of consumer tile ``j``'s range along ``axis`` inside producer part ``i``."""
        key = (axis, degree, config.degrees)
        if key not in self._overlaps:
            start, stop, step = (a[axis] for a in self.ranges(config))
            extent = self.shape[axis]
            bounds = np.arange(degree + 1) * extent // degree
            count = -(-(stop - start) // step)

            def before(x):      # elements of the range below x
                return np.clip(-(-(x[:, None] - start[None, :]) // step[None, :]), 0, count[None, :])
            self._overlaps[key] = before(bounds[1:]) - before(bounds[:-1])
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
        """The :class:`Traffic` of one forward exchange between configurations ``producer`` and ``consumer``."""
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
        if not (producers and consumers and self._separable() and _contiguous(producers, rank)
                and _contiguous(consumers, len(output_shape(self.consumer, self.batch)))):
            return self._table_by_pairs(producers, consumers)
        layout = _layout(tuple(p.degrees for p in producers),
                         tuple(q.degrees + (1,) * (rank - len(q.degrees)) for q in consumers),
                         self.machine.devices_per_node)
        numbers = [self._group_numbers(group) for group in layout.groups]
        seconds, nbytes = np.empty((2, len(producers), len(consumers)))
        for chunk, reach in layout.chunks:
            seconds[chunk], nbytes[chunk] = self._exchange(layout, numbers, chunk, reach)
        return seconds, nbytes

    def _table_by_pairs(self, producers, consumers):
        traffic = [[self.forward(p, q) for q in consumers] for p in producers]
        shape = (len(producers), len(consumers))
        return (np.array([[t.seconds for t in row] for row in traffic]).reshape(shape),
                np.array([[t.bytes for t in row] for row in traffic]).reshape(shape))

    def _exchange(self, layout, numbers, chunk, reach):
        """``(seconds, nbytes)`` of the producers ``chunk`` (all with tiles below device ``reach``, a node
        boundary) against every consumer. Each quantity is ``(2, A, device, B)``: elements and messages
        (nonzero entries), a product over the groups of dimensions of one lookup each: what each device sends
        (``sent``) and receives (``got``) in all, within its node (``near_*``: a sum over the node's boxes),
        and keeps (``own``: the producer and the consumer tile it holds)."""
        sent = got = own = 1.0
        near_sent, near_got = [1.0] * layout.send_boxes, [1.0] * layout.recv_boxes
        for group, (table, row_sums, col_sums, send_windows, recv_windows) in zip(layout.groups, numbers):
            rows, cols = group.row_pos[chunk, :reach], group.col_pos[:reach]        # (A, reach), (reach, B)
            sent = sent * np.take(row_sums[:, rows], group.col_kind, axis=3)
            got = got * np.take(col_sums, group.row_kind[chunk], axis=1)
            own = own * np.take(table, rows[:, :, None] * group.width + cols, axis=1)
            if layout.per_node:
                near_sent = [x * np.take(send_windows, rows[:, :, None] * group.send_width + w[:reach], axis=1)
                             for x, w in zip(near_sent, group.send_windows)]
                near_got = [x * np.take(recv_windows, w[chunk, :reach, None] * group.width + cols, axis=1)
                            for x, w in zip(near_got, group.recv_windows)]
        intra, inter = self.machine.intra_node, self.machine.inter_node
        near = (self.itemsize / intra.bandwidth, intra.latency)
        far = (self.itemsize / inter.bandwidth, inter.latency) if layout.per_node else near

        def busy(total, kept_on_node, kept):        # seconds per device, from exact integer differences
            return sum(far[n] * (total[n] - kept_on_node[n]) + near[n] * (kept_on_node[n] - kept[n]) for n in (0, 1))
        if layout.per_node:
            near_sent, near_got = sum(near_sent), sum(near_got)
        else:
            near_sent, near_got = sent, got[:, :, :reach]
        recv = np.empty(got.shape[1:])
        recv[:, :reach] = busy(got[:, :, :reach], near_got, own)
        recv[:, reach:] = busy(got[:, :, reach:], (0, 0), (0, 0))
        seconds = np.maximum(busy(sent, near_sent, own).max(axis=1), recv.max(axis=1))
        return seconds, (sent[0].sum(axis=1) - own[0].sum(axis=1)) * self.itemsize

    def _group_numbers(self, group):
        """The tables of one group of dimensions (:class:`_Group`), each stacked ``[elements, nonzero entries]``:
        the overlaps, flat; their row sums per consumer kind; their column sums per producer kind at every
        consumer tile ``(2, kinds, pad, B)``; their sums over the consumer windows, flat; over the producer
        windows, flat."""
        table = send_windows = recv_windows = 1.0
        for j, axis in enumerate(group.axes):
            degrees, parts = group.degrees[j], group.parts[j]
            overlaps = self._overlap_table(axis, degrees, parts)
            overlaps = np.stack([overlaps, overlaps > 0])                          # (2, R + 1, C + 1)
            rows, cols = group.rows[j][:, None], group.cols[j][None, :]
            table = table * overlaps[:, rows, cols]
            if group.send_windows:          # sums over windows [lo, hi) of the tiles of one degree
                across = _prefix(overlaps, parts, axis=2)
                down = _prefix(overlaps, degrees, axis=1)
                send_windows = send_windows * (across[:, rows, group.send_hi[j]] - across[:, rows, group.send_lo[j]])
                recv_windows = recv_windows * (down[:, group.recv_hi[j][:, None], cols]
                                               - down[:, group.recv_lo[j][:, None], cols])
        row_sums = np.add.reduceat(table[:, :, :-1], group.col_starts, axis=2)
        col_sums = np.add.reduceat(table[:, :-1], group.row_starts, axis=1)[:, :, group.col_pos]
        windows = (send_windows.reshape(2, -1), recv_windows.reshape(2, -1)) if group.send_windows else (None, None)
        return (table.reshape(2, -1), row_sums, col_sums) + windows

    def _overlap_table(self, axis, degrees, splits):
        """``(R + 1, C + 1)`` elements of consumer tile ranges (columns: ``splits[0]`` tiles, then ``splits[1]``,
        ...) inside producer parts (rows: the ``degrees[0]`` parts, then ...) along ``axis``; a zero row and
        column last."""
        extent = self.shape[axis]
        degree = np.repeat(degrees, degrees)
        index = np.arange(len(degree)) - np.repeat(np.cumsum(degrees) - degrees, degrees)
        start, stop, step = (np.concatenate(a) for a in zip(*(self._axis_range(axis, e) for e in splits)))
        count = -(-(stop - start) // step)

        def before(x):      # elements of each range below x
            return np.clip(-(-(x[:, None] - start[None, :]) // step[None, :]), 0, count[None, :])
        table = np.zeros((len(degree) + 1, len(start) + 1))
        table[:-1, :-1] = before((index + 1) * extent // degree) - before(index * extent // degree)
        return table

    def _axis_range(self, axis, degree):
        """``(start, stop, step)``, arrays of length ``degree``: what the consumer tiles read of the tensor along
        ``axis`` when the consumer splits that dimension ``degree`` ways (its other dimensions do not matter)."""
        key = (axis, degree)
        if key not in self._axis_ranges:
            found = [self._read(self._split_box(axis, degree, t))[axis] for t in range(degree)]
            self._axis_ranges[key] = tuple(np.array(a) for a in zip(*found))
        return self._axis_ranges[key]

    def _split_box(self, axis, degree, index):
        """The consumer's whole output, but part ``index`` of ``degree`` along ``axis``."""
        out_shape = output_shape(self.consumer, self.batch)
        return tuple(part(extent, degree, index) if k == axis else (0, extent) for k, extent in enumerate(out_shape))

    def _read(self, box):
        """``[(start, stop, step)]`` per dimension of the tensor: what the consumer's output ``box`` reads."""
        in_shapes = [(self.batch,) + tuple(s) for s in self.consumer.in_shapes]
        need = tile_needs(self.consumer, box, in_shapes)[self.slot]
        steps = need.steps or (1,) * len(need.box)
        return [(start, max(stop, start), step) for (start, stop), step in zip(need.box, steps)]

    def _separable(self):
        """Whether the consumer's reads go dimension by dimension (what :meth:`table` relies on), checked on
        every tile of the consumer's output split in two along each dimension: a tile's range along a
        dimension it has must be that of the same part with the other dimensions whole, and along one it lacks
        (flatten, linear, the loss) the whole-output one."""
        if self._separable_result is None:
            out_shape = output_shape(self.consumer, self.batch)
            whole = self._read(tuple((0, extent) for extent in out_shape))
            result = len(out_shape) <= len(self.shape)
            for index in (product(*(range(min(2, extent)) for extent in out_shape)) if result else ()):
                box = tuple(part(extent, min(2, extent), i) for extent, i in zip(out_shape, index))
                expected = [self._read(self._split_box(k, min(2, out_shape[k]), i))[k] for k, i in enumerate(index)]
                result = result and self._read(box) == expected + whole[len(out_shape):]
            self._separable_result = result
        return self._separable_result


def _contiguous(configs, rank):
    """Whether every configuration has ``rank`` degrees and its tiles on devices ``0 .. count-1``."""
    return all(len(c.degrees) == rank and c.devices == tuple(range(int(np.prod(c.degrees)))) for c in configs)




def _pairs_of_axes(rank):
    """The dimensions in groups of two consecutive ones (the last alone when ``rank`` is odd)."""
    return [tuple(range(k, min(k + 2, rank))) for k in range(0, rank, 2)]


@lru_cache(maxsize=16)
def _layout(rows, cols, per_node):
    return _Layout(np.array(rows, dtype=np.int64).reshape(len(rows), -1),
                   np.array(cols, dtype=np.int64).reshape(len(cols), -1), per_node)


class _Layout:
    """What :meth:`EdgeTraffic.table` needs of the configuration lists alone (degrees ``rows`` of the producers,
    ``cols`` of the consumers, padded to the tensor's rank) and the node size: the groups of dimensions, the
    devices padded to whole nodes (``pad``), and the producers in chunks of equal tile count, each with the
    node boundary past its tiles. ``per_node`` None: every configuration fits on one node."""

    def __init__(self, rows, cols, per_node):
        counts = rows.prod(axis=1)
        count = int(max(counts.max(), cols.prod(axis=1).max()))
        self.per_node = per_node if count > per_node else None
        node = self.per_node or count
        self.pad = -(-count // node) * node
        send = _node_boxes(cols, node, self.pad) if self.per_node else None      # consumer tiles per node
        recv = _node_boxes(rows, node, self.pad) if self.per_node else None      # producer tiles per node
        self.send_boxes, self.recv_boxes = (0, 0) if send is None else (send.shape[2], recv.shape[2])
        self.groups = [_Group(axes, rows, cols, self.pad, self.per_node, send, recv)
                       for axes in _pairs_of_axes(rows.shape[1])]
        step = max(1, (1 << 19) // (len(cols) * self.pad))
        self.chunks = []
        for count in np.unique(counts).tolist():
            members = np.flatnonzero(counts == count)
            reach = count if self.per_node is None else min(self.pad, -(-count // node) * node)
            self.chunks += [(members[i:i + step], reach) for i in range(0, len(members), step)]


class _Group:
    """A group of consecutive dimensions ``axes``. Its table's rows are the producer tiles of each degree
    combination in turn (a row of ``rows[j]`` per dimension: the row of the dimension's overlap table, degree by
    degree, then its zero row), its columns likewise the consumer tiles (``cols[j]``). ``row_pos`` (A, pad) and
    ``col_pos`` (pad, B) place every tile (the zero row or column past a configuration's tiles); ``row_kind``,
    ``col_kind`` give each configuration's combination. With several nodes, ``send_windows[m]`` (pad, B) is the
    window (``send_lo``, ``send_hi``: columns of the dimensions' running sums) holding box ``m`` of the consumer
    tiles on device ``t``'s node, ``recv_windows[m]`` (A, pad) that of the producer tiles (``recv_lo``,
    ``recv_hi``: rows)."""

    def __init__(self, axes, rows, cols, pad, per_node, send, recv):
        self.axes = axes
        self.degrees = [np.unique(rows[:, k]) for k in axes]
        self.parts = [np.unique(cols[:, k]) for k in axes]
        kinds, row_kind = np.unique(rows[:, axes], axis=0, return_inverse=True)
        splits, col_kind = np.unique(cols[:, axes], axis=0, return_inverse=True)
        self.row_kind, self.col_kind = row_kind.reshape(-1), col_kind.reshape(-1)
        row_tiles, row_starts = _tiles_of(kinds)
        col_tiles, col_starts = _tiles_of(splits)
        self.row_starts, self.col_starts = row_starts[:-1], col_starts[:-1]
        self.rows = [np.append(_first(d, kinds[row_tiles[0], j]) + row_tiles[j + 1], d.sum())
                     for j, d in enumerate(self.degrees)]
        self.cols = [np.append(_first(e, splits[col_tiles[0], j]) + col_tiles[j + 1], e.sum())
                     for j, e in enumerate(self.parts)]
        self.width = len(self.cols[0])
        self.row_pos = _positions(rows, axes, row_starts[self.row_kind], len(self.rows[0]) - 1, pad)
        self.col_pos = _positions(cols, axes, col_starts[self.col_kind], self.width - 1, pad).T
        self.send_windows = self.recv_windows = ()
        if per_node:
            node = np.arange(pad) // per_node
            self.send_lo, self.send_hi, ids = _windows(send, cols, axes, self.parts)
            self.send_width = len(self.send_lo[0])
            self.send_windows = [ids[:, node, m].T for m in range(send.shape[2])]
            self.recv_lo, self.recv_hi, ids = _windows(recv, rows, axes, self.degrees)
            self.recv_windows = [ids[:, node, m] for m in range(recv.shape[2])]


def _first(values, degrees, extra=0):
    """Where the entries of each of ``degrees`` begin when every value of ``values`` (sorted) in turn takes
    ``value + extra`` entries."""
    sizes = values + extra
    return (np.cumsum(sizes) - sizes)[np.searchsorted(values, degrees)]


def _windows(boxes, degrees, axes, values):
    """The distinct windows of ``boxes`` (n, nodes, M, r, 2) over ``axes``: per dimension their ``lo`` and
    ``hi`` in the running sums (``_prefix``: ``value + 1`` entries per degree value of ``values``), and each
    box's window ``(n, nodes, M)``."""
    ends = [_first(v, degrees[:, k], 1)[:, None, None, None] + boxes[:, :, :, k] for k, v in zip(axes, values)]
    found, ids = np.unique(np.concatenate(ends, axis=3).reshape(-1, 2 * len(axes)), axis=0, return_inverse=True)
    return list(found[:, 0::2].T), list(found[:, 1::2].T), ids.reshape(boxes.shape[:3])


def _prefix(table, sizes, axis):
    """``table``'s running sums along ``axis`` within each block of ``sizes`` entries (its last, zero, entry left
    out), each block's led by a zero: ``size + 1`` entries per block."""
    blocks = np.split(np.take(table, np.arange(sizes.sum()), axis=axis), np.cumsum(sizes)[:-1], axis=axis)
    zero = np.zeros_like(np.take(table, [0], axis=axis))
    return np.concatenate([x for block in blocks for x in (zero, np.cumsum(block, axis=axis))], axis=axis)


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


@lru_cache(maxsize=4096)
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
