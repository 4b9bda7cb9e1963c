"""autoopt on a real corpus: robustness, accuracy, speed and --wrap coverage.

The corpus is fetched first (`python benchmarks/corpus/fetch.py`, see benchmarks/corpus/).
autoopt is always run through its command line, so this harness does not depend on the
engine's internals: `accuracy`, `wrap` and `fixes` invoke its click command inside -j worker
processes (scripts two at a time by default; one import of autoopt per worker instead of one
per call, which halves their CPU time), the rest run `python -m autoopt ...` subprocesses.

    python benchmarks/corpus_eval.py robustness --json out/robustness.json
    python benchmarks/corpus_eval.py accuracy   --json out/accuracy.json
    python benchmarks/corpus_eval.py speed      --json out/speed.json
    python benchmarks/corpus_eval.py wrap       --json out/wrap.json
    python benchmarks/corpus_eval.py fixes      --json out/fixes.json
    python benchmarks/corpus_eval.py accuracy --split test   # the held-out split (issue 21)
    python benchmarks/corpus_eval.py report --split test --runs out/runs.json --json out/test.json

`--split dev` (the default) is the corpus rules are read and tuned on (manifest.json, labels.tsv);
`--split test` is the held-out one (testset.json, labels_test.tsv, wrap_test.tsv,
fixes_test.tsv): measure there, never tune on it.

Progress goes to stderr, a summary to stdout, the full results to the JSON file.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import difflib
import functools
import hashlib
import json
import multiprocessing
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter, defaultdict
from pathlib import Path

import libcst as cst

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
DEFAULT_ROOT = CORPUS / "_repos"
LABELS = CORPUS / "labels.tsv"
TORCH_DIR = "torch"
LABEL_VALUES = ("missing", "present", "na")
# Each split: the fetched repositories, the lint labels, the --wrap expectations, the fix
# verdicts (the last two optional: without them the outcomes are listed, not judged).
SPLITS = {
    "dev": {
        "root": DEFAULT_ROOT,
        "labels": LABELS,
        "wrap": CORPUS / "wrap_dev.tsv",
        "fixes": CORPUS / "fixes_dev.tsv",
    },
    "test": {
        "root": CORPUS / "_repos_test",
        "labels": CORPUS / "labels_test.tsv",
        "wrap": CORPUS / "wrap_test.tsv",
        "fixes": CORPUS / "fixes_test.tsv",
    },
    # First-contact batches (issue 30): labelled by reading, before autoopt ran on them.
    **{
        name: {
            "root": CORPUS / f"_repos_{name.replace('-', '_')}",
            "labels": CORPUS / f"labels_{name.replace('-', '_')}.tsv",
            "wrap": CORPUS / f"wrap_{name.replace('-', '_')}.tsv",
            "fixes": CORPUS / f"fixes_{name.replace('-', '_')}.tsv",
        }
        for name in (
            "fresh-c",
            "fresh-d",
            "fresh-e",
            "fresh-f",
            "fresh-g",
            "fresh-h",
            "fresh-i",
            "fresh-j",
            "fresh-k",
            "fresh-l",
            "fresh-m",
            "fresh-n",
            "fresh-o",
            "fresh-p",
            "fresh-q",
            "fresh-r",
            "fresh-s",
            "fresh-t",
            "fresh-u",
            "fresh-v",
            "fresh-w",
            "fresh-x",
            "fresh-y",
            "fresh-z",
            "fresh-aa",
            "fresh-ab",
            "fresh-ac",
            "fresh-ad",
            "fresh-ae",
            "fresh-af",
            "fresh-ag",
            "fresh-ah",
            "fresh-ai",
            "fresh-aj",
            "fresh-ak",
            "fresh-al",
            "fresh-am",
            "fresh-an",
            "fresh-ao",
            "fresh-ap",
            "fresh-aq",
            "fresh-ar",
            "fresh-as",
            "fresh-at",
            "fresh-au",
            "fresh-av",
            "fresh-aw",
            "fresh-ax",
        )
    },
}
# The rules every labelled script has a label for (recall is measured on these); a script's
# other rows label the other rules that fired on it (precision only).
CORE_RULES = [
    "AO101",
    "AO102",
    "AO103",
    "AO201",
    "AO301",
    "AO403",
    "AO406",
    "AO501",
    "AO502",
    "AO503",
    "AO601",
    "AO603",
    "AO606",
    "AO702",
    "AO703",
    "AO901",
]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# Set in each_script's worker processes: autoopt runs there through its click command in the
# process itself (the import of autoopt, libcst and the rules paid once per worker, not once per
# call: about half of a call's CPU time), with the same arguments, output and exit code.
IN_PROCESS = False


def autoopt(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m autoopt ARGS` and capture its output; from CWD when given (a script is
    linted from its repository's root, as its user runs autoopt: sibling modules readable)."""
    if IN_PROCESS:
        with contextlib.chdir(cwd or os.getcwd()):
            return autoopt_here(args)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "autoopt", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
    )


def autoopt_here(args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """`autoopt ARGS` through its click command in this process, as `autoopt()` reports it: an
    exception other than an exit becomes the traceback the subprocess would have printed."""
    from click.testing import CliRunner

    from autoopt.cli import main as cli

    result = CliRunner().invoke(cli, list(args), prog_name="autoopt")
    stderr, code = result.stderr, result.exit_code
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(*result.exc_info))
        code = 1
    return subprocess.CompletedProcess(["autoopt", *args], code, result.stdout, stderr)


def _in_process_worker() -> None:
    global IN_PROCESS
    IN_PROCESS = True
    warnings.simplefilter("ignore")  # what PYTHONWARNINGS=ignore does for the subprocesses


def repo_names(repos: list[str] | None) -> set[str] | None:
    """`owner/name` options as the folder names under the corpus root (`torch` as is)."""
    return {r.replace("/", "+") for r in repos} if repos else None


