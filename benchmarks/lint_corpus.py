"""Lint speed on a real corpus: torch's own `nn/`, `optim/`, `utils/`, `distributed/` sources.

Times, over the same files:
  parse  bare `libcst.parse_module` of every file, one process (the floor any libcst linter has)
  cold   `autoopt lint` with no cache (pre-filter, parallel workers, all rules)
  warm   `autoopt lint` again with the cache filled (nothing changed)
and prints the ratios (TorchFix 0.7.0 takes ~25x the bare parse time on this corpus; the target
is cold within 2x). Each timing is the best of `--repeat` runs. In-process timings exclude
Python's start-up; `--cli` also times the real `autoopt lint` command (start-up included).

    python benchmarks/lint_corpus.py                 # the whole corpus (~680 files)
    python benchmarks/lint_corpus.py --limit 60      # a quick subset while developing
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import libcst as cst

SUBDIRS = ("nn", "optim", "utils", "distributed")


def torch_root() -> Path:
    """torch's package folder, found without importing torch (only its files are needed)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def corpus_files(limit: int | None = None) -> list[Path]:
    """The corpus, in a stable order."""
    root = torch_root()
    files = sorted(p for sub in SUBDIRS for p in (root / sub).rglob("*.py"))
    return files[:limit] if limit else files


def time_parse(files: list[Path]) -> float:
    start = time.perf_counter()
    for path in files:
        with contextlib.suppress(Exception):  # a file libcst cannot parse still cost its time
            cst.parse_module(path.read_bytes().decode("utf-8"))
    return time.perf_counter() - start


def time_lint(corpus: Path, use_cache: bool, jobs: int | None) -> tuple[float, object]:
    from autoopt.lint.config import Options
    from autoopt.lint.project import load_project
    from autoopt.lint.runner import run_lint

    start = time.perf_counter()
    project = load_project([corpus], Options(no_cache=not use_cache))
    report = run_lint(project, jobs=jobs)
    return time.perf_counter() - start, report


def best(times: list[float]) -> float:
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N files")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timing (best is kept)")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes for lint")
    parser.add_argument("--cli", action="store_true", help="also time the `autoopt` command")
    args = parser.parse_args()

    files = corpus_files(args.limit)
    n_lines = sum(p.read_bytes().count(b"\n") for p in files)
    # Copy into a scratch project (own pyproject.toml) so the cache lives there, not in torch.
    scratch = Path(tempfile.mkdtemp(prefix="autoopt-bench-"))
    try:
        corpus = scratch / "corpus"
        root = torch_root()
        for path in files:
            target = corpus / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        (scratch / "pyproject.toml").write_text("[tool.autoopt]\n")
        cwd = os.getcwd()
        os.chdir(scratch)
        try:
            parse_t = best([time_parse(files) for _ in range(args.repeat)])
            cold_runs = [time_lint(corpus, False, args.jobs) for _ in range(args.repeat)]
            cold_t = best([t for t, _ in cold_runs])
            report = cold_runs[0][1]
            time_lint(corpus, True, args.jobs)  # fill the cache
            warm_t = best([time_lint(corpus, True, args.jobs)[0] for _ in range(args.repeat)])
            cli_t = None
            if args.cli:
                command = [sys.executable, "-m", "autoopt", "lint", "-q", "--exit-zero", "corpus"]
                runs = []
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    subprocess.run(command, check=True, capture_output=True)
                    runs.append(time.perf_counter() - start)
                cli_t = best(runs)
        finally:
            os.chdir(cwd)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"corpus: {len(files)} files, {n_lines} lines (torch {', '.join(SUBDIRS)})")
    print(f"rules: {len(report.rules)}; files parsed by lint: {report.parsed}/{len(files)}")
    print(f"findings: {len(report.diagnostics)}; file errors: {len(report.errors)}")
    print(f"jobs: {args.jobs or 'one per CPU'} (CPUs here: {os.cpu_count()})")
    print(f"bare libcst.parse_module : {parse_t:7.2f} s   1.00x")
    print(f"autoopt lint, cold       : {cold_t:7.2f} s   {cold_t / parse_t:.2f}x of parse")
    print(f"autoopt lint, warm cache : {warm_t:7.2f} s   {warm_t / parse_t:.3f}x of parse")
    if cli_t is not None:
        print(f"`autoopt lint` command, warm (incl. start-up): {cli_t:.2f} s")


if __name__ == "__main__":
    main()
