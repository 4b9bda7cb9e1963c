#!/usr/bin/env bash
# The GPU check, one command on a bare CUDA machine from a fresh copy of the tree, no network:
#   bash benchmarks/gpu/run.sh [quick] [STEP ...]
# STEPs: doctor, selftest, tests, real (the real-size bench: GPT-2 small, ResNet-50, ResNet-18,
# a 6-layer encoder; benchmarks/gpu/real_size.py), bench (every toy workload of `autoopt bench`)
# or bench:NAME (one: cnn, mlp, transformer, lstm, deep_linear).
#   quick: ONE device call. Default steps doctor selftest tests real, all under one time budget,
#     QUICK_BUDGET seconds (default 450) counted from the script's start: each step but the last
#     gets at most its share (doctor 45 s, selftest --quick 150 s, tests 90 s, never more than
#     leaves the bench 120 s), and the real-size bench gets what is left; it starts no
#     configuration the time left cannot cover and says which it skipped and why.
#   full (no `quick`): default steps doctor selftest tests bench, each bounded to STEP_TIMEOUT
#     (540 s): longer than one 10-minute call, so run it in parts, e.g. `run.sh doctor selftest
#     tests`, then `run.sh bench:cnn bench:mlp`, and so on (each part checks the machine and
#     installs the wheels again: seconds).
# What the machine must bring (checked first, with a message naming what is missing):
#   * a python3 (or $PYTHON) with a CUDA build of torch >= 2.4 that sees the GPU; the lent
#     H100/H200 image has one (python3 = /opt/torch/.venv/bin/python3, torch 2.11.0+cu130);
#     no torch wheel travels with the tree (a CUDA torch is gigabytes; this CPU machine has none);
#   * click, packaging, pathspec, pytest (the image has them), accelerate and lightning for the
#     peers in the bench (the image has them; without them the bench leaves the peers out);
#   * libcst and pyflakes, which the image lacks, and the peer pytorch-autotune: as wheels in
#     .whl/, made where PyPI is reachable by `bash benchmarks/gpu/wheels.sh` and carried with
#     the tree (without the pytorch-autotune wheel its rows say "not installed").
# autoopt itself runs from the tree (PYTHONPATH; pure Python, nothing to build). The steps:
#   1. autoopt doctor --json                    (what torch and the device can do)
#   2. autoopt selftest [--quick] --json        (every pass against torch's own loop, timed)
#   3. the CUDA branches of the runtime tests   (pytest -m "not slow", five files)
#   4. real: python -m benchmarks.gpu.real_size (eager fp32, optimize(), bf16 eager, compile,
#      Accelerate bf16, optimize(tune=True), pytorch-autotune; baseline rerun; CUDA events)
#      bench: autoopt bench on CUDA with the peers, one workload at a time
# Results go to $OUT (the device tool's folder) or ./gpu-results; copy the tables into
# docs/benchmarks/gpu.md with the device's name. Exit status: 0 when every step ran and the
# selftest passed, 1 when a check failed or a step ran out of its time, 2 when the machine lacks
# something above.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-results}"
mkdir -p "$OUT"
MODE=full
if [ "${1:-}" = quick ]; then MODE=quick; shift; fi
STEPS_ASKED=("$@")
if [ ${#STEPS_ASKED[@]} = 0 ]; then
  if [ "$MODE" = quick ]; then STEPS_ASKED=(doctor selftest tests real); else STEPS_ASKED=(doctor selftest tests bench); fi
fi
WORKLOADS=(cnn mlp transformer lstm deep_linear)
wants() { local s; for s in "${STEPS_ASKED[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
for s in "${STEPS_ASKED[@]}"; do
  case "$s" in
    doctor|selftest|tests|real|bench) ;;
    bench:*) [[ " ${WORKLOADS[*]} " == *" ${s#bench:} "* ]] || { echo "run.sh: unknown workload in $s (${WORKLOADS[*]})" >&2; exit 2; } ;;
    *) echo "run.sh: unknown step $s (doctor, selftest, tests, real, bench, bench:NAME)" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-python3}"
