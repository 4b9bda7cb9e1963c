"""Running rules over source text: parse once, visit with every active rule in one pass."""

from __future__ import annotations

import contextlib
import ctypes
import os
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst
from libcst.metadata import ExpressionContextProvider, PositionProvider, ScopeProvider

from autoopt.lint.engine.rule import FileContext, Finding, Rule
from autoopt.lint.tree import metadata, parsing
from autoopt.lint.tree.chunks import CHUNK_LINES, LARGE_FILE_LINES, top_level_cuts
from autoopt.lint.tree.nodes import Preorder
from autoopt.lint.tree.text import strip_prose


@dataclass(frozen=True)
class RuleCrash:
    """A rule that raised on a file: its findings for that file are dropped, no one else's."""

    code: str
    name: str
    error: str  # "AttributeError: ... (at rule_file.py:42)"
    line: int = 0  # where the rule was visiting (1-based), when known
    column: int = 0

    def describe(self) -> str:
        return f"internal error in rule {self.code} ({self.name}): {self.error}"


@dataclass
class Analysis:
    """The parsed module, the findings on it (fixes' nodes are nodes of `module`) and the rules
    that crashed on it."""

    module: cst.Module
    findings: list[Finding]
    crashes: list[RuleCrash] = field(default_factory=list)


def analyze(
    source: str,
    path: Path | str,
    rules: Sequence[type[Rule]],
    target_version: tuple[int, int] | None = None,
    parse: Callable[[str], cst.Module] | None = None,
    active: Sequence[type[Rule]] | None = None,
) -> Analysis:
    """Parse `source` (with `parse` if given: it must give `libcst.parse_module`'s tree) and run
    `rules` on it (those whose triggers appear in the text and that apply to
    `target_version`; `active`: that list, when the caller has just computed it).
    Raises `libcst.ParserSyntaxError` on unparsable code."""
    if active is None:
        active = active_rules(rules, source, target_version, path)
    module = parsing.parse_module(source) if parse is None else parse(source)
    return run_rules(module, source, path, active, target_version)


def parse_module(source: str) -> cst.Module:
    """`libcst.parse_module(source)`; a file of `LARGE_FILE_LINES` lines or more is parsed in
    chunks of top-level statements and joined into the same tree (`parse_large`)."""
    if source.count("\n") >= LARGE_FILE_LINES:
        module = parse_large(source)
        if module is not None:
            return module
    return parsing.parse_module(source)


def parse_large(source: str, chunk_lines: int = CHUNK_LINES) -> cst.Module | None:
    """The tree `libcst.parse_module(source)` gives, made from parses of runs of about
    `chunk_lines` lines of whole top-level statements (found with `ast`), so the parser's
    working memory is a chunk's. A chunk ends after a statement only where the lines up to
    the next one are empty or comments at column 0 (a line of spaces may close the block
    above): those open the next chunk, whose module
    header they become, and go back to its first statement's leading lines, where a parse of
    the whole file puts them. None (parse it whole) when `ast` rejects the text, a chunk does
    not parse, or the chunks infer another indentation or newline than the first."""
    cuts = top_level_cuts(source, chunk_lines)
    if cuts is None:
        return None
    lines = source.splitlines(keepends=True)
    first: cst.Module | None = None
    statements: list[cst.BaseStatement] = []
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        try:
            chunk = parsing.parse_module("".join(lines[lo:hi]))
        except Exception:
            return None
        part = list(chunk.body)
        if first is None:
            first = chunk
        elif (chunk.default_indent, chunk.default_newline) != (
            first.default_indent,
            first.default_newline,
        ) or not part:
            return None
        elif chunk.header:
            part[0] = part[0].with_changes(leading_lines=[*chunk.header, *part[0].leading_lines])
        statements.extend(part)
        last_chunk = chunk
    assert first is not None
    _return_freed_memory()
    return first.with_changes(
        body=statements,
        footer=last_chunk.footer,
        has_trailing_newline=last_chunk.has_trailing_newline,
    )


