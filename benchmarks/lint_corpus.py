"""Lint speed on a real corpus: torch's own `nn/`, `optim/`, `utils/`, `distributed/` sources,
or any folder of Python files (`--dir`, e.g. checkouts of real training repositories).

Times, over the same files:
  parse    bare `libcst.parse_module` of every file, one process (the floor any libcst linter has)
  ast      `ast.parse` of every file (what a syntax check costs)
  cold     `autoopt lint` with no cache (pre-filter, all rules; workers unless `--jobs 1`)
  warm     `autoopt lint` again with the cache filled (nothing changed)
  rewrite  what `autoopt rewrite --check` does per file (`--rewrite`): fixes to a fixed point
and prints the ratios to parse (the target: cold within 2x, rewrite within 3x). Each timing is
the best of `--repeat` runs. Each cold lint and rewrite run is made in a fresh interpreter (an
earlier run would leave autoopt's per-process caches filled); with `--jobs 1` no other process
is involved and the timings are CPU seconds of the timing process (steady on a shared machine),
otherwise wall seconds. Timings exclude Python's start-up and imports; `--cli` also times the
real `autoopt lint` command (start-up included).

    python benchmarks/lint_corpus.py                 # the whole corpus (~680 files)
    python benchmarks/lint_corpus.py --limit 60      # a quick subset while developing
    python benchmarks/lint_corpus.py --dir /tmp/corpus --jobs 1 --rewrite --repeat 1
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import libcst as cst

SUBDIRS = ("nn", "optim", "utils", "distributed")


def torch_root() -> Path:
    """torch's package folder, found without importing torch (only its files are needed)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def corpus_files(root: Path, limit: int | None = None) -> list[Path]:
    """The corpus, in a stable order."""
    if root == torch_root():
        files = sorted(p for sub in SUBDIRS for p in (root / sub).rglob("*.py"))
    else:
        files = sorted(root.rglob("*.py"))
    return files[:limit] if limit else files


# CPU seconds of this process when everything runs in it (`--jobs 1`), else wall seconds.
clock = time.perf_counter


def time_parse(files: list[Path], parse: object = cst.parse_module) -> float:
    start = clock()
    for path in files:
        with contextlib.suppress(Exception):  # a file that cannot be parsed still cost its time
            parse(path.read_bytes().decode("utf-8"))  # type: ignore[operator]
    return clock() - start


def time_lint(corpus: Path, use_cache: bool, jobs: int | None) -> tuple[float, object]:
    from autoopt.lint.config import Options
    from autoopt.lint.project import load_project
    from autoopt.lint.runner import run_lint

    start = clock()
    project = load_project([corpus], Options(no_cache=not use_cache))
    report = run_lint(project, jobs=jobs)
    return clock() - start, report


def time_rewrite(corpus: Path) -> tuple[float, int]:
    """`autoopt rewrite --check`'s work: every file's fixes to a fixed point, nothing written.
    Returns (seconds, files that would change)."""
    from autoopt.lint.config import Options
    from autoopt.lint.project import load_project
    from autoopt.lint.rewrite import fix_source
    from autoopt.lint.suppress import filter_findings

    start = clock()
    project = load_project([corpus], Options(no_cache=True))
    changed = 0
    for path in project.files:
        with contextlib.suppress(Exception):  # errors are the CLI's to report; time still counts
            result = fix_source(
                path.read_bytes().decode("utf-8"),
                project.rules_for(path),
                unsafe=project.settings.unsafe_fixes,
                target_version=project.settings.target_version,
                path=str(path),
                finding_filter=filter_findings,
            )
            changed += result.changed
    return clock() - start, changed


def fresh(cpu: bool, timing: Callable[..., tuple[float, Any]], *args: object) -> tuple[float, Any]:
    """`timing(*args)` in a new interpreter: an earlier timing in this process would leave the
    per-process caches filled (summaries of the sibling modules a file imports) and make the
    next one look cheaper than a real `autoopt lint` / `rewrite --check` run."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_in_child, cpu, timing, *args).result()


def _in_child(
    cpu: bool, timing: Callable[..., tuple[float, Any]], *args: object
) -> tuple[float, Any]:
    global clock
    if cpu:
        clock = time.process_time
    return timing(*args)


def best(times: list[float]) -> float:
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N files")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timing (best is kept)")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes for lint")
    parser.add_argument("--cli", action="store_true", help="also time the `autoopt` command")
    parser.add_argument("--dir", type=Path, default=None, help="corpus folder (default: torch)")
    parser.add_argument("--rewrite", action="store_true", help="also time `rewrite --check`")
    args = parser.parse_args()
    global clock
    if args.jobs == 1:
        clock = time.process_time

    root = args.dir.resolve() if args.dir else torch_root()
    files = corpus_files(root, args.limit)
    n_lines = sum(p.read_bytes().count(b"\n") for p in files)
    # Copy into a scratch project (own pyproject.toml) so the cache lives there, not in torch.
    scratch = Path(tempfile.mkdtemp(prefix="autoopt-bench-"))
    try:
        corpus = scratch / "corpus"
        for path in files:
            target = corpus / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        (scratch / "pyproject.toml").write_text("[tool.autoopt]\n")
        cwd = os.getcwd()
        os.chdir(scratch)
        try:
            parse_t = best([time_parse(files) for _ in range(args.repeat)])
            ast_t = best([time_parse(files, ast.parse) for _ in range(args.repeat)])
            cpu = clock is time.process_time
            rewrite_runs = [
                fresh(cpu, time_rewrite, corpus) for _ in range(args.repeat if args.rewrite else 0)
            ]
            cold_runs = [
                fresh(cpu, time_lint, corpus, False, args.jobs) for _ in range(args.repeat)
            ]
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

    where = args.dir or f"torch {', '.join(SUBDIRS)}"
    print(f"corpus: {len(files)} files, {n_lines} lines ({where})")
    print(f"rules: {len(report.rules)}; files parsed by lint: {report.parsed}/{len(files)}")
    print(f"findings: {len(report.diagnostics)}; file errors: {len(report.errors)}")
    unit = "CPU s" if clock is time.process_time else "s"
    print(f"jobs: {args.jobs or 'one per CPU'} (CPUs here: {os.cpu_count()}); times in {unit}")
    print(f"bare libcst.parse_module : {parse_t:7.2f}   1.00x")
    print(f"ast.parse                : {ast_t:7.2f}   {ast_t / parse_t:.2f}x of parse")
    print(f"autoopt lint, cold       : {cold_t:7.2f}   {cold_t / parse_t:.2f}x of parse")
    print(f"autoopt lint, warm cache : {warm_t:7.2f}   {warm_t / parse_t:.3f}x of parse")
    if rewrite_runs:
        rewrite_t = best([t for t, _ in rewrite_runs])
        print(
            f"rewrite --check          : {rewrite_t:7.2f}   {rewrite_t / parse_t:.2f}x of parse"
            f" ({rewrite_runs[0][1]} files would change)"
        )
    if cli_t is not None:
        print(f"`autoopt lint` command, warm (incl. start-up): {cli_t:.2f} s")


if __name__ == "__main__":
    main()
