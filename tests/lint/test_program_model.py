"""The program model (autoopt/lint/program/index.py, summaries.py, view.py): calls resolved
across functions, methods and modules, what each function does with what it is handed, and the
rules that use it on programs whose loop, model and loader live in different files (issue 30)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from autoopt.lint.engine.config import Options
from autoopt.lint.engine.project import load_project
from autoopt.lint.engine.runner import run_lint
from autoopt.lint.program.index import index_source
from autoopt.lint.program.summaries import Program, Target
from autoopt.lint.rewrite.apply import fix_source

from .fixtures import keep_cwd

pytestmark = pytest.mark.usefixtures(keep_cwd.__name__)


def _write(root: Path, files: dict[str, str]) -> None:
    (root / "pyproject.toml").write_text("[tool.autoopt]\n")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text).lstrip("\n"))


def _findings(root: Path, path: str, *select: str) -> list[tuple[str, int, str]]:
    os.chdir(root)
    options = Options(select=select, no_cache=True)
    report = run_lint(load_project([root / path], options), jobs=1)
    return sorted((d.code, d.line, d.message) for _, d in report.diagnostics)


def _codes(root: Path, path: str, *select: str) -> list[str]:
    return [code for code, _, _ in _findings(root, path, *select)]


def _summary(root: Path, path: str, qualname: str, is_class: bool = False):
    os.chdir(root)
    return Program().summary(Target(Path(os.path.abspath(root / path)), qualname, is_class))


# ----- what a function does with what it is handed ---------------------------------------------
ENGINE = """
import torch

def train_one_epoch(model, loader, optimizer, device, criterion=None):
    model.train()
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    return sum(model(x).argmax(1).eq(y).sum() for x, y in loader)

def save_model(model, path):
    torch.save(model.state_dict(), path)

def fit(model, loader, optimizer, device, epochs, criterion):
    for epoch in range(epochs):
        train_one_epoch(model, loader, optimizer, device, criterion)
        evaluate(model, loader)
        save_model(model, "last.pt")
"""


def test_roles_of_each_parameter(tmp_path: Path) -> None:
    _write(tmp_path, {"engine.py": ENGINE})
    step = _summary(tmp_path, "engine.py", "train_one_epoch")
    assert step.trains
    assert {"forward", "trained", "module"} <= step.roles["model"]
    assert {"loader", "batches_to_device"} <= step.roles["loader"]
    assert "optimizer" in step.roles["optimizer"]
    evaluate = _summary(tmp_path, "engine.py", "evaluate")
    assert not evaluate.trains
    assert "forward_no_grad" in evaluate.roles["model"]
    assert "forward" not in evaluate.roles["model"]
    assert not _summary(tmp_path, "engine.py", "save_model").roles.get("model")


def test_roles_pass_through_calls(tmp_path: Path) -> None:
    """`fit` trains through `train_one_epoch`, which it calls once per epoch."""
    _write(tmp_path, {"engine.py": ENGINE})
    fit = _summary(tmp_path, "engine.py", "fit")
    assert fit.trains
    assert "trained" in fit.roles["model"]
    assert "loader_per_epoch" in fit.roles["loader"]


def test_a_step_whose_backward_is_inside_a_loss_scaler_trains(tmp_path: Path) -> None:
    """ConvNeXt/Swin: `loss_scaler(loss, optimizer, ...)` runs backward; the step zeroes
    gradients itself."""
    _write(
        tmp_path,
        {
            "engine.py": """
            def train_one_epoch(model, loader, optimizer, loss_scaler):
                for x, y in loader:
                    loss = model(x).sum()
                    optimizer.zero_grad()
                    loss_scaler(loss, optimizer, parameters=model.parameters())
            """
        },
    )
    assert _summary(tmp_path, "engine.py", "train_one_epoch").trains


def test_a_class_keeps_its_constructor_arguments(tmp_path: Path) -> None:
    """A Solver/Trainer class: the constructor's parameters get the roles the methods give
    the attributes they are kept in."""
    _write(
        tmp_path,
        {
            "solver.py": """
            class Solver:
                def __init__(self, loader, model, optimizer):
                    self.loader = loader
                    self.model = model
                    self.optimizer = optimizer

                def train(self):
                    for epoch in range(10):
                        for x in self.loader:
                            self.model(x).sum().backward()
                            self.optimizer.step()
            """
        },
    )
    solver = _summary(tmp_path, "solver.py", "Solver", is_class=True)
    assert solver.constructs and solver.trains
    assert "trained" in solver.roles["model"]
    assert "loader_per_epoch" in solver.roles["loader"]


def test_calls_resolve_across_modules(tmp_path: Path) -> None:
    """`from x import f`, `import engine; engine.f`, `from . import engine`, a method of a base
    class in another module, `t = Trainer(); t.fit()`, and `from solver import Solver` run with
    its own PYTHONPATH (src/solver/solver.py)."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/engine.py": ENGINE,
            "pkg/base.py": "class Base:\n    def fit(self):\n        self.loss.backward()\n",
            "pkg/trainer.py": "from .base import Base\nclass Trainer(Base):\n    pass\n",
            "src/solver/__init__.py": "",
            "src/solver/solver.py": "class Solver:\n    def run(self):\n        pass\n",
            "src/bin/main.py": "from solver import Solver\n",
            "pkg/main.py": """
            import pkg.engine as engine
            from . import engine as relative
            from .engine import fit
            from .trainer import Trainer

            def main():
                t = Trainer()
                t.fit()
            """,
        },
    )
    os.chdir(tmp_path)
    program = Program()
    main = program.module(tmp_path / "pkg/main.py")
    func = main.functions["main"]
    resolved = {
        callee: [(t.path.name, t.qualname) for t in program.resolve(main, func, callee)]
        for callee in [("engine", "fit"), ("relative", "evaluate"), ("fit",), ("t", "fit")]
    }
    assert resolved == {
        ("engine", "fit"): [("engine.py", "fit")],
        ("relative", "evaluate"): [("engine.py", "evaluate")],
        ("fit",): [("engine.py", "fit")],
        ("t", "fit"): [("base.py", "Base.fit")],
    }
    runner = program.module(tmp_path / "src/bin/main.py")
    (target,) = program.resolve(runner, runner.module_code, ("Solver",))
    assert target.path == (tmp_path / "src/solver/solver.py").absolute() and target.is_class


def test_iteration_through_an_alias_of_the_loader() -> None:
    """ViT: `epoch_iterator = tqdm(train_loader)` inside `while True:`, then a loop over it."""
    index = index_source(
        Path("t.py"),
        "def main(train_loader):\n"
        "    while True:\n"
        "        it = tqdm(train_loader)\n"
        "        for step, batch in enumerate(it):\n"
        "            pass\n",
    )
    uses = index.functions["main"].uses[("train_loader",)]
    assert {"iterated", "iterated_in_loop"} <= uses


# ----- rules over a program whose loop lives elsewhere ----------------------------------------
DRIVER = """
import torch
from torch.utils.data import DataLoader
from engine import fit

def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(dataset, batch_size=64, num_workers=4)
    model = Net().to(device)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    fit(model, loader, optimizer, device, 10, criterion)

if __name__ == "__main__":
    main()
"""


def test_a_driver_whose_loop_is_in_another_module(tmp_path: Path) -> None:
    """The driver builds the model and the loader and hands them to engine.fit: compile and
    persistent workers are reported here, TF32 once for the program (the driver), nothing for
    the criterion."""
    cuda_engine = ENGINE.replace("x.to(device), y.to(device)", "x.cuda(), y.cuda()")
    _write(tmp_path, {"engine.py": cuda_engine, "train.py": DRIVER})
    found = _findings(tmp_path, "train.py", "AO104", "AO301", "AO602")
    assert [(code, line) for code, line, _ in found] == [
        ("AO104", 7),
        ("AO301", 8),
        ("AO602", 11),
    ]
    assert "`model`" in found[1][2]
    assert _codes(tmp_path, "engine.py", "AO602") == []  # the trainer module a driver imports


def test_a_module_level_driver_of_a_conv_net_gets_cudnn_benchmark(tmp_path: Path) -> None:
    """going_modular's train.py: no `__main__` guard and no loop of its own, it builds a
    convolutional net and hands it to engine.fit: the program starts here, so cuDNN
    autotuning is reported here (and not in the engine it imports)."""
    driver = """
    import torch
    from torch import nn
    from engine import fit
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten()).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    fit(model, loader, optimizer, device, 10, torch.nn.CrossEntropyLoss())
    """
    _write(tmp_path, {"engine.py": ENGINE, "train.py": driver})
    assert _codes(tmp_path, "train.py", "AO601") == ["AO601"]
    assert _codes(tmp_path, "engine.py", "AO601") == []


LIBRARY_BUILDER_DRIVER = """
import torch
from torch.optim import lr_scheduler
from timm.optim import create_optimizer_v2
from nets import Net

def main():
    device = torch.device("cuda")
    model = Net().to(device)
    optimizer = create_optimizer_v2(model, "sgd", lr=0.1)
    scheduler = lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda e: 1.0)
    for x in loader:
        optimizer.zero_grad()
        model(x.to(device)).sum().backward()
        optimizer.step()
    scheduler.step()

if __name__ == "__main__":
    main()
"""

NETS = """
import torch.nn as nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
"""


def test_an_optimizer_a_library_builds_from_the_model_trains_that_model(tmp_path: Path) -> None:
    """timm's `create_optimizer_v2(model, ...)`: the model handed first is the one trained,
    not `device` (what `Net().to(device)` is called with); the LR scheduler over the optimizer
    is no optimizer of its own."""
    _write(tmp_path, {"nets.py": NETS, "train.py": LIBRARY_BUILDER_DRIVER})
    found = _findings(tmp_path, "train.py", "AO301")
    assert [(code, line) for code, line, _ in found] == [("AO301", 8)]
    assert "`model`" in found[0][2]


def test_an_lr_scheduler_is_not_read_as_an_optimizer(tmp_path: Path) -> None:
    _write(tmp_path, {"nets.py": NETS, "train.py": LIBRARY_BUILDER_DRIVER})
    os.chdir(tmp_path)
    from autoopt.lint.engine.rule import Rule
    from autoopt.lint.program.trained_models import trained_models

    seen: list[str] = []

    class Probe(Rule):
        code = "AO999"

        def visit_Module(self, node) -> None:  # noqa: ANN001
            seen.extend(self.context.module.code_for_node(c.func) for c, _ in trained_models(self))

    from autoopt.lint.engine.runner import lint_path

    lint_path(tmp_path / "train.py", [Probe])
    assert seen == ["create_optimizer_v2"]


def test_a_project_scheduler_builder_is_not_an_optimizer(tmp_path: Path) -> None:
    """pysot's `lr_scheduler = build_lr_scheduler(optimizer, ...)`, stepped like an optimizer:
    a call handed the optimizer wraps it, so its groups' names (`trainable_params`, a list)
    are no model to compile; the model is."""
    builder = """
    import torch

    def build_lr_scheduler(optimizer, epochs=50):
        return torch.optim.lr_scheduler.StepLR(optimizer, epochs)
    """
    driver = """
    import torch
    from nets import Net
    from sched import build_lr_scheduler

    def main():
        device = torch.device("cuda")
        model = Net().to(device)
        trainable_params = []
        trainable_params += [{"params": model.fc.parameters(), "lr": 0.1}]
        optimizer = torch.optim.SGD(trainable_params, momentum=0.9)
        lr_scheduler = build_lr_scheduler(optimizer, epochs=10)
        for x in loader:
            optimizer.zero_grad()
            model(x.to(device)).sum().backward()
            optimizer.step()
        lr_scheduler.step()

    if __name__ == "__main__":
        main()
    """
    _write(tmp_path, {"nets.py": NETS, "sched.py": builder, "train.py": driver})
    found = _findings(tmp_path, "train.py", "AO301")
    assert ["`trainable_params`" in message for _, _, message in found] == [False]
    assert "`model`" in found[0][2]
    # groups this file cannot trace: no model is named, least of all the list
    untraced = driver.replace(
        'trainable_params = []\n        trainable_params += [{"params": model.fc.parameters(), "lr": 0.1}]',
        "trainable_params = gather(model_cfg)",
    )
    assert "gather(model_cfg)" in untraced
    _write(tmp_path, {"train.py": untraced})
    assert _findings(tmp_path, "train.py", "AO301") == []


