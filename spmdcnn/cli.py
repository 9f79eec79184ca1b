"""The ``spmdcnn`` command."""

import argparse
import json
import signal
import sys
import traceback

from . import __version__
from .cli_files import add_file_commands
from .cost.memory import format_bytes as _format_bytes

EXAMPLES = """\
examples:
  spmdcnn model models/alexnet.yaml --batch 128
  spmdcnn train jobs/quickstart.yaml --set optimizer.lr=0.05
  mpiexec -n 4 spmdcnn train jobs/quickstart.yaml --set plan=owt
  spmdcnn bench models/alexnet.yaml --batch 32 --steps 5
  mpiexec -n 2 spmdcnn bench models/alexnet.yaml --batch 32 --plan owt
  spmdcnn checkpoint info ckpt/quickstart.h5
  spmdcnn checkpoint export ckpt/quickstart.h5 --torch digits.pt
  spmdcnn data digits -o data/digits
  spmdcnn data info data/digits/train.h5
  spmdcnn plan models/alexnet.yaml --devices 4 --batch 128 --machine jobs/machines/local.yaml -o plan.yaml
  spmdcnn plan models/vgg16.yaml --devices 16 --batch 512 --machine jobs/machines/paper-p100-4x4.yaml --compare
  spmdcnn simulate plan.yaml other.yaml --machine jobs/machines/local.yaml
  spmdcnn plot plan.yaml -o plan.png --machine jobs/machines/local.yaml
  mpiexec -n 2 spmdcnn profile models/cifar_cnn.yaml --batch 64 --devices 2 -o profile.json
  mpiexec -n 4 spmdcnn calibrate -o jobs/machines/mycluster.yaml --name mycluster
"""


def _format_shape(shape):
    return "x".join(str(v) for v in shape) if shape else "scalar"


def _format_count(value):
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.2f}{unit}"
    return str(value)


def _model_rows(graph, batch, expand):
    rows = []
    if expand:
        for layer in graph.layers:
            rows.append({"name": layer.name, "op": layer.op, "inputs": layer.inputs,
                         "output_shape": [batch, *layer.out_shape], "params": layer.num_params,
                         "flops": layer.flops * batch})
        return rows
    groups = {}
    for layer in graph.layers:
        row = groups.get(layer.group)
        if row is None:
            row = groups[layer.group] = {"name": layer.group, "op": layer.op, "layers": 0, "params": 0, "flops": 0}
            rows.append(row)
        if layer.name != layer.group:
            row["op"] = "block"
        row["layers"] += 1
        row["params"] += layer.num_params
        row["flops"] += layer.flops * batch
        row["output_shape"] = [batch, *layer.out_shape]   # the last layer of a group is its output
    return rows


def cmd_model(args):
    from .graph import load_model
    graph = load_model(args.model)
    rows = _model_rows(graph, args.batch, args.expand)
    if args.json:
        print(json.dumps({"name": graph.name, "source": graph.source, "input": list(graph.input_shape),
                          "batch": args.batch, "layers": rows, "total_params": graph.num_params,
                          "total_flops": graph.flops(args.batch), "num_layers": len(graph.layers)}, indent=1))
        return 0
    width = max(len("layer"), *(len(r["name"]) for r in rows))
    print(f"model {graph.name} ({graph.source}): input {_format_shape(graph.input_shape)}, batch {args.batch}, "
          f"{len(graph.layers)} layers")
    print(f"{'layer':<{width}}  {'op':<22} {'output':>18} {'params':>12} {'fwd FLOPs':>10}")
    for r in rows:
        op = r["op"] if r["op"] != "block" else f"block ({r['layers']} layers)"
        print(f"{r['name']:<{width}}  {op:<22} {_format_shape(r['output_shape']):>18} {r['params']:>12,} "
              f"{_format_count(r['flops']):>10}")
    print(f"{'total':<{width}}  {'':<22} {'':>18} {graph.num_params:>12,} {_format_count(graph.flops(args.batch)):>10}")
    return 0


def cmd_train(args):
    from .comm import World
    from .io.job import load_job
    from .runtime.train import train
    world = World.create()
    job = world.agree(lambda: load_job(args.job, args.set))
    stopped = train(job, world=world)["stopped"]
    return 128 + getattr(signal, stopped) if stopped else 0      # a shell's status for a run a signal ended


