#!/usr/bin/env bash
# Builds clid._C with its CUDA kernels on a GPU machine, runs the kernel tests (also under
# compute-sanitizer) and the GPU benchmarks, each step's log in OUTDIR.
#
#   bash bench/gpu_check.sh OUTDIR [SECONDS]
#
# SECONDS (default 540) is the time the whole check may take: a step that would start after it is
# skipped and says so. PYTHON picks the interpreter (default python3); TORCH_CUDA_ARCH_LIST the
# GPU architectures to compile for (default: the visible GPU's).
set -u
out=${1:?usage: bash bench/gpu_check.sh OUTDIR [SECONDS]}
budget=${2:-540}
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

step build 240 $py -m pip install --no-build-isolation --no-deps -e .
$py -c 'import clid.ops as o; print(o.build_info()); assert o.with_cuda(), "clid._C was built without CUDA"' || exit 1
step tests 150 $py -m pytest -q -p no:cacheprovider tests/test_ops_score.py tests/test_ops_sampler.py
step bench_score 150 $py bench/bench_score.py --device cuda --dtype bfloat16 --rounds 20 --no-e2e \
    --hidden-shape 16384 768 30522
step bench_sampler 90 $py bench/bench_sampler.py --device cuda --sizes 1e7 1e8 --rounds 5 --limit 40
# the GPU tests under the sanitizer, without the 2^24-item one
gpu_tests=($py -m pytest -q -p no:cacheprovider tests/test_ops_score.py tests/test_ops_sampler.py -k "(cuda or gpu) and not above_2_24")
step memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 9 "${gpu_tests[@]}"
step racecheck 90 compute-sanitizer --tool racecheck --error-exitcode 9 "${gpu_tests[@]}"
echo "== done after $(( $(date +%s) - t0 )) s"
