"""The ``spmdcnn`` command."""

import argparse
import json
import signal
import sys
import traceback

from . import __version__
from .cli_files import add_file_commands, ahead_arg, augment_arg, count_arg, watchdog_argument
from .cli_plans import add_plan_commands, batchnorm_option, sync_arguments, sync_options
from .sizes import format_bytes as _format_bytes

EXAMPLES = """\
examples (from the repository's folder; docs/ describes every file format):
  mpiexec -n 4 spmdcnn train jobs/quickstart.yaml
  spmdcnn train jobs/quickstart.yaml --set checkpoint.path=ckpt/one.h5 --set log.metrics=ckpt/one.jsonl
  mpiexec -n 4 spmdcnn train jobs/quickstart.yaml --set plan=owt --set resume=false
  spmdcnn train jobs/quickstart.yaml --set epochs=5 --set optimizer.lr=0.1 --set resume=false
  spmdcnn model models/alexnet.yaml --batch 128
  spmdcnn model import torchvision:convnext_tiny -o convnext_tiny.yaml --weights convnext_tiny.h5
  spmdcnn bench models/alexnet.yaml --batch 32 --steps 5
  mpiexec -n 2 spmdcnn bench models/alexnet.yaml --batch 32 --plan owt
  spmdcnn checkpoint info ckpt/quickstart.h5
  spmdcnn checkpoint export ckpt/quickstart.h5 --torch digits.pt
  spmdcnn data digits -o data/digits
  spmdcnn data info data/digits/train.h5
  spmdcnn data bench data/imagenet-256/train.h5 --batch 64 --augment "{crop: [224, 224], flip: true}"
  spmdcnn plan models/alexnet.yaml --devices 4 --batch 128 -o plan.yaml
  spmdcnn plan models/vgg16.yaml --devices 16 --batch 512 --machine jobs/machines/paper-p100-4x4.yaml --compare
  spmdcnn simulate plan.yaml owt --model models/alexnet.yaml --devices 4 --batch 128
  spmdcnn plot plan.yaml -o plan.png
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


def cmd_model_import(args):
    from .graph.torchimport import import_model
    shape = args.input
    if shape is not None and (not 2 <= len(shape) <= 4 or any(v <= 0 for v in shape)):
        raise ValueError(f"--input takes C W, C H W or C D H W (positive sizes), got {' '.join(map(str, shape))}")
    check = None
    if args.check:
        from .graph.torchops import ImportFailure
        from .runtime.torchcheck import TOLERANCE, check_import

        def check(module, graph, arrays, input_shape):
            step, after = check_import(module, graph, arrays, input_shape)
            said = (f"one SGD step in float64 from its weights: the training loss within {step:.1e} of PyTorch's, "
                    f"the evaluation loss after the step within {after:.1e} (relative)")
            if max(step, after) > TOLERANCE:
                raise ImportFailure(f"{args.source}: the model does not compute what the network does: {said}")
            print(f"model import: checked against the network: {said}")
    graph = import_model(args.source, args.output, shape, args.weights, args.name, args.loss, say=print, check=check)
    print(f"wrote {args.output}: model '{graph.name}', {len(graph.layers)} layers, {graph.num_params:,} parameters "
          f"(input {_format_shape(graph.input_shape)})" + (f"; its weights in {args.weights}" if args.weights else ""))
    return 0


def cmd_train(args):
    from .comm import World
    from .io.job import load_job
    from .runtime.signals import Interrupted
    from .runtime.train import train
    world = World.create()
    job = world.agree(lambda: load_job(args.job, args.set))
    try:
        stopped = train(job, world=world)["stopped"]
    except Interrupted as interrupted:      # stopped after a step by Ctrl-C, as its log said
        stopped = interrupted.result["stopped"]
    return 128 + getattr(signal, stopped) if stopped else 0      # a shell's status for a run a signal ended


def cmd_bench(args):
    from .comm import World
    from .runtime.bench import bench, describe_blas
    world = World.create().watch(args.watchdog)
    result = bench(args.model, args.batch, args.steps, args.warmup, args.dtype, args.backend, args.seed, args.plan,
                   world, args.machine, not args.json, tf32=args.tf32, transport=args.transport,
                   share_gpus=args.share_gpus, data=args.data, augment=args.augment, workers=args.workers,
                   prefetch=args.prefetch, sync=sync_options(args), batchnorm=batchnorm_option(args),
                   trace=args.trace, memory=args.memory)
    if world.rank != 0:
        return 0
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    blas = describe_blas(result["blas"])
    print(f"{result['model']}: batch {result['batch']}, {result['steps']} steps after {result['warmup']} warm-up, "
          f"{result['dtype']} on {result['backend']} (BLAS: {blas}; compiled kernels {result['compiled']}; "
          f"float32 convolutions {result['convolutions']})")
    print(f"  {result['images_per_s']:.2f} images/s, {result['step_s_mean'] * 1e3:.1f} ms per step "
          f"(median {result['step_s_median'] * 1e3:.1f} ms), peak memory {result['peak_memory_bytes'] / 2**20:.0f} MiB"
          f"{'' if result['ranks'] == 1 else ' on the largest rank'}")
    if result["data"]:
        workers = (f"{result['workers']} worker{'s' * (result['workers'] != 1)} per rank reading ahead"
                   if result["workers"] else "read in each step")
        print(f"  data {result['data']} ({workers}): a step waited {result['data_wait_s'] * 1e3:.1f} ms for its batch "
              f"(mean; the slowest rank)")
    ranks = f"{result['ranks']} rank{'s' * (result['ranks'] != 1)}"
    if result["ranks"] > 1 or result["bytes_transferred"]:
        served = result["sync"]["mode"] == "parameter-server"
        summed = "pushed and pulled through parameter servers" if served else "in allreduces"
        print(f"  {ranks}, {result['plan']}: per step and rank (mean) compute "
              f"{result['compute_s'] * 1e3:.1f} ms, transfer {result['transfer_s'] * 1e3:.1f} ms, sync "
              f"{result['sync_s'] * 1e3:.1f} ms ({result['sync_exposed_s'] * 1e3:.1f} ms of it exposed); moved "
              f"{_format_bytes(result['bytes_transferred'])} between layers "
              f"and {_format_bytes(result['bytes_synced'])} {summed} per step (all ranks)")
    if args.trace:
        print(f"  wrote the last timed iteration of {ranks} to {args.trace} (spmdcnn plot --trace {args.trace} "
              "draws it)")
    return 0


def cmd_profile(args):
    from . import backend
    from .comm import World
    from .cost.compute import Profile
    from .graph import load_model
    from .runtime.profile import default_path, device_name, profile
    world = World.create().watch(args.watchdog)
    node_ranks = world.node_ranks()

    def load():
        graph = load_model(args.model)
        xp = backend.rank_module(args.backend, node_ranks, args.share_gpus, args.tf32)
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
                    log=print if world.rank == 0 else None, machine=args.machine,
                    progress=True)
    world.agree(lambda: store.save(path) if world.rank == 0 else None)
    if world.rank == 0:
        spread = f"; repeated timings of a tile differ by {100 * store.spread:.1f} % (median)" if store.spread else ""
        print(f"{device}: measured {count} tile shapes, {len(store)} in {path}{spread}")
    return 0


def cmd_calibrate(args):
    from .comm import World
    from .cost.calibrate import calibrate, check_name, host_name, prepare_output, summary, to_json, write_machine
    from . import backend
    from .comm import choose_transport
    world = World.create().watch(args.watchdog)
    node_ranks = world.node_ranks()
    args.name = args.name or world.bcast(host_name() if world.rank == 0 else None)

    def load():
        check_name(args.name)
        if world.rank == 0:
            prepare_output(args.output)
        return backend.rank_module(args.backend, node_ranks, args.share_gpus)
    xp = world.agree(load)
    world.use(choose_transport(world, xp, args.transport))
    machine = calibrate(world, args.name, args.quick, xp)
    world.agree(lambda: write_machine(machine, args.output) if world.rank == 0 else None)
    if world.rank == 0:
        print(json.dumps(to_json(machine, args.output), indent=1) if args.json
              else "\n".join(summary(machine, args.output)))
    return 0


def _add_measuring_commands(sub, common):
    """Add ``calibrate`` and ``profile``, the commands that measure this machine for the planner."""
    p = sub.add_parser("calibrate", parents=[common], help="measure the machine model (links, device) on MPI ranks",
                       description="Measure the machine the ranks run on and write its machine YAML "
                                   "(jobs/machines/*.yaml): bandwidth and latency of exchanges within a node and "
                                   "between nodes (all rank pairs at once; needs mpiexec -n 2 or more), and each "
                                   "rank's float32 matmul rate, memory bandwidth and per-op overhead (all ranks at "
                                   "once, averaged). Run it with the ranks per node training will use.")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="machine YAML to write (rank 0)")
    p.add_argument("--name", help="the machine's name (default: the host's, as rank 0 knows it)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (seconds; for tests)")
    p.add_argument("--json", action="store_true", help="print the machine and the raw measurements as JSON")
    device_arguments(p, tf32=False, backend_help="cupy: measure each rank's GPU, and the links between GPUs "
                     "through --transport", transport_help="the transport training will use (default auto: nccl, "
                     "cuda-mpi or host, whichever works)")
    p.set_defaults(run=cmd_calibrate)

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
    p.add_argument("--machine", help="machine YAML whose allreduce model the measured drift and wait per "
                   "synchronization are taken beyond (default: the built-in local machine)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"])
    device_arguments(p)
    p.set_defaults(run=cmd_profile)


def device_arguments(p, tf32=True, backend_help=None, transport_help=None):
    """The options every command that runs on this rank's device takes, as ``backend.rank_module`` reads them:
    ``--backend``, ``--tf32`` (unless not ``tf32``), ``--share-gpus``, and ``--transport`` when
    ``transport_help`` says what it is for."""
    p.add_argument("--backend", default="auto", choices=["auto", "numpy", "cupy"], help=backend_help)
    if tf32:
        p.add_argument("--tf32", action="store_true", help="cupy, float32: let convolutions and matmuls use TF32")
    if transport_help:
        p.add_argument("--transport", default="auto", choices=["auto", "host", "cuda-mpi", "nccl"],
                       help=transport_help)
    p.add_argument("--share-gpus", action="store_true", help="let more ranks than GPUs share a node's GPUs")
    watchdog_argument(p)


def _add_model_import(sub, common):
    """``spmdcnn model import ...``: main() routes it to the sub-command ``model-import`` (unlisted: it shows as
    part of ``model``)."""
    p = sub.add_parser("model-import", parents=[common], prog="spmdcnn model import",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Write a PyTorch network as a model YAML: torchvision's (torchvision:NAME) or\n"
                                   "one a Python file builds (FILE.py:CALLABLE, a function or class returning a\n"
                                   "torch.nn.Module). Its forward is captured by torch.export in training mode and\n"
                                   "each ATen operator mapped to an spmdcnn op (dropout, stochastic depth and batch\n"
                                   "norm's momentum kept); layers keep PyTorch's module names, so checkpoint\n"
                                   "import/export move its state dicts as they are. A loss follows its output\n"
                                   "(a cross-entropy of logits, or per position of a segmenter's output; --loss).\n"
                                   "Every node that maps to no op is named in one message. Needs PyTorch (and\n"
                                   "torchvision for its models).\n"
                                   "See docs/formats.md#importing-a-pytorch-model.",
                       epilog="examples:\n"
                              "  spmdcnn model import torchvision:efficientnet_b0 -o models/efficientnet_b0.yaml\n"
                              "  spmdcnn model import mynet.py:build --input 1 64 64 -o mynet.yaml --weights mynet.h5")
    p.add_argument("source", help="torchvision:NAME or FILE.py:CALLABLE")
    p.add_argument("-o", "--output", required=True, metavar="MODEL.yaml", help="model YAML to write")
    p.add_argument("--weights", metavar="CKPT.h5", help="also write the module's weights as a checkpoint (a job's "
                                                         "init:)")
    p.add_argument("--input", type=int, nargs="+", metavar="N", help="one sample's shape, C H W (C D H W for "
                                                                     "volumes, C W for sequences; torchvision's "
                                                                     "models: 3 224 224)")
    p.add_argument("--name", help="the model's name (default: the torchvision model's, or the callable's)")
    p.add_argument("--loss", choices=("cross_entropy", "dice_ce", "mse"),
                   help="the loss after the output: cross_entropy (the default: of logits (N, K), or per position of "
                        "a segmenter's (N, K, S...)), dice_ce (MONAI's DiceCELoss: Dice plus cross-entropy), mse "
                        "(regression targets (N, K))")
    p.add_argument("--check", action="store_true",
                   help="before writing, take one SGD step in float64 with the model and with the network from the "
                        "same weights and compare their losses, and the evaluation loss after the step (to 1e-8, "
                        "dropout and stochastic depth at 0 for the step): refused, nothing written, where they "
                        "differ (cross-entropy, Dice-CE and mse losses)")
    p.set_defaults(run=cmd_model_import)

    p = sub.add_parser("train", parents=[common], help="train a model as a job YAML describes",
                       description="Run a training job (jobs/*.yaml) on one process, or on MPI ranks under its plan "
                                   "(mpiexec -n K spmdcnn train JOB; srun under Slurm): logs loss and images/s, "
                                   "writes metrics and checkpoints, resumes from checkpoint.path when it exists.")
    p.add_argument("job", help="job YAML file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a job key, e.g. --set optimizer.lr=0.1 (repeatable)")
    p.set_defaults(run=cmd_train)

    p = sub.add_parser("bench", parents=[common], help="time training iterations on synthetic or real data",
                       description="Time whole training iterations (forward, backward, SGD update) after a warm-up;"
                                   " print images/s and peak memory. Under mpiexec, run the plan on the ranks "
                                   "and split the time into compute, transfer and sync, with the bytes moved.")
    p.add_argument("model", help="model YAML file")
    p.add_argument("--batch", type=int, required=True, help="global batch size")
    p.add_argument("--steps", type=int, default=10, help="timed iterations (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations first (default 2)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"],
                   help="bfloat16: activations in bfloat16, float32 master weights (cupy only)")
    device_arguments(p, transport_help="how ranks move data (default auto: nccl, cuda-mpi or host, whichever works)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plan", default="data",
                   help="data, model, owt, auto (the planner) or a plan YAML file (default data; one process runs "
                        "the whole model)")
    p.add_argument("--machine", help="machine YAML for --plan auto, whose sync (allreduce or parameter-server) "
                   "the ranks run (default: the built-in local machine)")
    p.add_argument("--memory", metavar="SIZE", help="with --plan auto: the most memory a device may hold (16GiB, "
                   "800MB; the job's memory key), which the search keeps to")
    p.add_argument("--data", metavar="FILE", help="train on this HDF5 dataset's shuffled batches, read as training "
                   "reads them, instead of one fixed synthetic batch; the time a step waits for its batch is printed")
    p.add_argument("--augment", type=augment_arg, metavar="YAML", help="with --data: data.augment as YAML, e.g. "
                   "'{crop: [224, 224], flip: true}'")
    p.add_argument("--workers", default="auto", type=count_arg, help="with --data: data.workers (default auto)")
    p.add_argument("--prefetch", default="auto", type=ahead_arg, help="with --data: data.prefetch (default auto)")
    sync_arguments(p)
    p.add_argument("--trace", metavar="FILE", help="write the last timed iteration of every rank (compute per "
                   "layer, exchanges, allreduces) as Chrome trace-event JSON (Perfetto, chrome://tracing; "
                   "spmdcnn plot --trace draws it)")
    p.add_argument("--json", action="store_true", help="print JSON (images_per_s, compute_s, transfer_s, sync_s, "
                   "sync_exposed_s, bytes_transferred, peak_memory_bytes, data_wait_s, ...)")
    p.set_defaults(run=cmd_bench)


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

    p = sub.add_parser("model", parents=[common], help="describe a model: layers, output shapes, parameters, FLOPs; "
                                                       "model import: a PyTorch network as a model",
                       description="Print a model's layers with output shape, parameter count and forward FLOPs, "
                                   "and the totals. Block instances are shown as one row unless --expand. "
                                   "'spmdcnn model import SOURCE -o MODEL.yaml' writes a PyTorch network as a model "
                                   "(spmdcnn model import --help).")
    p.add_argument("model", help="model YAML file (models/*.yaml)")
    p.add_argument("--batch", type=int, default=1, help="batch size for shapes and FLOPs (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON (with total_params and total_flops)")
    p.add_argument("--expand", action="store_true", help="show every layer instead of one row per block")
    p.set_defaults(run=cmd_model)

    _add_model_import(sub, common)
    _add_measuring_commands(sub, common)
    add_plan_commands(sub, common)
    add_file_commands(sub, common)
    return parser


# commands that need no other rank
SERIAL = ("model", "model-import", "plan", "simulate", "plot", "checkpoint", "data")


def routed(argv):
    """The command line as the parser takes it: ``model import ...`` (after any options) is the sub-command
    ``model-import``."""
    argv = list(argv)
    first = next((i for i, word in enumerate(argv) if not word.startswith("-")), len(argv))
    if argv[first:first + 2] == ["model", "import"]:
        return argv[:first] + ["model-import"] + argv[first + 2:]
    return argv


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(routed(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_help()
        return 2
    for name in ("batch", "steps", "devices", "nodes", "repeats"):
        if getattr(args, name, 1) is not None and getattr(args, name, 1) <= 0:
            parser.error(f"--{name} must be positive")
    if getattr(args, "warmup", 0) < 0:
        parser.error("--warmup must be zero or positive")
    if args.command in SERIAL and getattr(args, "trials", None) is None:    # plan --trials runs on every rank
        # under mpiexec: rank 0 runs it, once; every rank exits with its status
        from .comm.guard import serial
        return serial(lambda: _run(args, alone=True))
    return _run(args)


def _run(args, alone=False):
    """The command's exit status; an error is printed as one line (``alone``: this process runs the command by
    itself, even under MPI, so its errors need not end other ranks)."""
    try:
        return args.run(args)
    except BrokenPipeError:  # the output went to a pipe that closed early (| head)
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as error:
        said = f" {error}" if str(error) else ""            # a training run says what stopping now loses
        return _fail(f"spmdcnn: interrupted{said}", error, 130, alone)
    except MemoryError as error:
        _debug(args, alone)
        return _fail(f"spmdcnn: error: out of memory ({str(error) or 'allocation failed'}); use a smaller batch "
                     "or model", error, 2, alone)
    except (ValueError, OSError, FloatingPointError, RuntimeError) as error:
        _debug(args, alone)
        return _fail(f"spmdcnn: error: {error}", error, 2, alone)
    except Exception as error:          # a bug: under MPI the other ranks must not be left waiting
        traceback.print_exc()
        return _fail(f"spmdcnn: error: internal error {type(error).__name__}: {error}", error, 1, alone)


def _debug(args, alone=False):
    """With --debug, the traceback: raised in one process, printed under MPI (where the job must still end)."""
    if args.debug:
        from .comm.guard import world_size
        if world_size() == 1:
            raise
        traceback.print_exc()


def _fail(message, error, status=2, alone=False):
    """Print the error and end this process, or under MPI the whole job (see :mod:`spmdcnn.comm.guard`);
    ``alone``: only print it (the other ranks wait for this one's status)."""
    if alone:
        print(message, file=sys.stderr, flush=True)
        return status
    from .comm.guard import fail
    return fail(message, error, status)


def command():
    """The ``spmdcnn`` command: :func:`main` in a process of its own, whose freed memory is kept for the next
    arrays (:func:`spmdcnn.keep_freed_memory`)."""
    from . import keep_freed_memory
    keep_freed_memory()
    return main()


if __name__ == "__main__":
    sys.exit(command())
