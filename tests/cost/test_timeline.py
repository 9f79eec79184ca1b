"""The timeline (``CostModel.simulate``): compute, exchanges and batchnorm on the critical path, gradient buckets on a
communication lane that overlaps backward, updates after each bucket's sum; its parts add up to the iteration."""

import os
import sys
from math import prod

import pytest

from spmdcnn.cost.buckets import SyncOptions
from spmdcnn.cost.compute import ComputeModel
from spmdcnn.cost.machine import parse_machine_text
from spmdcnn.cost.model import CostModel
from spmdcnn.cost.timeline import device_buckets
from spmdcnn.graph import load_model
from spmdcnn.tiling.plan import named

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mpi"))
from plans import random_plan  # noqa: E402  (tests/mpi/plans.py)

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")


def machine(bandwidth, latency):
    return parse_machine_text(f"""
format: spmdcnn-machine/1
nodes: 2
devices_per_node: 2
intra_node: {{bandwidth: {bandwidth:e}, latency: {latency:e}}}
inter_node: {{bandwidth: {bandwidth / 4:e}, latency: {latency * 2:e}}}
device: {{name: test, flops: 1.0e+10, memory_bandwidth: 1.0e+10, overhead: 1.0e-6}}
""")


def cost_model(name, batch, bandwidth=1e9, latency=1e-5, sync=None):
    graph = load_model(os.path.join(MODELS, f"{name}.yaml"))
    m = machine(bandwidth, latency)
    return graph, CostModel(graph, batch, m, ComputeModel(m.device), sync=sync)


@pytest.mark.parametrize("name,batch", [("alexnet", 16), ("small_resnet", 8), ("small_inception", 8)])
def test_the_parts_add_up_to_the_iteration(name, batch):
    graph, cost = cost_model(name, batch)
    for seed in range(4):
        plan = random_plan(graph, batch, 4, seed)
        for overlap in (True, False):
            p = cost.simulate(plan, {"overlap": overlap})
            assert p.iteration_s == pytest.approx(p.timeline.iteration_s, rel=1e-12)
            assert p.compute_s + p.transfer_s + p.sync_s == pytest.approx(p.iteration_s, rel=1e-12)
            assert all(row.sync_s >= 0 for row in p.layers)


@pytest.mark.parametrize("name,batch", [("alexnet", 16), ("small_resnet", 8)])
def test_overlap_hides_allreduces_behind_backward_and_never_costs_more(name, batch):
    graph, cost = cost_model(name, batch, bandwidth=2e8)
    plan = named("data", graph, batch, 4)
    options = SyncOptions(bucket_mb=0.005)           # several buckets even for small_resnet (25 KB)
    on, off = cost.simulate(plan, options), cost.simulate(plan, SyncOptions(bucket_mb=0.005, overlap=False))
    assert on.iteration_s < off.iteration_s
    assert on.timeline.allreduce_s == pytest.approx(off.timeline.allreduce_s)
    # without overlap every allreduce waits for the end of backward: exposed, but for the updates of the
    # buckets already summed, which run while the next are
    updates = sum(cost.compute.update_seconds(sum(prod(shape) for shape in layer.params.values()))
                  for layer in graph.layers if layer.params)
    exposed, allreduce = off.timeline.exposed_s, off.timeline.allreduce_s + cost.compute.wait * len(off.timeline.buckets)
    assert allreduce - updates - 1e-12 <= exposed <= allreduce + 1e-12
    assert on.timeline.exposed_s < off.timeline.exposed_s
    # the surrogate charges every layer's allreduce on the critical path: never below the timeline with overlap
    assert on.iteration_s <= cost.surrogate(plan).iteration_s * (1 + 1e-12)


def test_a_free_network_exposes_nothing_and_the_critical_path_stays():
    graph, cost = cost_model("small_resnet", 8, bandwidth=1e15, latency=0.0)
    plan = named("data", graph, 8, 4)
    p = cost.simulate(plan)
    assert p.timeline.exposed_s == pytest.approx(0.0, abs=1e-12)
    batchnorm = sum(row.sync_s for row in p.layers if graph.by_name[row.name].op == "batchnorm2d")
    assert p.sync_s == pytest.approx(batchnorm + p.overhead_s)


def test_a_slow_network_leaves_the_last_buckets_exposed():
    """With allreduces far slower than backward, the lane ends long after backward: the iteration is the first
    bucket's ready time plus the whole lane plus the last update."""
    graph, cost = cost_model("alexnet", 16, bandwidth=1e6, latency=1e-5)
    plan = named("data", graph, 16, 4)
    p = cost.simulate(plan)
    t = p.timeline
    first = t.buckets[0]
    lane = sum(b.seconds + cost.compute.wait for b in t.buckets)
    assert t.buckets[-1].end_s >= first.start_s + lane * (1 - 1e-12)
    assert t.iteration_s >= t.buckets[-1].end_s
    assert t.exposed_s > 0.5 * t.allreduce_s


def test_smaller_buckets_start_sooner_but_pay_more_latency():
    graph, cost = cost_model("alexnet", 16, bandwidth=1e9, latency=1e-3)
    plan = named("data", graph, 16, 4)
    big, small = (cost.simulate(plan, SyncOptions(bucket_mb=mb)) for mb in (25.0, 1.0))
    assert len(small.timeline.buckets) > len(big.timeline.buckets)
    assert small.timeline.buckets[0].start_s <= big.timeline.buckets[0].start_s
    assert small.timeline.allreduce_s > big.timeline.allreduce_s + (len(small.timeline.buckets)
                                                                    - len(big.timeline.buckets)) * 1e-3


def test_each_devices_buckets_hold_its_share_of_the_summed_gradients():
    graph, cost = cost_model("small_inception", 8)
    for seed in range(4):
        plan = random_plan(graph, 8, 4, 20 + seed)
        total = sum(b.nbytes for rank in range(4)
                    for b in device_buckets(graph, plan, rank, SyncOptions(), 4, cost.machine))
        synced = sum(row.bytes_synced for row in cost.simulate(plan).layers
                     if not graph.by_name[row.name].spec.reduced_in_layer)
        assert total == synced


def test_a_model_parallel_plan_has_no_buckets():
    graph, cost = cost_model("alexnet", 16)
    p = cost.simulate(named("model", graph, 16, 4))
    assert p.timeline.buckets == [] and p.timeline.exposed_s == 0
