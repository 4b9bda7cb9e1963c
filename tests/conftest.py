"""Shared test set-up: quiet, single-threaded torch so the suite behaves the same on 2 cores."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
