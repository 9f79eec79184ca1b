"""Global arrays from this rank's shards and back: what checkpoints hold (docs/formats.md#checkpoint-files) is
independent of the plan, so a run restores onto any plan and any number of ranks."""

import numpy as np

from .. import backend


def gather_global(executor, store):
    """``{name: global array}`` on rank 0 (``{}`` elsewhere) from the shards in ``store`` (a FlatStore laid
    out like the executor's parameters or buffers). Each shard comes from the lowest rank of its replica group."""
    program = executor.program
    mine = {name: (program.layout[name].axis, program.layout[name].rows, backend.to_numpy(store[name]))
            for name in store if program.representative(name)}
    pieces = executor.world.gather(mine)
    if executor.world.rank != 0:
        return {}
    result = {}
    for name in _names(executor.graph, store, pieces):
        full = np.empty(program.global_shape(name), dtype=executor.param_dtype)
        covered = extent = 0
        for part in pieces:
            if name in part:
                axis, (c0, c1), array = part[name]
                full[(slice(None),) * axis + (slice(c0, c1),)] = array
                covered, extent = covered + c1 - c0, full.shape[axis]
        if covered != extent:
            raise RuntimeError(f"{name}: the ranks' shards cover {covered} of its {extent} rows")
        result[name] = full
    return result


def _names(graph, store, pieces):
    """Every tensor some rank holds, in the model's order."""
    held = set().union(*(part.keys() for part in pieces))
    return [f"{layer.name}.{kind}" for layer in graph.layers for kind in list(layer.params) + list(layer.buffers)
            if f"{layer.name}.{kind}" in held]


def restore(executor, optimizer, tensors, weights_only=False):
    """Copy this rank's rows of each global ``(group, name, array)`` of a checkpoint into the executor's
    parameters and buffers (``group`` params or buffers) and the optimizer's momentum (momentum; not with
    ``weights_only``, when ``optimizer`` may be None). Names this rank holds no shard of are passed over."""
    stores = {"params": executor.params, "buffers": executor.buffers,
              "momentum": None if weights_only else optimizer.velocity}
    for group, name, array in tensors:
        store = stores[group]
        if store is not None and name in store:
            store[name][...] = executor.xp.asarray(array[executor.program.layout[name].index],
                                                   dtype=executor.param_dtype)


GROUPS = ("params", "buffers", "momentum")


def share_checkpoint(world, found):
    """Rank 0's ``(kind, Checkpoint)`` (or None) on every rank, as ``(kind, step, path, tensors)``: ``tensors``
    yields ``(group, name, global array)`` for every tensor, broadcast one at a time as it is consumed (so no rank
    holds more than one extra global tensor, and no message exceeds one tensor). Every rank must consume it all."""
    header = None
    if found is not None:
        kind, ckpt = found
        groups = GROUPS if kind == "resume" else GROUPS[:2]     # initial weights: no momentum to send
        header = (kind, ckpt.step, ckpt.path,
                  [(group, name, a.shape, a.dtype.str) for group in groups for name, a in getattr(ckpt, group).items()])
    header = world.bcast(header)
    if header is None:
        return None
    kind, step, path, layout = header

    def tensors():
        for group, name, shape, dtype in layout:
            if world.rank == 0:
                array = np.ascontiguousarray(getattr(found[1], group)[name])
            else:
                array = np.empty(shape, dtype=dtype)
            yield group, name, world.bcast_array(array)
    return kind, step, path, tensors()
