"""``t_c`` from profiles and the analytic model, and ``t_s`` of replica groups."""

import os

import numpy as np
import pytest

from spmdcnn.cost.compute import ComputeModel, Profile, update_work, work
from spmdcnn.cost.tiles import TileShape, tile_shapes
from spmdcnn.cost.machine import Device, parse_machine_text
from spmdcnn.cost.model import CostModel
from spmdcnn.cost.sync import layer_sync
from spmdcnn.graph import load_model
from spmdcnn.tiling.config import ParallelConfig
from spmdcnn.tiling.plan import named

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
MACHINE = parse_machine_text("""format: spmdcnn-machine/1
nodes: 2
devices_per_node: 2
intra_node: {bandwidth: 1.0e+10, latency: 1.0e-5}
inter_node: {bandwidth: 1.0e+9, latency: 1.0e-4}
device: {name: test, flops: 1.0e+11, memory_bandwidth: 1.0e+10, overhead: 1.0e-6}
""")


def model(name):
    return load_model(os.path.join(MODELS, f"{name}.yaml"))


def test_uneven_splits_give_a_few_distinct_tiles_and_the_slowest_counts():
    conv = model("alexnet").by_name["conv2"]
    even = tile_shapes(conv, ParallelConfig((2, 1, 1, 1), (0, 1)), 4)
    uneven = tile_shapes(conv, ParallelConfig((3, 1, 1, 1), (0, 1, 2)), 4)     # 4 samples in 3 parts: 1, 1, 2
    assert len(even) == 1 and sorted(s.output[0] for s in uneven) == [1, 2]
    compute = ComputeModel(MACHINE.device)
    assert compute.layer_seconds(conv, ParallelConfig((3, 1, 1, 1), (0, 1, 2)), 4) == pytest.approx(
        compute.layer_seconds(conv, ParallelConfig((2, 1, 1, 1), (0, 1)), 4))


def test_a_profile_gives_measured_times_and_calibrates_the_rest():
    graph = model("cifar_cnn")
    layer = graph.by_name["conv2.conv"]
    shapes = tile_shapes(layer, ParallelConfig((1, 1, 1, 1), (0,)), 8)
    measured = {s: 3 * ComputeModel(Device()).analytic(*work(s)) for s in shapes}
    store = Profile("test")
    for shape, seconds in measured.items():
        store.add(shape, seconds)
    compute = ComputeModel(Device(), store)
    assert compute.tile_seconds(shapes[0]) == measured[shapes[0]]
    other = tile_shapes(layer, ParallelConfig((2, 1, 1, 1), (0, 1)), 8)[0]           # not in the profile
    assert compute.tile_seconds(other) == pytest.approx(3 * ComputeModel(Device()).analytic(*work(other)))


def test_reference_iterations_scale_tiles_and_charge_each_synchronization(tmp_path):
    graph = model("small_resnet")
    store = Profile("test", in_situ={"small_resnet": {"measured": 2.0, "isolated": 1.0, "wait": 1e-3}})
    store.save(str(tmp_path / "p.json"))
    again = Profile.load(str(tmp_path / "p.json"))
    assert again.factor == 2.0 and again.wait == 1e-3
    plain = CostModel(graph, 8, MACHINE, ComputeModel(MACHINE.device))
    scaled = CostModel(graph, 8, MACHINE, ComputeModel(MACHINE.device, again))
    plan = named("owt", graph, 8, 4)
    a, b = plain.surrogate(plan), scaled.surrogate(plan)       # the search's: every allreduce on the path
    assert b.compute_s == pytest.approx(2 * a.compute_s)
    exchanges = sum(1 for row in a.layers if row.bytes_transferred)
    allreduces = sum(2 if graph.by_name[row.name].op == "batchnorm2d" else 1 for row in a.layers if row.bytes_synced)
    assert b.transfer_s - a.transfer_s == pytest.approx(2 * exchanges * 1e-3)
    assert b.sync_s - a.sync_s == pytest.approx((allreduces + 1) * 1e-3)


