"""The cost of a plan as the runtime runs it: a timeline of one iteration (docs/architecture.md#the-timeline).

Every device runs the layers in order and waits at each exchange for the tiles it reads, so the compute lane is
shared: layer by layer, the slowest tile (``t_c``, its parameter update set aside), each edge's exchange, and
batchnorm's statistics (forward gather, backward sum) on the critical path. Forward, the loss's sum, then
backward in reverse order; a layer's backward readies the gradient buckets whose earliest layer it is
(:func:`spmdcnn.cost.buckets.assign`, the runtime's rule). Each device has a communication lane: its buckets'
allreduces, one after the other, each starting when it is ready (``overlap``) or when backward ends, and lasting
what the machine's allreduce regimes give its bytes over its group. After backward, a device updates the
parameters no bucket sums, then each bucket's once its sum is done; the iteration ends when the slowest device
has updated its last bucket.

On a machine of ``sync: parameter-server`` each layer's replica groups push its gradients to their servers
right after its backward, on the compute lane (the paper's runtime: Jia et al.'s ``t_s``), and each layer's pull
of the sum is a bucket of its own on the communication lane, started when the push is in; the compute lane is the
additive ``sum (t_c + t_s) + sum t_x`` of their section 5.1.

Backward is taken as twice forward for a layer with parameters whose input needs a gradient (three products of
the size of forward's), as long as forward for the others with a backward; a tile whose backward never runs is
all forward.
"""

from bisect import bisect_right
from dataclasses import dataclass, field, replace
from math import prod
from typing import NamedTuple

from ..graph.blocks import DATA
from ..tiling.boxes import part
from ..tiling.config import Devices, output_shape
from ..tiling.ghost import components
from .buckets import SyncOptions, assign


@dataclass
class BucketCost:
    """One bucket of one device: its group, bytes, the layers it holds and when its allreduce runs."""

    ranks: tuple
    nbytes: int
    layers: dict        # {layer: bytes of its gradients in the bucket}
    ready: str
    seconds: float = 0.0
    wait_s: float = 0.0         # what its group loses meeting (the ranks' drift), part of its allreduce
    start_s: float = 0.0
    end_s: float = 0.0
    exposed_s: float = 0.0


@dataclass
class Timeline:
    """The iteration of the slowest device (``rank``), with every device's end."""

    iteration_s: float
    backward_end_s: float
    rank: int
    buckets: list = field(default_factory=list)     # the slowest device's BucketCosts
    ends: list = field(default_factory=list)        # every device's end
    overhead_s: float = 0.0                         # the loss's sum after forward, its wait included
    served: bool = False                            # buckets are parameter servers' pulls (their pushes: sync)
    runtime_s: float = 0.0                          # the runtime's own work per step, measured (in iteration_s)

    @property
    def allreduce_s(self):
        """The slowest device's gradient allreduce time (the ranks' waits in them included), hidden or not."""
        return sum(b.seconds + b.wait_s for b in self.buckets)

    @property
    def exposed_s(self):
        return sum(b.exposed_s for b in self.buckets)


def forward_share(layer, backward):
    """The part of a tile's forward and backward time that is forward (module docstring)."""
    if not backward:
        return 1.0
    if layer.params and any(layer.input_grads):
        return 1.0 / 3.0
    return 0.5


def gradient_tensors(graph, plan, itemsize, ghost=None):
    """``[{group: [(layer, nbytes), ...]}]`` per device: the gradients it sums with other devices, per replica group,
    in layer order (each parameter tensor's shard of the rows its tile holds). Batchnorm sums its own, unless ghost
    batch norm (groups of ``ghost`` samples) splits its replica group into components."""
    tensors = [{} for _ in range(plan.devices)]
    interned = {}       # one object per group: each device's dict then finds it by identity, not item by item
    for layer in graph.layers:
        if not layer.params:
            continue
        config = plan[layer.name]
        sites = None
        if layer.spec.reduced_in_layer:
            if ghost is None:
                continue
            sites = components(config, output_shape(layer, plan.batch), ghost)
        c_degree = config.degrees[1] if len(config.degrees) > 1 else 1
        for index, group in config.replicas().items():
            if len(group) < 2 or (sites is not None and sites[group[0]].whole):    # whole: alike for the group
                continue
            channels = part(layer.out_shape[0], c_degree, index)
            sizes = [prod(layer.shard_shape(name, channels)) * itemsize for name in layer.params]
            ranks = Devices(sorted(group))      # hashed once, then looked up by each device below
            ranks = interned.setdefault(ranks, ranks)
            for rank in group:
                tensors[rank].setdefault(ranks, []).extend((layer.name, n) for n in sizes if n)
    return tensors