def test_parameter_groups_gathered_in_a_loop_over_the_model(tmp_path: Path) -> None:
    """faster-rcnn: `for key, value in dict(fasterRCNN.named_parameters()).items(): params +=
    [{"params": [value], ...}]`, then `SGD(params)`; the model is also zeroed
    (`fasterRCNN.zero_grad()`) and wrapped (`nn.DataParallel(fasterRCNN)`)."""
    driver = """
    import torch
    from nets import Net

    def main():
        fasterRCNN = Net()
        params = []
        for key, value in dict(fasterRCNN.named_parameters()).items():
            if value.requires_grad:
                params += [{"params": [value], "lr": 0.1}]
        optimizer = torch.optim.SGD(params, momentum=0.9)
        fasterRCNN.cuda()
        fasterRCNN = torch.nn.DataParallel(fasterRCNN)
        for x in loader:
            fasterRCNN.zero_grad()
            fasterRCNN(x.cuda()).sum().backward()
            optimizer.step()

    if __name__ == "__main__":
        main()
    """
    _write(tmp_path, {"nets.py": NETS, "train.py": driver})
    found = _findings(tmp_path, "train.py", "AO301")
    assert [(code, line) for code, line, _ in found] == [("AO301", 12)]
    assert "`fasterRCNN`" in found[0][2]


def test_a_project_optimizer_builder_that_walks_the_modules(tmp_path: Path) -> None:
    """yolov5's `smart_optimizer(model, ...)` reads `model.modules()` (no parameters() call):
    the argument the caller built as a model is the one trained."""
    builder = """
    import torch

    def smart_optimizer(model, lr=0.1):
        groups = [], []
        for m in model.modules():
            for name, p in m.named_parameters(recurse=False):
                (groups[0] if name == "bias" else groups[1]).append(p)
        optimizer = torch.optim.SGD(groups[1], lr=lr)
        optimizer.add_param_group({"params": groups[0]})
        return optimizer
    """
    driver = LIBRARY_BUILDER_DRIVER.replace(
        "from timm.optim import create_optimizer_v2", "from opt_utils import smart_optimizer"
    ).replace('create_optimizer_v2(model, "sgd", lr=0.1)', "smart_optimizer(model, 0.1)")
    _write(tmp_path, {"nets.py": NETS, "opt_utils.py": builder, "train.py": driver})
    found = _findings(tmp_path, "train.py", "AO301")
    assert [(code, line) for code, line, _ in found] == [("AO301", 8)]
    assert "`model`" in found[0][2]


def test_a_loader_a_project_function_only_evaluates_keeps_its_workers_choice(
    tmp_path: Path,
) -> None:
    """NCF: `hit_ratio(model, test_loader)` of evaluate.py iterates the loader and trains
    nothing; the training loader sets num_workers, so the test loader's 0 is a choice."""
    metrics = """
    def hit_ratio(model, loader):
        hits = 0
        for user, item in loader:
            hits += int(model(user, item).argmax() == item[0])
        return hits
    """
    driver = """
    import torch
    from torch.utils.data import DataLoader
    from engine import train_one_epoch
    from evaluate import hit_ratio

    def main():
        device = torch.device("cuda")
        train_loader = DataLoader(train_set, batch_size=64, num_workers=4)
        test_loader = DataLoader(test_set, batch_size=100, num_workers=0)
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(10):
            train_one_epoch(model, train_loader, optimizer, device)
            print(hit_ratio(model, test_loader))

    if __name__ == "__main__":
        main()
    """
    _write(tmp_path, {"engine.py": ENGINE, "evaluate.py": metrics, "train.py": driver})
    assert _codes(tmp_path, "train.py", "AO101") == []


SOLVER = """
import torch
from torch import nn

class Solver:
    def __init__(self, loader):
        self.loader = loader
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten()).cuda()
        self.optimizer = torch.optim.Adam(self.net.parameters())

    def train(self):
        for x, y in self.loader:
            self.net(x.cuda()).sum().backward()
            self.optimizer.step()
"""


def test_a_solver_module_a_driver_imports_leaves_cudnn_benchmark_to_the_driver(
    tmp_path: Path,
) -> None:
    """Image_Segmentation: solver.py's Solver trains a conv net in its own loop, main.py
    builds the Solver and sets cudnn.benchmark: nothing to report in solver.py; without the
    driver's line, the driver (the entry script) is told."""
    solver = SOLVER
    driver = """
    import torch
    from torch.backends import cudnn
    from solver import Solver

    def main():
        cudnn.benchmark = True
        Solver(loader).train()

    if __name__ == "__main__":
        main()
    """
    _write(tmp_path, {"solver.py": solver, "main.py": driver})
    assert _codes(tmp_path, "solver.py", "AO601") == []


def test_a_solver_in_a_package_leaves_cudnn_benchmark_to_the_root_driver(tmp_path: Path) -> None:
    """stargan-v2: core/solver.py trains, main.py at the root imports it (`from core.solver
    import Solver`) and sets cudnn.benchmark; without the driver's line solver.py is told."""
    solver = SOLVER
    driver = """
    from torch.backends import cudnn
    from core.solver import Solver

    def main(loader):
        cudnn.benchmark = True
        Solver(loader).train()

    if __name__ == "__main__":
        main(None)
    """
    files = {"core/__init__.py": "", "core/solver.py": solver, "main.py": driver}
    _write(tmp_path, files)
    assert _codes(tmp_path, "core/solver.py", "AO601") == []
    _write(tmp_path, {**files, "main.py": driver.replace("cudnn.benchmark = True", "pass")})
    assert _codes(tmp_path, "core/solver.py", "AO601") == ["AO601"]


def test_cudnn_benchmark_set_by_a_setup_function_the_script_calls(tmp_path: Path) -> None:
    """sam: train.py calls `initialize(args, seed=42)` from utility/initialize.py, which sets
    cudnn.benchmark: nothing to report; a determinism branch in the script itself still is."""
    setup = """
    import torch

    def initialize(args, seed):
        torch.manual_seed(seed)
        torch.backends.cudnn.benchmark = True
    """
    script = """
    import torch
    from torch import nn
    from utility.initialize import initialize

    initialize(None, seed=42)
    device = torch.device("cuda")
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten()).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        model(x.to(device)).sum().backward()
        optimizer.step()
    """
    files = {"utility/__init__.py": "", "utility/initialize.py": setup, "train.py": script}
    _write(tmp_path, files)
    assert _codes(tmp_path, "train.py", "AO601") == []
    quiet_setup = setup.replace("torch.backends.cudnn.benchmark = True", "pass")
    _write(tmp_path, {**files, "utility/initialize.py": quiet_setup})
    assert _codes(tmp_path, "train.py", "AO601") == ["AO601"]
    # a seed helper that turns it off only when asked for determinism (YOLOv3, SimSiam):
    # the default run has no autotuning, the script is still told
    seeded = setup.replace(
        "torch.backends.cudnn.benchmark = True",
        "if args.deterministic:\n        torch.backends.cudnn.benchmark = False",
    )
    _write(tmp_path, {**files, "utility/initialize.py": seeded})
    assert _codes(tmp_path, "train.py", "AO601") == ["AO601"]


TEXTCNN_MODEL = """
import torch
from torch import nn
from utils import *

class TextCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(8, 8, 3), nn.Flatten())

    def add_optimizer(self, optimizer):
        self.optimizer = optimizer

    def run_epoch(self, train_iterator, val_iterator):
        for i, batch in enumerate(train_iterator):
            self.optimizer.zero_grad()
            loss = self(batch.text.cuda()).sum()
            loss.backward()
            self.optimizer.step()
            if i % 100 == 0:
                print(evaluate_model(self, val_iterator))
"""
TEXTCNN_UTILS = """
def evaluate_model(model, iterator):
    scores = []
    for batch in iterator:
        scores.append(model(batch.text.cuda()).sum().item())
    return sum(scores)
"""
TEXTCNN_DRIVER = """
import torch
from torch import optim
from utils import *
from model import *

if __name__ == "__main__":
    model = TextCNN()
    if torch.cuda.is_available():
        model.cuda()
    optimizer = optim.SGD(model.parameters(), lr=0.1)
    model.add_optimizer(optimizer)
    for epoch in range(10):
        model.run_epoch(train_iterator, val_iterator)
"""


def test_a_model_class_that_trains_itself_behind_a_star_import(tmp_path: Path) -> None:
    """TextCNN: `from model import *` brings the class whose `run_epoch` holds the loop. The
    driver is told what belongs to the program's start (compile, TF32, the fused step, cuDNN's
    autotuning); model.py is not told cuDNN's flag again, nor about the periodic evaluation
    whose loop (utils.evaluate_model) is told where it is written."""
    _write(
        tmp_path,
        {"model.py": TEXTCNN_MODEL, "utils.py": TEXTCNN_UTILS, "train.py": TEXTCNN_DRIVER},
    )
    assert set(_codes(tmp_path, "train.py", "AO301", "AO601", "AO602", "AO605")) == {
        "AO301",
        "AO601",
        "AO602",
        "AO605",
    }
    assert _codes(tmp_path, "model.py", "AO601", "AO403") == []
    assert _codes(tmp_path, "utils.py", "AO403") == ["AO403"]
    # a driver that does not build the class itself leaves cuDNN's flag to model.py
    _write(tmp_path, {"train.py": TEXTCNN_DRIVER.replace("TextCNN()", "build()")})
    assert _codes(tmp_path, "model.py", "AO601") == ["AO601"]
    # a periodic call of a helper not named for evaluation is told where it runs
    _write(
        tmp_path,
        {
            "model.py": TEXTCNN_MODEL.replace("evaluate_model", "render_model"),
            "utils.py": TEXTCNN_UTILS.replace("evaluate_model", "render_model"),
        },
    )
    assert _codes(tmp_path, "model.py", "AO403") == ["AO403"]


def test_tf32_left_alone_when_the_trainer_the_driver_imports_runs_autocast(
    tmp_path: Path,
) -> None:
    """A driver hands its model to a Trainer (a star import of nerf/utils.py) whose steps
    always run under autocast: no TF32 advice for the driver; the same trainer with autocast
    behind a switch (torch-ngp's `enabled=self.fp16`, ConvNeXt's `if use_amp:`) leaves the
    default run in fp32, and without autocast at all too: the driver is told."""
    trainer = """
    import torch

    class Trainer:
        def __init__(self, model, optimizer, fp16):
            self.model, self.optimizer, self.fp16 = model.cuda(), optimizer, fp16

        def train(self, loader):
            for x in loader:
                self.optimizer.zero_grad()
                with torch.cuda.amp.autocast():
                    loss = self.model(x.cuda()).sum()
                loss.backward()
                self.optimizer.step()
    """
    driver = """
    import torch
    from nerf.utils import *

    if __name__ == "__main__":
        model = torch.nn.Linear(8, 8)
        optimizer = torch.optim.Adam(model.parameters())
        Trainer(model, optimizer, fp16=True).train(loader)
    """
    files = {"nerf/__init__.py": "", "nerf/utils.py": trainer, "main_nerf.py": driver}
    _write(tmp_path, files)
    assert _codes(tmp_path, "main_nerf.py", "AO602") == []
    switched = {
        "enabled=self.fp16": "with torch.cuda.amp.autocast(enabled=self.fp16):",
        "if self.fp16": "if self.fp16:\n                  with torch.cuda.amp.autocast():",
        "none": "if True:",
    }
    for how, line in switched.items():
        text = trainer.replace("with torch.cuda.amp.autocast():", line)
        if how == "if self.fp16":  # the body one level deeper
            text = text.replace("    loss = self.model", "      loss = self.model")
        _write(tmp_path, {**files, "nerf/utils.py": text})
        assert _codes(tmp_path, "main_nerf.py", "AO602") == ["AO602"], how


