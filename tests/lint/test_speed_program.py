"""The program model's speed mechanisms (issue 30, stop 21): who may call a function is asked
only of modules whose text names it; the index of an edited text takes the tree `rewrite`'s
verification parsed; a long module's cut points are found once for every run length."""

from __future__ import annotations

import ast
import os
import textwrap
from pathlib import Path

import pytest

from autoopt.lint.program import index as program_index
from autoopt.lint.program import project_files
from autoopt.lint.program.summaries import Program, Target
from autoopt.lint.tree import chunks

from .fixtures import keep_cwd

pytestmark = pytest.mark.usefixtures(keep_cwd.__name__)

LOADERS = """
def get_loader(path):
    return DataLoader(path)
"""


def _project(root: Path, files: dict[str, str]) -> None:
    (root / "pyproject.toml").write_text("[tool.autoopt]\n")
    for name, text in files.items():
        (root / name).write_bytes(textwrap.dedent(text).lstrip("\n").encode("utf-8"))
    os.chdir(root)
    project_files.begin_run()


def _callers(root: Path) -> list[tuple[str, str]]:
    target = Target(Path(os.path.abspath(root / "loaders.py")), "get_loader")
    return sorted((index.path.name, func.qualname) for index, func, _ in Program().callers(target))


def test_a_module_that_never_names_the_function_is_not_indexed(tmp_path, monkeypatch) -> None:
    # both modules import `loaders` (so both are candidates); only one names `get_loader`
    _project(
        tmp_path,
        {
            "loaders.py": LOADERS,
            "train.py": "import loaders\nloader = loaders.get_loader('x')\n",
            "other.py": "import loaders\nds = loaders.Dataset('x')\n",
        },
    )
    indexed: list[str] = []
    real = program_index.index_source
    monkeypatch.setattr(
        program_index, "index_source", lambda p, *a, **k: indexed.append(p.name) or real(p, *a, **k)
    )
    project_files.begin_file()
    assert _callers(tmp_path) == [("train.py", "<module>")]
    assert "other.py" not in indexed and "train.py" in indexed
    # skipped, yet recorded as read: the results cache re-lints when it changes
    assert str(tmp_path / "other.py") in project_files.files_read()


def test_a_caller_that_names_the_function_in_another_spelling_is_still_found(tmp_path) -> None:
    # Python reads `ｇｅｔ_loader` (fullwidth letters) as `get_loader` (NFKC): not in the bytes
    _project(
        tmp_path,
        {
            "loaders.py": LOADERS,
            "train.py": "from loaders import *\nloader = ｇｅｔ_loader('x')\n",
            "wrapped.py": "import loaders\n",
        },
    )
    assert b"get_loader" not in (tmp_path / "train.py").read_bytes()
    assert program_index.may_name(tmp_path / "train.py", "get_loader")
    assert not program_index.may_name(tmp_path / "wrapped.py", "get_loader")
    assert program_index.may_name(tmp_path / "wrapped.py", "<module>")  # not an identifier


def test_a_caller_in_a_latin_1_file_is_read_by_its_coding_cookie(tmp_path) -> None:
    _project(tmp_path, {"loaders.py": LOADERS})
    # `ª` (U+00AA) is one byte in Latin-1 and reads as `a` under NFKC: `get_lªder` is `get_lader`
    text = "# -*- coding: latin-1 -*-\nx = get_l\u00aader()\n"
    (tmp_path / "old.py").write_bytes(text.encode("latin-1"))
    assert program_index.may_name(tmp_path / "old.py", "get_lader")
    assert not program_index.may_name(tmp_path / "old.py", "get_loader")


def test_the_index_of_an_edited_text_takes_the_tree_verification_parsed(monkeypatch) -> None:
    from autoopt.lint.rewrite.verify import parse_python

    source = "import torch\n\ndef train(model):\n    model.x()\n"
    fresh = program_index.index_source(Path("t.py"), source)
    parse_python(source)  # rewrite's verification of this text
    parsed: list[str] = []
    monkeypatch.setattr(program_index, "parse_tree", lambda s: parsed.append(s))
    assert program_index.index_source(Path("t.py"), source) == fresh
    assert not parsed
    # another text is parsed (never the tree of a text it is not)
    program_index.index_source(Path("t.py"), source + "x = 1\n")
    assert parsed


def _cuts_in_one_pass(source: str, chunk_lines: int) -> tuple[int, ...] | None:
    """The cuts as `top_level_cuts` made them before it kept the cut points (one pass per run
    length, the gap tested only where the run is long enough)."""
    body = ast.parse(source).body
    lines = source.splitlines(keepends=True)
    cuts, last = [0], 0
    for statement, following in zip(body, body[1:], strict=False):
        end = statement.end_lineno or 0
        start = min(
            [following.lineno] + [d.lineno for d in getattr(following, "decorator_list", [])]
        )
        gap = lines[end : start - 1]
        if end - last >= chunk_lines and all(g in ("\n", "\r\n") or g.startswith("#") for g in gap):
            cuts.append(end)
            last = end
    return None if len(cuts) == 1 else (*cuts, len(lines))


def test_the_cut_points_of_a_long_module_are_found_once_for_any_run_length() -> None:
    source = "".join(
        f"def f{i}():\n    return {i}\n\n" if i % 7 else f"x{i} = (\n    {i}\n)\n    \n"
        for i in range(300)
    )
    chunks.top_level_cuts.cache_clear()
    chunks._cut_points.cache_clear()
    long_runs = chunks.top_level_cuts(source, 300)
    short_runs = chunks.top_level_cuts(source, 60)
    assert chunks._cut_points.cache_info().misses == 1  # one `ast` parse for both
    assert long_runs == _cuts_in_one_pass(source, 300)
    assert short_runs == _cuts_in_one_pass(source, 60)
    assert len(short_runs or ()) > len(long_runs or ()) > 2
