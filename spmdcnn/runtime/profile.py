"""``spmdcnn profile``: measure ``t_c`` on this device, one distinct tile shape at a time, with the kernels training
runs (the bound kernels of ``runtime.kernels``, built from the tile's shape), for the planner's cost model.

Each tile runs alone on made-up inputs of its shape: forward, then (unless no gradient reaches it) backward from a
made-up output gradient, and for a layer with parameters an SGD step over its shard; the median of a few repeats
after a warm-up is kept.
Under ``mpiexec`` every rank measures a share of the shapes at the same time, so ranks that share a node's cores
and memory are measured with the contention they will meet in training; rank 0 writes the file.
"""

import os
import statistics
from math import gcd

import numpy as np

from ..backend import master_dtype, synchronizer, tf32_allowed
from ..cost.calibrate import processor_name, spread, timings
from ..cost.compute import ComputeModel, Profile, reference_key, update_key, update_work, work
from ..cost.tiles import tile_shapes
from ..cost.machine import Device
from ..graph.graph import Layer
from ..graph.opkeys import keys_of
from ..graph.opspec import infer
from ..graph.optable import ANSWERS_LABELS, ANSWERS_TARGETS, OPS, READS_TRANSPOSED
from ..planner.configs import configurations
from ..progress import Progress
from ..tiling.config import ParallelConfig, output_shape
from .insitu import reference_iteration, synchronization
from .kernels import Run, Tile, TileKernel, Views, finish_loss
from .optimizer import SGD
from .params import initial_value


def device_name(world, xp=np, dtype=np.float32):
    """The profile's device: the processor, its BLAS threads per rank, how many ranks share it, and the dtype."""
    precision = np.dtype(dtype).name
    if xp is not np:
        precision += "+tf32" if tf32_allowed() and precision == "float32" else ""
    return _device(processor_name(xp), world.size, precision)


def _device(processor, ranks, precision):
    return f"{processor}{'' if ranks == 1 else f', {ranks} ranks'}, {precision}"


def job_device(devices, dtype=np.float32, per_node=None):
    """The device name of the profile that a CPU job of ``devices`` ranks, ``per_node`` of them (default all) on
    each node like this one, measures and uses (``plan: auto`` under ``mpiexec -n devices``), seen from here."""
    return _device(processor_name(np, per_node or devices), devices, np.dtype(dtype).name)


def cached_profile(devices, dtype=np.float32, per_node=None):
    """``(profile or None, device, path)``: the cached profile of a CPU job of ``devices`` ranks
    (:func:`job_device`)."""
    device = job_device(devices, dtype, per_node)
    path = default_path(device)
    if not os.path.exists(path):
        return None, device, path
    store = Profile.load(path, device)
    return (store if store.device == device else None), device, path


def measured_for(store, graph, batch, devices):
    """Whether ``store`` was measured for ``graph`` at ``batch`` on ``devices`` devices (by as many ranks, or by
    one process for one device): then every tile time the planner needs is in it."""
    return reference_key(graph, batch, devices, devices) in store.in_situ


