"""One-line summaries of exceptions, for warnings and report entries."""

from __future__ import annotations

MAX_CHARS = 300


def error_summary(err: BaseException, limit: int = MAX_CHARS) -> str:
    """`Type: first line of the message`, at most `limit` characters.

    Dynamo's wrapper errors end their first line with ':' and name the real error on the next,
    so that line is kept too."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    message = " ".join(lines[:2]) if lines and lines[0].endswith(":") else " ".join(lines[:1])
    text = f"{type(err).__name__}: {message}" if message else type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
