"""The ``spmdcnn checkpoint`` and ``spmdcnn data`` commands: checkpoints and datasets, in and out."""

import argparse
import json
import os

from .io.samples import axes_text, kind


def watchdog_setting(text):
    """The :class:`~spmdcnn.comm.watchdog.Settings` of ``--watchdog`` (argparse reports a bad one)."""
    from .comm.watchdog import Settings
    try:
        return Settings.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).split(": ", 1)[1]) from None



def watchdog_argument(p, when="on several ranks"):
    """``--watchdog`` (:func:`watchdog_setting`), for the commands that run collectives on ranks."""
    p.add_argument("--watchdog", default="auto", type=watchdog_setting, metavar="auto|off|WARN[,ABORT]",
                   help=f"{when}: seconds without progress before naming the ranks that hold the job up, and after "
                        "that before ending it (default auto: 60 s or more, then 540 s or more; "
                        "docs/architecture.md#when-a-rank-stalls)")

def cmd_checkpoint(args):
    from .io.checkpoint import describe, load_checkpoint
    if args.action in ("export", "import"):
        return _torch_weights(args)
    if args.json:
        ckpt = load_checkpoint(args.file)
        print(json.dumps({"path": args.file, **{k: v for k, v in ckpt.attrs.items() if k != "model"},
                          "params": {k: list(v.shape) for k, v in ckpt.params.items()},
                          "buffers": {k: list(v.shape) for k, v in ckpt.buffers.items()},
                          "momentum": bool(ckpt.momentum), "state": ckpt.state}, indent=1, default=str))
    else:
        print(describe(args.file))
    return 0


def _torch_weights(args):
    from .graph import load_model
    from .graph.graph import parse_model
    from .io.checkpoint import load_checkpoint
    from .io.torchstate import export_torch, import_torch
    from .io.yamlfile import load_yaml_text
    if args.action == "import":
        count = import_torch(args.file, load_model(args.model), args.output, args.drop)
        print(f"wrote {args.output}: {count} tensors from {args.file} (step 0; use it as a job's init:)")
        return 0
    if args.model:
        graph = load_model(args.model)
    else:
        text = load_checkpoint(args.file).model_text
        graph = parse_model(load_yaml_text(text, f"{args.file} (model)"), f"{args.file} (model)", text)
    count = export_torch(args.file, args.torch, graph)
    print(f"wrote {args.torch}: {count} tensors of model '{graph.name}' (a PyTorch state dict)")
    return 0


def cmd_data_bench(args):
    from .io.databench import data_bench, describe
    if args.batch <= 0 or args.batches <= 0 or args.warmup < 0:
        raise ValueError("--batch and --batches must be positive and --warmup non-negative")
    result = data_bench(args.file, args.batch, args.workers, args.prefetch, args.augment, args.batches, args.warmup,
                        args.dtype)
    print(json.dumps(result, indent=1) if args.json else "\n".join(describe(result)))
    return 0


def count_arg(text, least=0):
    """``auto`` or an integer of at least ``least`` (argparse type)."""
    import argparse
    if text == "auto":
        return text
    if text.isdigit() and int(text) >= least:
        return int(text)
    what = "a non-negative integer" if least == 0 else f"an integer of {least} or more"
    raise argparse.ArgumentTypeError(f"expected auto or {what}, got {text!r}")


def positive_float(text):
    """A number above 0 (argparse type)."""
    import argparse
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def ahead_arg(text):
    """``--prefetch``: ``auto`` or 1 or more (argparse type)."""
    return count_arg(text, least=1)


def augment_arg(text):
    """A ``data.augment`` mapping from YAML (argparse type)."""
    import argparse
    import yaml
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise argparse.ArgumentTypeError(f"not valid YAML: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a mapping such as '{{crop: [224, 224], flip: true}}', got {text!r}")
    return value