def _return_freed_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's `malloc_trim`; elsewhere
    nothing). The native parser's freed working memory stays in the heap otherwise, and
    Python's own objects, which come from separate arenas, never reuse most of it: on a 50k-line
    file that is 100 MB held until the process ends."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def run_rules(
    module: cst.Module,
    source: str,
    path: Path | str,
    rules: Sequence[type[Rule]],
    target_version: tuple[int, int] | None = None,
) -> Analysis:
    """Run `rules` (already filtered, see `active_rules`) over a parsed `module` in one batched
    traversal; the metadata resolved is the union of what these rules declare. Findings come
    sorted by position. A rule that raises is left out of this file and listed in `crashes`."""
    if not rules:
        return Analysis(module, [])
    wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
    parents = metadata.install(wrapper, source)
    _defer_metadata(wrapper, rules)
    context = FileContext(Path(path), source, module, wrapper, target_version)
    visitors: list[Rule] = []
    crashes: list[RuleCrash] = []
    for rule in rules:
        try:
            visitors.append(rule(context))
        except Exception as exc:
            crashes.append(RuleCrash(rule.code, rule.name, _describe(exc)))
    _visit_batched(wrapper, parents.tree, visitors)
    findings: list[Finding] = []
    last = [v for v in visitors if getattr(v, "runs_after_other_rules", False)]
    for visitor in visitors:
        if visitor in last:
            continue
        if visitor.crash is None:
            findings.extend(visitor.findings)
        else:
            crashes.append(_crash_of(visitor, wrapper))
    for visitor in last:  # AO001: judges the other rules' findings, before suppression
        if visitor.crash is None:
            try:
                visitor.after_other_rules(list(findings), [v.code for v in visitors])
            except Exception as exc:
                crashes.append(RuleCrash(visitor.code, visitor.name, _describe(exc)))
                continue
            findings.extend(visitor.findings)
        else:
            crashes.append(_crash_of(visitor, wrapper))
    findings.sort(key=lambda f: (f.line, f.column, f.code))
    return Analysis(module, findings, crashes)


def _visit_batched(wrapper: cst.MetadataWrapper, tree: Preorder, visitors: list[Rule]) -> None:
    """What `wrapper.visit_batched(visitors)` does, read off the tree's preorder: each node's
    `visit_<Node>` methods in source order, its `leave_<Node>` methods after its last
    descendant's, every visitor in turn. libcst's traversal rebuilds every node it passes
    (validating each), which cost more than all the rules together. Rules with attribute
    visitors (`visit_<Node>_<field>`) get libcst's traversal. Only the nodes of a class some
    rule has a method for are stepped on (a tenth of a tree's nodes): the others would call
    nothing."""
    methods: dict[str, list[Callable[[cst.CSTNode], None]]] = {}
    for visitor in visitors:
        for name, method in visitor.get_visitors().items():
            methods.setdefault(name, []).append(method)
    if any("_" in name.split("_", 1)[1] for name in methods):
        wrapper.visit_batched(visitors)
        return
    no_methods: list[Callable[[cst.CSTNode], None]] = []
    visits: dict[type, list[Callable[[cst.CSTNode], None]]] = {}
    leaves: dict[type, list[Callable[[cst.CSTNode], None]]] = {}
    nodes, end = tree.nodes, tree.end
    pending: list[int] = []  # ranks of the open nodes with leave methods, innermost last
    with contextlib.ExitStack() as stack:
        for visitor in visitors:
            stack.enter_context(visitor.resolve(wrapper))
        for rank in tree.ranks_of_named({name.split("_", 1)[1] for name in methods}):
            node = nodes[rank]
            while pending and end[pending[-1]] <= rank:
                done = nodes[pending.pop()]
                for method in leaves[type(done)]:
                    method(done)
            kind = type(node)
            on_visit = visits.get(kind)
            if on_visit is None:
                on_visit = visits[kind] = methods.get(f"visit_{kind.__name__}", no_methods)
                leaves[kind] = methods.get(f"leave_{kind.__name__}", no_methods)
            for method in on_visit:
                method(node)
            if leaves[kind]:
                pending.append(rank)
        while pending:
            done = nodes[pending.pop()]
            for method in leaves[type(done)]:
                method(done)