def default_path(device):
    """Where profiles are cached: ``$SPMDCNN_CACHE`` or ``~/.cache/spmdcnn``, one file per device."""
    folder = os.environ.get("SPMDCNN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "spmdcnn")
    slug = "".join(ch if ch.isalnum() else "-" for ch in device.lower()).strip("-")
    return os.path.join(folder, f"profile-{slug}.json")


def tile_kernel(shape, xp=np, dtype=np.float32, seed=0):
    """``(kernel, inputs)``: the :class:`~spmdcnn.runtime.kernels.TileKernel` training binds for a tile of
    ``shape`` (a :class:`~spmdcnn.cost.tiles.TileShape`), alone: its input arrives padded and subsampled, so it
    adds no padding and applies the shape's own stride, its replica group is itself, and relu, dropout and add
    write over their (first) input, as training runs them wherever no other layer reads it; with made-up
    parameters and inputs (the loss's labels last)."""
    rng = np.random.default_rng(seed)
    layer = _layer(shape)
    master = master_dtype(dtype)            # parameters in float32 under bfloat16, as the executor keeps them
    params = {name: xp.asarray((rng.standard_normal(s) * 0.1).astype(master)) for name, s in shape.params}
    buffers = {kind: xp.asarray(initial_value(layer, kind, seed), master) for kind in layer.buffers}
    views = Views(params, {name: xp.zeros_like(value) for name, value in params.items()}, buffers)
    tile = Tile(shape.output, tuple((0, extent) for extent in shape.output))
    inputs = [xp.asarray(rng.standard_normal(s).astype(dtype)) for s in shape.inputs]
    if layer.spec.answers == ANSWERS_LABELS:          # a label per sample, or per position
        n, classes, *spatial = shape.inputs[0]
        inputs.append(xp.asarray(rng.integers(0, classes, (n, *spatial))))
    elif layer.spec.answers == ANSWERS_TARGETS:
        inputs.append(xp.asarray(rng.uniform(-1, 1, shape.inputs[0]).astype(np.float32)))
    return TileKernel(layer, tile, views, overwrite=0 if layer.spec.inplace else None), inputs


def _transposed_padding(shape):
    """``padding`` (per side) and ``output_padding`` of a transposed convolution whose input of the tile's extents
    gives the tile's output extents: the full extent cropped evenly, or extended at the end."""
    a = dict(shape.attrs)
    pads, extra = [], []
    for size, out, k, s, d in zip(shape.inputs[0][2:], shape.output[2:], a["kernel"], a["stride"], a["dilation"]):
        surplus = (size - 1) * s + d * (k - 1) + 1 - out
        pads.append([max(surplus, 0) // 2, max(surplus, 0) - max(surplus, 0) // 2])
        extra.append(max(-surplus, 0))
    return {"padding": pads, "output_padding": extra}


def _layer(shape):
    """A layer computing what the tile ``shape`` computes, on inputs of the tile's shapes."""
    attrs = dict(shape.attrs)
    spec = OPS[shape.op]
    if spec.window:
        attrs["padding"] = 0
    if spec.reads == READS_TRANSPOSED:      # padding that crops the full extent the input fills to the output's
        attrs.update(_transposed_padding(shape))
    keys = keys_of(shape.op)
    for key in ("out_channels", "out_features"):        # as many outputs as the tile computes
        if key in keys:
            attrs[key] = shape.output[1]
    if "bias" in keys:
        attrs["bias"] = any(n == "bias" for n, _ in shape.params)
    if "affine" in keys:
        attrs["affine"] = bool(shape.params)
    if spec.grouped:                    # the tile's groups: its channels (input's, or a transposed convolution's
        weight = dict(shape.params)["weight"]           # output's) over the weight's per group
        attrs["groups"] = (shape.inputs[0][1] if spec.param_axis("weight") == 0 else shape.output[1]) // weight[1]
    if "group_channels" in attrs:       # a group normalisation: the layer's groups where the tile's channels
        per = gcd(attrs.pop("group_channels"), shape.inputs[0][1])     # hold whole ones (the work is the same)
        if "groups" in keys:
            attrs["groups"] = shape.inputs[0][1] // per
    out = shape.output[1:] if not spec.loss else ()
    in_shapes = [s[1:] for s in shape.inputs]
    _, _, buffers, _ = infer(shape.op, attrs, in_shapes, "tile")
    return Layer("tile", shape.op, attrs, ["x"] * len(shape.inputs), in_shapes, out,
                 dict(shape.params), buffers, input_grads=(shape.input_grad,) * len(shape.inputs),
                 needs_grad=shape.backward)


def tile_step(shape, xp=np, dtype=np.float32, seed=0):
    """``run()``: one forward and (when the tile runs one) backward of the tile ``shape``, as training runs them
    (:func:`tile_kernel`), from a made-up output gradient."""
    kernel, xs = tile_kernel(shape, xp, dtype, seed)
    y, _ = kernel.forward(xs, Run())
    if OPS[shape.op].loss:              # its forward gives its share of the sums; backward starts from their seed
        gy = finish_loss(kernel.layer, y.sum, y.counted, y.table)[1]
    else:
        gy = xp.asarray(np.random.default_rng(seed).standard_normal(np.shape(y)).astype(dtype))

    def run():
        _, saved = kernel.forward(xs, Run())
        if shape.backward:
            kernel.backward(gy, saved)
    return run


def measure_tile(shape, xp=np, dtype=np.float32, repeats=3, warmup=1, seed=0):
    """The ``repeats`` timings (seconds) of one forward and backward of the tile ``shape`` (a
    :class:`~spmdcnn.cost.tiles.TileShape`)."""
    return timings(tile_step(shape, xp, dtype, seed), repeats, warmup, sync=synchronizer(xp))


def measure_update(count, xp=np, dtype=np.float32, repeats=3, warmup=1):
    """The ``repeats`` timings (seconds) of an SGD step (momentum and weight decay) over ``count`` parameters."""
    sgd = SGD({"w": (count,)}, master_dtype(dtype), xp, lr=0.01, momentum=0.9, weight_decay=5e-4)
    weights, grads = xp.ones(count, master_dtype(dtype)), xp.ones(count, master_dtype(dtype))
    return timings(lambda: sgd.step(weights, grads), repeats, warmup, sync=synchronizer(xp))


def shapes_to_profile(graph, batch, devices, configs=None):
    """The distinct tile shapes (and parameter shard sizes) of every configuration the planner considers for
    ``graph`` on ``devices`` devices (or of the given ``{layer: [configs]}``)."""
    shapes, updates = [], set()
    for layer in graph.layers:
        for config in (configs or {}).get(layer.name) or configurations(layer, batch, devices):
            for shape in tile_shapes(layer, config, batch):
                if shape not in shapes:
                    shapes.append(shape)
                    count = sum(int(np.prod(s)) for _, s in shape.params)
                    if count:
                        updates.add(count)
    return shapes, sorted(updates)


def profile(graph, batch, devices, world, profile_store, xp=np, dtype=np.float32, repeats=3, log=None,
            machine=None, progress=False, reads=None):
    """Measure every tile shape ``profile_store`` lacks, on all ranks at once, then (if the profile has none for
    this model, batch and rank count) a reference iteration (:func:`reference_iteration`) and the wait per
    synchronization (:func:`synchronization_wait`, against ``machine``: a machine YAML path, or None for the
    built-in local machine); returns the number of tile shapes measured. ``progress``: rank 0 shows the measuring
    on standard output (:class:`~spmdcnn.progress.Progress`). ``reads``: a :class:`JobReads` (``plan: auto``'s
    job): the data-parallel calibration then reads the job's batches as its run will, and the profile's entry for
    this model says so (another job's reads measure it again)."""
    world.board.stage("profile", slow=True, name="tile shapes")     # where this rank is, for the watchdog
    count = _measure_tiles(profile_store, *shapes_to_profile(graph, batch, devices), world, xp, dtype, repeats, log,
                           progress)
    key = reference_key(graph, batch, devices, world.size)
    entry = profile_store.in_situ.get(key, {})
    if "latency" not in entry or entry.get("reads") != (reads.describe() if reads else None):
        sample = max(batch // devices, 1)
        whole = {layer.name: [ParallelConfig((1,) * len(output_shape(layer, sample)), (0,))] for layer in graph.layers}
        count += _measure_tiles(profile_store, *shapes_to_profile(graph, sample, 1, whole), world, xp, dtype,
                                repeats, None)
        world.board.stage("profile", slow=True, name="the reference iteration")
        measured = max(world.allgather(reference_iteration(graph, sample, xp, dtype, world)))
        isolated = sum(ComputeModel(Device(), profile_store).layer_seconds(layer, whole[layer.name][0], sample)
                       for layer in graph.layers) / profile_store.factor
        reference = profile_store.in_situ[key] = {"measured": measured, "isolated": isolated, "latency": 0.0,
                                                  "drift": 0.0}
        if reads is not None:
            reference["reads"] = reads.describe()
        world.board.stage("profile", slow=True, name="data-parallel steps")
        found = _synchronize(graph, sample * world.size, world, xp, dtype, machine, profile_store, reference, reads)
        if log:
            log(reference_text(reference, sample, batch, devices, world.size, profile_store.restricted(key).factor,
                               found))
    return count


def _synchronize(graph, batch, world, xp, dtype, machine, store, reference, feed=None):
    """Measure the ranks' :func:`synchronization` into ``reference`` (the ``in_situ`` entry of ``store`` being
    made) and what the data-parallel step took beyond the model with it (``step``: the runtime's own work, which
    no tile includes); returns the :class:`Synchronization`."""
    from ..planner.service import cost_model
    from ..tiling.plan import named
    itemsize = np.dtype(dtype).itemsize
    key = next(k for k, entry in store.in_situ.items() if entry is reference)
    store = store.restricted(key)           # this model's own scale, whatever else the cache holds
    try:
        found = synchronization(graph, batch, world, xp, dtype, cost_model(graph, batch, world.size, machine, store,
                                                                           itemsize), feed=feed)
    finally:
        if feed is not None:
            feed.close()
    reference.update(latency=found.latency, drift=found.drift, step=0.0)
    cost = cost_model(graph, batch, world.size, machine, store, itemsize)     # with the waits just measured
    reference["step"] = found.measured - cost.simulate(named("data", graph, batch, world.size)).iteration_s
    return found


def reference_text(reference, sample, batch, devices, ranks, factor, found):
    """The profile's line on a reference iteration (``reference``: its ``in_situ`` entry) and the data-parallel
    run that measured the runtime's own work and, on several ranks, their meetings (``found``, a
    :class:`Synchronization`): what was run, what it took, and what the cost model takes from it."""
    measured, isolated = reference["measured"] * 1e3, reference["isolated"] * 1e3
    share = "" if devices == 1 else f" (its share of the global batch {batch} on {devices} devices)"
    if ranks == 1:
        text = f"profile: a training step of the whole model at {sample} samples{share} took {measured:.1f} ms"
    else:
        cores = _cores()
        sharing = f"; {ranks} ranks share {cores} cores" if cores and ranks > cores else ""
        text = (f"profile: {ranks} ranks each ran a training step of the whole model at {sample} samples{share} at "
                f"once, without communicating{sharing}: {measured:.1f} ms")
    text += (f"; its layers measured alone add up to {isolated:.1f} ms, so the plan's layer times are taken as "
             f"{factor:.2f}x their times alone")
    on = ", reading the job's batches as its run will," if reference.get("reads") else ""
    beyond = _beyond(reference["step"])
    if ranks == 1:
        text += f"; trained step after step{on} a step took {found.measured * 1e3:.1f} ms: {beyond}"
    else:
        text += (f"; a data-parallel step on the {ranks} ranks{on} took {found.measured * 1e3:.1f} ms: meeting at its "
                 f"{found.points} synchronization points cost {found.latency * 1e3:.2f} ms each and "
                 f"{found.drift * 100:.0f} % of the compute since the last, and {beyond}")
    return text


def _beyond(step):
    """What a data-parallel step took beyond the model (``step`` seconds), in words: the runtime's own work, or,
    when the steps ran faster than their layers add up to (the layers' times overlap a little when run back to
    back), by how much; every plan's prediction adds it."""
    if step >= 0:
        return f"the runtime's own work {step * 1e3:.2f} ms per step beyond the layers"
    return (f"the steps {-step * 1e3:.2f} ms faster than their layers add up to (taken off every plan's "
            "prediction)")


def _cores():
    """The cores this process may run on (None where the system does not say)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


_ANALYTIC = ComputeModel(Device())     # the analytic model alone, to order jobs by size


def _estimate(job):
    """The analytic model's seconds of a job of :func:`_measure_tiles` (to put tiles of like sizes together)."""
    kind, item = job
    return _ANALYTIC.analytic(*(work(item) if kind == "tile" else update_work(item)))


PROGRESS_DELAY = 3.0     # seconds of measuring before the profile shows its progress


def _measure_tiles(profile_store, shapes, updates, world, xp, dtype, repeats, log, progress=False):
    """Measure the tiles and updates ``profile_store`` lacks. On several ranks each takes a share, in rounds: the
    jobs sorted by their analytic time, each round one per rank, started together after a barrier, so that every
    tile is timed while every rank runs one of like size (ranks that share cores then take turns alike for every
    tile: tile times compare with one another, and the reference iteration scales them all alike)."""
    missing = [s for s in shapes if profile_store.get(s) is None]
    missing_updates = [n for n in updates if update_key(n) not in profile_store.entries]
    jobs = [("tile", s) for s in missing] + [("sgd", n) for n in missing_updates]
    if world.size > 1:          # rounds of tiles of like sizes, so that every tile is timed with all ranks busy
        jobs.sort(key=_estimate, reverse=True)
    if log and not jobs:
        log(f"profile: all {len(shapes) + len(updates)} tile shapes the planner considers are in the profile")
    elif log:
        where = "on this process" if world.size == 1 else f"shared between {world.size} ranks, measuring at once"
        cached = len(shapes) + len(updates) - len(jobs)
        held = f" ({cached} are in the profile)" if cached else ""
        log(f"profile: {len(jobs)} of {len(shapes) + len(updates)} tile shapes to measure{held}, {where}")
    # progress only for work long enough to need it: a small model's profile takes a second or two
    bar = Progress(len(jobs), "profile", unit="tile shapes", delay=PROGRESS_DELAY) \
        if progress and world.rank == 0 and jobs else None
    mine = {}
    try:
        rounds = -(-len(jobs) // world.size)
        for count, i in enumerate(range(world.rank, rounds * world.size, world.size), 1):
            if world.size > 1:
                world.board.at("profile", f"tile shapes, round {count} of {rounds}")
                world.barrier()         # each round starts together: as many on every rank
            if i >= len(jobs):
                continue
            kind, item = jobs[i]
            if kind == "tile":
                mine[i] = measure_tile(item, xp, dtype, repeats)
            else:
                mine[i] = measure_update(item, xp, dtype, repeats)
            if bar:                     # rank 0's share, as the share of all: the ranks measure alike
                bar.update(min(len(jobs), count * world.size))
    finally:
        if bar:
            bar.close()
    world.barrier()
    measured = {}
    for part in world.allgather(mine):
        measured.update(part)
    for i, times in measured.items():
        kind, item = jobs[i]
        if kind == "tile":
            profile_store.add(item, statistics.median(times), spread(times))
        else:
            profile_store.entries[update_key(item)] = statistics.median(times)
            profile_store.spreads[update_key(item)] = spread(times)
    return len(jobs)