def cmd_bench(args):
    from .comm import World
    from .runtime.bench import bench
    world = World.create()
    result = bench(args.model, args.batch, args.steps, args.warmup, args.dtype, args.backend, args.seed, args.plan,
                   world, args.machine, not args.json, tf32=args.tf32, transport=args.transport,
                   share_gpus=args.share_gpus)
    if world.rank != 0:
        return 0
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    blas = ", ".join(f"{b['internal_api']} {b['version']} {b['architecture']} x{b['num_threads']}"
                     for b in result["blas"]) or "unknown"
    print(f"{result['model']}: batch {result['batch']}, {result['steps']} steps after {result['warmup']} warm-up, "
          f"{result['dtype']} on {result['backend']} (BLAS: {blas})")
    print(f"  {result['images_per_s']:.2f} images/s, {result['step_s_mean'] * 1e3:.1f} ms per step "
          f"(median {result['step_s_median'] * 1e3:.1f} ms), peak memory {result['peak_memory_bytes'] / 2**20:.0f} MiB"
          f"{'' if result['ranks'] == 1 else ' on the largest rank'}")
    if result["ranks"] > 1 or result["bytes_transferred"]:
        print(f"  {result['ranks']} ranks, {result['plan']}: per step and rank (mean) compute "
              f"{result['compute_s'] * 1e3:.1f} ms, transfer {result['transfer_s'] * 1e3:.1f} ms, sync "
              f"{result['sync_s'] * 1e3:.1f} ms; moved {_format_bytes(result['bytes_transferred'])} between layers "
              f"and {_format_bytes(result['bytes_synced'])} in allreduces per step (all ranks)")
    return 0


def _cost_for(args, graph, batch, devices):
    import numpy as np
    from .planner.service import cost_model
    itemsize = np.dtype(args.dtype).itemsize
    return cost_model(graph, batch, devices, args.machine, args.profile, itemsize, getattr(args, "nodes", None))


def _ms(seconds):
    return f"{seconds * 1e3:.2f}"


def _print_prediction(title, prediction, plan):
    rows = prediction.layers
    width = max(len("layer"), *(len(r.name) for r in rows))
    cwidth = max(len("configuration"), *(len(r.config) for r in rows))
    print(title)
    print(f"{'layer':<{width}}  {'configuration':<{cwidth}}  {'compute ms':>10} {'transfer ms':>11} {'sync ms':>8} "
          f"{'moved':>10} {'allreduced':>10}")
    for r in rows:
        print(f"{r.name:<{width}}  {r.config:<{cwidth}}  {_ms(r.compute_s):>10} {_ms(r.transfer_s):>11} "
              f"{_ms(r.sync_s):>8} {_format_bytes(r.bytes_transferred):>10} {_format_bytes(r.bytes_synced):>10}")
    s = prediction.summary()
    print(f"predicted iteration {_ms(s['iteration_s'])} ms = compute {_ms(s['compute_s'])} + transfer "
          f"{_ms(s['transfer_s'])} + sync {_ms(s['sync_s'])} ms; {plan.batch / s['iteration_s']:.1f} images/s; moves "
          f"{_format_bytes(s['bytes_transferred'])} between layers and allreduces {_format_bytes(s['bytes_synced'])}"
          " per iteration")


