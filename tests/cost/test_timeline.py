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
    exposed, allreduce = off.timeline.exposed_s, off.timeline.allreduce_s
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
    lane = sum(b.seconds + b.wait_s for b in t.buckets)
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


def test_a_bucket_starts_when_every_member_of_its_group_is_free():
    """Device 1 sums a long bucket with device 2 first: its bucket with device 0 waits for it on both devices."""
    from spmdcnn.cost.timeline import BucketCost, schedule

    def bucket(ranks, seconds, layer):
        return BucketCost(ranks, 8, {layer: 8}, layer, seconds)
    per_device = [[bucket((0, 1), 1.0, "b")], [bucket((1, 2), 5.0, "a"), bucket((0, 1), 1.0, "b")],
                  [bucket((1, 2), 5.0, "a")]]
    schedule(per_device, {"a": 0.0, "b": 0.0}, 10.0, SyncOptions(), 0.0)
    assert per_device[1][0].end_s == per_device[2][0].end_s == 5.0
    assert per_device[0][0].start_s == per_device[1][1].start_s == 5.0
    assert per_device[0][0].end_s == per_device[1][1].end_s == 6.0
    crossed = [[bucket((0, 1), 1.0, "b"), bucket((0, 1), 2.0, "c")], [bucket((0, 1), 2.0, "c")]]
    with pytest.raises(RuntimeError, match="not the same"):
        schedule(crossed, {"b": 0.0, "c": 0.0}, 1.0, SyncOptions(), 0.0)


def test_a_layer_split_over_two_buckets_is_updated_once():
    """fc's bias fills the small first bucket and its weight the next: each bucket updates its share of fc."""
    from spmdcnn.cost.timeline import BucketCost, device_end
    first = BucketCost((0, 1), 1, {"fc": 1}, "fc", 0.0, 0.0, 0.5)
    second = BucketCost((0, 1), 3, {"fc": 3}, "fc", 0.0, 0.0, 0.5)
    end = device_end([first, second], 0.0, {"fc": 1.0, "conv": 2.0})
    assert end == pytest.approx(2.0 + 1.0)          # conv's update first (unbucketed), then fc's once
    assert first.exposed_s == 0.0 and second.exposed_s == 0.0


class _Layer:
    def __init__(self, name):
        self.name, self.needs_grad = name, True


def test_a_synchronization_point_waits_for_the_drift_since_the_last_one():
    """``walk``: each point (an exchange that moves data, batch norm's gather and sum, the loss's sum) loses
    ``wait(gap)``, the gap the compute lane's time from the end of the previous point to its start (its own
    communication left out); parts without a point keep their seconds."""
    from spmdcnn.cost.timeline import Lane, walk
    a, b = _Layer("a"), _Layer("b")
    lanes = [(a, Lane(0.0, 1.0, 2.0, 0.0)), (b, Lane(0.5, 1.2, 2.0, 0.5, (0.5, 0.2, None, 0.5)))]
    walked = walk(lanes, 0.1, lambda gap: 0.1 * gap)
    found, overhead, met = walked.layers, walked.overhead_s, walked.met
    # forward: a 1.0; b's exchange starts at 1.0, waits 0.1, ends at 1.6; b's 1.0 of compute, then its gather at
    # 2.6 waits 0.1, ends at 2.9; the loss's sum starts at once and waits nothing, ends at 3.0; backward: b 2.0,
    # its exchange starts at 5.0, waits 0.2, ends at 5.7; a 2.0, no point
    assert found[0][1] == Lane(0.0, 1.0, 2.0, 0.0)
    assert found[1][1][:4] == pytest.approx((0.6, 1.3, 2.0, 0.7))
    assert overhead == pytest.approx(0.1)
    assert met == pytest.approx([1.6, 2.9, 3.0, 5.7])
    assert walked.ready == pytest.approx({"b": 5.0, "a": 7.7}) and walked.end == pytest.approx(7.7)
    assert [kind for _, kind, _, _ in walked.spans] == ["forward", "exchange", "forward", "loss", "backward",
                                                         "exchange", "backward"]


@pytest.mark.parametrize("name,batch", [("alexnet", 16), ("small_resnet", 8)])
def test_the_drift_lost_on_the_compute_lane_is_at_most_the_drift_of_its_compute(name, batch):
    """However many points a plan synchronizes at, the gaps between them never add up to more than the lane's
    own time: the waits on it are at most ``drift`` times the iteration without them, and a plan whose exchanges
    follow one another closely loses less per exchange than the first after a stretch of compute."""
    graph, cost = cost_model(name, batch)
    cost.compute.drift = 0.0
    still = [cost.simulate(random_plan(graph, batch, 4, seed)) for seed in range(4)]
    cost.compute.drift = 0.05
    drifting = [cost.simulate(random_plan(graph, batch, 4, seed)) for seed in range(4)]
    for before, after in zip(still, drifting):
        lane = before.timeline.backward_end_s
        assert before.timeline.backward_end_s < after.timeline.backward_end_s <= lane * 1.05 * (1 + 1e-12)


def test_a_point_costs_the_profiles_latency_and_drift_and_older_profiles_their_wait():
    """A point after ``gap`` seconds of the model's compute costs ``latency + drift * gap``; a profile from before
    latencies were measured is charged its wait per point, and its drift (then measured against each rank's own
    compute, not the model's) is not used."""
    from spmdcnn.cost.compute import Profile
    graph, cost = cost_model("alexnet", 16)
    m = cost.machine
    old = Profile("test", in_situ={"x": {"measured": 1.0, "isolated": 1.0, "wait": 2e-3, "drift": 1.6}})
    new = Profile("test", in_situ={"x": {"measured": 1.0, "isolated": 1.0, "latency": 1e-3, "drift": 0.1,
                                         "step": 4e-3}})
    assert (old.drift, old.wait, old.step) == (0.0, 2e-3, 0.0) and (new.drift, new.wait, new.step) == (0.1, 1e-3,
                                                                                                      4e-3)
    charged = [CostModel(graph, 16, m, ComputeModel(m.device, p)).point_wait(0.5) for p in (old, new)]
    assert charged == pytest.approx([2e-3, 1e-3 + 0.05])


