"""Gradient buckets: each replica group's summed shards packed in reverse layer order into slices of the flat
gradient array, allreduced while backward goes on (``sync.overlap``) or after it, with the same bits either way and
the same numbers as one process whatever the bucket size."""

import os

import numpy as np
import pytest

from conftest import agree
from plans import random_plan
from stepping import train
from spmdcnn.cost.buckets import FIRST_BUCKET_BYTES, SyncOptions
from spmdcnn.graph import load_model
from spmdcnn.runtime.executor import Executor

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
TINY = SyncOptions(bucket_mb=2e-3)          # about 2 KiB: many buckets even for small_resnet
BATCH = 4


def layout_problems(program, graph, options, tag):
    problems = []
    order = {layer.name: index for index, layer in enumerate(graph.layers)}
    summed = sorted((shard.start, shard.stop, shard.group, shard.layer) for shard in program.layout.values()
                    if shard.param and len(shard.group) > 1 and shard.stop > shard.start
                    and not graph.by_name[shard.layer].spec.reduced_in_layer)
    covered = sorted((b.start, b.stop) for b in program.buckets)
    for (a0, a1), (b0, _) in zip(covered, covered[1:]):
        if a1 > b0:
            problems.append(f"{tag}: buckets [{a0}, {a1}) and [{b0}, ...) overlap")
    for start, stop, group, layer in summed:
        bucket = next((b for b in program.buckets if b.start <= start and stop <= b.stop), None)
        if bucket is None or bucket.ranks != group:
            problems.append(f"{tag}: shard [{start}, {stop}) of {layer} (group {group}) in bucket {bucket}")
    if sum(b.stop - b.start for b in program.buckets) != sum(stop - start for start, stop, _, _ in summed):
        problems.append(f"{tag}: the buckets hold more than the summed shards")
    seen = {}
    for bucket in program.buckets:
        inside = [s for s in summed if bucket.start <= s[0] and s[1] <= bucket.stop]
        nbytes = (bucket.stop - bucket.start) * program.grad_itemsize
        first = bucket.ranks not in seen
        cap = options.first_bytes if first else options.cap_bytes
        if nbytes > cap and len(inside) > 1:
            problems.append(f"{tag}: bucket of {nbytes} bytes over its cap {cap} with {len(inside)} tensors")
        earliest = min(inside, key=lambda s: order[s[3]])[3]
        if bucket.ready != earliest:
            problems.append(f"{tag}: bucket ready after {bucket.ready}, its earliest layer is {earliest}")
        if not first and bucket.start >= seen[bucket.ranks]:
            problems.append(f"{tag}: group {bucket.ranks}'s buckets are not in reverse layer order")
        seen[bucket.ranks] = bucket.start
    readiness = [-order[b.ready] for b in program.buckets]
    if readiness != sorted(readiness):
        problems.append(f"{tag}: buckets not listed in the order backward readies them")
    total = sum(shard.stop - shard.start for shard in program.layout.values() if shard.param)
    pieces = sorted(program.local + covered)
    at = 0
    for start, stop in pieces:
        if start != at:
            problems.append(f"{tag}: gap or overlap at {at} (next slice starts at {start})")
        at = stop
    if pieces and at != total:
        problems.append(f"{tag}: slices end at {at}, not {total}")
    return problems


@pytest.mark.parametrize("options", [SyncOptions(), TINY], ids=["25MiB", "2KiB"])
def test_buckets_pack_each_groups_shards_in_reverse_layer_order(world, options):
    graph = load_model(os.path.join(MODELS, "small_resnet.yaml"))
    problems = []
    for seed in range(3):
        executor = Executor(graph, np, np.float64, plan=random_plan(graph, BATCH, world.size, 60 + seed),
                            world=world, sync=options)
        problems += layout_problems(executor.program, graph, options, f"seed {seed}")
    agree(world, problems)


def test_the_first_bucket_is_capped_at_one_mib():
    assert SyncOptions().first_bytes == FIRST_BUCKET_BYTES == 1 << 20
    assert SyncOptions(bucket_mb=0.5).first_bytes == 1 << 19


