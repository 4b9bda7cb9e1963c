"""Code written for Python < 3.7 that passes `async=` as a keyword argument.

PyTorch before 0.4 spelt a non-blocking copy `x.cuda(async=True)`; Python 3.7 made `async` a
keyword, so such a file no longer parses (and torch >= 0.4 calls the argument `non_blocking=`).
Old training scripts that are otherwise ordinary Python 3 still carry it. The lint reads such a
file as if each `async=` keyword argument were renamed, to a name of the same length so that
every line and column a finding names is the original's, and offers no fix for it (a fix would
be made on text that is not the file's).
"""

from __future__ import annotations

import io
import tokenize
from typing import NamedTuple

_STAND_IN = "Async"  # as long as `async`: positions stay the original's


class Renamed(NamedTuple):
    """The text with every `async=` keyword argument renamed, and where the first one is
    (1-based line, 0-based column)."""

    text: str
    line: int
    column: int


def rename_async_keywords(text: str) -> Renamed | None:
    """`text` with `f(async=True)` read as `f(Async=True)`; None when it passes no `async=`
    keyword argument (or cannot be tokenized)."""
    if "async" not in text:
        return None
    try:
        tokens = [
            t
            for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type not in (tokenize.NL, tokenize.COMMENT)
        ]
    except (tokenize.TokenError, SyntaxError):  # an unterminated string or bracket
        return None
    found = [
        tok.start
        for before, tok, after in zip(tokens, tokens[1:], tokens[2:], strict=False)
        if tok.type == tokenize.NAME
        and tok.string == "async"
        and after.exact_type == tokenize.EQUAL
        and before.exact_type in (tokenize.LPAR, tokenize.COMMA)
    ]
    if not found:
        return None
    lines = text.splitlines(keepends=True)
    for row, col in found:
        line = lines[row - 1]
        lines[row - 1] = line[:col] + _STAND_IN + line[col + len(_STAND_IN) :]
    return Renamed("".join(lines), found[0][0], found[0][1])