def cmd_data(args):
    if args.action == "digits":
        from .io.digits import make_digits
        paths = [os.path.join(args.output, name) for name in ("train.h5", "val.h5")]
        train, val = make_digits(*paths, held_out=args.held_out, seed=args.seed)
        print(f"wrote {paths[0]} ({train} samples) and {paths[1]} ({val} held out)")
        return 0
    if args.action == "cosmo":
        return _cosmo(args)
    if args.action == "shapes":
        return _shapes(args)
    if args.action == "convert":
        return _convert(args)
    from .io.dataset import dataset_info
    info = dataset_info(args.file)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    axes = f"C x {axes_text(len(info['shape']) - 1, ' x ')}"
    answers = []
    if "classes" in info:
        labels = f" (labels {info['labels'][0]}..{info['labels'][1]})" if info["labels"] else ""
        answers.append(f"{'masks of ' if info.get('masks') else ''}{info['classes']} classes{labels}")
    if "targets" in info:
        answers.append(f"{info['targets']['count']} targets per sample")
    print(f"{args.file}: {info['samples']} samples of {'x'.join(map(str, info['shape']))} ({axes}) "
          f"{info['dtype']}, {' and '.join(answers)}")
    for key in ("class_names", "mean", "std", "description"):
        if info.get(key) is not None:
            print(f"  {key}: {info[key]}")
    if "per_class" in info:
        print(f"  {('voxels' if len(info['shape']) == 4 else 'pixels') if info.get('masks') else 'samples'} per class: " + ", ".join(f"{label}: {count}" for label, count in info["per_class"].items()))
    if "targets" in info:
        targets = info["targets"]
        names = targets["names"] or [f"target {k}" for k in range(targets["count"])]
        for k, name in enumerate(names):
            if targets["min"]:
                print(f"  {name}: {targets['min'][k]:.4g} .. {targets['max'][k]:.4g}, mean {targets['mean'][k]:.4g}")
    return 0


def _cosmo(args):
    """``data cosmo``: universes to regress 4 parameters from (:mod:`spmdcnn.io.cosmo`), with progress."""
    from .io.cosmo import held_out, make_cosmo
    from .progress import Progress
    paths = [os.path.join(args.output, name) for name in ("train.h5", "val.h5")]
    val_samples = held_out(args.samples) if args.val_samples is None else args.val_samples
    with Progress(args.samples + val_samples, f"data cosmo {args.output}", "universes") as progress:
        train, val = make_cosmo(*paths, size=args.size, samples=args.samples, val_samples=val_samples,
                                seed=args.seed, progress=progress.update)
    print(f"wrote {paths[0]} ({train} universes of 4x{args.size}^3) and {paths[1]} ({val} held out); targets: "
          "amplitude, spectral_index, cutoff, growth_index, each in [-1, 1]")
    return 0


def _shapes(args):
    """``data shapes``: discs, boxes and rings to segment (:mod:`spmdcnn.io.shapes`), with progress."""
    from .io.shapes import CLASSES, held_out, make_shapes
    from .progress import Progress
    paths = [os.path.join(args.output, name) for name in ("train.h5", "val.h5")]
    val_samples = held_out(args.samples) if args.val_samples is None else args.val_samples
    rank = 3 if args.volumes else 2
    with Progress(args.samples + val_samples, f"data shapes {args.output}", "samples") as progress:
        train, val = make_shapes(*paths, size=args.size, rank=rank, samples=args.samples, val_samples=val_samples,
                                 seed=args.seed, progress=progress.update)
    kind = "volumes" if rank == 3 else "images"
    print(f"wrote {paths[0]} ({train} {kind} of 1x{'x'.join([str(args.size)] * rank)}) and {paths[1]} ({val} held "
          f"out); masks of {len(CLASSES)} classes: {', '.join(CLASSES)}")
    return 0


