#!/usr/bin/env bash
# The GPU run, prepared once: everything the book claims about a CUDA GPU, checked and timed in one
# go, within 9 minutes on one H100/H200-class GPU. Whenever a GPU is available, run this first and
# put its tables (OUT_DIR/summary.md) into benchmarks/README.md with the hardware named.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]      # OUT_DIR defaults to $OUT, else ./gpu_results
#
# Pieces, in order, each under its own time limit (seconds; the limits sum to 500, at most 530 s
# with the 5 s grace each; the H200 run of 2026-12-04 took 39, 25, -, 43 s for pieces 1, 2, 5):
#   1-cuda-tests        pytest -m gpu tests/ (4 workers): the compiled Triton flash and paged kernels   60
#   2-flash             benchmarks/flash_gpu.py: kernel correctness, then TFLOP/s against SDPA          40
#   3-serving           benchmarks/serving_gpu.py, eager: correctness (float32 tokens == transformers,
#                       bf16 logits against float32), timing against transformers, decode bandwidth      75
#   4-serving-compiled  the same timing with Engine(compile=True): its warm-up (the compile) is timed
#                       in its own piece and reported in the table's warm-up column                     100
#   5-train             benchmarks/train_gpu.py: GPT-2 small, 10 timed steps, eager and compiled         55
#   6-chapters          benchmarks/chapters_gpu.py: every chapter in the gpu profile (nbval-lax, 7 at a
#                       time), each chapter's time and status in one table                              170
# (a piece cut short keeps what it printed.) Each piece writes OUT_DIR/NAME.out (its output; the
# benchmarks print markdown tables), NAME.err, and NAME.json (exit status, seconds and every table as
# JSON; tools/gpu_report.py); then OUT_DIR/summary.json and summary.md gather them. A failing piece does
# not stop the others; the exit status is 1 if any piece failed or ran out of time.
#
# Offline machines: a stock CUDA image lacks the notebook stack (nbformat, nbclient, ipykernel, nbval,
# ipywidgets, matplotlib, datasets, ...). If gpu_bundle/ (tools/gpu_bundle.py, built where a package
# index is reachable) is here and nbval is not importable, its wheels are installed with no network into
# gpu_bundle/site (put on PYTHONPATH) and its corpora unpacked into data/derived/.
#
# Without CUDA it says "no CUDA", runs what each piece can do on a CPU (collect the CUDA tests, the
# serving script's --device cpu --tiny flow, the two GPU-only scripts up to their "needs a CUDA GPU"
# exit, status 2, and chapter 1 in the gpu profile's dry run), writes the same files, and exits 0 if all
# of that behaved as designed. tests/test_gpu_check.py runs this CPU dry run.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT_DIR="${1:-${OUT:-./gpu_results}}"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
mkdir -p "$OUT_DIR"
rm -f "$OUT_DIR"/[1-9]-*.json "$OUT_DIR"/[1-9]-*.out "$OUT_DIR"/[1-9]-*.err "$OUT_DIR"/[1-9]-*.junit.xml \
      "$OUT_DIR"/summary.json "$OUT_DIR"/summary.md   # this script's own files from an earlier run
export PYTHONUNBUFFERED=1

if [ -f gpu_bundle/requirements.txt ] && ! "$PY" -c "import nbval" 2>/dev/null; then
    echo "gpu_check: installing the offline bundle (gpu_bundle/) into gpu_bundle/site"
    "$PY" -m pip install --quiet --no-index --no-deps --find-links gpu_bundle/wheels --target gpu_bundle/site \
        -r gpu_bundle/requirements.txt
    export PYTHONPATH="$PWD/gpu_bundle/site${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -f gpu_bundle/corpora.tar.xz ] && [ ! -d data/derived ]; then
    tar -xJf gpu_bundle/corpora.tar.xz
fi

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
    run 1-cuda-tests 60 0 "$PY" -m pytest -m gpu tests -n 4 -q -p no:cacheprovider -o addopts="-ra" \
        --junitxml="$OUT_DIR/1-cuda-tests.junit.xml"
    run 2-flash 40 0 "$PY" benchmarks/flash_gpu.py --seqlens 1024 4096 --head-dims 64 128
    run 3-serving 75 0 "$PY" benchmarks/serving_gpu.py --d-model 1024 --layers 8 --heads 8 --kv-heads 2 \
        --requests 32 --new 32 --reps 2 --no-compile
    run 4-serving-compiled 100 0 "$PY" benchmarks/serving_gpu.py --d-model 1024 --layers 8 --heads 8 \
        --kv-heads 2 --requests 32 --new 32 --reps 2 --skip check bandwidth
    run 5-train 55 0 "$PY" benchmarks/train_gpu.py --steps 10 --warmup 3 --batch 8
    run 6-chapters 170 0 "$PY" benchmarks/chapters_gpu.py --jobs 7 --timeout 160 --log "$OUT_DIR/6-chapters.log" \
        --times "$OUT_DIR/chapter_times_gpu.json"
else
    echo "gpu_check: no CUDA: running each piece's CPU smoke mode instead"
    run 1-cuda-tests 120 0 "$PY" -m pytest -m gpu tests --collect-only -q -p no:cacheprovider -o addopts="" \
        --junitxml="$OUT_DIR/1-cuda-tests.junit.xml"
    run 2-flash 60 2 "$PY" benchmarks/flash_gpu.py --seqlens 1024 --head-dims 64
    run 3-serving 240 0 "$PY" benchmarks/serving_gpu.py --device cpu --tiny
    run 4-serving-compiled 60 2 "$PY" benchmarks/serving_gpu.py --skip check bandwidth
    run 5-train 60 2 "$PY" benchmarks/train_gpu.py --steps 1 --warmup 1 --batch 1 --context 16
    run 6-chapters 180 0 "$PY" benchmarks/chapters_gpu.py --dry-run --jobs 1 --timeout 170 \
        --log "$OUT_DIR/6-chapters.log" --times "$OUT_DIR/chapter_times_gpu.json" book/ch01_attention.ipynb
fi

"$PY" tools/gpu_report.py summary "$OUT_DIR"
