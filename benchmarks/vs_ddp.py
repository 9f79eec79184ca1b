"""spmdcnn on K ranks against PyTorch DistributedDataParallel on K processes, the system a user would pick instead.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/vs_ddp.py --rounds 3 \\
        --runs alexnet:32 resnet50:16

Both train the same network (the spmdcnn model YAML; PyTorch runs it as tests/torch_reference.py's TorchNet, the
torchvision layer layout with the same shapes and initial weights) at the same global batch on one fixed synthetic
batch, with SGD (momentum 0.9, weight decay 5e-4), on the same cores split the same way: K processes of
cores / K threads each.

- PyTorch: ``torch.distributed`` with gloo, K processes (``torch.multiprocessing``), each on batch / K, wrapped in
  DistributedDataParallel (25 MiB buckets, allreduce overlapped with backward); batch norm per process, as DDP
  computes it without SyncBatchNorm.
- spmdcnn: ``mpiexec -n K spmdcnn bench --plan auto`` with ``batchnorm: global`` (statistics over the whole
  batch, which DDP does not compute) and with ``batchnorm: {group: B/K}`` (per group of a process's share of
  samples: like for like with DDP), and ``--plan data`` with the same groups.

The two alternate in fresh processes, ``--rounds`` times; medians of images/s and the ratio spmdcnn / DDP are
printed. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from the children's environment. ``--torch-malloc
spmdcnn`` gives the DDP processes the malloc settings the spmdcnn command sets (``spmdcnn.keep_freed_memory``).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = os.path.join(ROOT, "models")


def environment(threads):
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env.update({"OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
                "MKL_NUM_THREADS": str(threads), "SPMDCNN_NUM_THREADS": str(threads)})
    return env


def spmdcnn(model, batch, ranks, steps, warmup, plan, group, env):
    command = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "spmdcnn.cli", "bench",
               os.path.join(MODELS, f"{model}.yaml"), "--batch", str(batch), "--steps", str(steps), "--warmup",
               str(warmup), "--plan", plan, "--json"] + (["--batchnorm-group", str(group)] if group else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, timeout=7200)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
    lines = done.stdout.splitlines()         # plan auto may report its profiling first
    return json.loads("\n".join(lines[lines.index("{"):]))


def ddp(model, batch, ranks, steps, warmup, env):
    command = [sys.executable, __file__, "--ddp-worker", model, str(batch), str(ranks), str(steps), str(warmup)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, timeout=7200)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ddp_process(rank, model, batch, ranks, steps, warmup, port, results):
    if os.environ.get("SPMDCNN_MALLOC") == "spmdcnn":      # --torch-malloc spmdcnn: as the spmdcnn command sets it
        import spmdcnn
        spmdcnn.keep_freed_memory()
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from torch_reference import TorchNet
    from spmdcnn.graph import load_model
    from spmdcnn.io.synthetic import SyntheticData
    from spmdcnn.runtime.executor import Executor
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    graph = load_model(os.path.join(MODELS, f"{model}.yaml"))
    executor = Executor(graph, np, np.float32)
    net = TorchNet(graph, dict(executor.params.items()), dict(executor.buffers.items()), dtype=torch.float32)
    del executor
    net.train()
    wrapped = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=25)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)
    share = batch // ranks
    images, labels = SyntheticData.for_model(graph, batch).batch(0, 0, batch)
    mine = slice(rank * share, (rank + 1) * share)          # this process's share of spmdcnn's global batch
    images, labels = torch.from_numpy(images[mine].copy()), torch.from_numpy(labels[mine].copy())
    times = []
    for step in range(warmup + steps):
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss, _ = wrapped(images, labels, step)
        loss.backward()
        optimizer.step()
        dist.barrier()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    if rank == 0:
        results.put({"images_per_s": batch * steps / sum(times), "step_s_median": statistics.median(times),
                     "torch": torch.__version__, "threads": torch.get_num_threads()})
    dist.destroy_process_group()


def ddp_worker(model, batch, ranks, steps, warmup):
    import torch.multiprocessing as mp
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    processes = [context.Process(target=_ddp_process, args=(rank, model, batch, ranks, steps, warmup, port,
                                                             results)) for rank in range(ranks)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
        if p.exitcode:
            sys.exit(f"a DDP process exited with {p.exitcode}")
    print(json.dumps(results.get()))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--ddp-worker":
        model, batch, ranks, steps, warmup = sys.argv[2], *map(int, sys.argv[3:7])
        return ddp_worker(model, batch, ranks, steps, warmup)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", default=["alexnet:32", "resnet50:16"], metavar="MODEL:BATCH")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--json", help="also write every run's result here")
    parser.add_argument("--torch-malloc", choices=["system", "spmdcnn"], default="system",
                        help="DDP's malloc: the C library's defaults, as PyTorch users run it (default), or "
                             "spmdcnn's settings (freed memory kept for the next arrays)")
    args = parser.parse_args()
    env = environment(max(args.cores // args.ranks, 1))
    everything = {}
    for spec in args.runs:
        model, batch = spec.split(":")
        batch = int(batch)
        group = batch // args.ranks
        variants = {"ddp": lambda: ddp(model, batch, args.ranks, args.steps, args.warmup,
                                       {**env, "SPMDCNN_MALLOC": args.torch_malloc})}
        for plan in ("auto", "data"):
            for label, g in (("global", None), (f"group {group}", group)):
                if plan == "data" and g is None:
                    continue
                variants[f"spmdcnn plan {plan}, batchnorm {label}"] = (
                    lambda plan=plan, g=g: spmdcnn(model, batch, args.ranks, args.steps, args.warmup, plan, g, env))
        results = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, run in variants.items():
                results[name].append(run())
        everything[spec] = results
        ddp_rate = statistics.median(r["images_per_s"] for r in results["ddp"])
        print(f"{model} batch {batch} on {args.ranks} processes of {env['OMP_NUM_THREADS']} threads; median of "
              f"{args.rounds} rounds; PyTorch {results['ddp'][0]['torch']}")
        for name, runs in results.items():
            rate = statistics.median(r["images_per_s"] for r in runs)
            extra = ""
            if name != "ddp":
                extra = (f"  sync {statistics.median(r['sync_s'] for r in runs) * 1e3:.0f} ms, exposed "
                         f"{statistics.median(r['sync_exposed_s'] for r in runs) * 1e3:.0f} ms; {runs[0]['plan']}")
            print(f"  {name:<42} {rate:7.2f} images/s  {rate / ddp_rate:5.2f}x DDP{extra}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(everything, handle, indent=1)


if __name__ == "__main__":
    main()
