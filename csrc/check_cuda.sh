#!/usr/bin/env bash
# Compile-check every CUDA source for sm_80 and sm_90 with `nvcc -Xptxas -v`, and the CUDA ops'
# host code (csrc/cuda/*.cpp: torch's CUDA headers) with the host compiler.
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
        if ! log=$(nvcc -c -o /dev/null -std=c++17 -O3 -DNDEBUG -arch=sm_$arch -Xptxas -v -DCLID_WITH_CUDA -Icsrc "$src" 2>&1); then
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
# The host code: torch's headers and the toolkit's. A CPU build of torch ships the CUDA headers but
# not the one its CMake writes (c10/cuda/impl/cuda_cmake_macros.h): an empty stand-in replaces it.
PY=${PY:-.venv/bin/python}
torch_include=$("$PY" -c "from torch.utils.cpp_extension import include_paths; print(' '.join('-I' + p for p in include_paths()))")
cuda_include=$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ INCLUDES="\(.*\)" *$/\1/p' | head -1)
stub=$(mktemp -d)
trap 'rm -rf "$stub"' EXIT
mkdir -p "$stub/c10/cuda/impl"
[ -n "$(find ${torch_include//-I/} -path '*c10/cuda/impl/cuda_cmake_macros.h' 2>/dev/null | head -1)" ] || \
    printf '#pragma once\n' > "$stub/c10/cuda/impl/cuda_cmake_macros.h"
for src in csrc/cuda/*.cpp; do
    if ! log=$(${CXX:-c++} -std=c++20 -fsyntax-only -Wall -DCLID_WITH_CUDA -Icsrc $torch_include -I"$stub" \
               $cuda_include "$src" 2>&1); then
        echo "$log"; echo "cuda-check: FAILED to compile $src (host code)"; status=1
    else
        echo "cuda-check: $src host code ok"
    fi
done
exit $status
