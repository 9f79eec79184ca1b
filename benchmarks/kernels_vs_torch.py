"""spmdcnn's convolution, transposed-convolution, upsampling and batch-norm kernels against PyTorch's on the same
shapes, one thread each (``SPMDCNN_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2``: two): where a network's per-process
gap to PyTorch comes from, kernel by kernel.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/kernels_vs_torch.py models/resnet50.yaml --batch 8
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/kernels_vs_torch.py \
        benchmarks/models/decoder_block.yaml --batch 4

For every distinct convolution (input shape, output channels, kernel, stride, padding), transposed convolution,
upsampling and batch-norm shape of the model at the given batch: forward and backward of spmdcnn's NumPy kernel
(``ops/conv.py``, ``ops/conv_transpose.py``, ``ops/upsample.py``, ``ops/batchnorm.py``) and of ``torch.nn.functional`` (oneDNN's direct convolutions, or its im2col path, whichever PyTorch picks), each
the best of ``--repeats`` after a warm-up, alternating the two; then the totals over the network's layers (each
shape times its count), and the time the convolutions' matrix products would take at this machine's single-thread
SGEMM rate on those shapes (``numpy.matmul`` of the im2col product, measured), and for each convolution the fraction
of a 2048^2 SGEMM's rate (the peak) its forward and backward products reach in ours and in PyTorch's kernels. One
BLAS thread and one PyTorch thread unless the environment gives more.
"""

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("SPMDCNN_NUM_THREADS", "1")

import spmdcnn  # noqa: E402  (first: it tunes OpenBLAS before NumPy loads it)
spmdcnn.keep_freed_memory()     # freed memory kept, as the spmdcnn command does: for both frameworks in this process
import numpy as np  # noqa: E402
import torch  # noqa: E402

from spmdcnn.graph import load_model  # noqa: E402
from spmdcnn.ops import batchnorm, conv, conv_transpose, upsample  # noqa: E402
from spmdcnn.ops.window import ntuple  # noqa: E402
from spmdcnn.runtime.bench import blas_info  # noqa: E402


def best(function, repeats):
    function()
    fastest = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        fastest = min(fastest, time.perf_counter() - start)
    return fastest


def shapes(graph, batch):
    """``{("conv", x_shape, K, kernel, stride, padding) or ("bn", x_shape): count}`` in network order."""
    found = {}
    for layer in graph.layers:
        x_shape = (batch,) + tuple(layer.in_shapes[0])
        if layer.spec.family == "conv":
            g = layer.window
            key = ("conv", x_shape, layer.attrs["out_channels"], g.kernel, g.stride, g.padding, layer.input_grad)
        elif layer.spec.family == "conv_transpose":
            g, a = layer.window, layer.attrs
            extra = ntuple(a["output_padding"], len(g.kernel))
            key = ("convT", x_shape, a["out_channels"], g.kernel, g.stride, g.padding, extra, g.dilation)
        elif layer.spec.family == "upsample":
            a = layer.attrs
            key = ("up", x_shape, ntuple(a["scale"], len(x_shape) - 2), a["mode"], a["align_corners"])
        elif layer.spec.family == "batchnorm":
            key = ("bn", x_shape)
        else:
            continue
        found[key] = found.get(key, 0) + 1
    return found


def time_conv(x_shape, K, kernel, stride, padding, input_grad, repeats, rng):
    """Forward and backward, ours and PyTorch's; backward without the input's gradient where the network has none
    (its first layer's)."""
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal((K, x_shape[1]) + kernel, dtype=np.float32) * 0.01
    geometry = conv.ConvGeometry(stride, padding, rank=len(kernel))
    y, saved = conv.conv_forward(x, w, None, geometry, input_grad)
    gy = rng.standard_normal(y.shape, dtype=np.float32)
    tx, tw, tgy = torch.from_numpy(x).requires_grad_(input_grad), torch.from_numpy(w).requires_grad_(), \
        torch.from_numpy(gy)
    function = getattr(torch.nn.functional, f"conv{len(kernel)}d")
    symmetric = all(before == after for before, after in padding)
    pads = tuple(p for pair in reversed(padding) for p in pair)     # F.pad lists the last axis first

    def torch_forward():
        if symmetric:
            return function(tx, tw, None, stride, tuple(before for before, _ in padding))
        return function(torch.nn.functional.pad(tx, pads), tw, None, stride)

    def torch_both():
        torch.autograd.grad(torch_forward(), (tx, tw) if input_grad else (tw,), tgy)
    ours = (best(lambda: conv.conv_forward(x, w, None, geometry, input_grad), repeats),
            best(lambda: conv.conv_backward(gy, saved), repeats))
    forward = best(torch_forward, repeats)
    theirs = (forward, max(best(torch_both, repeats) - forward, 0.0))
    columns = rng.standard_normal((w[0].size, y.shape[0] * int(np.prod(y.shape[2:]))), dtype=np.float32)
    w2 = w.reshape(K, -1)
    gemm = best(lambda: w2 @ columns, repeats)          # forward's product; backward has one or two of the same size
    products = 3 if input_grad else 2
    return ours, theirs, products * gemm, products * 2 * w2.size * columns.shape[1]