SITE="${AUTOOPT_SITE:-/tmp/autoopt-site}"
export PYTHONUNBUFFERED=1
LIMIT="${STEP_TIMEOUT:-540}"  # seconds per step: one step and the checks fit a 10-minute call
BUDGET="${QUICK_BUDGET:-450}"  # quick: seconds for the whole script
BENCH_FLOOR=120  # quick: what the steps before the real-size bench leave it at least
STATUS=0

step() { echo; echo "=== $* ($(date -u +%H:%M:%S), ${SECONDS} s into the run)"; }
left() { echo $((BUDGET - SECONDS)); }
# The seconds step $1 may take: its share in quick mode (never more than leaves the real-size
# bench BENCH_FLOOR when it is to run), STEP_TIMEOUT otherwise.
limit() {
  [ "$MODE" = quick ] || { echo "$LIMIT"; return; }
  local cap floor=0
  case "$1" in doctor) cap=45 ;; selftest) cap=150 ;; tests) cap=90 ;; *) cap=$(left) ;; esac
  wants real && [ "$1" != real ] && floor=$BENCH_FLOOR
  local room=$(($(left) - floor))
  [ "$room" -lt "$cap" ] && cap=$room
  [ "$cap" -lt 1 ] && cap=1
  echo "$cap"
}
# Exit status of a bounded step: 124 means it ran out of its time, which is said.
ended() {
  local name=$1 code=$2 limit=$3
  if [ "$code" = 124 ]; then
    echo "$name: stopped at its limit of $limit s ($([ "$MODE" = quick ] && echo "its share of QUICK_BUDGET=$BUDGET" || echo STEP_TIMEOUT))"
  fi
  echo "$name exit $code"; [ "$code" = 0 ] || STATUS=1
}
missing() { echo "run.sh: MISSING: $*" >&2; exit 2; }

step check the machine
command -v "$PY" >/dev/null || missing "no '$PY' on PATH (set PYTHON=/path/to/python3)"
"$PY" -c "import torch" 2>/dev/null || missing "'$PY' cannot import torch. The GPU session must \
bring a CUDA build of torch >= 2.4 (the lent image's python3 has torch 2.11.0+cu130); no torch \
wheel travels with the tree. Point PYTHON at the python that has it."
for pkg in click packaging pathspec pytest; do
  "$PY" -c "import $pkg" 2>/dev/null || missing "'$PY' cannot import $pkg (the lent image has \
it; elsewhere carry its wheel in .whl/ beside libcst and pyflakes)"
done
# What the python lacks comes from .whl/: libcst and pyflakes must, the peer may.
WHEELS=()
if ! "$PY" -c "import libcst, pyflakes" 2>/dev/null; then
  ls .whl/libcst-*.whl .whl/pyflakes-*.whl >/dev/null 2>&1 || missing "libcst and pyflakes are \
not importable and .whl/ holds no wheels of them: run 'bash benchmarks/gpu/wheels.sh' where PyPI \
is reachable (GPU_PYTHON= the GPU python's version, 3.12 for the lent image) and carry .whl/ with \
the tree"
  WHEELS+=(.whl/libcst-*.whl .whl/pyflakes-*.whl)
fi
if ! "$PY" -c "import pytorch_autotune" 2>/dev/null && ls .whl/pytorch_autotune-*.whl >/dev/null 2>&1; then
  WHEELS+=(.whl/pytorch_autotune-*.whl)
