"""Scaling from 1 to K ranks on this machine, with one BLAS thread per rank: images/s, efficiency and where the
time goes (compute, transfer, sync per rank; bytes moved per iteration).

    python benchmarks/scaling.py models/cifar_cnn.yaml --batch 64 --ranks 2 \\
        --plans data owt benchmarks/plans/cifar_cnn_2_layerwise.yaml

Each round runs, in fresh processes: one rank; K independent one-rank runs at the same time (each on 1/K of the
batch: what the machine gives K processes that never communicate, the ceiling for K ranks); then K ranks under
each plan. The median over rounds is reported. Efficiency is images/s on K ranks over K times one rank's, and
over the K independent runs' total. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from the children's
environment.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "SPMDCNN_NUM_THREADS": "1"}


def environment():
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env.update(ONE_THREAD)
    return env


def bench_command(args, batch, plan=None):
    command = [sys.executable, "-m", "spmdcnn.cli", "bench", args.model, "--batch", str(batch), "--steps",
               str(args.steps), "--warmup", str(args.warmup), "--json"]
    return command + (["--plan", plan] if plan else [])


def run(command, env):
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def independent(args, env):
    """K one-rank runs at once, each on batch/K: their summed images/s."""
    processes = [subprocess.Popen(bench_command(args, args.batch // args.ranks), env=env, stdout=subprocess.PIPE,
                                  text=True) for _ in range(args.ranks)]
    results = [json.loads(p.communicate()[0]) for p in processes]
    return sum(r["images_per_s"] for r in results)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--plans", nargs="+", default=["data", "owt"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    env = environment()
    mpiexec = shutil.which("mpiexec") or sys.exit("needs mpiexec (pip install mpich)")
    one, ceiling, runs = [], [], {plan: [] for plan in args.plans}
    for round_ in range(args.rounds):
        one.append(run(bench_command(args, args.batch), env))
        ceiling.append(independent(args, env))
        for plan in args.plans:
            runs[plan].append(run([mpiexec, "-n", str(args.ranks), *bench_command(args, args.batch, plan)], env))
        print(f"round {round_ + 1}: 1 rank {one[-1]['images_per_s']:.1f}, {args.ranks} independent "
              f"{ceiling[-1]:.1f}, " + ", ".join(f"{p} {runs[p][-1]['images_per_s']:.1f}" for p in args.plans)
              + " images/s", file=sys.stderr)
    base = statistics.median(r["images_per_s"] for r in one)
    top = statistics.median(ceiling)
    summary = {"model": one[0]["model"], "batch": args.batch, "ranks": args.ranks, "rounds": args.rounds,
               "blas": one[0]["blas"], "one_rank_images_per_s": base, "independent_images_per_s": top, "plans": {}}
    for plan, results in runs.items():
        median = statistics.median(r["images_per_s"] for r in results)
        middle = sorted(results, key=lambda r: r["images_per_s"])[len(results) // 2]
        summary["plans"][plan] = {
            "images_per_s": median, "efficiency": median / (args.ranks * base), "of_ceiling": median / top,
            **{k: middle[k] for k in ("step_s_median", "compute_s", "transfer_s", "sync_s", "bytes_transferred",
                                      "bytes_synced")}}
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    blas = ", ".join(f"{b['internal_api']} {b['version']} kernel {b['architecture']}, {b['num_threads']} thread(s)"
                     for b in summary["blas"])
    print(f"{summary['model']}, batch {args.batch}, float32, one BLAS thread per rank ({blas}); median of "
          f"{args.rounds} rounds of {args.steps} steps")
    print(f"  1 rank: {base:.1f} images/s; {args.ranks} independent one-rank runs together: {top:.1f} images/s "
          f"({top / base:.2f}x: the most {args.ranks} processes get from this machine)")
    print(f"  {'plan':<44} {'images/s':>9} {'eff.':>6} {'of ceiling':>10} {'compute':>9} {'transfer':>9} "
          f"{'sync':>8} {'moved':>10} {'synced':>10}")
    for plan, r in summary["plans"].items():
        print(f"  {os.path.basename(plan):<44} {r['images_per_s']:>9.1f} {r['efficiency']:>6.2f} "
              f"{r['of_ceiling']:>10.2f} {r['compute_s'] * 1e3:>7.1f}ms {r['transfer_s'] * 1e3:>7.1f}ms "
              f"{r['sync_s'] * 1e3:>6.1f}ms {r['bytes_transferred'] / 2**20:>6.2f} MiB "
              f"{r['bytes_synced'] / 2**20:>6.2f} MiB")


if __name__ == "__main__":
    main()
