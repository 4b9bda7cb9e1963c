"""Linting files: read, decode, pre-filter, parse, run the rules, suppress; parallel and cached.

Per file (`lint_bytes`): the bytes are decoded (`encoding.decode_source`: PEP 263, BOM, UTF-8);
a notebook becomes its joined code cells; a file-level `# autoopt: noqa` ends it there; the cheap
text pre-filter (`engine.active_rules`) drops the rules whose triggers are absent, and a file with
no rule left only gets CPython's cheap syntax check; otherwise libcst parses it once and every
remaining rule visits it in one batched traversal; `# noqa` comments then drop suppressed
findings. Anything that goes wrong becomes a `FileError` of that file (with line and reason) and
the run goes on; a rule that raises costs only its own findings on that file.

Across files (`run_lint`): results are looked up in the cache by content hash first; the rest
run in worker processes (fork, so workers inherit the loaded rules without pickling them; serial
when fork is unavailable or there are few files). Output is sorted, so parallel == serial.
Never imports or executes the code it reads: libcst, `ast` and `compile()` only parse it.
"""

from __future__ import annotations

import ast
import dataclasses
import multiprocessing
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from autoopt.lint.engine import analysis as engine
from autoopt.lint.engine import suppress
from autoopt.lint.engine.cache import Cache, settings_key
from autoopt.lint.engine.collector import collector_paused
from autoopt.lint.engine.discovery import display_path, is_notebook
from autoopt.lint.engine.project import Project
from autoopt.lint.engine.results import Diagnostic, FileError, FileResult
from autoopt.lint.engine.rule import FixSafety, Rule
from autoopt.lint.program import project_files
from autoopt.lint.tree.encoding import SourceDecodeError, content_digest, decode_source
from autoopt.lint.tree.legacy_async import rename_async_keywords
from autoopt.lint.tree.legacy_tabs import expand_indent_tabs
from autoopt.lint.tree.notebook import NotebookError, NotebookSource, notebook_source

# Below this many files to analyse, starting worker processes costs more than it saves.
MIN_PARALLEL_FILES = 16
Progress = Callable[[int], None]


# ----- one file --------------------------------------------------------------------------------


def check_syntax(source: str, path: str, *, notebook: bool = False) -> FileError | None:
    """A syntax check for a file no rule needs parsed: CPython's own compiler (about 8x cheaper
    than libcst; it builds code objects and never runs them), as a "parse" error or None."""
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if notebook else 0  # IPython allows top-level await
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarnings (invalid escapes) are not errors
            compile(source, path, "exec", flags=flags, dont_inherit=True)
    except SyntaxError as exc:
        return FileError(
            f"syntax error: {exc.msg}", exc.lineno or 0, exc.offset or 0, None, "parse"
        )
    except (ValueError, RecursionError, MemoryError) as exc:  # e.g. a NUL byte, deep nesting
        return FileError(f"cannot compile: {exc}", 0, 0, None, "parse")
    return None


def syntax_error(source: str, exc: cst.ParserSyntaxError) -> FileError:
    """A readable syntax error: CPython's message and position where it agrees (parsing with
    `ast` only, which never executes anything), libcst's otherwise. `lint` and `rewrite` both
    report a file libcst cannot parse with it, so they agree on the message and position."""
    try:
        ast.parse(source)
    except SyntaxError as py_exc:
        return FileError(
            f"syntax error: {py_exc.msg}", py_exc.lineno or 0, py_exc.offset or 0, None, "parse"
        )
    except (ValueError, RecursionError, MemoryError):
        pass
    message = exc.message.replace("parser error: ", "")
    if len(message) > 160:
        message = message[:157] + "..."
    return FileError(f"syntax error: {message}", exc.raw_line, exc.raw_column + 1, None, "parse")


_LEGACY_ASYNC = (
    "syntax error: `async=` is a keyword since Python 3.7 (torch 0.4 renamed the argument "
    "`non_blocking=`); linted as if renamed, no fix offered in this file"
)


