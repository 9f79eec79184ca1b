"""Predicted against measured iteration time: the cost model's error on the plans that can run here.

For each model and rank count K: profile the tile shapes with K ranks at once (``spmdcnn profile``), find the
optimal plan (``spmdcnn plan``; on several ranks ``mpiexec -n K spmdcnn plan --trials 4``, which times the model's
4 best plans there and keeps the fastest measured), once for each gradient overlap setting (``--no-overlap`` is the
job's, and the planner plans for it), then for the data, owt and optimal plans compare ``spmdcnn simulate``'s
predicted iteration with the mean iteration ``spmdcnn bench`` measures under ``mpiexec -n K`` (the mean, as a
run's logged step time and its images/s are: the cost model predicts it). Each measurement times at least
``--seconds`` of steps (``--steps`` or, for a short step, as many as its prediction says fill that time: ten steps
of a 10 ms step are one scheduler hiccup from a 10 % error). Every pair of numbers is printed, then the median and
largest absolute error.

With ``--rounds R`` the whole set is measured R times in turn, the plans in reverse order every other round. Each
round but the first starts each model and rank count by measuring its reference iteration and wait again (the tile
times stay cached), so each prediction rests on a profile taken shortly before the runs it predicts (a shared
machine drifts by more than the model's error within minutes). The optimal plans are found once, from the first
profiles, so every round predicts and measures the same plans; when the planner's plan equals one of the named
plans layer for layer, it is measured once, as both (two measurements of one plan differ by this VM's noise, not by
the planner's choice). A pair's error is the median over the rounds of predicted / measured - 1; the table after
the rounds shows it next to the median predicted and the median measured time (which need not give that error).
Where the planner's plan did not measure fastest, it and the fastest then run head to head, ``--pairs`` times one
after the other (the order swapped each time), and the median ratio of their steps is printed: two plans a few per
cent apart, measured minutes apart, differ as much by when they ran.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/cost_model.py \\
        --models models/cifar_cnn.yaml:64 benchmarks/models/alexnet_reduced.yaml:32 --ranks 1 2 4
"""

