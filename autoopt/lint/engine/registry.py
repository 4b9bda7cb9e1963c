"""Loading rules and selecting them.

Every module of the `autoopt.rules` package, and every `*.py` file of the user's `extra-rules`
folders, defines exactly one `Rule` subclass with a `code` (helper base classes without a code
and modules whose name starts with `_` are allowed). Broken, malformed or duplicate rules are a
`RuleError` naming the file, never a silent skip.

Selection follows Ruff: selectors are `ALL`, a prefix (`AO`, `AO2`) or a code (`AO201`). Each
layer (defaults, then config, then command line) either replaces the selection (`select`) or
extends it (`extend-select`), then applies `ignore`; inside a layer more specific selectors win,
and at equal specificity `ignore` beats `select` — so `select AO2` + `ignore AO201` keeps AO2xx
but AO201, and `ignore AO2` + `select AO201` keeps AO201 alone of the AO2 block.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import pkgutil
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from autoopt.lint.engine.rule import FixSafety, Invalid, Rule, Valid

BUILTIN_PACKAGE: str | None = "autoopt.rules"
# Where each rule's documentation lives; a rule's URL is this plus `#<code>` (a stable anchor).
DOCS_URL = "https://github.com/autoopt/autoopt/blob/main/docs/rules.md"

CODE_RE = re.compile(r"^[A-Z]+[0-9]+$")
SELECTOR_RE = re.compile(r"^[A-Z]+[0-9]*$")


class RuleError(Exception):
    """A rule could not be loaded, is malformed, or a selector names no rule."""


# ----- loading ---------------------------------------------------------------------------------


@dataclass
class Registry:
    """All loaded rules, by code (sorted), and the file each one comes from."""

    rules: dict[str, type[Rule]] = field(default_factory=dict)
    origins: dict[str, Path] = field(default_factory=dict)

    def add(self, rule: type[Rule], origin: Path) -> None:
        if rule.code in self.rules:
            raise RuleError(
                f"duplicate rule code {rule.code}: defined in {self.origins[rule.code]} "
                f"and in {origin}"
            )
        self.rules[rule.code] = rule
        self.origins[rule.code] = origin
        self.rules = dict(sorted(self.rules.items()))

    def all(self) -> list[type[Rule]]:
        return list(self.rules.values())

    def find(self, text: str) -> type[Rule] | None:
        """The rule with this code (any case) or name."""
        wanted = text.strip()
        if wanted.upper() in self.rules:
            return self.rules[wanted.upper()]
        for rule in self.rules.values():
            if rule.name == wanted.lower():
                return rule
        return None

    def suggest(self, text: str) -> list[str]:
        """Codes or names close to `text`, for 'did you mean' messages."""
        candidates = [*self.rules, *(r.name for r in self.rules.values())]
        close = difflib.get_close_matches(text.strip(), candidates, n=3, cutoff=0.6)
        close += difflib.get_close_matches(text.strip().upper(), list(self.rules), n=3, cutoff=0.6)
        return list(dict.fromkeys(close))[:3]

    def select(self, layers: Sequence[Selection]) -> list[type[Rule]]:
        """The rules enabled by `layers` (see the module docs), sorted by code."""
        enabled = resolve_selection(list(self.rules), layers)
        return [rule for code, rule in self.rules.items() if code in enabled]

    def fingerprint(self, rules: Iterable[type[Rule]]) -> str:
        """A hash of what decides the findings: the selected codes, the sources of their folders
        and of the whole engine, and the versions of autoopt and libcst. Part of every cache
        key."""
        return rules_fingerprint(rules)


def load_registry(extra_dirs: Sequence[Path] = (), include_builtin: bool = True) -> Registry:
    """Load the built-in rules (unless `include_builtin` is false) and those of `extra_dirs`."""
    registry = Registry()
    if include_builtin and BUILTIN_PACKAGE is not None:
        for module, origin in _builtin_modules(BUILTIN_PACKAGE):
            registry.add(rule_of_module(module, origin), origin)
    for folder in extra_dirs:
        for module, origin in _folder_modules(Path(folder)):
            registry.add(rule_of_module(module, origin), origin)
    return registry


def _builtin_modules(package_name: str) -> Iterable[tuple[ModuleType, Path]]:
    package = importlib.import_module(package_name)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.ispkg:
            continue
        name = f"{package_name}.{info.name}"
        origin = Path(package.__path__[0]) / f"{info.name}.py"
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # a broken rule file must say which file broke
            raise RuleError(f"{origin}: cannot import rule module: {_describe(exc)}") from exc
        yield module, Path(module.__file__ or origin)


def _folder_modules(folder: Path) -> Iterable[tuple[ModuleType, Path]]:
    if not folder.is_dir():
        raise RuleError(f"extra-rules folder {folder} does not exist or is not a folder")
    tag = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:10]
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        name = f"_autoopt_extra_{tag}_{path.stem}"
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise RuleError(f"{path}: cannot load rule module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # before exec: dataclasses & co. look themselves up there
            try:
                spec.loader.exec_module(module)
            except Exception as exc:
                del sys.modules[name]
                raise RuleError(f"{path}: cannot import rule module: {_describe(exc)}") from exc
        yield module, path


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} (line {exc.lineno})"
    return f"{type(exc).__name__}: {exc}"


def rule_of_module(module: ModuleType, origin: Path) -> type[Rule]:
    """The one Rule subclass with a `code` that `module` defines (validated)."""
    found = [
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, Rule)
        and obj is not Rule
        and obj.__module__ == module.__name__
        and "code" in _class_attrs(obj)
    ]
    if not found:
        raise RuleError(f"{origin}: defines no Rule subclass with a `code`")
    if len(found) > 1:
        names = ", ".join(sorted(c.__name__ for c in found))
        raise RuleError(f"{origin}: defines {len(found)} rules ({names}); one rule per file")
    validate_rule(found[0], origin)
    return found[0]


def _class_attrs(cls: type) -> set[str]:
    attrs: set[str] = set()
    for klass in cls.__mro__:
        if klass is Rule:
            break
        attrs |= set(vars(klass))
    return attrs


def validate_rule(rule: type[Rule], origin: Path | str) -> None:
    """Raise `RuleError` unless `rule`'s class attributes have the shapes the engine relies on."""
    where = f"{origin}: rule {rule.__name__}"
    code = getattr(rule, "code", None)
    if not isinstance(code, str) or not CODE_RE.match(code):
        raise RuleError(f"{where}: code {code!r} must be letters then digits, e.g. 'AO201'")
    for attr in ("name", "message"):
        value = getattr(rule, attr, None)
        if not isinstance(value, str) or not value.strip():
            raise RuleError(f"{where} ({code}): `{attr}` must be a non-empty string")
    if not isinstance(rule.fix_safety, FixSafety):
        raise RuleError(f"{where} ({code}): fix_safety must be a FixSafety")
    if not isinstance(rule.triggers, tuple | list) or not all(
        isinstance(t, str) and t for t in rule.triggers
    ):
        raise RuleError(f"{where} ({code}): triggers must be a tuple of non-empty strings")
    if not isinstance(rule.requires, tuple | list) or not all(
        (isinstance(t, str) and t) or (isinstance(t, tuple) and t and all(_words(t)))
        for t in rule.requires
    ):
        raise RuleError(
            f"{where} ({code}): requires must be a tuple of non-empty strings "
            "(or of tuples of them: any one of a tuple)"
        )
    versions = rule.applies_to_versions
    if not isinstance(versions, tuple) or len(versions) != 2:
        raise RuleError(f"{where} ({code}): applies_to_versions must be (low, high)")
    if not all(isinstance(v, Valid) for v in rule.VALID):
        raise RuleError(f"{where} ({code}): VALID must hold Valid(...) examples")
    for example in rule.INVALID:
        if not isinstance(example, Invalid):
            raise RuleError(f"{where} ({code}): INVALID must hold Invalid(...) examples")
        n_lines = len(example.code.splitlines())
        if not 1 <= example.line <= max(n_lines, 1):
            raise RuleError(
                f"{where} ({code}): an INVALID example says line {example.line}, "
                f"but it has {n_lines} lines"
            )


