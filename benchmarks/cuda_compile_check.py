"""Check the GPU code without a GPU, before spending GPU time: compile every CUDA kernel body of
spmdcnn/ops/cuda/kernels.py with NVRTC for float32, float64 and bfloat16, and describe every convolution graph
of the op tests' cases with the cuDNN frontend (its graph IR needs no GPU; building it does).

    pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 nvidia-cudnn-frontend ml_dtypes
    NVRTC=$(python -c 'import nvidia.cuda_nvrtc as m, os; print(os.path.dirname(m.__file__))')
    LD_LIBRARY_PATH=$NVRTC/lib python benchmarks/cuda_compile_check.py

CuPy itself compiles only for a present device, so each kernel's operation is wrapped here in a harness shaped
like CuPy's generated code (its CArray, bfloat16 and math headers; element references for array parameters,
CArrays for raw ones, the type placeholders typedef'd; ``;`` after the operation) and compiled for compute_90.
It catches what a kernel body gets wrong (syntax, types, bfloat16 conversions), not CuPy's code generation.
"""

import importlib.util
import os
import sys

import cupy
import nvidia.cuda_runtime
from cupy_backends.cuda.libs import nvrtc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ops"))
from spmdcnn.ops.cuda import kernels  # noqa: E402

INCLUDES = [os.path.join(os.path.dirname(cupy.__file__), "_core", "include"),
            os.path.join(list(nvidia.cuda_runtime.__path__)[0], "include")]
CTYPE = {"float32": "float", "float64": "double", "bfloat16": "bfloat16", "uint8": "unsigned char",
         "uint32": "unsigned int", "bool": "bool", "int64": "long long", "uint64": "unsigned long long",
         "int32": "int"}
DTYPES = ("float32", "float64", "bfloat16")
HEADER = "#include <cupy/carray.cuh>\n#include <cupy/bfloat16.cuh>\n"


def compile_source(name, source):
    """NVRTC's log when ``source`` does not compile, else None."""
    program = nvrtc.createProgram(source, name, [], [])
    try:
        nvrtc.compileProgram(program, [*(f"-I{d}" for d in INCLUDES), "-arch=compute_90", "--std=c++17"])
        return None
    except nvrtc.NVRTCError:
        return nvrtc.getProgramLog(program)


def elementwise_source(kernel, types):
    """A kernel function running ``kernel``'s operation on element ``i``; ``types``: placeholder -> dtype name."""
    declarations, bindings = [], []
    for param in list(kernel.in_params) + list(kernel.out_params):
        ctype = CTYPE.get(types.get(param.ctype, param.ctype), param.ctype)
        if param.raw:
            declarations.append(f"CArray<{ctype}, 1, true, true> {param.name}")
        else:
            const = "" if param in kernel.out_params else "const "
            declarations.append(f"{const}{ctype}* _p_{param.name}")
            bindings.append(f"{const}{ctype} &{param.name} = _p_{param.name}[i];")
    typedefs = "".join(f"typedef {CTYPE[v]} {t};\n" for t, v in types.items())
    return f"""{HEADER}{kernel.preamble}
{typedefs}
extern "C" __global__ void check({', '.join(declarations)}) {{
    const long long i = blockIdx.x * blockDim.x + threadIdx.x;
    {' '.join(bindings)}
    {kernel.operation};
}}
"""


def reduction_source(kernel, dtype):
    """A function evaluating ``kernel``'s map expression (its inputs default-initialised)."""
    declarations = "; ".join(f"{CTYPE.get(dtype if p.ctype == 'T' else p.ctype, p.ctype)} {p.name} = {{}}"
                             for p in kernel.in_params)
    return f"""{HEADER}typedef {CTYPE[dtype]} T;
extern "C" __global__ void check(double* out) {{ {declarations}; out[0] = {kernel.map_expr}; }}
"""


