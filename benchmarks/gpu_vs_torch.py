"""spmdcnn on one GPU against PyTorch on the same GPU: images/s per model and precision, and their ratio.

    python benchmarks/gpu_vs_torch.py [--models alexnet vgg16 inception_v3] [--precisions fp32 bf16] [--json FILE]

Each cell times whole training iterations (forward, backward, SGD with momentum 0.9 and weight decay 5e-4) on
one synthetic batch after a warm-up, with the GPU synchronized before the clock is read:
- PyTorch: the torchvision model (Inception-v3 without its auxiliary head, as spmdcnn's model has none), fp32
  with PyTorch's defaults (cuDNN convolutions may use TF32, matmuls do not), bf16 as autocast in channels_last;
- spmdcnn: ``spmdcnn.runtime.bench.bench`` on CuPy, plan ``data`` on one rank, fp32 with TF32 as PyTorch's
  convolutions (``--without-tf32`` adds full fp32) and bfloat16 (float32 master weights).
AlexNet runs at batch 128, VGG-16 and Inception-v3 at batch 64 (issue 6), the sizes of ``../shared/DEVICE.md``'s
PyTorch numbers. The target is spmdcnn >= 0.9x PyTorch in every cell.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BATCH = {"alexnet": 128, "vgg16": 64, "inception_v3": 64}
SIZE = {"alexnet": 224, "vgg16": 224, "inception_v3": 299}


def torch_images_per_s(name, batch, precision, steps, warmup):
    import torch
    import torchvision
    torch.backends.cudnn.benchmark = True
    kwargs = {"aux_logits": False, "init_weights": False} if name == "inception_v3" else {}
    model = getattr(torchvision.models, name)(num_classes=1000, **kwargs).cuda()
    images = torch.randn(batch, 3, SIZE[name], SIZE[name], device="cuda")
    labels = torch.randint(0, 1000, (batch,), device="cuda")
    if precision == "bf16":
        model = model.to(memory_format=torch.channels_last)
        images = images.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
    times = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return batch / statistics.median(times)


def spmdcnn_images_per_s(name, batch, dtype, tf32, steps, warmup):
    """``(images/s, {"graph layout": calls})``: the convolutions' paths (cuDNN in NCHW or NHWC, or im2col)."""
    import cupy
    from spmdcnn.ops.cuda import conv
    from spmdcnn.runtime.bench import bench
    conv.paths.clear()
    result = bench(os.path.join(ROOT, "models", f"{name}.yaml"), batch, steps=steps, warmup=warmup, dtype=dtype,
                   backend_name="cupy", plan="data", tf32=tf32)
    cupy.get_default_memory_pool().free_all_blocks()
    return batch / result["step_s_median"], {" ".join(k): v for k, v in sorted(conv.paths.items())}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(BATCH), choices=list(BATCH))
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", help="also write the rows as JSON here")
    parser.add_argument("--without-tf32", action="store_true",
                        help="also time spmdcnn's fp32 without TF32 (PyTorch's fp32 convolutions use it)")
    args = parser.parse_args()
    rows = []
    for name in args.models:
        batch = BATCH[name]
        for precision in args.precisions:
            row = {"model": name, "batch": batch, "precision": precision}
            try:
                row["pytorch"] = torch_images_per_s(name, batch, precision, args.steps, args.warmup)
                import torch
                torch.cuda.empty_cache()            # the model is gone: its memory goes back for spmdcnn's run
            except Exception as error:              # report the cell, go on with the others
                row["pytorch_error"] = f"{type(error).__name__}: {error}"
            variants = [("spmdcnn", "float32", True)] + ([("spmdcnn_no_tf32", "float32", False)]
                                                         if args.without_tf32 else []) \
                if precision == "fp32" else [("spmdcnn", "bfloat16", False)]
            for key, dtype, tf32 in variants:
                try:
                    row[key], row[f"{key}_convolutions"] = spmdcnn_images_per_s(name, batch, dtype, tf32,
                                                                                args.steps, args.warmup)
                except Exception as error:
                    row[f"{key}_error"] = f"{type(error).__name__}: {error}"
            if "pytorch" in row and "spmdcnn" in row:
                row["ratio"] = row["spmdcnn"] / row["pytorch"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| model | batch | precision | PyTorch images/s | spmdcnn images/s | ratio |")
    print("|---|---:|---|---:|---:|---:|")
    for row in rows:
        cells = [f"{row[k]:.0f}" if k in row else "error" for k in ("pytorch", "spmdcnn")]
        ratio = f"{row['ratio']:.2f}x" if "ratio" in row else "-"
        print(f"| {row['model']} | {row['batch']} | {row['precision']} | {cells[0]} | {cells[1]} | {ratio} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(rows, out, indent=1)
    return 0 if all(row.get("ratio", 0) >= 0.9 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
