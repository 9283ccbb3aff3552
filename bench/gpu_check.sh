#!/usr/bin/env bash
# The GPU check in one command (docs/GPU.md): on an H100/H200 it runs
#   1. the test suite on CUDA (TFORMER_TEST_DEVICE=cuda: the device-generic tests and tests/gpu/),
#   2. bf16 autocast + torch.compile training of GPT-2 124M at T = 1024, tformer vs HF (bench/train_throughput.py),
#   3. decode with CUDA graphs over the static cache, tformer vs HF (bench/decode_speed.py --compile),
#   4. `tformer bench` then `tformer report` on the GPU (predicted vs measured step, the GPU roofs),
# and files the results as one bench record, bench/results/gpu-<device>.json, dated and named by device
# (bench/gpu_record.py), which `tformer report` lists wherever it runs.
#
#   bash bench/gpu_check.sh                 # the whole check on cuda, record in bench/results/
#   bash bench/gpu_check.sh --smoke         # tiny sizes on the CPU, seconds: proves the script works
#   options: --results DIR (or $GPU_CHECK_RESULTS), --device cuda:N, --python EXE
#            $GPU_CHECK_REPORT_ARGS replaces the report's model/size arguments
#
# A part whose bench lacks the flags it needs is skipped with a note in the record, not failed.
# Exit status: 0 record written and every part ran or was skipped; 1 a part failed; 2 bad usage.
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
SMOKE=0
RESULTS=${GPU_CHECK_RESULTS:-}
DEVICE=""
PY=${PYTHON:-python3}
while [ $# -gt 0 ]; do
    case "$1" in
        --smoke) SMOKE=1 ;;
        --results) RESULTS=${2:?--results needs a folder}; shift ;;
        --device) DEVICE=${2:?--device needs a torch device}; shift ;;
        --python) PY=${2:?--python needs an interpreter}; shift ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

if [ "$SMOKE" = 1 ]; then
    MODE=smoke
    DEVICE=${DEVICE:-cpu}
    RESULTS=${RESULTS:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}
    LIMIT="timeout 300"  # smoke parts take seconds; a hang must not stall a test
else
    MODE=full
    DEVICE=${DEVICE:-cuda}
    RESULTS=${RESULTS:-$ROOT/bench/results}
    LIMIT=""
    if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "gpu_check: torch.cuda.is_available() is False; run on a GPU machine, or use --smoke" >&2
        exit 2
    fi
fi
mkdir -p "$RESULTS" || exit 2
WORK=${GPU_CHECK_WORK:-$RESULTS/gpu_check/$MODE-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$WORK" || exit 2
echo "gpu_check: $MODE on $DEVICE; work folder $WORK"

say() { echo "gpu_check: $*"; }
mark() { echo "$2" > "$WORK/$1.status"; say "$1: $2"; }

# True when `SCRIPT --help` lists every flag given.
has_flags() {
    local script=$1; shift
    local help
    help=$("$PY" "$script" --help 2>&1) || return 1
    for flag in "$@"; do
        grep -qE -- "${flag}([ ,=]|\]|$)" <<<"$help" || return 1  # the whole flag: not --device-map
    done
}

# Run a part: its output to WORK/<part>.log; ok, or error with the exit status.
run_part() {
    local part=$1; shift
    say "$part: $*"
    if $LIMIT "$@" >"$WORK/$part.log" 2>&1; then
        mark "$part" ok
    else
        mark "$part" "error: exit $? (see $WORK/$part.log)"
    fi
}

# 1. The test suite on the device: failures are figures (the summary line), not a failed part.
if [ "$SMOKE" = 1 ]; then TESTS=(tests/gpu/test_cuda_paths.py); else TESTS=(tests); fi
say "tests: TFORMER_TEST_DEVICE=$DEVICE pytest -q ${TESTS[*]}"
TFORMER_TEST_DEVICE=$DEVICE $LIMIT "$PY" -m pytest -q -p no:cacheprovider -rs "${TESTS[@]}" >"$WORK/tests.log" 2>&1
RC=$?
echo "$RC" > "$WORK/tests.rc"
if [ "$RC" -le 1 ] || [ "$RC" = 5 ]; then mark tests ok; else mark tests "error: pytest exit $RC"; fi
tail -n 1 "$WORK/tests.log"

# 2. Training throughput: bf16 autocast + torch.compile, GPT-2 124M at T = 1024 (smoke: tiny, eager).
TRAIN=bench/train_throughput.py
if has_flags "$TRAIN" --device --model --json; then
    if [ "$SMOKE" = 1 ]; then ARGS=(--device "$DEVICE" --model char-small --seq 16 --batch 2 --steps 1 --rounds 1)
    else ARGS=(--device "$DEVICE" --model gpt2 --seq 1024 --bf16 --compile); fi
    has_flags "$TRAIN" --no-save && ARGS+=(--no-save)  # the record below holds the figures
    run_part train "$PY" "$TRAIN" "${ARGS[@]}" --json "$WORK/train.json"
else
    mark train "skipped: $TRAIN has no --device/--model/--json yet (they come with issue 19's training bench)"
fi

# 3. Decode with CUDA graphs (torch.compile mode reduce-overhead) over the static cache, vs HF static cache.
DECODE=bench/decode_speed.py
if has_flags "$DECODE" --device --compile --json; then
    if [ "$SMOKE" = 1 ]; then
        ARGS=(--device "$DEVICE" --compile eager --models char-small --batches 1 --prompt 4 --new 4 --contexts 32 \
              --repeats 1)
    else ARGS=(--device "$DEVICE" --compile inductor --models gpt2 --batches 1,8); fi
    has_flags "$DECODE" --no-save && ARGS+=(--no-save)
    run_part decode "$PY" "$DECODE" "${ARGS[@]}" --json "$WORK/decode.json"
else
    mark decode "skipped: $DECODE has no --device/--compile yet (they come with issue 19's compiled decode)"
fi

# 4. The measured profile of the device, then the report on it.
if [ "$SMOKE" = 1 ]; then
    # No bench: the report reads the saved profile, or runs its own quick one.
    REPORT_ARGS=(--quick --no-train --no-distributed --no-long-context --batch 2 --seq 16 --set n_layers=1
                 --set d_model=32 --set n_heads=2 --set d_ff=64 --set max_positions=16)
    BENCH_OK=1
else
    # shellcheck disable=SC2206  # word splitting of the override is the point
    REPORT_ARGS=(${GPU_CHECK_REPORT_ARGS:---preset gpt2 --batch 8 --seq 1024 --no-distributed})
    say "bench: tformer bench (matmul sweep per dtype, STREAM), saved as this machine's profile"
    "$PY" -m tformer bench >"$WORK/bench.log" 2>&1 && BENCH_OK=1 || BENCH_OK=0
fi
if [ "$BENCH_OK" = 1 ]; then
    run_part report "$PY" -m tformer report --device "$DEVICE" --out "$WORK/report" "${REPORT_ARGS[@]}"
else
    mark report "error: tformer bench failed (see $WORK/bench.log)"
fi

# The record: every part, dated and named by device.
"$PY" bench/gpu_record.py --work "$WORK" --results "$RESULTS" --mode "$MODE" --device "$DEVICE" || exit 1
grep -l '^error' "$WORK"/*.status >/dev/null 2>&1 && exit 1
exit 0
