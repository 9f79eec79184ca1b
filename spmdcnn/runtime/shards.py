"""Global arrays from this rank's shards and back: what checkpoints hold (DESIGN.md §3.5) is independent of the
plan, so a run restores onto any plan and any number of ranks."""

import numpy as np

from .. import backend


def gather_global(executor, store):
    """``{name: global array}`` on rank 0 (``{}`` elsewhere) from the shards in ``store`` (a FlatStore laid
    out like the executor's parameters or buffers). Each shard comes from the lowest rank of its replica group."""
    program = executor.program
    mine = {name: (executor.shards[name], backend.to_numpy(store[name]))
            for name in store if program.representative(name)}
    pieces = executor.world.gather(mine)
    if executor.world.rank != 0:
        return {}
    result = {}
    for name in _names(executor.graph, store, pieces):
        full = np.empty(program.global_shape(name), dtype=executor.dtype)
        covered = 0
        for part in pieces:
            if name in part:
                (c0, c1), array = part[name]
                full[c0:c1] = array
                covered += c1 - c0
        assert covered == full.shape[0], f"{name}: shards cover {covered} of {full.shape[0]} rows"
        result[name] = full
    return result


def _names(graph, store, pieces):
    """Every tensor some rank holds, in the model's order."""
    held = set().union(*(part.keys() for part in pieces))
    kinds = ("weight", "bias", "running_mean", "running_var")
    return [f"{layer.name}.{kind}" for layer in graph.layers for kind in kinds if f"{layer.name}.{kind}" in held]


def scatter_global(executor, store, arrays):
    """Copy this rank's rows of the global ``arrays`` into ``store`` (names missing from ``arrays`` are left)."""
    xp = executor.xp
    for name in store:
        if name in arrays:
            c0, c1 = executor.shards[name]
            store[name][...] = xp.asarray(arrays[name][c0:c1], dtype=executor.dtype)