def _convert(args):
    """``data convert``: a folder (of class sub-folders, or of images with ``--labels``), or arrays with
    ``--labels``. Its progress goes to standard output, like the ``wrote ...`` line printed last (the progress is
    closed, its bar erased, before): one stream keeps them in order in a batch log, and errors alone on standard
    error."""
    from . import usable_cores
    from .io.convert import convert_arrays, convert_folder
    from .io.labels import training_statistics
    from .io.dataset import DataError
    from .progress import Progress

    def progress(total):
        return Progress(total, "convert", unit="images")
    if args.masks and (args.labels or args.targets or not os.path.isdir(args.source)):
        raise DataError(f"--masks {args.masks}: masks go with a folder of images, instead of --labels or --targets")
    if args.mask_values and not args.masks:
        raise DataError(f"--mask-values {args.mask_values}: a value map goes with --masks")
    if args.targets and (os.path.isdir(args.source) or args.labels):
        raise DataError(f"--targets {args.targets}: targets go with a samples .npy, instead of --labels")
    if (args.labels or args.targets) and not os.path.isdir(args.source):
        if args.classes:
            raise DataError(f"--classes {args.classes}: class names label the images of a folder (with --labels, "
                            "a text or CSV file); an images .npy takes integer labels")
        count, shape = convert_arrays(args.source, args.labels or args.targets, args.output, args.channels_last,
                                      args.normalize, progress, args.chunk, targets=bool(args.targets))
        what = f", targets from {args.targets}" if args.targets else ""
    else:
        count, shape, classes = convert_folder(
            args.source, args.output, args.size, args.grayscale, args.normalize, progress, labels=args.labels,
            classes=args.classes, fit=args.fit, workers=usable_cores() if args.workers is None else args.workers,
            chunk=args.chunk, masks=args.masks, mask_values=args.mask_values)
        if args.masks:
            what = f", masks from {args.masks}" + (f" mapped by {args.mask_values}" if args.mask_values else "")
        elif classes is None:
            what = f", integer labels from {args.labels}"
        else:
            shared = " and normalised with its mean and std" if args.normalize and training_statistics(args.classes) \
                else ""
            how = (f" as in {args.classes}{shared}" if args.classes else
                   ", numbered in sorted order (no --classes)" if args.labels else "")
            what = f", {len(classes)} classes ({', '.join(classes[:5])}{' ...' if len(classes) > 5 else ''}){how}"
    rank = len(shape) - 1
    print(f"wrote {args.output}: {count} {kind(rank)} of {'x'.join(map(str, shape))} (C x {axes_text(rank, ' x ')})"
          f"{what}")
    return 0


def add_file_commands(sub, common):
    """Add the ``checkpoint`` and ``data`` commands to the subparsers ``sub``."""
    p = sub.add_parser("checkpoint", parents=[common], help="inspect checkpoints; weights to and from PyTorch",
                       description="Inspect spmdcnn checkpoints (HDF5); move their weights to and from PyTorch.")
    csub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = csub.add_parser("info", parents=[common], help="describe a checkpoint: model, step, tensors, state")
    c.add_argument("file", help="checkpoint HDF5 file")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(run=cmd_checkpoint)
    c = csub.add_parser("export", parents=[common], help="write a checkpoint's weights as a PyTorch state dict",
                        description="Write the parameters and batch-norm statistics of a checkpoint as a PyTorch "
                        "state dict (torch.save), under the model's PyTorch names (torch_names; torchvision's for "
                        "the shipped AlexNet, VGG-16, ResNet-50 and Inception-v3). Needs PyTorch.")
    c.add_argument("file", help="checkpoint HDF5 file")
    c.add_argument("--torch", required=True, metavar="FILE", help="state dict to write (.pt)")
    c.add_argument("--model", help="model YAML whose torch_names to use (default: the checkpoint's own model)")
    c.set_defaults(run=cmd_checkpoint)
    c = csub.add_parser("import", parents=[common], help="write a PyTorch state dict as a checkpoint for init:",
                        description="Write the weights of a PyTorch state dict (torchvision's, say) as a checkpoint "
                        "of MODEL at step 0, for a job's init:. Every tensor the model has must be there, with its "
                        "shape, and no other. Needs PyTorch.")
    c.add_argument("file", help="PyTorch state dict (torch.save(model.state_dict(), FILE))")
    c.add_argument("--model", required=True, help="model YAML the weights are for")
    c.add_argument("--drop", action="append", default=[], metavar="PREFIX",
                   help="leave out the tensors whose names start with PREFIX (repeatable; torchvision's "
                   "Inception-v3 has an auxiliary head: --drop AuxLogits.)")
    c.add_argument("-o", "--output", required=True, help="checkpoint HDF5 file to write")
    c.set_defaults(run=cmd_checkpoint)

    _add_data_commands(sub, common)


