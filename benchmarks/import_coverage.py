"""Which real networks ``spmdcnn model import`` takes, and whether each computes what the network does.

    python benchmarks/import_coverage.py                       # every library installed, every model
    python benchmarks/import_coverage.py --libraries torchvision --only resnet18 fcn_resnet50 --json

For each network of torchvision's classification, segmentation and video zoos (and, where installed, the models
of timm, MONAI and segmentation-models-pytorch listed in CANDIDATES), with its parameters and statistics drawn at
random: the import's time, and either why it was refused (every node that maps to nothing, as ``spmdcnn model
import`` says it) or whether the imported model with the imported weights evaluates, in float64 on one process,
to the network's own loss in evaluation mode (cross-entropy of its main output, per position for a segmenter) to
1e-8: ``exact``, or ``differs`` with the relative error. One table, then the totals per library. A library that
is not installed is said so, not counted. Networks above ``--max-params`` are listed as too large to evaluate
here (their import is still tried).
"""

import argparse
import json
import math
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# MONAI's networks in 3D and segmentation-models-pytorch's U-Net, as the issue that asked for them names them:
# (library, name, builder (module, input shape))
CANDIDATES = [
    ("monai", "UNet", lambda m: (m.networks.nets.UNet(3, 1, 3, (8, 16, 32), (2, 2)), (1, 32, 32, 32))),
    ("monai", "BasicUNet", lambda m: (m.networks.nets.BasicUNet(3, 1, 3, features=(8, 8, 16, 32, 64, 8)),
                                      (1, 32, 32, 32))),
    ("monai", "SegResNet", lambda m: (m.networks.nets.SegResNet(3, init_filters=8, in_channels=1, out_channels=3),
                                      (1, 32, 32, 32))),
    ("monai", "DynUNet", lambda m: (m.networks.nets.DynUNet(3, 1, 3, [3, 3, 3], [1, 2, 2], [2, 2]), (1, 32, 32, 32))),
    ("monai", "DenseNet121", lambda m: (m.networks.nets.DenseNet121(3, 1, 2), (1, 32, 32, 32))),
    ("monai", "resnet18", lambda m: (m.networks.nets.resnet18(spatial_dims=3, n_input_channels=1, num_classes=2),
                                     (1, 32, 32, 32))),
    ("segmentation_models_pytorch", "Unet(resnet18)",
     lambda m: (m.Unet("resnet18", encoder_weights=None, classes=3), (3, 64, 64))),
]
# timm's CNN families (timm 1.0's modules built of convolutions, not of attention over activations) and the smallest
# model of each by parameters (its test_* networks left out); the families built on attention (vision_transformer,
# swin_transformer, maxxvit, mvitv2, levit, efficientvit, fastvit, metaformer, ...) are not candidates
TIMM_FAMILIES = {
    "byobnet": "mobileone_s1", "convmixer": "convmixer_768_32", "convnext": "convnext_zepto_rms",
    "cspnet": "cs3darknet_focus_s", "cspnext": "cspnext_tiny", "densenet": "densenet121", "dla": "dla46x_c",
    "dpn": "dpn48b", "efficientnet": "mobilenetv2_035", "fasternet": "fasternet_t0", "focalnet": "focalnet_tiny_srf",
    "ghostnet": "ghostnet_050", "hardcorenas": "hardcorenas_b", "hgnet": "hgnetv2_b0", "hrnet": "hrnet_w18_small",
    "inception_next": "inception_next_atto", "inception_resnet_v2": "inception_resnet_v2",
    "inception_v3": "inception_v3", "inception_v4": "inception_v4", "lcnetv2": "lcnetv2_small",
    "mambaout": "mambaout_femto", "mobilenetv3": "mobilenetv3_small_050", "nasnet": "nasnetalarge",
    "nfnet": "nf_regnet_b0", "pnasnet": "pnasnet5large", "rdnet": "rdnet_tiny", "regnet": "regnetx_002",
    "repghost": "repghostnet_050", "repvit": "repvit_m1", "res2net": "res2next50", "resnest": "resnest14d",
    "resnet": "resnet10t", "resnetv2": "resnetv2_18", "rexnet": "rexnet_100", "selecsls": "selecsls42",
    "senet": "legacy_seresnet18", "sknet": "skresnet18", "starnet": "starnet_s050", "tresnet": "tresnet_m",
    "vgg": "vgg11", "vovnet": "ese_vovnet19b_slim_dw", "xception": "legacy_xception",
    "xception_aligned": "xception41p",
}