def cmd_plan(args):
    from .graph import load_model
    from .planner import STRATEGIES, make_plan
    from .planner.service import plan_document
    graph = load_model(args.model)
    cost = _cost_for(args, graph, args.batch, args.devices)
    strategies = [s for s in STRATEGIES if s != "exhaustive"] if args.compare else [args.strategy]
    if args.compare and args.strategy not in strategies:
        strategies.append(args.strategy)
    from .cost.memory import parse_size, plan_memory
    memory = parse_size(args.memory) if args.memory else None
    if memory is not None and args.strategy != "optimal":
        raise ValueError(f"--memory applies to the optimal search, not to --strategy {args.strategy}")
    results = {s: make_plan(graph, args.devices, cost, s, limit=args.limit, memory=memory if s == "optimal" else None)
               for s in strategies}
    chosen = results[args.strategy]
    if args.output:
        from .cost.calibrate import prepare_output
        prepare_output(args.output)
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(plan_document(chosen, args.model, args.output))
    if args.json:
        print(json.dumps({"model": graph.name, "devices": args.devices, "batch": args.batch,
                          "machine": cost.machine.name, "output": args.output,
                          "plans": {s: {"search_s": r.search_s, "exact": getattr(r.solution, "exact", True),
                                        "plan": r.plan.text, "predicted": r.prediction.to_json()}
                                    for s, r in results.items()}}, indent=1))
        return 0
    profile = cost.compute.profile
    source = f"profile {profile.path} ({len(profile)} tile times)" if profile else "the analytic model"
    _print_prediction(f"{args.strategy} plan for {graph.name}: {args.devices} devices, batch {args.batch}, machine "
                      f"{cost.machine.name}; compute from {source}", chosen.prediction, chosen.plan)
    if chosen.solution is not None:
        sol = chosen.solution
        used = plan_memory(graph, chosen.plan, cost.itemsize)
        limit = f" (limit {_format_bytes(memory)})" if memory else ""
        print(f"memory: {_format_bytes(used)} on the busiest device{limit}")
        pruned = f" ({sol.kept} after pruning)" if sol.kept < chosen.configurations else ""
        print(f"search: {chosen.nodes} layers to place, {chosen.configurations} configurations{pruned}, {sol.method} "
              f"({sol.eliminated_nodes} nodes and {sol.eliminated_edges} edges eliminated, {sol.remaining_nodes} "
              f"left){'' if sol.exact else ', not proven optimal'}; {chosen.search_s:.3f} s")
    if args.compare:
        base = results["data"].prediction.iteration_s
        print(f"\n{'strategy':<11} {'iteration ms':>12} {'compute':>9} {'transfer':>9} {'sync':>9} {'images/s':>9} "
              f"{'vs data':>7} {'moved':>10} {'allreduced':>10} {'search s':>8}")
        for s, r in results.items():
            p = r.prediction.summary()
            print(f"{s:<11} {_ms(p['iteration_s']):>12} {_ms(p['compute_s']):>9} {_ms(p['transfer_s']):>9} "
                  f"{_ms(p['sync_s']):>9} {args.batch / p['iteration_s']:>9.1f} {base / p['iteration_s']:>6.2f}x "
                  f"{_format_bytes(p['bytes_transferred']):>10} {_format_bytes(p['bytes_synced']):>10} "
                  f"{r.search_s:>8.3f}")
    if args.output:
        print(f"wrote {args.output}")
    return 0


def _load_plan_for_simulate(spec, args):
    """A plan file (its model from --model, its model_file (relative to the plan file's folder), or
    models/<name>.yaml) or a named strategy."""
    import os
    from .graph import load_model
    from .io.yamlfile import read_yaml
    from .tiling.plan import NAMED, from_mapping, named
    if spec in NAMED:
        if not (args.model and args.devices and args.batch):
            raise ValueError(f"simulate {spec}: a named strategy needs --model, --devices and --batch")
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
    plans = [_load_plan_for_simulate(spec, args) for spec in args.plans]
    results = []
    for spec, (graph, plan) in zip(args.plans, plans):
        cost = _cost_for(args, graph, plan.batch, plan.devices)
        results.append((spec, graph, plan, cost.simulate(plan)))
    if args.json:
        print(json.dumps([{"plan": spec, "model": graph.name, "devices": plan.devices, "batch": plan.batch,
                           "predicted": prediction.to_json()} for spec, graph, plan, prediction in results], indent=1))
        return 0
    for i, (spec, graph, plan, prediction) in enumerate(results):
        if i:
            print()
        _print_prediction(f"{spec}: {graph.name}, {plan.devices} devices, batch {plan.batch}", prediction, plan)
    return 0


