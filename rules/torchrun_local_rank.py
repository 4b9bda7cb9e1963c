"""AO502: `--local_rank` arguments and `torch.distributed.launch`, superseded by torchrun."""

from __future__ import annotations

import re

import libcst as cst

from autoopt.lint.engine.rule import Invalid, Rule, Valid
from autoopt.lint.tree.calls import arg
from autoopt.lint.tree.nodes import code_of, method_name, string_value

_LAUNCH = "torch.distributed.launch"
_FLAGS = ("--local_rank", "--local-rank")
# A file that sets DeepSpeed up: it imports it, adds its options or a `--deepspeed` flag.
_DEEPSPEED = re.compile(
    r"^[ \t]*(?:import|from)[ \t]+deepspeed\b|add_config_arguments\(|['\"]--deepspeed['\"]",
    re.MULTILINE,
)


class TorchrunLocalRank(Rule):
    """
    ## What it does
    Flags an argparse `--local_rank` / `--local-rank` option, an import of
    `torch.distributed.launch`, and command lines (lists or strings passed to a call) that run
    `python -m torch.distributed.launch`. The option may be declared in a module of the
    project the script calls to parse its command line (Point-MAE's `parser.get_args()` of
    utils/parser.py, BasicSR's `parse_options()`): that module is checked for this rule and
    the option reported there.

    ## Why
    `torch.distributed.launch` is deprecated since torch 1.10 in favour of `torchrun`, which
    restarts failed workers (`--max-restarts`), supports elastic membership, and passes the
    rank through the environment (`LOCAL_RANK`, `RANK`, `WORLD_SIZE`) instead of a
    `--local_rank` command-line argument (as a widely read PyTorch tutorial teaches). A script that requires `--local_rank`
    fails under `torchrun` with "the following arguments are required" or silently trains
    every process on GPU 0 when the argument defaults to 0. `autoopt.optimize()` reads
    rank and world size from the environment itself.

    ## When not to
    - A `--local_rank` option whose default already reads `os.environ["LOCAL_RANK"]` works
      under both launchers; it is not flagged.
    - Documentation strings that mention the old launcher are not flagged.
    - A file that sets DeepSpeed up (imports `deepspeed`, adds its options with
      `add_config_arguments`, or a `--deepspeed` flag: DALLE-pytorch's DeepSpeed backend):
      DeepSpeed's own launcher passes `--local_rank` to the script.

    ## Fix
    None: the launch command lives outside the file. Replace `--local_rank` with
    `local_rank = int(os.environ["LOCAL_RANK"])` and launch with
    `torchrun --nproc_per_node=N train.py`.
    """

    code = "AO502"
    name = "torchrun-local-rank"
    message = (
        "torch.distributed.launch / --local_rank are deprecated; launch with torchrun and read "
        'int(os.environ["LOCAL_RANK"])'
    )
    fix_reason = "the launch command is outside the script"
    triggers = ("--local_rank", "--local-rank", "distributed.launch", "import launch")
    applies_to_versions = ((1, 10), None)

    VALID = [
        Valid(  # a backend that loads DeepSpeed by name and adds its options (DALLE-pytorch)
            """
            class DeepSpeedBackend:
                def wrap_arg_parser(self, parser):
                    parser = self.backend_module.add_config_arguments(parser)
                    parser.add_argument("--local_rank", type=int, default=-1)
                    return parser
            """
        ),
        Valid(  # DeepSpeed's launcher passes --local_rank to the script
            """
            import argparse
            import deepspeed
            parser = argparse.ArgumentParser()
            parser.add_argument("--local_rank", type=int, default=-1)
            parser = deepspeed.add_config_arguments(parser)
            """
        ),
        Valid(
            """
            import os
            local_rank = int(os.environ["LOCAL_RANK"])
            """
        ),
        Valid(
            """
            import argparse, os
            parser = argparse.ArgumentParser()
            parser.add_argument(
                "--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0))
            )
            """
        ),
        Valid(
            '''
            """Launch with: python -m torch.distributed.launch --nproc_per_node=2 train.py (old)."""
            import torch
            '''
        ),
        Valid(
            """
            parser.add_argument("--rank", type=int, default=0)
            """
        ),
    ]
    INVALID = [
        Invalid(  # through a local alias of add_argument (dfdc_deepfake_challenge)
            """
            import argparse
            def main():
                parser = argparse.ArgumentParser()
                arg = parser.add_argument
                arg("--config", default="b7.json")
                arg("--local_rank", default=0, type=int)
                return parser.parse_args()
            """,
            line=6,
        ),
        Invalid(
            """
            import argparse
            parser = argparse.ArgumentParser()
            parser.add_argument('--local_rank', default=0, type=int)
            args = parser.parse_args()
            """,
            line=3,
        ),
        Invalid(
            """
            import subprocess as sp
            sp.run(["python", "-m", "torch.distributed.launch", "--nproc_per_node=2", "a.py"])
            """,
            line=2,
        ),
        Invalid(
            """
            from torch.distributed import launch
            launch.main()
            """,
            line=1,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if method_name(node) == "add_argument" or self._add_argument_alias(node):
            for a in node.args:
                if a.keyword is None and string_value(a.value) in _FLAGS:
                    default = arg(node, "default")
                    if default is not None and "LOCAL_RANK" in code_of(default.value):
                        return  # already reads torchrun's environment
                    if _DEEPSPEED.search(self.context.source):
                        return  # DeepSpeed's launcher passes `--local_rank` itself
                    self.report(node)
                    return
            return
        # a command line that runs the old launcher
        for a in node.args:
            values = (
                [e.value for e in a.value.elements]
                if isinstance(a.value, cst.List | cst.Tuple)
                else [a.value]
            )
            for v in values:
                text = string_value(v)
                if text is not None and _LAUNCH in text:
                    self.report(node)
                    return

    def _add_argument_alias(self, node: cst.Call) -> bool:
        """`arg("--local_rank", ...)` after `arg = parser.add_argument` in the same function
        (dfdc_deepfake_challenge's training pipelines)."""
        if not isinstance(node.func, cst.Name):
            return False
        scope = self.facts.enclosing_scope(node)
        return any(
            isinstance(value, cst.Attribute) and value.attr.value == "add_argument"
            for value, _ in self.facts.assigned_in(scope).get(node.func.value, ())
        )

    def visit_Import(self, node: cst.Import) -> None:
        if any(code_of(alias.name) == _LAUNCH for alias in node.names):
            self.report(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = code_of(node.module) if node.module is not None else ""
        if module == _LAUNCH:
            self.report(node)
            return
        if (
            module == "torch.distributed"
            and not isinstance(node.names, cst.ImportStar)
            and any(code_of(alias.name) == "launch" for alias in node.names)
        ):
            self.report(node)
