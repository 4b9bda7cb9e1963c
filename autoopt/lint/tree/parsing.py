"""libcst's parse, without re-checking what its tokenizer has already checked.

Every node libcst builds validates itself on construction (`CSTNode.__post_init__`). For three
leaves of a parsed tree that check repeats the parser's own: libcst's native tokenizer takes a
`SimpleWhitespace`, `Newline` or `Comment` value as the text a regular expression matched, and
the node's `_validate` matches the same expression again (`([ \\f\\t]|\\\\(\\r\\n?|\\n))*`,
`\\r\\n?|\\n`, `#[^\\r\\n]*`). Whitespace leaves are 40% of a tree's nodes: the repeated match is
about a tenth of the lint's parse. Every other node (names, parentheses, operators) is still
validated, and nodes built outside `parse_module` (fixes, `with_changes`) are checked as usual.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import libcst as cst

# Leaves whose value the tokenizer matched with the regular expression their `_validate` uses.
_MATCHED_BY_THE_TOKENIZER: tuple[type[cst.CSTNode], ...] = (
    cst.SimpleWhitespace,
    cst.Newline,
    cst.Comment,
)


def _unchecked(self: cst.CSTNode) -> None:
    """A `__post_init__` that validates nothing (see the module doc)."""


@contextmanager
def _tokenizer_checked_leaves() -> Iterator[None]:
    """While inside, the leaves of `_MATCHED_BY_THE_TOKENIZER` skip their validation. They
    inherit `__post_init__` from `CSTNode`; deleting the override restores exactly that."""
    for kind in _MATCHED_BY_THE_TOKENIZER:
        kind.__post_init__ = _unchecked  # type: ignore[method-assign]
    try:
        yield
    finally:
        for kind in _MATCHED_BY_THE_TOKENIZER:
            if kind.__dict__.get("__post_init__") is _unchecked:
                del kind.__post_init__


def parse_module(source: str) -> cst.Module:
    """`libcst.parse_module(source)`: the same tree, or the same exception."""
    with _tokenizer_checked_leaves():
        return cst.parse_module(source)