_LEGACY_TABS = (
    "indentation mixes tabs and spaces in a way Python reads (a tab to the next 8-column "
    "stop) and libcst does not; linted with the tabs expanded, no fix offered in this file"
)


def _parsed_or_none(text: str) -> cst.Module | None:
    try:
        return engine.parse_module(text)
    except cst.ParserSyntaxError:
        return None


def _crashed_rule(exc: BaseException) -> str | None:
    """The code of the rule whose visitor raised `exc`, found on the traceback."""
    code = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        owner = frame.f_locals.get("self")
        if isinstance(owner, Rule):
            code = owner.code
    return code


def _relocate(diag: Diagnostic, nb: NotebookSource) -> Diagnostic:
    cell, line = nb.locate(diag.line)
    end_cell, end_line = nb.locate(diag.end_line)
    if end_cell != cell:  # a finding spanning cells is shown to the end of its first cell
        end_line, end_column = line, diag.column
    else:
        end_column = diag.end_column
    return Diagnostic(
        diag.code,
        diag.message,
        line,
        diag.column,
        end_line,
        end_column,
        # `autoopt rewrite` does not edit notebooks: nothing in one is shown as fixable
        FixSafety.NONE.value,
        "",
        cell,
    )


def _relocate_error(error: FileError, nb: NotebookSource | None) -> FileError:
    if nb is None or not error.line:
        return error
    cell, line = nb.locate(error.line)
    return FileError(error.reason, line, error.column, cell, error.kind)


@collector_paused()
def lint_bytes(
    data: bytes,
    path: str,
    rules: Sequence[type[Rule]],
    target_version: tuple[int, int] | None = None,
    *,
    notebook: bool = False,
    display: str | None = None,
) -> FileResult:
    """Lint one file's content. Never raises for a problem of the file; see the module docs."""
    result = FileResult(path=display or path, digest=content_digest(data))
    nb: NotebookSource | None = None
    try:
        text = decode_source(data).text
        if notebook:
            nb = notebook_source(text)
            text = nb.source
        file_level = suppress.file_suppressions(text)
        if file_level is suppress.ALL:
            return result
        if file_level:
            rules = [r for r in rules if not suppress.matches(r.code, file_level)]
        active = engine.active_rules(rules, text, target_version, path)
        if not active:  # the pre-filter: no rule can match, so a cheap syntax check is all
            error = check_syntax(text, path, notebook=notebook)
            if error is not None:
                result.errors.append(_relocate_error(error, nb))
            return result
        legacy = False
        try:
            module = engine.parse_module(text)  # a huge file in chunks, the same tree
        except cst.ParserSyntaxError as exc:
            renamed = rename_async_keywords(text) if nb is None else None
            module = _parsed_or_none(renamed.text) if renamed is not None else None
            if renamed is not None and module is not None:
                # `x.cuda(async=True)` of torch < 0.4: linted as if renamed, no fix offered
                result.errors.append(
                    FileError(_LEGACY_ASYNC, renamed.line, renamed.column + 1, None, "legacy")
                )
                text, legacy = renamed.text, True
            else:
                expanded = expand_indent_tabs(text) if nb is None else None
                module = _parsed_or_none(expanded.text) if expanded is not None else None
                if expanded is None or module is None:
                    result.errors.append(_relocate_error(syntax_error(text, exc), nb))
                    return result
                # tabs mixed into indentation as Python reads them: linted expanded, no fix
                result.errors.append(FileError(_LEGACY_TABS, expanded.line, 1, None, "legacy"))
                text, legacy = expanded.text, True
        result.parsed = True
        project_files.begin_file()
        analysis = engine.run_rules(module, text, path, active, target_version)
        result.depends = project_files.files_read()
        findings = suppress.filter_findings(analysis.findings, text)
        for crash in analysis.crashes:
            error = FileError(crash.describe(), crash.line, crash.column, None, "internal")
            result.errors.append(_relocate_error(error, nb))
    except (SourceDecodeError, NotebookError) as exc:
        result.errors.append(unreadable_source(exc))
        return result
    except RecursionError:
        result.errors.append(FileError("code nested too deeply to analyse", 0, 0, None, "internal"))
        return result
    except Exception as exc:  # the engine's own bug must not stop the run, but it must be seen
        code = _crashed_rule(exc)
        who = f"rule {code}" if code else "the engine"
        result.errors.append(
            FileError(f"internal error in {who}: {type(exc).__name__}: {exc}", kind="internal")
        )
        return result
    diagnostics = [Diagnostic.from_finding(f) for f in findings]
    if nb is not None:
        diagnostics = [_relocate(d, nb) for d in diagnostics]
    if legacy:  # the findings are the renamed text's: no edit of it may reach the file
        diagnostics = [
            dataclasses.replace(d, fix_safety=FixSafety.NONE.value, fix_message="")
            for d in diagnostics
        ]
    result.diagnostics = diagnostics
    return result


