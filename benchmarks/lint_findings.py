"""Findings and rewrite outcomes of a corpus, as JSON lines: the check that a speed change keeps
what lint and rewrite say byte-identical.

Per file, in path order: `autoopt lint`'s diagnostics and file errors (`run_lint`, no cache,
one process) and, with `--rewrite`, what `rewrite --check` computes (`fix_source`: the new text's
hash, the fixes applied, declined, unsafe-available, rejected and skipped, the passes). Run it on
two checkouts and compare the outputs:

    python benchmarks/lint_findings.py --corpus dev --every 3 --rewrite -o after.jsonl
    PYTHONPATH=<export of the base commit> python benchmarks/lint_findings.py \\
        --corpus dev --every 3 --rewrite -o before.jsonl
    cmp before.jsonl after.jsonl

`--corpus dev` is the development split (benchmarks/corpus/_repos, torch's own sources left
out: they are a library, not training code, and as big as the rest together); `--corpus test`
the held-out split; `--dir` any folder. `--every N` keeps every Nth file.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"


def corpus_roots(name: str) -> list[Path]:
    """The repositories of a named split."""
    if name == "test":
        return [CORPUS / "_repos_test"]
    return sorted(p for p in (CORPUS / "_repos").iterdir() if p.is_dir() and p.name != "torch")


def rewrite_record(path: Path, project: object) -> dict:
    """What `rewrite --check` computes for one file (no text, its hash)."""
    from autoopt.lint.engine.suppress import filter_findings
    from autoopt.lint.rewrite.apply import fix_source

    source = path.read_bytes().decode("utf-8", errors="replace")
    try:
        result = fix_source(
            source,
            project.rules_for(path),  # type: ignore[attr-defined]
            unsafe=project.settings.unsafe_fixes,  # type: ignore[attr-defined]
            target_version=project.settings.target_version,  # type: ignore[attr-defined]
            path=str(path),
            finding_filter=filter_findings,
        )
    except Exception as exc:  # the CLI reports these; the type and text must not change
        return {"error": f"{type(exc).__name__}: {exc}"}
    finding = lambda f: [f.code, f.line, f.column, f.end_line, f.end_column, f.message]  # noqa: E731
    return {
        "sha": hashlib.sha256(result.source.encode()).hexdigest()[:16],
        "applied": [[a.code, a.description, a.line] for a in result.applied],
        "declined": [finding(f) for f in result.declined],
        "unsafe": [finding(f) for f in result.unsafe_available],
        "rejected": [[r.code, r.description, r.line, r.reason] for r in result.rejected],
        "skipped": [[s.code, s.reason] for s in result.skipped],
        "passes": result.passes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", choices=("dev", "test"), default="dev")
    parser.add_argument("--dir", type=Path, action="append", help="corpus folder (repeatable)")
    parser.add_argument("--every", type=int, default=1, help="keep every Nth file")
    parser.add_argument("--rewrite", action="store_true", help="also record `rewrite --check`")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()

    from autoopt.lint.engine.config import Options
    from autoopt.lint.engine.project import load_project
    from autoopt.lint.engine.runner import run_lint

    roots = [d.resolve() for d in args.dir] if args.dir else corpus_roots(args.corpus)
    files = [(r, p) for r in roots for p in sorted(r.rglob("*.py"))][:: args.every]
    scratch = Path(tempfile.mkdtemp(prefix="autoopt-findings-"))
    try:
        corpus = scratch / "corpus"
        for root, path in files:
            target = corpus / root.name / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        (scratch / "pyproject.toml").write_text("[tool.autoopt]\n")
        with contextlib.chdir(scratch):
            project = load_project([corpus], Options(no_cache=True))
            report = run_lint(project, jobs=1)
            rewrites = {}
            if args.rewrite:
                for path in project.files:
                    rewrites[str(path.relative_to(corpus))] = rewrite_record(path, project)
        with args.output.open("w", encoding="utf-8") as out:
            for result in report.results:
                shown = result.path.removeprefix("corpus/")
                record = {
                    "path": shown,
                    "parsed": result.parsed,
                    "diagnostics": [d.__dict__ for d in result.diagnostics],
                    "errors": [e.__dict__ for e in result.errors],
                }
                if shown in rewrites:
                    record["rewrite"] = rewrites[shown]
                out.write(json.dumps(record, sort_keys=True, default=str) + "\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{len(report.results)} files, {len(report.diagnostics)} findings -> {args.output}")


if __name__ == "__main__":
    sys.exit(main())