def cmd_plot(args):
    from .planner.plot import draw_plan
    graph, plan = _load_plan_for_simulate(args.plan, args)
    cost = _cost_for(args, graph, plan.batch, plan.devices)
    prediction = cost.simulate(plan)
    draw_plan(graph, plan, prediction, args.output,
              f"{args.plan}: {graph.name}, {plan.devices} devices, batch {plan.batch}, machine {cost.machine.name}")
    print(f"wrote {args.output}")
    return 0


def cmd_profile(args):
    from . import backend
    from .comm import World
    from .cost.compute import Profile
    from .graph import load_model
    from .runtime.profile import default_path, device_name, profile
    world = World.create()
    node_ranks = world.node_ranks()

    def load():
        graph = load_model(args.model)
        xp = backend.get_array_module(args.backend, *node_ranks, share=args.share_gpus)
        backend.set_precision(xp, args.tf32)
        dtype = backend.resolve_dtype(args.dtype, xp)
        device = device_name(world, xp, dtype)
        path = args.output or default_path(device)
        store = Profile.load(path, device) if world.rank == 0 else None
        if store is not None and store.device != device:
            raise ValueError(f"{path}: a profile of {store.device!r}, not of this device ({device!r})")
        return graph, xp, dtype, device, path, store
    graph, xp, dtype, device, path, store = world.agree(load)
    store = world.bcast(store)
    count = profile(graph, args.batch, args.devices, world, store, xp, dtype, args.repeats,
                    log=print if world.rank == 0 else None, machine=args.machine)
    world.agree(lambda: store.save(path) if world.rank == 0 else None)
    if world.rank == 0:
        print(f"{device}: measured {count} tile shapes, {len(store)} in {path}")
    return 0


def cmd_calibrate(args):
    from .comm import World
    from .cost.calibrate import calibrate, check_name, prepare_output, summary, to_json, write_machine
    from . import backend
    from .comm import choose_transport
    world = World.create()
    node_ranks = world.node_ranks()

    def load():
        check_name(args.name)
        if world.rank == 0:
            prepare_output(args.output)
        return backend.get_array_module(args.backend, *node_ranks, share=args.share_gpus)
    xp = world.agree(load)
    world.use(choose_transport(world, xp, args.transport))
    machine = calibrate(world, args.name, args.quick, xp)
    world.agree(lambda: write_machine(machine, args.output) if world.rank == 0 else None)
    if world.rank == 0:
        print(json.dumps(to_json(machine, args.output), indent=1) if args.json
              else "\n".join(summary(machine, args.output)))
    return 0


