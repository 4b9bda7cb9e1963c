"""Lint speed on a real corpus: torch's own `nn/`, `optim/`, `utils/`, `distributed/` sources,
or any folder of Python files (`--dir`, e.g. checkouts of real training repositories).

Times, over the same files:
  parse    bare `libcst.parse_module` of every file, one process (the floor any libcst linter has)
  ast      `ast.parse` of every file (what a syntax check costs)
  cold     `autoopt lint` with no cache (pre-filter, all rules; workers unless `--jobs 1`)
  warm     `autoopt lint` again with the cache filled (nothing changed)
  rewrite  what `autoopt rewrite --check` does per file (`--rewrite`): fixes to a fixed point
and prints the ratios to parse (the target: cold within 2x, rewrite within 3x). Each timing is
the best of `--repeat` runs and is taken both as wall seconds and as CPU seconds (the timing
process's own plus its reaped worker processes'), in the same run: on a shared machine the CPU
ratio is the steady one, the wall ratio what a user waits. Each cold lint and rewrite run is
made in a fresh interpreter (an earlier run would leave autoopt's per-process caches filled).
Timings exclude Python's start-up and imports; `--cli` also times the real `autoopt lint`
command (start-up included). `--memory` measures the peak resident memory of `autoopt lint` on
one generated 50,000-line file (corpus files concatenated, each kept only if the result still
parses), against a bare `libcst.parse_module` of the same file (the target: 300 MB).

    python benchmarks/lint_corpus.py                 # torch's own sources (~680 files)
    python benchmarks/lint_corpus.py --limit 60      # a quick subset while developing
    python benchmarks/lint_corpus.py --dir /tmp/corpus --jobs 1 --rewrite --repeat 1
    python benchmarks/lint_corpus.py --corpus test --jobs 1 --rewrite --repeat 1   # issue 21
    python benchmarks/lint_corpus.py --corpus large --jobs 1 --rewrite --repeat 1 --memory
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import multiprocessing
import os
import resource
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
CORPUS = Path(__file__).resolve().parent / "corpus"
# Named corpora of fetched repositories (benchmarks/corpus/fetch.py --split test / dev).
CORPORA = {
    # the held-out split: 26 repositories never tuned on
    "test": [CORPUS / "_repos_test"],
    # 800+ files: the test split and four dev repositories of different styles
    "large": [
        CORPUS / "_repos_test",
        CORPUS / "_repos" / "pytorch+examples",
        CORPUS / "_repos" / "ultralytics+yolov5",
        CORPUS / "_repos" / "huggingface+pytorch-image-models",
        CORPUS / "_repos" / "eriklindernoren+PyTorch-GAN",
    ],
}


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


class Clock:
    """Wall and CPU seconds since it was made; CPU is this process's plus that of its child
    processes that have ended (lint's workers)."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = self._cpu()

    @staticmethod
    def _cpu() -> float:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + children.ru_utime + children.ru_stime

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, self._cpu() - self.cpu


def time_parse(files: list[Path], parse: object = cst.parse_module) -> tuple[float, float]:
    clock = Clock()
    for path in files:
        with contextlib.suppress(Exception):  # a file that cannot be parsed still cost its time
            parse(path.read_bytes().decode("utf-8"))  # type: ignore[operator]
    return clock.read()


def time_lint(
    corpus: Path, use_cache: bool, jobs: int | None
) -> tuple[tuple[float, float], object]:
    from autoopt.lint.engine.config import Options
    from autoopt.lint.engine.project import load_project
    from autoopt.lint.engine.runner import run_lint

    clock = Clock()
    project = load_project([corpus], Options(no_cache=not use_cache))
    report = run_lint(project, jobs=jobs)
    return clock.read(), report


def time_rewrite(corpus: Path) -> tuple[tuple[float, float], int]:
    """`autoopt rewrite --check`'s work: every file's fixes to a fixed point, nothing written.
    Returns ((wall, CPU seconds), files that would change)."""
    from autoopt.lint.engine.config import Options
    from autoopt.lint.engine.project import load_project
    from autoopt.lint.engine.suppress import filter_findings
    from autoopt.lint.rewrite.apply import fix_source

    clock = Clock()
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
    return clock.read(), changed


def fresh(timing: Callable[..., tuple[Any, Any]], *args: object) -> tuple[Any, Any]:
    """`timing(*args)` in a new interpreter: an earlier timing in this process would leave the
    per-process caches filled (summaries of the sibling modules a file imports) and make the
    next one look cheaper than a real `autoopt lint` / `rewrite --check` run."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(timing, *args).result()


def best(times: list[tuple[float, float]]) -> tuple[float, float]:
    """The fastest run's (wall, CPU) seconds, each the minimum over the runs."""
    return min(t[0] for t in times), min(t[1] for t in times)


# Run inside the measured process: its own peak (VmHWM of its address space), written at exit.
# `ru_maxrss` of a child is not it: Linux keeps the pre-exec peak, which is this (large)
# process's resident set copied by the fork.
_PEAK = """
import atexit, os, runpy, sys
out = sys.argv.pop(1)
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            with open(out, "w") as f:
                f.write(line.split()[1])
atexit.register(peak)
if sys.argv[1] == "-c":
    exec(sys.argv[2], {"__name__": "__main__"})
else:
    sys.argv = sys.argv[2:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def peak_rss_mb(args: list[str]) -> float:
    """Peak resident memory (MB) of `python ARGS` (`-m module ...` or `-c code`), measured in
    the process itself."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "peak"
        subprocess.run(
            [sys.executable, "-c", _PEAK, str(out), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        return int(out.read_text()) / 1024  # kilobytes


def big_file(files: list[Path], lines: int, out: Path) -> int:
    """Concatenate corpus files into OUT until it has LINES lines; a file is kept only if the
    result still parses (no `from __future__` in the middle, no broken file). Returns lines."""
    parts: list[str] = []
    count = 0
    for path in files:
        try:
            text = path.read_bytes().decode("utf-8")
            ast.parse(text)
        except (SyntaxError, ValueError, UnicodeDecodeError):
            continue
        text = "\n".join(
            line for line in text.splitlines() if not line.startswith("from __future__")
        )
        parts.append(text + "\n")
        count += text.count("\n") + 1
        if count >= lines:
            break
    source = "".join(parts)
    ast.parse(source)
    out.write_text(source, encoding="utf-8")
    return source.count("\n")


def memory(files: list[Path], scratch: Path, lines: int = 50_000) -> dict:
    """Peak memory of `autoopt lint` on one generated LINES-line file, against bare libcst
    parsing and against importing autoopt's CLI only."""
    target = scratch / "big" / "big_file.py"
    target.parent.mkdir(parents=True)
    n = big_file(files, lines, target)
    parse = f"import libcst; libcst.parse_module(open({str(target)!r}).read())"
    return {
        "lines": n,
        "lint_mb": peak_rss_mb(
            ["-m", "autoopt", "lint", "--no-cache", "--exit-zero", "-q", str(target)]
        ),
        "libcst_parse_mb": peak_rss_mb(["-c", parse]),
        "cli_start_mb": peak_rss_mb(["-m", "autoopt", "--help"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N files")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timing (best is kept)")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes for lint")
    parser.add_argument("--cli", action="store_true", help="also time the `autoopt` command")
    parser.add_argument(
        "--dir", type=Path, action="append", help="corpus folder (repeatable; default: torch)"
    )
    parser.add_argument("--corpus", choices=tuple(CORPORA), help="a named corpus of fetched repos")
    parser.add_argument("--rewrite", action="store_true", help="also time `rewrite --check`")
    parser.add_argument("--memory", action="store_true", help="peak memory on a 50k-line file")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()

    roots = [d.resolve() for d in (args.dir or CORPORA.get(args.corpus, []))] or [torch_root()]
    missing = [str(r) for r in roots if not r.is_dir()]
    if missing:
        raise SystemExit(f"not found: {missing}: run benchmarks/corpus/fetch.py (--split test)")
    pairs = [(root, path) for root in roots for path in corpus_files(root)]
    pairs = pairs[: args.limit] if args.limit else pairs
    files = [path for _, path in pairs]
    n_lines = sum(p.read_bytes().count(b"\n") for p in files)
    # Copy into a scratch project (own pyproject.toml) so the cache lives there, not in torch.
    scratch = Path(tempfile.mkdtemp(prefix="autoopt-bench-"))
    mem = None
    try:
        corpus = scratch / "corpus"
        for root, path in pairs:
            target = corpus / (root.name if len(roots) > 1 else "") / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        (scratch / "pyproject.toml").write_text("[tool.autoopt]\n")
        cwd = os.getcwd()
        os.chdir(scratch)
        try:
            parse_t = best([time_parse(files) for _ in range(args.repeat)])
            ast_t = best([time_parse(files, ast.parse) for _ in range(args.repeat)])
            rewrite_runs = [
                fresh(time_rewrite, corpus) for _ in range(args.repeat if args.rewrite else 0)
            ]
            cold_runs = [fresh(time_lint, corpus, False, args.jobs) for _ in range(args.repeat)]
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
                cli_t = min(runs)
            if args.memory:
                mem = memory(files, scratch)
        finally:
            os.chdir(cwd)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    where = ", ".join(str(r) for r in roots) if args.dir or args.corpus else f"torch {SUBDIRS}"
    print(f"corpus: {len(files)} files, {n_lines} lines ({where})")
    print(f"rules: {len(report.rules)}; files parsed by lint: {report.parsed}/{len(files)}")
    print(f"findings: {len(report.diagnostics)}; file errors: {len(report.errors)}")
    print(
        f"jobs: {args.jobs or 'one per CPU'} (CPUs here: {os.cpu_count()}); load {os.getloadavg()}"
    )
    rows = [("bare libcst.parse_module", parse_t), ("ast.parse", ast_t)]
    rows += [("autoopt lint, cold", cold_t), ("autoopt lint, warm cache", warm_t)]
    figures: dict = {"files": len(files), "lines": n_lines, "roots": [str(r) for r in roots]}
    if rewrite_runs:
        rows.append(("rewrite --check", best([t for t, _ in rewrite_runs])))
        figures["rewrite_would_change"] = rewrite_runs[0][1]
    print(f"{'':26} {'wall s':>8} {'x parse':>8} {'CPU s':>8} {'x parse':>8}")
    for label, (wall, cpu) in rows:
        print(
            f"{label:26} {wall:8.2f} {wall / parse_t[0]:7.2f}x {cpu:8.2f} {cpu / parse_t[1]:7.2f}x"
        )
        figures[label] = {
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
            "wall_x_parse": round(wall / parse_t[0], 2),
            "cpu_x_parse": round(cpu / parse_t[1], 2),
        }
    if cli_t is not None:
        print(f"`autoopt lint` command, warm (incl. start-up): {cli_t:.2f} s")
        figures["cli_warm_s"] = round(cli_t, 2)
    if mem:
        print(
            f"peak memory on one {mem['lines']}-line file: lint {mem['lint_mb']:.0f} MB, "
            f"bare libcst parse "
            f"{mem['libcst_parse_mb']:.0f} MB, `autoopt --help` {mem['cli_start_mb']:.0f} MB"
        )
        figures["memory"] = mem
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