import argparse
import json
import math
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
    parser.add_argument("--steps", type=int, default=10, help="timed steps of each measurement, at least")
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="timed seconds of each measurement, at least, in steps of the predicted time (default 2)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="times the whole set is measured, in turn")
    parser.add_argument("--overlap", nargs="+", default=["on"], choices=["on", "off"],
                        help="gradient allreduces overlapped with backward (sync.overlap), off, or both")
    parser.add_argument("--trials", type=int, default=4, help="the optimal plan from `spmdcnn plan --trials K` on "
                        "the ranks (the model's K best timed; default 4, as plan: auto; 0: the model's choice alone)")
    parser.add_argument("--pairs", type=int, default=4, help="where the planner's plan did not measure fastest: "
                        "that many alternating runs of it and the fastest, head to head (default 4; 0: none)")
    parser.add_argument("--json", help="write every pair of numbers here")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="spmdcnn-cost-")
    cases = []
    for spec in args.models:
        model, batch = spec.rsplit(":", 1)
        name = os.path.splitext(os.path.basename(model))[0]
        for ranks in args.ranks:
            profile = os.path.join(work, f"profile-{name}-{ranks}.json")
            run(["profile", model, "--batch", batch, "--devices", str(ranks), "-o", profile, "--machine",
                 args.machine], ranks)
            trials = ["--trials", str(args.trials)] if ranks > 1 and args.trials > 1 else []
            optimal, same = {}, {}
            for overlap in args.overlap:        # the planner plans for the job's sync: one plan for each
                optimal[overlap] = os.path.join(work, f"optimal-{name}-{ranks}-{overlap}.yaml")
                said = run(["plan", model, "--devices", str(ranks), "--batch", batch, "--machine", args.machine,
                            "--profile", profile, "-o", optimal[overlap], *trials, *_sync(overlap)],
                           ranks if trials else 1)
                for line in said.splitlines():     # the trials: what the planner's choice rests on
                    if line.startswith("plan auto: chose") or line.startswith("  ") and "predicted" in line:
                        print(f"  {name} on {ranks} ranks, overlap {overlap}: {line.strip()}", flush=True)
                same[overlap] = _same_as(model, int(batch), ranks, optimal[overlap],
                                         [p for p in args.plans if p != "optimal"])
                if same[overlap]:
                    print(f"{name} on {ranks} ranks, overlap {overlap}: the planner's plan is the {same[overlap]} "
                          "plan; measured once, as both", flush=True)
            cases.append((model, name, batch, ranks, profile, optimal, same))
    pairs = {}
    for round_ in range(args.rounds):
        for model, name, batch, ranks, profile, optimal, same in cases:
            if round_:
                _forget_reference(profile)
                run(["profile", model, "--batch", batch, "--devices", str(ranks), "-o", profile, "--machine",
                 args.machine], ranks)
            runs = [(p, o) for p in (args.plans if ranks > 1 else ["data"]) for o in args.overlap]
            if round_ % 2:      # the machine's speed drifts within a round: the plans alternate their turns
                runs = runs[::-1]
            for plan, overlap in sorted(runs, key=lambda r: r[0] == "optimal" and bool(same[r[1]])):
                if plan == "optimal" and same[overlap]:
                    copy = same[overlap] if len(args.overlap) == 1 else f"{same[overlap]}/{overlap}"
                    label = plan if len(args.overlap) == 1 else f"{plan}/{overlap}"
                    pairs.setdefault((name, ranks, label), []).append({**pairs[name, ranks, copy][-1], "plan": label,
                                                                      "copy_of": copy})
                    continue
                spec_plan = optimal[overlap] if plan == "optimal" else plan
                sync = _sync(overlap)
                # the predicted time sets the steps: at least --seconds of them
                predicted = json.loads(run(["simulate", spec_plan, "--model", model, "--devices", str(ranks),
                                            "--batch", batch, "--machine", args.machine, "--profile", profile,
                                            "--json", *sync], 1))[0]["predicted"]
                steps = max(args.steps, min(1000, math.ceil(args.seconds / max(predicted["iteration_s"], 1e-6))))
                measured = _bench(model, batch, spec_plan, ranks, steps, args.warmup, sync)
                plan = plan if len(args.overlap) == 1 else f"{plan}/{overlap}"
                row = {"model": name, "batch": int(batch), "ranks": ranks, "plan": plan, "round": round_,
                       "steps": steps,
                       "predicted_ms": predicted["iteration_s"] * 1e3, "measured_ms": measured["step_s_mean"] * 1e3,
                       "error": predicted["iteration_s"] / measured["step_s_mean"] - 1,
                       "predicted_parts_ms": [predicted[k] * 1e3 for k in ("compute_s", "transfer_s", "sync_s")],
                       "measured_parts_ms": [measured[k] * 1e3 for k in ("compute_s", "transfer_s", "sync_s")]}
                pairs.setdefault((name, ranks, plan), []).append(row)
                print(f"round {round_ + 1}  {name:<16} {ranks} ranks {plan:<8} predicted {row['predicted_ms']:8.1f} ms"
                      f"  measured {row['measured_ms']:8.1f} ms  error {row['error'] * 100:+6.1f}%   (compute/"
                      f"transfer/sync predicted {'/'.join(f'{v:.0f}' for v in row['predicted_parts_ms'])}, "
                      f"measured {'/'.join(f'{v:.0f}' for v in row['measured_parts_ms'])} ms)", flush=True)
    errors = {key: statistics.median(r["error"] for r in rows) for key, rows in pairs.items()}
    counted = [error for key, error in errors.items() if "copy_of" not in pairs[key][0]]     # copies once
    print(f"\n{'model':<16} {'ranks':>5} {'plan':<8} {'predicted ms':>14} {'measured ms':>14} {'error':>7}"
          f"   (each a median over {args.rounds} round{'s' * (args.rounds != 1)})")
    for (name, ranks, plan), rows in pairs.items():
        print(f"{name:<16} {ranks:>5} {plan:<8} {statistics.median(r['predicted_ms'] for r in rows):>14.1f} "
              f"{statistics.median(r['measured_ms'] for r in rows):>14.1f} {errors[name, ranks, plan] * 100:>+6.1f}%")
    size = [abs(e) for e in counted]
    print(f"\n{len(size)} pairs: median |error| {statistics.median(size) * 100:.1f}%, largest {max(size) * 100:.1f}%")
    if args.json:           # before the head-to-head runs, which may fail
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump([row for rows in pairs.values() for row in rows], handle, indent=1)
    for name, ranks in dict.fromkeys((n, r) for n, r, _ in pairs):
        for mode in ([""] if len(args.overlap) == 1 else [f"/{o}" for o in args.overlap]):
            # the overlap is the job's, not the planner's: the plans compared run under the same
            measured = {plan: statistics.median(r["measured_ms"] for r in rows)
                        for (n, r, plan), rows in pairs.items() if (n, r) == (name, ranks) and plan.endswith(mode)}
            if f"optimal{mode}" in measured and ranks > 1:
                chosen, fastest = measured[f"optimal{mode}"], min(measured, key=measured.get)
                print(f"{name} on {ranks} ranks: the planner's plan{mode} measured {chosen:.1f} ms, the fastest "
                      f"({fastest}) {measured[fastest]:.1f} ms: {chosen / measured[fastest] - 1:+.1%}", flush=True)
                overlap, rival = mode[1:] or args.overlap[0], fastest[:-len(mode)] if mode else fastest
                case = next(c for c in cases if (c[1], c[3]) == (name, ranks))
                if args.pairs and rival not in ("optimal", case[6][overlap]):
                    steps = pairs[name, ranks, f"optimal{mode}"][-1]["steps"]      # as the rounds measured it
                    ratio = _head_to_head(case, overlap, rival, steps, args)
                    print(f"  head to head, {args.pairs} alternating pairs: the planner's plan / {fastest} "
                          f"{ratio:.3f}x (median)", flush=True)
    shutil.rmtree(work, ignore_errors=True)


