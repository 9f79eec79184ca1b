"""The ``spmdcnn plan``, ``simulate`` and ``plot`` commands: plans under the cost model, as tables and pictures.

Each says on its first line where its compute times come from: a profile (``--profile``, or by default the cached
profile of this machine that a job of that many ranks here would use), or the analytic model, and why.
"""

import json
import os

from .cli_files import positive_float, watchdog_argument
from .planner.idle import idle_note
from .sizes import format_against, format_bytes


def sync_arguments(p):
    """The job's ``sync`` keys as options (``bench``, ``plan``, ``simulate``, ``plot``)."""
    p.add_argument("--bucket-mb", type=positive_float, default=25.0, metavar="MIB",
                   help="sync.bucket_mb: MiB per gradient allreduce bucket (default 25, the first at most 1)")
    p.add_argument("--no-overlap", action="store_true",
                   help="sync.overlap: false: allreduce the buckets after backward, not while it runs")
    p.add_argument("--batchnorm-group", type=int, metavar="G",
                   help="batchnorm: {group: G}: batch-norm statistics over groups of G consecutive samples (ghost "
                        "batch norm; default: the global batch)")


def sync_options(args):
    return {"bucket_mb": args.bucket_mb, "overlap": not args.no_overlap}


def batchnorm_option(args):
    """The job's ``batchnorm`` key of ``--batchnorm-group``."""
    group = args.batchnorm_group
    if group is None:
        return "global"
    if group < 1:
        raise ValueError(f"--batchnorm-group must be a positive number of samples, got {group}")
    return {"group": group}


def compute_source(args, graph, batch, devices):
    """``(profile, line)``: the profile to time tiles with (a :class:`Profile`, or None for the analytic model) and
    the first line that says so. ``--profile P`` names one, ``--profile none`` asks for the analytic model; by
    default the cached profile of a CPU job of ``devices`` ranks on this node is used when it was measured for this
    model, batch and device count (``plan: auto`` or ``spmdcnn profile`` did) and the machine is this one (the
    built-in local machine, or a machine file of device ``cpu`` or of this processor). A profile measured for other
    shapes would time the missing tiles by extrapolating its own, which can be far off."""
    from .cost.calibrate import cpu_name
    from .cost.machine import load_machine
    from .runtime.profile import cached_profile, measured_for
    launcher = "" if devices == 1 else f"mpiexec -n {devices} "
    command = f"{launcher}spmdcnn profile {graph.source} --batch {batch} --devices {devices}"
    if args.profile and args.profile.lower() != "none":
        from .cost.compute import Profile
        store = Profile.load(args.profile)
        covered = "measured for this model, batch and device count" if measured_for(store, graph, batch, devices) \
            else "not measured for this model, batch and device count: the tiles it lacks are extrapolated"
        return store, f"compute: profile {args.profile} of {store.device!r} ({_profile_summary(store)}; {covered})"
    if args.profile:
        return None, "compute: the analytic model (--profile none)"
    machine = load_machine(args.machine) if args.machine else None
    if machine is not None and not (machine.device.name == "cpu" or machine.device.name.startswith(cpu_name())):
        return None, (f"compute: the analytic model of machine {machine.name}'s device {machine.device.name!r} "
                      "(not this computer; --profile P times tiles from a profile made there)")
    if args.dtype == "bfloat16":
        return None, ("compute: the analytic model (bfloat16 runs on GPUs: --profile P times tiles from a profile "
                      "made there)")
    per_node = devices if machine is None else min(devices, machine.devices_per_node)
    store, device, path = cached_profile(devices, args.dtype, per_node)
    if store is None:
        return None, (f"compute: the analytic model (no cached profile of {device!r} in {os.path.dirname(path)}; "
                      f"`{command}` or a job with plan: auto on {devices} ranks makes one)")
    if not measured_for(store, graph, batch, devices):
        return None, (f"compute: the analytic model (the cached profile {path} was not measured for this model at "
                      f"batch {batch} on {devices} devices; `{command}` measures it)")
    return store, f"compute: the cached profile {path} of {device!r} ({_profile_summary(store)})"


def _profile_summary(store):
    spread = f", spread {100 * store.spread:.1f} %" if store.spread else ""
    return f"{len(store)} tile times{spread}"


