"""What the stall watchdog costs a training step (docs/architecture.md#when-a-rank-stalls).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/watchdog_overhead.py

Two parts. The board (each rank's place, written by its main thread: a few assignments per layer) is always
written: its cost per step is the number of places a step writes times the time of one, both measured here on one
process. The watchdog's thread (a small message to the monitors every second, and on the monitors the judging)
runs only with the watchdog on: ``spmdcnn bench`` under ``mpiexec -n RANKS`` with ``--watchdog auto`` and with
``--watchdog off``, alternating, and the ratio of their mean steps, median over the rounds.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import timeit

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def board_cost(model, batch):
    """``(places written in one step, seconds per place)`` on one process."""
    from spmdcnn.comm.watchdog import Board
    from spmdcnn.graph import load_model
    from spmdcnn.runtime.executor import Executor
    graph = load_model(model)
    executor = Executor(graph, np, np.float32, seed=0)
    counted = []
    board = executor.world.board
    for name in ("at", "note", "stage"):
        method = getattr(board, name)
        setattr(board, name, lambda *args, _method=method, **keys: (counted.append(1), _method(*args, **keys)))
    rng = np.random.default_rng(0)
    executor.forward(rng.standard_normal((batch,) + graph.input_shape).astype(np.float32),
                     rng.integers(0, graph.num_classes, batch), step=0)
    executor.backward()
    plain = Board()
    seconds = min(timeit.repeat(lambda: (plain.at("forward", "conv1", "its input exchange"), plain.note("computing")),
                                number=20000, repeat=5)) / 40000
    return len(counted) + 1, seconds        # and the trainer's stage of the step


def bench(ranks, model, batch, steps, setting):
    command = [shutil.which("mpiexec"), "-n", str(ranks), sys.executable, "-m", "spmdcnn.cli", "bench", model,
               "--batch", str(batch), "--steps", str(steps), "--warmup", "3", "--plan", "data", "--json",
               "--watchdog", setting]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if result.returncode:
        raise SystemExit(f"failed: {' '.join(command)}\n{result.stdout}\n{result.stderr}")
    return json.loads(result.stdout[result.stdout.index("{"):])["step_s_mean"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/small_resnet.yaml")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200, help="timed steps per bench (a few seconds: several beats)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    places, seconds = board_cost(os.path.join(ROOT, args.model), args.batch)
    on, off, ratios = [], [], []
    for index in range(args.rounds):
        order = ("auto", "off") if index % 2 == 0 else ("off", "auto")
        got = {setting: bench(args.ranks, args.model, args.batch, args.steps, setting) for setting in order}
        on.append(got["auto"])
        off.append(got["off"])
        ratios.append(got["auto"] / got["off"])
        print(f"round {index + 1}: watchdog on {got['auto'] * 1e3:.2f} ms/step, off {got['off'] * 1e3:.2f} "
              f"({ratios[-1]:.3f}x)", flush=True)
    step = statistics.median(off)
    print(f"{args.model}, batch {args.batch}: the board takes {places} places a step at {seconds * 1e9:.0f} ns "
          f"each: {places * seconds * 1e6:.1f} us a step ({places * seconds / step:.4%} of the {step * 1e3:.2f} ms "
          "step)")
    print(f"{args.ranks} ranks, watchdog on against off (its thread): {statistics.median(ratios):.3f}x the step "
          f"(median over {args.rounds} rounds; min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
