"""Redistribution between a layer's producers and its tiles, and its adjoint.

Forward: every rank assembles the input box each of its tiles needs from the intersections with the producer
tiles: local pieces are copied (or, when one local producer tile covers the whole box, passed on as a view,
without a copy), remote ones arrive by message. Backward is the adjoint: the gradient of each needed box goes
back along the same intersections and is *added* into the producer tile's gradient.

The schedule comes from the plan, identically on every rank, so message sizes are never exchanged. Posting
order is fixed: all receives, then all sends, then one wait, so no plan can deadlock. A message's tag is its
input slot; messages between the same pair of ranks with the same tag are matched in the order they are sent,
so consecutive exchanges cannot mix up. The world's transport (:mod:`.transport`) moves the bytes: host
buffers, device buffers, or NCCL.
"""

import time

import numpy as np

from ..tiling.boxes import packed, relative, shape_of

TAG_BASE = 100


def _add_into(target, source):
    """``target += source``, on any array module."""
    target += source


class Exchange:
    """The part of one layer's redistribution that concerns this rank.

    ``transfers``: the layer's :class:`~spmdcnn.tiling.transfers.Transfer` list (the same on every rank).
    ``accumulate(target, source)`` adds ``source`` into ``target`` in place in the adjoint; by default
    ``target += source``. comm/ knows no GPU kernels: the runtime passes :func:`spmdcnn.ops.add.accumulate`,
    which on the GPU sums bfloat16 in float32.
    """

    def __init__(self, world, transfers, dtype, xp=np, accumulate=None):
        self.world, self.dtype, self.xp = world, np.dtype(dtype), xp
        self.accumulate = _add_into if accumulate is None else accumulate
        me = world.rank
        self.recvs = [t for t in transfers if t.dst == me and t.src != me]
        self.sends = [t for t in transfers if t.src == me and t.dst != me]
        self.local = [t for t in transfers if t.src == me and t.dst == me]
        incoming = {}
        for t in transfers:
            if t.dst == me:
                incoming.setdefault(t.slot, []).append(t)
        outgoing = {}
        for t in transfers:
            if t.src == me:
                outgoing.setdefault(t.slot, []).append(t)
        # forward without a copy: one local producer tile covers the whole needed box
        self.view_in = {slot: ts[0] for slot, ts in incoming.items()
                        if len(ts) == 1 and ts[0].src == me and ts[0].box == ts[0].dst_box}
        # backward without a copy: the whole producer tile's gradient is one local needed box's
        self.view_out = {slot: ts[0] for slot, ts in outgoing.items()
                         if len(ts) == 1 and ts[0].dst == me and ts[0].box == ts[0].src_box and not ts[0].steps}
        # the index expressions of every transfer, computed once: the schedule is the same at every step
        self._in_producer = {id(t): relative(t.box, t.src_box, t.steps) for t in transfers if t.src == me}
        self._in_needed = {id(t): packed(t.box, t.dst_box, t.steps) for t in transfers if t.dst == me}
        self._box_shape = {id(t): shape_of(t.box, t.steps) for t in self.sends}
        self._view_out = {slot: packed(t.box, t.dst_box) for slot, t in self.view_out.items()}
        self._need_shapes = {}

    @property
    def remote(self):
        return bool(self.recvs or self.sends)

    def forward(self, sources, needs):
        """Assemble this rank's input boxes.

        ``sources``: ``{slot: array}`` this rank's producer tiles; ``needs``: ``{slot: Need}`` what its tile
        reads. Returns ``{slot: array of the needed box}`` (compact where the need is strided).
        """
        start = time.perf_counter()
        comm, xp = self.world.comm, self.xp
        inputs = {}
        for slot, need in needs.items():
            if slot in self.view_in:
                t = self.view_in[slot]
                inputs[slot] = sources[slot][self._in_producer[id(t)]]
                if t.steps:     # a compact copy: the layer may keep it for backward, not the whole producer tile
                    inputs[slot] = xp.ascontiguousarray(inputs[slot])
            else:
                if slot not in self._need_shapes:
                    self._need_shapes[slot] = shape_of(need.box, need.steps)
                inputs[slot] = xp.empty(self._need_shapes[slot], dtype=self.dtype)
        if not (self.recvs or self.sends or self.local):
            return inputs
        transport = self.world.transport
        recvs, sends, arrived = [], [], []
        for t in self.recvs:
            target = inputs[t.slot][self._in_needed[id(t)]]
            # a contiguous part of the input (a range of samples, say) is received in place
            buffer = transport.recv_buffer(target)
            recvs.append((buffer, t.src, TAG_BASE + t.slot))
            if buffer is not target:
                arrived.append((target, buffer))
        for t in self.sends:
            sends.append((transport.send_buffer(sources[t.slot][self._in_producer[id(t)]]), t.dst,
                          TAG_BASE + t.slot))
        for t in self.local:
            if t.slot not in self.view_in:
                inputs[t.slot][self._in_needed[id(t)]] = sources[t.slot][self._in_producer[id(t)]]
        if recvs or sends:
            transport.exchange(comm, recvs, sends)
        for target, buffer in arrived:
            target[...] = xp.asarray(buffer)
        outgoing = [buffer for buffer, _, _ in sends]
        self._account(start, sum(b.nbytes for b in outgoing))
        return inputs

    def adjoint(self, grads, tiles, slots):
        """Sum the gradients of the needed boxes back into the producer tiles.

        ``grads``: ``{slot: gradient of this rank's needed box}``; ``tiles``: ``{slot: box of this rank's producer
        tile}``; ``slots``: the inputs that need a gradient. Returns ``{slot: gradient of this rank's producer
        tile}`` for the slots in ``slots`` where this rank holds a producer tile.
        """
        start = time.perf_counter()
        comm, xp = self.world.comm, self.xp
        transport = self.world.transport
        recvs, sends, arrived = [], [], []
        for t in self.sends:               # the forward's sends come back
            if t.slot in slots:
                buffer = transport.recv_buffer(xp.empty(self._box_shape[id(t)], dtype=self.dtype))
                recvs.append((buffer, t.dst, TAG_BASE + t.slot))
                arrived.append((t, buffer))
        for t in self.recvs:
            if t.slot in slots:
                sends.append((transport.send_buffer(grads[t.slot][self._in_needed[id(t)]]), t.src,
                              TAG_BASE + t.slot))
        outgoing = [buffer for buffer, _, _ in sends]
        result = {}
        for slot, box in tiles.items():
            if slot not in slots:
                continue
            if slot in self.view_out:
                result[slot] = grads[slot][self._view_out[slot]]
            else:
                result[slot] = xp.zeros(shape_of(box), dtype=self.dtype)
        for t in self.local:
            if t.slot in slots and t.slot not in self.view_out:
                self.accumulate(result[t.slot][self._in_producer[id(t)]], grads[t.slot][self._in_needed[id(t)]])
        if recvs or sends:
            transport.exchange(comm, recvs, sends)
        for t, buffer in arrived:
            self.accumulate(result[t.slot][self._in_producer[id(t)]], xp.asarray(buffer))
        self._account(start, sum(b.nbytes for b in outgoing))
        return result

    def _account(self, start, sent):
        if self.remote:
            self.world.counters.transfer_s += time.perf_counter() - start
            self.world.counters.bytes_transferred += sent