def _cost_for(args, graph, batch, devices):
    """``(cost model, first line)`` of a command's options for ``graph`` at ``batch`` on ``devices``."""
    import numpy as np
    from .planner.service import cost_model
    profile, line = compute_source(args, graph, batch, devices)
    itemsize = 2 if args.dtype == "bfloat16" else np.dtype(args.dtype).itemsize
    cost = cost_model(graph, batch, devices, args.machine, profile, itemsize, args.nodes, sync_options(args),
                      batchnorm_option(args))
    return cost, line


def _ms(seconds):
    return f"{seconds * 1e3:.2f}"


def print_prediction(title, prediction, plan, cost=None):
    rows = prediction.layers
    width = max(len("layer"), *(len(r.name) for r in rows))
    cwidth = max(len("configuration"), *(len(r.config) for r in rows))
    print(f"{title} (times in ms)")
    print(f"{'layer':<{width}}  {'configuration':<{cwidth}}  {'compute':>8} {'transfer':>8} {'sync':>7} "
          f"{'hidden':>7} {'moved':>9} {'allreduced':>10}")
    for r in rows:
        hidden = max(r.allreduce_s - r.sync_s, 0.0)
        print(f"{r.name:<{width}}  {r.config:<{cwidth}}  {_ms(r.compute_s):>8} {_ms(r.transfer_s):>8} "
              f"{_ms(r.sync_s):>7} {_ms(hidden):>7} {format_bytes(r.bytes_transferred):>9} "
              f"{format_bytes(r.bytes_synced):>10}")
    s = prediction.summary()
    timeline = prediction.timeline
    sums = ("pushes and pulls through parameter servers" if timeline is not None and timeline.served
            else "allreduces")
    runtime = ""
    if s["runtime_s"] > 0:
        runtime = f" + the runtime's own work {_ms(s['runtime_s'])}"
    elif s["runtime_s"] < 0:        # the profile's data-parallel steps ran faster than their layers add up to
        runtime = f" - {_ms(-s['runtime_s'])} by which measured steps beat their layers' sum"
    print(f"predicted iteration {_ms(s['iteration_s'])} ms = compute {_ms(s['compute_s'])} + transfer "
          f"{_ms(s['transfer_s'])} + exposed sync {_ms(s['sync_s'])}{runtime} ms; {plan.batch / s['iteration_s']:.1f} "
          f"images/s; moves {format_bytes(s['bytes_transferred'])} between layers and {sums} "
          f"{format_bytes(s['bytes_synced'])} per iteration")
    if timeline is not None and timeline.buckets and timeline.served:
        print(f"gradients through parameter servers: each layer's push after its backward (in sync), and "
              f"{len(timeline.buckets)} pulls on the slowest device, {_ms(timeline.allreduce_s)} ms, "
              f"{_ms(timeline.allreduce_s - timeline.exposed_s)} ms hidden behind backward")
        print("  (sync: what a layer exposes, its push included; hidden: its pull overlapped)")
    elif timeline is not None and timeline.buckets:
        print(f"gradients: {len(timeline.buckets)} buckets on the slowest device, {_ms(timeline.allreduce_s)} ms of "
              f"allreduces, {_ms(timeline.allreduce_s - timeline.exposed_s)} ms hidden behind backward")
        print("  (sync: what a layer exposes, batch norm's sums included; hidden: its allreduces overlapped)")
    note = idle_note(cost, plan, prediction) if cost is not None else None
    if note:
        print(note)


def _tie(args, cost):
    """``(fraction, source)``: the band within which plans are ties, ``--tie``, else the profile's spread (0 for
    the analytic model, which has no noise)."""
    if args.tie is not None:
        if args.tie < 0:
            raise ValueError(f"--tie must be zero or positive (a fraction of the fastest plan's time), got {args.tie}")
        return args.tie, "--tie"
    return (cost.compute.profile.spread if cost.compute.profile is not None else 0.0), "the profile's spread"


