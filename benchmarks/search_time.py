"""How long the planner takes, and how much memory, per model and device count: the whole ``spmdcnn plan``
command (a fresh process: its wall time and peak resident memory) and the search alone (the planner's own time:
node costs, screening, tables, Algorithm 1 and the scoring of the candidates on the timeline), and the command's
start-up (its wall time on a one-layer-per-node plan of one device, less that plan's search).

Machine: the paper's 4 x 4 P100 with nodes added beyond 16 devices (``--machine`` for another, such as
``jobs/machines/cluster-4x256-fat-tree.yaml``), compute from the analytic model, batch 32 per device.
``--reference REV`` also runs the same commands with the planner of git revision REV (checked out in a temporary
folder) and reports both predicted iterations, marking a plan predicted slower than that revision's ("WORSE");
a reference command past ``--timeout`` seconds, or one that fails (an older revision may not read a newer machine
file), is reported as such.

    python benchmarks/search_time.py [--devices 16 64 256 1024] [--models alexnet vgg16 inception_v3 resnet50]
                                     [--rounds 1] [--reference a765257]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER = os.path.join(ROOT, "jobs", "machines", "paper-p100-4x4.yaml")
RUN = """import json, resource, sys
from spmdcnn.cli import main
code = main(sys.argv[1:])
import spmdcnn
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)  # B or KiB
print(json.dumps({"peak": peak, "package": spmdcnn.__file__}), file=sys.stderr)
sys.exit(code)
"""


def plan(model, devices, machine, path=None, timeout=None):
    """``(wall s, peak bytes, the plan JSON)`` of one ``spmdcnn plan`` in a fresh process (``path``: the package's
    folder, for another revision), or None past ``timeout``; a failure ends the run, or with ``path``, returns the
    end of its message."""
    nodes = max(4, -(-devices // 4)) if machine == PAPER else None
    argv = ["plan", os.path.join(ROOT, "models", f"{model}.yaml"), "--devices", str(devices),
            "--batch", str(32 * devices), "--machine", machine, "--profile", "none", "--json"]
    argv += ["--nodes", str(nodes)] if nodes else []
    env = dict(os.environ, PYTHONPATH=path) if path else None
    start = time.perf_counter()
    try:        # python -c puts its folder first on the path: the reference's folder for the reference's package
        done = subprocess.run([sys.executable, "-c", RUN, *argv], capture_output=True, text=True, env=env,
                              timeout=timeout, cwd=path or ROOT)
    except subprocess.TimeoutExpired:
        return None
    wall = time.perf_counter() - start
    if done.returncode:
        if path:
            return done.stderr.strip().splitlines()[-1][-100:]
        raise SystemExit(f"spmdcnn plan {model} on {devices} devices failed:\n{done.stderr[-2000:]}")
    found = json.loads(done.stderr.strip().splitlines()[-1])
    assert found["package"].startswith(path or ROOT), f"ran {found['package']}, not the package in {path or ROOT}"
    return wall, found["peak"], json.loads(done.stdout)["plans"]["optimal"]


def startup(rounds):
    """The command's start-up: the median over ``rounds`` of a one-device plan's wall time less its search."""
    found = []
    for _ in range(rounds):
        wall, _, result = plan("tiny_cnn", 1, PAPER)
        found.append(wall - result["search_s"])
    return statistics.median(found)


def checkout(revision):
    """A temporary folder holding the package of git ``revision``."""
    folder = tempfile.mkdtemp(prefix="spmdcnn-reference-")
    archive = subprocess.run(["git", "-C", ROOT, "archive", revision, "spmdcnn"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
    return folder


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["alexnet", "vgg16", "inception_v3", "resnet50"])
    parser.add_argument("--devices", nargs="+", type=int, default=[16, 64, 256, 1024])
    parser.add_argument("--machine", default=PAPER)
    parser.add_argument("--rounds", type=int, default=1, help="runs per cell (the median is reported)")
    parser.add_argument("--reference", metavar="REV", help="also run the planner of this git revision")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a reference command may take")
    args = parser.parse_args()
    print(f"start-up (interpreter, imports, files, printing): {startup(max(5, args.rounds)):.3f} s", flush=True)
    reference = checkout(args.reference) if args.reference else None
    print("seconds of the planner (search s) in its stages: costs (every configuration's t_c + t_s), screen (lower-"
          "bound tables and pruning), tables (exact, of what is left), alg1 (Algorithm 1: the optimum at each "
          "weighting of the gradient sync), scoring (the candidates on the timeline)")
    print(f"{'model':<13} {'devices':>7} {'configs':>7} {'kept':>6} {'costs':>6} {'screen':>6} {'tables':>6} "
          f"{'alg1':>6} {'scoring':>7} {'search s':>8} {'command s':>9} {'peak GiB':>8} {'iteration ms':>12}"
          + (f"  {args.reference}: command s, GiB, iteration ms" if reference else ""), flush=True)
    try:
        for model in args.models:
            for devices in args.devices:
                runs = [plan(model, devices, args.machine) for _ in range(args.rounds)]
                wall = statistics.median(r[0] for r in runs)
                peak = max(r[1] for r in runs)
                result = runs[0][2]
                screened = result["screening"]
                kept = screened["after"] if screened else result["configurations"]
                phases = {key: statistics.median(r[2]["phases"].get(key, 0.0) for r in runs)
                          for key in ("costs", "bounds", "screen", "tables", "search", "scoring")}
                line = (f"{model:<13} {devices:>7} {result['configurations']:>7} {kept:>6} {phases['costs']:>6.2f} "
                        f"{phases['bounds'] + phases['screen']:>6.2f} {phases['tables']:>6.2f} "
                        f"{phases['search']:>6.2f} {phases['scoring']:>7.2f} "
                        f"{statistics.median(r[2]['search_s'] for r in runs):>8.2f} {wall:>9.2f} "
                        f"{peak / 2 ** 30:>8.2f} {result['predicted']['iteration_s'] * 1e3:>12.3f}")
                if reference:
                    old = plan(model, devices, args.machine, reference, args.timeout)
                    if old is None:
                        line += f"  over {args.timeout:.0f} s"
                    elif isinstance(old, str):
                        line += f"  failed: {old}"
                    else:
                        before = old[2]["predicted"]["iteration_s"]
                        worse = result["predicted"]["iteration_s"] > before * (1 + 1e-9)
                        line += (f"  {old[0]:.2f} s, {old[1] / 2 ** 30:.2f} GiB, {before * 1e3:.3f} ms"
                                 + ("  WORSE" if worse else ""))
                print(line, flush=True)
    finally:
        if reference:
            shutil.rmtree(reference, ignore_errors=True)


if __name__ == "__main__":
    main()
