"""Output formats: text, json (Ruff's fields), SARIF 2.1.0 (schema subset), github, statistics."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import jsonschema
import pytest

from autoopt.cli.output import render, statistics
from autoopt.lint.engine.config import Options
from autoopt.lint.engine.project import load_project
from autoopt.lint.engine.runner import LintReport, run_lint

from .fixtures import keep_cwd, load_fixture_rules, write_project

# The parts of the SARIF 2.1.0 schema that GitHub code scanning requires.
SARIF_SUBSET = {
    "type": "object",
    "required": ["version", "runs"],
    "properties": {
        "version": {"const": "2.1.0"},
        "$schema": {"type": "string"},
        "runs": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["tool", "results"],
                "properties": {
                    "tool": {
                        "type": "object",
                        "required": ["driver"],
                        "properties": {
                            "driver": {
                                "type": "object",
                                "required": ["name", "rules"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "rules": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": [
                                                "id",
                                                "shortDescription",
                                                "fullDescription",
                                                "helpUri",
                                            ],
                                            "properties": {
                                                "id": {"type": "string"},
                                                "shortDescription": {"$ref": "#/$defs/message"},
                                                "fullDescription": {"$ref": "#/$defs/message"},
                                                "helpUri": {"type": "string", "format": "uri"},
                                            },
                                        },
                                    },
                                },
                            }
                        },
                    },
                    "results": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["ruleId", "message", "locations"],
                            "properties": {
                                "ruleId": {"type": "string"},
                                "level": {"enum": ["none", "note", "warning", "error"]},
                                "message": {"$ref": "#/$defs/message"},
                                "locations": {
                                    "type": "array",
                                    "minItems": 1,
                                    "items": {
                                        "type": "object",
                                        "required": ["physicalLocation"],
                                        "properties": {
                                            "physicalLocation": {
                                                "type": "object",
                                                "required": ["artifactLocation", "region"],
                                                "properties": {
                                                    "artifactLocation": {
                                                        "type": "object",
                                                        "required": ["uri"],
                                                    },
                                                    "region": {
                                                        "type": "object",
                                                        "required": ["startLine"],
                                                        "properties": {
                                                            "startLine": {
                                                                "type": "integer",
                                                                "minimum": 1,
                                                            },
                                                            "startColumn": {
                                                                "type": "integer",
                                                                "minimum": 1,
                                                            },
                                                            "endLine": {
                                                                "type": "integer",
                                                                "minimum": 1,
                                                            },
                                                            "endColumn": {
                                                                "type": "integer",
                                                                "minimum": 1,
                                                            },
                                                        },
                                                    },
                                                },
                                            }
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
    "$defs": {
        "message": {
            "type": "object",
            "required": ["text"],
            "properties": {"text": {"type": "string"}},
        }
    },
}

pytestmark = pytest.mark.usefixtures(keep_cwd.__name__)


@pytest.fixture
def report(tmp_path: Path) -> LintReport:
    write_project(
        tmp_path,
        {
            "b.py": "import torch\nm = torch.nn.Linear(1, 1).cuda()\nprint(m)\n",
            "a.py": "print(1)\nopt.zero_grad()\n",
            "bad.py": "print(1\n",
            "nb.ipynb": json.dumps(
                {"cells": [{"cell_type": "code", "source": "x.cuda()\n"}], "metadata": {}}
            ),
        },
    )
    os.chdir(tmp_path)
    project = load_project(
        [tmp_path], Options(target_version="1.13"), registry=load_fixture_rules()
    )
    return run_lint(project, jobs=1)


def test_text_is_sorted_concise_with_fix_markers(report: LintReport) -> None:
    styled = render(report, "text")
    assert "\x1b[" in styled  # styles are there; click strips them off a terminal
    lines = click.unstyle(styled).splitlines()
    assert lines[:6] == [
        "a.py:1:1: XT201 print() in a training script",
        "a.py:2:1: XT301 zero_grad() keeps gradients allocated before torch 2.0",
        "b.py:2:5: XT101 [*] hard-coded .cuda() call",
        "b.py:3:1: XT201 print() in a training script",
        "bad.py:1:6: error: syntax error: '(' was never closed",
        # rewrite does not edit notebooks: their findings are not shown as fixable
        "nb.ipynb:cell 1:1:1: XT101 hard-coded .cuda() call",
    ]
    assert lines[6] == "Found 5 findings in 3 files (4 files checked)."
    assert lines[7] == "[*] 1 fixable with `autoopt rewrite`."
    assert "1 more fixable with `autoopt rewrite --unsafe-fixes`" in lines[8]
    assert "1 file could not be linted" in lines[9]
    unsafe = click.unstyle(render(report, "text", unsafe_fixes=True))
    assert "a.py:2:1: XT301 [*]" in unsafe and "2 fixable" in unsafe


def test_quiet_has_no_summary(report: LintReport) -> None:
    assert "Found" not in click.unstyle(render(report, "text", quiet=True))


def test_json_has_ruff_fields(report: LintReport, tmp_path: Path) -> None:
    entries = json.loads(render(report, "json"))
    assert len(entries) == 6
    error = entries[0]
    assert error["code"] is None and error["message"].startswith("SyntaxError: ")
    by_code = {(e["code"], Path(e["filename"]).name, e["cell"]): e for e in entries[1:]}
    cuda = by_code[("XT101", "b.py", None)]
    assert set(cuda) == {
        "cell",
        "code",
        "end_location",
        "filename",
        "fix",
        "location",
        "message",
        "noqa_row",
        "url",
    }
    assert cuda["filename"] == str(tmp_path / "b.py")
    assert cuda["location"] == {"row": 2, "column": 5}
    assert cuda["end_location"] == {"row": 2, "column": 33}
    assert cuda["fix"] == {"applicability": "safe", "message": "use .to('cuda')"}
    assert cuda["url"].endswith("#xt101")
    assert by_code[("XT301", "a.py", None)]["fix"]["applicability"] == "unsafe"
    assert by_code[("XT201", "a.py", None)]["fix"] is None
    assert by_code[("XT101", "nb.ipynb", 1)]["location"] == {"row": 1, "column": 1}


def test_sarif_validates_against_the_schema_subset(report: LintReport, tmp_path: Path) -> None:
    log = json.loads(render(report, "sarif", root=tmp_path))
    jsonschema.validate(log, SARIF_SUBSET)
    run = log["runs"][0]
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == ["XT101", "XT201", "XT301"]
    first = run["results"][0]
    location = first["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "a.py", "uriBaseId": "%SRCROOT%"}
    assert location["region"] == {"startLine": 1, "startColumn": 1, "endLine": 1, "endColumn": 9}
    assert first["ruleIndex"] == 1
    assert run["invocations"][0]["executionSuccessful"] is False
    (note,) = run["invocations"][0]["toolExecutionNotifications"]
    assert "SyntaxError" in note["message"]["text"]
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"].endswith("/")


def test_github_annotations(report: LintReport) -> None:
    lines = render(report, "github").splitlines()
    assert lines[0].startswith("::error file=bad.py,line=1,col=6,title=autoopt SyntaxError::")
    assert (
        "::warning file=b.py,line=2,col=5,endLine=2,endColumn=33,title=XT101::hard-coded .cuda() call"
        in lines
    )
    assert any("title=XT101 (cell 1)" in line for line in lines)


def test_github_escapes_properties_and_data() -> None:
    from autoopt.cli.output import _escape_data, _escape_property

    assert _escape_property("a,b:c%") == "a%2Cb%3Ac%25"
    assert _escape_data("x\ny%") == "x%0Ay%25"


def test_statistics(report: LintReport) -> None:
    rows = statistics(report)
    assert [(r["code"], r["count"], r["fixable"]) for r in rows] == [
        ("XT101", 2, True),
        ("XT201", 2, False),
        ("XT301", 1, False),
    ]
    text = click.unstyle(render(report, "text", statistics=True, quiet=True))
    assert text.splitlines()[0] == "2\tXT101\t[*] cuda-call"
    assert json.loads(render(report, "json", statistics=True))[0]["code"] == "XT101"
