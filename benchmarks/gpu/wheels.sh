#!/usr/bin/env bash
# Download, here (where PyPI is reachable), the wheels the GPU image lacks for autoopt: its
# python3 (3.12, torch 2.11.0+cu130) has click, packaging, pathspec, pytest, hypothesis,
# accelerate, lightning and transformers, but not libcst or pyflakes, nor the real-size bench's
# peer pytorch-autotune (pure Python; it needs torch and numpy, which the image has). They land
# in .whl/ (ignored by git), which the device call carries:
#   bash benchmarks/gpu/wheels.sh && <device run with carry [".whl"]> bash benchmarks/gpu/run.sh
# GPU_PYTHON: the GPU python's version (3.12 for the lent image; the CPU rehearsal of run.sh
# here uses this machine's, e.g. GPU_PYTHON=3.11). No torch wheel: see run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  PLATFORMS+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" \
  --implementation cp "${PLATFORMS[@]}" -d .whl libcst pyflakes pytorch-autotune
ls .whl
