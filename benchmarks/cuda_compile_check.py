"""Compile every CUDA kernel of spmdcnn/ops/cuda/kernels.py with NVRTC, for float32, float64 and bfloat16,
without a GPU, and describe every convolution graph with the cuDNN frontend: a check to run before spending GPU
time.

    pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12
    LD_LIBRARY_PATH=$(python -c 'import nvidia.cuda_nvrtc, os; print(os.path.dirname(nvidia.cuda_nvrtc.__file__))')/lib \
        python benchmarks/cuda_compile_check.py

CuPy itself compiles only for a present device, so each kernel's operation is wrapped here in a harness shaped
like CuPy's generated code (its CArray, bfloat16 and math headers; element references for array parameters,
CArrays for raw ones, the type placeholders typedef'd) and compiled for compute_90. It catches what a kernel
body gets wrong (syntax, types, bfloat16 conversions), not CuPy's own code generation.
"""
import importlib.util
import os
import sys

import cupy
import nvidia.cuda_runtime
from cupy_backends.cuda.libs import nvrtc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from spmdcnn.ops.cuda import kernels as k  # noqa: E402

CUPY_INC = os.path.join(os.path.dirname(cupy.__file__), "_core", "include")
CUDA_INC = os.path.join(list(nvidia.cuda_runtime.__path__)[0], "include")
CTYPE = {"float32": "float", "float64": "double", "bfloat16": "bfloat16", "uint8": "unsigned char",
         "uint32": "unsigned int", "bool": "bool", "int64": "long long", "uint64": "unsigned long long",
         "int32": "int"}

def harness(kernel, types):
    """types: placeholder -> dtype name."""
    decls, body = [], []
    for p in list(kernel.in_params) + list(kernel.out_params):
        ctype = types[p.ctype] if p.ctype in types else p.ctype
        ctype = CTYPE.get(ctype, ctype)
        if p.raw:
            decls.append(f"CArray<{ctype}, 1, true, true> {p.name}")
        elif p in kernel.out_params:
            decls.append(f"{ctype}* _p_{p.name}")
            body.append(f"{ctype} &{p.name} = _p_{p.name}[i];")
        else:
            decls.append(f"const {ctype}* _p_{p.name}")
            body.append(f"const {ctype} &{p.name} = _p_{p.name}[i];")
    typedefs = "".join(f"typedef {CTYPE[v]} {t};\n" for t, v in types.items())
    op = getattr(kernel, "operation", None)
    return f"""#include <cupy/carray.cuh>
#include <cupy/bfloat16.cuh>
{kernel.preamble if hasattr(kernel, 'preamble') else ''}
{typedefs}
extern "C" __global__ void check({', '.join(decls)}) {{
    const long long i = blockIdx.x * blockDim.x + threadIdx.x;
    {' '.join(body)}
    {op};
}}
"""

def compile_source(name, src):
    prog = nvrtc.createProgram(src, name, [], [])
    try:
        nvrtc.compileProgram(prog, [f"-I{CUPY_INC}", f"-I{CUDA_INC}", "-arch=compute_90", "--std=c++17",
                                    "-DCUPY_USE_BFLOAT16"])
        return None
    except nvrtc.NVRTCError:
        return nvrtc.getProgramLog(prog)

failures = 0
cases = []
for d in ("float32", "float64", "bfloat16"):
    acc = {"float32": "float32", "float64": "float64", "bfloat16": "float32"}[d]
    for t in ("uint8", "uint32"):
        cases += [(f"maxpool_f_{t}_{d}", k._maxpool_forward(t, d), {"T": d}),
                  (f"maxpool_b_{t}_{d}", k._maxpool_backward(t, d), {"T": d})]
    cases += [(f"avgpool_f_{d}", k._avgpool_forward(d), {"T": d}), (f"avgpool_b_{d}", k._avgpool_backward(d), {"T": d})]
    bn = k._bn_kernels(d)
    cases += [(f"bn_affine_{d}", bn[3], {"T": d, "A": acc}), (f"bn_backward_{d}", bn[4], {"T": d, "A": acc})]
    cases += [(f"dropout4_{d}", k._dropout_forward(4), {"T": d, "A": acc}),
              (f"dropout_b_{d}", k._dropout_backward(), {"T": d, "A": acc})]
    cases += [(f"relu_f_{d}", k._relu()[0], {"T": d}), (f"relu_b_{d}", k._relu()[1], {"T": d})]
    cases += [(f"add_into_{d}", k._add(d), {"T": d}), (f"add2_{d}", k._add2(d), {"T": d})]
for m in (False, True):
    for nv in (False, True):
        for dc in (False, True):
            if nv and not m:
                continue
            cases.append((f"sgd_{m}_{nv}_{dc}", k._sgd(m, nv, dc), {"T": "float32"}))
for name, kernel, types in cases:
    log = compile_source(name, harness(kernel, types))
    if log:
        failures += 1
        print(f"--- {name}\n{log[:1500]}")
# reduction kernels: compile their map expressions
for d in ("float32", "float64", "bfloat16"):
    for kernel in k._bn_kernels(d)[:3]:
        params = list(kernel.in_params)
        decl = "; ".join(f"{'double' if p.ctype == 'double' else CTYPE.get(d if p.ctype == 'T' else p.ctype, p.ctype)} {p.name} = {{}}" for p in params)
        src = f"#include <cupy/carray.cuh>\n#include <cupy/bfloat16.cuh>\ntypedef {CTYPE[d]} T;\nextern \"C\" __global__ void check(double* out) {{ {decl}; double a_ = {kernel.map_expr}; out[0] = a_; }}"
        log = compile_source(kernel.name, src)
        if log:
            failures += 1
            print(f"--- {kernel.name}\n{log[:1500]}")
print(f"{len(cases) + 9} kernels, {failures} failed to compile")


def describe_convolutions():
    """Describe every convolution graph of the op tests' cases (cuDNN frontend's IR, no GPU): the calls, their
    keywords and the tensors' dims and strides. Building the graphs needs the GPU."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ops"))
    from op_cases import CONV_CASES
    from spmdcnn.ops.conv import ConvGeometry
    from spmdcnn.ops.cuda import conv
    from spmdcnn.ops.window import output_extent
    count = 0
    for x_shape, w_shape, stride, padding, dilation, _ in CONV_CASES.values():
        geometry = ConvGeometry(stride, padding, dilation)
        extra, symmetric = conv._symmetric(geometry, w_shape[2:])
        N, C, H, W = x_shape
        H, W = H + sum(extra[0]), W + sum(extra[1])
        y_shape = (N, w_shape[0]) + tuple(output_extent(size, k, s, p, p, d) for size, k, s, p, d in zip(
            (H, W), w_shape[2:], geometry.stride, symmetric, geometry.dilation))
        for kind in ("fprop", "dgrad", "wgrad"):
            for io, out in (("float32", "float32"), ("float64", "float64"), ("bfloat16", "bfloat16"),
                            ("bfloat16", "float32")):
                for layout in conv.LAYOUTS:
                    conv.describe(kind, io, out, (N, C, H, W), w_shape, y_shape, symmetric, geometry.stride,
                                  geometry.dilation, layout)
                    count += 1
    return count


if importlib.util.find_spec("cudnn") is not None:
    print(f"{describe_convolutions()} cuDNN convolution graphs described")
else:
    print("cuDNN frontend not installed: convolution graphs not described (pip install nvidia-cudnn-frontend)")
sys.exit(1 if failures else 0)