def test_the_runtimes_work_per_step_is_added_once_to_every_plan():
    from spmdcnn.cost.compute import Profile
    graph, cost = cost_model("alexnet", 16)
    m = cost.machine
    bare = Profile("test", in_situ={"x": {"measured": 1.0, "isolated": 1.0, "latency": 0.0, "drift": 0.0}})
    busy = Profile("test", in_situ={"x": {"measured": 1.0, "isolated": 1.0, "latency": 0.0, "drift": 0.0,
                                          "step": 4e-3}})
    for seed in range(3):
        plan = random_plan(graph, 16, 4, seed)
        a, b = (CostModel(graph, 16, m, ComputeModel(m.device, p)).simulate(plan) for p in (bare, busy))
        assert b.iteration_s == pytest.approx(a.iteration_s + 4e-3)
        assert b.timeline.iteration_s == pytest.approx(b.iteration_s)
    one = named("data", graph, 16, 1)
    a, b = (CostModel(graph, 16, m, ComputeModel(m.device, p)).simulate(one) for p in (bare, busy))
    assert b.iteration_s == pytest.approx(a.iteration_s + 4e-3)     # one process too: its steps' own work


def served(bandwidth=1e9, latency=1e-5):
    text = machine(bandwidth, latency).to_yaml().replace("name: machine", "name: served") + "sync: parameter-server\n"
    return parse_machine_text(text)


@pytest.mark.parametrize("name,batch", [("alexnet", 16), ("small_resnet", 8), ("small_inception", 8)])
def test_through_parameter_servers_the_compute_lane_is_the_papers_additive_cost(name, batch):
    """sync: parameter-server: each layer's gradients pushed to its groups' servers right after its backward, on
    the critical path (the surrogate's t_s: one way of (g - 1) transfers in a node and (n - 1) between nodes), and
    pulled back on the communication lane, each layer's update after its pull: the iteration is the paper's
    additive t_o at least, and at most that and every pull of the slowest device."""
    graph = load_model(os.path.join(MODELS, f"{name}.yaml"))
    m = served()
    cost = CostModel(graph, batch, m, ComputeModel(m.device))
    for seed in range(4):
        plan = random_plan(graph, batch, 4, seed)
        additive = cost.surrogate(plan).iteration_s
        for overlap in (True, False):
            p = cost.simulate(plan, {"overlap": overlap})
            pulls = sum(bucket.seconds for bucket in p.timeline.buckets)
            assert additive * (1 - 1e-9) <= p.iteration_s <= (additive + pulls) * (1 + 1e-9)
            assert p.compute_s + p.transfer_s + p.sync_s == pytest.approx(p.iteration_s, rel=1e-12)
            assert len({(b.ranks, b.ready) for b in p.timeline.buckets}) == len(p.timeline.buckets)
    plan = named("data", graph, batch, 4)           # one group of 4 devices on 2 nodes of 2: g = 2, n = 2
    p = cost.simulate(plan)
    for layer, row in zip(graph.layers, p.layers):
        if layer.params and not layer.spec.reduced_in_layer:
            nbytes = sum(prod(shape) for shape in layer.params.values()) * 4
            push = nbytes / m.intra_node.bandwidth + m.intra_node.latency + nbytes / m.inter_node.bandwidth \
                + m.inter_node.latency
            assert row.sync_s >= push * (1 - 1e-9), layer.name
            assert row.allreduce_s == pytest.approx(2 * push, rel=1e-9), layer.name    # push and pull


def test_a_parameter_server_grows_with_its_group_where_a_ring_does_not():
    """The paper's point against 2018's data parallelism: a server's link carries every replica's gradients (linear
    in the replicas), a ring's carries about twice the gradients whatever the group."""
    graph = load_model(os.path.join(MODELS, "alexnet.yaml"))
    one_node = parse_machine_text("format: spmdcnn-machine/1\nnodes: 1\ndevices_per_node: 8\n"
                                  "intra_node: {bandwidth: 1.0e+9, latency: 0}\n")
    server = parse_machine_text(one_node.to_yaml() + "sync: parameter-server\n")
    sync = {}
    for m in (one_node, server):
        for devices in (2, 8):
            plan = named("data", graph, 8 * devices, devices)
            sync[m.sync, devices] = CostModel(graph, 8 * devices, m, ComputeModel(m.device)).surrogate(plan).sync_s
    assert sync["parameter-server", 8] > 5 * sync["parameter-server", 2]
    assert sync["allreduce", 8] < 2 * sync["allreduce", 2]


def test_a_sync_mode_other_than_the_two_is_refused_where_it_is_made():
    from spmdcnn.cost.machine import Link, Machine, MachineError
    with pytest.raises(ValueError, match="the machine's sync must be 'allreduce' or 'parameter-server', got 'ring'"):
        SyncOptions(mode="ring")
    with pytest.raises(MachineError, match="'sync' must be 'allreduce' or 'parameter-server', got 'ps'"):
        Machine("m", 1, 2, Link(1e9, 0.0), Link(1e9, 0.0), sync="ps")
    assert SyncOptions.of({"bucket_mb": 2}, "parameter-server").served
    assert not SyncOptions.of(SyncOptions(mode="parameter-server"), "allreduce").served