def cmd_plan(args):
    if args.trials is not None:
        return cmd_plan_trials(args)
    from .cost.memory import plan_memory
    from .sizes import parse_size
    from .graph import load_model
    from .planner import STRATEGIES, make_plan
    from .planner.service import plan_document
    graph = load_model(args.model)
    cost, source = _cost_for(args, graph, args.batch, args.devices)
    strategies = [s for s in STRATEGIES if s != "exhaustive"] if args.compare else [args.strategy]
    if args.compare and args.strategy not in strategies:
        strategies.append(args.strategy)
    memory = parse_size(args.memory) if args.memory else None
    if memory is not None and args.strategy != "optimal":
        raise ValueError(f"--memory applies to the optimal search, not to --strategy {args.strategy}")
    if memory is None and args.strategy == "optimal":
        memory = cost.machine.device.memory        # the device's own, from the machine file (None: no limit)
    tie, tie_source = _tie(args, cost) if memory is None else (0.0, "")
    from .planning_progress import SearchProgress
    progress = SearchProgress(setting=False if args.json else "auto")
    try:
        results = {s: make_plan(graph, args.devices, cost, s, limit=args.limit,
                                memory=memory if s == "optimal" else None, tie=tie, tie_source=tie_source,
                                progress=progress)
                   for s in strategies}
    finally:
        progress.close()
    chosen = results[args.strategy]
    if args.output:
        from .cost.calibrate import prepare_output
        prepare_output(args.output)
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(plan_document(chosen, args.model, args.output))
    if args.json:
        print(json.dumps({"model": graph.name, "devices": args.devices, "batch": args.batch,
                          "machine": cost.machine.name, "output": args.output, "compute": source,
                          "plans": {s: {"search_s": r.search_s, "exact": getattr(r.solution, "exact", True),
                                        "configurations": r.configurations, "phases": r.phases,
                                        "screening": r.screening and r.screening.to_json(),
                                        "lower_bound_s": getattr(r.solution, "lower", None),
                                        "ties": vars(r.ties) if r.ties else None,
                                        "plan": r.plan.text, "predicted": r.prediction.to_json(),
                                        "memory_bytes": plan_memory(graph, r.plan, cost.itemsize,
                                                                    cost.machine.device.im2col)}
                                    for s, r in results.items()}}, indent=1))
        return 0
    print(source)
    print_prediction(f"{args.strategy} plan for {graph.name}: {args.devices} devices, batch {args.batch}, machine "
                     f"{cost.machine.name}", chosen.prediction, chosen.plan, cost)
    print(_memory_line(graph, chosen.plan, cost, memory))
    if chosen.solution is not None:
        sol = chosen.solution
        pruned = f" ({sol.kept} after {'screening and ' if chosen.screening else ''}pruning)" \
            if sol.kept < chosen.configurations else ""
        print(f"search: {chosen.nodes} layers to place, {chosen.configurations} configurations{pruned}, {sol.method} "
              f"({sol.eliminated_nodes} nodes and {sol.eliminated_edges} edges eliminated, {sol.remaining_nodes} "
              f"left), {'proven optimal under the surrogate' if sol.exact else _distance(sol)}; "
              f"{chosen.search_s:.3f} s" + (f" ({', '.join(f'{k} {v:.2f}' for k, v in chosen.phases.items())})"
                                            if chosen.phases else ""))
        if chosen.screening is not None:
            print(f"screen: {chosen.screening.describe()}")
        if chosen.candidates:
            import textwrap
            scored = ", ".join(f"{label} {_ms(seconds)}" for label, seconds in chosen.candidates)
            print(textwrap.fill(f"scored on the timeline (ms): {scored}", 119, subsequent_indent="  "))
        if chosen.ties:
            print(f"ties: {chosen.ties.describe()}")
    if args.compare:
        _print_comparison(results, args.batch, graph, cost, memory)
    if args.output:
        print(f"wrote {args.output}")
    return 0


