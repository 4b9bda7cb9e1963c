"""One decoder for lint and rewrite (PEP 263 cookie, BOM, UTF-8); rewrite writes a file back in
its own encoding."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from autoopt.cli import main
from autoopt.lint.tree.encoding import SourceDecodeError, decode_source

# AO102 adds `pin_memory=True`: a safe fix that touches these files.
LOADER = """import torch
from torch.utils.data import DataLoader

loader = DataLoader(ds, batch_size=8)
for x, y in loader:
    model(x.cuda()).sum().backward()
"""


def test_decode_source_honours_cookie_and_bom() -> None:
    latin = "# -*- coding: latin-1 -*-\ns = 'caf\xe9'\n"
    decoded = decode_source(latin.encode("latin-1"))
    assert decoded.text == latin and decoded.encode(decoded.text) == latin.encode("latin-1")
    bom = decode_source(b"\xef\xbb\xbfx = 1\n")
    assert bom.text == "x = 1\n" and bom.encode(bom.text) == b"\xef\xbb\xbfx = 1\n"
    with pytest.raises(SourceDecodeError, match="invalid byte 0xe9"):
        decode_source(b"s = '\xe9'\n")


@pytest.mark.parametrize(
    ("name", "data"),
    [
        (
            "latin.py",
            ("# -*- coding: latin-1 -*-\n# caf\xe9\n" + LOADER).encode("latin-1"),
        ),
        ("bom.py", b"\xef\xbb\xbf# caf\xc3\xa9\n" + LOADER.encode()),
    ],
)
def test_rewrite_keeps_the_files_encoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, data: bytes
) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.autoopt]\n")
    (tmp_path / name).write_bytes(data)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["rewrite", name, "--select", "AO102"])
    assert result.exit_code == 0, result.output
    assert "Rewrote 1 file" in result.stderr
    expected = data.replace(b"batch_size=8)", b"batch_size=8, pin_memory=True)")
    assert expected != data
    assert (tmp_path / name).read_bytes() == expected
    lint = CliRunner().invoke(main, ["lint", name, "--no-cache"])
    assert "error" not in lint.output
