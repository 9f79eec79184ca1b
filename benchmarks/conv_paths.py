"""spmdcnn's two host convolution paths on a network's shapes: the implicit GEMM (``ops/implicit.py``, a GEMM per
kernel position on the padded input in place) against im2col + one GEMM, alternating in one process, medians over
rounds; for each distinct convolution the path ``conv_forward`` takes by default, and the whole network's
convolutions in each.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE SPMDCNN_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 \\
        python benchmarks/conv_paths.py models/resnet50.yaml --batch 16

Only the convolutions whose layout has shifted rows can take the implicit path (1x1 ones have their own); ``--all`` also times the others
with shifted rows forced (what the thresholds turn down). Where the default would not take it (below its thresholds
of channels or positions) the row says so.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("SPMDCNN_NUM_THREADS", "1")

import spmdcnn  # noqa: E402  (first: it tunes OpenBLAS before NumPy loads it)
spmdcnn.keep_freed_memory()
import numpy as np  # noqa: E402

from kernels_vs_torch import shapes  # noqa: E402
from spmdcnn.graph import load_model  # noqa: E402
from spmdcnn.ops import blas, im2col, implicit  # noqa: E402
from spmdcnn.ops.conv import ConvGeometry, conv_backward, conv_forward  # noqa: E402
from spmdcnn.runtime.bench import describe_host  # noqa: E402


def seconds(function):
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def time_paths(x_shape, K, kernel, stride, padding, rounds, force, rng):
    """``(default takes implicit, {path: (forward s, backward s)})``, medians over ``rounds`` alternating rounds."""
    geometry = ConvGeometry(stride, padding, rank=len(kernel))
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal((K, x_shape[1]) + tuple(kernel), dtype=np.float32)
    default = implicit.applies(im2col.Layout(x_shape, kernel, geometry, 4), x, 1)
    settings = {"im2col": (10 ** 9, implicit.MIN_POSITIONS, im2col.SHIFTED_WASTE),
                "implicit": (1, 1, float("inf")) if force else (1, 1, im2col.SHIFTED_WASTE)}
    kept = (implicit.MIN_CHANNELS, implicit.MIN_POSITIONS, im2col.SHIFTED_WASTE)
    taken = {path: [] for path in settings}
    try:
        for _ in range(rounds + 1):                 # the first round warms up
            for path, (channels, positions, waste) in settings.items():
                implicit.MIN_CHANNELS, implicit.MIN_POSITIONS, im2col.SHIFTED_WASTE = channels, positions, waste
                y, saved = conv_forward(x, w, None, geometry)
                gy = rng.standard_normal(y.shape, dtype=np.float32)
                taken[path].append((seconds(lambda: conv_forward(x, w, None, geometry)),
                                    seconds(lambda: conv_backward(gy, saved))))
    finally:
        implicit.MIN_CHANNELS, implicit.MIN_POSITIONS, im2col.SHIFTED_WASTE = kept
    return default, {path: tuple(statistics.median(t[i] for t in times[1:]) for i in (0, 1))
                     for path, times in taken.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--all", action="store_true", help="also time convolutions without shifted rows, forced")
    args = parser.parse_args()
    if blas.gemm(np.float32) is None:
        raise SystemExit(f"no implicit path here: {blas.describe()}")
    graph = load_model(args.model)
    rng = np.random.default_rng(0)
    print(f"{graph.name}, batch {args.batch}; {describe_host()}")
    print(f"{'count':>5}  {'convolution':<44} {'im2col fwd':>10} {'bwd':>7} {'implicit fwd':>12} {'bwd':>7}  ratio  default")
    totals = {"im2col": 0.0, "implicit": 0.0, "default": 0.0}
    for key, count in shapes(graph, args.batch).items():
        if key[0] != "conv":
            continue
        _, x_shape, K, kernel, stride, padding = key
        geometry = ConvGeometry(stride, padding, rank=len(kernel))
        if all(k == 1 for k in kernel) or (not args.all and not im2col.Layout(x_shape, kernel, geometry, 4).shifted):
            continue
        default, found = time_paths(x_shape, K, kernel, stride, padding, args.rounds, args.all, rng)
        (f0, b0), (f1, b1) = found["im2col"], found["implicit"]
        for path, (f, b) in found.items():
            totals[path] += count * (f + b)
        totals["default"] += count * ((f1 + b1) if default else (f0 + b0))
        name = (f"{x_shape[1]}x{'x'.join(map(str, x_shape[2:]))} -> {K}, k{'x'.join(map(str, kernel))} "
                f"s{'x'.join(map(str, stride))}")
        print(f"{count:>5}  {name:<44} {f0 * 1e3:>10.1f} {b0 * 1e3:>7.1f} {f1 * 1e3:>12.1f} {b1 * 1e3:>7.1f}  "
              f"{(f1 + b1) / (f0 + b0):.2f}   {'implicit' if default else 'im2col'}", flush=True)
    print(f"\nthese convolutions, over the network's layers (ms per iteration, forward + backward): im2col "
          f"{totals['im2col'] * 1e3:.0f}, implicit {totals['implicit'] * 1e3:.0f}, the default's choice "
          f"{totals['default'] * 1e3:.0f} ({totals['default'] / totals['im2col']:.2f}x im2col's)")


if __name__ == "__main__":
    main()