def test_cuda_calls_of_a_trainer_module_a_cuda_only_driver_runs(tmp_path: Path) -> None:
    """HRNet: lib/core/function.py moves batches with `.cuda()`; tools/train.py, which imports
    it, pins its rank with set_device and nccl: CUDA-only by design, nothing to report; a
    driver with a CPU path leaves the trainer's `.cuda()` reported."""
    function = """
    def train(model, loader, optimizer):
        for images, labels in loader:
            loss = model(images.cuda()).sum()
            loss.backward()
            optimizer.step()
    """
    driver = """
    import torch
    import torch.distributed as dist
    from core.function import train

    if __name__ == "__main__":
        dist.init_process_group("nccl")
        torch.cuda.set_device(0)
        train(model, loader, optimizer)
    """
    files = {"core/__init__.py": "", "core/function.py": function, "train.py": driver}
    _write(tmp_path, files)
    assert _codes(tmp_path, "core/function.py", "AO603") == []
    portable = driver.replace('dist.init_process_group("nccl")', "pass").replace(
        "torch.cuda.set_device(0)", 'device = "cpu"'
    )
    _write(tmp_path, {**files, "train.py": portable})
    assert _codes(tmp_path, "core/function.py", "AO603") == ["AO603"]
    # a `set_device` behind the driver's own flag (cnn-text-classification): not CUDA-only
    flagged = driver.replace('dist.init_process_group("nccl")', "pass").replace(
        "torch.cuda.set_device(0)", "if args.cuda:\n            torch.cuda.set_device(0)"
    )
    _write(tmp_path, {**files, "train.py": flagged})
    assert _codes(tmp_path, "core/function.py", "AO603") == ["AO603"]


def test_cuda_only_programs_spread_by_data_parallel(tmp_path: Path) -> None:
    """ban-vqa: the trainer module of a driver that spreads over the GPUs with DataParallel and
    has no CPU path is CUDA-only too; CMC: a script whose model class wraps itself in
    DataParallel, and which loads checkpoints with map_location="cpu" (no CPU path), is."""
    trainer = """
    def train(model, loader, optimizer):
        for v, a in loader:
            loss = model(v.cuda()).sum()
            loss.backward()
            optimizer.step()
    """
    driver = """
    import torch.nn as nn
    from train import train

    if __name__ == "__main__":
        model = nn.DataParallel(Net()).cuda()
        train(model, loader, optimizer)
    """
    _write(tmp_path, {"train.py": trainer, "main.py": driver})
    assert _codes(tmp_path, "train.py", "AO603") == []
    portable = driver.replace("nn.DataParallel(Net()).cuda()", 'nn.DataParallel(Net()).to("cpu")')
    _write(tmp_path, {"train.py": trainer, "main.py": portable})
    assert _codes(tmp_path, "train.py", "AO603") == ["AO603"]
    models = """
    import torch.nn as nn
    class InsResNet50(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.DataParallel(nn.Conv2d(3, 8, 3))
    """
    script = """
    import torch
    from models import InsResNet50
    model = InsResNet50().cuda()
    state = torch.load("ckpt.pt", map_location="cpu")
    for x in loader:
        model(x.cuda()).sum().backward()
    """
    _write(tmp_path, {"models.py": models, "moco.py": script})
    assert _codes(tmp_path, "moco.py", "AO603") == []
    # a `--cuda` flag guarding the moves is a CPU path (Knowledge-Distillation-Zoo)
    flagged = script.replace(
        "model = InsResNet50().cuda()",
        "model = InsResNet50()\n    if args.cuda:\n        model = model.cuda()",
    )
    _write(tmp_path, {"models.py": models, "moco.py": flagged})
    assert "AO603" in _codes(tmp_path, "moco.py", "AO603")
    plain = models.replace("nn.DataParallel(nn.Conv2d(3, 8, 3))", "nn.Conv2d(3, 8, 3)")
    _write(tmp_path, {"models.py": plain, "moco.py": script})
    assert set(_codes(tmp_path, "moco.py", "AO603")) == {"AO603"}


def test_a_model_class_that_wraps_itself_in_data_parallel(tmp_path: Path) -> None:
    """CMC: `model = InsResNet50()` whose `__init__` wraps its encoder in nn.DataParallel
    (models/resnet.py) is reported where the script builds it, naming the line; a factory
    function likewise; a class without DataParallel is not."""
    models = """
    import torch.nn as nn

    class InsResNet50(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.DataParallel(nn.Conv2d(3, 8, 3))

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Conv2d(3, 8, 3)

    def create_model():
        return nn.DataParallel(Plain())

    def maybe_parallel(gpus):
        model = Plain()
        if gpus:
            model = nn.DataParallel(model)
        return model
    """
    script = """
    import torch
    from models import InsResNet50, Plain, create_model, maybe_parallel

    model = InsResNet50().cuda()
    plain = Plain().cuda()
    made = create_model()
    for x in loader:
        model(x.cuda()).sum().backward()
    size = count_parameters(create_model())
    single = maybe_parallel(None)
    """
    _write(tmp_path, {"models.py": models, "train.py": script})
    found = _findings(tmp_path, "train.py", "AO501")
    assert [(code, line) for code, line, _ in found] == [("AO501", 4), ("AO501", 6)]
    assert "models.py:6" in found[0][2] and "models.py:14" in found[1][2]