def repo_dirs(root: Path, include_torch: bool = True) -> list[Path]:
    """The fetched repositories (one folder each), torch's sources last."""
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and p.name != TORCH_DIR)
    if include_torch and (root / TORCH_DIR).is_dir():
        dirs.append(root / TORCH_DIR)
    if not dirs:
        raise SystemExit(f"no corpus under {root}: run benchmarks/corpus/fetch.py first")
    return dirs


def py_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def has_traceback(text: str) -> bool:
    return "Traceback (most recent call last)" in text


def parses(source: str) -> str | None:
    """None if both ast and libcst parse `source`, else the first error."""
    try:
        ast.parse(source)
    except SyntaxError as exc:
        return f"ast: {exc}"
    try:
        cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        return f"libcst: {str(exc).splitlines()[0]}"
    return None


def python_parses(path: Path) -> bool:
    try:
        ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        return False
    return True


def digest(files: list[Path]) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


# ---------------------------------------------------------------- robustness


def lint_findings(
    paths: list[Path], extra: tuple[str, ...] = (), cwd: Path | None = None
) -> tuple[list[dict], object]:
    """Lint PATHS (JSON output, no cache) from CWD; returns (findings, completed process)."""
    proc = autoopt(
        "lint",
        "--output-format",
        "json",
        "--no-cache",
        "--exit-zero",
        *extra,
        *map(str, paths),
        cwd=cwd,
    )
    try:
        findings = json.loads(proc.stdout) if proc.stdout.strip() else []
    except json.JSONDecodeError:
        findings = []
    return findings, proc


def is_internal_error(finding: dict) -> bool:
    """A file error of lint's JSON (`code: null`): internal, parse, decode or read."""
    return finding.get("code") in (None, "", "AO000", "E999")


# lint's JSON titles (`SyntaxError: ...`) for a file that is itself broken, or that was linted
# as older Python reads it (`LegacySyntax: ...`: `async=`, tabs mixed into indentation); any
# other file error (`InternalError`, `IOError`, a bare `Error`) is autoopt's fault.
INPUT_ERROR_TITLES = ("SyntaxError:", "DecodeError:", "LegacySyntax:")
# rewrite's stderr: `error: PATH: REASON`; these reasons blame the input file, not autoopt.
INPUT_ERROR_REASONS = ("cannot parse:", "cannot decode", "binary file:")


def rewrite_errors(stderr: str) -> list[tuple[str, str]]:
    """The `error: PATH: REASON` lines of a rewrite run's summary, as (path, reason)."""
    errors = []
    for line in stderr.splitlines():
        match = re.match(r"error: (.+?\.pyi?): (.*)$", line)
        if match:
            errors.append((match.group(1), match.group(2)))
    return errors


def rewrite_run(copy: Path, repo: str, command: str, result: dict) -> subprocess.CompletedProcess:
    """`rewrite --unsafe-fixes COPY`; records its traceback (or odd exit code) and every error
    line that is not the input's own parse/decode error (a crashed or failed fix, a fixed point
    not reached) as an internal error."""
    proc = autoopt("rewrite", "--unsafe-fixes", str(copy))
    if has_traceback(proc.stderr) or proc.returncode not in (0, 1, 2):
        result["tracebacks"].append(
            {"repo": repo, "command": command, "rc": proc.returncode, "stderr": proc.stderr[-3000:]}
        )
    for path, reason in rewrite_errors(proc.stderr):
        entry = {"file": f"{repo}/{os.path.relpath(path, copy)}", "command": command}
        if reason.startswith(INPUT_ERROR_REASONS):
            if command == "rewrite":
                result["parse_errors_reported"].append(entry | {"message": reason})
        else:
            result["internal_errors"].append(entry | {"message": reason})
    return proc


_PROJECTS: dict[str, object] = {}


def _time_file(task: tuple[str, str]) -> dict:
    """Seconds to lint FILE and to compute its fixes (unsafe ones too; nothing written), in
    this process through autoopt's own functions: the CLI runs give no per-file times."""
    from autoopt.lint.engine.project import load_project
    from autoopt.lint.engine.runner import lint_path
    from autoopt.lint.rewrite.apply import fix_source
    from autoopt.lint.tree.encoding import decode_source

    repo, file = task
    if repo not in _PROJECTS:
        _PROJECTS[repo] = load_project([repo])
    rules = _PROJECTS[repo].rules_for(file)  # type: ignore[attr-defined]
    entry: dict = {"file": file}
    start = time.perf_counter()
    lint_path(file, rules)
    entry["lint_s"] = round(time.perf_counter() - start, 3)
    start = time.perf_counter()
    try:
        fix_source(decode_source(Path(file).read_bytes()).text, rules, unsafe=True, path=file)
    except Exception as exc:  # the CLI run reports these; here only the time counts
        entry["fix_error"] = f"{type(exc).__name__}: {exc}"[:300]
    entry["fix_s"] = round(time.perf_counter() - start, 3)
    return entry


def file_times(repo: Path, jobs: int) -> list[dict]:
    """`_time_file` for every file of REPO, in JOBS processes."""
    tasks = [(str(repo), str(f)) for f in py_files(repo)]
    with multiprocessing.Pool(jobs) as pool:
        return list(pool.imap_unordered(_time_file, tasks, chunksize=4))