def test_allreduce_groups_use_their_slowest_link():
    fc = model("alexnet").by_name["fc6"]
    within = layer_sync(fc, ParallelConfig((2, 1), (0, 1)), MACHINE)       # one node
    across = layer_sync(fc, ParallelConfig((2, 1), (1, 2)), MACHINE)       # two nodes
    split = layer_sync(fc, ParallelConfig((1, 2), (0, 1)), MACHINE)        # no replicas
    assert across.seconds > 5 * within.seconds and split.seconds == 0 and split.bytes == 0
    assert within.bytes == across.bytes == 2 * fc.num_params * 4
    # two devices: one step of recursive doubling (the whole message) beats a ring's two half-messages
    assert MACHINE.allreduce_time((0, 1), 1e6) == pytest.approx(1e6 / 1e10 + 1e-5)


REGIMES = """format: spmdcnn-machine/1
nodes: 2
devices_per_node: 8
intra_node: {bandwidth: 1.0e+10, latency: 1.0e-5}
inter_node: {bandwidth: 1.0e+9, latency: 1.0e-4}
allreduce:
  intra_node: {small: {bandwidth: 2.0e+9, latency: 1.0e-6}, large: {bandwidth: 1.0e+10, latency: 5.0e-5}}
"""


def test_allreduce_regimes_small_by_recursive_doubling_large_by_a_ring():
    from spmdcnn.cost.machine import parse_machine_text
    machine = parse_machine_text(REGIMES)
    group = tuple(range(8))
    doubling = lambda n: 3 * (n / 2e9 + 1e-6)                       # noqa: E731
    ring = lambda n: 2 * 7 * (n / 8 / 1e10 + 5e-5)                  # noqa: E731
    assert machine.allreduce_time(group, 64) == pytest.approx(doubling(64))
    assert machine.allreduce_time(group, 64 << 20) == pytest.approx(ring(64 << 20))
    sizes = [2 ** k for k in range(3, 27)]
    times = [machine.allreduce_time(group, n) for n in sizes]
    assert times == sorted(times)                                   # no jump at the crossover
    # a group across nodes has no regimes given: both are the inter-node link
    across = (7, 8)
    assert machine.allreduce_time(across, 1e6) == pytest.approx(min(1e6 / 1e9 + 1e-4, 2 * (0.5e6 / 1e9 + 1e-4)))
    again = parse_machine_text(machine.to_yaml())
    assert again.allreduce == machine.allreduce


@pytest.mark.parametrize("text, fragment", [
    ("allreduce: {intra: {}}", "intra"),
    ("allreduce: {intra_node: {small: {bandwidth: 1.0e+9, latency: 1.0e-6}}}", "large"),
    ("allreduce: {intra_node: {small: {bandwidth: 0, latency: 1.0e-6}, large: {bandwidth: 1, latency: 0}}}",
     "bandwidth"),
    ("allreduce: 3", "allreduce"),
])
def test_bad_allreduce_regimes_are_refused_naming_the_key(text, fragment):
    from spmdcnn.cost.machine import MachineError, parse_machine_text
    with pytest.raises(MachineError, match=fragment):
        parse_machine_text(REGIMES.split("allreduce:")[0] + text + "\n", "m.yaml")


def test_a_tile_shape_survives_json():
    shape = TileShape("conv2d", (("kernel", (3, 3)), ("stride", (1, 2))), ((2, 3, 8, 8),), (2, 4, 6, 3),
                      (("weight", (4, 3, 3, 3)),), False)
    assert TileShape.from_json(shape.to_json()) == shape


@pytest.mark.parametrize("name", ["tiny_cnn", "small_inception", "small_resnet", "cifar_cnn"])
def test_distinct_tiles_are_those_of_every_tile(name):
    from spmdcnn.cost.tiles import tile_shape
    from spmdcnn.planner.configs import configurations
    from spmdcnn.tiling.config import output_shape
    from spmdcnn.tiling.fields import needs
    graph = model(name)
    for devices, batch in ((3, 5), (8, 9)):
        for layer in graph.layers:
            in_shapes = [(batch,) + tuple(s) for s in layer.in_shapes]
            out = output_shape(layer, batch)
            for config in configurations(layer, batch, devices):
                every = {tile_shape(layer, box, needs(layer, box, in_shapes))
                         for box in (config.box(out, index) for index in config.indices())}
                assert set(tile_shapes(layer, config, batch)) == every, (layer.name, config)


