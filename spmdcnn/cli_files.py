"""The ``spmdcnn checkpoint`` and ``spmdcnn data`` commands: checkpoints and datasets, in and out."""

import json


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


def cmd_data(args):
    if args.action == "digits":
        import os
        from .io.digits import make_digits
        paths = [os.path.join(args.output, name) for name in ("train.h5", "val.h5")]
        train, val = make_digits(*paths, held_out=args.held_out, seed=args.seed)
        print(f"wrote {paths[0]} ({train} samples) and {paths[1]} ({val} held out)")
        return 0
    if args.action == "convert":
        return _convert(args)
    from .io.dataset import dataset_info
    info = dataset_info(args.file)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    labels = f" (labels {info['labels'][0]}..{info['labels'][1]})" if info["labels"] else ""
    print(f"{args.file}: {info['samples']} samples of {'x'.join(map(str, info['shape']))} (C x H x W) {info['dtype']}, "
          f"{info['classes']} classes{labels}")
    for key in ("class_names", "mean", "std", "description"):
        if info.get(key) is not None:
            print(f"  {key}: {info[key]}")
    print("  samples per class: " + ", ".join(f"{label}: {count}" for label, count in info["per_class"].items()))
    return 0


def _convert(args):
    """``data convert``: a folder, or arrays with ``--labels``. Its progress goes to standard output, like the
    ``wrote ...`` line printed last (the progress is closed, its bar erased, before): one stream keeps them in
    order in a batch log, and errors alone on standard error."""
    from .io.convert import convert_arrays, convert_folder
    from .progress import Progress

    def progress(total):
        return Progress(total, "convert", unit="images")
    if args.labels:
        count, shape = convert_arrays(args.source, args.labels, args.output, args.channels_last, args.normalize,
                                      progress)
        what = ""
    else:
        count, shape, classes = convert_folder(args.source, args.output, args.size, args.grayscale,
                                               args.normalize, progress)
        what = f", {len(classes)} classes ({', '.join(classes[:5])}{' ...' if len(classes) > 5 else ''})"
    print(f"wrote {args.output}: {count} images of {'x'.join(map(str, shape))} (C x H x W){what}")
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

    p = sub.add_parser("data", parents=[common], help="make and inspect HDF5 datasets",
                       description="Make and inspect HDF5 datasets (docs/formats.md#dataset-files).")
    dsub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    d = dsub.add_parser("digits", parents=[common], help="scikit-learn's handwritten digits as train.h5 and val.h5",
                        description="Write scikit-learn's handwritten digits (1,797 8x8 images, shipped with "
                        "spmdcnn) as OUTPUT/train.h5 and OUTPUT/val.h5, a held-out share of each class in val.h5.")
    d.add_argument("-o", "--output", default="data/digits", help="folder to write (default data/digits)")
    d.add_argument("--held-out", type=float, default=0.2, help="share of each class held out (default 0.2)")
    d.add_argument("--seed", type=int, default=0, help="seed of the split (default 0)")
    d.set_defaults(run=cmd_data)
    d = dsub.add_parser("convert", parents=[common], help="an image folder or NumPy arrays into a dataset",
                        description="Write an HDF5 dataset from an image folder (one sub-folder of images per class; "
                        "their sorted names give the labels; needs Pillow) or from NumPy arrays (SOURCE the images "
                        ".npy, --labels the labels .npy). Streams: datasets larger than memory convert. Shows its "
                        "progress: a bar on a terminal, a line every 5 % in a log.")
    d.add_argument("source", help="image folder, or images .npy ((N, C, H, W) or (N, H, W, C), uint8 or float32)")
    d.add_argument("-o", "--output", required=True, help="dataset HDF5 file to write")
    d.add_argument("--labels", help="labels .npy ((N,) integers): SOURCE is then an images .npy")
    d.add_argument("--size", type=int, nargs=2, metavar=("H", "W"), help="resize every image to H x W (folders)")
    d.add_argument("--grayscale", action="store_true", help="one channel instead of RGB (folders)")
    layout = d.add_mutually_exclusive_group()
    layout.add_argument("--channels-first", dest="channels_last", action="store_const", const=False, default=None,
                        help="the images .npy is (N, C, H, W) (without either option: taken as that when only its "
                        "second dim is 1, 3 or 4; any other shape needs one of the two)")
    layout.add_argument("--channels-last", dest="channels_last", action="store_const", const=True, default=None,
                        help="the images .npy is (N, H, W, C)")
    d.add_argument("--no-normalize", dest="normalize", action="store_false",
                   help="store no per-channel mean and std (by default they are measured and stored)")
    d.set_defaults(run=cmd_data)
    d = dsub.add_parser("info", parents=[common], help="describe a dataset: samples, shape, classes",
                        description="Describe an HDF5 dataset: samples, image shape and type, classes, mean/std.")
    d.add_argument("file", help="dataset HDF5 file")
    d.add_argument("--json", action="store_true", help="print JSON")
    d.set_defaults(run=cmd_data)