def _bench(model, batch, plan, ranks, steps, warmup, sync):
    return json.loads(run(["bench", model, "--batch", batch, "--plan", plan, "--steps", str(steps), "--warmup",
                           str(warmup), "--json", *sync], ranks))


def _head_to_head(case, overlap, rival, steps, args):
    """The median over ``args.pairs`` pairs of the planner's plan's mean step over ``rival``'s (a named plan),
    ``steps`` steps each, the two run one after the other, the order swapped each pair: two plans a few per cent
    apart, measured minutes apart on a shared machine, differ by when they ran as much as by what they are."""
    model, _, batch, ranks, _, optimal, _ = case
    sync = _sync(overlap)
    ratios = []
    for pair in range(args.pairs):
        order = [optimal[overlap], rival] if pair % 2 == 0 else [rival, optimal[overlap]]
        taken = {plan: _bench(model, batch, plan, ranks, steps, args.warmup, sync)["step_s_mean"] for plan in order}
        ratios.append(taken[optimal[overlap]] / taken[rival])
    return statistics.median(ratios)


def _sync(overlap):
    return [] if overlap == "on" else ["--no-overlap"]


def _same_as(model, batch, ranks, optimal, plans):
    """The named plan of ``plans`` that the planner's plan file ``optimal`` equals, layer for layer, or None."""
    sys.path.insert(0, ROOT)
    from spmdcnn.graph import load_model
    from spmdcnn.tiling.plan import load_plan
    graph = load_model(os.path.join(ROOT, model))
    found = load_plan(optimal, graph, batch, ranks)
    return next((plan for plan in plans if load_plan(plan, graph, batch, ranks).configs == found.configs), None)


def _forget_reference(path):
    """Drop a profile's reference iterations, so that the next ``spmdcnn profile`` measures them again (the tile
    times stay)."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    data["in_situ"] = {}
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