def sgemm_rate(size=2048, repeats=5):
    """FLOP/s of a square SGEMM at this BLAS's threads: the peak the convolutions are measured against."""
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    return 2 * size ** 3 / best(lambda: a @ a, repeats)


def _against_torch(ours_forward, ours_backward, torch_forward, inputs, gy, repeats):
    """Best forward and backward times of ours and of PyTorch's autograd (its backward: both less its forward)."""
    def torch_both():
        torch.autograd.grad(torch_forward(), inputs, gy)
    ours = (best(ours_forward, repeats), best(ours_backward, repeats))
    forward = best(torch_forward, repeats)
    return ours, (forward, max(best(torch_both, repeats) - forward, 0.0))


def time_conv_transpose(x_shape, K, kernel, stride, padding, output_padding, dilation, repeats, rng):
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal((x_shape[1], K) + kernel, dtype=np.float32) * 0.01
    geometry = conv_transpose.geometry(x_shape[2:], kernel, stride, padding, output_padding, dilation)
    y, saved = conv_transpose.conv_transpose_forward(x, w, None, geometry)
    gy = rng.standard_normal(y.shape, dtype=np.float32)
    tx, tw, tgy = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_(), torch.from_numpy(gy)
    function = getattr(torch.nn.functional, f"conv_transpose{len(kernel)}d")
    symmetric = tuple(before for before, _ in padding)          # the models' transposed convolutions pad alike

    def torch_forward():
        return function(tx, tw, None, stride, symmetric, output_padding, 1, dilation)
    ours, theirs = _against_torch(lambda: conv_transpose.conv_transpose_forward(x, w, None, geometry),
                                  lambda: conv_transpose.conv_transpose_backward(gy, saved), torch_forward, (tx, tw),
                                  tgy, repeats)
    columns = rng.standard_normal((x_shape[1], x_shape[0] * int(np.prod(x_shape[2:]))), dtype=np.float32)
    w2 = w.reshape(x_shape[1], -1).T
    gemm = best(lambda: w2 @ columns, repeats)          # forward's product; backward has two of the same size
    return ours, theirs, 3 * gemm


def time_upsample(x_shape, scale, mode, align_corners, repeats, rng):
    x = rng.standard_normal(x_shape, dtype=np.float32)
    rank = len(x_shape) - 2
    axes = [upsample.axis_taps(np, 2 + a, mode, scale[a], align_corners, x_shape[2 + a], x_shape[2 + a] * scale[a],
                               (0, x_shape[2 + a] * scale[a]), 0, x_shape[2 + a], np.float32) for a in range(rank)]
    y, saved = upsample.upsample_forward(x, axes)
    gy = rng.standard_normal(y.shape, dtype=np.float32)
    tx, tgy = torch.from_numpy(x).requires_grad_(), torch.from_numpy(gy)
    torch_mode = "nearest" if mode == "nearest" else {1: "linear", 2: "bilinear", 3: "trilinear"}[rank]

    def torch_forward():
        return torch.nn.functional.interpolate(tx, scale_factor=[float(s) for s in scale], mode=torch_mode,
                                               align_corners=align_corners if mode != "nearest" else None)
    ours, theirs = _against_torch(lambda: upsample.upsample_forward(x, axes),
                                  lambda: upsample.upsample_backward(gy, saved), torch_forward, (tx,), tgy, repeats)
    return ours, theirs, 0.0