def _add_making_commands(dsub, common):
    """``data digits``, ``data cosmo`` and ``data shapes``: datasets spmdcnn writes itself."""
    d = dsub.add_parser("digits", parents=[common], help="scikit-learn's handwritten digits as train.h5 and val.h5",
                        description="Write scikit-learn's handwritten digits (1,797 8x8 images, shipped with "
                        "spmdcnn) as OUTPUT/train.h5 and OUTPUT/val.h5, a held-out share of each class in val.h5.")
    d.add_argument("-o", "--output", default="data/digits", help="folder to write (default data/digits)")
    d.add_argument("--held-out", type=float, default=0.2, help="share of each class held out (default 0.2)")
    d.add_argument("--seed", type=int, default=0, help="seed of the split (default 0)")
    d.set_defaults(run=cmd_data)
    d = dsub.add_parser("cosmo", parents=[common], help="universes of Gaussian random fields to regress 4 parameters "
                        "from", description="Write OUTPUT/train.h5 and OUTPUT/val.h5: volumes of 4 x SIZE^3, four "
                        "snapshots of a Gaussian random field whose power spectrum depends on 4 parameters "
                        "(amplitude, spectral index, cutoff, growth index), with those parameters, normalised to "
                        "[-1, 1], as /targets: a regression task for 3D CNNs such as models/cosmoflow.yaml "
                        "(docs/formats.md#dataset-files).")
    d.add_argument("-o", "--output", default="data/cosmo", help="folder to write (default data/cosmo)")
    d.add_argument("--size", type=int, default=32, help="the volumes' extent along each axis (default 32)")
    d.add_argument("--samples", type=int, default=1024, help="training universes (default 1024)")
    d.add_argument("--val-samples", type=int, help="held-out universes (default: a quarter of --samples)")
    d.add_argument("--seed", type=int, default=0, help="seed of the universes (default 0)")
    d.set_defaults(run=cmd_data)
    d = dsub.add_parser("shapes", parents=[common], help="discs, boxes and rings to segment, with their masks",
                        description="Write OUTPUT/train.h5 and OUTPUT/val.h5: images (or with --volumes, volumes) "
                        "of one channel holding random discs, boxes and rings (balls, cubes and shells) on textured "
                        "noise, told apart by shape alone, with a mask of each pixel's class (background, disc, "
                        "box, ring) as /labels: a segmentation task for models such as models/unet2d.yaml "
                        "(docs/formats.md#dataset-files).")
    d.add_argument("-o", "--output", default="data/shapes", help="folder to write (default data/shapes)")
    d.add_argument("--volumes", action="store_true", help="3D volumes instead of 2D images")
    d.add_argument("--size", type=int, default=64, help="the samples' extent along each axis (default 64)")
    d.add_argument("--samples", type=int, default=512, help="training samples (default 512)")
    d.add_argument("--val-samples", type=int, help="held-out samples (default: a quarter of --samples)")
    d.add_argument("--seed", type=int, default=0, help="seed of the samples (default 0)")
    d.set_defaults(run=cmd_data)


