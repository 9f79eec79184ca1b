"""How long the planner takes: building the cost tables and running Algorithm 1, per model and device count.

The paper's search took 0.02 s (AlexNet), 0.1 s (VGG-16) and 0.4 s (Inception-v3) on 4 GPUs. Machine: the paper's
4 x 4 P100 (nodes added for 64 devices), compute from the analytic model, batch 32 per device.

    python benchmarks/search_time.py [--devices 4 16 64] [--models alexnet vgg16 inception_v3 resnet50]
"""

import argparse
import os
import statistics
import time

from spmdcnn.graph import load_model
from spmdcnn.planner import Problem, search
from spmdcnn.planner.service import cost_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["alexnet", "vgg16", "inception_v3", "resnet50"])
    parser.add_argument("--devices", nargs="+", type=int, default=[4, 16, 64])
    parser.add_argument("--machine", default=os.path.join(ROOT, "jobs", "machines", "paper-p100-4x4.yaml"))
    parser.add_argument("--rounds", type=int, default=3, help="runs per cell (the median is reported)")
    args = parser.parse_args()
    print(f"{'model':<13} {'devices':>7} {'layers':>6} {'configs':>7} {'kept':>6} {'tables s':>8} {'search s':>8} "
          f"{'total s':>8}  method")
    for name in args.models:
        graph = load_model(os.path.join(ROOT, "models", f"{name}.yaml"))
        for devices in args.devices:
            times = []
            for _ in range(args.rounds):
                # a fresh cost model each round: nothing cached from the previous one
                from spmdcnn.cost import layout
                from spmdcnn.cost.machine import load_machine
                from spmdcnn.cost.tiles import clear_caches
                clear_caches()
                layout.layout_of.cache_clear()
                layout.tile_boxes.cache_clear()
                machine = load_machine(args.machine)
                nodes = max(machine.nodes, -(-devices // machine.devices_per_node))
                cost = cost_model(graph, 32 * devices, devices, machine, None, 4, nodes)
                start = time.perf_counter()
                problem = Problem(graph, devices, cost)
                built = time.perf_counter()
                solution = search.optimize([len(c) for c in problem.choices], problem.node_costs, problem.edges)
                done = time.perf_counter()
                times.append((built - start, done - built, done - start))
            tables, searched, total = (statistics.median(t[i] for t in times) for i in range(3))
            print(f"{name:<13} {devices:>7} {len(problem.nodes):>6} {problem.considered:>7} "
                  f"{solution.kept:>6} "
                  f"{tables:>8.3f} {searched:>8.3f} {total:>8.3f}  {solution.method}"
                  f"{'' if solution.exact else ' (not exact)'}", flush=True)


if __name__ == "__main__":
    main()