def all_buckets(graph, plan, options, itemsize, machine, ghost=None):
    """Every device's :class:`BucketCost` list, each in the order its allreduces start. Under ``sync:
    parameter-server`` a bucket is one layer's gradients of one group and its seconds are the pull of their sum
    from the server (the push is on the compute lane: :func:`layer_lanes`)."""
    options = replace(options, mode=machine.sync)
    order = {layer.name: index for index, layer in enumerate(graph.layers)}
    found, summers = [], {}     # summers: each group's way of summing, once (groups are one object each)
    for tensors in gradient_tensors(graph, plan, itemsize, ghost):
        mine = []
        for group, first, stop, ready in assign(tensors, order, options):
            layers = {}
            for name, nbytes in tensors[group][first:stop]:
                layers[name] = layers.get(name, 0) + nbytes
            nbytes = sum(layers.values())
            summer = summers.get(group)
            if summer is None:
                summer = summers[group] = machine.gradient_sum(group)
            mine.append(BucketCost(group, nbytes, layers, ready, summer.allreduce(len(group), nbytes)))
        found.append(mine)
    return found


def device_buckets(graph, plan, rank, options, itemsize, machine, ghost=None):
    """The :class:`BucketCost` list of ``rank``, in the order its allreduces start."""
    return all_buckets(graph, plan, options, itemsize, machine, ghost)[rank]


class Lane(NamedTuple):
    """One layer on the compute lane: its forward exchange, forward (batch norm's gather included), backward
    (batch norm's sum included) and backward exchange, in seconds, parameter updates left out; ``points``: for
    each of the four, the seconds of communication in it where the devices synchronize (an exchange that moves
    bytes, batch norm's gather and sum), None where they do not."""

    forward_x: float
    forward: float
    backward: float
    backward_x: float
    points: tuple = (None, None, None, None)


class Walk(NamedTuple):
    """The compute lane of one iteration (:func:`walk`)."""

    layers: list        # [(layer, Lane)] in model order, each part with the wait of its synchronization point
    overhead_s: float   # the loss's sum, with its wait
    met: list           # when each synchronization point ends, in order
    ready: dict         # {layer: when its backward is done}: its buckets are ready then, before its exchange
    end: float          # when backward ends
    spans: list         # (name, kind, start, end) of each exchange, forward, the loss's sum and backward
    points: list        # (gap, communication, wait) of each synchronization point, in order


def walk(layers, loss_s, wait):
    """The :class:`Walk` of ``layers`` (``[(layer, Lane)]`` in model order, no waits) and the loss's sum
    ``loss_s`` (a point when positive): forward in model order, the loss's sum, backward in reverse. A point
    waits ``wait(gap)``, ``gap`` the compute lane's seconds from the end of the previous point to its start (the
    ranks drift apart in between; the first to arrive waits); its own communication is not part of the gap."""
    now = last = 0.0
    met, spans, ready, points = [], [], {}, []

    def part(name, kind, seconds, communication, shown=True):
        nonlocal now, last
        start = now
        if communication is None:
            now += seconds
        else:
            now += seconds - communication
            extra = wait(now - last)
            points.append((now - last, communication, extra))
            now += communication + extra
            last = now
            met.append(now)
            seconds += extra
        if shown:
            spans.append((name, kind, start, now))
        return seconds

    parts = {}
    for layer, lane in layers:
        parts[layer.name] = [part(layer.name, "exchange", lane.forward_x, lane.points[0], lane.forward_x > 0),
                             part(layer.name, "forward", lane.forward, lane.points[1])]
    overhead = part("loss", "loss", loss_s, loss_s if loss_s > 0 else None, loss_s > 0)
    for layer, lane in reversed(layers):
        parts[layer.name].append(part(layer.name, "backward", lane.backward, lane.points[2], layer.needs_grad))
        ready[layer.name] = now
        parts[layer.name].append(part(layer.name, "exchange", lane.backward_x, lane.points[3], lane.backward_x > 0))
    return Walk([(layer, Lane(*parts[layer.name])) for layer, _ in layers], overhead, met, ready, now, spans,
                points)


