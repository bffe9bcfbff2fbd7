#!/usr/bin/env bash
# The whole GPU check in one command, in sections, each with its own time limit and log in OUTDIR:
#   env        the GPU, the driver, torch, compute-sanitizer (printed only)
#   build      clid._C with its CUDA kernels (pip install --no-build-isolation --no-deps -e ., CLID_CUDA=1),
#              with the machine's own torch, whatever its version
#   ct2        CTranslate2 for 03 --engine ctranslate2: installed from .cache/wheels (bench/gpu_wheels.sh) where
#              it is missing, CUDA 12's cuBLAS found or stood in for, then a probe (a tiny random Pegasus, the
#              same greedy ids on the GPU as on the CPU); where it cannot run, the log says why and 03's rows
#              fall back to transformers
#   tests      every GPU test (tests skipped without a GPU, tests/gpu_only.py), then, in a pytest of their own,
#              those that expect a device-side assertion (it ends the CUDA context of its process)
#   memcheck   compute-sanitizer --tool memcheck over the kernel tests (0 errors expected; said so where the
#              tool is absent)
#   bench      bench/bench_gpu.py with what is left of the time (bench_gpu.json: its rows, written row by row)
# then a summary (summary.txt): each section's exit status and seconds. Exit status 0 when every section passed.
#
#   bash bench/gpu_check.sh OUTDIR [SECONDS]                 # on the GPU machine (default 470 s in all)
#   bash bench/gpu_check.sh --cpu-dry-run OUTDIR [SECONDS]   # here: the same steps at tiny sizes, those
#                                                            # that need CUDA said and skipped
#
# OUTDIR receives at most 7 files (build.log ct2.log tests.log memcheck.log bench_gpu.log bench_gpu.json
# summary.txt). PYTHON picks the interpreter (default python3); TORCH_CUDA_ARCH_LIST the GPU architectures
# to compile for (default: the visible GPU's).
set -u
dry=0
if [[ ${1:-} == --cpu-dry-run ]]; then dry=1; shift; fi
out=${1:?usage: bash bench/gpu_check.sh [--cpu-dry-run] OUTDIR [SECONDS]}
budget=${2:-470}
if ! [[ $budget =~ ^[0-9]+$ ]] || (( budget < 60 )); then
    echo "error: SECONDS must be a whole number of seconds, at least 60, not '$budget'" >&2; exit 2
fi
mkdir -p "$out" && out=$(cd "$out" && pwd) || { echo "error: cannot write to $out" >&2; exit 2; }
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} TOKENIZERS_PARALLELISM=false
t0=$(date +%s)
failed=0
: > "$out/summary.txt"

left() { echo $(( budget - ($(date +%s) - t0) )); }

step() {  # step NAME LOG LIMIT COMMAND...: run it with a time limit, appending to OUTDIR/LOG; show its tail
    local name=$1 log=$2 limit=$3; shift 3
    local rest; rest=$(left)
    if (( rest < 15 )); then
        echo "== $name: skipped (${rest} s of the budget left)" | tee -a "$out/summary.txt"; failed=1; return 1
    fi
    (( limit > rest - 5 )) && limit=$(( rest - 5 ))
    echo "== $name (at most ${limit} s, at $(( $(date +%s) - t0 )) s): $*"
    echo "== $name: $*" >> "$out/$log"
    local start; start=$(date +%s)
    timeout -k 5 "$limit" "$@" >> "$out/$log" 2>&1
    local rc=$?
    local note=""
    (( rc == 124 || rc == 137 )) && note=" (stopped by its time limit)"
    echo "== $name: exit $rc after $(( $(date +%s) - start )) s$note" | tee -a "$out/summary.txt"
    tail -n "${TAIL:-15}" "$out/$log"
    (( rc == 0 )) || failed=1
    return $rc
}

# ---- env
echo "== env"
if (( dry )); then
    echo "CPU dry run: the GPU sections run at tiny sizes on the CPU, or say what they would run"
