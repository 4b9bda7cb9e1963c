"""Python's cyclic garbage collector, paused while one file is linted or rewritten.

A file's analysis allocates its tree, its metadata and its facts (hundreds of thousands of
objects for a long file) and keeps nearly all of them alive until the file is done. Automatic
collections meanwhile free almost nothing, yet each one traverses the young objects, and every
hundredth or so every object of the process, the project-wide caches of indexes and summaries
included: a fifth of the CPU time of `autoopt lint` and `rewrite --check` on the test corpus.
Paused for the file, the collector resumes its usual schedule when the file is done (its
first collection then frees what the file left in reference cycles)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection inside the block (also a decorator). Where the collector is off
    already (a file's work inside another's, or a caller that turned it off), it stays as it
    is."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