def cmd_plan_trials(args):
    """``spmdcnn plan --trials K`` under ``mpiexec``: rank 0 searches, every rank times the model's K best plans
    (runtime/trials.py, on a synthetic batch), rank 0 prints them and writes the fastest measured."""
    from . import backend
    from .comm import World
    from .graph import load_model
    from .planner import make_plan
    from .planner.service import plan_document
    from .runtime.autoplan import choose, propose
    from .runtime.trials import TrialSettings
    from .sizes import parse_size
    from .tiling.plan import parse_plan_text
    world = World.create().watch(args.watchdog)
    say = print if world.rank == 0 else (lambda line: None)
    if args.trials < 2:
        raise ValueError(f"--trials {args.trials}: time 2 or more plans (without --trials the model chooses)")
    if args.strategy != "optimal" or args.compare:
        raise ValueError("--trials times the optimal search's best plans: not with --strategy or --compare")
    if world.size != args.devices:
        raise ValueError(f"--trials times plans on the ranks it runs on: start it with mpiexec -n {args.devices} "
                         f"(it runs on {world.size})")
    graph = load_model(args.model)
    cost, source = _cost_for(args, graph, args.batch, args.devices)
    settings = TrialSettings(plans=args.trials)

    def search():
        if world.rank != 0:
            return None
        limit = parse_size(args.memory) if args.memory else cost.machine.device.memory
        tie, tie_source = _tie(args, cost) if limit is None else (0.0, "")
        best = make_plan(graph, args.devices, cost, "optimal", memory=limit, tie=tie, tie_source=tie_source)
        return propose(best, cost, settings, limit, say)
    say(source)
    world.board.stage("plan", slow=True, name="the search on rank 0")      # the others wait: for the watchdog
    proposed = [(label, parse_plan_text(text, graph, args.batch, args.devices, "plan --trials"), seconds)
                for label, text, seconds in world.bcast(world.agree(search))]
    store = cost.compute.profile
    xp = backend.rank_module("auto", world.node_ranks())
    dtype = backend.resolve_dtype(args.dtype, xp)       # bfloat16 on a GPU only
    label, plan, predicted, chosen_by = choose(
        proposed, graph, args.batch, world, xp, dtype, settings, store if store is not None else _NoCache(),
        getattr(store, "path", None), say, cost.sync, batchnorm_option(args))
    world.unwatch()             # the last collective: rank 0 goes on alone
    if world.rank != 0:
        return 0
    prediction = cost.simulate(plan)
    print_prediction(f"{label} for {graph.name}: {args.devices} devices, batch {args.batch}, {chosen_by}",
                     prediction, plan, cost)
    if args.output:
        from .cost.calibrate import prepare_output
        from .planner import Result
        prepare_output(args.output)
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(plan_document(Result(plan, prediction, "optimal"), args.model, args.output))
        print(f"wrote {args.output}")
    return 0


class _NoCache:
    """Where trials are remembered when no profile holds them (the analytic model): nowhere."""

    trials = {}


def _distance(solution):
    """How far a search that is not proven optimal may be from the optimum, proven by a lower bound."""
    if solution.lower is None or solution.cost <= 0:
        return "not proven optimal"
    return (f"not proven optimal, at most {100 * (solution.cost - solution.lower) / solution.cost:.2f} % above the "
            "optimum under the surrogate (a relaxation's lower bound)")


def _memory_line(graph, plan, cost, limit=None):
    """``memory: ...`` of ``plan`` under the memory model: the busiest device's bytes, what it keeps and its
    largest transient, and against ``limit`` (bytes) when given, how much over it when it does not fit."""
    from .cost.memory import kept_memory, peak_transient
    kept = kept_memory(graph, plan, cost.itemsize)
    transient, layer = peak_transient(graph, plan, cost.itemsize, cost.machine.device.im2col)
    used = kept + transient
    parts = f"{format_bytes(kept)} kept for backward + {format_bytes(transient)} while {layer} runs"
    if limit is None:
        return f"memory: {format_bytes(used)} on the busiest device ({parts})"
    used_text, limit_text = format_against(used, limit)
    over = "" if used <= limit else f"; does not fit: {format_bytes(used - limit)} over"
    return f"memory: {used_text} on the busiest device ({parts}; limit {limit_text}{over})"


def _print_comparison(results, batch, graph, cost, limit=None):
    from .cost.memory import plan_memory
    base = results["data"].prediction.iteration_s
    print(f"\n{'strategy':<11} {'iteration ms':>12} {'compute':>9} {'transfer':>9} {'sync':>9} {'images/s':>9} "
          f"{'vs data':>7} {'moved':>10} {'allreduced':>10} {'memory':>10} {'search s':>8}")
    for s, r in results.items():
        p = r.prediction.summary()
        used = plan_memory(graph, r.plan, cost.itemsize, cost.machine.device.im2col)
        fits = "" if limit is None else ("  fits" if used <= limit else
                                         f"  does not fit ({format_bytes(used - limit)} over)")
        print(f"{s:<11} {_ms(p['iteration_s']):>12} {_ms(p['compute_s']):>9} {_ms(p['transfer_s']):>9} "
              f"{_ms(p['sync_s']):>9} {batch / p['iteration_s']:>9.1f} {base / p['iteration_s']:>6.2f}x "
              f"{format_bytes(p['bytes_transferred']):>10} {format_bytes(p['bytes_synced']):>10} "
              f"{format_bytes(used):>10} {r.search_s:>8.3f}{fits}")


