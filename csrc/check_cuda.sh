#!/usr/bin/env bash
# Compile-check every CUDA source for sm_80 and sm_90 with `nvcc -Xptxas -v`, and the CUDA ops'
# host code (csrc/cuda/*.cpp: torch's CUDA headers) with the host compiler.
# Fails on any compile error and on any register spill, and when a kernel named in TENSOR_CORE_KERNELS
# has no tensor-core instruction in its SASS (HMMA: mma.sync; HGMMA: wgmma), counted with cuobjdump
# where it is found (PATH, the CUDA toolkit, or the pip packages nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm in .venv); without it, its PTX must hold mma instructions instead.
# CUDA kernels cannot run on a machine without a GPU, but they must always compile cleanly. Without
# nvcc this check is skipped, unless CLID_REQUIRE_NVCC=1 (set by CI), where a missing nvcc is an error.
set -euo pipefail
cd "$(dirname "$0")/.."
shopt -s nullglob
sources=(csrc/cuda/*.cu)
if ! command -v nvcc >/dev/null 2>&1; then
    if [ "${CLID_REQUIRE_NVCC:-0}" = 1 ]; then echo "error: nvcc not found (CLID_REQUIRE_NVCC=1)"; exit 1; fi
    echo "cuda-check: nvcc not found, skipped"; exit 0
fi
if [ ${#sources[@]} -eq 0 ]; then echo "cuda-check: no CUDA sources yet"; exit 0; fi
TENSOR_CORE_KERNELS=(tc_head_kernel)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cuobjdump=$(command -v cuobjdump || ls "${CUDA_HOME:-/usr/local/cuda}"/bin/cuobjdump /usr/local/cuda*/bin/cuobjdump \
            .venv/lib/python3*/site-packages/nvidia/cu*/bin/cuobjdump 2>/dev/null | head -n 1 || true)
[ -z "$cuobjdump" ] || export PATH="$(dirname "$cuobjdump"):$PATH"  # (its nvdisasm beside it)

# tensor_core_check SRC ARCH OBJECT: every function of a TENSOR_CORE_KERNELS kernel holds HMMA or HGMMA
tensor_core_check() {
    local src=$1 arch=$2 obj=$3 name counts
    for name in "${TENSOR_CORE_KERNELS[@]}"; do
        grep -q "$name" "$src" || continue
        if [ -n "$cuobjdump" ]; then
            counts=$("$cuobjdump" --dump-sass "$obj" | awk -v k="$name" '
                /Function :/ { f = index($0, k) > 0; if (f) { n++; c[n] = 0 } }
                f && /[^A-Z](HMMA|HGMMA)[.]/ { c[n]++ }
                END { for (i = 1; i <= n; i++) printf "%d ", c[i] }')
            if [ -z "$counts" ] || [[ " $counts" == *" 0 "* ]]; then
                echo "cuda-check: $name in $src for sm_$arch has no HMMA/HGMMA in its SASS (${counts:-no such function})"
                return 1
            fi
            echo "cuda-check: $name sm_$arch: HMMA/HGMMA instructions per instantiation: $counts"
        else
            counts=$(nvcc -ptx -o - -std=c++17 -O3 -DNDEBUG -arch=sm_$arch -DCLID_WITH_CUDA -Icsrc "$src" 2>/dev/null |
                     awk -v k="$name" '/^[.]visible|^[.]entry|^[.]weak/ { f = index($0, k) > 0 } f && /mma[.]sync|wgmma/ { c++ }
                                       END { print c + 0 }')
            if [ "$counts" = 0 ]; then echo "cuda-check: $name in $src for sm_$arch has no mma in its PTX"; return 1; fi
            echo "cuda-check: $name sm_$arch: $counts mma instructions in its PTX (SASS not checked: no cuobjdump)"
        fi
    done
}

status=0
for src in "${sources[@]}"; do
    for arch in 80 90; do
        obj="$tmp/$(basename "$src").sm_$arch.o"
        if ! log=$(nvcc -c -o "$obj" -std=c++17 -O3 -DNDEBUG -arch=sm_$arch -Xptxas -v -DCLID_WITH_CUDA -Icsrc "$src" 2>&1); then
            echo "$log"; echo "cuda-check: FAILED to compile $src for sm_$arch"; status=1; continue
        fi
        spills=$(echo "$log" | grep -E "[1-9][0-9]* bytes spill (stores|loads)" || true)
        if [ -n "$spills" ]; then
            echo "$log" | grep -B2 -E "[1-9][0-9]* bytes spill" ; echo "cuda-check: register spills in $src for sm_$arch"; status=1
        else
            kernels=$(echo "$log" | grep -c "Compiling entry function" || true)
            echo "cuda-check: $src sm_$arch ok ($kernels kernels, no spills)"
        fi
        tensor_core_check "$src" "$arch" "$obj" || status=1
        rm -f "$obj"
    done
done
# The host code: torch's headers and the toolkit's. A CPU build of torch ships the CUDA headers but
# not the one its CMake writes (c10/cuda/impl/cuda_cmake_macros.h): an empty stand-in replaces it.
PY=${PY:-.venv/bin/python}
torch_include=$("$PY" -c "from torch.utils.cpp_extension import include_paths; print(' '.join('-I' + p for p in include_paths()))")
cuda_include=$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ INCLUDES="\(.*\)" *$/\1/p' | head -1)
stub=$tmp/stub
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