# ----- selection -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """One layer of rule selection. `select=None` keeps the previous layer's rules."""

    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    source: str = "options"  # where the layer comes from, for error messages


def _specificity(selector: str) -> int:
    return 0 if selector == "ALL" else len(selector)


def _matching(selector: str, codes: Sequence[str]) -> set[str]:
    if selector == "ALL":
        return set(codes)
    return {c for c in codes if c.startswith(selector)}


def normalize_selector(selector: str) -> str:
    return selector.strip().upper()


def check_selectors(selectors: Iterable[str], codes: Sequence[str], where: str) -> None:
    """Raise `RuleError` for a selector that is malformed or matches no rule."""
    for raw in selectors:
        selector = normalize_selector(raw)
        if selector == "ALL":
            continue
        close = difflib.get_close_matches(selector, list(codes), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        if not SELECTOR_RE.match(selector):
            raise RuleError(
                f"invalid rule selector {raw!r} in {where}: use a code (AO201), a prefix (AO2) "
                f"or ALL{hint}"
            )
        if not _matching(selector, codes):
            raise RuleError(f"unknown rule selector {raw!r} in {where}: it matches no rule{hint}")


def resolve_selection(codes: Sequence[str], layers: Sequence[Selection]) -> set[str]:
    """The codes enabled by `layers`, applied in order on top of the default (ALL)."""
    enabled = set(codes)
    for layer in layers:
        check_selectors(
            [*(layer.select or ()), *layer.extend_select, *layer.ignore], codes, layer.source
        )
        selects = [normalize_selector(s) for s in (*(layer.select or ()), *layer.extend_select)]
        ignores = [normalize_selector(s) for s in layer.ignore]
        current = set() if layer.select is not None else set(enabled)
        for level in sorted({_specificity(s) for s in (*selects, *ignores)}):
            for selector in selects:
                if _specificity(selector) == level:
                    current |= _matching(selector, codes)
            for selector in ignores:
                if _specificity(selector) == level:
                    current -= _matching(selector, codes)
        enabled = current
    return enabled


# ----- identity --------------------------------------------------------------------------------

_file_hashes: dict[str, str] = {}  # per process: a source file is hashed once


def _file_hash(path: str | None) -> str:
    if not path:
        return "-"
    if path not in _file_hashes:
        try:
            _file_hashes[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            _file_hashes[path] = "-"
    return _file_hashes[path]


def _tree_hash(digest: Any, folder: Path) -> None:
    """Feed every .py file under `folder` (name and content) into `digest`."""
    for path in sorted(folder.rglob("*.py")):
        digest.update(f"{path.relative_to(folder).as_posix()}:".encode())
        digest.update(_file_hash(str(path)).encode())


def rules_fingerprint(rules: Iterable[type[Rule]]) -> str:
    """See `Registry.fingerprint`. Covers every module the findings can depend on: all of the
    lint package (tree, program model, engine, rewrite and wrap) and every .py file of each folder a selected
    rule comes from (its helper modules too), not just the rule files themselves."""
    from libcst._version import __version__ as libcst_version

    from autoopt import __version__

    digest = hashlib.sha256()
    digest.update(f"autoopt {__version__}; libcst {libcst_version}".encode())
    _tree_hash(digest, Path(__file__).parent.parent)  # autoopt/lint as a whole
    folders: set[Path] = set()
    for rule in sorted(rules, key=lambda r: r.code):
        digest.update(rule.code.encode())
        source = inspect.getsourcefile(rule)
        digest.update(_file_hash(source).encode())
        if source:
            folders.add(Path(source).resolve().parent)
    for folder in sorted(folders):
        _tree_hash(digest, folder)
    return digest.hexdigest()


def rule_url(rule: type[Rule]) -> str:
    """A stable link to the rule's documentation (a rule may set its own `url`)."""
    return getattr(rule, "url", None) or f"{DOCS_URL}#{rule.code.lower()}"


def _words(values: tuple[object, ...]) -> list[bool]:
    return [isinstance(v, str) and bool(v) for v in values]