def schedule(per_device, ready, end, options, wait, met=()):
    """Lay every device's buckets (``per_device[d]``, each in its start order) on the communication lanes: a
    bucket's allreduce starts when it is ready (``ready[layer]``; with ``overlap`` off, at backward's ``end``) and
    every member of its group has finished the allreduces before it, and lasts its seconds and a wait: ``wait``
    seconds, or ``wait(gap)`` of the seconds since its group last met (the latest of the compute lane's
    synchronization points ``met`` before it starts and the end of the group's allreduces before it). Sets each
    BucketCost's start and end (a bucket is the k-th of its group on every member)."""
    keys = []
    for buckets in per_device:
        counts, mine = {}, []
        for bucket in buckets:
            counts[bucket.ranks] = counts.get(bucket.ranks, 0) + 1
            mine.append((bucket.ranks, counts[bucket.ranks]))
        keys.append(mine)
    heads = [0] * len(per_device)
    free = [0.0] * len(per_device)
    left = sum(map(len, per_device))
    while left:
        for device, buckets in enumerate(per_device):
            if heads[device] == len(buckets):
                continue
            key = keys[device][heads[device]]
            members = key[0]
            if all(heads[m] < len(keys[m]) and keys[m][heads[m]] == key for m in members):
                bucket = buckets[heads[device]]
                start = max([ready[bucket.ready] if options.overlapping else end] + [free[m] for m in members])
                lost = wait
                if callable(wait):
                    before = bisect_right(met, start)
                    lost = wait(start - max([met[before - 1] if before else 0.0] + [free[m] for m in members]))
                finish = start + bucket.seconds + lost
                for m in members:
                    mine = per_device[m][heads[m]]
                    mine.start_s, mine.end_s, mine.wait_s = start, finish, lost
                    free[m] = finish
                    heads[m] += 1
                    left -= 1
                break
        else:
            raise RuntimeError("the buckets' allreduce order is not the same on all members of a group")


def device_end(buckets, end, updates, spans=None):
    """When a device whose buckets are laid out has updated its last parameters: after backward's ``end`` it
    updates what no bucket sums, then each bucket's share of its layers' updates (by bytes) once its sum is done;
    sets each bucket's exposed time. ``spans``, a list, gets ``(bucket or None, start, end)`` of each update."""
    total = {}
    for bucket in buckets:
        for name, nbytes in bucket.layers.items():
            total[name] = total.get(name, 0) + nbytes
    local = sum(updates.values()) - sum(updates[name] for name in total)
    if spans is not None and local > 0:
        spans.append((None, end, end + local))
    t = end + local
    for bucket in buckets:
        if bucket.end_s > t:
            bucket.exposed_s, t = bucket.end_s - t, bucket.end_s
        spent = bucket_update(bucket, total, updates)
        if spans is not None:
            spans.append((bucket, t, t + spent))
        t += spent
    return t


def bucket_update(bucket, total, updates):
    """The seconds of updating ``bucket``'s parameters: its layers' updates in proportion of their bytes in it."""
    return sum(updates[name] * nbytes / total[name] for name, nbytes in bucket.layers.items())


def _laid_out(cost, plan, options):
    """``(rows, lanes, Walk, per_device, updates)`` of ``plan``: :func:`layer_lanes`, the compute lane walked and
    every device's buckets scheduled on its communication lane."""
    options = SyncOptions.of(options if options is not None else cost.sync, cost.machine.sync)
    rows, lanes, updates = layer_lanes(cost, plan)
    walked = walk(lanes, cost.loss_sum(plan.devices), cost.point_wait)
    per_device = all_buckets(plan.graph, plan, options, max(cost.itemsize, 4), cost.machine, cost.ghost)
    schedule(per_device, walked.ready, walked.end, options, cost.point_wait, walked.met)
    return rows, lanes, walked, per_device, updates


