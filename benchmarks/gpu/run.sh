#!/usr/bin/env bash
# The GPU check, one command on a bare CUDA machine from a fresh copy of the tree:
#   bash benchmarks/gpu/run.sh [quick]
# Installs autoopt (and, from .whl/ when the machine cannot reach PyPI, the few wheels its image
# lacks: see benchmarks/gpu/wheels.sh), then runs, each step bounded to 10 minutes:
#   1. autoopt doctor --json                    (what torch and the device can do)
#   2. autoopt selftest --json                  (every pass against torch's own loop, timed)
#   3. the CUDA tests: pytest -m "not slow" tests/runtime -k "cuda or amp or loader or memory"
#   4. autoopt bench on CUDA with the peers     (eager, tricks, optimize(), Accelerate, Fabric)
# Results go to $OUT (the device tool's folder) or ./gpu-results; copy the tables into
# docs/benchmarks/gpu.md with the device's name.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-results}"
mkdir -p "$OUT"
MODE="${1:-full}"
PY="${PYTHON:-python3}"
SITE=/tmp/autoopt-site
export PYTHONUNBUFFERED=1

step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step install
if ! "$PY" -c "import libcst, pyflakes" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl || exit 1
fi
"$PY" -m pip install -q --no-deps --no-build-isolation --no-compile --target "$SITE" . || exit 1
export PYTHONPATH="$SITE"
"$PY" -c "import autoopt, torch; print('autoopt', autoopt.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee "$OUT/versions.txt"

step doctor
timeout 600 "$PY" -m autoopt doctor --json > "$OUT/doctor.json"; echo "doctor exit $?"

step selftest
QUICK=(); [ "$MODE" = quick ] && QUICK=(--quick)
timeout 600 "$PY" -m autoopt selftest "${QUICK[@]}" | tee "$OUT/selftest.txt"; echo "selftest exit ${PIPESTATUS[0]}"
timeout 600 "$PY" -m autoopt selftest "${QUICK[@]}" --json > "$OUT/selftest.json"

step tests
# The tree's own tests, run against the installed package; CUDA paths run where torch sees one.
PYTHONPATH="$SITE:$PWD" timeout 600 "$PY" -m pytest -q -x -m "not slow" -p no:cacheprovider \
  tests/runtime/test_amp.py tests/runtime/test_loss_scaling.py tests/runtime/test_loader.py \
  tests/runtime/test_backends.py tests/runtime/test_memory.py 2>&1 | tail -30 | tee "$OUT/tests.txt"

step bench
STEPS=10; [ "$MODE" = quick ] && STEPS=3
PYTHONPATH="$SITE:$PWD" timeout 600 "$PY" -m autoopt bench --steps "$STEPS" --repeats 3 \
  --json "$OUT/bench.json" --markdown "$OUT/bench.md" 2>&1 | tail -40
echo "bench exit ${PIPESTATUS[0]}"
ls -la "$OUT"
