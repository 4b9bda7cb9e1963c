#!/usr/bin/env bash
# Download, here (where PyPI is reachable), the wheels the GPU image lacks for autoopt: its
# image has torch, click, packaging, pathspec, accelerate, lightning, transformers, pytest, but
# not libcst or pyflakes. They land in .whl/ (ignored by git), which the device call carries:
#   bash benchmarks/gpu/wheels.sh && <device run with carry [".whl"]> bash benchmarks/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" \
  --implementation cp "${PLATFORMS[@]}" -d .whl libcst pyflakes
ls .whl
