"""Source bytes to text and back, as Python reads them: a PEP 263 coding cookie or a UTF-8 BOM
decides the encoding (UTF-8 otherwise). `lint` and `rewrite` share this, and `rewrite` writes a
file back in its own encoding, BOM included. `content_digest` names a file's bytes (the lint
cache and the program model key on it)."""

from __future__ import annotations

import hashlib
import io
import tokenize
from dataclasses import dataclass


def content_digest(data: bytes) -> str:
    """The content hash of a file's bytes: what keys its cached results."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class SourceDecodeError(ValueError):
    """Bytes that are not Python source text: binary, an unknown cookie, an invalid byte."""

    def __init__(self, reason: str, line: int = 1, column: int = 1) -> None:
        super().__init__(reason)
        self.reason, self.line, self.column = reason, line, column


@dataclass(frozen=True)
class SourceText:
    """Decoded source (without its BOM) and the codec that gives its bytes back."""

    text: str
    encoding: str  # as `tokenize.detect_encoding` names it: "utf-8", "utf-8-sig", "iso-8859-1"

    def encode(self, text: str) -> bytes:
        """`text` as bytes of this file: same encoding, the BOM again if the file had one.
        Raises `UnicodeEncodeError` when `text` has a character the encoding cannot hold."""
        return text.encode(self.encoding)


def _line_of_offset(data: bytes, offset: int) -> tuple[int, int]:
    before = data[:offset]
    line = before.count(b"\n") + 1
    return line, offset - (before.rfind(b"\n") + 1) + 1


def decode_source(data: bytes) -> SourceText:
    """Source bytes as text: the PEP 263 coding cookie if any, else UTF-8 (a BOM is dropped from
    the text and remembered in the encoding). Raises `SourceDecodeError`."""
    nul = data.find(b"\x00")
    if nul != -1:
        line, column = _line_of_offset(data, nul)
        raise SourceDecodeError("binary file: contains NUL bytes, not Python source", line, column)
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:  # an unknown coding cookie, or undecodable first lines
        encoding = "utf-8"
        if "encoding declaration" not in str(exc.msg) or b"coding" in data[:400]:
            raise SourceDecodeError(f"cannot decode: {exc.msg}") from None
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        line, column = _line_of_offset(data, exc.start)
        raise SourceDecodeError(
            f"cannot decode as {exc.encoding}: invalid byte 0x{data[exc.start]:02x}", line, column
        ) from None
    if text.startswith("\ufeff"):  # a BOM with a utf-8 cookie: tokenize says "utf-8-sig" then
        text, encoding = text[1:], "utf-8-sig"
    return SourceText(text, encoding)
