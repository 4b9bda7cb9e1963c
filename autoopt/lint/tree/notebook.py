"""Jupyter notebooks as Python source: the code cells joined in order, with a map back to cells.

The cells are joined into one module (as the kernel runs them, so an `import torch` in cell 1
resolves names in cell 5). IPython syntax is not Python: line magics (`%matplotlib inline`),
shell escapes (`!pip install`), `x = !ls`, and help (`obj?`) become `pass` at the same indentation,
which keeps every line number and any enclosing block valid. Cells whose cell magic runs another
language (`%%bash`, `%%html`, ...) are left out; `%%time` and friends keep their Python body.
Cells are numbered 1, 2, ... counting every cell of the notebook (markdown too), as they appear.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# Cell magics whose body is still Python.
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug", "python", "python3"})
_LINE_MAGIC = re.compile(r"^(?P<indent>[ \t]*)(?:%{1,2}[A-Za-z_]|![^=]|\?{1,2}[A-Za-z_])")
_HELP = re.compile(r"^(?P<indent>[ \t]*)[A-Za-z_][\w.]*\?{1,2}[ \t]*$")
_ASSIGN_MAGIC = re.compile(r"^(?P<indent>[ \t]*)[A-Za-z_][\w., \t]*=[ \t]*(?:%{1,2}[A-Za-z_]|!\S)")
_CELL_MAGIC = re.compile(r"^[ \t]*%%(?P<name>[A-Za-z_]\w*)")
_NEWLINE = re.compile(r"\r\n|\r|\n")


class NotebookError(ValueError):
    """The file is not a notebook autoopt can read (bad JSON, unknown format)."""

    def __init__(self, reason: str, line: int = 0, column: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line
        self.column = column


@dataclass
class NotebookSource:
    """The joined Python source of a notebook and, for each of its lines, (cell, line in cell)."""

    source: str
    line_map: list[tuple[int, int]] = field(default_factory=list)

    def locate(self, line: int) -> tuple[int | None, int]:
        """(cell number, line within the cell) of a 1-based line of `source`."""
        if not self.line_map:
            return None, line
        index = min(max(line, 1), len(self.line_map)) - 1
        return self.line_map[index]


def _cell_text(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    if isinstance(source, list):
        return "".join(str(part) for part in source)
    if isinstance(source, str):
        return source
    raise NotebookError("a cell's source is neither a string nor a list of strings")


def _python_line(line: str) -> str:
    """`line` itself, or `pass` at its indentation when it is IPython-only syntax."""
    for pattern in (_LINE_MAGIC, _HELP, _ASSIGN_MAGIC):
        match = pattern.match(line)
        if match is not None:
            return f"{match.group('indent')}pass"
    return line


def is_python_notebook(data: dict[str, Any]) -> bool:
    """False for notebooks whose kernel is declared to run another language (R, Julia...)."""
    metadata = data.get("metadata") or {}
    language = (metadata.get("language_info") or {}).get("name") or (
        metadata.get("kernelspec") or {}
    ).get("language")
    return language is None or str(language).lower() in ("python", "python3", "ipython")


def notebook_source(text: str) -> NotebookSource:
    """The Python source of notebook JSON `text`. Raises `NotebookError` when it is not one."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotebookError(f"invalid notebook JSON: {exc.msg}", exc.lineno, exc.colno) from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        if isinstance(data, dict) and "worksheets" in data:
            raise NotebookError("unsupported notebook format (nbformat 3); convert it to v4")
        raise NotebookError("not a Jupyter notebook (no 'cells' list)")
    out = NotebookSource(source="")
    if not is_python_notebook(data):
        return out
    parts: list[str] = []
    for number, cell in enumerate(data["cells"], start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        text = _cell_text(cell)
        lines = _NEWLINE.split(text[:-1] if text.endswith("\n") else text)
        if not any(line.strip() for line in lines):
            continue
        first = next(i for i, line in enumerate(lines) if line.strip())
        magic = _CELL_MAGIC.match(lines[first])
        if magic is not None:
            if magic.group("name") not in _PYTHON_CELL_MAGICS:
                continue  # %%bash, %%html, ...: not Python at all
            lines[first] = "pass"
        for in_cell, line in enumerate(lines, start=1):
            parts.append(_python_line(line))
            out.line_map.append((number, in_cell))
    out.source = "\n".join(parts) + ("\n" if parts else "")
    return out
