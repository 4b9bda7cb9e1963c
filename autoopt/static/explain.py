"""Rule documentation for `autoopt rules` (the catalog) and `autoopt explain CODE` (one rule)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from autoopt.static.registry import rule_url
from autoopt.static.rule import Invalid, Rule


def _versions(rule: type[Rule]) -> str | None:
    low, high = rule.applies_to_versions
    parts = []
    if low is not None:
        parts.append(f">= {low[0]}.{low[1]}")
    if high is not None:
        parts.append(f"< {high[0]}.{high[1]}")
    return ", ".join(parts) or None


def rule_summary(rule: type[Rule]) -> dict[str, Any]:
    """What `autoopt rules --output-format json` says about one rule."""
    return {
        "code": rule.code,
        "name": rule.name,
        "message": rule.message,
        "fix": rule.fix_safety.value,
        "fix_reason": rule.fix_reason or None,
        "torch_versions": _versions(rule),
        "url": rule_url(rule),
    }


def render_rules(rules: Sequence[type[Rule]], output_format: str = "text") -> str:
    """The catalog: one line per rule (code, name, fix availability, message), or JSON."""
    if output_format == "json":
        return json.dumps([rule_summary(r) for r in rules], indent=2) + "\n"
    if not rules:
        return "No rules found.\n"
    name_width = max(len(r.name) for r in rules)
    code_width = max(len(r.code) for r in rules)
    lines = [f"{'CODE':<{code_width}}  {'NAME':<{name_width}}  {'FIX':<6}  MESSAGE"]
    for rule in rules:
        lines.append(
            f"{rule.code:<{code_width}}  {rule.name:<{name_width}}  "
            f"{rule.fix_safety.value:<6}  {rule.message}"
        )
    return "\n".join(lines) + "\n"


def _example_block(code: str) -> str:
    return "```python\n" + code.rstrip("\n") + "\n```"


def render_explain(rule: type[Rule]) -> str:
    """Everything about one rule, as Markdown (`ruff rule` style)."""
    out = [f"# {rule.code}: {rule.name}", "", f"Message: {rule.message}", ""]
    fix = rule.fix_safety.value
    reason = f" — {rule.fix_reason}" if rule.fix_reason else ""
    how = {"safe": "applied by `autoopt rewrite`", "unsafe": "applied with `--unsafe-fixes`"}
    out.append(f"Fix: {fix}{' (' + how[fix] + ')' if fix in how else ''}{reason}")
    versions = _versions(rule)
    if versions:
        out.append(f"Applies to torch {versions}")
    out.append(f"Docs: {rule_url(rule)}")
    docs = rule.documentation()
    if docs:
        out += ["", docs]
    if rule.INVALID or rule.VALID:
        out += ["", "## Examples"]
    for example in rule.INVALID:
        out += ["", f"Flagged (line {example.line}):", _example_block(example.code)]
        if isinstance(example, Invalid) and example.fixed is not None:
            out += ["Fixed:", _example_block(example.fixed)]
    for valid in rule.VALID:
        out += ["", "Not flagged:", _example_block(valid.code)]
    return "\n".join(out) + "\n"