@pytest.mark.parametrize("name", ["small_resnet", "small_inception"])
def test_overlap_on_and_off_give_the_same_bits_and_one_process_numbers(world, name):
    graph = load_model(os.path.join(MODELS, f"{name}.yaml"))
    reference, _ = train(graph, None, None, SyncOptions())
    problems = []
    for seed in range(2):
        plan = random_plan(graph, BATCH, world.size, 70 + seed)
        runs = {}
        for label, options in (("overlap", TINY), ("after", SyncOptions(bucket_mb=TINY.bucket_mb, overlap=False)),
                               ("default", SyncOptions())):
            executor, calls = train(graph, plan, world, options)
            runs[label] = executor
            program = executor.program
            expected = program.local + [(b.start, b.stop) for b in program.buckets]
            if calls != expected:
                problems.append(f"{name} seed {seed} {label}: updated {calls}, expected the local slices then "
                                f"the buckets: {expected}")
        for tensor, index in runs["overlap"].shards.items():
            if tensor not in runs["overlap"].params:
                continue
            if not np.array_equal(runs["overlap"].params[tensor], runs["after"].params[tensor]):
                problems.append(f"{name} seed {seed}: {tensor} differs between overlap on and off")
            want = reference.params[tensor][index]
            for label in ("overlap", "default"):
                error = np.max(np.abs(runs[label].params[tensor] - want))
                if error > 1e-10 * max(np.max(np.abs(want)), 1e-6):
                    problems.append(f"{name} seed {seed} {label}: {tensor} off one process by {error:.3g}")
    agree(world, problems)


def test_exposed_sync_is_part_of_the_sync_time(world):
    graph = load_model(os.path.join(MODELS, "small_resnet.yaml"))
    plan = random_plan(graph, BATCH, world.size, 90)
    world.reset()
    train(graph, plan, world, TINY, steps=2)
    counters = world.counters
    problems = [] if counters.sync_exposed_s <= counters.sync_s + 1e-9 else \
        [f"exposed {counters.sync_exposed_s} > sync {counters.sync_s}"]
    agree(world, problems)


@pytest.mark.parametrize("options", [SyncOptions(), TINY], ids=["25MiB", "2KiB"])
@pytest.mark.parametrize("ghost", [None, 1, 2], ids=["global", "ghost1", "ghost2"])
def test_the_cost_model_charges_the_buckets_each_rank_runs(world, options, ghost):
    """The timeline's buckets of every rank (cost.timeline.device_buckets) are the runtime's: same groups, bytes,
    ready layers, in the same order (with ghost batch norm, gamma and beta of split replica groups too)."""
    from spmdcnn.cost.machine import default_machine
    from spmdcnn.cost.timeline import device_buckets
    graph = load_model(os.path.join(MODELS, "small_resnet.yaml" if ghost else "small_inception.yaml"))
    problems = []
    for seed in range(3):
        plan = random_plan(graph, BATCH, world.size, 110 + seed)
        program = Executor(graph, np, np.float32, plan=plan, world=world, sync=options,
                           batchnorm=ghost and {"group": ghost}).program
        ran = [(b.ranks, (b.stop - b.start) * 4, b.ready) for b in program.buckets]
        charged = [(b.ranks, b.nbytes, b.ready)
                   for b in device_buckets(graph, plan, world.rank, options, 4, default_machine(), ghost)]
        if ran != charged:
            problems.append(f"seed {seed}: the runtime runs {ran}, the model charges {charged}")
    agree(world, problems)


def test_the_thread_and_nonblocking_collectives_train_the_same_weights(world, monkeypatch):
    """Buckets summed by the communication thread (blocking MPI_Allreduce) and by MPI_Iallreduce tested between
    layers (SPMDCNN_SYNC_PROGRESS=test) train the same weights: bit for bit on two ranks (a sum of two terms has
    one value in either order), to rounding on more. MPI leaves the order of a sum to the algorithm, and a library
    may run different ones for its blocking and non-blocking collectives (Open MPI 5: coll/tuned and coll/libnbc,
    whose sums differ in the last bits on three ranks; MPICH 5: the same bits)."""
    from spmdcnn.comm.transport import progress
    if world.size == 1:
        pytest.skip("one rank sums nothing")
    graph = load_model(os.path.join(MODELS, "small_resnet.yaml"))
    plan = random_plan(graph, BATCH, world.size, 150)
    runs = {}
    for mode in ("thread", "test"):
        monkeypatch.setenv("SPMDCNN_SYNC_PROGRESS", mode)
        runs[progress()] = train(graph, plan, world, TINY)[0]
    problems = [] if len(runs) == 2 else [f"only the modes {sorted(runs)} ran"]
    first, *others = runs.values()
    for other in others:
        for name in first.params:
            a, b = first.params[name], other.params[name]
            if world.size == 2 and not np.array_equal(a, b):
                problems.append(f"{name} differs between the modes")
            elif not np.allclose(a, b, rtol=1e-12, atol=1e-12 * max(np.max(np.abs(a)), 1e-6)):
                problems.append(f"{name} differs between the modes by {np.max(np.abs(a - b)):.3g}")
    agree(world, problems)
