"""Notebooks: code cells joined, IPython syntax neutralised, locations name the cell."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from autoopt.lint.engine.config import Options
from autoopt.lint.engine.project import load_project
from autoopt.lint.engine.runner import lint_bytes, run_lint
from autoopt.lint.tree.notebook import NotebookError, notebook_source

from .fixtures import keep_cwd, load_fixture_rules, write_project

RULES = load_fixture_rules().all()

pytestmark = pytest.mark.usefixtures(keep_cwd.__name__)


def notebook(*cells: tuple[str, str], language: str = "python") -> str:
    return json.dumps(
        {
            "cells": [
                {"cell_type": kind, "source": text.splitlines(keepends=True), "metadata": {}}
                for kind, text in cells
            ],
            "metadata": {"kernelspec": {"language": language, "name": "k"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


def test_findings_name_cell_and_line() -> None:
    nb = notebook(
        ("markdown", "# Title\nCall x.cuda() here"),
        ("code", "import torch\n%matplotlib inline\n!pip install x\nx = torch.ones(1)"),
        ("code", "y = 2\nz = x.cuda()\n"),
    )
    result = lint_bytes(nb.encode(), "nb.ipynb", RULES, notebook=True)
    assert result.errors == []
    assert [(d.code, d.cell, d.line, d.column) for d in result.diagnostics] == [("XT101", 3, 2, 5)]


def test_magics_and_shell_lines_become_pass() -> None:
    nb = notebook(
        ("code", "for i in range(2):\n    %time f(i)\nfiles = !ls\nlen?\n"),
        ("code", "%%bash\necho hi ( unbalanced\n"),
        ("code", "%%time\nx = 1\n"),
    )
    source = notebook_source(nb).source
    assert source == "for i in range(2):\n    pass\npass\npass\npass\nx = 1\n"
    compile(source, "nb", "exec", dont_inherit=True, flags=0x400)  # PyCF_ONLY_AST: parses


def test_syntax_error_located_in_its_cell() -> None:
    nb = notebook(("code", "print(1)\n"), ("markdown", "x"), ("code", "a = 1\nprint(2\n"))
    (error,) = lint_bytes(nb.encode(), "nb.ipynb", RULES, notebook=True).errors
    assert (error.cell, error.line, error.kind) == (3, 2, "parse")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{", "invalid notebook JSON"),
        ("[]", "not a Jupyter notebook"),
        ('{"worksheets": []}', "nbformat 3"),
    ],
)
def test_bad_notebooks(text: str, words: str) -> None:
    with pytest.raises(NotebookError, match=words):
        notebook_source(text)
    assert words in lint_bytes(text.encode(), "nb.ipynb", RULES, notebook=True).errors[0].reason


def test_non_python_kernel_is_skipped() -> None:
    nb = notebook(("code", "x.cuda()\n"), language="R")
    assert lint_bytes(nb.encode(), "nb.ipynb", RULES, notebook=True).diagnostics == []


def test_noqa_inside_a_cell(tmp_path: Path) -> None:
    nb = notebook(("code", "a.cuda()  # noqa: XT101\nb.cuda()\n"))
    write_project(tmp_path, {"nb.ipynb": nb})
    os.chdir(tmp_path)
    project = load_project([tmp_path], Options(), registry=load_fixture_rules())
    report = run_lint(project, jobs=1)
    assert [(p, d.cell, d.line) for p, d in report.diagnostics] == [("nb.ipynb", 1, 2)]