def layer_lanes(cost, plan):
    """``(rows, layers, updates)`` for :func:`walk` and the buckets from a :class:`~spmdcnn.cost.model.CostModel`:
    ``rows`` ``{layer: (compute_s, transfer_s, batchnorm_sync_s, bytes_transferred, bytes_synced)}`` (the
    transfer and the sync on the compute lane without their waits: batch norm's sums, and under ``sync:
    parameter-server`` every layer's gradients through the servers), ``layers`` ``[(layer, Lane)]``."""
    rows, lanes, updates = {}, [], {}
    compute = cost.compute
    served = cost.machine.served
    factor = compute.profile.factor if compute.profile is not None else 1.0
    for layer in cost.graph.layers:
        config = plan[layer.name]
        t_c, _, synced, _, _ = cost.node_parts(layer, config)
        update = 0.0
        if layer.params:
            c_degree = config.degrees[1] if len(config.degrees) > 1 else 1
            channels = (0, -(-layer.out_shape[0] // c_degree))        # the largest part's
            held = sum(prod(layer.shard_shape(name, channels)) for name in layer.params)
            update = min(t_c, factor * compute.update_seconds(held))
        updates[layer.name] = update
        forward_x = backward_x = moved = 0.0
        crosses = False
        for slot, ref in enumerate(layer.inputs):
            if ref == DATA:
                continue
            traffic = cost.edge(layer, slot).forward(plan[ref], config)
            forward_x += traffic.seconds
            crosses = crosses or traffic.bytes > 0
            if layer.input_grads[slot]:
                backward_x += traffic.seconds
                moved += traffic.bytes
            moved += traffic.bytes
        sync = cost.node_sync(layer, config)
        gather = batchnorm = 0.0                # batchnorm: the sync on the compute lane
        if layer.spec.reduced_in_layer or layer.spec.statistics:
            if sync.points:
                gather, batchnorm = sync.forward, sync.seconds - sync.gradient
            if served:
                batchnorm += sync.gradient
        elif served:
            batchnorm = sync.seconds            # the layer's gradients pushed to the servers, after its backward
        share = forward_share(layer, layer.needs_grad)
        work = t_c - update
        points = (forward_x if crosses else None, gather if gather > 0 else None,
                  batchnorm - gather if batchnorm > gather else None,
                  backward_x if crosses and backward_x > 0 else None)
        lanes.append((layer, Lane(forward_x, share * work + gather, (1 - share) * work + batchnorm - gather,
                                  backward_x, points)))
        rows[layer.name] = (t_c, forward_x + backward_x, batchnorm, moved, synced)
    return rows, lanes, updates


def timeline(cost, plan, options=None):
    """``(rows, Timeline)`` of ``plan`` under ``cost`` (a CostModel) with the sync ``options``; ``rows`` as
    :func:`layer_lanes` gives them, with the waits of their synchronization points. The iteration ends when the
    slowest device has updated its last bucket."""
    rows, lanes, walked, per_device, updates = _laid_out(cost, plan, options)
    for (layer, lane), (_, with_wait) in zip(lanes, walked.layers):
        t_c, _, batchnorm, moved, synced = rows[layer.name]
        rows[layer.name] = (t_c, with_wait.forward_x + with_wait.backward_x,
                            batchnorm + (with_wait.forward - lane.forward) + (with_wait.backward - lane.backward),
                            moved, synced)
    ends = [device_end(buckets, walked.end, updates) for buckets in per_device]
    rank = max(range(len(ends)), key=ends.__getitem__)
    step = cost.compute.step                    # the runtime's own work per step, measured
    return rows, Timeline(ends[rank] + step, walked.end, rank, per_device[rank], ends, walked.overhead_s,
                          cost.machine.served, step)


def timeline_events(cost, plan, options=None):
    """The predicted iteration of every device as :class:`~spmdcnn.io.trace.Event` s (``spmdcnn simulate
    --trace``): the shared compute lane (exchanges, forward, the loss's sum, backward, updates) and each device's
    bucket allreduces."""
    from ..io.trace import Event
    _, _, walked, per_device, updates = _laid_out(cost, plan, options)
    events = []
    for rank, buckets in enumerate(per_device):
        events += [Event(name, kind, rank, "compute", a, b) for name, kind, a, b in walked.spans]
        events += [Event(f"gradients of {', '.join(b.layers)}", "allreduce", rank, "communication", b.start_s,
                         b.end_s) for b in buckets]
        spans = []
        device_end(buckets, walked.end, updates, spans)
        events += [Event("update" if bucket is None else f"update of {', '.join(bucket.layers)}", "update", rank,
                         "compute", a, b) for bucket, a, b in spans]
    return events
