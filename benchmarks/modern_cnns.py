"""Today's CNNs (written by spmdcnn model import from torchvision) planned on the paper's machine and the cluster
machine: what layer-wise plans gain over data parallelism and over "one weird trick", predicted.

    python benchmarks/modern_cnns.py                          # the five imported models, 16 and 64 devices
    python benchmarks/modern_cnns.py --models convnext_tiny --devices 16 --per-device 32

For each model and device count: ``spmdcnn plan --compare --json`` on jobs/machines/paper-p100-4x4.yaml (16 P100s
in 4 nodes, the paper's; an allreduce and overlapped gradient sums, as today's frameworks run) and on
jobs/machines/cluster-4x256-fat-tree.yaml (the paper's machine grown to as many nodes of 4 as the devices need), with
a global batch of ``--per-device`` samples per device (32, as
the paper's runs). It prints the predicted images/s of data parallelism, owt and the planner's plan, the plan's
speed-up, the gradient bytes it sums against data parallelism's, what it splits other than samples, and the
search's time. Every number is a **prediction** of the cost model (the machine file's analytic device model), not a
measurement.
"""

import argparse
import json
import os
import subprocess
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
MODELS = ["efficientnet_b0", "convnext_tiny", "resnext50_32x4d", "regnet_y_400mf", "mobilenet_v3_large"]
MACHINES = {"paper": "jobs/machines/paper-p100-4x4.yaml", "cluster": "jobs/machines/cluster-4x256-fat-tree.yaml"}


def plan(model, machine, devices, batch):
    command = [sys.executable, "-m", "spmdcnn.cli", "plan", os.path.join(ROOT, "models", f"{model}.yaml"),
               "--devices", str(devices), "--batch", str(batch), "--machine", os.path.join(ROOT, machine),
               "--nodes", str(-(-devices // 4)), "--compare", "--json"]       # both machines: 4 devices a node
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def splits(plan_text):
    """How many layers the plan splits over each dimension but samples alone (``c``, ``h``, ``c+n`` ...)."""
    import yaml
    counted = Counter()
    for config in (yaml.safe_load(plan_text).get("layers") or {}).values():
        kinds = "+".join(sorted(k for k, v in config.items() if k != "devices" and v > 1 and k != "n"))
        if kinds:
            counted[kinds] += 1
    return ", ".join(f"{kind} {count}" for kind, count in counted.most_common()) or "samples only"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--machines", nargs="+", default=list(MACHINES), choices=list(MACHINES))
    parser.add_argument("--devices", nargs="+", type=int, default=[16, 64])
    parser.add_argument("--per-device", type=int, default=32, help="samples per device (default 32)")
    args = parser.parse_args()
    print("| model | machine | devices | batch | data img/s | owt img/s | planner img/s | vs data | vs owt | "
          "summed vs data | splits besides n | search s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for model in args.models:
        for machine in args.machines:
            for devices in args.devices:
                batch = devices * args.per_device
                found = plan(model, MACHINES[machine], devices, batch)["plans"]
                rate = {name: batch / entry["predicted"]["iteration_s"] for name, entry in found.items()}
                synced = found["optimal"]["predicted"]["bytes_synced"] / found["data"]["predicted"]["bytes_synced"]
                print(f"| {model} | {machine} | {devices} | {batch} | {rate['data']:.0f} | {rate['owt']:.0f} | "
                      f"{rate['optimal']:.0f} | {rate['optimal'] / rate['data']:.2f}x | "
                      f"{rate['optimal'] / rate['owt']:.2f}x | {synced:.2f} | {splits(found['optimal']['plan'])} | "
                      f"{found['optimal']['search_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
