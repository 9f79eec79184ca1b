"""spmdcnn against PyTorch CPU on the same network, batch and machine: images/s, ratio and peak memory.

    python benchmarks/vs_pytorch.py models/alexnet.yaml --batch 32 --steps 5 --rounds 3

Each round runs ``spmdcnn bench --json`` and ``benchmarks/torch_bench.py`` in fresh processes, one after the
other (so each peak memory is that framework's alone, and slow phases of a shared machine hit both); the
median over rounds is reported. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, which this workplace sets for old
OpenBLAS builds and which slow NumPy's BLAS, are removed from the children's environment; the BLAS kernel that
ran is printed (threadpoolctl).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(command, env):
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=os.path.join(HERE, "..", "models", "alexnet.yaml"))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--torch-malloc", choices=["system", "spmdcnn"], default="system",
                        help="PyTorch's malloc: the C library's defaults, as PyTorch users run it (default), or "
                             "spmdcnn's settings (freed memory kept for the next arrays)")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    common = [args.model, "--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    ours, theirs = [], []
    for round_ in range(args.rounds):
        ours.append(run([sys.executable, "-m", "spmdcnn.cli", "bench", *common, "--json"], env))
        # PyTorch with the C library's malloc as its users have it, or with --torch-malloc spmdcnn as the spmdcnn
        # command sets it (spmdcnn.keep_freed_memory)
        theirs.append(run([sys.executable, os.path.join(HERE, "torch_bench.py"), *common],
                          {**env, "SPMDCNN_MALLOC": args.torch_malloc}))
        print(f"round {round_ + 1}: spmdcnn {ours[-1]['images_per_s']:.2f} images/s, "
              f"pytorch {theirs[-1]['images_per_s']:.2f} images/s", file=sys.stderr)
    summary = {
        "model": ours[0]["model"], "batch": args.batch, "steps": args.steps, "rounds": args.rounds,
        "spmdcnn_images_per_s": statistics.median(r["images_per_s"] for r in ours),
        "pytorch_images_per_s": statistics.median(r["images_per_s"] for r in theirs),
        "spmdcnn_peak_memory_mib": max(r["peak_memory_bytes"] for r in ours) / 2**20,
        "pytorch_peak_memory_mib": max(r["peak_memory_bytes"] for r in theirs) / 2**20,
        "blas": ours[0]["blas"], "torch": theirs[0]["torch"], "threads": theirs[0]["threads"],
    }
    summary["ratio"] = summary["spmdcnn_images_per_s"] / summary["pytorch_images_per_s"]
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    blas = ", ".join(f"{b['internal_api']} {b['version']} kernel {b['architecture']}, {b['num_threads']} threads"
                     for b in summary["blas"])
    print(f"{summary['model']}, batch {args.batch}, float32, median of {args.rounds} rounds of {args.steps} steps")
    print(f"  spmdcnn : {summary['spmdcnn_images_per_s']:8.2f} images/s   peak memory "
          f"{summary['spmdcnn_peak_memory_mib']:7.0f} MiB   (NumPy BLAS: {blas})")
    print(f"  pytorch : {summary['pytorch_images_per_s']:8.2f} images/s   peak memory "
          f"{summary['pytorch_peak_memory_mib']:7.0f} MiB   (torch {summary['torch']}, {summary['threads']} threads)")
    print(f"  ratio   : {summary['ratio']:.2f}x PyTorch's images/s")


if __name__ == "__main__":
    main()