def _describe(exc: BaseException) -> str:
    """`Type: message (at file.py:line)`, the line being where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _crash_of(visitor: Rule, wrapper: cst.MetadataWrapper) -> RuleCrash:
    assert visitor.crash is not None
    line = column = 0
    if visitor.crash_node is not None:
        with contextlib.suppress(Exception):  # positions may be what failed
            start = wrapper.resolve(PositionProvider)[visitor.crash_node].start
            line, column = start.line, start.column + 1
    return RuleCrash(visitor.code, visitor.name, _describe(visitor.crash), line, column)


# What the pre-filter reads for a file that trains through the project's other code (its loop in
# another module's function, its backward inside a loss scaler): it counts as calling backward.
TRAINS_ELSEWHERE = "\n.backward(\n"
# ... and for such a file whose device is chosen in a module it imports (`dist_util.dev()`).
RUNS_ON_CUDA_ELSEWHERE = "\ncuda\n"


def active_rules(
    rules: Sequence[type[Rule]],
    source: str,
    target_version: tuple[int, int] | None = None,
    path: Path | str | None = None,
) -> list[type[Rule]]:
    """The rules that can possibly report on `source`: they apply to `target_version` and one of
    their `triggers` occurs in the code (comments and triple-quoted strings do not count:
    torch's own sources say "backward" or "cuda" far more in prose than in code). A rule
    without triggers always runs. When this is empty the file need not even be parsed. With
    the file's `path`, a file that trains through the project's other code counts as calling
    `backward()` (`program.view.drives_training_elsewhere`)."""
    if path is not None and ".backward(" not in source and _trains_elsewhere(path, source):
        source += TRAINS_ELSEWHERE
        if "cuda" not in source and _reaches_cuda(path, source):
            source += RUNS_ON_CUDA_ELSEWHERE
    candidates = [r for r in rules if r.applies_to(target_version) and _text_matches(r, source)]
    if not any(r.triggers or r.requires or r.covered_by_optimize for r in candidates):
        return candidates
    code = strip_prose(source)
    optimized = calls_autoopt_optimize(code)
    return [
        r
        for r in candidates
        # AO001 reads the comments themselves: its trigger was matched on the raw text above.
        if (_text_matches(r, code) or getattr(r, "runs_after_other_rules", False))
        and not (optimized and r.covered_by_optimize)
    ]


def _trains_elsewhere(path: Path | str, source: str) -> bool:
    from autoopt.lint.program.view import drives_training_elsewhere

    try:
        return drives_training_elsewhere(path, source)
    except (OSError, RecursionError, ValueError):  # the program model is best effort here
        return False


def _reaches_cuda(path: Path | str, source: str) -> bool:
    from autoopt.lint.program.view import reached_text_uses_cuda

    try:
        return reached_text_uses_cuda(Path(os.path.abspath(path)), source)
    except (OSError, RecursionError, ValueError):
        return False


def calls_autoopt_optimize(code: str) -> bool:
    """The file hands its training objects to `autoopt.optimize()` (`import autoopt` /
    `from autoopt import optimize`), which applies the runtime's tricks itself."""
    return "optimize(" in code and ("import autoopt" in code or "from autoopt import" in code)


def _text_matches(rule: type[Rule], text: str) -> bool:
    """Any of the rule's triggers and all of its requirements occur in `text`."""
    return (not rule.triggers or any(t in text for t in rule.triggers)) and all(
        (r in text) if isinstance(r, str) else any(alt in text for alt in r) for r in rule.requires
    )


# libcst providers computed only when a rule first asks for them. Each is a full Python
# traversal of the tree (several times the cost of parsing). Positions, parents and qualified
# names never get here: `metadata.install` supplies cheap equivalents. Declaring them stays the
# rules' business; when they are computed is ours.
_DEFERRED = (ScopeProvider, ExpressionContextProvider)


class _DeferredMetadata(Mapping[cst.CSTNode, Any]):
    """Stands in for a provider's metadata in the wrapper and computes it on first lookup."""

    def __init__(self, wrapper: cst.MetadataWrapper, provider: type) -> None:
        self._wrapper = wrapper
        self._provider = provider
        self._data: Mapping[cst.CSTNode, Any] | None = None

    def _load(self) -> Mapping[cst.CSTNode, Any]:
        if self._data is None:
            computed = self._wrapper._metadata  # libcst has no public hook for this
            if computed.get(self._provider) is self:
                del computed[self._provider]  # let libcst compute (and store) the real one
            self._data = self._wrapper.resolve(self._provider)
        return self._data

    def __getitem__(self, node: cst.CSTNode) -> Any:
        return self._load()[node]

    def get(self, node: cst.CSTNode, default: Any = None) -> Any:
        return self._load().get(node, default)

    def __contains__(self, node: object) -> bool:
        return node in self._load()

    def __iter__(self) -> Iterator[cst.CSTNode]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


def _defer_metadata(wrapper: cst.MetadataWrapper, rules: Sequence[type[Rule]]) -> None:
    """Put deferred stand-ins for the costly providers the rules declare into `wrapper`."""
    # What the rules declare and what that needs in turn (QualifiedNameProvider: scopes).
    declared: set[type] = set()
    pending = [p for rule in rules for p in rule.get_inherited_dependencies()]
    while pending:
        provider = pending.pop()
        if provider not in declared:
            declared.add(provider)
            pending.extend(provider.get_inherited_dependencies())
    for provider in _DEFERRED:
        if provider in declared and provider not in wrapper._metadata:
            wrapper._metadata[provider] = _DeferredMetadata(wrapper, provider)