def elementwise_cases():
    for dtype in DTYPES:
        accumulate = "float64" if dtype == "float64" else "float32"
        for kind in ("maxpool_forward", "maxpool_backward", "avgpool_forward", "avgpool_backward"):
            for index in ("uint8", "uint32") if kind.startswith("max") else (None,):
                yield f"{kind}_{index}_{dtype}", kernels._pooling(kind, dtype, index), {"T": dtype}
        _, _, _, affine, backward = kernels._bn_kernels(dtype)
        yield f"bn_affine_{dtype}", affine, {"T": dtype, "A": accumulate}
        yield f"bn_backward_{dtype}", backward, {"T": dtype, "A": accumulate}
        for ndim in (2, 4, 5):
            yield f"dropout_forward_{ndim}d_{dtype}", kernels._dropout_forward(ndim), {"T": dtype, "A": accumulate}
        yield f"dropout_backward_{dtype}", kernels._dropout_backward(), {"T": dtype, "A": accumulate}
        forward, backward = kernels._relu()
        yield f"relu_forward_{dtype}", forward, {"T": dtype}
        yield f"relu_backward_{dtype}", backward, {"T": dtype}
        for name, pair in (("leaky_relu", kernels._leaky_relu(dtype)), ("tanh", kernels._tanh(dtype))):
            yield f"{name}_forward_{dtype}", pair[0], {"T": dtype, "A": accumulate}
            yield f"{name}_backward_{dtype}", pair[1], {"T": dtype, "A": accumulate}
        yield f"scale_{dtype}", kernels._scale(dtype), {"T": dtype, "A": accumulate}
        yield f"add_into_{dtype}", kernels._add(dtype), {"T": dtype}
        yield f"add_{dtype}", kernels._add2(dtype), {"T": dtype}
    for momentum in (False, True):
        for nesterov in (False, True) if momentum else (False,):
            for decay in (False, True):
                yield f"sgd_{momentum}_{nesterov}_{decay}", kernels._sgd(momentum, nesterov, decay), {"T": "float32"}


def describe_convolutions():
    """Describe the forward, data-gradient and weight-gradient graphs of every convolution case of the op tests
    (sequences, images and volumes, grouped and depthwise ones: cuDNN reads the groups from the weight's
    channels), in every data type and layout; returns how many."""
    from op_cases import CONV_CASES, GROUPED_CASES
    from spmdcnn.ops.conv import ConvGeometry
    from spmdcnn.ops.cuda import conv
    from spmdcnn.ops.window import output_extent
    count = 0
    for x_shape, w_shape, stride, padding, dilation, *_ in list(CONV_CASES.values()) + list(GROUPED_CASES.values()):
        geometry = ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2)
        extra, symmetric = conv._symmetric(geometry, w_shape[2:])
        spatial = tuple(size + sum(pad) for size, pad in zip(x_shape[2:], extra))
        y_shape = x_shape[:1] + (w_shape[0],) + tuple(output_extent(size, k, s, p, p, d) for size, k, s, p, d in zip(
            spatial, w_shape[2:], geometry.stride, symmetric, geometry.dilation))
        for kind in ("fprop", "dgrad", "wgrad"):
            for io, out in (("float32", "float32"), ("float64", "float64"), ("bfloat16", "bfloat16"),
                            ("bfloat16", "float32")):
                for layout in conv.LAYOUTS:
                    conv.describe(kind, io, out, x_shape[:2] + spatial, w_shape, y_shape, symmetric,
                                  geometry.stride, geometry.dilation, layout)
                    count += 1
    return count


def main():
    failures = total = 0
    sources = [(name, elementwise_source(kernel, types)) for name, kernel, types in elementwise_cases()]
    sources += [(kernel.name, reduction_source(kernel, dtype)) for dtype in DTYPES
                for kernel in kernels._bn_kernels(dtype)[:3]]
    for name, source in sources:
        total += 1
        log = compile_source(name, source)
        if log:
            failures += 1
            print(f"--- {name}\n{log[:1500]}")
    print(f"{total} kernels, {failures} failed to compile")
    if importlib.util.find_spec("cudnn") is not None:
        print(f"{describe_convolutions()} cuDNN convolution graphs described")
    else:
        print("cuDNN frontend not installed: convolution graphs not described (pip install nvidia-cudnn-frontend)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
