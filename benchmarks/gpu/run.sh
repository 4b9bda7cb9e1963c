#!/usr/bin/env bash
# The GPU check, one command on a bare CUDA machine from a fresh copy of the tree, no network:
#   bash benchmarks/gpu/run.sh [quick] [STEP ...]
# STEPs: doctor, selftest, tests, bench (every workload) or bench:NAME (one workload: cnn, mlp,
# transformer, lstm, deep_linear); default all. The device tool gives a command 10 minutes, so
# there run it in parts, e.g. `run.sh doctor selftest tests`, then `run.sh bench:cnn bench:mlp`,
# and so on (each part checks the machine and installs the wheels again: seconds).
# What the machine must bring (checked first, with a message naming what is missing):
#   * a python3 (or $PYTHON) with a CUDA build of torch >= 2.4 that sees the GPU; the lent
#     H100/H200 image has one (python3 = /opt/torch/.venv/bin/python3, torch 2.11.0+cu130);
#     no torch wheel travels with the tree (a CUDA torch is gigabytes; this CPU machine has none);
#   * click, packaging, pathspec, pytest (the image has them), accelerate and lightning for the
#     peers in the bench (the image has them; without them the bench leaves the peers out);
#   * libcst and pyflakes, which the image lacks: as wheels in .whl/, made where PyPI is
#     reachable by `bash benchmarks/gpu/wheels.sh` and carried with the tree.
# autoopt itself runs from the tree (PYTHONPATH; pure Python, nothing to build). Then, each
# step bounded to 10 minutes:
#   1. autoopt doctor --json                    (what torch and the device can do)
#   2. autoopt selftest --json                  (every pass against torch's own loop, timed)
#   3. the CUDA branches of the runtime tests   (pytest -m "not slow", five files)
#   4. autoopt bench on CUDA with the peers, one workload at a time (eager, tricks, optimize(),
#      Accelerate, Fabric)
# Results go to $OUT (the device tool's folder) or ./gpu-results; copy the tables into
# docs/benchmarks/gpu.md with the device's name. Exit status: 0 when every step ran and the
# selftest passed, 1 when a check failed, 2 when the machine lacks something above.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-results}"
mkdir -p "$OUT"
MODE=full
if [ "${1:-}" = quick ]; then MODE=quick; shift; fi
STEPS_ASKED=("$@"); [ ${#STEPS_ASKED[@]} = 0 ] && STEPS_ASKED=(doctor selftest tests bench)
WORKLOADS=(cnn mlp transformer lstm deep_linear)
wants() { local s; for s in "${STEPS_ASKED[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
for s in "${STEPS_ASKED[@]}"; do
  case "$s" in
    doctor|selftest|tests|bench) ;;
    bench:*) [[ " ${WORKLOADS[*]} " == *" ${s#bench:} "* ]] || { echo "run.sh: unknown workload in $s (${WORKLOADS[*]})" >&2; exit 2; } ;;
    *) echo "run.sh: unknown step $s (doctor, selftest, tests, bench, bench:NAME)" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-python3}"
SITE="${AUTOOPT_SITE:-/tmp/autoopt-site}"
export PYTHONUNBUFFERED=1
LIMIT="${STEP_TIMEOUT:-540}"  # seconds per step: one step and the checks fit a 10-minute call
STATUS=0

step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
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
if ! "$PY" -c "import libcst, pyflakes" 2>/dev/null; then
  ls .whl/*.whl >/dev/null 2>&1 || missing "libcst and pyflakes are not importable and .whl/ \
holds no wheels: run 'bash benchmarks/gpu/wheels.sh' where PyPI is reachable (GPU_PYTHON= the \
GPU python's version, 3.12 for the lent image) and carry .whl/ with the tree"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl || missing "the wheels in .whl/ do not install on this python \
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
for peer in accelerate lightning; do
  "$PY" -c "import $peer" 2>/dev/null || echo "run.sh: note: $peer is not installed: the bench \
leaves its peer out" | tee -a "$OUT/versions.txt" >&2
done

if wants doctor; then
  step doctor
  timeout "$LIMIT" "$PY" -m autoopt doctor --json > "$OUT/doctor.json"
  code=$?; echo "doctor exit $code"; [ $code = 0 ] || STATUS=1
fi

if wants selftest; then
  step selftest
  QUICK=(); [ "$MODE" = quick ] && QUICK=(--quick)
  timeout "$LIMIT" "$PY" -m autoopt selftest "${QUICK[@]}" --json > "$OUT/selftest.json"
  code=$?; echo "selftest exit $code"; [ $code = 0 ] || STATUS=1
  # The table a person reads, from the same run (a second run would double the step's time).
  "$PY" -c "
import json, sys
from autoopt.diagnostics import selftest
report = json.load(open(sys.argv[1]))
print(selftest.render([selftest.Row(**r) for r in report['checks']], report['device']), end='')
" "$OUT/selftest.json" | tee "$OUT/selftest.txt"
fi

if wants tests; then
  step tests
  # The tree's own tests; CUDA paths run where torch sees one.
  timeout "$LIMIT" "$PY" -m pytest -q -x -m "not slow" -p no:cacheprovider \
    tests/runtime/test_amp.py tests/runtime/test_loss_scaling.py tests/runtime/test_loader.py \
    tests/runtime/test_backends.py tests/runtime/test_memory.py > "$OUT/tests.txt" 2>&1
  code=$?; tail -30 "$OUT/tests.txt"; echo "tests exit $code"; [ $code = 0 ] || STATUS=1
fi

# The bench one workload at a time: all 66 configurations (25 compiled) would not fit 10 minutes.
BENCH=(--steps 10); [ "$MODE" = quick ] && BENCH=(--steps 3 --warmup 2)
for w in "${WORKLOADS[@]}"; do
  wants bench || wants "bench:$w" || continue
  step "bench $w"
  timeout "$LIMIT" "$PY" -m autoopt bench --workload "$w" "${BENCH[@]}" --repeats 3 \
    --json "$OUT/bench-$w.json" --markdown "$OUT/bench-$w.md" > "$OUT/bench-$w.txt" 2>&1
  code=$?; tail -25 "$OUT/bench-$w.txt"; echo "bench $w exit $code"; [ $code = 0 ] || STATUS=1
done
ls -la "$OUT"
echo "run.sh exit $STATUS"
exit $STATUS
