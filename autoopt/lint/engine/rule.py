"""The rule contract: one `Rule` subclass per file in `rules/`.

A rule is a libcst batchable visitor. Its class attributes are its identity and documentation
(the class docstring *is* the documentation `autoopt explain` prints) and its examples, from
which the test suite is generated:

    class DataLoaderNumWorkers(Rule):
        '''Markdown docs: what, why (with numbers), when not to apply it.'''
        code = "AO101"
        name = "dataloader-num-workers"
        message = "DataLoader loads batches in the main process; set num_workers"
        fix_safety = FixSafety.UNSAFE
        fix_reason = "worker processes need a picklable dataset and a __main__ guard"
        triggers = ("DataLoader",)            # text pre-filter: skip files with none of these
        VALID = [Valid("...code...")]
        INVALID = [Invalid("...code...", line=3, fixed="...code after --unsafe-fixes...")]

        def visit_Call(self, node: cst.Call) -> None:
            if self.is_call_to(node, "torch.utils.data.DataLoader"):
                self.report(node, fix=Fix(replacements={node: new_node}))
"""

from __future__ import annotations

import functools
import inspect
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import libcst as cst
from libcst.codemod.visitors import ImportItem
from libcst.metadata import (
    CodeRange,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
)

from autoopt.lint.tree.metadata import QualifiedNames

if TYPE_CHECKING:
    from autoopt.lint.program.facts import FileFacts
    from autoopt.lint.program.view import ProgramView


class FixSafety(str, Enum):
    """Whether a rule has a fix, and whether `rewrite` applies it by default."""

    NONE = "none"  # report only
    SAFE = "safe"  # keeps behaviour; applied by `autoopt rewrite`
    UNSAFE = "unsafe"  # may change behaviour; applied only with --unsafe-fixes


@dataclass(frozen=True)
class Fix:
    """An edit of the file: original node -> new node (or `cst.RemoveFromParent()`, or a
    `cst.FlattenSentinel` of statements). Several replacements may form one fix; they must not
    overlap. `add_imports` are added by libcst's AddImportsVisitor; `remove_imports` are removed
    only if they became unused (RemoveImportsVisitor)."""

    replacements: Mapping[cst.CSTNode, cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel]
    description: str = ""
    add_imports: Sequence[ImportItem] = ()
    remove_imports: Sequence[ImportItem] = ()
    # None: the rule's own fix_safety decides. A rule may mark one fix unsafe where others are safe.
    safety: FixSafety | None = None


@dataclass
class Finding:
    """One report of one rule at one place. Lines and columns are 1-based (columns too, as Ruff)."""

    code: str
    message: str
    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    fix: Fix | None = None
    fix_safety: FixSafety = FixSafety.NONE
    cell: int | None = None  # notebook cell index (1-based), when the file is a notebook
    # Set by the engine: the node the finding is about (not serialised).
    node: cst.CSTNode | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class Valid:
    """Example code the rule must not flag (for torch `target_version`, when set)."""

    code: str
    target_version: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", textwrap.dedent(self.code).lstrip("\n"))


@dataclass(frozen=True)
class Invalid:
    """Example code the rule must flag at `line` (1-based, after dedent). `fixed` is the whole
    file after the rule's fix (None: the rule offers no fix here, e.g. it declines). `unsafe`
    examples are fixed only with --unsafe-fixes (the tests check both ways: a safe example's fix
    applies without the flag, an unsafe one's only with it). `target_version` sets the torch
    version."""

    code: str
    line: int
    fixed: str | None = None
    message_contains: str | None = None
    target_version: str | None = None
    unsafe: bool = False
    config_uses_cuda: bool | None = None  # reserved; leave None

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", textwrap.dedent(self.code).lstrip("\n"))
        if self.fixed is not None:
            object.__setattr__(self, "fixed", textwrap.dedent(self.fixed).lstrip("\n"))


@dataclass
class FileContext:
    """What a rule may know about the file it is visiting (set by the engine)."""

    path: Path
    source: str
    module: cst.Module
    wrapper: cst.MetadataWrapper
    target_version: tuple[int, int] | None = None  # torch version the code targets, e.g. (2, 0)
    _facts: FileFacts | None = None

    _program: ProgramView | None = None

    @property
    def facts(self) -> FileFacts:
        """Training-loop facts, built once per file and shared by all rules."""
        if self._facts is None:
            from autoopt.lint.program.facts import FileFacts

            self._facts = FileFacts(
                self.wrapper, self.source, project_training_calls=self._project_training_calls
            )
        return self._facts

    @property
    def program(self) -> ProgramView:
        """The program model as this file sees it (calls that train elsewhere in the project,
        what a callee does with its arguments), built once per file."""
        if self._program is None:
            from autoopt.lint.program.view import ProgramView

            self._program = ProgramView(self.path, self.source, self.facts)
        return self._program

    def _project_training_calls(self) -> list[cst.Call]:
        return self.program.training_calls