fi
if [ ${#WHEELS[@]} -gt 0 ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${WHEELS[@]}" || missing "the wheels in .whl/ do not install on this python \
($("$PY" -V 2>&1)): rebuild them with GPU_PYTHON set to its version"
fi
export PYTHONPATH="$SITE:$PWD"
"$PY" -c "import libcst, pyflakes" 2>/dev/null || missing "libcst or pyflakes still not importable \
after installing .whl/ (a wheel for another python or platform?)"
"$PY" -c "import autoopt, torch; print('autoopt', autoopt.__version__, 'from', autoopt.__file__); \
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
torch.cuda.get_device_name() if torch.cuda.is_available() else '')" | tee "$OUT/versions.txt" \
  || missing "autoopt does not import from the tree"
if ! "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "run.sh: WARNING: torch sees no CUDA device: every step runs on the CPU (a rehearsal, \
not the GPU check; nothing here is a GPU figure)" | tee -a "$OUT/versions.txt" >&2
fi
for peer in accelerate lightning pytorch_autotune; do
  "$PY" -c "import $peer" 2>/dev/null || echo "run.sh: note: $peer is not installed: the bench \
leaves its peer out" | tee -a "$OUT/versions.txt" >&2
done

if wants doctor; then
  t=$(limit doctor); step "doctor (limit $t s)"
  timeout "$t" "$PY" -m autoopt doctor --json > "$OUT/doctor.json"
  ended doctor $? "$t"
fi

if wants selftest; then
  t=$(limit selftest); step "selftest (limit $t s)"
  QUICK=(); [ "$MODE" = quick ] && QUICK=(--quick)
  began=$SECONDS
  timeout "$t" "$PY" -m autoopt selftest "${QUICK[@]}" --json > "$OUT/selftest.json"
  ended selftest $? "$t"
  # The table a person reads, from the same run (a second run would double the step's time).
  "$PY" -c "
import json, sys
from autoopt.diagnostics import selftest
report = json.load(open(sys.argv[1]))
rows = [selftest.Row(**r) for r in report['checks']]
print(report['device'])
print(''.join(selftest.row_lines(r) for r in rows) + selftest.verdict(rows, float(sys.argv[2])), end='')
" "$OUT/selftest.json" $((SECONDS - began)) | tee "$OUT/selftest.txt"
fi

if wants tests; then
  t=$(limit tests); step "tests (limit $t s)"
  # The tree's own tests; CUDA paths run where torch sees one.
  timeout "$t" "$PY" -m pytest -q -x -m "not slow" -p no:cacheprovider \
    tests/runtime/test_amp.py tests/runtime/test_loss_scaling.py tests/runtime/test_loader.py \
    tests/runtime/test_backends.py tests/runtime/test_memory.py > "$OUT/tests.txt" 2>&1
  code=$?; tail -30 "$OUT/tests.txt"; ended tests $code "$t"
fi

if wants real; then
  # The bench's own budget leaves 15 s for the tables and the python's exit; the timeout is
  # the backstop for a configuration that overruns its estimate (the tables written so far
  # stay, naming the configuration that was running).
  t=$(limit real); step "real-size bench (limit $t s)"
  timeout -k 10 "$t" "$PY" -m benchmarks.gpu.real_size --budget $((t > 30 ? t - 15 : t / 2)) \
    --out "$OUT" > "$OUT/real-size.txt" 2> "$OUT/real-size.log"
  code=$?; tail -4 "$OUT/real-size.log"; cat "$OUT/real-size.md" 2>/dev/null; ended real $code "$t"
fi

# The bench one workload at a time: all 66 configurations (25 compiled) would not fit 10 minutes.
BENCH=(--steps 10); [ "$MODE" = quick ] && BENCH=(--steps 3 --warmup 2)
for w in "${WORKLOADS[@]}"; do
  wants bench || wants "bench:$w" || continue
  t=$(limit bench); step "bench $w (limit $t s)"
  timeout "$t" "$PY" -m autoopt bench --workload "$w" "${BENCH[@]}" --repeats 3 \
    --json "$OUT/bench-$w.json" --markdown "$OUT/bench-$w.md" > "$OUT/bench-$w.txt" 2>&1
  code=$?; tail -25 "$OUT/bench-$w.txt"; ended "bench $w" $code "$t"
done
ls -la "$OUT"
echo "run.sh exit $STATUS after $SECONDS s$([ "$MODE" = quick ] && echo " (QUICK_BUDGET=$BUDGET)")"
exit $STATUS