def robustness(
    root: Path,
    jobs: int,
    only: set[str] | None = None,
    partial: Path | None = None,
    time_files: bool = False,
) -> dict:
    """Lint and rewrite every corpus file: crashes, internal errors, parseability, idempotence.

    Internal errors: lint's JSON file errors other than the file's own syntax/decoding error,
    and rewrite's error lines other than those. Tracebacks: a traceback on either command's
    stderr or an exit code other than 0/1/2. Every file the rewrite changed is parsed again
    (ast and libcst), and a second rewrite of the whole copy (the same project context: a fix
    in one module can change what another module's rules see) must change no file. With
    TIME_FILES, each file's lint and fix time is measured too (in-process, a second pass)."""
    result: dict = {
        "repos": {},
        "internal_errors": [],
        "tracebacks": [],
        "unparseable": [],
        "not_idempotent": [],
        "parse_errors_reported": [],
        "slowest": [],
        "over_10s": [],
    }
    totals = Counter()
    times: list[dict] = []
    # Smallest first: a run cut short still covers as many repositories as it can.
    for repo in sorted(repo_dirs(root), key=lambda d: len(py_files(d))):
        if only and repo.name not in only:
            continue
        files = py_files(repo)
        log(f"[robustness] {repo.name}: {len(files)} files: lint")
        start = time.perf_counter()
        findings, proc = lint_findings([repo], ("-j", str(jobs)))
        lint_s = time.perf_counter() - start
        if (
            has_traceback(proc.stderr)
            or proc.returncode not in (0, 1, 2)
            or (not proc.stdout.strip() and files)
        ):
            result["tracebacks"].append(
                {
                    "repo": repo.name,
                    "command": "lint",
                    "rc": proc.returncode,
                    "stderr": proc.stderr[-3000:],
                }
            )
        internal = 0
        for f in findings:
            if not is_internal_error(f):
                continue
            entry = {
                "file": os.path.relpath(f["filename"], root),
                "row": f["location"]["row"],
                "command": "lint",
                "message": f.get("message"),
            }
            if str(f.get("message")).startswith(INPUT_ERROR_TITLES):
                # Does CPython agree the file is broken (or is it libcst's limit)?
                entry["python_parses"] = python_parses(Path(f["filename"]))
                result["parse_errors_reported"].append(entry)
            else:
                result["internal_errors"].append(entry)
                internal += 1

        log(f"[robustness] {repo.name}: rewrite --unsafe-fixes on a copy")
        with tempfile.TemporaryDirectory(prefix="autoopt-corpus-") as tmp:
            copy = Path(tmp) / repo.name
            # a link to what was not fetched (Listen-Attend-Spell's Kaldi `steps`) stays a link
            shutil.copytree(repo, copy, symlinks=True)
            copies = py_files(copy)
            before = digest(copies)
            n_errors = len(result["internal_errors"])
            start = time.perf_counter()
            first = rewrite_run(copy, repo.name, "rewrite", result)
            rewrite_s = time.perf_counter() - start
            after = digest(copies)
            changed = [Path(p) for p in after if after[p] != before[p]]
            for path in changed:
                error = parses(path.read_bytes().decode("utf-8", errors="replace"))
                if error:
                    result["unparseable"].append(
                        {"file": f"{repo.name}/{path.relative_to(copy)}", "error": error}
                    )
            log(f"[robustness] {repo.name}: second rewrite")
            start = time.perf_counter()
            rewrite_run(copy, repo.name, "rewrite (2nd)", result)
            second_s = time.perf_counter() - start
            again = digest(copies)
            for p in again:
                if again[p] != after[p]:
                    result["not_idempotent"].append(f"{repo.name}/{Path(p).relative_to(copy)}")
            internal += len(result["internal_errors"]) - n_errors
        stats = {
            "files": len(files),
            "findings": len(findings),
            "internal": internal,
            "lint_rc": proc.returncode,
            "lint_s": round(lint_s, 1),
            "rewrite_rc": first.returncode,
            "rewrite_s": round(rewrite_s, 1),
            "rewrite_2nd_s": round(second_s, 1),
            "rewritten": len(changed),
            "rewrite_stderr_tail": first.stderr.strip().splitlines()[-3:],
        }
        if time_files:
            log(f"[robustness] {repo.name}: time per file")
            for entry in file_times(repo, jobs):
                times.append(entry | {"file": os.path.relpath(entry["file"], root)})
            times.sort(key=lambda t: -(t["lint_s"] + t["fix_s"]))
            result["slowest"] = times[:30]
            result["over_10s"] = [t for t in times if max(t["lint_s"], t["fix_s"]) > 10]
        result["repos"][repo.name] = stats
        totals.update(
            {
                k: v
                for k, v in stats.items()
                if k
                in (
                    "files",
                    "findings",
                    "internal",
                    "rewritten",
                    "lint_s",
                    "rewrite_s",
                    "rewrite_2nd_s",
                )
            }
        )
        log(f"[robustness] {repo.name}: {stats}")
        if partial:  # a long run leaves usable results behind after every repository
            partial.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    result["totals"] = dict(totals) | {
        "repos": len(result["repos"]),
        "tracebacks": len(result["tracebacks"]),
        "internal_errors": len(result["internal_errors"]),
        "unparseable": len(result["unparseable"]),
        "not_idempotent": len(result["not_idempotent"]),
        "parse_errors_reported": len(result["parse_errors_reported"]),
    }
    return result


