#!/usr/bin/env bash
# Compile-check every CUDA source for sm_80 and sm_90 with `nvcc -Xptxas -v`.
# Fails on any compile error and on any register spill. CUDA kernels cannot run on a machine
# without a GPU, but they must always compile cleanly. Without nvcc this check is skipped,
# unless CLID_REQUIRE_NVCC=1 (set by CI), where a missing nvcc is an error.
set -euo pipefail
cd "$(dirname "$0")/.."
shopt -s nullglob
sources=(csrc/cuda/*.cu)
if ! command -v nvcc >/dev/null 2>&1; then
    if [ "${CLID_REQUIRE_NVCC:-0}" = 1 ]; then echo "error: nvcc not found (CLID_REQUIRE_NVCC=1)"; exit 1; fi
    echo "cuda-check: nvcc not found, skipped"; exit 0
fi
if [ ${#sources[@]} -eq 0 ]; then echo "cuda-check: no CUDA sources yet"; exit 0; fi
status=0
for src in "${sources[@]}"; do
    for arch in 80 90; do
        if ! log=$(nvcc -c -o /dev/null -std=c++17 -O3 -arch=sm_$arch -Xptxas -v -DCLID_WITH_CUDA -Icsrc "$src" 2>&1); then
            echo "$log"; echo "cuda-check: FAILED to compile $src for sm_$arch"; status=1; continue
        fi
        spills=$(echo "$log" | grep -E "[1-9][0-9]* bytes spill (stores|loads)" || true)
        if [ -n "$spills" ]; then
            echo "$log" | grep -B2 -E "[1-9][0-9]* bytes spill" ; echo "cuda-check: register spills in $src for sm_$arch"; status=1
        else
            kernels=$(echo "$log" | grep -c "Compiling entry function" || true)
            echo "cuda-check: $src sm_$arch ok ($kernels kernels, no spills)"
        fi
    done
done
exit $status
