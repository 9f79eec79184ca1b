"""Ghost batch norm (``batchnorm: {group: G}``) under any plan equals one process under the same G: losses,
weights, momentum and running statistics; a tile holding whole groups communicates nothing for them."""

import os

import numpy as np
import pytest

from conftest import agree
from plans import answers, random_plan
from spmdcnn.graph import load_model
from spmdcnn.runtime.executor import Executor
from spmdcnn.runtime.optimizer import SGD
from spmdcnn.tiling.config import ParallelConfig
from spmdcnn.tiling.ghost import components
from spmdcnn.tiling.plan import named

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
BATCH = 8
STEPS = 3


def _train(graph, plan, world, group):
    executor = Executor(graph, np, np.float64, seed=5, plan=plan, world=world, batchnorm={"group": group})
    optimizer = SGD(executor.params.shapes, np.float64, np, lr=0.05, momentum=0.9, weight_decay=1e-3)
    rng = np.random.default_rng(8)
    losses = []
    for step in range(STEPS):
        images = rng.standard_normal((BATCH,) + graph.input_shape)
        labels = answers(graph, rng, BATCH)
        loss, _, _ = executor.forward(images, labels, step=step)
        executor.backward(update=optimizer.updater(executor.params.flat, executor.grads.flat))
        losses.append(loss)
    losses.append(executor.forward(images, labels, step=STEPS, training=False)[0])
    return losses, executor, optimizer


def _problems(tag, reference, run):
    (ref_losses, ref, ref_opt), (losses, executor, optimizer) = reference, run
    problems = [f"{tag}: loss {i}: {a!r} != {b!r}" for i, (a, b) in enumerate(zip(losses, ref_losses))
                if abs(a - b) > 1e-10 * abs(b)]
    for tensor, index in executor.shards.items():
        pairs = [(executor.params, ref.params), (optimizer.velocity, ref_opt.velocity)] \
            if tensor in executor.params else [(executor.buffers, ref.buffers)]
        for mine, theirs in pairs:
            want = theirs[tensor][index]
            error = float(np.max(np.abs(mine[tensor] - want)))
            if error > 1e-10 * max(float(np.max(np.abs(want))), 1e-6):
                problems.append(f"{tag}: {tensor} off by {error:.3g}")
    return problems


@pytest.mark.parametrize("name", ["small_resnet", "small_inception", "tiny_volume"])
@pytest.mark.parametrize("group", [2, 4, 8])
def test_any_plan_equals_one_process_under_the_same_group(world, name, group):
    graph = load_model(os.path.join(MODELS, f"{name}.yaml"))
    reference = _train(graph, None, None, group)
    problems = []
    plans = [random_plan(graph, BATCH, world.size, 130 + seed) for seed in range(2)]
    plans.append(named("data", graph, BATCH, world.size))
    for plan in plans:
        problems += _problems(f"{plan.source} G={group}", reference, _train(graph, plan, world, group))
    agree(world, problems)


def test_ghost_batch_norm_differs_from_the_global_batch():
    graph = load_model(os.path.join(MODELS, "small_resnet.yaml"))
    ghost = _train(graph, None, None, 2)[0]
    executor = Executor(graph, np, np.float64, seed=5)
    rng = np.random.default_rng(8)
    images = rng.standard_normal((BATCH,) + graph.input_shape)
    labels = rng.integers(0, graph.num_classes, BATCH)
    assert abs(executor.forward(images, labels)[0] - ghost[0]) > 1e-6


def test_components_join_the_tiles_that_share_a_group():
    shape = (8, 4, 6, 6)
    # n split in 4 (two samples each), groups of 4: tiles {0, 1} share group 0, {2, 3} group 1
    sites = components(ParallelConfig((4, 1, 1, 1), (0, 1, 2, 3)), shape, 4)
    assert sites[0].component == sites[1].component == (0, 1) and sites[2].component == (2, 3)
    assert sites[1].spans == ((0, 2),) and not sites[0].whole and sites[2].leader and not sites[3].leader
    # tiles holding whole groups are components of one
    alone = components(ParallelConfig((4, 1, 1, 1), (0, 1, 2, 3)), shape, 2)
    assert all(site.component == (d,) and site.spans == ((0, 2),) for d, site in alone.items())
    # a split over h joins the tiles of a group (devices n*4 + c*2 + h); each channel part is a replica group
    rows = components(ParallelConfig((2, 2, 2, 1), tuple(range(8))), shape, 4)
    assert rows[0].component == (0, 1) and rows[4].component == (4, 5) and rows[0].whole is False
    # uneven: samples 0-2 and 3-7 with groups of 4 overlap in group 0: one component, the whole group
    uneven = components(ParallelConfig((2, 1, 1, 1), (0, 1)), (7, 4, 6, 6), 4)
    assert uneven[0].component == (0, 1) and uneven[0].whole


def test_tiles_of_whole_groups_send_nothing_for_batch_norm(world):
    """Data parallelism with one group per rank: batch norm moves no statistics (the counters see only the
    gradients, the deferred running statistics and the loss)."""
    if world.size == 1:
        pytest.skip("needs ranks")
    graph = load_model(os.path.join(MODELS, "small_resnet.yaml"))
    plan = named("data", graph, 2 * world.size, world.size)
    executor = Executor(graph, np, np.float64, plan=plan, world=world, batchnorm={"group": 2})
    gathers = []
    original = world.allgather_array
    world.allgather_array = lambda array, comm: gathers.append(array.shape) or original(array, comm)
    try:
        rng = np.random.default_rng(1)
        executor.forward(rng.standard_normal((2 * world.size,) + graph.input_shape),
                         rng.integers(0, graph.num_classes, 2 * world.size))
        executor.backward()
    finally:
        world.allgather_array = original
    agree(world, [f"gathered {gathers}"] if gathers else [])


def test_a_group_that_does_not_divide_the_batch_is_refused_for_training_only():
    graph = load_model(os.path.join(MODELS, "small_resnet.yaml"))
    executor = Executor(graph, np, np.float64, batchnorm={"group": 4})
    rng = np.random.default_rng(0)
    images, labels = rng.standard_normal((6,) + graph.input_shape), rng.integers(0, graph.num_classes, 6)
    with pytest.raises(ValueError, match="batchnorm.group 4 does not divide the batch of 6"):
        executor.forward(images, labels)
    executor.forward(images, labels, training=False)        # evaluation takes any batch
    with pytest.raises(ValueError, match="does not divide"):
        Executor(graph, np, np.float64, plan=named("data", graph, 6, 1), batchnorm={"group": 4})