class Rule(cst.BatchableCSTVisitor):
    """Base class of every rule. Subclasses set the class attributes below and visit nodes."""

    code: ClassVar[str]
    name: ClassVar[str]
    message: ClassVar[str]
    fix_safety: ClassVar[FixSafety] = FixSafety.NONE
    fix_reason: ClassVar[str] = ""  # why the fix is unsafe, or why a rule has none
    triggers: ClassVar[tuple[str, ...]] = ()  # any of these substrings must be in the code
    # ... and all of these (e.g. ".backward(" for rules about training loops, "cuda" for
    # CUDA-only tricks; a tuple inside means any one of its strings): most files are then never
    # parsed at all.
    requires: ClassVar[tuple[str | tuple[str, ...], ...]] = ()
    # True when `autoopt.optimize()` applies this trick at run time: the rule then stays quiet
    # in files that call it (telling such a script to add autocast would be wrong).
    covered_by_optimize: ClassVar[bool] = False
    # Torch versions the rule applies to (inclusive lower, exclusive upper), e.g. ((2, 0), None).
    applies_to_versions: ClassVar[tuple[tuple[int, int] | None, tuple[int, int] | None]] = (
        None,
        None,
    )
    VALID: ClassVar[list[Valid]] = []
    INVALID: ClassVar[list[Invalid]] = []

    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ParentNodeProvider)

    def __init__(self, context: FileContext) -> None:
        super().__init__()
        self.context = context
        self.findings: list[Finding] = []
        # The first exception this rule raised on this file, and the node it was visiting.
        self.crash: Exception | None = None
        self.crash_node: cst.CSTNode | None = None

    def get_visitors(self) -> Mapping[str, Callable[[cst.CSTNode], None]]:
        """libcst's batched-traversal callbacks, each contained: the first exception stops this
        rule for the rest of the file (kept in `crash`) and never reaches the other rules."""
        return {name: self._contained(getattr(self, name)) for name in _visitor_names(type(self))}

    def _contained(self, method: Callable[[cst.CSTNode], object]) -> Callable[[cst.CSTNode], None]:
        def call(node: cst.CSTNode) -> None:
            if self.crash is not None:
                return
            try:
                method(node)
            except Exception as exc:  # a rule's bug costs its own findings only
                self.crash, self.crash_node = exc, node

        return call

    # ----- reporting -------------------------------------------------------------------------
    def report(
        self,
        node: cst.CSTNode,
        message: str | None = None,
        *,
        fix: Fix | None = None,
    ) -> None:
        """Report `node`. `message` defaults to the rule's message; a declined fix says why in it."""
        pos: CodeRange = self.get_metadata(PositionProvider, node)
        safety = FixSafety.NONE if fix is None else (fix.safety or self.fix_safety)
        if fix is not None and safety is FixSafety.NONE:
            raise TypeError(f"{self.code} reported a fix but declares fix_safety = NONE")
        self.findings.append(
            Finding(
                code=self.code,
                message=message or self.message,
                path=str(self.context.path),
                line=pos.start.line,
                column=pos.start.column + 1,
                end_line=pos.end.line,
                end_column=pos.end.column + 1,
                fix=fix,
                fix_safety=safety,
                node=node,
            )
        )

    # ----- matching torch APIs by qualified name ---------------------------------------------
    def qualified_names(self, node: cst.CSTNode) -> AbstractSet[str]:
        """Fully qualified names `node` may refer to ("torch.utils.data.DataLoader")."""
        # The engine's provider (`metadata.QualifiedNames`) keeps each node's names: read it
        # straight from the resolved metadata, not through libcst's `get_metadata` checks
        # (rules ask this hundreds of thousands of times on a corpus).
        provider = self.metadata.get(QualifiedNameProvider)
        if type(provider) is QualifiedNames:
            return provider.names(node)
        return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}

    def refers_to(self, node: cst.CSTNode, *names: str) -> bool:
        """True if `node` (a Name/Attribute) resolves to any of `names` through the imports."""
        return not self.qualified_names(node).isdisjoint(names)

    def is_call_to(self, node: cst.CSTNode, *names: str) -> bool:
        """True if `node` is a call of one of the qualified `names`."""
        return isinstance(node, cst.Call) and self.refers_to(node.func, *names)

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.get_metadata(ParentNodeProvider, node, None)

    @property
    def facts(self) -> FileFacts:
        return self.context.facts

    # ----- documentation ---------------------------------------------------------------------
    @classmethod
    def documentation(cls) -> str:
        """The rule's docs (its docstring), dedented."""
        return textwrap.dedent(cls.__doc__ or "").strip()

    @classmethod
    def applies_to(cls, target_version: tuple[int, int] | None) -> bool:
        """Whether the rule speaks for code targeting this torch version (None: unknown -> yes)."""
        if target_version is None:
            return True
        low, high = cls.applies_to_versions
        return (low is None or target_version >= low) and (high is None or target_version < high)


def rule_examples(rule: type[Rule]) -> Iterable[Valid | Invalid]:
    """Every example of a rule, valid first."""
    yield from rule.VALID
    yield from rule.INVALID


@functools.cache
def _visitor_names(cls: type[Rule]) -> tuple[str, ...]:
    """The `visit_*`/`leave_*` methods `cls` defines (libcst's no-op stubs left out), read once
    per class from the class: libcst's own `get_visitors` runs `inspect.getmembers` on every
    instance, which also evaluates each property (cached facts included), for every file."""
    return tuple(
        name
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if name.startswith(("visit_", "leave_")) and not getattr(member, "_is_no_op", False)
    )
