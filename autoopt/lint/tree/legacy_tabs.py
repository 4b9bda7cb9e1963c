"""Code indented with tabs and spaces mixed, which Python reads and libcst does not.

Python's tokenizer takes a tab in indentation to the next multiple of 8 columns (and rejects
only a mix whose meaning would change with the tab size), so old training scripts edited in
several editors still run (improved-wgan-pytorch's train.py). libcst's tokenizer rejects some
of them ("no matching outer block for dedent"). The lint reads such a file as if each line's
indentation were expanded the way Python reads it, and offers no fix for it (a fix would be made
on text that is not the file's). Lines keep their numbers; columns on an expanded line move.
"""

from __future__ import annotations

import ast
import re
from typing import NamedTuple

_INDENT = re.compile(r"^[ \t]+", re.MULTILINE)


class Expanded(NamedTuple):
    """The text with its indentation expanded, and the first line that had a tab in it."""

    text: str
    line: int


def expand_indent_tabs(text: str) -> Expanded | None:
    """`text` with the tabs of each line's indentation expanded to 8-column stops; None when
    no indentation holds a tab, or Python itself does not parse the text."""
    first = next((m for m in _INDENT.finditer(text) if "\t" in m.group()), None)
    if first is None:
        return None
    try:
        ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    expanded = _INDENT.sub(lambda m: m.group().expandtabs(8), text)
    return Expanded(expanded, text.count("\n", 0, first.start()) + 1)
