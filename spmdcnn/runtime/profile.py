"""``spmdcnn profile``: measure ``t_c`` on this device, one distinct tile shape at a time, with the kernels training
runs (the bound kernels of ``runtime.kernels``, built from the tile's shape), for the planner's cost model.

Each tile runs alone on made-up inputs of its shape: forward, then (unless no gradient reaches it) backward from a
made-up output gradient, and for a layer with parameters an SGD step over its shard; the median of a few repeats
after a warm-up is kept.
Under ``mpiexec`` every rank measures a share of the shapes at the same time, so ranks that share a node's cores
and memory are measured with the contention they will meet in training; rank 0 writes the file.
"""

import hashlib
import os
import statistics
import time
from typing import NamedTuple

import numpy as np

from ..backend import master_dtype, synchronizer, tf32_allowed
from ..cost.calibrate import median_seconds, processor_name, spread, timings
from ..cost.compute import ComputeModel, Profile, update_key
from ..cost.tiles import tile_shapes
from ..cost.machine import Device
from ..graph.graph import Layer
from ..graph.opspec import infer, keys_of
from ..graph.optable import ANSWERS_LABELS, ANSWERS_TARGETS, OPS
from ..planner.configs import configurations
from ..progress import Progress
from ..tiling.config import ParallelConfig, output_shape
from .kernels import Run, Tile, TileKernel, Views
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


def reference_key(graph, batch, devices, ranks):
    """The ``in_situ`` key of a profile measured for ``graph`` at global ``batch`` on ``devices`` devices by
    ``ranks`` ranks: :func:`profile` writes it once every tile shape the planner considers there is measured."""
    digest = hashlib.sha256(graph.text.encode()).hexdigest()[:12]
    return f"{graph.name} ({digest}) batch {batch} on {devices} devices, {ranks} ranks"


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
    if layer.spec.answers == ANSWERS_LABELS:
        n, classes = shape.inputs[0]
        inputs.append(xp.asarray(rng.integers(0, classes, n)))
    elif layer.spec.answers == ANSWERS_TARGETS:
        inputs.append(xp.asarray(rng.uniform(-1, 1, shape.inputs[0]).astype(np.float32)))
    return TileKernel(layer, tile, views, overwrite=0 if layer.spec.inplace else None), inputs


