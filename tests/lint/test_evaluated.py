"""`eval(<string>)(...)`: the class or function a command-line option names is what the call
runs (ncsn's `runner = eval(args.runner)(args, config)`), so the lint follows the training
into it."""

from __future__ import annotations

import ast
import json
import os
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoopt.cli import main
from autoopt.lint.program.evaluated import evaluated_names, string_options

from .fixtures import keep_cwd

pytestmark = pytest.mark.usefixtures(keep_cwd.__name__)

PARSER = """
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--runner", type=str, default="AnnealRunner")
parser.add_argument("--arch", default="DARTS", choices=["DARTS", "PDARTS"])
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--data-set", dest="dataset", default="cifar")
"""


def _names(expr: str) -> list[tuple[str, ...]]:
    options = string_options(ast.parse(PARSER))
    return evaluated_names(ast.parse(expr, mode="eval").body, options)


def test_the_names_an_option_its_defaults_and_choices_spell() -> None:
    assert string_options(ast.parse(PARSER)) == {
        "runner": ("AnnealRunner",),
        "arch": ("DARTS", "PDARTS"),
        "dataset": ("cifar",),
    }
    assert _names("args.runner") == [("AnnealRunner",)]
    assert _names('"genotypes.%s" % args.arch') == [("genotypes", "DARTS"), ("genotypes", "PDARTS")]
    assert _names("'datasets.' + opt.dataset + '.Loader'") == [("datasets", "cifar", "Loader")]
    assert _names('f"models.{args.runner}"') == [("models", "AnnealRunner")]


def test_what_is_not_spelt_in_the_module_names_nothing() -> None:
    assert _names("args.model") == []  # no such option
    assert _names("cfg.MODEL.NAME") == []  # a config tree, not an option here
    assert _names("args.lr") == []  # not a string
    assert _names("'1, 0 or 1'") == []  # not a name
    assert _names('f"models.{args.runner!r}"') == []


RUNNER = """
import torch


class AnnealRunner:
    def __init__(self, args, config):
        self.args, self.config = args, config

    def train(self):
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.Adam(model.parameters())
        for x in torch.utils.data.DataLoader(torch.randn(64, 8), batch_size=8):
            loss = model(x.cuda()).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""

MAIN = """
import argparse
from runners import *


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runner", type=str, default="AnnealRunner")
    args = parser.parse_args()
    runner = eval(args.runner)(args, None)
    runner.train()


if __name__ == "__main__":
    main()
"""


def test_a_runner_picked_by_eval_of_an_option_is_followed(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.autoopt]\n")
    (tmp_path / "runners").mkdir()
    (tmp_path / "runners" / "__init__.py").write_text("from runners.anneal_runner import *\n")
    (tmp_path / "runners" / "anneal_runner.py").write_text(textwrap.dedent(RUNNER))
    (tmp_path / "main.py").write_text(textwrap.dedent(MAIN))
    os.chdir(tmp_path)
    result = CliRunner().invoke(
        main, ["lint", "--no-cache", "--output-format", "json", "--select", "AO201", "main.py"]
    )
    found = [(Path(f["filename"]).name, f["code"]) for f in json.loads(result.stdout)]
    assert found == [("anneal_runner.py", "AO201")], result.output