def lint_path(
    path: Path | str,
    rules: Sequence[type[Rule]],
    target_version: tuple[int, int] | None = None,
    display: str | None = None,
) -> FileResult:
    """Read and lint one file; an unreadable file is an error entry, not an exception."""
    shown = display or display_path(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return FileResult(shown, errors=[read_error(exc)])
    return lint_bytes(
        data, str(path), rules, target_version, notebook=is_notebook(path), display=shown
    )


def read_error(exc: OSError) -> FileError:
    """A file that could not be read, as `lint` and `rewrite` report it."""
    if isinstance(exc, IsADirectoryError):
        return FileError("cannot read: is a folder", kind="read")
    return FileError(f"cannot read: {exc.strerror or exc}", kind="read")


def unreadable_source(exc: SourceDecodeError | NotebookError) -> FileError:
    """Bytes that are not Python source (binary, undecodable) or a notebook that cannot be read,
    as `lint` and `rewrite` report them."""
    kind = "decode" if isinstance(exc, SourceDecodeError) else "parse"
    return FileError(exc.reason, exc.line, exc.column, None, kind)


# ----- many files ------------------------------------------------------------------------------

_Task = tuple[int, str, str]  # (index, path, display)
# Set in the parent just before forking; workers inherit it (no pickling of rule classes).
_WORKER_STATE: tuple[Sequence[type[Rule]], tuple[int, int] | None] | None = None


def _lint_chunk(chunk: Sequence[_Task]) -> list[tuple[int, FileResult]]:
    assert _WORKER_STATE is not None
    rules, target = _WORKER_STATE
    return [(i, lint_path(path, rules, target, display)) for i, path, display in chunk]


def fork_available() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS/Windows
        return max(1, os.cpu_count() or 1)


def _chunks(tasks: Sequence[_Task], n_chunks: int) -> list[list[_Task]]:
    """Split tasks into balanced chunks: biggest files first, dealt round-robin."""

    def size(task: _Task) -> int:
        try:
            return os.path.getsize(task[1])
        except OSError:
            return 0

    ordered = sorted(tasks, key=size, reverse=True)
    chunks: list[list[_Task]] = [[] for _ in range(min(n_chunks, len(ordered)))]
    for i, task in enumerate(ordered):
        chunks[i % len(chunks)].append(task)
    return chunks


def execute(
    tasks: Sequence[_Task],
    rules: Sequence[type[Rule]],
    target_version: tuple[int, int] | None,
    jobs: int | None = None,
    progress: Progress | None = None,
) -> Iterable[tuple[int, FileResult]]:
    """Lint `tasks`, in worker processes when it pays off; yields (index, result) as they come."""
    global _WORKER_STATE
    jobs = default_jobs() if jobs is None else jobs
    if jobs <= 1 or len(tasks) < MIN_PARALLEL_FILES or not fork_available():
        for i, path, display in tasks:
            yield i, lint_path(path, rules, target_version, display)
            if progress:
                progress(1)
        return
    _WORKER_STATE = (rules, target_version)
    done: set[int] = set()
    try:
        with warnings.catch_warnings():
            # 3.12+ warns that fork with threads may deadlock; workers only parse text.
            warnings.simplefilter("ignore", DeprecationWarning)
            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
                futures = [pool.submit(_lint_chunk, c) for c in _chunks(tasks, jobs * 4)]
                for future in as_completed(futures):
                    batch = future.result()
                    for i, result in batch:
                        done.add(i)
                        yield i, result
                    if progress:
                        progress(len(batch))
    except (BrokenProcessPool, OSError) as exc:
        # A worker died (out of memory, killed) or processes cannot be made: finish serially.
        print(f"autoopt: worker processes failed ({exc}); continuing serially", file=sys.stderr)
        for i, path, display in tasks:
            if i not in done:
                yield i, lint_path(path, rules, target_version, display)
                if progress:
                    progress(1)
    finally:
        _WORKER_STATE = None


@dataclass
class LintReport:
    """The outcome of a run: one result per file (sorted by path) and what was run."""

    results: list[FileResult]
    rules: list[type[Rule]]
    files_checked: int = 0
    elapsed: float = 0.0
    cached: int = 0
    parsed: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def diagnostics(self) -> list[tuple[str, Diagnostic]]:
        return [(r.path, d) for r in self.results for d in r.diagnostics]

    @property
    def errors(self) -> list[tuple[str, FileError]]:
        return [(r.path, e) for r in self.results for e in r.errors]

    def exit_code(self, exit_zero: bool = False) -> int:
        """0 clean, 1 findings, 2 files that could not be linted (all 0 with `exit_zero`)."""
        if exit_zero:
            return 0
        if self.errors:
            return 2
        return 1 if self.diagnostics else 0


def _sort_key(diag: Diagnostic) -> tuple[int, int, int, str]:
    return (diag.cell or 0, diag.line, diag.column, diag.code)


def run_lint(
    project: Project,
    *,
    jobs: int | None = None,
    progress: Progress | None = None,
    use_cache: bool | None = None,
) -> LintReport:
    """Lint every file of `project` (see the module docs) and return the sorted report."""
    from autoopt import __version__

    started = time.perf_counter()
    settings = project.settings
    rules = project.rules
    target = settings.target_version
    files = project.checked_files
    enabled = settings.use_cache if use_cache is None else use_cache
    key = settings_key(project.registry.fingerprint(rules), target)
    cache = Cache(settings.project_root, key, __version__, enabled=enabled and bool(files))

    results: dict[int, FileResult] = {}
    tasks: list[_Task] = []
    for i, path in enumerate(files):
        display = display_path(path)
        if cache.enabled:  # hash here: a hit needs no worker at all
            try:
                data = path.read_bytes()
            except OSError as exc:
                results[i] = FileResult(display, errors=[read_error(exc)])
                if progress:
                    progress(1)
                continue
            hit = cache.get(path, content_digest(data), display)
            if hit is not None:
                results[i] = hit
                if progress:
                    progress(1)
                continue
        tasks.append((i, str(path), display))

    for i, result in execute(tasks, rules, target, jobs, progress):
        results[i] = result
        cache.put(files[i], result)
    cache.save()

    ordered: list[FileResult] = []
    for i, path in enumerate(files):
        result = results[i]
        diagnostics = [d for d in result.diagnostics if project.reports(path, d.code, d.line)]
        diagnostics.sort(key=_sort_key)
        ordered.append(
            FileResult(
                result.path,
                diagnostics,
                list(result.errors),
                result.digest,
                result.parsed,
                result.cached,
            )
        )
    for shown, error in project.discovered.errors:
        ordered.append(FileResult(shown, errors=[error]))
    ordered.sort(key=lambda r: r.path)
    return LintReport(
        results=ordered,
        rules=list(rules),
        files_checked=len(files),
        elapsed=time.perf_counter() - started,
        cached=sum(1 for r in ordered if r.cached),
        parsed=sum(1 for r in ordered if r.parsed),
    )