def print_robustness(result: dict) -> None:
    print("| repo | files | findings | internal errors | lint s | rewritten | rewrite s |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for name, s in result["repos"].items():
        print(
            f"| {name} | {s['files']} | {s['findings']} | {s['internal']} | {s['lint_s']} "
            f"| {s['rewritten']} | {s['rewrite_s']} |"
        )
    print(f"\ntotals: {result['totals']}")
    for key in ("tracebacks", "internal_errors", "unparseable", "not_idempotent"):
        for item in result[key]:
            print(f"{key}: {item if not isinstance(item, dict) else json.dumps(item)[:600]}")


# ---------------------------------------------------------------- accuracy


def read_labels(path: Path) -> list[dict]:
    with path.open(encoding="utf-8", newline="") as handle:
        rows = [r for r in csv.DictReader(handle, delimiter="\t") if r["repo"].strip()]
    for row in rows:
        if row["label"] not in LABEL_VALUES:
            raise SystemExit(f"{path}: bad label {row['label']!r} in {row}")
    return rows


def script_path(root: Path, repo: str, path: str) -> Path:
    return root / repo.replace("/", "+") / path


def ratio(num: int, den: int) -> float | None:
    return round(num / den, 3) if den else None


def _lint_labelled(root: Path, rules: list[str], repo: str, path: str):
    """`accuracy`'s lint of one labelled script."""
    # One file per run, from its repository's root (its local imports readable, as a user
    # runs it). The default rules (what a user sees) plus every labelled one.
    file = script_path(root, repo, path)
    return lint_findings(
        [file], ("--extend-select", ",".join(rules), "-j", "1"), cwd=script_path(root, repo, "")
    )


def _found_in(root: Path, repo: str, path: str, finding: dict, scripts: list) -> str:
    """The labelled script a finding counts for: the module it is in when that module is a
    labelled script of the split (it is linted on its own as well: counted once, there), else
    the script linted (a driver's finding in the module holding the training it runs, which
    `autoopt lint` follows)."""
    where = os.path.relpath(finding["filename"], script_path(root, repo, ""))
    where = where.replace(os.sep, "/")
    return where if (repo, where) in scripts else path


def accuracy(root: Path, labels_path: Path, jobs: int = 1) -> dict:
    """Lint the labelled scripts and score the findings against labels.tsv."""
    labels = read_labels(labels_path)
    rules = sorted({r["rule"] for r in labels})
    scripts = sorted({(r["repo"], r["path"]) for r in labels})
    require_scripts(root, scripts)
    fired: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    errors = []

    for (repo, path), (findings, proc) in zip(
        scripts,
        each_script(functools.partial(_lint_labelled, root, rules), scripts, jobs, "accuracy"),
        strict=True,
    ):
        if has_traceback(proc.stderr):
            errors.append({"script": f"{repo}/{path}", "stderr": proc.stderr[-2000:]})
        for f in findings:
            if is_internal_error(f):  # it hides that rule's findings: a miss to fix first
                errors.append({"script": f"{repo}/{path}", "message": f.get("message")})
            else:
                fired[(repo, _found_in(root, repo, path, f, scripts), f["code"])].append(
                    f["location"]["row"]
                )
    per_rule: dict[str, Counter] = {rule: Counter() for rule in rules}
    false_pos, false_neg = [], []
    labelled = {(r["repo"], r["path"], r["rule"]) for r in labels}
    # A rule that fired on a labelled script with no label for it: to be read and labelled.
    unlabelled = [
        {"script": f"{repo}/{path}", "rule": code, "lines": sorted(set(lines))}
        for (repo, path, code), lines in sorted(fired.items())
        if (repo, path, code) not in labelled
    ]
    per_script: dict[str, Counter] = defaultdict(Counter)
    for row in labels:
        key = (row["repo"], row["path"], row["rule"])
        lines = sorted(set(fired.get(key, [])))
        counts = per_rule[row["rule"]]
        where = f"{row['repo']}/{row['path']}"
        if row["label"] == "missing":
            per_script[where]["tp" if lines else "fn"] += 1
        else:
            per_script[where]["fp" if lines else "tn"] += 1
        if row["label"] == "missing":
            counts["tp" if lines else "fn"] += 1
            if not lines:
                false_neg.append({"script": where, "rule": row["rule"], "note": row["note"]})
        else:
            counts["fp" if lines else "tn"] += 1
            if lines:
                false_pos.append(
                    {
                        "script": where,
                        "rule": row["rule"],
                        "lines": lines,
                        "label": row["label"],
                        "note": row["note"],
                    }
                )
    total = sum(per_rule.values(), Counter())
    core = sum((c for rule, c in per_rule.items() if rule in CORE_RULES), Counter())

    def score(c: Counter) -> dict:
        return {
            "tp": c["tp"],
            "fp": c["fp"],
            "fn": c["fn"],
            "tn": c["tn"],
            "precision": ratio(c["tp"], c["tp"] + c["fp"]),
            "recall": ratio(c["tp"], c["tp"] + c["fn"]),
        }

    return {
        "scripts": len(scripts),
        "labels": len(labels),
        "overall": score(total),
        "core": score(core),
        "per_rule": {rule: score(c) for rule, c in per_rule.items()},
        "per_script": {where: dict(c) for where, c in sorted(per_script.items())},
        "false_positives": false_pos,
        "false_negatives": false_neg,
        "unlabelled_findings": unlabelled,
        "tracebacks": errors,
    }


def print_accuracy(result: dict) -> None:
    o = result["overall"]
    print(
        f"{result['scripts']} scripts, {result['labels']} labels: precision {o['precision']}, "
        f"recall {o['recall']} (tp {o['tp']}, fp {o['fp']}, fn {o['fn']}, tn {o['tn']})"
    )
    c = result["core"]
    print(
        f"the {len(CORE_RULES)} rules every script is labelled for: precision {c['precision']}, "
        f"recall {c['recall']} (tp {c['tp']}, fp {c['fp']}, fn {c['fn']}, tn {c['tn']})\n"
    )
    print("| rule | tp | fp | fn | tn | precision | recall |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for rule, s in result["per_rule"].items():
        print(
            f"| {rule} | {s['tp']} | {s['fp']} | {s['fn']} | {s['tn']} | {s['precision']} "
            f"| {s['recall']} |"
        )
    print("\nfalse positives:")
    for f in result["false_positives"]:
        print(
            f"  {f['rule']} {f['script']}:{','.join(map(str, f['lines']))} ({f['label']}) "
            f"{f['note']}"
        )
    print("\nfalse negatives:")
    for f in result["false_negatives"]:
        print(f"  {f['rule']} {f['script']} {f['note']}")
    if result["unlabelled_findings"]:
        print("\nunlabelled findings (read them and add a label row):")
        for f in result["unlabelled_findings"]:
            print(f"  {f['rule']} {f['script']}:{','.join(map(str, f['lines']))}")
    for e in result["tracebacks"]:
        print(f"error: {e['script']}: {e.get('message') or e['stderr'].splitlines()[-1]}")


# ---------------------------------------------------------------- speed


def _parse_cst(path: str) -> None:
    with contextlib.suppress(Exception):  # a file that does not parse still cost its time
        cst.parse_module(Path(path).read_bytes())


def _parse_ast(path: str) -> None:
    with contextlib.suppress(Exception):
        ast.parse(Path(path).read_bytes())


def time_pool(func, files: list[Path], jobs: int) -> float:
    start = time.perf_counter()
    with multiprocessing.Pool(jobs) as pool:
        pool.map(func, [str(p) for p in files], chunksize=8)
    return time.perf_counter() - start


def time_cli(*args: str) -> tuple[float, int]:
    start = time.perf_counter()
    proc = autoopt(*args)
    return time.perf_counter() - start, proc.returncode


def speed(root: Path, jobs: int, only: set[str] | None) -> dict:
    """Cold lint and rewrite --check vs bare libcst and ast parsing of the same files."""
    dirs = [d for d in repo_dirs(root, include_torch=False) if not only or d.name in only]
    files = [f for d in dirs for f in py_files(d)]
    log(f"[speed] {len(dirs)} repos, {len(files)} files, {jobs} processes")
    startup, _ = time_cli("--help")
    log("[speed] ast.parse")
    ast_s = time_pool(_parse_ast, files, jobs)
    log(f"[speed] ast.parse: {ast_s:.1f} s")
    log("[speed] libcst.parse_module")
    cst_s = time_pool(_parse_cst, files, jobs)
    log(f"[speed] libcst.parse_module: {cst_s:.1f} s")
    log("[speed] lint --no-cache")
    lint_s, lint_rc = time_cli(
        "lint", "--no-cache", "--exit-zero", "-q", "-j", str(jobs), *map(str, dirs)
    )
    log(f"[speed] lint: {lint_s:.1f} s (rc {lint_rc})")
    log("[speed] rewrite --check")
    rewrite_s, rewrite_rc = time_cli("rewrite", "--check", *map(str, dirs))
    result = {
        "repos": [d.name for d in dirs],
        "files": len(files),
        "jobs": jobs,
        "cli_startup_s": round(startup, 2),
        "ast_parse_s": round(ast_s, 2),
        "libcst_parse_s": round(cst_s, 2),
        "lint_cold_s": round(lint_s, 2),
        "lint_rc": lint_rc,
        "rewrite_check_s": round(rewrite_s, 2),
        "rewrite_rc": rewrite_rc,
        "lint_vs_libcst": round(lint_s / cst_s, 2),
        "rewrite_vs_libcst": round(rewrite_s / cst_s, 2),
        "lint_vs_ast": round(lint_s / ast_s, 2),
        "libcst_vs_ast": round(cst_s / ast_s, 2),
    }
    log(f"[speed] {result}")
    return result


def print_speed(r: dict) -> None:
    print(
        f"{r['files']} files in {len(r['repos'])} repositories, {r['jobs']} processes "
        f"(CLI start-up {r['cli_startup_s']} s, included in the autoopt rows)\n"
    )
    print("| what | seconds | x libcst parse |")
    print("|---|--:|--:|")
    base = r["libcst_parse_s"]
    for label, key in (
        ("ast.parse", "ast_parse_s"),
        ("libcst.parse_module", "libcst_parse_s"),
        ("autoopt lint --no-cache", "lint_cold_s"),
        ("autoopt rewrite --check", "rewrite_check_s"),
    ):
        print(f"| {label} | {r[key]} | {r[key] / base:.2f} |")


# ---------------------------------------------------------------- edits, checked


# pyflakes' messages for a name used where it is not bound (on some path).
NAME_ERRORS = ("UndefinedName", "UndefinedLocal", "UndefinedExport")


def read_tsv(path: Path) -> list[dict]:
    """Rows of a TSV with a header line; none if the file does not exist."""
    if not path.is_file():
        return []
    with path.open(encoding="utf-8", newline="") as handle:
        return [r for r in csv.DictReader(handle, delimiter="\t") if r["repo"].strip()]


def name_errors(source: str) -> Counter:
    """pyflakes' undefined-name messages of SOURCE, as a multiset of (kind, name): the cheap
    check that an edit binds every name it introduces (line numbers shift, names do not)."""
    import pyflakes.checker

    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return Counter({("SyntaxError", str(exc.msg)): 1})
    checker = pyflakes.checker.Checker(tree, filename="<edited>")
    return Counter(
        (type(m).__name__, str(m.message_args[0]) if m.message_args else "")
        for m in checker.messages
        if type(m).__name__ in NAME_ERRORS
    )


def new_name_errors(before: str, after: str) -> list[str]:
    """Undefined names (or a syntax error) the edit introduced."""
    return sorted(f"{kind} {name}" for kind, name in (name_errors(after) - name_errors(before)))


def added_lines(before: str, after: str) -> list[str]:
    """The stripped lines an edit added."""
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    return [
        line[1:].strip() for line in diff if line.startswith("+") and not line.startswith("+++")
    ]


@contextlib.contextmanager
def scratch(root: Path, repo: str):
    """A scratch copy of REPO (the whole repository: a rewrite reads the script's local
    imports); yields the copy's folder."""
    with tempfile.TemporaryDirectory(prefix="autoopt-edit-") as tmp:
        source = root / repo.replace("/", "+")
        copy = Path(tmp) / source.name
        shutil.copytree(source, copy, symlinks=True)
        yield copy


def rewrite_once(file: Path, before: str, *args: str, cwd: Path | None = None):
    """`autoopt rewrite ARGS FILE` from CWD on FILE as it was (BEFORE is written back first, so
    one scratch copy serves several rewrites: each sees the original); (text after, process)."""
    file.write_text(before, encoding="utf-8")
    proc = autoopt("rewrite", *args, str(file), cwd=cwd)
    return file.read_text(encoding="utf-8", errors="replace"), proc


@contextlib.contextmanager
def edited(root: Path, repo: str, path: str, *args: str):
    """A scratch copy of REPO in which `autoopt rewrite ARGS SCRIPT` ran on the one script;
    yields (text before, text after, the process, the edited file)."""
    with scratch(root, repo) as copy:
        file = copy / path
        before = file.read_text(encoding="utf-8", errors="replace")
        proc = autoopt("rewrite", *args, str(file), cwd=copy)
        after = file.read_text(encoding="utf-8", errors="replace")
        yield before, after, proc, file


def each_script(func, scripts: list, jobs: int, tag: str) -> list:
    """FUNC(repo, path) for every script (each in its own scratch copy: nothing shared), in
    JOBS worker processes that run autoopt in-process; results in the scripts' order. FUNC must
    be picklable (a module-level function or a partial of one)."""
    items = [(func, tag, i, len(scripts), repo, path) for i, (repo, path) in enumerate(scripts, 1)]
    with multiprocessing.Pool(max(1, jobs), initializer=_in_process_worker) as pool:
        return pool.map(_one_script, items, chunksize=1)


def _one_script(item: tuple) -> object:
    func, tag, i, n, repo, path = item
    log(f"[{tag}] {i}/{n} {repo}/{path}")
    return func(repo, path)


def labelled_scripts(labels_path: Path) -> list[tuple[str, str]]:
    return sorted({(r["repo"], r["path"]) for r in read_labels(labels_path)})


def require_scripts(root: Path, scripts: list[tuple[str, str]]) -> None:
    """Stop when a labelled script is not on disk: its labels would score as misses (a fetch
    that failed leaves an empty checkout, and every `missing` label would count as a miss)."""
    absent = [
        f"{repo}/{path}" for repo, path in scripts if not script_path(root, repo, path).is_file()
    ]
    if absent:
        shown = "\n  ".join(absent[:20]) + (
            f"\n  ... and {len(absent) - 20} more" if len(absent) > 20 else ""
        )
        raise SystemExit(
            f"{len(absent)} of {len(scripts)} labelled scripts are not under {root}:\n  {shown}\n"
            "fetch the split first (benchmarks/corpus/fetch.py --split ...; see its FAILED lines)"
        )


# ---------------------------------------------------------------- wrap

WRAP_VERDICTS = (
    "wrapped right",
    "declined, true reason",
    "declined, wrong reason",
    "declined, should wrap",
    "wrapped, should decline",
    "wrapped, wrong call",
    "broken",
)


def wrap_verdict(outcome: str, reason: str, calls: list[str], broken: list[str], expect: dict):
    """Judge one `--wrap` outcome against its expectation row (None: not judged)."""
    if not expect:
        return None
    if outcome == "error" or broken:
        return "broken"
    pattern = expect.get("pattern") or ""
    if outcome == "wrapped":
        if expect["expect"] != "wrap":
            return "wrapped, should decline"
        if pattern and not all(re.search(pattern, call) for call in calls):
            return "wrapped, wrong call"
        return "wrapped right"
    if expect["expect"] == "wrap":
        return "declined, should wrap"
    return "declined, true reason" if re.search(pattern, reason) else "declined, wrong reason"


def _wrap_one(root: Path, expectations: dict, repo: str, path: str) -> dict:
    """`rewrite --wrap` on one script in a scratch copy, judged."""
    with edited(root, repo, path, "--wrap") as (before, after, proc, _):
        added = added_lines(before, after)
        broken = new_name_errors(before, after) if after != before else []
    calls = [line for line in added if "autoopt.optimize(" in line]
    reasons = [
        line.split("--wrap declined:", 1)[-1].split("declined:", 1)[-1].strip()
        for line in proc.stderr.splitlines()
        if "declined" in line
    ]
    # the scratch copy's folder is no part of the reason
    reasons = [re.sub(r"\S*/autoopt-edit-[^/]+/", "", r) for r in reasons]
    if has_traceback(proc.stderr):
        outcome, reason = "error", proc.stderr.strip().splitlines()[-1]
    elif calls:
        outcome, reason = "wrapped", ""
    else:
        outcome, reason = "declined", reasons[0] if reasons else proc.stderr.strip()[-300:]
    expect = expectations.get((repo, path), {})
    return {
        "script": f"{repo}/{path}",
        "outcome": outcome,
        "reason": reason,
        "inserted": [line for line in added if line],
        "new_name_errors": broken,
        "verdict": wrap_verdict(outcome, reason, calls, broken, expect),
        "expected": expect.get("note", ""),
    }


def wrap(root: Path, labels_path: Path, expect_path: Path | None = None, jobs: int = 1) -> dict:
    """`rewrite --wrap` on every labelled script (in a scratch copy): wrapped, or declined and
    why; judged against the split's expectations (wrap_<split>.tsv) where it has them. An edit
    that leaves a name unbound (pyflakes, before vs after) is `broken`."""
    expectations = {(r["repo"], r["path"]): r for r in read_tsv(expect_path)} if expect_path else {}
    scripts = labelled_scripts(labels_path)
    require_scripts(root, scripts)

    rows = each_script(functools.partial(_wrap_one, root, expectations), scripts, jobs, "wrap")
    by_reason = Counter(r["reason"] for r in rows if r["outcome"] != "wrapped")
    verdicts = Counter(r["verdict"] for r in rows if r["verdict"])
    return {
        "scripts": len(rows),
        "wrapped": sum(r["outcome"] == "wrapped" for r in rows),
        "judged": sum(verdicts.values()),
        "verdicts": {v: verdicts.get(v, 0) for v in WRAP_VERDICTS},
        "declined_by_reason": dict(by_reason.most_common()),
        "rows": rows,
    }


def print_wrap(result: dict) -> None:
    print(f"wrapped {result['wrapped']} of {result['scripts']} scripts")
    if result["judged"]:
        judged = ", ".join(f"{v} {n}" for v, n in result["verdicts"].items())
        print(f"judged {result['judged']}: {judged}")
    print("\n| reason declined | scripts |")
    print("|---|--:|")
    for reason, n in result["declined_by_reason"].items():
        print(f"| {reason} | {n} |")
    print("\n| script | outcome | verdict | reason / inserted |")
    print("|---|---|---|---|")
    for r in result["rows"]:
        detail = r["reason"] or "; ".join(r["inserted"])[:200]
        if r["new_name_errors"]:
            detail += f" (new: {', '.join(r['new_name_errors'])})"
        print(f"| {r['script']} | {r['outcome']} | {r['verdict'] or ''} | {detail} |")


# ---------------------------------------------------------------- fixes


def fix_entry(
    before: str, after: str, proc, verdicts: list[dict], repo: str, path: str, variant: str
) -> dict:
    """One rewrite of one script, checked: parse, new undefined names, the verdicts' breaks."""
    added = added_lines(before, after)
    entry = {
        "changed": after != before,
        "unparseable": parses(after) if after != before else None,
        "new_name_errors": new_name_errors(before, after) if after != before else [],
        "added": added,
        "errors": [reason for _, reason in rewrite_errors(proc.stderr)],
        "traceback": has_traceback(proc.stderr),
        "breaks": [],
    }
    for v in verdicts:
        if (v["repo"], v["path"], v["variant"]) != (repo, path, variant):
            continue
        hits = [line for line in added if re.search(v["pattern"], line)]
        if hits:
            entry["breaks"].append(
                {"rule": v["rule"], "verdict": v["verdict"], "line": hits[0], "note": v["note"]}
            )
    return entry


def _fixes_one(root: Path, verdicts: list[dict], repo: str, path: str) -> dict:
    """`fixes` of one script: lint, `rewrite`, `rewrite --unsafe-fixes`, lint again."""
    # One scratch copy per script: lint the original there, then each rewrite starts from
    # the original text written back (the rewrite writes nothing else into the copy).
    with scratch(root, repo) as copy:
        file = copy / path
        before = file.read_text(encoding="utf-8", errors="replace")
        findings, _ = lint_findings([file], ("-j", "1", "--no-follow"), cwd=copy)
        fixable = {
            (f["code"], (f.get("fix") or {}).get("applicability")) for f in findings if f.get("fix")
        }
        row: dict = {"script": f"{repo}/{path}", "fixable_before": sorted(map(list, fixable))}
        for variant, extra in (("safe", ()), ("unsafe", ("--unsafe-fixes",))):
            after, proc = rewrite_once(file, before, *extra, cwd=copy)
            row[variant] = fix_entry(before, after, proc, verdicts, repo, path, variant)
            if variant == "unsafe":
                left, _ = lint_findings([file], ("-j", "1", "--no-follow"), cwd=copy)
                left = [f for f in left if not is_internal_error(f)]
                row[variant]["left"] = sorted({f["code"] for f in left})
                row[variant]["left_fixable"] = sorted(
                    f"{f['code']}:{f['location']['row']} ({f['fix']['applicability']})"
                    for f in left
                    if f.get("fix")
                )
    return row


def fixes(root: Path, labels_path: Path, verdicts_path: Path | None = None, jobs: int = 1) -> dict:
    """`rewrite` (safe fixes) and `rewrite --unsafe-fixes` on every labelled script, each in a
    scratch copy. Per script: the rules whose fixes were applied, undefined names the edit
    introduced (pyflakes before vs after), the added lines that the split's fix verdicts
    (fixes_<split>.tsv: a regex over the added lines and what such a line does to the script)
    mark as breaking it, and `autoopt lint` on the unsafe-rewritten file: what is left, and
    what of it still carries a fix the rewrite could have applied."""
    verdicts = read_tsv(verdicts_path) if verdicts_path else []
    scripts = labelled_scripts(labels_path)
    require_scripts(root, scripts)

    rows = each_script(functools.partial(_fixes_one, root, verdicts), scripts, jobs, "fixes")

    def count(variant: str, key: str) -> int:
        return sum(bool(r[variant][key]) for r in rows)

    def broken(variant: str, verdict: str) -> list[str]:
        return [
            r["script"]
            for r in rows
            if r[variant]["new_name_errors"]
            or r[variant]["unparseable"]
            or any(b["verdict"] == verdict for b in r[variant]["breaks"])
        ]

    return {
        "scripts": len(rows),
        "safe_changed": count("safe", "changed"),
        "unsafe_changed": count("unsafe", "changed"),
        "safe_breaks": broken("safe", "breaks"),
        "unsafe_breaks_beyond": broken("unsafe", "breaks"),
        "new_name_errors": {
            v: {r["script"]: r[v]["new_name_errors"] for r in rows if r[v]["new_name_errors"]}
            for v in ("safe", "unsafe")
        },
        "left_fixable": {
            r["script"]: r["unsafe"]["left_fixable"] for r in rows if r["unsafe"]["left_fixable"]
        },
        "rewrite_errors": {
            r["script"]: r["unsafe"]["errors"] for r in rows if r["unsafe"]["errors"]
        },
        "rows": rows,
    }


def print_fixes(result: dict) -> None:
    n = result["scripts"]
    print(
        f"{n} scripts: safe fixes changed {result['safe_changed']}, unsafe {result['unsafe_changed']}"
    )
    print(f"safe fixes break {len(result['safe_breaks'])}: {result['safe_breaks']}")
    print(
        f"unsafe fixes break beyond 'may change behaviour' {len(result['unsafe_breaks_beyond'])}:"
        f" {result['unsafe_breaks_beyond']}"
    )
    for variant, errors in result["new_name_errors"].items():
        for script, names in errors.items():
            print(f"  {variant}: {script}: new {', '.join(names)}")
    for r in result["rows"]:
        for variant in ("safe", "unsafe"):
            for b in r[variant]["breaks"]:
                print(f"  {variant}: {r['script']}: {b['rule']} {b['verdict']}: {b['line']}")
    left = result["left_fixable"]
    total = sum(len(v) for v in left.values())
    print(
        f"\nlint after rewrite --unsafe-fixes: {total} findings still carry a fix, in {len(left)} scripts"
    )
    for script, items in left.items():
        print(f"  {script}: {', '.join(items)}")
    for script, errors in result["rewrite_errors"].items():
        print(f"  rewrite error: {script}: {'; '.join(errors)[:300]}")


# ---------------------------------------------------------------- report


def report(root: Path, labels: Path, split: dict, runs: Path | None, jobs: int = 1) -> dict:
    """accuracy, wrap and fixes of one split, and (from run_scripts.py's JSON) whether the
    edited scripts still run: the figures of issue 21 in one command."""
    result = {
        "accuracy": accuracy(root, labels, jobs),
        "wrap": wrap(root, labels, split["wrap"], jobs),
        "fixes": fixes(root, labels, split["fixes"], jobs),
    }
    if runs and runs.is_file():
        result["runs"] = json.loads(runs.read_text(encoding="utf-8"))
    return result


def print_report(result: dict) -> None:
    acc, wr, fx = result["accuracy"], result["wrap"], result["fixes"]
    o, c = acc["overall"], acc["core"]
    print(
        f"lint: precision {o['precision']}, recall {o['recall']} over every labelled rule "
        f"(tp {o['tp']}, fp {o['fp']}, fn {o['fn']}); the {len(CORE_RULES)} core rules: "
        f"precision {c['precision']}, recall {c['recall']}"
    )
    print(
        f"wrap: {', '.join(f'{v} {n}' for v, n in wr['verdicts'].items())} "
        f"(of {wr['scripts']} scripts)"
    )
    print(
        f"safe fixes break {len(fx['safe_breaks'])} scripts; unsafe fixes break beyond "
        f"'may change behaviour' {len(fx['unsafe_breaks_beyond'])}; lint after "
        f"rewrite --unsafe-fixes: {sum(map(len, fx['left_fixable'].values()))} fixable left"
    )
    runs = {r["script"]: r for r in result.get("runs", {}).get("results", [])}
    wraps = {r["script"]: r for r in wr["rows"]}
    fixed = {r["script"]: r for r in fx["rows"]}
    print(
        "\n| script | lint tp/fp/fn | wrap | safe fixes | unsafe fixes | runs: original / safe / wrap |"
    )
    print("|---|---|---|---|---|---|")
    for script, counts in acc["per_script"].items():
        lint = f"{counts.get('tp', 0)}/{counts.get('fp', 0)}/{counts.get('fn', 0)}"
        w = wraps.get(script, {})
        cells = []
        for variant in ("safe", "unsafe"):
            e = fixed.get(script, {}).get(variant, {})
            bad = [f"{b['rule']} {b['verdict']}" for b in e.get("breaks", [])]
            bad += e.get("new_name_errors", [])
            cells.append(
                ("edited" if e.get("changed") else "unchanged")
                + (f" ({'; '.join(bad)})" if bad else "")
            )
        run = runs.get(script)
        ran = (
            " / ".join(run[v]["status"] for v in ("original", "safe", "wrap") if v in run)
            if run
            else ""
        )
        print(
            f"| {script} | {lint} | {w.get('verdict') or w.get('outcome', '')} | {cells[0]} | {cells[1]} | {ran} |"
        )


# ---------------------------------------------------------------- main


def machine() -> dict:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "command", choices=("robustness", "accuracy", "speed", "wrap", "fixes", "report")
    )
    parser.add_argument(
        "--runs", type=Path, help="report: run_scripts.py's JSON, for the still-runs column"
    )
    parser.add_argument(
        "--split",
        choices=tuple(SPLITS),
        default="dev",
        help="dev (tuned on), test (held out) or a first-contact batch (fresh-c, fresh-d, fresh-e, fresh-f, fresh-g, fresh-h, fresh-i, fresh-j, fresh-k, fresh-l, fresh-m, fresh-n, fresh-o, fresh-p, fresh-q, fresh-r, fresh-s, fresh-t, fresh-u, fresh-v, fresh-w, fresh-x, fresh-y, fresh-z, fresh-aa, fresh-ab, fresh-ac, fresh-ad, fresh-ae, fresh-af, fresh-ag, fresh-ah, fresh-ai, fresh-aj, fresh-ak, fresh-al, fresh-am, fresh-an, fresh-ao, fresh-ap, fresh-aq, fresh-ar, fresh-as, fresh-at, fresh-au, fresh-av, fresh-aw, fresh-ax)",
    )
    parser.add_argument("--root", type=Path, help="fetched corpus (default: the split's)")
    parser.add_argument("--labels", type=Path, help="labels TSV (default: the split's)")
    parser.add_argument("--json", type=Path, help="write the full results here")
    parser.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=2,
        help="processes (lint, parsing); accuracy, wrap, fixes: scripts at once",
    )
    parser.add_argument(
        "--repo", action="append", help="robustness/speed: only these repos (owner/name, torch)"
    )
    parser.add_argument(
        "--time-files",
        action="store_true",
        help="robustness: also time lint and fixes per file (a second, in-process pass)",
    )
    args = parser.parse_args(argv)
    split = SPLITS[args.split]
    root = args.root or split["root"]
    labels = args.labels or split["labels"]

    if args.command == "robustness":
        result, show = (
            robustness(root, args.jobs, repo_names(args.repo), args.json, args.time_files),
            print_robustness,
        )
    elif args.command == "accuracy":
        result, show = accuracy(root, labels, args.jobs), print_accuracy
    elif args.command == "speed":
        result, show = speed(root, args.jobs, repo_names(args.repo)), print_speed
    elif args.command == "wrap":
        result, show = wrap(root, labels, split["wrap"], args.jobs), print_wrap
    elif args.command == "fixes":
        result, show = fixes(root, labels, split["fixes"], args.jobs), print_fixes
    else:
        result, show = report(root, labels, split, args.runs, args.jobs), print_report
    result["split"] = args.split
    result["machine"] = machine()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    show(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