def build_parser():
    parser = argparse.ArgumentParser(
        prog="spmdcnn", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="Train convolutional networks with layer-wise parallelism on MPI ranks.")
    parser.add_argument("--version", action="version", version=f"spmdcnn {__version__}")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # --debug is accepted after the subcommand too; SUPPRESS keeps a subcommand from resetting it to False
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show Python tracebacks for errors")

    p = sub.add_parser("model", parents=[common], help="describe a model: layers, output shapes, parameters, FLOPs",
                       description="Print a model's layers with output shape, parameter count and forward FLOPs, "
                                   "and the totals. Block instances are shown as one row unless --expand.")
    p.add_argument("model", help="model YAML file (models/*.yaml)")
    p.add_argument("--batch", type=int, default=1, help="batch size for shapes and FLOPs (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON (with total_params and total_flops)")
    p.add_argument("--expand", action="store_true", help="show every layer instead of one row per block")
    p.set_defaults(run=cmd_model)

    p = sub.add_parser("train", parents=[common], help="train a model as a job YAML describes",
                       description="Run a training job (jobs/*.yaml) on one process, or on MPI ranks under its plan "
                                   "(mpiexec -n K spmdcnn train JOB; srun under Slurm): logs loss and images/s, "
                                   "writes metrics and checkpoints, resumes from checkpoint.path when it exists.")
    p.add_argument("job", help="job YAML file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a job key, e.g. --set optimizer.lr=0.1 (repeatable)")
    p.set_defaults(run=cmd_train)

    p = sub.add_parser("bench", parents=[common], help="time training iterations on synthetic data",
                       description="Time whole training iterations (forward, backward, SGD update) after a warm-up;"
                                   " print images/s and peak memory. Under mpiexec, run the plan on the ranks "
                                   "and split the time into compute, transfer and sync, with the bytes moved.")
    p.add_argument("model", help="model YAML file")
    p.add_argument("--batch", type=int, required=True, help="global batch size")
    p.add_argument("--steps", type=int, default=10, help="timed iterations (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations first (default 2)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"],
                   help="bfloat16: activations in bfloat16, float32 master weights (cupy only)")
    p.add_argument("--backend", default="auto", choices=["auto", "numpy", "cupy"])
    p.add_argument("--tf32", action="store_true", help="cupy, float32: let convolutions and matmuls use TF32")
    p.add_argument("--transport", default="auto", choices=["auto", "host", "cuda-mpi", "nccl"],
                   help="how ranks move data (default auto: nccl, cuda-mpi or host, whichever works)")
    p.add_argument("--share-gpus", action="store_true", help="let more ranks than GPUs share a node's GPUs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plan", default="data",
                   help="data, model, owt, auto (the planner) or a plan YAML file (default data; one process runs "
                        "the whole model)")
    p.add_argument("--machine", help="machine YAML for --plan auto (default: the built-in local machine)")
    p.add_argument("--json", action="store_true", help="print JSON (images_per_s, compute_s, transfer_s, sync_s, "
                   "bytes_transferred, peak_memory_bytes, ...)")
    p.set_defaults(run=cmd_bench)

    p = sub.add_parser("calibrate", parents=[common], help="measure the machine model (links, device) on MPI ranks",
                       description="Measure the machine the ranks run on and write its machine YAML "
                                   "(jobs/machines/*.yaml): bandwidth and latency of exchanges within a node and "
                                   "between nodes (all rank pairs at once; needs mpiexec -n 2 or more), and each "
                                   "rank's float32 matmul rate, memory bandwidth and per-op overhead (all ranks at "
                                   "once, averaged). Run it with the ranks per node training will use.")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="machine YAML to write (rank 0)")
    p.add_argument("--name", default="local", help="the machine's name (default local)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (seconds; for tests)")
    p.add_argument("--json", action="store_true", help="print the machine and the raw measurements as JSON")
    p.add_argument("--backend", default="auto", choices=["auto", "numpy", "cupy"],
                   help="cupy: measure each rank's GPU, and the links between GPUs through --transport")
    p.add_argument("--transport", default="auto", choices=["auto", "host", "cuda-mpi", "nccl"],
                   help="the transport training will use (default auto: nccl, cuda-mpi or host, whichever works)")
    p.add_argument("--share-gpus", action="store_true", help="let more ranks than GPUs share a node's GPUs")
    p.set_defaults(run=cmd_calibrate)

    def plan_source_options(p):
        """What a plan needs beside its file (or a named strategy): the model, devices and batch."""
        p.add_argument("--model", help="model YAML (default: the plan's model_file, or models/<model>.yaml)")
        p.add_argument("--devices", type=int, help="devices, for a named strategy")
        p.add_argument("--batch", type=int, help="global batch, for a named strategy or a plan without batch_size")

    def cost_options(p):
        p.add_argument("--machine", help="machine YAML (jobs/machines/*.yaml; default: the built-in local machine)")
        p.add_argument("--profile", help="compute profile from spmdcnn profile (default: the analytic model)")
        p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
        p.add_argument("--nodes", type=int, help="use this many nodes of the machine (default: its 'nodes')")
        p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("plan", parents=[common], help="find the best plan for a model on N devices",
                       description="Search the per-layer configurations (OptCNN's node and edge elimination, "
                                   "exact under the cost model) and print each layer's configuration with its "
                                   "predicted compute, transfer and sync time; -o writes the plan YAML.")
    p.add_argument("model", help="model YAML file")
    p.add_argument("--devices", type=int, required=True, help="devices (MPI ranks) of the job")
    p.add_argument("--batch", type=int, required=True, help="global batch size")
    p.add_argument("--strategy", default="optimal", choices=["optimal", "data", "model", "owt", "exhaustive"])
    p.add_argument("--compare", action="store_true", help="also print every strategy side by side")
    p.add_argument("--limit", type=int, default=10**7,
                   help="exhaustive: refuse searches over more combinations than this (default 1e7)")
    p.add_argument("--memory", metavar="SIZE", help="the most memory a device may keep (16GiB, 800MB, 1.5e9; "
                   "spmdcnn/cost/memory.py's model): the optimal search keeps to it")
    p.add_argument("-o", "--output", help="write the plan YAML (with 'predicted') here")
    cost_options(p)
    p.set_defaults(run=cmd_plan)

    p = sub.add_parser("simulate", parents=[common], help="predict the iteration time of plans",
                       description="Score plans (plan YAML files, or data/model/owt with --model, --devices and "
                                   "--batch) with the cost model: per layer compute, transfer and sync time.")
    p.add_argument("plans", nargs="+", metavar="PLAN", help="plan YAML file, or data, model, owt")
    plan_source_options(p)
    cost_options(p)
    p.set_defaults(run=cmd_simulate)

    p = sub.add_parser("plot", parents=[common], help="draw a plan: each layer's configuration and predicted times",
                       description="Draw a plan as a picture (PNG, SVG or PDF): each layer's configuration and its "
                                   "predicted compute, transfer and sync time under the cost model. Needs matplotlib.")
    p.add_argument("plan", metavar="PLAN", help="plan YAML file, or data, model, owt")
    p.add_argument("-o", "--output", required=True, help="picture to write (.png, .svg, .pdf)")
    plan_source_options(p)
    cost_options(p)
    p.set_defaults(run=cmd_plot)

    p = sub.add_parser("profile", parents=[common], help="measure tile compute times for the planner",
                       description="Run every distinct tile shape the planner considers for MODEL on N devices "
                                   "(forward, backward, SGD update) and cache the times in a JSON profile. Under "
                                   "mpiexec all ranks measure at once, as they would compute in training.")
    p.add_argument("model", help="model YAML file")
    p.add_argument("--batch", type=int, required=True, help="global batch size")
    p.add_argument("--devices", type=int, required=True, help="devices of the jobs to plan")
    p.add_argument("-o", "--output", help="profile file (default: ~/.cache/spmdcnn/profile-<device>.json, "
                   "or $SPMDCNN_CACHE)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per tile (median; default 3)")
    p.add_argument("--machine", help="machine YAML whose ring model the measured wait per synchronization is "
                   "taken beyond (default: the built-in local machine)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"])
    p.add_argument("--backend", default="auto", choices=["auto", "numpy", "cupy"])
    p.add_argument("--tf32", action="store_true", help="cupy, float32: let convolutions and matmuls use TF32")
    p.add_argument("--share-gpus", action="store_true", help="let more ranks than GPUs share a node's GPUs")
    p.set_defaults(run=cmd_profile)

    add_file_commands(sub, common)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    for name in ("batch", "steps", "devices", "nodes", "repeats"):
        if getattr(args, name, 1) is not None and getattr(args, name, 1) <= 0:
            parser.error(f"--{name} must be positive")
    if getattr(args, "warmup", 0) < 0:
        parser.error("--warmup must be zero or positive")
    try:
        return args.run(args)
    except BrokenPipeError:  # the output went to a pipe that closed early (| head)
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as error:
        return _fail("spmdcnn: interrupted", error, 130)
    except MemoryError as error:
        _debug(args)
        return _fail(f"spmdcnn: error: out of memory ({str(error) or 'allocation failed'}); use a smaller batch "
                     "or model", error)
    except (ValueError, OSError, FloatingPointError, RuntimeError) as error:
        _debug(args)
        return _fail(f"spmdcnn: error: {error}", error)
    except Exception as error:          # a bug: under MPI the other ranks must not be left waiting
        traceback.print_exc()
        return _fail(f"spmdcnn: error: internal error {type(error).__name__}: {error}", error, 1)


def _debug(args):
    """With --debug, the traceback: raised in one process, printed under MPI (where the job must still end)."""
    if args.debug:
        from .comm.guard import world_size
        if world_size() == 1:
            raise
        traceback.print_exc()


def _fail(message, error, status=2):
    """Print the error and end this process, or under MPI the whole job (see :mod:`spmdcnn.comm.guard`)."""
    from .comm.guard import fail
    return fail(message, error, status)


if __name__ == "__main__":
    sys.exit(main())
