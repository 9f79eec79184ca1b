"""Checkpoints hold global arrays whatever the plan: gathering the shards gives the one-process tensors, and
scattering global arrays onto another plan gives each rank its rows."""

import os

import numpy as np
import pytest

from conftest import agree
from decoder_models import DECODER, SEGMENTER_VOLUME
from plans import random_plan
from spmdcnn.graph import load_model, parse_model
from spmdcnn.runtime.executor import Executor
from spmdcnn.runtime.shards import gather_global, restore

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")


@pytest.mark.parametrize("name", ["small_inception", "decoder", "segmenter_volume"])
def test_gather_then_scatter_onto_another_plan(world, name):
    """The decoder's transposed convolutions hold their output channels' part of their weight's axis 1."""
    inline = {"decoder": DECODER, "segmenter_volume": SEGMENTER_VOLUME}
    graph = parse_model(inline[name]) if name in inline else load_model(os.path.join(MODELS, f"{name}.yaml"))
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
                index = second.shards[name]
                if not np.array_equal(store[name], full[name][index]):
                    problems.append(f"seed {seed}: {name} part {index} not restored")
    agree(world, problems)


def test_the_rank_on_the_node_is_the_shared_memory_split(world):
    """Every rank runs on this one machine: its index on the node is its rank, whatever the launcher's variables."""
    got = world.local_rank()
    agree(world, [] if got == world.rank and world.local_rank() == got else [f"rank {world.rank}: {got}"])
