"""The data pipeline: how fast shuffled batches come out of an HDF5 dataset, and what reading costs a training step.

    python benchmarks/data_pipeline.py [--images 2000] [--size 224] [--batch 64] [--rounds 5]
                                       [--train-model models/alexnet.yaml --train-batch 32 --train-ranks 2]

Three parts, each timed in rounds that alternate the variants, medians over the rounds:

1. **Reads** (one process, no workers): shuffled batches of ``--batch`` uint8 images of ``--size`` squared,
   from files in the page cache written three ways (one image per chunk, what ``data convert`` writes; ~1 MiB
   chunks, what it wrote before; contiguous), read two ways (one point selection over the batch's sorted samples,
   as before; one hyperslab per sample, as now; h5py's ``read_direct`` per sample), with HDF5's chunk cache on
   (1 MiB) or off, and through the sec2 and stdio file drivers; "delivered" includes the conversion to float32
   that training does.
2. **Workers**: ``spmdcnn data bench`` on the one-image-per-chunk file with 0, 1 and 2 workers, with random
   crops and flips from images stored 32 pixels larger: the images/s delivered to one rank, and a worker's peak
   memory against its buffers.
3. **Training** (with ``--train-model``): ``mpiexec -n R spmdcnn bench`` of the model on one fixed synthetic batch,
   and on the file's shuffled batches with crops and flips read ahead by workers: the step times' ratio and the
   time a step waited for data.
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

import h5py
import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
from spmdcnn.io.dataset import HDF5Dataset, write_blocks  # noqa: E402
from spmdcnn.runtime.bench import blas_info  # noqa: E402


def write_files(folder, count, size, seed=0):
    """The test files: ``{layout: path}`` of ``count`` random images (3, size, size), and a larger-image file."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, count)           # within every shipped model's classes
    paths = {}
    per_image = 3 * size * size

    def blocks(side):
        for start in range(0, count, 256):
            yield rng.integers(0, 256, (min(256, count - start), 3, side, side), dtype=np.uint8)
    for layout, chunk in (("one image per chunk", 1), ("1 MiB chunks", max(1, (1 << 20) // per_image)),
                          ("contiguous", 0)):
        paths[layout] = os.path.join(folder, f"{chunk}.h5")
        write_blocks(paths[layout], (3, size, size), np.uint8, labels, blocks(size), ([0.5] * 3, [0.25] * 3),
                     chunk=chunk)
    paths["larger"] = os.path.join(folder, "larger.h5")
    write_blocks(paths["larger"], (3, size + 32, size + 32), np.uint8, labels, blocks(size + 32),
                 ([0.5] * 3, [0.25] * 3))
    return paths


def point_selection(data, indices):
    """The read before: one point selection over the sorted samples, then the conversion."""
    unique = np.unique(indices)
    images = data.images[unique].astype(np.float32)
    images /= 255
    images -= data.mean.reshape(1, -1, 1, 1).astype(np.float32)
    images /= data.std.reshape(1, -1, 1, 1).astype(np.float32)
    return images


def hyperslabs(data, indices):
    return data.read(indices)[0]


def read_direct(data, indices):
    """h5py's high-level ``read_direct``, one call per sample into a buffer, then the conversion."""
    staged = np.empty((len(indices),) + data.stored_shape, np.uint8)
    for k, index in enumerate(indices):
        data.images.read_direct(staged, np.s_[int(index)], np.s_[k])
    images = staged.astype(np.float32)
    images /= 255
    images -= data.mean.reshape(1, -1, 1, 1).astype(np.float32)
    images /= data.std.reshape(1, -1, 1, 1).astype(np.float32)
    return images


def read_rates(paths, batch, rounds, batches):
    """``{variant: [images/s per round]}`` of shuffled reads, the variants alternating within each round."""
    variants = []
    for layout in ("one image per chunk", "1 MiB chunks", "contiguous"):
        variants.append((f"{layout}, per-sample hyperslabs (now)", paths[layout], hyperslabs, None, None))
        variants.append((f"{layout}, point selection (before)", paths[layout], point_selection, None, None))
    variants.append(("one image per chunk, read_direct per sample", paths["one image per chunk"], read_direct, None,
                     None))
    variants.append(("one image per chunk, hyperslabs, chunk cache 1 MiB", paths["one image per chunk"],
                     hyperslabs, 1 << 20, None))
    variants.append(("one image per chunk, hyperslabs, stdio driver", paths["one image per chunk"], hyperslabs, None,
                     "stdio"))
    rates = {name: [] for name, *_ in variants}
    rng = np.random.default_rng(1)
    for _ in range(rounds):
        for name, path, read, cache, driver in variants:
            data = HDF5Dataset(path)
            if cache is not None or driver is not None:      # reopen the same file another way
                data.file.close()
                data.file = h5py.File(path, "r", rdcc_nbytes=cache if cache is not None else 0, driver=driver)
                data.images = data.file["images"]
            count = batches if "point selection" not in name else max(1, batches // 10)
            orders = [rng.permutation(data.num_samples)[:batch] for _ in range(count)]
            start = time.perf_counter()
            for indices in orders:
                read(data, indices)
            rates[name].append(count * batch / (time.perf_counter() - start))
            data.close()
    return rates


def spmdcnn_command(*args):
    return [sys.executable, "-m", "spmdcnn.cli", *map(str, args)]


def run_json(command, env):
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout[done.stdout.index("{"):])


def worker_rates(path, batch, size, rounds, batches, env):
    """``{workers: [data bench results per round]}``, the worker counts alternating."""
    results = {w: [] for w in (0, 1, 2)}
    for _ in range(rounds):
        for workers in results:
            results[workers].append(run_json(spmdcnn_command(
                "data", "bench", path, "--batch", batch, "--workers", workers, "--batches", batches, "--augment",
                f"{{crop: [{size}, {size}], flip: true}}", "--json"), env))
    return results


def training(model, path, batch, ranks, size, steps, rounds, env):
    """``{variant: [bench results per round]}`` of the model on synthetic data and on the file, alternating."""
    launch = [shutil.which("mpiexec"), "-n", str(ranks)] if ranks > 1 else []
    variants = {"synthetic (one fixed batch)": [],
                "HDF5, shuffled, random crops and flips, a worker per rank reading ahead": []}
    common = ["bench", model, "--batch", batch, "--steps", steps, "--warmup", 2, "--plan", "data", "--json"]
    for _ in range(rounds):
        for name in variants:
            # one worker a rank: auto reads a run this short in the step
            extra = [] if name.startswith("synthetic") else [
                "--data", path, "--augment", f"{{crop: [{size}, {size}], flip: true}}", "--workers", 1]
            variants[name].append(run_json(launch + spmdcnn_command(*common, *extra), env))
    return variants


def median(values):
    return statistics.median(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000, help="images in each test file (default 2000)")
    parser.add_argument("--size", type=int, default=224, help="image side (default 224)")
    parser.add_argument("--batch", type=int, default=64, help="batch of the read tests (default 64)")
    parser.add_argument("--batches", type=int, default=20, help="batches per read measurement (default 20)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--train-model", help="also time training of this model on the data (e.g. "
                        "models/alexnet.yaml)")
    parser.add_argument("--train-batch", type=int, default=32)
    parser.add_argument("--train-ranks", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=5)
    parser.add_argument("--train-rounds", type=int, default=3)
    parser.add_argument("--dir", help="where to write the test files (default: a temporary folder, removed after)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    folder = args.dir or tempfile.mkdtemp(prefix="spmdcnn-data-bench-")
    os.makedirs(folder, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    if args.train_ranks > 1:
        env.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})     # one core per rank
    try:
        paths = write_files(folder, args.images, args.size)
        reads = read_rates(paths, args.batch, args.rounds, args.batches)
        workers = worker_rates(paths["larger"], args.batch, args.size, args.rounds, args.batches, env)
        trained = (training(args.train_model, paths["larger"], args.train_batch, args.train_ranks, args.size,
                            args.train_steps, args.train_rounds, env) if args.train_model else None)
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
    summary = {"blas": blas_info(), "cores": os.cpu_count(), "images": args.images, "size": args.size,
               "batch": args.batch, "rounds": args.rounds,
               "reads_images_per_s": {name: median(rates) for name, rates in reads.items()},
               "workers": {str(w): {"images_per_s": median([r["images_per_s"] for r in results]),
                                    "worker_peak_mib": (max(r["worker_peak_bytes"] for r in results) / 2 ** 20
                                                        if w else None),
                                    "idle_worker_mib": (results[0]["idle_worker_bytes"] / 2 ** 20 if w else None),
                                    "shared_mib": results[0]["shared_bytes"] / 2 ** 20,
                                    "staging_mib": results[0]["staging_bytes"] / 2 ** 20}
                           for w, results in workers.items()}}
    if trained:
        synthetic, real = (trained[name] for name in trained)
        step = {name: median([r["step_s_median"] for r in results]) for name, results in trained.items()}
        summary["training"] = {"model": args.train_model, "batch": args.train_batch, "ranks": args.train_ranks,
                               "step_s": step, "ratio": step[list(step)[1]] / step[list(step)[0]],
                               "data_wait_s": median([r["data_wait_s"] for r in real]),
                               "rounds_step_s": {name: [r["step_s_median"] for r in results]
                                                 for name, results in trained.items()}}
        del synthetic
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    blas = ", ".join(f"{b['internal_api']} {b['version']} {b['architecture']} x{b['num_threads']}"
                     for b in summary["blas"]) or "unknown"
    print(f"{args.images} images of 3x{args.size}x{args.size} uint8, shuffled batches of {args.batch}, medians of "
          f"{args.rounds} rounds; {summary['cores']} cores; BLAS {blas}")
    print("reads in one process (images/s delivered as float32):")
    for name, rate in summary["reads_images_per_s"].items():
        print(f"  {rate:>9,.0f}  {name}")
    print(f"data bench, random {args.size}x{args.size} crops and flips of {args.size + 32}x{args.size + 32} images:")
    for w, row in summary["workers"].items():
        memory = (f"; worker peak {row['worker_peak_mib']:.0f} MiB = idle {row['idle_worker_mib']:.0f} + shared "
                  f"{row['shared_mib']:.0f} + staging {row['staging_mib']:.1f} (bound "
                  f"{row['idle_worker_mib'] + row['shared_mib'] + row['staging_mib']:.0f})" if row["worker_peak_mib"]
                  else "")
        print(f"  {row['images_per_s']:>9,.0f}  images/s, {w} worker{'s' * (w != '1')}{memory}")
    if trained:
        t = summary["training"]
        print(f"training {t['model']}, batch {t['batch']}, {t['ranks']} ranks (median step over rounds):")
        for name, seconds in t["step_s"].items():
            print(f"  {seconds * 1e3:>9.1f}  ms  {name}   rounds: "
                  + ", ".join(f"{s * 1e3:.0f}" for s in t["rounds_step_s"][name]))
        print(f"  ratio {t['ratio']:.3f} (data / synthetic); a step waited {t['data_wait_s'] * 1e3:.2f} ms for data")


if __name__ == "__main__":
    main()
