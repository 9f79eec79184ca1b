"""Why a plan leaves devices idle: the layers that run on fewer devices than the plan has, and what the same cost
model predicts for the plan with those layers split over every device instead (``plan``, ``simulate`` and
``plan: auto`` print it, so a user who sees ranks idle sees the prediction that made them so)."""

from ..tiling.plan import Plan, named


def idle_layers(plan):
    """The layers of ``plan`` whose configuration uses fewer devices than the plan has, in model order."""
    return [layer.name for layer in plan.graph.layers if plan[layer.name].size < plan.devices]


def idle_note(cost, plan, prediction=None):
    """One line on ``plan``'s idle devices (None when every layer uses them all): which layers leave devices idle,
    and the iteration ``cost`` predicts with them split over every device as data parallelism splits them."""
    idle = idle_layers(plan)
    if not idle:
        return None
    spread = named("data", plan.graph, plan.batch, plan.devices)
    idle = [name for name in idle if spread[name].size > plan[name].size]
    if not idle:                # a batch of fewer samples than devices: splitting samples cannot use them all
        return (f"idle devices: the batch of {plan.batch} leaves some of the {plan.devices} devices without a sample "
                "in the layers the plan splits over samples alone")
    configs = {name: spread[name] if name in idle else plan[name] for name in plan.configs}
    other = cost.simulate(Plan(plan.graph, plan.batch, plan.devices, configs, "idle layers spread")).iteration_s
    mine = (prediction or cost.simulate(plan)).iteration_s
    names = ", ".join(idle[:4]) + (f" and {len(idle) - 4} more" if len(idle) > 4 else "")
    fewest = min(plan[name].size for name in idle)
    if other > mine:
        verdict = (f"{(other / mine - 1) * 100:.1f} % slower: moving their data and summing their gradients would "
                   "cost more than splitting them saves")
    else:
        verdict = f"{(1 - other / mine) * 100:.1f} % faster: this plan is not the model's best there"
    verb = "runs" if len(idle) == 1 else "run"
    return (f"idle devices: {names} {verb} on {fewest} of {plan.devices} devices; split over all {plan.devices} as "
            f"data parallelism splits them, the model predicts {other * 1e3:.2f} ms per step against "
            f"{mine * 1e3:.2f}, {verdict}")