def test_float64_set_by_a_driver_whose_training_is_elsewhere(tmp_path: Path) -> None:
    """PyTorch-RL: examples/ppo_gym.py sets float64 as the default dtype and calls ppo_step
    of core/ppo.py, which trains; a script that trains nowhere is left alone."""
    ppo = """
    def ppo_step(policy, optimizer, states):
        loss = policy(states).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
    driver = """
    import torch
    from ppo import ppo_step

    torch.set_default_dtype(torch.float64)
    for i in range(100):
        ppo_step(policy, optimizer, states)
    """
    _write(tmp_path, {"ppo.py": ppo, "train.py": driver})
    assert _codes(tmp_path, "train.py", "AO203") == ["AO203"]
    idle = driver.replace("ppo_step(policy, optimizer, states)", "print(i)")
    _write(tmp_path, {"ppo.py": ppo, "train.py": idle})
    assert _codes(tmp_path, "train.py", "AO203") == []


def test_a_trainer_module_follows_the_device_its_driver_chooses(tmp_path: Path) -> None:
    """faster-rcnn's utils_fit.py: `if cuda: images = images.cuda()` in a module whose driver
    chooses `device = torch.device(...)` is the driver's choice followed, not a script that
    never names a device; with a driver that names none, it is reported (once)."""
    function = """
    def fit(model, loader, optimizer, cuda):
        for images, labels in loader:
            if cuda:
                images, labels = images.cuda(), labels.cuda()
            loss = model(images).sum()
            loss.backward()
            optimizer.step()
    """
    driver = """
    import torch
    from utils_fit import fit

    if __name__ == "__main__":
        cuda = torch.cuda.is_available()
        device = torch.device("cuda" if cuda else "cpu")
        model = model.to(device)
        fit(model, loader, optimizer, cuda)
    """
    _write(tmp_path, {"utils_fit.py": function, "train.py": driver})
    assert _codes(tmp_path, "utils_fit.py", "AO603") == []
    legacy = driver.replace('device = torch.device("cuda" if cuda else "cpu")', "pass")
    legacy = legacy.replace("model = model.to(device)", "model = model.cuda() if cuda else model")
    _write(tmp_path, {"utils_fit.py": function, "train.py": legacy})
    assert _codes(tmp_path, "utils_fit.py", "AO603") == ["AO603"]


def test_a_model_picked_by_name_from_a_package_of_conv_nets(tmp_path: Path) -> None:
    """pytorch-book: `model = getattr(models, opt.model)()` over a package whose `__init__`
    re-exports its networks (`from .resnet34 import ResNet34`): convolutional, so cuDNN's
    flag and channels-last are told; a package of MLPs is not."""
    resnet = """
    from torch import nn

    class ResNet34(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 64, 7)
            self.fc = nn.Linear(64, 2)
    """
    driver = """
    import torch
    import models

    device = torch.device("cuda")
    model = getattr(models, "ResNet34")()
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters())
    for x, y in loader:
        optimizer.zero_grad()
        model(x.to(device)).sum().backward()
        optimizer.step()
    """
    files = {
        "models/__init__.py": "from .resnet34 import ResNet34\n",
        "models/resnet34.py": resnet,
        "main.py": driver,
    }
    _write(tmp_path, files)
    assert _codes(tmp_path, "main.py", "AO601", "AO606") == ["AO601", "AO606"]
    mlp = resnet.replace("nn.Conv2d(3, 64, 7)", "nn.Linear(3, 64)")
    _write(tmp_path, {**files, "models/resnet34.py": mlp})
    assert _codes(tmp_path, "main.py", "AO601", "AO606") == []


def test_an_optimizer_class_of_the_project_trains_the_model(tmp_path: Path) -> None:
    """sam: `SAM(model.parameters(), torch.optim.SGD, ...)` with `class SAM(Optimizer)` in
    sam.py, stepped by `first_step`/`second_step`: the model is trained, so compile is told;
    a class of the same name that is no optimizer is not one."""
    sam = """
    import torch

    class SAM(torch.optim.Optimizer):
        def __init__(self, params, base_optimizer, **kwargs):
            super().__init__(params, dict(**kwargs))
            self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
    """
    script = """
    import torch
    from sam import SAM

    device = torch.device("cuda")
    model = Net().to(device)
    optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1)
    for x, y in loader:
        model(x.to(device)).sum().backward()
        optimizer.first_step(zero_grad=True)
        model(x.to(device)).sum().backward()
        optimizer.second_step(zero_grad=True)
    """
    _write(tmp_path, {"sam.py": sam, "train.py": script})
    assert _codes(tmp_path, "train.py", "AO301") == ["AO301"]
    _write(tmp_path, {"sam.py": sam.replace("(torch.optim.Optimizer)", "(Base)")})
    assert _codes(tmp_path, "train.py", "AO301") == []


def test_compile_behind_the_device_the_script_picks(tmp_path: Path) -> None:
    """A CPU fallback keeps running eagerly: the safe fix compiles only on CUDA."""
    _write(tmp_path, {"engine.py": ENGINE, "train.py": DRIVER})
    os.chdir(tmp_path)
    from autoopt.rules.torch_compile_model import TorchCompileModel

    result = fix_source(
        (tmp_path / "train.py").read_text(), [TorchCompileModel], path=tmp_path / "train.py"
    )
    assert (
        '    model = Net().to(device)\n    if device.type == "cuda":\n        model.compile()\n'
        in (result.source)
    )
    cuda_only = DRIVER.replace("Net().to(device)", "Net().cuda()")
    result = fix_source(textwrap.dedent(cuda_only), [TorchCompileModel], path=tmp_path / "c.py")
    assert "    model = Net().cuda()\n    model.compile()\n" in result.source


def test_the_model_an_optimizer_builder_reads(tmp_path: Path) -> None:
    """Swin: `optimizer = build_optimizer(config, model)`: the model is the argument whose
    parameters the builder reads, not the config handed first (the old `opt.compile()` on an
    argparse namespace)."""
    _write(
        tmp_path,
        {
            "engine.py": ENGINE,
            "optim.py": """
            import torch
            def build_optimizer(config, model):
                return torch.optim.AdamW(model.parameters(), lr=config.lr)
            """,
            "train.py": """
            import torch
            from optim import build_optimizer
            config = load_config()
            model = Net().cuda()
            optimizer = build_optimizer(config, model)
            for x in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
            """,
        },
    )
    found = _findings(tmp_path, "train.py", "AO301")
    assert len(found) == 1 and "`model`" in found[0][2]


def test_training_call_that_returns_the_model(tmp_path: Path) -> None:
    """lufficc/SSD: `model = do_train(cfg, model, ...)` hands back the model it trained; a
    training call inside `try:` (YOLOv4) trains too."""
    _write(
        tmp_path,
        {
            "engine.py": ENGINE + "\ndef do_train(model, loader, opt):\n"
            "    fit(model, loader, opt, 'cuda', 1)\n    return model\n",
            "a.py": """
            from engine import do_train
            model = Net().cuda()
            opt = make_optimizer(model)
            model = do_train(model, loader, opt)
            """,
            "b.py": """
            from engine import do_train
            if __name__ == "__main__":
                model = Net()
                model.to(device="cuda")
                try:
                    do_train(model, loader, make_optimizer(model))
                except KeyboardInterrupt:
                    save(model)
            """,
        },
    )
    assert _codes(tmp_path, "a.py", "AO301") == ["AO301"]
    assert _codes(tmp_path, "b.py", "AO301") == ["AO301"]


def test_returned_loaders_iterated_by_the_caller(tmp_path: Path) -> None:
    """`get_loader()` builds the loaders; the script that calls it re-iterates them every
    epoch: persistent workers belong where the DataLoader is built. A dataset re-sampled in
    the main process between epochs must keep non-persistent workers."""
    _write(
        tmp_path,
        {
            "data.py": """
            from torch.utils.data import DataLoader
            def get_loader(args):
                train_loader = DataLoader(train_set, batch_size=8, num_workers=4)
                test_loader = DataLoader(test_set, batch_size=8, num_workers=4)
                return train_loader, test_loader
            """,
            "train.py": """
            from data import get_loader
            train_loader, test_loader = get_loader(args)
            for epoch in range(10):
                for x in train_loader:
                    model(x).sum().backward()
            """,
            "resampled.py": """
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=8, num_workers=4)
            for epoch in range(10):
                loader.dataset.ng_sample()
                for x in loader:
                    model(x).sum().backward()
            """,
        },
    )
    assert _findings(tmp_path, "data.py", "AO104")[0][:2] == ("AO104", 3)
    assert len(_codes(tmp_path, "data.py", "AO104")) == 1  # the test loader is iterated once
    assert _codes(tmp_path, "resampled.py", "AO104") == []


def test_evaluation_helpers_that_run_no_forward_with_autograd(tmp_path: Path) -> None:
    """`save_model(model)` and an `evaluate()` decorated with no_grad, called every N epochs
    inside the training loop, are no model run with autograd on (AO403's false positives)."""
    _write(
        tmp_path,
        {
            "engine.py": ENGINE,
            "train.py": """
            import torch
            from engine import evaluate, save_model
            model = Net().cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(10):
                for x in loader:
                    model(x).sum().backward()
                if epoch % 5 == 0:
                    evaluate(model, loader)
                    save_model(model, "m.pt")
                if epoch % 7 == 0:
                    samples = model(noise)
            """,
        },
    )
    assert [line for _, line, _ in _findings(tmp_path, "train.py", "AO403")] == [12]


def test_conv_models_by_weight(tmp_path: Path) -> None:
    """A vision transformer whose only Conv2d is the patch embedding is no convolutional net;
    a U-Net with attention blocks in some stages is (each block counted once per use)."""
    vit = """
    import torch.nn as nn
    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.fc1 = nn.Linear(d, 4 * d)
            self.fc2 = nn.Linear(4 * d, d)
    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, 192, 16, 16)
            self.blocks = nn.Sequential(*[Block(192) for _ in range(12)])
            self.head = nn.Linear(192, 10)
    """
    unet = """
    import torch.nn as nn
    class DoubleConv(nn.Module):
        def __init__(self, a, b):
            super().__init__()
            self.net = nn.Sequential(nn.Conv2d(a, b, 3), nn.Conv2d(b, b, 3))
    class Attention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.mha = nn.MultiheadAttention(c, 4)
            self.ff = nn.Sequential(nn.Linear(c, 4 * c), nn.Linear(4 * c, c))
    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.down1 = DoubleConv(3, 64)
            self.down2 = DoubleConv(64, 128)
            self.sa = Attention(128)
            self.up1 = DoubleConv(128, 64)
            self.up2 = DoubleConv(64, 3)
    """
    driver = """
    import torch
    from models import {name}
    model = {name}().cuda()
    opt = torch.optim.AdamW(model.parameters())
    for x in loader:
        model(x.cuda()).sum().backward()
    """
    for name, models, expected in (("ViT", vit, []), ("UNet", unet, ["AO606"])):
        _write(tmp_path, {"models.py": models, "train.py": driver.format(name=name)})
        assert _codes(tmp_path, "train.py", "AO606") == expected, name


def test_determinism_asked_for_through_a_flag(tmp_path: Path) -> None:
    """cleanrl: `cudnn.deterministic = args.torch_deterministic` (True by default): turning
    cudnn.benchmark on there would silently drop reproducibility."""
    script = """
    import torch
    import torch.nn as nn
    torch.backends.cudnn.deterministic = {value}
    model = nn.Conv2d(3, 8, 3).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in loader:
        model(x.cuda()).sum().backward()
    """
    for value, expected in (("args.torch_deterministic", []), ("False", ["AO601"])):
        _write(tmp_path, {"train.py": script.format(value=value)})
        assert _codes(tmp_path, "train.py", "AO601") == expected, value


def test_an_optimizer_factory_of_a_cuda_program(tmp_path: Path) -> None:
    """The optimizer is built in a factory module; the program that imports it trains on
    CUDA: fused belongs in the factory."""
    _write(
        tmp_path,
        {
            "optim_factory.py": """
            import torch
            def create_optimizer(model, lr):
                return torch.optim.AdamW(model.parameters(), lr=lr)
            """,
            "train.py": """
            import torch
            from optim_factory import create_optimizer
            model = Net().cuda()
            opt = create_optimizer(model, 1e-3)
            for x in loader:
                model(x.cuda()).sum().backward()
                opt.step()
            """,
            "cpu.py": "",
        },
    )
    assert _codes(tmp_path, "optim_factory.py", "AO605") == ["AO605"]
    (tmp_path / "train.py").write_text((tmp_path / "train.py").read_text().replace(".cuda()", ""))
    assert _codes(tmp_path, "optim_factory.py", "AO605") == []


def test_a_model_handed_in_is_compiled_where_it_is_built(tmp_path: Path) -> None:
    """cnn-text-classification: `train.train(train_iter, dev_iter, cnn, args)` builds the
    optimizer over the model it receives; compile belongs in main.py, which builds it."""
    _write(
        tmp_path,
        {
            "train.py": """
            import torch
            def train(loader, model, args):
                if args.cuda:
                    model.cuda()
                optimizer = torch.optim.Adam(model.parameters())
                for x in loader:
                    model(x).sum().backward()
                    optimizer.step()
            """,
            "main.py": """
            import train
            cnn = CNN_Text(args)
            if args.cuda:
                cnn = cnn.cuda()
            train.train(train_iter, cnn, args)
            """,
        },
    )
    assert _codes(tmp_path, "train.py", "AO301") == []
    assert _codes(tmp_path, "main.py", "AO301") == ["AO301"]


@pytest.mark.parametrize(
    "optimizer",
    [
        # parameter groups over parts of the model (DeepLabV3Plus)
        'torch.optim.SGD([{"params": model.backbone.parameters()},'
        ' {"params": model.classifier.parameters(), "lr": 0.1}], lr=0.01)',
        # a local alias of a torch.optim class over a filtered view (person re-id)
        "optim_name([{'params': filter(lambda p: p.requires_grad, model.parameters())}])",
        # transformers' AdamW over grouped named parameters (BERT-NER)
        "AdamW([{'params': [p for n, p in groups]}], lr=5e-5)",
        # a library optimizer inside a scheduling wrapper (FastSpeech2's ScheduledOptim)
        "ScheduledOptim(AdamW(model.parameters(), lr=5e-5), warmup=4000)",
        # a class picked from the config, stepped below (pytorch-semseg)
        "optimizer_cls(model.parameters(), lr=0.01)",
        # the model's own group helper (temporal-shift-module)
        "torch.optim.SGD(model.get_optim_policies(), lr=0.01)",
    ],
)
def test_optimizers_over_a_model_in_every_spelling(tmp_path: Path, optimizer: str) -> None:
    script = f"""
    import torch
    from torch import optim
    from transformers import AdamW
    model = Net().cuda()
    optim_name = optim.SGD
    optimizer_cls = get_optimizer(cfg)
    groups = list(model.named_parameters())
    optimizer = {optimizer}
    for x in loader:
        model(x).sum().backward()
        optimizer.step()
    """
    _write(tmp_path, {"train.py": script})
    found = _findings(tmp_path, "train.py", "AO301")
    assert len(found) == 1 and "`model`" in found[0][2], optimizer


def test_a_dataset_that_moves_its_samples_to_the_device(tmp_path: Path) -> None:
    """UrbanSoundDataset: `__getitem__` returns `signal.to(self.device)`: workers would have to
    start CUDA and pinning has nothing to pin (the loader is built by a helper that receives the
    dataset)."""
    _write(
        tmp_path,
        {
            "data.py": """
            from torch.utils.data import Dataset
            class Sounds(Dataset):
                def __init__(self, device):
                    self.device = device
                def __getitem__(self, i):
                    return self._load(i).to(self.device)
            class Plain(Dataset):
                def __getitem__(self, i):
                    return load(i)
            """,
            "train.py": """
            import torch
            from torch.utils.data import DataLoader
            from data import {dataset}
            def make_loader(data):
                return DataLoader(data, batch_size=64)
            if __name__ == "__main__":
                device = "cuda" if torch.cuda.is_available() else "cpu"
                loader = make_loader({dataset}(device))
                ds = {dataset}(device)
                loader = make_loader(ds)
                model = Net().to(device)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                for x in loader:
                    model(x.to(device)).sum().backward()
            """,
        },
    )
    for dataset, expected in (("Sounds", []), ("Plain", ["AO101", "AO102"])):
        text = (tmp_path / "train.py").read_text().replace("Sounds", "{dataset}")
        text = text.replace("Plain", "{dataset}").replace("{dataset}", dataset)
        (tmp_path / "train.py").write_text(text)
        assert _codes(tmp_path, "train.py", "AO101", "AO102") == expected, dataset


def test_a_library_optimizer_stepped_through_a_scaler(tmp_path: Path) -> None:
    """transformers' AdamW stepped by `scaler.step(optimizer)`: the class says optimizer."""
    _write(
        tmp_path,
        {
            "train.py": """
            import torch
            from transformers import AdamW
            model = Net().cuda()
            optimizer = AdamW(model.parameters(), lr=5e-5)
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x).sum()).backward()
                scaler.step(optimizer)
                scaler.update()
            """
        },
    )
    assert _codes(tmp_path, "train.py", "AO301") == ["AO301"]


def test_a_step_function_run_by_another_modules_loop_syncs_every_step(tmp_path: Path) -> None:
    """Graph-WaveNet, SAC, LightGCN: `engine.train(x, y)` returns `loss.item()`, and train.py's
    batch loop calls it: a sync per step (AO702 said nothing, the loop being elsewhere). A
    function no loop calls (an evaluation run once) stays quiet."""
    _write(
        tmp_path,
        {
            "engine.py": """
            import torch

            class Trainer:
                def __init__(self, model):
                    self.model = model
                    self.optimizer = torch.optim.Adam(model.parameters())

                def train(self, x, y):
                    self.optimizer.zero_grad()
                    loss = torch.nn.functional.mse_loss(self.model(x), y)
                    loss.backward()
                    self.optimizer.step()
                    return loss.item()

            def step(model, optimizer, x):
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
                return loss.item()

            def once(model, x):
                loss = model(x).sum()
                loss.backward()
                return loss.item()
            """,
            "train.py": """
            import torch
            from engine import Trainer, step, once

            engine = Trainer(torch.nn.Linear(4, 1).cuda())
            model = torch.nn.Linear(4, 1).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            once(model, torch.randn(2, 4))
            for epoch in range(10):
                for x, y in loader:
                    metrics = engine.train(x, y)
                    loss = step(model, opt, x)
            """,
        },
    )
    assert [line for _, line, _ in _findings(tmp_path, "engine.py", "AO702")] == [13, 19]
    # the same program on the CPU only: no device runs ahead of the host, nothing to wait for
    _write(tmp_path, {"train.py": (tmp_path / "train.py").read_text().replace(".cuda()", "")})
    assert _findings(tmp_path, "engine.py", "AO702") == []


# ----- stop 21: drivers, packages and agents (fresh-d's misses) ----------------------------------
PACKAGE_TRAINER = """
import torch
from torch import nn


class TrainLoop:
    def __init__(self, model, data, lr):
        self.model = model
        self.data = data
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)

    def run_loop(self):
        for x in self.data:
            self.opt.zero_grad()
            self.model(x).sum().backward()
            self.opt.step()
"""
PACKAGE_DEVICE = """
import torch


def dev():
    if torch.cuda.is_available():
        return torch.device("cuda:0")
    return torch.device("cpu")
"""
PACKAGE_DRIVER = """
from torch import nn
from pkg import dist_util
from pkg.train_util import TrainLoop


def main():
    model = nn.Linear(8, 8)
    model.to(dist_util.dev())
    TrainLoop(model=model, data=[], lr=1e-3).run_loop()


if __name__ == "__main__":
    main()
"""


def test_driver_of_a_package_trainer_gets_the_entry_script_advice(tmp_path: Path) -> None:
    """`from pkg import dist_util` reaches the package's submodule (its CUDA device), and
    `TrainLoop(...).run_loop()` trains: TF32 advice belongs to the driver (improved-diffusion)."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/dist_util.py": PACKAGE_DEVICE,
            "pkg/train_util.py": PACKAGE_TRAINER,
            "scripts/train.py": PACKAGE_DRIVER,
        },
    )
    assert _codes(tmp_path, "scripts/train.py", "AO602") == ["AO602"]
    # the setup code the driver imports chooses the precision: nothing to say
    _write(
        tmp_path,
        {
            "pkg/dist_util.py": PACKAGE_DEVICE
            + '\ndef setup():\n    torch.set_float32_matmul_precision("high")\n'
        },
    )
    assert _codes(tmp_path, "scripts/train.py", "AO602") == []


def test_submodules_named_by_a_from_import(tmp_path: Path) -> None:
    from autoopt.lint.program.project_text import imported_paths

    _write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "", "pkg/b.py": "", "pkg/c.py": ""})
    text = "from . import (a,\n    b as other)\nfrom pkg import c as a\n"
    found = {p.name for p in imported_paths(tmp_path / "pkg" / "m.py", text)}
    assert found == {"__init__.py", "a.py", "b.py", "c.py"}


AGENT = """
import torch
from torch import nn


class Agent:
    def __init__(self, device):
        self.device = device
        self.policy = nn.Linear(4, 2).to(device)
        self.optim = torch.optim.Adam(self.policy.parameters())

    def learn(self, batch):
        loss = self.policy(batch).pow(2).mean()
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
        return loss.item()
"""
AGENT_MAIN = """
import torch
from agent import Agent

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
agent: Agent = make_agent(device)
for step in range(1000):
    agent.learn(torch.randn(32, 4, device=device))
"""


def test_a_step_function_run_by_another_module_loop(tmp_path: Path) -> None:
    """`Agent.learn` is a training step: main.py's loop runs it (the instance is known by its
    annotation only). The agent's model, precision, optimizer and per-step sync are reported
    in agent.py, where they are built."""
    _write(tmp_path, {"agent.py": AGENT, "main.py": AGENT_MAIN})
    codes = _codes(tmp_path, "agent.py", "AO201", "AO301", "AO605", "AO702")
    assert codes == ["AO201", "AO301", "AO605", "AO702"]
    # without the loop that runs it, `learn` is one call, not a step: only the optimizer of
    # a CUDA program is left (AO605 reads what the importing code trains)
    _write(tmp_path, {"main.py": AGENT_MAIN.replace("for step in range(1000):\n    ", "")})
    assert _codes(tmp_path, "agent.py", "AO201", "AO301", "AO605", "AO702") == ["AO605"]


PPO_ALGO = """
import torch


