#!/usr/bin/env bash
# Downloads, where pip reaches PyPI, the wheels that bench/gpu_check.sh installs on a GPU machine that has no
# package index: CTranslate2 (03 --engine ctranslate2) and Cut Cross-Entropy (a peer of token_logprob_hidden),
# for the GPU machine's Python (default 3.12, x86-64), into .cache/wheels (about 43 MB; ignored by git).
#
#   bash bench/gpu_wheels.sh [PYTHON_VERSION]
set -eu
version=${1:-3.12}
cd "$(dirname "$0")/.."
mkdir -p .cache/wheels
ct2=$(grep -E '^ctranslate2==' requirements.txt | cut -d' ' -f1)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .cache/wheels "$ct2"
python3 -m pip download -q --no-deps --only-binary=:all: -d .cache/wheels cut-cross-entropy==25.1.1
ls -l .cache/wheels
