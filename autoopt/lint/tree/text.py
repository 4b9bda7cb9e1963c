"""Source text as code: comments and triple-quoted strings blanked, so that a text test (the
pre-filter, a spelling of determinism) does not match prose. Single-line strings are kept
(rules look for "cuda" or "CUDA_VISIBLE_DEVICES" in them)."""

from __future__ import annotations

import re

# One left-to-right scan, as the tokenizer does it: a `#` inside a string is no comment and a
# quote inside a comment opens no string. Single-line strings are kept (rules may look for
# "CUDA_VISIBLE_DEVICES" or "cuda" in them); comments and triple-quoted strings are blanked.
_PROSE = re.compile(
    r"""
      (?P<comment>\#[^\r\n]*)
    | (?P<long>[rRbBuUfF]{0,3}(?:\"\"\"(?:[^"\\]|\\.|"(?!""))*\"\"\"|'''(?:[^'\\]|\\.|'(?!''))*'''))
    | (?P<short>[rRbBuUfF]{0,3}(?:"(?:[^"\\\r\n]|\\.)*"|'(?:[^'\\\r\n]|\\.)*'))
    """,
    re.DOTALL | re.VERBOSE,
)


def _keep_short_strings(match: re.Match[str]) -> str:
    return match.group(0) if match.lastgroup == "short" else " "


# The last text stripped: `rewrite` asks the pre-filter about the same text twice (whether to
# parse it at all, then which rules to run on it), and a file's regex pass is not free.
_STRIPPED: list[tuple[str, str]] = []


def strip_prose(source: str) -> str:
    """`source` with comments and triple-quoted strings blanked (for the trigger pre-filter)."""
    if "#" not in source and '"""' not in source and "'''" not in source:
        return source
    if _STRIPPED and _STRIPPED[0][0] is source:
        return _STRIPPED[0][1]
    code = _PROSE.sub(_keep_short_strings, source)
    _STRIPPED[:] = [(source, code)]
    return code