class PPO:
    def __init__(self, actor_critic, lr):
        self.actor_critic = actor_critic
        self.optimizer = torch.optim.Adam(actor_critic.parameters(), lr=lr)

    def update(self, rollouts):
        for batch in rollouts.split(4):
            loss = self.actor_critic(batch).pow(2).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
"""
PPO_MAIN = """
import torch
from algos import algo

policy = torch.nn.Linear(4, 2).cuda()
agent = algo.PPO(policy, lr=1e-3)
for step in range(100):
    agent.update(torch.randn(8, 4).cuda())
"""


def test_a_model_handed_to_a_constructor_is_compiled_where_it_is_built(tmp_path: Path) -> None:
    """a2c-ppo-acktr: `PPO.__init__` receives the policy from main.py (through the package's
    `from .ppo import PPO`): compile goes where main.py builds it, not on the parameter."""
    _write(
        tmp_path,
        {
            "algos/__init__.py": "",
            "algos/algo/__init__.py": "from .ppo import PPO\n",
            "algos/algo/ppo.py": PPO_ALGO,
            "main.py": PPO_MAIN,
        },
    )
    assert _codes(tmp_path, "algos/algo/ppo.py", "AO301") == []
    assert _codes(tmp_path, "main.py", "AO301") == ["AO301"]


def test_an_optimizer_factory_handed_the_parameters_after_a_config(tmp_path: Path) -> None:
    """ddim: `get_optimizer(self.config, model.parameters())`, a function of the project that
    builds a torch.optim optimizer, trains `model` (AO301), although the config comes first."""
    _write(
        tmp_path,
        {
            "functions/__init__.py": """
                import torch.optim as optim

                def get_optimizer(config, parameters):
                    if config.optimizer == "Adam":
                        return optim.Adam(parameters, lr=config.lr)
                    return optim.SGD(parameters, lr=config.lr)
                """,
            "runner.py": """
                import torch
                from functions import get_optimizer

                def train(config, loader):
                    model = Model(config).to("cuda")
                    optimizer = get_optimizer(config, model.parameters())
                    for x in loader:
                        optimizer.zero_grad()
                        model(x).sum().backward()
                        optimizer.step()
                """,
        },
    )
    assert [(c, line) for c, line, _ in _findings(tmp_path, "runner.py", "AO301")] == [("AO301", 5)]


def test_a_model_picking_its_backbone_from_a_table_of_builder_and_size_pairs(
    tmp_path: Path,
) -> None:
    """SupContrast: `model_dict = {"resnet50": [resnet50, 2048], ...}` pairs each conv builder
    with its feature size; the class that picks from it is a Conv2d model (AO606)."""
    _write(
        tmp_path,
        {
            "networks/resnet_big.py": """
                import torch.nn as nn

                class ResNet(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.conv1 = nn.Conv2d(3, 64, 3)
                        self.conv2 = nn.Conv2d(64, 64, 3)

                    def forward(self, x):
                        return self.conv2(self.conv1(x)).mean((2, 3))

                def resnet18():
                    return ResNet()

                def resnet50():
                    return ResNet()

                model_dict = {"resnet18": [resnet18, 512], "resnet50": [resnet50, 2048]}

                class SupConResNet(nn.Module):
                    def __init__(self, name="resnet50"):
                        super().__init__()
                        model_fun, dim_in = model_dict[name]
                        self.encoder = model_fun()
                        self.head = nn.Linear(dim_in, 128)

                    def forward(self, x):
                        return self.head(self.encoder(x))
                """,
            "main.py": """
                import torch
                from networks.resnet_big import SupConResNet

                def set_model():
                    model = SupConResNet(name="resnet50")
                    if torch.cuda.is_available():
                        model = model.cuda()
                    return model

                def main(loader):
                    model = set_model()
                    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                    for x in loader:
                        optimizer.zero_grad()
                        model(x.cuda()).sum().backward()
                        optimizer.step()
                """,
        },
    )
    assert _codes(tmp_path, "main.py", "AO606") == ["AO606"]


def test_a_model_built_by_a_base_class_in_another_module_is_trained_uncompiled(
    tmp_path: Path,
) -> None:
    """Autoformer: `Exp_Basic.__init__` (exp/exp_basic.py) builds and places `self.model`;
    `Exp_Main(Exp_Basic)` trains it with its Adam: AO301 at the optimizer, without a fix,
    naming where the model is built. A class that binds `self.model` itself decides alone."""
    basic = """
        import torch

        class Exp_Basic:
            def __init__(self, args):
                self.device = torch.device("cuda")
                self.model = self._build_model().to(self.device)
        """
    main = """
        import torch
        from exp.exp_basic import Exp_Basic

        class Exp_Main(Exp_Basic):
            def _build_model(self):
                return Net()

            def _select_optimizer(self):
                return torch.optim.Adam(self.model.parameters(), lr=1e-3)

            def train(self, loader):
                model_optim = self._select_optimizer()
                for x in loader:
                    model_optim.zero_grad()
                    self.model(x.to(self.device)).sum().backward()
                    model_optim.step()
        """
    _write(tmp_path, {"exp/__init__.py": "", "exp/exp_basic.py": basic, "exp/exp_main.py": main})
    found = _findings(tmp_path, "exp/exp_main.py", "AO301")
    assert [(c, line) for c, line, _ in found] == [("AO301", 9)]
    assert "built in Exp_Basic.__init__ of exp/exp_basic.py" in found[0][2]

    # the subclass takes the model it is handed: its caller built it, the base's is replaced
    rebinding = main.replace(
        "def _build_model(self):",
        "def __init__(self, args, model):\n"
        "                super().__init__(args)\n"
        "                self.model = model\n\n"
        "            def _build_model(self):",
    )
    _write(tmp_path, {"exp/exp_main.py": rebinding})
    compile((tmp_path / "exp/exp_main.py").read_text(), "exp_main.py", "exec")
    found = _findings(tmp_path, "exp/exp_main.py", "AO301")
    assert not any("built in Exp_Basic" in message for _, _, message in found)


def test_a_script_whose_setup_module_starts_nccl_is_cuda_only(tmp_path: Path) -> None:
    """LoRA: gpt2_ft.py imports its apex amp in a `try:` (optional) and calls `.cuda()`; the
    distributed setup it imports (gpu.py) starts nccl and pins the rank with `set_device`: the
    program is CUDA-only, so AO603 stays quiet. Without that setup, `.cuda()` is reported."""
    setup = """
        import torch
        import torch.distributed as dist

        def parse_gpu(args):
            dist.init_process_group(backend="nccl")
            torch.cuda.set_device(args.local_rank)
        """
    script = """
        import torch
        from gpu import parse_gpu

        try:
            from apex import amp
        except ImportError:
            amp = None

        def main(args):
            parse_gpu(args)
            model = Net()
            model = model.cuda()
        """
    _write(tmp_path, {"gpu.py": setup, "train.py": script})
    assert _codes(tmp_path, "train.py", "AO603") == []
    _write(
        tmp_path,
        {
            "gpu.py": setup.replace('backend="nccl"', 'backend="gloo"').replace(
                "torch.cuda.set_device(args.local_rank)", "pass"
            )
        },
    )
    assert _codes(tmp_path, "train.py", "AO603") == ["AO603"]


# ----- a helper of another module that reads tensors on the host, run on every step -----------
COMMONS = """
import torch

def clip_grad_value_(parameters, clip_value):
    total = 0
    for p in parameters:
        norm = p.grad.data.norm(2)
        total += norm.item() ** 2
    return total ** 0.5

def log_every(step, loss, every):
    if step % every == 0:
        print(loss.item())

def train_step(model, x, y, optimizer):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
"""

GLOW_DRIVER = """
import torch
import commons

def train(model, loader, optimizer):
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())
        loss.backward()
        grad_norm = commons.clip_grad_value_(model.parameters(), None)
        commons.log_every(step, loss, 100)
        optimizer.step()
        commons.train_step(model, x.cuda(), y.cuda(), optimizer)
