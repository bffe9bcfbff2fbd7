#!/usr/bin/env bash
# Builds clid._C with its CUDA kernels on a GPU machine, runs the GPU tests, then bench/bench_gpu.py
# (every row of the GPU table beside its bound, and the COCO recipe's GPU-hours), then, with the time
# left, the kernel benchmarks and the GPU tests under compute-sanitizer; each step's log in OUTDIR
# (bench_gpu.json: the table's rows).
#
#   bash bench/gpu_check.sh OUTDIR [SECONDS]
#
# SECONDS (default 570, under one device call's 600) is the time the whole check may take: a step
# that would start after it is skipped and says so. PYTHON picks the interpreter (default python3); TORCH_CUDA_ARCH_LIST the
# GPU architectures to compile for (default: the visible GPU's).
set -u
out=${1:?usage: bash bench/gpu_check.sh OUTDIR [SECONDS]}
budget=${2:-570}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 CLID_CUDA=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$($py -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')}
t0=$(date +%s)

step() {  # step NAME LIMIT_SECONDS COMMAND...: run it with a time limit, log to OUTDIR/NAME.log, show its tail
    local name=$1 limit=$2; shift 2
    local left=$(( budget - ($(date +%s) - t0) ))
    if (( left < 20 )); then echo "== $name: skipped (${left} s of the budget left)"; return; fi
    (( limit > left )) && limit=$left
    echo "== $name (at most ${limit} s): $*"
    local start=$(date +%s)
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    echo "== $name: exit $? after $(( $(date +%s) - start )) s"
    tail -n "${TAIL:-12}" "$out/$name.log"
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
echo "arch $TORCH_CUDA_ARCH_LIST, $MAX_JOBS jobs"

step build 200 $py -m pip install --no-build-isolation --no-deps -e .
$py -c 'import clid.ops as o; print(o.build_info()); assert o.with_cuda(), "clid._C was built without CUDA"' || exit 1
# the GPU tests: the kernels against their references, padded against grouped passes, bf16 within its bounds
step tests 90 $py -m pytest -q -p no:cacheprovider tests/test_ops_score.py tests/test_ops_sampler.py \
    tests/test_model.py -k "cuda or gpu"
left=$(( budget - ($(date +%s) - t0) - 30 ))
step bench_gpu $left $py bench/bench_gpu.py --budget $(( left - 90 )) --json "$out/bench_gpu.json"
TAIL=40 step bench_gpu_table 5 tail -n 40 "$out/bench_gpu.log"
step bench_score 100 $py bench/bench_score.py --device cuda --dtype bfloat16 --rounds 20 --no-e2e \
    --hidden-shape 16384 768 30522
# the GPU tests under the sanitizer, without the 2^24-item one
gpu_tests=($py -m pytest -q -p no:cacheprovider tests/test_ops_score.py tests/test_ops_sampler.py -k "(cuda or gpu) and not above_2_24 and not memory_is_bounded and not device_assertion")
step memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 9 "${gpu_tests[@]}"
echo "== done after $(( $(date +%s) - t0 )) s"
