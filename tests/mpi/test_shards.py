"""Checkpoints hold global arrays whatever the plan: gathering the shards gives the one-process tensors, and
scattering global arrays onto another plan gives each rank its rows."""

import os

import numpy as np

from conftest import agree
from plans import random_plan
from spmdcnn.graph import load_model
from spmdcnn.runtime.executor import Executor
from spmdcnn.runtime.shards import gather_global, restore

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")


def test_gather_then_scatter_onto_another_plan(world):
    graph = load_model(os.path.join(MODELS, "small_inception.yaml"))
    reference = Executor(graph, np, np.float64, seed=9)
    problems = []
    for seed in range(3):
        first = Executor(graph, np, np.float64, seed=9, plan=random_plan(graph, 4, world.size, 40 + seed),
                         world=world)
        params, buffers = gather_global(first, first.params), gather_global(first, first.buffers)
        if world.rank == 0:
            for store, gathered in ((reference.params, params), (reference.buffers, buffers)):
                if set(gathered) != set(store):
                    problems.append(f"seed {seed}: gathered {sorted(set(store) ^ set(gathered))} wrongly")
                problems += [f"seed {seed}: {name} differs" for name in store
                             if name in gathered and not np.array_equal(gathered[name], store[name])]
        else:
            if params or buffers:
                problems.append("a rank other than 0 received global arrays")
        params, buffers = world.bcast(params), world.bcast(buffers)
        second = Executor(graph, np, np.float64, seed=123, plan=random_plan(graph, 4, world.size, 80 + seed),
                          world=world)
        restore(second, None, [("params", name, array) for name, array in params.items()]
                + [("buffers", name, array) for name, array in buffers.items()], weights_only=True)
        for store, full in ((second.params, reference.params), (second.buffers, reference.buffers)):
            for name in store:
                c0, c1 = second.shards[name]
                if not np.array_equal(store[name], full[name][c0:c1]):
                    problems.append(f"seed {seed}: {name} rows {c0}:{c1} not restored")
    agree(world, problems)


def test_the_rank_on_the_node_is_the_shared_memory_split(world):
    """Every rank runs on this one machine: its index on the node is its rank, whatever the launcher's variables."""
    got = world.local_rank()
    agree(world, [] if got == world.rank and world.local_rank() == got else [f"rank {world.rank}: {got}"])


def test_each_replica_groups_gradients_are_one_bucket_of_the_flat_array(world):
    """The shards a replica group sums after backward lie side by side: one Bucket per group covering exactly them,
    and every layer's Site names the bucket its gradients are in."""
    graph = load_model(os.path.join(MODELS, "small_resnet.yaml"))
    problems = []
    for seed in range(3):
        executor = Executor(graph, np, np.float64, plan=random_plan(graph, 4, world.size, 60 + seed), world=world)
        program = executor.program
        summed = sorted((shard.start, shard.stop, shard.group) for shard in program.layout.values()
                        if shard.param and len(shard.group) > 1
                        and not graph.by_name[shard.layer].spec.reduced_in_layer)
        covered = sorted(bucket.ranks for bucket in program.buckets)
        if covered != sorted({group for _, _, group in summed}):
            problems.append(f"seed {seed}: buckets for groups {covered}, summed shards in {summed}")
        for start, stop, group in summed:
            bucket = next((b for b in program.buckets if b.start <= start and stop <= b.stop), None)
            if bucket is None or bucket.ranks != group:
                problems.append(f"seed {seed}: shard [{start}, {stop}) of group {group} in bucket {bucket}")
        if sum(b.stop - b.start for b in program.buckets) != sum(stop - start for start, stop, _ in summed):
            problems.append(f"seed {seed}: the buckets hold more than the summed shards")
        for site in program.sites.values():
            shards = [program.layout[f"{site.layer.name}.{k}"] for k in site.layer.params] if site.box else []
            inside = [s for s in shards if site.bucket and site.bucket.start <= s.start and s.stop <= site.bucket.stop]
            if site.bucket is not None and len(inside) != len(shards):
                problems.append(f"seed {seed}: {site.layer.name}'s shards are not all in its bucket")
            if site.bucket is None and any(s.start < s.stop and len(s.group) > 1 for s in shards) \
                    and not site.layer.spec.reduced_in_layer:
                problems.append(f"seed {seed}: {site.layer.name} has summed shards but no bucket")
    agree(world, problems)
