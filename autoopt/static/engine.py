"""Running rules over source text: parse once, visit with every active rule in one pass."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from autoopt.static.rule import FileContext, Finding, Rule


@dataclass
class Analysis:
    """The parsed module and the findings on it; fixes' nodes are nodes of `module`."""

    module: cst.Module
    findings: list[Finding]


def analyze(
    source: str,
    path: Path | str,
    rules: Sequence[type[Rule]],
    target_version: tuple[int, int] | None = None,
) -> Analysis:
    """Parse `source` and run `rules` on it (those whose triggers appear in the text and that
    apply to `target_version`). Raises `libcst.ParserSyntaxError` on unparsable code."""
    active = [
        r
        for r in rules
        if r.applies_to(target_version) and (not r.triggers or any(t in source for t in r.triggers))
    ]
    module = cst.parse_module(source)
    if not active:
        return Analysis(module, [])
    wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
    context = FileContext(Path(path), source, module, wrapper, target_version)
    visitors = [rule(context) for rule in active]
    wrapper.visit_batched(visitors)
    findings = [f for v in visitors for f in v.findings]
    findings.sort(key=lambda f: (f.line, f.column, f.code))
    return Analysis(module, findings)
