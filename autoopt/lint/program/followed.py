"""The modules of the project that hold the training a script runs.

`autoopt lint train.py` checks train.py and, as mypy follows imports, the modules where the
training it runs lives: Conv-TasNet's `src/train.py` builds a `Solver` whose `train()` loop is in
`src/solver.py`; MelGAN's `trainer.py` calls `train(...)` of `utils/train.py`. A driver's
findings are those of the program it runs, reported where the code is (the file and line to
edit), once: a module already linted is not added again.

A call leads on when the program model says it trains (`Program.call_summary(...).trains`: the
callee reaches `backward()`, a constructor excepted) and resolves to a module of the project;
the modules found are followed in turn (`depth` calls deep: a driver, its trainer, the
trainer's step helper). Only from a script whose training is all elsewhere: one that calls
`backward()` itself has its loop in its own text (yolov5's `train.py` reaching a profiling
helper through its batch-size search is not a driver of that helper).
"""

from __future__ import annotations

import os
from pathlib import Path

from autoopt.lint.program.index import load_index
from autoopt.lint.program.project_files import root_of
from autoopt.lint.program.project_text import read_text
from autoopt.lint.program.summaries import Target, program
from autoopt.lint.program.view import drives_training_elsewhere, training_call_sites


def training_modules(path: Path, source: str, depth: int = 3) -> list[tuple[Path, str]]:
    """The project modules (other than `path`) whose code the training `path` runs lives in,
    in the order the calls reach them, then those that build the loaders it iterates
    (`loader_modules`), each with what it holds ("training" or "loader"); [] when the
    script has a backward of its own or trains nowhere else."""
    if not drives_training_elsewhere(path, source):
        return []
    index = load_index(path)
    if index is None or any(func.backward for func in index.functions.values()):
        return []  # a script with a backward of its own is checked as it is written
    prog = program()
    root = os.path.abspath(root_of(path))
    start = os.path.abspath(path)
    seen = {start}
    found: list[Path] = []
    frontier = [start]
    for _ in range(depth):
        later = []
        for module in frontier:
            index = load_index(module)
            if index is None:
                continue
            for func, site in training_call_sites(index, own_methods=module != start):
                for target in prog.resolve(index, func, site.callee):
                    where = os.path.abspath(target.path)
                    if where in seen or not _inside(where, root):
                        continue
                    seen.add(where)
                    found.append(Path(where))
                    later.append(where)
        frontier = later
    loaders = loader_modules([Path(start), *found], root)
    return [(m, "training") for m in found] + [(m, "loader") for m in loaders]


def loader_modules(modules: list[Path], root: str) -> list[Path]:
    """The project modules (other than `modules`) whose functions build the loaders the
    training of `modules` iterates: guided-diffusion's `data = load_data(...)`, handed to
    `TrainLoop(data=data)`, built by a generator of image_datasets.py that re-iterates its
    DataLoader forever."""
    prog = program()
    seen = {os.path.abspath(m) for m in modules}
    found: list[Path] = []
    for module in modules:
        index = load_index(module)
        if index is None:
            continue
        for func in index.functions.values():
            roles = prog.summary(Target(index.path, func.qualname)).local_roles
            for name, held in roles.items():
                if "loader" not in held:
                    continue
                for value in func.assigns.get(name, ()):
                    call = value.options[0] if value.kind == "item" else value
                    if call.kind != "call":
                        continue
                    for target in prog.resolve(index, func, call.dotted):
                        where = os.path.abspath(target.path)
                        if target.is_class or where in seen or not _inside(where, root):
                            continue
                        if "DataLoader" not in read_text(Path(where)):
                            continue  # a list the training iterates (metric names), no loader
                        seen.add(where)
                        found.append(Path(where))
    return found


def _inside(path: str, root: str) -> bool:
    return path.endswith(".py") and path.startswith(root.rstrip(os.sep) + os.sep)