def load_plan_for_simulate(spec, args):
    """A plan file (its model from --model, its model_file (relative to the plan file's folder), or
    models/<name>.yaml) or a named strategy."""
    from .graph import load_model
    from .io.yamlfile import read_yaml
    from .tiling.plan import NAMED, from_mapping, named
    if spec in NAMED:
        if not (args.model and args.devices and args.batch):
            raise ValueError(f"{spec}: a named strategy needs --model, --devices and --batch")
        graph = load_model(args.model)
        return graph, named(spec, graph, args.batch, args.devices)
    data, _ = read_yaml(spec, "plan file")
    if not isinstance(data, dict):
        raise ValueError(f"{spec}: not a plan (expected a mapping)")
    model = args.model
    if model is None and data.get("model_file") is not None:
        written = data["model_file"]
        if not isinstance(written, str):
            raise ValueError(f"{spec}: model_file must be a path, got {written!r}")
        model = os.path.join(os.path.dirname(os.path.abspath(spec)), written)
        if not os.path.exists(model):
            raise ValueError(f"{spec}: model_file {written} does not exist (read from the plan file's folder: "
                             f"{os.path.normpath(model)}); pass --model MODEL.yaml")
    if model is None:
        model = os.path.join("models", f"{data.get('model')}.yaml")
        if not os.path.exists(model):
            raise ValueError(f"{spec}: which model? the plan has no model_file and {model} does not exist; "
                             "pass --model MODEL.yaml")
    graph = load_model(model)
    batch = data.get("batch_size")
    if batch is None:
        batch = args.batch
    if batch is None:
        raise ValueError(f"{spec}: the plan has no batch_size; pass --batch")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"{spec}: batch_size must be a positive integer, got {batch!r}")
    return graph, from_mapping(data, graph, batch, None, spec)


def cmd_simulate(args):
    if args.trace and len(args.plans) != 1:
        raise ValueError(f"--trace writes the timeline of one plan, got {len(args.plans)} plans")
    plans = [load_plan_for_simulate(spec, args) for spec in args.plans]
    results = []
    for spec, (graph, plan) in zip(args.plans, plans):
        cost, source = _cost_for(args, graph, plan.batch, plan.devices)
        results.append((spec, graph, plan, cost.simulate(plan), source, cost))
        if args.trace:
            from .cost.timeline import timeline_events
            from .io.trace import write_trace
            write_trace(args.trace, timeline_events(cost, plan),
                        f"predicted: {graph.name}, batch {plan.batch}, {plan.devices} devices, {spec}, machine "
                        f"{cost.machine.name}")
    if args.json:
        print(json.dumps([{"plan": spec, "model": graph.name, "devices": plan.devices, "batch": plan.batch,
                           "compute": source, "predicted": prediction.to_json()}
                          for spec, graph, plan, prediction, source, _ in results], indent=1))
        return 0
    shown = None
    for i, (spec, graph, plan, prediction, source, cost) in enumerate(results):
        if i:
            print()
        if source != shown:             # plans of another device count may take another profile
            print(source)
            shown = source
        print_prediction(f"{spec}: {graph.name}, {plan.devices} devices, batch {plan.batch}", prediction, plan, cost)
    return 0


def cmd_plot(args):
    from .planner.plot import draw_plan, draw_traces
    if args.trace:
        if args.plan:
            raise ValueError("give a plan or --trace, not both")
        from .io.trace import read_trace
        for title, note in draw_traces([read_trace(path) for path in args.trace], args.output):
            print(f"{title}: {note}")
        print(f"wrote {args.output}")
        return 0
    if not args.plan:
        raise ValueError("give a plan (a plan file, or data, model, owt) or --trace FILE")
    graph, plan = load_plan_for_simulate(args.plan, args)
    cost, source = _cost_for(args, graph, plan.batch, plan.devices)
    prediction = cost.simulate(plan)
    draw_plan(graph, plan, prediction, args.output,
              f"{args.plan}: {graph.name}, {plan.devices} devices, batch {plan.batch}, machine {cost.machine.name}")
    if args.json:
        print(json.dumps({"plan": args.plan, "model": graph.name, "devices": plan.devices, "batch": plan.batch,
                          "machine": cost.machine.name, "compute": source, "output": args.output,
                          "predicted": prediction.to_json()}, indent=1))
        return 0
    print(source)
    print(f"wrote {args.output}")
    return 0


