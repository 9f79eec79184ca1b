"""Predicted against measured iteration time: the cost model's error on the plans that can run here.

For each model and rank count K: profile the tile shapes with K ranks at once (``spmdcnn profile``), find the
optimal plan (``spmdcnn plan``), then for the data, owt and optimal plans compare ``spmdcnn simulate``'s
predicted iteration with the median iteration ``spmdcnn bench`` measures under ``mpiexec -n K``. Every pair of
numbers is printed, then the median and largest absolute error.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/cost_model.py \\
        --models models/cifar_cnn.yaml:64 benchmarks/models/alexnet_reduced.yaml:32 --ranks 1 2 4
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(command, ranks):
    prefix = [] if ranks == 1 else [shutil.which("mpiexec"), "-n", str(ranks)]
    result = subprocess.run(prefix + [sys.executable, "-m", "spmdcnn.cli"] + command, cwd=ROOT, text=True,
                            capture_output=True, timeout=3600)
    if result.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{result.stdout}\n{result.stderr}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["models/cifar_cnn.yaml:64",
                                                        "benchmarks/models/alexnet_reduced.yaml:32"],
                        help="MODEL.yaml:BATCH")
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--plans", nargs="+", default=["data", "owt", "optimal"])
    parser.add_argument("--machine", default="jobs/machines/local.yaml")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="bench runs per plan (the median is kept)")
    parser.add_argument("--json", help="write every pair of numbers here")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="spmdcnn-cost-")
    rows = []
    for spec in args.models:
        model, batch = spec.rsplit(":", 1)
        name = os.path.splitext(os.path.basename(model))[0]
        for ranks in args.ranks:
            profile = os.path.join(work, f"profile-{name}-{ranks}.json")
            run(["profile", model, "--batch", batch, "--devices", str(ranks), "-o", profile], ranks)
            optimal = os.path.join(work, f"optimal-{name}-{ranks}.yaml")
            run(["plan", model, "--devices", str(ranks), "--batch", batch, "--machine", args.machine,
                 "--profile", profile, "-o", optimal], 1)
            for plan in (args.plans if ranks > 1 else ["data"]):
                spec_plan = optimal if plan == "optimal" else plan
                predicted = json.loads(run(["simulate", spec_plan, "--model", model, "--devices", str(ranks),
                                            "--batch", batch, "--machine", args.machine, "--profile", profile,
                                            "--json"], 1))[0]["predicted"]
                measured = [json.loads(run(["bench", model, "--batch", batch, "--plan", spec_plan, "--steps",
                                            str(args.steps), "--warmup", str(args.warmup), "--json"], ranks))
                            for _ in range(args.rounds)]
                step = statistics.median(m["step_s_median"] for m in measured)
                best = measured[0]
                row = {"model": name, "batch": int(batch), "ranks": ranks, "plan": plan,
                       "predicted_ms": predicted["iteration_s"] * 1e3, "measured_ms": step * 1e3,
                       "error": predicted["iteration_s"] / step - 1,
                       "predicted_parts_ms": [predicted[k] * 1e3 for k in ("compute_s", "transfer_s", "sync_s")],
                       "measured_parts_ms": [best[k] * 1e3 for k in ("compute_s", "transfer_s", "sync_s")]}
                rows.append(row)
                print(f"{name:<16} {ranks} ranks {plan:<8} predicted {row['predicted_ms']:8.1f} ms  measured "
                      f"{row['measured_ms']:8.1f} ms  error {row['error'] * 100:+6.1f}%   (compute/transfer/sync "
                      f"predicted {'/'.join(f'{v:.0f}' for v in row['predicted_parts_ms'])}, measured "
                      f"{'/'.join(f'{v:.0f}' for v in row['measured_parts_ms'])} ms)", flush=True)
    errors = [abs(r["error"]) for r in rows]
    print(f"\n{len(rows)} pairs: median |error| {statistics.median(errors) * 100:.1f}%, largest "
          f"{max(errors) * 100:.1f}%")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
