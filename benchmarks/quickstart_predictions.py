"""Fresh quick starts: the plan they choose, and their predicted against their measured step.

Each run is the README's quick start (``mpiexec -n K spmdcnn train jobs/quickstart.yaml``) with an empty profile
cache (``SPMDCNN_CACHE``), so it profiles the ranks, searches, runs its trials and trains the 440 steps anew; the
rank counts alternate from run to run. For each run: the plan it trained under (from its checkpoint), the step it
predicted (the metrics' ``predicted_step_s``: the plan's iteration and reading its batch) and the median of the
measured steps it logged (``step_s``, one per epoch), and their ratio. Per rank count: in how many runs the plan was
the same, and the largest |error|. Each run also says how far its own epochs' steps wandered ((slowest - fastest)
/ median): a quiet machine's quick starts mostly stay within about 25 %; a prediction is made before the run and cannot know of
a neighbour that takes the cores for seconds at a time during it.

With ``--load``, a busy process pinned to core 0 (``taskset``) runs throughout, and each run is followed by the
same quick start under data parallelism (``--set plan=data``, trials off), to compare the chosen plan's measured
step with data parallelism's under the same load.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/quickstart_predictions.py --ranks 4 2 --runs 5
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/quickstart_predictions.py --ranks 2 --runs 3 --load
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUSY = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"


def quick_start(ranks, work, name, data, *sets):
    """``(plan text, predicted step, median measured step, chosen line, how far its epochs wandered)`` of one
    fresh quick start, its digits in the folder ``data``."""
    folder = os.path.join(work, name)
    os.makedirs(folder)
    overrides = [f"checkpoint.path={folder}/q.h5", f"log.metrics={folder}/q.jsonl", "resume=false",
                 f"data.path={data}/train.h5", f"data.val={data}/val.h5", *sets]
    command = [shutil.which("mpiexec"), "-n", str(ranks), sys.executable, "-m", "spmdcnn.cli", "train",
               "jobs/quickstart.yaml"] + [x for o in overrides for x in ("--set", o)]
    result = subprocess.run(command, cwd=ROOT, env={**os.environ, "SPMDCNN_CACHE": os.path.join(folder, "cache")},
                            capture_output=True, text=True, timeout=1200)
    with open(os.path.join(folder, "log.txt"), "w", encoding="utf-8") as log:       # what the run printed
        log.write(result.stdout + result.stderr)
    if result.returncode:
        raise SystemExit(f"failed: {' '.join(command)}\n{result.stdout}\n{result.stderr}")
    records = [json.loads(line) for line in open(os.path.join(folder, "q.jsonl"), encoding="utf-8")]
    steps = [r["step_s"] for r in records if r.get("step_s")]
    with h5py.File(os.path.join(folder, "q.h5"), "r") as handle:
        plan = handle.attrs["plan"]
    chosen = next((line for line in result.stdout.splitlines() if line.startswith("plan auto: chose")), "")
    return plan, records[-1]["predicted_step_s"], statistics.median(steps), chosen, _steadiness(steps)


def _steadiness(steps):
    """How far the run's own epochs' steps wandered: (slowest - fastest) / median. A quiet machine's quick start
    mostly keeps it within about 25 %; well beyond, something else took the cores or the memory bandwidth for
    seconds at a time during the run (a prediction made before it cannot know)."""
    return (max(steps) - min(steps)) / statistics.median(steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", nargs="+", type=int, default=[4, 2])
    parser.add_argument("--runs", type=int, default=5, help="fresh quick starts per rank count")
    parser.add_argument("--load", action="store_true", help="a busy process on core 0 throughout; each run "
                        "followed by data parallelism's")
    parser.add_argument("--data", default="data/digits", help="where the digits are, or are written the first time "
                        "(default data/digits, the quick start's)")
    parser.add_argument("--json", help="write every run here")
    parser.add_argument("--keep", metavar="DIR", help="keep every run's folder here (its log.txt: what the run "
                        "printed, the profile lines among it; its metrics, checkpoint and profile cache), to look "
                        "into a prediction that missed; default: a temporary folder, removed")
    args = parser.parse_args()
    if args.keep:
        os.makedirs(args.keep, exist_ok=False)
    work = args.keep or tempfile.mkdtemp(prefix="spmdcnn-quickstarts-")
    busy = subprocess.Popen([sys.executable, "-c", BUSY]) if args.load else None
    found = {ranks: [] for ranks in args.ranks}
    try:
        for run in range(args.runs):
            for ranks in args.ranks:
                plan, predicted, measured, chosen, wandered = quick_start(ranks, work, f"{ranks}-{run}", args.data)
                entry = {"ranks": ranks, "plan": plan, "predicted_s": predicted, "measured_s": measured,
                         "error": predicted / measured - 1, "chosen": chosen, "epochs_wandered": wandered}
                if args.load:
                    data_plan, _, data_s, _, _ = quick_start(ranks, work, f"{ranks}-{run}-data", args.data,
                                                             "plan=data", "trials.plans=0")
                    entry["data_measured_s"] = data_s
                    entry["chose_data"] = plan == data_plan
                found[ranks].append(entry)
                extra = (f", data parallelism {data_s * 1e3:.2f} ms ({measured / data_s:.3f}x"
                         f"{'; the same plan, so two runs of one plan' if entry['chose_data'] else ''})"
                         if args.load else "")
                print(f"{ranks} ranks, run {run + 1}: predicted {predicted * 1e3:.2f} ms, measured {measured * 1e3:.2f}"
                      f" ms ({100 * entry['error']:+.1f} %; its epochs' steps wandered {100 * wandered:.0f} %){extra}; "
                      f"{chosen or 'no trials'}", flush=True)
    finally:
        if busy is not None:
            busy.kill()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    for ranks, entries in found.items():
        plans = Counter(e["plan"] for e in entries)
        worst = max(abs(e["error"]) for e in entries)
        line = (f"{ranks} ranks: the same plan in {plans.most_common(1)[0][1]} of {len(entries)} runs; largest "
                f"|predicted / measured - 1| {100 * worst:.1f} %, median {100 * statistics.median(abs(e['error']) for e in entries):.1f} %")
        if args.load:
            ratios = [e["measured_s"] / e["data_measured_s"] for e in entries]
            line += (f"; the chosen plan's step against data parallelism's under the load: median "
                     f"{statistics.median(ratios):.3f}x, largest {max(ratios):.3f}x")
            others = [r for r, e in zip(ratios, entries) if not e["chose_data"]]
            line += (f"; {len(entries) - len(others)} of {len(entries)} runs chose data parallelism itself (their "
                     f"ratios are two runs of one plan under the load: its noise)")
            if others:
                line += f"; the other runs' largest {max(others):.3f}x"
        print(line)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(found, handle, indent=1)


if __name__ == "__main__":
    main()
