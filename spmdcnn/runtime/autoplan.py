"""``plan: auto``: before the first step, profile what the cache lacks (all ranks at once), search on rank 0,
and give every rank the plan it found."""

import time

from ..cost.compute import Profile
from ..cost.memory import plan_memory
from ..sizes import format_against, parse_size
from ..planner import make_plan
from ..planner.service import cost_model
from ..tiling.plan import named, parse_plan_text
from .profile import default_path, device_name, profile


def auto_plan(graph, batch, world, machine, xp, dtype, log, sync=None, batchnorm=None, memory=None):
    """The optimal plan for ``graph`` on the ranks of ``world`` (collective). ``machine``: a machine YAML path
    or None (the built-in local machine); ``sync``, ``batchnorm`` and ``memory`` (the most a device may hold,
    bytes or a size such as ``80GB``): the job's keys."""
    if world.size == 1:
        plan = named("data", graph, batch, 1)
        plan.source = "plan auto (one device: the whole model here)"
        return plan
    device = device_name(world, xp, dtype)
    path = default_path(device)

    def load():
        if world.rank != 0:
            return None
        try:
            store = Profile.load(path, device)
        except ValueError as error:         # a cache is disposable: start a new one
            log(f"plan auto: ignoring the cached profile ({error})")
            return Profile(device, path=path)
        return store if store.device == device else Profile(device, path=path)
    store = world.bcast(world.agree(load))
    start = time.perf_counter()
    references = len(store.in_situ)
    measured = profile(graph, batch, world.size, world, store, xp, dtype, log=log, machine=machine,
                       progress=True)
    if (measured or len(store.in_situ) != references) and world.rank == 0:
        try:
            store.save(path)
        except OSError as error:
            log(f"plan auto: could not cache the profile in {path}: {error}")
    profiled = time.perf_counter() - start

    def search():
        if world.rank != 0:
            return None
        cost = cost_model(graph, batch, world.size, machine, store, dtype.itemsize, sync=sync, batchnorm=batchnorm)
        limit = cost.machine.device.memory if memory is None else parse_size(memory)
        best = make_plan(graph, world.size, cost, "optimal", tie=store.spread, memory=limit)
        data = cost.simulate(named("data", graph, batch, world.size)).iteration_s
        predicted = best.prediction.iteration_s
        log(f"plan auto: searched {best.configurations} configurations of {best.nodes} layers in "
            f"{best.search_s:.2f} s (profile {path}: {measured} tile shapes measured in {profiled:.1f} s); "
            f"predicted {predicted * 1e3:.1f} ms per step, data parallelism {data * 1e3:.1f} ms "
            f"({data / predicted:.2f}x), both on the timeline of what runs")
        log("plan auto: scored " + ", ".join(f"{label} {seconds * 1e3:.1f} ms" for label, seconds in best.candidates))
        if best.ties:
            log(f"plan auto: {best.ties.describe()}")
        if limit is not None:
            used = plan_memory(graph, best.plan, cost.itemsize, cost.machine.device.im2col)
            used_text, limit_text = format_against(used, limit)
            log(f"plan auto: {used_text} per device under the memory model (memory: {limit_text})")
        for layer in graph.layers:
            log(f"  {layer.name}: {best.plan[layer.name].describe(short=True)}")
        return best.plan.text, predicted
    text, predicted = world.bcast(world.agree(search))
    plan = parse_plan_text(text, graph, batch, world.size, "plan auto")
    plan.source = f"plan auto (optimal under the cost model, predicted {predicted * 1e3:.1f} ms per step)"
    plan.predicted_s = predicted
    return plan