def _add_data_commands(sub, common):
    """``data digits``, ``convert``, ``info`` and ``bench``."""
    p = sub.add_parser("data", parents=[common], help="make, inspect and time HDF5 datasets",
                       description="Make, inspect and time HDF5 datasets (docs/formats.md#dataset-files).")
    dsub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    _add_making_commands(dsub, common)
    d = dsub.add_parser("convert", parents=[common], help="an image folder or NumPy arrays into a dataset",
                        description="Write an HDF5 dataset from an image folder (one sub-folder of images per class, "
                        "their sorted names giving the labels; or one folder of images with --labels, as ImageNet's "
                        "validation set comes; needs Pillow) or from NumPy arrays (SOURCE the images or volumes .npy, "
                        "--labels the labels .npy or --targets the regression targets .npy). Streams: datasets "
                        "larger than memory convert. Shows its progress: a bar on a terminal, a line every 5 % in a "
                        "log.")
    d.add_argument("source", help="image folder, or a samples .npy: images (N, C, H, W) or (N, H, W, C), volumes "
                   "(N, C, D, H, W) or (N, D, H, W, C); uint8 or float32")
    d.add_argument("-o", "--output", required=True, help="dataset HDF5 file to write")
    d.add_argument("--labels", metavar="FILE",
                   help="a folder of images: a text file of one label a line (for its images in sorted name "
                   "order) or a CSV of file,label rows (a header row is skipped; the label the first word of its "
                   "field), labels being integers or class names; an images .npy: a labels .npy ((N,) integers)")
    d.add_argument("--targets", metavar="FILE", help="a samples .npy: a targets .npy ((N, K) floats, the values "
                   "mse_loss regresses), written as /targets instead of labels")
    d.add_argument("--masks", metavar="DIR", help="a folder of images: the folder of their masks (segmentation), a "
                   "class per pixel, one file per image of the same name (name.png for name.jpg): a palette PNG's "
                   "indices or a greyscale image's values, fitted as the images are (nearest neighbour); written as "
                   "/labels (N, H, W)")
    d.add_argument("--mask-values", metavar="FILE", help="with --masks: a text file mapping mask values to classes, "
                   "'VALUE CLASS' or 'R G B CLASS' a line (colour masks need one)")
    d.add_argument("--classes", metavar="FILE",
                   help="number class names as the training set does: its dataset .h5 (its classes attribute), or "
                   "a text file of one name a line (without it: in sorted order)")
    d.add_argument("--size", type=int, nargs=2, metavar=("H", "W"), help="fit every image to H x W (folders)")
    d.add_argument("--fit", choices=("stretch", "crop"), default="stretch",
                   help="with --size: stretch resizes to H x W (the default); crop resizes the shorter side to fit, "
                   "keeping the aspect, and keeps the center H x W")
    d.add_argument("--grayscale", action="store_true", help="one channel instead of RGB (folders)")
    d.add_argument("--workers", type=int, metavar="N",
                   help="decode images in N worker processes (default: the usable cores; 0 or 1: in this one)")
    d.add_argument("--chunk", type=int, default=1, metavar="N",
                   help="images per HDF5 chunk (default 1, fastest for shuffled reads; 0: one contiguous array)")
    layout = d.add_mutually_exclusive_group()
    layout.add_argument("--channels-first", dest="channels_last", action="store_const", const=False, default=None,
                        help="the samples .npy is (N, C, H, W) or (N, C, D, H, W) (without either option: taken as "
                        "that when only its second dim is 1, 3 or 4; any other shape needs one of the two)")
    layout.add_argument("--channels-last", dest="channels_last", action="store_const", const=True, default=None,
                        help="the samples .npy is (N, H, W, C) or (N, D, H, W, C)")
    d.add_argument("--no-normalize", dest="normalize", action="store_false",
                   help="store no per-channel mean and std (by default they are measured and stored)")
    d.set_defaults(run=cmd_data)
    d = dsub.add_parser("info", parents=[common], help="describe a dataset: samples, shape, classes",
                        description="Describe an HDF5 dataset: samples, image shape and type, classes, mean/std.")
    d.add_argument("file", help="dataset HDF5 file")
    d.add_argument("--json", action="store_true", help="print JSON")
    d.set_defaults(run=cmd_data)
    d = dsub.add_parser("bench", parents=[common], help="images/s a dataset delivers to one rank",
                        description="Time shuffled batches of a dataset read as training reads them (worker "
                        "processes reading ahead, augmentation), with no computing in between: the images/s it "
                        "can feed one rank, and a worker's peak memory (docs/formats.md#reading-ahead).")
    d.add_argument("file", help="dataset HDF5 file")
    d.add_argument("--batch", type=int, required=True, help="samples per batch (one rank's share)")
    d.add_argument("--workers", default="auto", type=count_arg, help="worker processes (default auto: one per core, "
                   "at most 8; 0: read in this process)")
    d.add_argument("--prefetch", default="auto", type=ahead_arg, help="batches read ahead (default auto: workers + 1)")
    d.add_argument("--augment", type=augment_arg, default=None, metavar="YAML",
                   help="data.augment as YAML, e.g. '{crop: [224, 224], flip: true}'")
    d.add_argument("--batches", type=int, default=50, help="timed batches (default 50)")
    d.add_argument("--warmup", type=int, default=3, help="untimed batches first (default 3)")
    d.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="the type read into")
    d.add_argument("--json", action="store_true", help="print JSON (images_per_s, worker_peak_bytes, ...)")
    d.set_defaults(run=cmd_data_bench)