def _layer(shape):
    """A layer computing what the tile ``shape`` computes, on inputs of the tile's shapes."""
    attrs = dict(shape.attrs)
    spec = OPS[shape.op]
    if spec.window:
        attrs["padding"] = 0
    keys = keys_of(shape.op)
    for key in ("out_channels", "out_features"):        # as many outputs as the tile computes
        if key in keys:
            attrs[key] = shape.output[1]
    if "bias" in keys:
        attrs["bias"] = any(n == "bias" for n, _ in shape.params)
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
    gy = xp.asarray(np.random.default_rng(seed).standard_normal(np.shape(y)).astype(dtype)) if np.ndim(y) else None

    def run():
        out, saved = kernel.forward(xs, Run())
        if shape.backward:
            kernel.backward(gy if gy is not None else out, saved)
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
            machine=None, progress=False):
    """Measure every tile shape ``profile_store`` lacks, on all ranks at once, then (if the profile has none for
    this model, batch and rank count) a reference iteration (:func:`reference_iteration`) and the wait per
    synchronization (:func:`synchronization_wait`, against ``machine``: a machine YAML path, or None for the
    built-in local machine); returns the number of tile shapes measured. ``progress``: rank 0 shows the measuring
    on standard output (:class:`~spmdcnn.progress.Progress`)."""
    count = _measure_tiles(profile_store, *shapes_to_profile(graph, batch, devices), world, xp, dtype, repeats, log,
                           progress)
    key = reference_key(graph, batch, devices, world.size)
    if key not in profile_store.in_situ:
        sample = max(batch // devices, 1)
        whole = {layer.name: [ParallelConfig((1,) * len(output_shape(layer, sample)), (0,))] for layer in graph.layers}
        count += _measure_tiles(profile_store, *shapes_to_profile(graph, sample, 1, whole), world, xp, dtype,
                                repeats, None)
        measured = max(world.allgather(reference_iteration(graph, sample, xp, dtype, world)))
        wait, drift = synchronization_wait(graph, sample * world.size, world, xp, dtype, machine) \
            if world.size > 1 else (0.0, 0.0)
        isolated = sum(ComputeModel(Device(), profile_store).layer_seconds(layer, whole[layer.name][0], sample)
                       for layer in graph.layers) / profile_store.factor
        profile_store.in_situ[key] = {"measured": measured, "isolated": isolated, "wait": wait, "drift": drift}
        if log:
            share = "" if devices == 1 else f", its share of the global batch {batch} on {devices} devices"
            ranks = "one rank" if world.size == 1 else f"each of {world.size} ranks at once"
            wait_text = f"; ranks drift {drift * 100:.1f} % apart between synchronizations ({wait * 1e3:.2f} ms " \
                f"lost per point here)" if world.size > 1 else ""
            log(f"profile: one training iteration of the whole model at {sample} samples per device{share}, on "
                f"{ranks}: {measured * 1e3:.1f} ms, its tiles run alone {isolated * 1e3:.1f} ms, so tile times "
                f"are scaled by {profile_store.factor:.3f}{wait_text}")
    return count


def training_step(graph, batch, xp, dtype, world=None, plan=None, seed=0, feed=None, sync=None, batchnorm=None):
    """``step(index)``: one training iteration (forward, backward, SGD update) of ``graph`` at global ``batch`` on
    one fixed synthetic batch, the whole model here or, with ``plan``, this rank's share of it on the ranks of
    ``world``. ``feed``: a function of the executor that gives the batch of each step index instead (a function
    of the index: ``spmdcnn bench --data``)."""
    from ..io.synthetic import SyntheticData
    from .executor import Executor, array_batch
    executor = Executor(graph, xp, dtype, seed=seed, plan=plan, world=world, sync=sync, batchnorm=batchnorm)
    optimizer = SGD(executor.params.shapes, executor.param_dtype, xp, lr=1e-3, momentum=0.9, weight_decay=5e-4)
    update = optimizer.updater(executor.params.flat, executor.grads.flat)
    if feed is None:
        images, labels = SyntheticData.for_model(graph, batch, seed=seed).batch(0, 0, batch, dtype)
        fixed = array_batch(xp.asarray(images), xp.asarray(labels))

        def batch_of(index):
            return fixed
    else:
        batch_of = feed(executor)

    def step(index=0):
        executor.forward(batch_of(index), step=index)
        executor.backward(update=update)
    step.executor = executor
    return step


def reference_iteration(graph, batch, xp, dtype, world, repeats=5, warmup=2):
    """Median seconds of a training iteration of the whole model at ``batch`` on this rank alone (every rank at
    once: the contention of training, without its communication). A fresh process's first iterations run slower
    (its heap grows, pages fault in) and one iteration can differ from the next by a fifth on a shared machine:
    two warm-up iterations and the median of five."""
    run = training_step(graph, batch, xp, dtype)
    world.barrier()
    return median_seconds(run, repeats, warmup, sync=synchronizer(xp))


class Synchronization(NamedTuple):
    """What the ranks lose where they synchronize (:func:`synchronization_wait`)."""

    wait: float     # seconds per point, on average over the points of the measured run
    drift: float    # seconds per second of a rank's compute since the ranks last synchronized


def synchronization_wait(graph, batch, world, xp, dtype, machine=None, steps=5, warmup=1):
    """The :class:`Synchronization` of the ranks: the data-parallel plan trains at ``batch`` on all ranks for a
    few iterations, and the small collectives every rank waits in on the critical path (the loss's sum, batch
    norm's gathers and sums) take longer than the allreduce model of ``machine`` (a machine YAML path; None: the
    built-in local machine) gives a message of their size. Ranks drift apart between two such points (uneven
    cores, the operating system, ranks sharing a core take turns) and the first to arrive waits for the last, so
    the excess grows with the work done since the ranks last met: ``drift`` is the excess over that work (each
    point's time since the step began or the previous point ended), ``wait`` the mean excess per point; both the
    median rank's. Large allreduces are left out: their time is the model's bandwidth, not drift."""
    from ..cost.machine import default_machine, load_machine
    from ..tiling.plan import named
    plan = named("data", graph, batch, world.size)
    step, sync = training_step(graph, batch, xp, dtype, world, plan), synchronizer(xp)
    starts = []
    for index in range(warmup + steps):
        if index == warmup:
            world.reset()
        world.barrier()
        if index >= warmup:
            starts.append(time.perf_counter())
        step(index)
        sync()
    small = sorted((start, end) for start, end, what in world.counters.intervals if what in ("loss", "batchnorm"))
    world.reset()
    machine = load_machine(machine) if machine else default_machine()
    modelled = machine.allreduce_time(tuple(range(world.size)), 2 * 8)
    excess = [end - start - modelled for start, end in small]
    gaps, met = [], 0.0
    for start, end in small:
        met = max([met] + [s for s in starts if s <= start])
        gaps.append(max(start - met, 0.0))
        met = end
    mine = (statistics.fmean(excess) if excess else 0.0, sum(excess) / sum(gaps) if sum(gaps) > 0 else 0.0)
    ranks = world.allgather(mine)
    return Synchronization(max(statistics.median(r[0] for r in ranks), 0.0),
                           max(statistics.median(r[1] for r in ranks), 0.0))


def _measure_tiles(profile_store, shapes, updates, world, xp, dtype, repeats, log, progress=False):
    missing = [s for s in shapes if profile_store.get(s) is None]
    missing_updates = [n for n in updates if update_key(n) not in profile_store.entries]
    jobs = [("tile", s) for s in missing] + [("sgd", n) for n in missing_updates]
    if log:
        where = "on this process" if world.size == 1 else f"shared between {world.size} ranks, measuring at once"
        log(f"profile: {len(jobs)} of {len(shapes) + len(updates)} tile shapes to measure, {where}")
    bar = Progress(len(jobs), "profile", unit="tile shapes") if progress and world.rank == 0 and jobs else None
    mine = {}
    try:
        for count, i in enumerate(range(world.rank, len(jobs), world.size), 1):
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
