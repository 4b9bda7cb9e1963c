"""Where a long module can be cut into runs of whole top-level statements, so that a parser
(libcst's, `ast`'s) holds one run at a time: its working memory is a chunk's, not the file's."""

from __future__ import annotations

import ast
import functools

# A file this long is parsed in pieces: libcst's native parser holds about 16 KB per line while
# it parses (830 MB for 50k lines), and `ast`'s tree of such a file is about 180 MB.
LARGE_FILE_LINES = 20_000
CHUNK_LINES = 5_000


@functools.lru_cache(maxsize=4)
def top_level_cuts(source: str, chunk_lines: int = CHUNK_LINES) -> tuple[int, ...] | None:
    """Line offsets (0 first, the line count last) that cut `source` into runs of about
    `chunk_lines` lines of whole top-level statements (found with `ast`; the statements' ends
    are kept, so the lint's libcst parse and the program model's index, whatever run length
    each asks for, parse it whole only once). A cut falls after a statement only where the
    lines up to the next one are empty or comments at column 0 (a line of spaces may close the
    block above). None where there is no cut, `ast` rejects the text, or its line breaks are
    not `ast`'s (`\\r`, `\\f`)."""
    found = _cut_points(source)
    if found is None:
        return None
    points, n_lines = found
    cuts, last = [0], 0
    for end in points:
        if end - last >= chunk_lines:
            cuts.append(end)
            last = end
    if len(cuts) == 1:
        return None
    cuts.append(n_lines)
    return tuple(cuts)


@functools.lru_cache(maxsize=2)
def _cut_points(source: str) -> tuple[tuple[int, ...], int] | None:
    """(every line after which `source` may be cut, its line count); see `top_level_cuts`."""
    try:
        body = ast.parse(source).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    lines = source.splitlines(keepends=True)
    if len(lines) != source.count("\n") + (not source.endswith("\n")):
        return None
    points = []
    for statement, following in zip(body, body[1:], strict=False):
        end = statement.end_lineno or 0
        start = min(
            [following.lineno] + [d.lineno for d in getattr(following, "decorator_list", [])]
        )
        gap = lines[end : start - 1]
        if all(g in ("\n", "\r\n") or g.startswith("#") for g in gap):
            points.append(end)
    return tuple(points), len(lines)