else
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
fi
$py -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
torch.cuda.get_device_name() if torch.cuda.is_available() else "(no GPU)")'
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
echo "compute-sanitizer: ${sanitizer:-not found}; $(env -u OMP_NUM_THREADS nproc) CPU cores; budget $budget s"

# ---- build
if (( dry )); then
    echo "== build: dry run: the extension built here is used (on the GPU: CLID_CUDA=1 pip install -e .)"
    $py -c 'import clid.ops as o; print(o.build_info())' | tee -a "$out/build.log"
else
    export CLID_CUDA=1 MAX_JOBS=${MAX_JOBS:-$(env -u OMP_NUM_THREADS nproc)}
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$($py -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')}
    step build build.log 180 $py -m pip install --no-build-isolation --no-deps -e .
    if ! $py -c 'import clid.ops as o; print(o.build_info()); assert o.with_cuda(), "clid._C was built without CUDA"' \
        2>&1 | tee -a "$out/build.log"; then
        echo "== build: clid._C has no CUDA kernels; nothing else can be checked" | tee -a "$out/summary.txt"
        exit 1
    fi
fi

# ---- ct2: CTranslate2 for 03, from the carried wheels where the machine lacks it
device=cuda; (( dry )) && device=cpu
ct2_ready() { $py -c "from clid.selfgen import ct2_pegasus as c; why = c.available('$device'); print(why or 'ready'); raise SystemExit(bool(why))"; }
{
    if ! $py -c 'import ctranslate2' 2>/dev/null; then
        tag=$($py -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
        wheels=$(ls .cache/wheels/ctranslate2-*-"$tag"-*.whl .cache/wheels/cut_cross_entropy-*.whl 2>/dev/null)
        if [[ -n $wheels ]]; then
            echo "installing $wheels into /tmp/clid-site (--no-deps: the machine's own torch stays)"
            $py -m pip install -q --no-index --no-deps --no-compile --target /tmp/clid-site $wheels \
                && export PYTHONPATH=$PYTHONPATH:/tmp/clid-site
        else
            echo "no ctranslate2 wheel for $tag in .cache/wheels (bash bench/gpu_wheels.sh makes them)"
        fi
    fi
    if (( ! dry )) && ! $py -c 'import ctypes; ctypes.CDLL("libcublas.so.12"); ctypes.CDLL("libcublasLt.so.12")' 2>/dev/null; then
        # CTranslate2's CUDA wheel loads CUDA 12's cuBLAS by name: look for it, else stand in CUDA 13's
        dirs=$($py -c 'import glob, site; print(" ".join(glob.glob(p + "/nvidia/*/lib") for p in site.getsitepackages()))' 2>/dev/null)
        found=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib /usr/lib/x86_64-linux-gnu $dirs \
            -maxdepth 1 -name 'libcublasLt.so.12*' 2>/dev/null | head -n 1)
        if [[ -n $found ]]; then
            echo "CUDA 12's cuBLAS: $found"
            export LD_LIBRARY_PATH=$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        else
            lt=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib /usr/lib/x86_64-linux-gnu $dirs \
                -maxdepth 1 -name 'libcublasLt.so.13' 2>/dev/null | head -n 1)
            if [[ -n $lt ]]; then
                echo "no CUDA 12 cuBLAS on this machine; trying CUDA 13's ($lt) under the 12 names (an experiment)"
                mkdir -p /tmp/clid-cublas12
                for v in 12 13; do
                    ln -sf "$lt" /tmp/clid-cublas12/libcublasLt.so.$v
                    ln -sf "$(dirname "$lt")/libcublas.so.13" /tmp/clid-cublas12/libcublas.so.$v
                done
                export LD_LIBRARY_PATH=/tmp/clid-cublas12${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            else
                echo "no cuBLAS 12 or 13 library found"
            fi
        fi
    fi
} >> "$out/ct2.log" 2>&1
saved_ld=${LD_LIBRARY_PATH:-}
# the probe: a tiny random Pegasus through CTranslate2 on the device and on the CPU, greedy, the same ids expected
cat > /tmp/clid-ct2-probe.py <<'EOF'
import sys, tempfile, torch
from transformers import PegasusConfig, PegasusForConditionalGeneration
from clid.selfgen import ct2_pegasus
device = sys.argv[1]
why = ct2_pegasus.available(device)
print(f"ctranslate2 on {device}:", why or "ready")
if why:
    raise SystemExit(1)
torch.manual_seed(0)
config = PegasusConfig(vocab_size=500, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
                       pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
model = PegasusForConditionalGeneration(config).eval()
folder = tempfile.mkdtemp()
spec = ct2_pegasus.model_spec(model)
spec.validate(); spec.optimize(quantization=None); spec.save(folder)
ids = [torch.randint(2, 500, (n,)).tolist() + [1] for n in range(4, 36, 2)]
out = {d: ct2_pegasus.Translator(folder, d, "fp32", 4).generate(ids, 1, 24, model.generation_config, 16)
       for d in ("cpu", device)}
alike = sum(a == b for a, b in zip(out["cpu"], out[device]))
print(f"greedy ids alike on the CPU and {device}: {alike} of {len(ids)}")
raise SystemExit(0 if alike == len(ids) else 1)
EOF
before=$failed
if ! TAIL=8 step ct2 ct2.log 90 $py /tmp/clid-ct2-probe.py $device; then
    if [[ -d /tmp/clid-cublas12 ]]; then export LD_LIBRARY_PATH=$saved_ld; rm -rf /tmp/clid-cublas12; fi
    echo "== ct2: CTranslate2 cannot run here (ct2.log says why); 03's rows fall back to transformers" \
        | tee -a "$out/summary.txt"
    failed=$before  # (the engine is optional: its absence is reported, not a failed check)
fi

# ---- tests: every GPU test; those expecting a device-side assertion in a pytest of their own
gpu_files=$(grep -rl -E 'skipif' --include='test_*.py' tests | xargs grep -l 'GPU')
pytest_gpu=($py -m pytest -q -s -rsfE -p no:cacheprovider -p gpu_only)
export PYTHONPATH=$PYTHONPATH:$PWD/tests
CLID_GPU_TESTS=rest step tests tests.log 150 "${pytest_gpu[@]}" $gpu_files
CLID_GPU_TESTS=assert step tests_assert tests.log 60 "${pytest_gpu[@]}" $gpu_files

# ---- memcheck
memcheck=("${pytest_gpu[@]}" tests/ops/test_ops_score.py tests/ops/test_ops_sampler.py tests/ops/test_fused_head.py
          -k "not above_2_24 and not memory_is_bounded and not benchmark_shape")
if (( dry )); then
    echo "== memcheck: dry run, no CUDA: on the GPU it runs compute-sanitizer --tool memcheck --error-exitcode 9 ${memcheck[*]}" \
        | tee -a "$out/memcheck.log" "$out/summary.txt"
elif [[ -z $sanitizer ]]; then
    echo "== memcheck: not run: compute-sanitizer is not on this machine (PATH, /usr/local/cuda*/bin)" \
        | tee -a "$out/memcheck.log" "$out/summary.txt"
else
    CLID_GPU_TESTS=rest step memcheck memcheck.log 120 "$sanitizer" --tool memcheck --error-exitcode 9 "${memcheck[@]}"
    errors=$(grep -h 'ERROR SUMMARY' "$out/memcheck.log" | tail -n 1)
    echo "memcheck: ${errors:-no ERROR SUMMARY line (stopped before the end?)}" | tee -a "$out/summary.txt"
fi

# ---- bench: the rest of the time
sections=${BENCH_SECTIONS:-kernels train train04 paraphrase score}
bench=(bench/bench_gpu.py --sections $sections --json "$out/bench_gpu.json")
(( dry )) && bench+=(--smoke --repeats 2)
rest=$(left)
TAIL=${TAIL_BENCH:-60} step bench bench_gpu.log $(( rest - 5 )) $py "${bench[@]}" --budget $(( rest - 45 > 30 ? rest - 45 : 30 ))

echo "== summary, after $(( $(date +%s) - t0 )) s of $budget"
cat "$out/summary.txt"
exit $failed
