"""Shared test set-up: quiet, single-threaded torch so the suite behaves the same on 2 cores;
deterministic property tests under CI."""

from __future__ import annotations

import os
import tempfile

from hypothesis import settings

os.environ.setdefault("OMP_NUM_THREADS", "1")
# No test reads or writes the per-user compile cache; its own tests pass a directory.
os.environ.setdefault("AUTOOPT_COMPILE_CACHE", "0")
# Nor torch's own: each test process compiles into an empty inductor cache of its own, so no
# result depends on what the machine's shared /tmp/torchinductor_<user> holds (a truncated
# entry there once failed a bench test), as on a clean CI machine.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="autoopt-inductor-"))

# CI: the same examples on every run (no example database, no random seed), so a red build is
# reproducible and a green one is not luck. Locally hypothesis explores new examples each run.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
if os.environ.get("CI", "").lower() == "true":
    settings.load_profile("ci")