OPS = {"conv2d": (("dilation", (1, 1)), ("kernel", (3, 3)), ("stride", (1, 1))),
       "maxpool2d": (("dilation", (1, 1)), ("kernel", (3, 3)), ("stride", (2, 2))),
       "avgpool2d": (("dilation", (1, 1)), ("kernel", (2, 2)), ("stride", (2, 2))),
       "linear": (), "batchnorm2d": (("eps", 1e-5), ("momentum", 0.1)), "relu": (), "dropout": (), "concat": (),
       "add": (), "flatten": (), "global_avgpool": (), "softmax_cross_entropy": ()}


@pytest.mark.parametrize("op", sorted(OPS))
def test_work_never_shrinks_when_a_tile_grows(op):
    """The contract of ``work``: growing any one extent (output, an input, a parameter shard) never lowers any of
    calls, FLOPs and bytes; the planner times only the largest kinds of part on it."""
    rng = np.random.default_rng(0)
    rank = 2 if op in ("linear", "softmax_cross_entropy", "flatten") else 4
    for _ in range(300):
        out = tuple(int(v) for v in rng.integers(0, 7, rank))
        ins = [list(int(v) for v in rng.integers(0, 9, rank)) for _ in range(2 if op in ("concat", "add") else 1)]
        params = [["weight", [int(rng.integers(0, 6)), 3, 3, 3]]] if op in ("conv2d", "linear", "batchnorm2d") else []
        tile = TileShape(op, OPS[op], tuple(map(tuple, ins)), out, tuple((n, tuple(s)) for n, s in params), True)
        which = int(rng.integers(0, 3 if params else 2))
        if which == 0:
            grown_out = list(out)
            grown_out[int(rng.integers(0, rank))] += 1
            grown = TileShape(op, tile.attrs, tile.inputs, tuple(grown_out), tile.params, True)
        elif which == 1:
            ins[int(rng.integers(0, len(ins)))][int(rng.integers(0, rank))] += 1
            grown = TileShape(op, tile.attrs, tuple(map(tuple, ins)), out, tile.params, True)
        else:
            params[0][1][0] += 1
            grown = TileShape(op, tile.attrs, tile.inputs, out, tuple((n, tuple(s)) for n, s in params), True)
        assert all(b >= a for a, b in zip(work(tile), work(grown))), (tile, grown)
    assert all(b >= a for a, b in zip(update_work(10), update_work(11)))


def test_a_model_measured_in_place_is_scaled_by_its_own_reference_iteration():
    """A cache holds the reference iterations of several models: the cost model of one of them takes its own
    scale, meeting latency and runtime work, not the median over the others; a model it has not measured, the
    median."""
    from spmdcnn.cost.compute import reference_key
    from spmdcnn.planner.service import cost_model
    graph, other = model("small_resnet"), model("tiny_cnn")
    mine, theirs = reference_key(graph, 8, 2, 2), reference_key(other, 8, 2, 2)
    store = Profile("test", in_situ={
        mine: {"measured": 3.0, "isolated": 1.0, "latency": 1e-3, "drift": 0.0, "step": 2e-3},
        theirs: {"measured": 1.0, "isolated": 1.0, "latency": 0.0, "drift": 0.0, "step": 0.0},
        "third": {"measured": 1.2, "isolated": 1.0, "latency": 0.0, "drift": 0.0, "step": 0.0}})
    own = cost_model(graph, 8, 2, profile=store).compute
    assert (own.profile.factor, own.wait, own.step) == (3.0, 1e-3, 2e-3)
    assert store.factor == 1.2 and len(store.in_situ) == 3          # the cache itself is unchanged
    elsewhere = cost_model(graph, 16, 2, profile=store).compute     # another batch: not measured in place
    assert elsewhere.profile.factor == 1.2
    assert own.profile.entries is store.entries and own.profile.trials is store.trials