def networks(libraries, only):
    """``(library, name, build)`` of every network to try; ``build()`` gives ``(module, input shape)``; a
    library not installed gives one entry whose build raises ImportError."""
    import importlib

    from spmdcnn.graph.torchimport import load_torchvision
    try:
        load_torchvision()              # timm and smp import torchvision, whose operators may need declaring first
    except Exception:
        pass
    if "torchvision" in libraries:
        from spmdcnn.graph.torchimport import build_torchvision, default_input, torchvision_names
        for name, kind in sorted(torchvision_names().items(), key=lambda item: (item[1], item[0])):
            yield (f"torchvision{'.' + kind if kind else ''}", name,
                   lambda name=name, kind=kind: (build_torchvision(name, kind), default_input(name, kind)))
    if "timm" in libraries:
        try:
            timm = importlib.import_module("timm")
        except ImportError:
            yield "timm", "(not installed)", None
        else:
            for name in TIMM_FAMILIES.values():
                yield "timm", name, lambda name=name: (timm.create_model(name, pretrained=False),
                                                       (3, 224, 224))
    for library in ("monai", "segmentation_models_pytorch"):
        if library not in libraries:
            continue
        try:
            package = importlib.import_module(library)
        except ImportError:
            yield library, "(not installed)", None
            continue
        for owner, name, build in CANDIDATES:
            if owner == library:
                yield library, name, lambda build=build, package=package: build(package)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--libraries", nargs="+", default=["torchvision", "timm", "monai",
                                                           "segmentation_models_pytorch"])
    parser.add_argument("--only", nargs="+", help="these network names alone")
    parser.add_argument("--max-params", type=float, default=1e8, help="evaluate networks of at most this many "
                                                                      "parameters (default 1e8)")
    parser.add_argument("--size", type=int, help="images of SIZE x SIZE (volumes SIZE^3) instead of each network's "
                                                 "default input (a quicker check)")
    parser.add_argument("--json", action="store_true", help="the rows as JSON")
    args = parser.parse_args()
    import torch

    from spmdcnn.graph.torchimport import ImportFailure, import_module, randomized
    from spmdcnn.runtime.torchcheck import TOLERANCE, check_import
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for library, name, build in networks(args.libraries, args.only):
            if args.only and name not in args.only and build is not None:
                continue
            row = {"library": library, "model": name, "parameters": None, "result": None, "why": "",
                   "import_s": None}
            rows.append(row)
            if build is None:
                row["result"] = "not installed"
                continue
            try:
                torch.manual_seed(0)
                module, shape = build()
                if args.size:           # every spatial axis (a video's frames stay)
                    spatial = 2 if library.endswith("video") else len(shape) - 1
                    shape = tuple(shape[:len(shape) - spatial]) + (args.size,) * spatial
            except Exception as error:          # a builder this library version does not have
                row["result"], row["why"] = "not built", f"{type(error).__name__}: {error}"
                continue
            module = randomized(module)
            row["parameters"] = sum(p.numel() for p in module.parameters())
            output = os.path.join(folder, "model.yaml")
            errors = []

            def check(module, graph, arrays, input_shape):
                if row["parameters"] <= args.max_params:
                    checked = time.perf_counter()
                    try:
                        errors.append(max(check_import(module, graph, arrays, input_shape)))
                    except Exception as failure:
                        errors.append(f"checking: {type(failure).__name__}: {failure}")
                    row["check_s"] = time.perf_counter() - checked
            started = time.perf_counter()
            try:
                import_module(module, output, shape, source=f"{library}:{name}", check=check,
                              name=name.replace("(", "_").replace(")", ""))
            except ImportFailure as error:
                row["import_s"] = time.perf_counter() - started
                row["result"], row["why"] = "refused", str(error).partition(": ")[2]
                continue
            except Exception as error:          # the importer failed where it should have refused: a finding
                row["import_s"] = time.perf_counter() - started
                row["result"], row["why"] = "error", f"{type(error).__name__}: {error}"
                continue
            row["import_s"] = time.perf_counter() - started - row.get("check_s", 0.0)
            if not errors:
                row["result"], row["why"] = "imported", "too large to check here (--max-params)"
                continue
            if isinstance(errors[0], str):
                row["result"], row["why"] = "error", errors[0]
                continue
            row["result"] = "exact" if errors[0] <= TOLERANCE else "differs"
            row["why"] = "" if errors[0] <= TOLERANCE else f"relative error {errors[0]:.2e}"
            print(f"{library} {name}: {row['result']}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'library':<30} {'model':<28} {'parameters':>12} {'import s':>9}  result")
    for row in rows:
        parameters = f"{row['parameters']:,}" if row["parameters"] is not None else ""
        seconds = f"{row['import_s']:.2f}" if row["import_s"] is not None else ""
        why = f": {row['why']}" if row["why"] else ""
        print(f"{row['library']:<30} {row['model']:<28} {parameters:>12} {seconds:>9}  {row['result']}{why}"[:400])
    print()
    libraries = dict.fromkeys(row["library"] for row in rows)
    for library in libraries:
        mine = [row for row in rows if row["library"] == library and row["result"] != "not installed"]
        if not mine:
            print(f"{library}: not installed")
            continue
        exact = sum(row["result"] == "exact" for row in mine)
        slowest = max((row["import_s"] for row in mine if row["import_s"] is not None), default=math.nan)
        print(f"{library}: {exact} of {len(mine)} exact, {sum(row['result'] == 'refused' for row in mine)} refused, "
              f"{sum(row['result'] in ('differs', 'error', 'not built') for row in mine)} differing or failing; "
              f"the slowest import {slowest:.1f} s")


if __name__ == "__main__":
    main()
