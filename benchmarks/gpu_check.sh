#!/usr/bin/env bash
# The GPU run, prepared once: everything the book claims about a CUDA GPU, checked and timed in one
# go, within 8 minutes on one H100/H200-class GPU. Whenever a GPU is available, run this first and
# put its tables (OUT_DIR/summary.md) into benchmarks/README.md with the hardware named.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]      # OUT_DIR defaults to $OUT, else ./gpu_results
#
# Pieces, in order, each under its own time limit (seconds, the sum stays under 8 minutes):
#   1-cuda-tests  pytest -m gpu tests/ (4 workers): the compiled Triton flash and paged kernels    110
#   2-flash       benchmarks/flash_gpu.py: kernel correctness, then TFLOP/s against SDPA, T = 1k, 4k  90
#   3-serving     benchmarks/serving_gpu.py on a smaller model (d 1024, 8 layers, 32 requests)      150
#   4-train       benchmarks/train_gpu.py: GPT-2 small, 10 timed steps, eager and compiled           90
# (440 s of limits, at most 460 s with the 5 s grace each; a piece cut short keeps what it printed.)
# Each piece writes OUT_DIR/NAME.out (its output; the benchmarks print markdown tables), NAME.err,
# and NAME.json (exit status, seconds and every table as JSON; tools/gpu_report.py); then
# OUT_DIR/summary.json and summary.md gather them. A failing piece does not stop the others; the
# exit status is 1 if any piece failed or ran out of time.
#
# Without CUDA it says "no CUDA", runs what each piece can do on a CPU (collect the CUDA tests, the
# serving script's --device cpu --tiny flow, and the two GPU-only scripts up to their "needs a CUDA
# GPU" exit, status 2), writes the same files, and exits 0 if all of that behaved as designed.
# tests/test_gpu_check.py runs this CPU dry run.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT_DIR="${1:-${OUT:-./gpu_results}}"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
mkdir -p "$OUT_DIR"
rm -f "$OUT_DIR"/[1-4]-*.json "$OUT_DIR"/[1-4]-*.out "$OUT_DIR"/[1-4]-*.err "$OUT_DIR"/[1-4]-*.junit.xml \
      "$OUT_DIR"/summary.json "$OUT_DIR"/summary.md   # this script's own files from an earlier run
export PYTHONUNBUFFERED=1

# run NAME LIMIT_S EXPECTED_STATUS COMMAND...: time one piece, keep its output, record it as JSON.
run() {
    local name="$1" limit="$2" expected="$3"
    shift 3
    echo "gpu_check: $name: $*"
    local start end status
    start=$(date +%s.%N)
    timeout -k 5 "$limit" "$@" >"$OUT_DIR/$name.out" 2>"$OUT_DIR/$name.err"
    status=$?
    end=$(date +%s.%N)
    "$PY" tools/gpu_report.py piece "$OUT_DIR" "$name" "$status" "$(awk "BEGIN { print $end - $start }")" "$expected" -- "$@"
}

if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    "$PY" -c "import torch; print('gpu_check:', torch.cuda.get_device_name(), 'torch', torch.__version__)"
    run 1-cuda-tests 110 0 "$PY" -m pytest -m gpu tests -n 4 -q -p no:cacheprovider -o addopts="-ra" \
        --junitxml="$OUT_DIR/1-cuda-tests.junit.xml"
    run 2-flash 90 0 "$PY" benchmarks/flash_gpu.py --seqlens 1024 4096 --head-dims 64 128
    run 3-serving 150 0 "$PY" benchmarks/serving_gpu.py --d-model 1024 --layers 8 --heads 8 --kv-heads 2 \
        --requests 32 --new 32 --reps 2
    run 4-train 90 0 "$PY" benchmarks/train_gpu.py --steps 10 --warmup 3 --batch 8
else
    echo "gpu_check: no CUDA: running each piece's CPU smoke mode instead"
    run 1-cuda-tests 120 0 "$PY" -m pytest -m gpu tests --collect-only -q -p no:cacheprovider -o addopts="" \
        --junitxml="$OUT_DIR/1-cuda-tests.junit.xml"
    run 2-flash 60 2 "$PY" benchmarks/flash_gpu.py --seqlens 1024 --head-dims 64
    run 3-serving 240 0 "$PY" benchmarks/serving_gpu.py --device cpu --tiny
    run 4-train 60 2 "$PY" benchmarks/train_gpu.py --steps 1 --warmup 1 --batch 1 --context 16
fi

"$PY" tools/gpu_report.py summary "$OUT_DIR"