def time_batchnorm(x_shape, repeats, rng):
    C = x_shape[1]
    x = rng.standard_normal(x_shape, dtype=np.float32) + 3.0
    gamma, beta = np.ones(C, np.float32), np.zeros(C, np.float32)
    mean, var = np.zeros(C, np.float32), np.ones(C, np.float32)
    y, saved = batchnorm.batchnorm_forward(x, gamma, beta, mean, var)
    gy = rng.standard_normal(y.shape, dtype=np.float32)
    tx = torch.from_numpy(x).requires_grad_()
    tgamma, tbeta = torch.ones(C, requires_grad=True), torch.zeros(C, requires_grad=True)
    tmean, tvar, tgy = torch.zeros(C), torch.ones(C), torch.from_numpy(gy)

    def torch_forward():
        return torch.nn.functional.batch_norm(tx, tmean, tvar, tgamma, tbeta, training=True)

    def torch_both():
        torch.autograd.grad(torch_forward(), (tx, tgamma, tbeta), tgy)
    ours = (best(lambda: batchnorm.batchnorm_forward(x, gamma, beta, mean, var), repeats),
            best(lambda: batchnorm.batchnorm_backward(gy, saved), repeats))
    forward = best(torch_forward, repeats)
    return ours, (forward, max(best(torch_both, repeats) - forward, 0.0)), 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    threads = int(os.environ["SPMDCNN_NUM_THREADS"])
    torch.set_num_threads(threads)
    graph = load_model(args.model)
    rng = np.random.default_rng(0)
    peak = sgemm_rate()
    print(f"{graph.name}, batch {args.batch}, {threads} thread{'s' * (threads > 1)}; BLAS {blas_info()}; "
          f"PyTorch {torch.__version__}; SGEMM 2048^2 {peak / 1e9:.0f} GFLOP/s (the peak below)")
    print(f"{'count':>5}  {'kernel':<44} {'ours fwd':>9} {'bwd':>8}  {'torch fwd':>9} {'bwd':>8}  {'GEMMs':>7}  (ms)  "
          f"{'peak ours':>9} {'torch':>6}")
    totals = {}
    for key, count in shapes(graph, args.batch).items():
        if key[0] == "conv":
            _, x_shape, K, kernel, stride, padding, input_grad = key
            ours, theirs, gemm, flops = time_conv(x_shape, K, kernel, stride, padding, input_grad, args.repeats, rng)
            name = f"conv {'x'.join(map(str, x_shape[1:]))} -> {K}, k{kernel[0]} s{stride[0]} p{padding[0][0]}"
            name += "" if input_grad else " (no gx)"
        elif key[0] == "convT":
            _, x_shape, K, kernel, stride, padding, extra, dilation = key
            ours, theirs, gemm = time_conv_transpose(x_shape, K, kernel, stride, padding, extra, dilation,
                                                     args.repeats, rng)
            name = (f"convT {'x'.join(map(str, x_shape[1:]))} -> {K}, k{kernel[0]} s{stride[0]} p{padding[0][0]}"
                    f" op{extra[0]}")
        elif key[0] == "up":
            _, x_shape, scale, mode, corners = key
            ours, theirs, gemm = time_upsample(x_shape, scale, mode, corners, args.repeats, rng)
            name = f"upsample {'x'.join(map(str, x_shape[1:]))} x{scale[0]} {mode}{' corners' if corners else ''}"
        else:
            ours, theirs, gemm = time_batchnorm(key[1], args.repeats, rng)
            name = f"batchnorm {'x'.join(map(str, key[1][1:]))}"
        # a convolution's forward and backward products against the SGEMM peak (fractions of it reached)
        reached = f"  {flops / sum(ours) / peak:9.0%} {flops / sum(theirs) / peak:6.0%}" if key[0] == "conv" else ""
        print(f"{count:>5}  {name:<44} {ours[0] * 1e3:9.1f} {ours[1] * 1e3:8.1f}  {theirs[0] * 1e3:9.1f} "
              f"{theirs[1] * 1e3:8.1f}  {gemm * 1e3:7.1f}{reached}")
        row = totals.setdefault(key[0], np.zeros(5))
        row += count * np.array([*ours, *theirs, gemm])
    print("\nover the network's layers (ms per iteration):")
    for kind, row in totals.items():
        ours, theirs = row[0] + row[1], row[2] + row[3]
        gemm = f"; its matrix products at this BLAS's rate {row[4] * 1e3:.0f}" if kind in ("conv", "convT") else ""
        print(f"  {kind:<5} ours {row[0] * 1e3:6.0f} + {row[1] * 1e3:6.0f} = {ours * 1e3:6.0f}   PyTorch "
              f"{row[2] * 1e3:6.0f} + {row[3] * 1e3:6.0f} = {theirs * 1e3:6.0f}   ratio {theirs / ours:.2f}x{gemm}")


if __name__ == "__main__":
    main()
