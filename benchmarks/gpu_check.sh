#!/usr/bin/env bash
# Issue 6's GPU checks in one run, on the GPU machine of ../shared/DEVICE.md (one H200, CuPy 14, Open MPI 4.1
# that is not CUDA-aware, no network):
#   1. the op tests on CuPy against NumPy float64 (tests/ops/test_cuda_ops.py);
#   2. plans on CuPy through each transport that can work, on 2 ranks sharing the GPU (tests/mpi/test_transport.py);
#   3. training from the command line: 2 ranks sharing the GPU under a layer-wise plan over host staging against
#      1 rank, the refusal of more ranks than GPUs, bfloat16 against float32 (tests/test_gpu.py);
#   4. spmdcnn profile and calibrate on the GPU (tile times for the planner; the GPU's rates and the links through
#      the transport, 2 ranks sharing the GPU);
#   5. spmdcnn against PyTorch: AlexNet 128, VGG-16 64, Inception-v3 64, fp32 and bf16 (benchmarks/gpu_vs_torch.py).
# Every step runs even when an earlier one fails; the outputs go to $OUT (default /tmp/gpu_check), with a summary.
#
# What the machine lacks travels as wheels in .wheels/ (git-ignored; carry it): nvidia-cudnn-frontend and
# ml_dtypes for its Python 3.12, and pytest with pytest-timeout. Fetch them here with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#       -d .wheels nvidia-cudnn-frontend==1.32.0 ml_dtypes pytest pytest-timeout pluggy iniconfig packaging pygments
# and run on the machine: bash benchmarks/gpu_check.sh   (at most 570 s of steps)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
DEPS=/tmp/spmdcnn_gpu_deps
missing=()
for module in cudnn ml_dtypes pytest pytest_timeout; do
    python3 -c "import $module" 2>/dev/null || missing+=("$module")
done
if [ ${#missing[@]} -gt 0 ] && ls .wheels/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-deps --target "$DEPS" .wheels/*.whl > "$OUT/install.txt" 2>&1
fi
export PYTHONPATH="$PWD:$DEPS${PYTHONPATH:+:$PYTHONPATH}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export SPMDCNN_CACHE="$OUT/cache" PYTHONUNBUFFERED=1 SPMDCNN_REQUIRE_GPU=1   # GPU tests fail, not skip, without one

python3 - > "$OUT/environment.txt" 2>&1 <<'EOF'
import cupy, numpy
print("cupy", cupy.__version__, "numpy", numpy.__version__)
print("device", cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "count",
      cupy.cuda.runtime.getDeviceCount())
try:
    import cudnn
    print("cudnn frontend", cudnn.__version__, "backend", cudnn.backend_version())
except Exception as error:
    print("cudnn frontend: not usable:", error)
from cupy.cuda import nccl
print("nccl available", nccl.available, nccl.get_version() if nccl.available else "")
from spmdcnn.comm.transport import cuda_aware_mpi
print("cuda-aware MPI", cuda_aware_mpi())
try:
    import ml_dtypes
    x = cupy.arange(8, dtype=cupy.float32).astype(ml_dtypes.bfloat16)
    print("bfloat16 on CuPy:", x.dtype, (x + x).astype(cupy.float32).get())
except Exception as error:
    print("bfloat16 on CuPy: not usable:", error)
EOF

status=0
step() {        # step NAME SECONDS COMMAND...: run, keep the output, note the result
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && status=1
    echo "$name: exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
    tail -n 3 "$OUT/$name.txt" | sed 's/^/    /' | tee -a "$OUT/summary.txt"
}
: > "$OUT/summary.txt"
# the limits add up to 570 s: one call of the device tool (at most 600 s)
step ops 80 python3 -m pytest tests/ops/test_cuda_ops.py -q -p no:cacheprovider --timeout 60 -rs
step transports 80 mpiexec -n 2 python3 -m mpi4py -m pytest tests/mpi/test_transport.py -q -p no:cacheprovider \
    --timeout 70 -rs
step training 130 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider --timeout 120 -rs
step profile 40 python3 -m spmdcnn.cli profile models/small_resnet.yaml --batch 8 --devices 2 --backend cupy \
    --repeats 2 -o "$OUT/profile.json"
step calibrate 30 mpiexec -n 2 python3 -m spmdcnn.cli calibrate --quick --backend cupy --share-gpus \
    -o "$OUT/h200.yaml" --name h200
step vs_torch 210 python3 benchmarks/gpu_vs_torch.py --steps 5 --warmup 2 --json "$OUT/vs_torch.json"
cat "$OUT/environment.txt" "$OUT/summary.txt"
grep -A8 "^| model" "$OUT/vs_torch.txt"
exit $status