"""


def test_a_helper_of_another_module_reading_on_the_host_every_step(tmp_path: Path) -> None:
    """glow-tts: the step loop calls `commons.clip_grad_value_`, whose `.item()` per parameter
    is in commons.py: reported at the call, naming where the read is. Quiet for a helper that
    reads only under its own condition, and for a training step of that module (its reads are
    that module's findings)."""
    _write(tmp_path, {"commons.py": COMMONS, "train.py": GLOW_DRIVER})
    found = _findings(tmp_path, "train.py", "AO702")
    assert [(line, message.split(" reads")[0]) for _, line, message in found] == [
        (9, "commons.clip_grad_value_()")
    ]
    assert "(commons.py:7)" in found[0][2]


def test_a_helper_reading_on_the_host_through_the_helper_it_calls(tmp_path: Path) -> None:
    """ChangeFormer: the step loop calls `self._collect_running_batch_states()`, which calls
    `self._update_metric()` every time, whose `G_pred.cpu().numpy()` reads on the host: reported
    at the step's call, naming the read. Quiet where that call is under the helper's own `if`
    (a logging interval)."""
    trainer = """
    import torch

    class Trainer:
        def _update_metric(self):
            return self.pred.cpu().numpy()

        def _collect_states(self):
            score = self._update_metric()
            return score

        def train(self, loader):
            for x in loader:
                self.pred = self.net(x.cuda())
                loss = self.pred.sum()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                self._collect_states()
    """
    driver = """
    import torch
    from trainer import Trainer

    Trainer().train(loader)
    """
    _write(tmp_path, {"trainer.py": trainer, "train.py": driver})
    found = _findings(tmp_path, "trainer.py", "AO702")
    assert [(line, message.split(" reads")[0]) for _, line, message in found] == [
        (18, "self._collect_states()")
    ]
    assert "(trainer.py:5)" in found[0][2]
    logged = trainer.replace(
        "score = self._update_metric()",
        "if self.step % 100 == 0:\n                score = self._update_metric()",
    )
    _write(tmp_path, {"trainer.py": logged, "train.py": driver})
    assert _findings(tmp_path, "trainer.py", "AO702") == []
    # a function of another module below it is the algorithm's own (hindsight-experience-
    # replay's `sync_grads` reading the gradients into numpy for MPI): not reported
    comms = "def flat(pred):\n    return pred.cpu().numpy()\n"
    helper = trainer.replace(
        "import torch\n", "import torch\n    from comms import flat\n"
    ).replace("score = self._update_metric()", "score = flat(self.pred)")
    assert "score = flat(self.pred)" in helper
    _write(tmp_path, {"trainer.py": helper, "comms.py": comms, "train.py": driver})
    assert _findings(tmp_path, "trainer.py", "AO702") == []


def test_a_models_forward_reading_on_the_host_is_its_computation(tmp_path: Path) -> None:
    """Raindrop: `model.forward(P, Pstatic, Ptime, lengths)` every step, whose forward calls
    `lengths.cpu()` to pack the sequences: the model's computation, which no logging
    interval thins out; not reported (a helper's read is, above)."""
    model = """
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.GRU(8, 8)

        def forward(self, x, lengths):
            packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), enforce_sorted=False)
            return self.rnn(packed)[1].sum()
    """
    driver = """
    import torch
    from models import Net

    model = Net().cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for x, lengths in loader:
        loss = model.forward(x.cuda(), lengths.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
    _write(tmp_path, {"models.py": model, "train.py": driver})
    assert _findings(tmp_path, "train.py", "AO702") == []


def test_a_class_named_through_a_submodule_its_package_does_not_import(tmp_path: Path) -> None:
    """Audio-Classification: `import models.densenet`, then `models.densenet.DenseNet(...)`,
    with an empty models/__init__.py: the class is models/densenet.py's (a conv network on
    CUDA: AO606), which was not found through the package."""
    net = """
    import torch.nn as nn

    class DenseNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 8, 3)

        def forward(self, x):
            return self.conv(x).mean()
    """
    driver = """
    import torch
    import models.densenet

    model = models.densenet.DenseNet().to("cuda")
    optimizer = torch.optim.Adam(model.parameters())
    for x in loader:
        loss = model(x.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
    _write(tmp_path, {"models/__init__.py": "", "models/densenet.py": net, "train.py": driver})
    assert _codes(tmp_path, "train.py", "AO606") == ["AO606"]


TORCHBEAST = """
import torch
import torch.multiprocessing as mp
from torch import nn


class AtariNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 32, 8, stride=4)
        self.fc = nn.Linear(32 * 20 * 20, 6)

    def forward(self, x):
        return self.fc(self.conv(x).view(x.shape[0], -1))


Net = AtariNet

model = Net()
model.share_memory()
actors = [mp.Process(target=act, args=(model,)) for _ in range(4)]
learner_model = Net().to(device="cuda")
optimizer = torch.optim.RMSprop(learner_model.parameters(), lr=1e-3)
for batch in batches:
    loss = learner_model(batch.cuda()).sum()
    loss.backward()
    optimizer.step()
"""


def test_a_shared_actor_copy_beside_a_trained_learner_is_no_hogwild(tmp_path: Path) -> None:
    """TorchBeast: `model.share_memory()` is the actors' inference copy; the optimizer trains
    `learner_model` in an ordinary loop: compile, mixed precision and channels-last (the conv
    net under its alias `Net = AtariNet`, flattening with `.view`: no fix) are reported. With
    the trained model itself shared (Hogwild) they are not."""
    _write(tmp_path, {"monobeast.py": TORCHBEAST})
    found = _findings(tmp_path, "monobeast.py", "AO201", "AO301", "AO606")
    assert [(code, line) for code, line, _ in found] == [
        ("AO201", 23),
        ("AO301", 21),
        ("AO606", 21),
    ]
    assert "flattens activations with .view()" in found[2][2]
    hogwild = TORCHBEAST.replace("model.share_memory()", "learner_model.share_memory()")
    _write(tmp_path, {"monobeast.py": hogwild})
    assert _codes(tmp_path, "monobeast.py", "AO201", "AO301") == []


TABLE_MODELS = {
    "models/__init__.py": """
    from .cnn import ConvNet
    from .mlp import MLP

    MODELS = {"cnn": ConvNet, "small": MLP}
    """,
    "models/cnn.py": """
    from torch import nn

    class ConvNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.Conv2d(8, 8, 3), nn.Flatten()
            )

        def forward(self, x):
            return self.body(x)
    """,
    "models/mlp.py": """
    from torch import nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(8, 2)

        def forward(self, x):
            return self.body(x)
    """,
}
TABLE_DRIVER = """
import torch
from models import MODELS

device = torch.device("cuda")
model = MODELS[args.model]().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_model_picked_from_a_table_of_convolutional_networks(tmp_path: Path) -> None:
    """`MODELS[args.model]()` with `MODELS = {"cnn": ConvNet, ...}` in models/__init__.py:
    the table's networks weighed together are convolutional, so cuDNN autotuning and
    channels-last are reported where the model is built; a table of MLPs gets neither."""
    _write(tmp_path, {**TABLE_MODELS, "train.py": TABLE_DRIVER})
    assert _codes(tmp_path, "train.py", "AO601", "AO606") == ["AO601", "AO606"]
    mlps = TABLE_MODELS["models/__init__.py"].replace('"cnn": ConvNet', '"mlp": MLP')
    _write(tmp_path, {"models/__init__.py": mlps})
    assert _codes(tmp_path, "train.py", "AO601", "AO606") == []


def test_the_classes_a_table_entry_may_construct(tmp_path: Path) -> None:
    """The program model resolves `MODELS[name]()` (imported table) and `cls()` after
    `cls = MODELS[name]` to every class of the table."""
    driver = """
    from models import MODELS

    def main(name):
        cls = MODELS[name]
        return MODELS[name](), cls()
    """
    _write(tmp_path, {**TABLE_MODELS, "train.py": driver})
    os.chdir(tmp_path)
    program = Program()
    index = program.module(tmp_path / "train.py")
    main = index.functions["main"]
    for callee in (("MODELS", "[]"), ("cls",)):
        targets = program.resolve(index, main, callee)
        assert sorted(t.qualname for t in targets) == ["ConvNet", "MLP"]
        assert all(t.is_class for t in targets)


TEMPLATE_LOADERS = """
from torch.utils.data import DataLoader


class BaseDataLoader(DataLoader):
    def __init__(self, dataset, batch_size, shuffle, num_workers):
        self.init_kwargs = {"dataset": dataset, "batch_size": batch_size,
                            "shuffle": shuffle, "num_workers": num_workers}
        super().__init__(**self.init_kwargs)


class MnistDataLoader(BaseDataLoader):
    def __init__(self, data_dir, batch_size, shuffle=True, num_workers=1):
        super().__init__(make(data_dir), batch_size, shuffle, num_workers)
"""
TEMPLATE_TRAIN = """
import torch
from data_loader.data_loaders import MnistDataLoader

device = torch.device("cuda")
model = torch.nn.Linear(8, 2).to(device)
loader = MnistDataLoader("data", 64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(10):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_a_dataloader_subclass_of_the_project_without_pinning(tmp_path: Path) -> None:
    """pytorch-template: `MnistDataLoader(BaseDataLoader)`, the base a DataLoader that gets
    its options as kwargs. The script that builds it and copies its batches to CUDA is told
    (naming the class's line); a base that sets pin_memory, or a CPU script, is not."""
    files = {"data_loader/data_loaders.py": TEMPLATE_LOADERS, "train.py": TEMPLATE_TRAIN}
    _write(tmp_path, files)
    found = _findings(tmp_path, "train.py", "AO102")
    assert [(code, line) for code, line, _ in found] == [("AO102", 6)]
    assert "`MnistDataLoader` (data_loader/data_loaders.py:11)" in found[0][2]
    pinned = TEMPLATE_LOADERS.replace('"num_workers": num_workers}', '"pin_memory": True}')
    _write(tmp_path, {"data_loader/data_loaders.py": pinned})
    assert _codes(tmp_path, "train.py", "AO102") == []
    cpu = TEMPLATE_TRAIN.replace('torch.device("cuda")', '"cpu"')
    _write(tmp_path, {"data_loader/data_loaders.py": TEMPLATE_LOADERS, "train.py": cpu})
    assert _codes(tmp_path, "train.py", "AO102") == []
    # the script hands pin_memory to the class (MACE's `pin_memory=args.pin_memory`)
    handed = TEMPLATE_TRAIN.replace(
        'MnistDataLoader("data", 64)', 'MnistDataLoader("data", 64, pin_memory=args.pin)'
    )
    _write(tmp_path, {"train.py": handed})
    assert _codes(tmp_path, "train.py", "AO102") == []


S3REC_TRAINERS = """
import torch
import tqdm


class Trainer:
    def __init__(self, model, train_dataloader, args):
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = model.to(self.device)
        self.train_dataloader = train_dataloader
        self.optim = torch.optim.Adam(self.model.parameters(), lr=args.lr)

    def train(self, epoch):
        self.iteration(epoch, self.train_dataloader)

    def iteration(self, epoch, dataloader):
        raise NotImplementedError


class FinetuneTrainer(Trainer):
    def __init__(self, model, train_dataloader, args):
        super().__init__(model, train_dataloader, args)

    def iteration(self, epoch, dataloader):
        rec_data_iter = tqdm.tqdm(enumerate(dataloader), total=len(dataloader))
        for i, batch in rec_data_iter:
            batch = tuple(t.to(self.device) for t in batch)
            loss = self.model(*batch).mean()
            self.optim.zero_grad()
            loss.backward()
            self.optim.step()
"""
S3REC_DRIVER = """
import torch
from torch.utils.data import DataLoader
from trainers import FinetuneTrainer

args.cuda_condition = torch.cuda.is_available()
train_dataloader = DataLoader(train_dataset, batch_size=256)
trainer = FinetuneTrainer(model, train_dataloader, args)
for epoch in range(args.epochs):
    trainer.train(epoch)
"""


def test_a_loader_a_trainer_subclass_keeps_through_its_base(tmp_path: Path) -> None:
    """S3Rec: `FinetuneTrainer(model, train_dataloader, args)` hands the loader through
    `super().__init__` to `Trainer.__init__`, which keeps it; `Trainer.train` runs the
    subclass's `iteration`, which copies each batch (`tuple(t.to(self.device) for t in
    batch)`) to the device: the driver's DataLoader is told to pin its memory."""
    _write(tmp_path, {"trainers.py": S3REC_TRAINERS, "train.py": S3REC_DRIVER})
    assert _codes(tmp_path, "train.py", "AO102") == ["AO102"]
    os.chdir(tmp_path)
    summary = _summary(tmp_path, "trainers.py", "FinetuneTrainer", is_class=True)
    assert {"loader", "batches_to_device"} <= summary.roles["train_dataloader"]
    # batches used as they come (never copied) give the loader nothing to pin for
    host = S3REC_TRAINERS.replace("tuple(t.to(self.device) for t in batch)", "batch")
    _write(tmp_path, {"trainers.py": host})
    assert _codes(tmp_path, "train.py", "AO102") == []


def test_a_model_a_factory_returns_in_a_tuple(tmp_path: Path) -> None:
    """Deformable-DETR / guided-diffusion: `model, criterion = build_model(args)`: the
    factory's model is a Conv2d network (channels-last reported where it is placed); a
    tuple without one element named as the model is not guessed at."""
    builder = """
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.Flatten())

        def forward(self, x):
            return self.body(x)

    def build_model(args):
        model = Net()
        return model, nn.CrossEntropyLoss()
    """
    driver = """
    import torch
    from builder import build_model

    def main(args):
        device = torch.device("cuda")
        model, criterion = build_model(args)
        model.to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = criterion(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    main(args)
    """
    _write(tmp_path, {"builder.py": builder, "train.py": driver})
    assert _codes(tmp_path, "train.py", "AO606") == ["AO606"]
    _write(
        tmp_path,
        {"train.py": driver.replace("model, criterion", "net_a, net_b").replace("model", "net_a")},
    )
    assert _codes(tmp_path, "train.py", "AO606") == []


def test_loaders_a_helper_returns_kept_in_a_dict_the_epochs_pick_from(tmp_path: Path) -> None:
    """brain-segmentation: `loader_train, loader_valid = data_loaders(args)`, then
    `loaders = {"train": loader_train, ...}` and `for data in loaders[phase]` every epoch: the
    helper's loaders restart their workers each epoch."""
    script = """
    import torch
    from torch.utils.data import DataLoader

    def main(args):
        loader_train, loader_valid = data_loaders(args)
        loaders = {"train": loader_train, "valid": loader_valid}
        for epoch in range(args.epochs):
            for phase in ["train", "valid"]:
                for i, data in enumerate(loaders[phase]):
                    model(data.to(args.device)).sum().backward()

    def data_loaders(args):
        loader_train = DataLoader(train_set, batch_size=16, num_workers=args.workers)
        loader_valid = DataLoader(valid_set, batch_size=16, num_workers=args.workers)
        return loader_train, loader_valid
    """
    _write(tmp_path, {"train.py": script})
    assert _codes(tmp_path, "train.py", "AO104") == ["AO104", "AO104"]
    once = script.replace("for i, data in enumerate(loaders[phase])", "for i, data in [1]")
    _write(tmp_path, {"train.py": once})
    assert _codes(tmp_path, "train.py", "AO104") == []


FEEDS_DATA = """
import torch

class ModelPlain:
    def __init__(self, opt):
        self.device = torch.device("cuda")
        self.netG = torch.nn.Linear(4, 4).to(self.device)
        self.opt = torch.optim.Adam(self.netG.parameters())

    def feed_data(self, data):
        self.L = data["L"].to(self.device)
        self.H = data["H"].to(self.device)

    def optimize_parameters(self):
        self.opt.zero_grad()
        (self.netG(self.L) - self.H).pow(2).mean().backward()
        self.opt.step()
"""

FEEDS_DRIVER = """
import torch
from torch.utils.data import DataLoader
from models import ModelPlain

def main():
    torch.cuda.manual_seed_all(0)
    model = ModelPlain(opt)
    train_loader = DataLoader(dataset, batch_size=16, pin_memory=True)
    for epoch in range(10):
        for i, train_data in enumerate(train_loader):
            model.feed_data(train_data)
            model.optimize_parameters()

if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize(
    ("copy", "reported"),
    [
        ('data["L"].to(self.device)', True),
        ('data["L"].to(self.device, non_blocking=True)', False),  # the author chose
    ],
)
def test_a_batch_copied_by_a_method_the_loop_hands_it_to(
    tmp_path: Path, copy: str, reported: bool
) -> None:
    """KAIR: `model.feed_data(train_data)` copies the batch with `.to(self.device)` in
    models/model_plain.py; the loop itself writes no `.to()`: reported at the call, no fix."""
    models = FEEDS_DATA.replace('data["L"].to(self.device)', copy).replace(
        'data["H"].to(self.device)', copy.replace('"L"', '"H"')
    )
    _write(tmp_path, {"models.py": models, "train.py": FEEDS_DRIVER})
    found = _findings(tmp_path, "train.py", "AO103")
    assert [(code, line) for code, line, _ in found] == ([("AO103", 11)] if reported else [])
    if reported:
        assert "model.feed_data" in found[0][2]
        # bound anew first (audioset_tagging_cnn's `x = torch.Tensor(x)`): a new host tensor
        rebound = models.replace(
            "    def feed_data(self, data):\n",
            "    def feed_data(self, data):\n        data = dict(data)\n",
        )
        assert rebound != models
        _write(tmp_path, {"models.py": rebound})
        assert _findings(tmp_path, "train.py", "AO103") == []


def test_a_module_of_torch_before_0_4_is_indexed() -> None:
    """`x.cuda(async=True)` parses only as Python < 3.7: the project's index still reads the
    module (a loop in it is followed like any other)."""
    index = index_source(
        Path("engine.py"), "def train(model, x):\n    model(x.cuda(async=True)).backward()\n"
    )
    assert index.functions["train"].backward


CORL_IQL = """
import torch

class IQL:
    def __init__(self, net, optimizer):
        self.net, self.optimizer = net, optimizer

    def _update(self, x, log):
        loss = self.net(x).pow(2).mean()
        log["loss"] = loss.item()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def train(self, batch):
        log = {}
        self._update(batch, log)
        return log

def main(device="cuda"):
    net = torch.nn.Linear(4, 4).to(device)
    trainer = IQL(net, torch.optim.Adam(net.parameters()))
    for t in range(1000):
        batch = buffer.sample(256).to(device)
        trainer.train(batch)
"""


def test_a_step_that_a_loop_runs_through_an_object_and_a_helper(tmp_path: Path) -> None:
    """CORL's iql.py: the loop calls `trainer.train(batch)`, which calls `self._update(...)`,
    where the backward and an unconditional `loss.item()` are: a step run on every iteration
    (AO201 at the step, AO702 at the read)."""
    _write(tmp_path, {"iql.py": CORL_IQL})
    found = [(code, line) for code, line, _ in _findings(tmp_path, "iql.py", "AO201", "AO702")]
    assert found == [("AO201", 14), ("AO702", 9)]


def test_a_backward_helper_called_through_a_partial(tmp_path: Path) -> None:
    """lucidrains' stylegan2: `backwards = partial(loss_backwards, self.fp16)`, then
    `backwards(disc_loss, ...)` in the step loop: the loop trains (AO201)."""
    script = """
    import torch
    from functools import partial

    def loss_backwards(fp16, loss):
        loss.backward()

    def main(loader, device="cuda"):
        model = torch.nn.Linear(4, 4).to(device)
        optimizer = torch.optim.Adam(model.parameters())
        backwards = partial(loss_backwards, False)
        for x in loader:
            backwards(model(x.to(device)).sum())
            optimizer.step()
    """
    _write(tmp_path, {"gan.py": script})
    # the step runs in the helper: reported there (no fix)
    assert [(c, line) for c, line, _ in _findings(tmp_path, "gan.py", "AO201")] == [("AO201", 4)]


def test_a_logger_that_yields_the_loaders_batches(tmp_path: Path) -> None:
    """DETR's engine iterates `metric_logger.log_every(data_loader, print_freq, header)`: the
    loader's batches (not the print frequency nor the header) are what the loop copies, so the
    driver's DataLoader feeds a device (AO102)."""
    _write(
        tmp_path,
        {
            "engine.py": """
            def train_one_epoch(model, criterion, data_loader, optimizer, device, print_freq):
                model.train()
                header = "Epoch"
                for samples, targets in metric_logger.log_every(data_loader, print_freq, header):
                    samples = samples.to(device)
                    loss = criterion(model(samples), targets)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
            "main.py": """
            import torch
            from torch.utils.data import DataLoader
            from engine import train_one_epoch
            device = torch.device("cuda")
            loader = DataLoader(dataset, batch_size=2, num_workers=2)
            for epoch in range(10):
                train_one_epoch(model, criterion, loader, optimizer, device, 10)
            """,
        },
    )
    roles = _summary(tmp_path, "engine.py", "train_one_epoch").roles
    assert {"loader", "batches_to_device"} <= roles["data_loader"]
    assert "loader" not in roles.get("print_freq", set())
    assert _findings(tmp_path, "main.py", "AO102")[0][:2] == ("AO102", 5)


def test_a_type_dispatching_helper_reads_on_the_host_every_step(tmp_path: Path) -> None:
    """GwcNet's `tensor2float` (`if isinstance(v, torch.Tensor): return v.item()`) runs its
    read on every call: a type test is no logging clock (AO702 at the step's call)."""
    _write(
        tmp_path,
        {
            "utils.py": """
            import torch
            def tensor2float(v):
                if isinstance(v, float):
                    return v
                elif isinstance(v, torch.Tensor):
                    return v.data.item()
                raise NotImplementedError
            def every_hundred(step, v):
                if step % 100 == 0:
                    return v.item()
            """,
            "train.py": """
            from utils import tensor2float, every_hundred
            for step, (x, y) in enumerate(loader):
                loss = criterion(model(x.cuda()), y.cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                value, early = tensor2float(loss), every_hundred(step, loss)
            """,
        },
    )
    found = _findings(tmp_path, "train.py", "AO702")
    assert [(code, line) for code, line, _ in found] == [("AO702", 7)]
    assert "tensor2float()" in found[0][2]


def test_a_factorys_sampler_whose_loader_is_iterated_every_epoch_elsewhere(
    tmp_path: Path,
) -> None:
    """HigherHRNet's `make_dataloader` builds a DistributedSampler and returns the loader;
    the driver hands it to `do_train` every epoch and never calls set_epoch: AO503 in the
    factory, without a fix. A project that calls set_epoch anywhere is left alone."""
    files = {
        "build.py": """
        import torch
        def make_dataloader(dataset, distributed):
            sampler = None
            if distributed:
                sampler = torch.utils.data.distributed.DistributedSampler(dataset)
            data_loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)
            return data_loader
        """,
        "trainer.py": """
        def do_train(model, data_loader, optimizer):
            for x, y in data_loader:
                loss = model(x.cuda()).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        """,
        "train.py": """
        from build import make_dataloader
        from trainer import do_train
        train_loader = make_dataloader(dataset, True)
        for epoch in range(10):
            do_train(model, train_loader, optimizer)
        """,
    }
    _write(tmp_path, files)
    found = _findings(tmp_path, "build.py", "AO503")
    assert [(code, line) for code, line, _ in found] == [("AO503", 5)]
    assert "(no fix)" in found[0][2]
    script = textwrap.dedent(files["train.py"])
    (tmp_path / "train.py").write_text(
        script.replace("    do_train(", "    train_loader.sampler.set_epoch(epoch)\n    do_train(")
    )
    assert _codes(tmp_path, "build.py", "AO503") == []


def test_a_trainer_whose_driver_runs_its_own_fp16_optimizer(tmp_path: Path) -> None:
    """HigherHRNet's dist_train.py wraps the optimizer `do_train` steps in `FP16_Optimizer`
    and casts the model with `network_to_half`: the trainer module is not told to add
    autocast (AO201); without the driver's fp16 it is."""
    files = {
        "trainer.py": """
        import torch
        def do_train(model, loader, optimizer, fp16=False):
            for x, y in loader:
                loss = model(x.cuda(), y.cuda())
                optimizer.zero_grad()
                if fp16:
                    optimizer.backward(loss)
                else:
                    loss.backward()
                optimizer.step()
        """,
        "train.py": """
        import torch
        from trainer import do_train
        from fp16_utils import FP16_Optimizer, network_to_half
        model = network_to_half(Net().cuda())
        optimizer = FP16_Optimizer(torch.optim.Adam(model.parameters()), dynamic_loss_scale=True)
        for epoch in range(10):
            do_train(model, loader, optimizer, fp16=True)
        """,
    }
    _write(tmp_path, files)
    assert _codes(tmp_path, "trainer.py", "AO201") == []
    files["train.py"] = files["train.py"].replace("FP16_Optimizer(", "Wrapped(")
    _write(tmp_path, files)
    assert _codes(tmp_path, "trainer.py", "AO201") == ["AO201"]


def test_a_step_that_copies_the_entries_of_its_batch(tmp_path: Path) -> None:
    """`imgL, imgR = sample["left"], sample["right"]` then `imgL.cuda()`: the parameter's
    contents are copied to the device (GwcNet's `train_sample(sample)`); a name bound anew to
    something else is no part of it."""
    _write(
        tmp_path,
        {
            "step.py": """
            import torch
            def train_sample(sample, other):
                imgL, imgR = sample["left"], sample["right"]
                imgL = imgL.cuda()
                x = other["x"]
                x = torch.zeros(3)
                x = x.cuda()
            """
        },
    )
    roles = _summary(tmp_path, "step.py", "train_sample").roles
    assert "copied_to_device" in roles["sample"]
    assert "copied_to_device" not in roles.get("other", set())


def test_determinism_asked_for_by_a_seed_helper_the_script_calls(tmp_path: Path) -> None:
    """AGCRN calls `init_seed(args.seed)` of lib/TrainInits.py, which sets
    `cudnn.deterministic = True` whenever it runs: determinism is requested (no AO601); so does
    one under `if deterministic:` defaulting to True (PointPillars). A helper that asks for it
    only under another `if`, or a call under one, requests nothing."""
    files = {
        "inits.py": """
        import torch
        def init_seed(seed):
            torch.backends.cudnn.deterministic = True
            torch.manual_seed(seed)
        def maybe_seed(seed):
            if seed is not None:
                torch.backends.cudnn.deterministic = True
        def strict_seed(seed):
            torch.use_deterministic_algorithms(True)
        def setup_seed(seed=0, deterministic=True):
            if deterministic:
                torch.backends.cudnn.deterministic = True
        def loose_seed(seed=0, deterministic=False):
            if deterministic:
                torch.backends.cudnn.deterministic = True
        """,
        "run.py": """
        import torch
        from torch import nn
        from inits import init_seed, loose_seed, maybe_seed, setup_seed, strict_seed
        init_seed(args.seed)
        model = nn.Conv2d(3, 8, 3).cuda()
        for x in loader:
            model(x.cuda()).sum().backward()
        """,
    }
    _write(tmp_path, files)
    assert _codes(tmp_path, "run.py", "AO601") == []
    script = textwrap.dedent(files["run.py"])
    # PointPillars' `setup_seed()`, whose `if deterministic:` defaults to True
    for call in ("strict_seed(1)", "setup_seed()"):
        (tmp_path / "run.py").write_text(script.replace("init_seed(args.seed)", call))
        assert _codes(tmp_path, "run.py", "AO601") == [], call
    for call in (
        "maybe_seed(args.seed)",
        "loose_seed()",
        "if args.seed:\n    init_seed(args.seed)",
    ):
        (tmp_path / "run.py").write_text(script.replace("init_seed(args.seed)", call))
        assert _codes(tmp_path, "run.py", "AO601") == ["AO601"], call
    # the `__main__` block runs on every run: a call there asks for it (Gus-Lab's seed_all)
    main = 'if __name__ == "__main__":\n    init_seed(args.seed)'
    (tmp_path / "run.py").write_text(script.replace("init_seed(args.seed)", main))
    assert _codes(tmp_path, "run.py", "AO601") == []


def test_an_agent_class_picked_by_a_conditional_expression(tmp_path: Path) -> None:
    """sac-discrete's `Agent = SacdAgent if not args.shared else SharedSacdAgent`, then
    `Agent(...).run()`: either class, whose `run` trains, so the driver's training is followed;
    the environment the agent steps with its action is no optimizer."""
    _write(
        tmp_path,
        {
            "agents.py": """
            import torch
            class SacdAgent:
                def __init__(self, env):
                    self.env = env
                    self.policy = Policy().cuda()
                    self.optim = torch.optim.Adam(self.policy.parameters())
                def run(self):
                    state = self.env.reset()
                    for step in range(1000):
                        action = self.policy(state)
                        state, reward = self.env.step(action)
                        loss = -reward * action.sum()
                        self.optim.zero_grad()
                        loss.backward()
                        self.optim.step()
            class SharedSacdAgent(SacdAgent):
                pass
            """,
            "train.py": """
            from agents import SacdAgent, SharedSacdAgent
            def run(args, env):
                Agent = SacdAgent if not args.shared else SharedSacdAgent
                agent = Agent(env)
                agent.run()
            """,
        },
    )
    os.chdir(tmp_path)
    program = Program()
    index = program.module(Path(os.path.abspath("train.py")))
    targets = program.resolve(index, index.functions["run"], ("Agent",))
    assert {t.qualname for t in targets} == {"SacdAgent", "SharedSacdAgent"}
    assert _summary(tmp_path, "agents.py", "SacdAgent", is_class=True).trains
    run = _summary(tmp_path, "agents.py", "SacdAgent.run")
    assert "optimizer" not in run.roles.get("self.env", set())
    assert "optimizer" in run.roles.get("self.optim", set())
    from autoopt.lint.program.view import drives_training_elsewhere

    assert drives_training_elsewhere(tmp_path / "train.py", (tmp_path / "train.py").read_text())


def test_a_trainer_function_that_steps_the_model_it_is_handed(tmp_path: Path) -> None:
    """continual-learning: `train(model, loader)` of train_standard.py calls
    `model.train_a_batch(x, y)`; the driver hands it `cnn = define.define_classifier(...)`, a
    factory of models.py returning its `Classifier`, whose `train_a_batch` trains. The
    trainer's class comes from what its callers pass, in another module too, so the driver's
    training is followed into train_standard.py."""
    _write(
        tmp_path,
        {
            "models.py": """
            import torch
            from torch import nn
            class Classifier(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(4, 2)
                    self.optimizer = None
                def train_a_batch(self, x, y):
                    loss = nn.functional.cross_entropy(self.fc(x), y)
                    self.optimizer.zero_grad()
                    loss.backward()
                    self.optimizer.step()
                    return loss.item()
            def define_classifier(device):
                return Classifier().to(device)
            """,
            "train_standard.py": """
            def train(model, loader, device):
                for x, y in loader:
                    x, y = x.to(device), y.to(device)
                    model.train_a_batch(x, y)
            """,
            "main.py": """
            import torch
            import models
            import train_standard
            cnn = models.define_classifier("cuda")
            cnn.optimizer = torch.optim.Adam(cnn.parameters())
            train_standard.train(cnn, loader, "cuda")
            """,
        },
    )
    assert _summary(tmp_path, "train_standard.py", "train").trains
    from autoopt.lint.program.view import drives_training_elsewhere

    assert drives_training_elsewhere(tmp_path / "main.py", (tmp_path / "main.py").read_text())


def test_one_model_under_two_names_is_compiled_once(tmp_path: Path) -> None:
    """YOLOS: `model_without_ddp = model` (then `model.module` once wrapped in DDP) is handed
    to a local `build_optimizer(model, args)` while the loop trains `model`: one
    `model_without_ddp.compile()`, and a second pass finds it compiled (it used to insert it
    again and again: "no fixed point after 10 passes")."""
    script = """
    import torch
    def main(args):
        model = Net()
        model.to(device)
        model_without_ddp = model
        if args.distributed:
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
            model_without_ddp = model.module
        def build_optimizer(model, args):
            return torch.optim.AdamW(model.parameters(), lr=args.lr)
        optimizer = build_optimizer(model_without_ddp, args)
        for x, y in loader:
            loss = criterion(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """
    _write(tmp_path, {"main.py": script})
    os.chdir(tmp_path)
    from autoopt.rules.torch_compile_model import TorchCompileModel

    text = (tmp_path / "main.py").read_text()
    result = fix_source(text, [TorchCompileModel], path=tmp_path / "main.py")
    assert result.source.count(".compile()") == 1
    assert "        model_without_ddp = model.module\n    model_without_ddp.compile()\n" in (
        result.source
    )


def test_an_import_of_the_standard_library_or_an_installed_package_names_no_project_file(
    tmp_path: Path,
) -> None:
    """The PYTHONPATH fallback (`from solver import Solver` with src/solver.py) does not take
    a checkout's `tools/time.py` (a built-in module) or a copy of an installed package
    (`vendor/click/`) for what `import time` or `import click` means."""
    from autoopt.lint.program.project_files import begin_run, modules_named

    _write(
        tmp_path,
        {
            "src/solver.py": "",
            "tools/time.py": "",
            "vendor/click/__init__.py": "",
            "train.py": "",
        },
    )
    begin_run()
    script = tmp_path / "train.py"
    assert modules_named(script, "solver") == [tmp_path / "src" / "solver.py"]
    assert modules_named(script, "time") == []
    assert modules_named(script, "click") == []