def add_plan_commands(sub, common):
    """Add the ``plan``, ``simulate`` and ``plot`` commands to the subparsers ``sub``."""

    def plan_source_options(p):
        """What a plan needs beside its file (or a named strategy): the model, devices and batch."""
        p.add_argument("--model", help="model YAML (default: the plan's model_file, read from the plan file's "
                       "folder, or models/<model>.yaml)")
        p.add_argument("--devices", type=int, help="devices, for a named strategy")
        p.add_argument("--batch", type=int, help="global batch, for a named strategy or a plan without batch_size")

    def cost_options(p, what="print"):
        p.add_argument("--machine", help="machine YAML (jobs/machines/*.yaml; default: the built-in local machine)")
        p.add_argument("--profile", metavar="P", help="compute profile from spmdcnn profile, or none for the "
                       "analytic model (default: the cached profile of this machine that a job of this many ranks "
                       "uses, if there is one; the first line says which)")
        p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"],
                       help="the activations' type: what tiles and exchanges move (bfloat16: 2 bytes, with float32 "
                       "gradient sums; a GPU's, so the analytic model or --profile P made there)")
        p.add_argument("--nodes", type=int, help="use this many nodes of the machine (default: its 'nodes')")
        sync_arguments(p)
        p.add_argument("--json", action="store_true", help=f"{what} JSON")

    p = sub.add_parser("plan", parents=[common], help="find the best plan for a model on N devices",
                       description="Search the per-layer configurations (OptCNN's node and edge elimination, exact "
                                   "under the cost model's additive surrogate, with the gradient sync weighted a few "
                                   "ways), score those plans and the fixed strategies on the timeline of what runs, "
                                   "and print the fastest: each layer's configuration with its predicted compute, "
                                   "transfer and exposed sync time; -o writes the plan YAML.")
    p.add_argument("model", help="model YAML file")
    p.add_argument("--devices", type=int, required=True, help="devices (MPI ranks) of the job")
    p.add_argument("--batch", type=int, required=True, help="global batch size")
    p.add_argument("--strategy", default="optimal", choices=["optimal", "data", "model", "owt", "exhaustive"])
    p.add_argument("--compare", action="store_true", help="also print every strategy side by side")
    p.add_argument("--limit", type=int, default=10**7,
                   help="exhaustive: refuse searches over more combinations than this (default 1e7)")
    p.add_argument("--memory", metavar="SIZE", help="the most memory a device may hold (16GiB, 800MB, 1.5e9; the "
                   "memory model of docs/architecture.md#memory): the optimal search keeps to it (default: the "
                   "machine file's device memory, when it gives one)")
    p.add_argument("--tie", type=float, metavar="FRACTION",
                   help="plans predicted within this fraction of the fastest are ties, and the one with the fewest "
                        "exchanges wins (default: the profile's spread; 0 with the analytic model)")
    p.add_argument("-o", "--output", help="write the plan YAML (with 'predicted') here")
    p.add_argument("--trials", type=int, metavar="K",
                   help="under mpiexec -n DEVICES: time the model's K best plans (data parallelism among them) for "
                        "a few steps each on these ranks, keep the fastest measured, and print predicted against "
                        "measured for each (docs/architecture.md#trials)")
    watchdog_argument(p, "with --trials on several ranks")
    cost_options(p)
    p.set_defaults(run=cmd_plan)

    p = sub.add_parser("simulate", parents=[common], help="predict the iteration time of plans",
                       description="Score plans (plan YAML files, or data/model/owt with --model, --devices and "
                                   "--batch) with the cost model: per layer compute, transfer and sync time.")
    p.add_argument("plans", nargs="+", metavar="PLAN", help="plan YAML file, or data, model, owt")
    p.add_argument("--trace", metavar="FILE", help="write the predicted iteration of every device (compute per "
                   "layer, exchanges, bucket allreduces) as Chrome trace-event JSON, as bench --trace writes the "
                   "measured one (one plan)")
    plan_source_options(p)
    cost_options(p)
    p.set_defaults(run=cmd_simulate)

    p = sub.add_parser("plot", parents=[common], help="draw a plan: each layer's configuration and predicted times",
                       description="Draw a plan as a picture (PNG, SVG or PDF): each layer's configuration and its "
                                   "predicted compute, transfer and sync time under the cost model. Needs matplotlib.")
    p.add_argument("plan", metavar="PLAN", nargs="?", help="plan YAML file, or data, model, owt")
    p.add_argument("--trace", metavar="FILE", nargs="+", help="draw traces instead (bench --trace, simulate "
                   "--trace): each a panel, on one time axis, so prediction and measurement can be compared")
    p.add_argument("-o", "--output", required=True, help="picture to write (.png, .svg, .pdf)")
    plan_source_options(p)
    cost_options(p, "also print the prediction as")
    p.set_defaults(run=cmd_plot)
