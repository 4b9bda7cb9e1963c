"""`autoopt lint train.py` also checks the modules holding the training train.py runs (a
driver's `engine.py`, a `Solver` class), reports each finding once, where its code is, and
edits only the files named."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoopt.cli import main
from autoopt.lint.engine.config import Options
from autoopt.lint.engine.project import load_project

from .fixtures import keep_cwd

pytestmark = pytest.mark.usefixtures(keep_cwd.__name__)

# The loop, on CUDA, in fp32 (AO201) with a per-step `.item()` (AO702).
ENGINE = """
import torch

def train_one_epoch(model, loader, optimizer):
    model.train()
    for x, y in loader:
        x, y = x.cuda(), y.cuda()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(loss.item())
"""

DRIVER = """
import torch
from engine import train_one_epoch

def main():
    model = torch.nn.Linear(8, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(10):
        train_one_epoch(model, loader, optimizer)

main()
"""


def _project(root: Path, files: dict[str, str], config: str = "") -> Path:
    (root / "pyproject.toml").write_text(f"[tool.autoopt]\n{config}")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text).lstrip("\n"))
    os.chdir(root)
    return root


def _lint(*args: str) -> tuple[list[tuple[str, str]], str]:
    result = CliRunner().invoke(
        main, ["lint", "--no-cache", "--output-format", "json", "--select", "AO201", *args]
    )
    assert result.exit_code in (0, 1), result.output
    found = [
        (os.path.relpath(f["filename"]).replace(os.sep, "/"), f["code"])
        for f in json.loads(result.stdout)
    ]
    return sorted(found), result.stderr


def test_a_driver_is_checked_with_the_module_its_loop_is_in(tmp_path: Path) -> None:
    _project(tmp_path, {"engine.py": ENGINE, "train.py": DRIVER})
    found, said = _lint("train.py")
    assert found == [("engine.py", "AO201")]
    assert "also checking engine.py" in said and "train.py" in said
    assert _lint("train.py", "--no-follow")[0] == []


# A trainer class whose loop trains on CUDA in fp32 (AO201), imported as `from solver import Solver`.
SOLVER = """
import torch

class Solver:
    def __init__(self, data, model, optimizer):
        self.data, self.model, self.optimizer = data, model, optimizer

    def train(self):
        for x, y in self.data:
            loss = self.model(x.cuda()).sum()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
"""


def test_a_trainer_imported_through_a_pythonpath_entry_is_followed(tmp_path: Path) -> None:
    """Listen-Attend-Spell: src/bin/train.py does `from solver import Solver`, run with
    src/solver on PYTHONPATH (path.sh), where src/solver/__init__.py is empty and
    src/solver/solver.py holds the Solver whose loop trains: the package that does not bind
    the name leaves the module of that name, which is followed (it was not)."""
    driver = """
    import torch
    from solver import Solver

    def main():
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        Solver(loader, model, optimizer).train()

    main()
    """
    files = {
        "src/solver/__init__.py": "",
        "src/solver/solver.py": SOLVER,
        "src/bin/train.py": driver,
    }
    _project(tmp_path, files)
    found, _ = _lint("src/bin/train.py")
    assert found == [("src/solver/solver.py", "AO201")]
    # a package that binds the name itself is what the import means
    files["src/solver/__init__.py"] = "class Solver:\n    def train(self):\n        pass\n"
    _project(tmp_path, files)
    found, _ = _lint("src/bin/train.py")
    assert found == []


def test_a_copy_of_a_library_in_the_checkout_is_not_what_its_import_means(
    tmp_path: Path,
) -> None:
    """A checkout holding a copy of torch's sources (benchmarks/corpus/_repos/torch here, a
    vendored library elsewhere): `from torch.utils.data import DataLoader` means the installed
    torch, not that copy, which was followed as the module building the script's loader. A
    module of the project's own is still found the way PYTHONPATH would."""
    copy = """
    class DataLoader:
        def __init__(self, dataset, batch_size=1, num_workers=0):
            self.dataset = dataset

        def __iter__(self):
            return iter(self.dataset)
    """
    driver = """
    import torch
    from torch.utils.data import DataLoader
    from solver import Solver

    def main():
        loader = DataLoader(list(range(8)), batch_size=2)
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        Solver(loader, model, optimizer).train()

    main()
    """
    _project(
        tmp_path,
        {
            "vendor/torch/__init__.py": "",
            "vendor/torch/utils/__init__.py": "",
            "vendor/torch/utils/data/__init__.py": "from .dataloader import DataLoader\n",
            "vendor/torch/utils/data/dataloader.py": copy,
            "src/solver.py": SOLVER,
            "train.py": driver,
        },
    )
    found, said = _lint("train.py")
    assert "vendor" not in said, said
    assert found == [("src/solver.py", "AO201")], said


def test_a_module_linted_anyway_is_reported_once(tmp_path: Path) -> None:
    _project(tmp_path, {"engine.py": ENGINE, "train.py": DRIVER})
    assert _lint("train.py", "engine.py")[0] == [("engine.py", "AO201")]
    found, said = _lint(".")
    assert found == [("engine.py", "AO201")]
    assert "also checking" not in said  # a folder's modules are all linted already


def test_the_training_is_followed_through_a_trainer_to_its_step(tmp_path: Path) -> None:
    """train.py -> trainer.Trainer.fit -> step.step (the backward): both modules; not the
    module of a builder the driver calls, although another function of it trains."""
    step = ENGINE.replace(
        "def train_one_epoch(model, loader, optimizer):", "def step(model, loader, optimizer):"
    )
    trainer = """
    from step import step

    class Trainer:
        def __init__(self, model, loader, optimizer):
            self.model, self.loader, self.optimizer = model, loader, optimizer

        def fit(self):
            for epoch in range(3):
                step(self.model, self.loader, self.optimizer)
    """
    tools = """
    import torch

    def make_model():
        return torch.nn.Linear(8, 2)

    def finetune(model, x):
        model(x).sum().backward()
    """
    driver = """
    import torch
    from tools import make_model
    from trainer import Trainer

    model = make_model().cuda()
    Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.1)).fit()
    """
    root = _project(
        tmp_path, {"step.py": step, "trainer.py": trainer, "tools.py": tools, "train.py": driver}
    )
    project = load_project([Path("train.py")], Options(no_cache=True), follow=True)
    assert [(m.as_posix(), n.as_posix()) for m, n in project.discovered.followed] == [
        ("trainer.py", "train.py"),
        ("step.py", "train.py"),
    ]
    assert load_project([root / "train.py"], Options(no_cache=True)).discovered.followed == []


def test_an_excluded_module_is_not_followed(tmp_path: Path) -> None:
    _project(
        tmp_path,
        {
            "vendor/engine.py": ENGINE,
            "train.py": DRIVER.replace("from engine", "from vendor.engine"),
        },
        config='extend-exclude = ["vendor"]\n',
    )
    assert _lint("train.py")[0] == []
    (tmp_path / "pyproject.toml").write_text("[tool.autoopt]\n")
    assert _lint("train.py")[0] == [("vendor/engine.py", "AO201")]


def test_a_library_trainer_is_not_followed(tmp_path: Path) -> None:
    driver = """
    import lightning as L
    trainer = L.Trainer(max_epochs=3)
    trainer.fit(model, loader)
    """
    _project(tmp_path, {"train.py": driver})
    assert load_project([Path("train.py")], Options(), follow=True).discovered.followed == []


def test_edits_touch_only_the_files_named(tmp_path: Path) -> None:
    """`--add-noqa` and `--fix` edit the files named; a followed module is left as it is."""
    _project(tmp_path, {"engine.py": ENGINE, "train.py": DRIVER})
    engine = (tmp_path / "engine.py").read_bytes()
    runner = CliRunner()
    result = runner.invoke(
        main, ["lint", "--no-cache", "--select", "AO201,AO702", "--add-noqa", "train.py"]
    )
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        main,
        ["lint", "--no-cache", "--select", "AO201,AO702", "--fix", "--unsafe-fixes", "train.py"],
    )
    assert (tmp_path / "engine.py").read_bytes() == engine
    assert "engine.py" in result.stdout  # still reported: nothing was fixed there


def test_a_script_with_a_loop_of_its_own_is_checked_as_written(tmp_path: Path) -> None:
    """yolov5's train.py has its own loop and reaches a profiling helper that calls backward()
    (its batch-size search): the helper's module is no driver's training."""
    own_loop = DRIVER.replace(
        "        train_one_epoch(model, loader, optimizer)",
        "        for x in loader:\n            model(x.cuda()).sum().backward()\n"
        "        train_one_epoch(model, loader, optimizer)",
    )
    _project(tmp_path, {"engine.py": ENGINE, "train.py": own_loop})
    assert load_project([Path("train.py")], Options(), follow=True).discovered.followed == []
    found, _ = _lint("train.py")
    assert found == [("train.py", "AO201")]


AGENT = """
import torch

class Agent:
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def update(self, x, y):
        loss = torch.nn.functional.cross_entropy(self.model(x.cuda()), y.cuda())
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
"""


def test_an_object_a_factory_of_the_script_returns(tmp_path: Path) -> None:
    """CURL: `agent = make_agent(...)` returns a `CurlSacAgent(...)`; `agent.update()` trains
    in curl_sac.py."""
    driver = """
    import torch
    from agent import Agent

    def make_agent(kind):
        if kind == "sac":
            return Agent(torch.nn.Linear(8, 2).cuda(), None)
        raise ValueError(kind)

    def main():
        agent = make_agent("sac")
        for step in range(100):
            agent.update(x, y)

    main()
    """
    _project(tmp_path, {"agent.py": AGENT, "train.py": driver})
    assert _lint("train.py")[0] == [("agent.py", "AO201")]


def test_a_class_under_another_name(tmp_path: Path) -> None:
    """PatchTST: `Exp = Exp_Main` in the `__main__` block, then `exp = Exp(args)` and
    `exp.train(setting)`."""
    driver = """
    import torch
    from agent import Agent

    if __name__ == "__main__":
        Exp = Agent
        exp = Exp(torch.nn.Linear(8, 2).cuda(), None)
        for step in range(100):
            exp.update(x, y)
    """
    _project(tmp_path, {"agent.py": AGENT, "train.py": driver})
    assert _lint("train.py")[0] == [("agent.py", "AO201")]


def test_a_function_imported_inside_the_function_that_calls_it(tmp_path: Path) -> None:
    """benchmarking-gnns: `from train.x import train_epoch_sparse as train_epoch` inside the
    pipeline function, then `train_epoch(model, ...)` every epoch."""
    driver = """
    import torch

    def pipeline():
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        from engine import train_one_epoch as train_epoch
        for epoch in range(10):
            train_epoch(model, loader, optimizer)

    pipeline()
    """
    _project(tmp_path, {"engine.py": ENGINE, "train.py": driver})
    assert _lint("train.py")[0] == [("engine.py", "AO201")]


@pytest.mark.parametrize(
    "pick",
    [
        # a table of the driver's (TRAINERS = {...}), an entry kept under a name, then built
        "TRAINERS = {'sac': Agent}\n\ndef main():\n    cls = TRAINERS['sac']\n"
        "    agent = cls(torch.nn.Linear(8, 2).cuda(), None)\n",
        # the entry built at once
        "TRAINERS = {'sac': Agent}\n\ndef main():\n"
        "    agent = TRAINERS['sac'](torch.nn.Linear(8, 2).cuda(), None)\n",
        # TabSurvey's `str2model`: a function that returns the class by name
        "def pick(name):\n    if name == 'sac':\n        return Agent\n"
        "    raise ValueError(name)\n\ndef main():\n"
        "    agent = pick('sac')(torch.nn.Linear(8, 2).cuda(), None)\n",
    ],
    ids=["table-entry", "table-call", "class-factory"],
)
def test_a_trainer_class_picked_at_run_time(tmp_path: Path, pick: str) -> None:
    """The trainer is chosen by a string: an entry of a dict of classes, or the class a
    function returns. Its `update` is the training the driver runs."""
    driver = (
        "import torch\nfrom agent import Agent\n\n"
        + pick
        + "    for step in range(100):\n        agent.update(x, y)\n\nmain()\n"
    )
    _project(tmp_path, {"agent.py": AGENT, "train.py": driver})
    assert _lint("train.py")[0] == [("agent.py", "AO201")]


def test_a_factory_returning_an_instance_is_not_a_class_to_call(tmp_path: Path) -> None:
    """`model = build()` returning `Agent(...)` is a model, not a class: `model(x)` does not
    run `Agent.__init__` (nothing followed into agent.py for that call)."""
    driver = """
    import torch
    from agent import Agent

    def build():
        return Agent(torch.nn.Linear(8, 2).cuda(), None)

    def main():
        agent = build()
        agent(x)

    main()
    """
    _project(tmp_path, {"agent.py": AGENT, "train.py": driver})
    assert _lint("train.py")[0] == []


BASE_TRAINER = """
class BaseTrainer:
    def __init__(self, model, optimizer, loader):
        self.model, self.optimizer, self.loader = model, optimizer, loader

    def train(self, epochs):
        for epoch in range(epochs):
            self._train_epoch(epoch)

    def _train_epoch(self, epoch):
        raise NotImplementedError
"""
SUB_TRAINER = """
import torch
from base.base_trainer import BaseTrainer

class Trainer(BaseTrainer):
    def __init__(self, model, optimizer, loader):
        super().__init__(model, optimizer, loader)

    def _train_epoch(self, epoch):
        for x, y in self.loader:
            loss = torch.nn.functional.cross_entropy(self.model(x.cuda()), y.cuda())
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
"""


def test_a_base_trainer_whose_step_a_subclass_of_another_module_overrides(
    tmp_path: Path,
) -> None:
    """pytorch-template: `Trainer(BaseTrainer)` in trainer/trainer.py; `BaseTrainer.train`
    (base/base_trainer.py) calls `self._train_epoch`, which only the subclass defines. The
    driver's `trainer.train()` trains there."""
    driver = """
    import torch
    from trainer.trainer import Trainer

    def main():
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        trainer = Trainer(model, optimizer, loader)
        trainer.train(10)

    main()
    """
    files = {
        "base/__init__.py": "",
        "base/base_trainer.py": BASE_TRAINER,
        "trainer/__init__.py": "",
        "trainer/trainer.py": SUB_TRAINER,
        "train.py": driver,
    }
    _project(tmp_path, files)
    assert _lint("train.py")[0] == [("trainer/trainer.py", "AO201")]


@pytest.mark.parametrize(
    "run",
    [
        "trainer(10)",  # the instance called: its class's __call__ (disentangling-vae)
        "retry_call(trainer.fit, tries=3)",  # a bound method handed to a library (lightweight-gan)
    ],
    ids=["instance-call", "method-handed-on"],
)
def test_a_trainer_run_without_a_method_call_by_name(tmp_path: Path, run: str) -> None:
    trainer = (
        SUB_TRAINER.replace("from base.base_trainer import BaseTrainer\n", "")
        .replace("class Trainer(BaseTrainer):", "class Trainer:")
        .replace(
            "super().__init__(model, optimizer, loader)",
            "self.model, self.optimizer, self.loader = model, optimizer, loader",
        )
    )
    trainer += "\n    def __call__(self, epochs):\n        self._train_epoch(0)\n"
    trainer += "\n    def fit(self):\n        self._train_epoch(0)\n"
    driver = f"""
    import torch
    from retry.api import retry_call
    from trainer import Trainer

    def main():
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        trainer = Trainer(model, optimizer, loader)
        while True:
            {run}

    main()
    """
    _project(tmp_path, {"trainer.py": trainer, "train.py": driver})
    assert _lint("train.py")[0] == [("trainer.py", "AO201")]


def test_the_module_that_builds_the_loader_a_driver_trains_on(tmp_path: Path) -> None:
    """guided-diffusion: `data = load_data(...)` (image_datasets.py builds a DataLoader and
    re-iterates it forever) is handed to `TrainLoop(data=data)`, whose loop draws from it:
    image_datasets.py is checked too (its loader restarts its workers on every pass), and
    stderr says why."""
    datasets = """
    from torch.utils.data import DataLoader

    def load_data(dataset, batch_size):
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=1)
        while True:
            yield from loader
    """
    train_util = """
    import torch

    class TrainLoop:
        def __init__(self, model, data, optimizer):
            self.model, self.data, self.optimizer = model, data, optimizer

        def run_loop(self):
            while True:
                batch = next(self.data)
                loss = self.model(batch.cuda()).mean()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
    """
    driver = """
    import torch
    from image_datasets import load_data
    from train_util import TrainLoop

    def main():
        model = torch.nn.Linear(8, 2).cuda()
        data = load_data(dataset, 16)
        TrainLoop(model, data, torch.optim.SGD(model.parameters(), lr=0.1)).run_loop()

    main()
    """
    files = {"image_datasets.py": datasets, "train_util.py": train_util, "train.py": driver}
    _project(tmp_path, files, config='select = ["AO104", "AO201"]')
    result = CliRunner().invoke(main, ["lint", "--no-cache", "--output-format", "json", "train.py"])
    found = sorted((f["filename"].rsplit("/", 1)[-1], f["code"]) for f in json.loads(result.stdout))
    assert found == [("image_datasets.py", "AO104"), ("train_util.py", "AO201")]
    assert "image_datasets.py, which builds the loader the training of train.py" in result.stderr


def test_the_module_that_defines_the_trained_model_is_checked_for_the_model_rules(
    tmp_path: Path,
) -> None:
    """SRGAN: train.py has its own loop; model.py defines the network, with a convolution's
    bias cancelled by the BatchNorm after it (AO607), and a training helper in fp32 (AO201, a
    training rule): only the model rule is reported there; the loop's own findings stay in
    train.py. A module no trained model comes from is not read."""
    model = """
    import torch
    from torch import nn

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8))

        def forward(self, x):
            return self.block(x)

    def warm_up(net, loader, optimizer):  # a training helper the script does not run
        for x in loader:
            optimizer.zero_grad()
            net(x.cuda()).sum().backward()
            optimizer.step()
    """
    other = """
    from torch import nn

    class Unused(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
    """
    train = """
    import torch
    from model import Generator
    import other

    net = Generator().cuda()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for x in loader:
        optimizer.zero_grad()
        net(x.cuda()).sum().backward()
        optimizer.step()
    """
    _project(tmp_path, {"model.py": model, "other.py": other, "train.py": train})
    found, said = _lint("train.py", "--select", "AO201,AO603,AO607")
    assert [f for f in found if f[0] == "model.py"] == [("model.py", "AO607")]
    assert ("train.py", "AO201") in found and ("train.py", "AO603") in found
    assert "also checking model.py, which defines a module train.py runs" in said
    assert "other.py" not in said
    assert ("model.py", "AO607") not in _lint("train.py", "--no-follow", "--select", "AO607")[0]


def test_a_driver_that_never_names_torch_is_followed(tmp_path: Path) -> None:
    """melgan's trainer.py: the model, loader and optimizer come from helpers and the loop
    from utils/train.py; the driver's own text never names torch."""
    build = """
    import torch

    def make():
        model = torch.nn.Linear(8, 2).cuda()
        return model, loader, torch.optim.SGD(model.parameters(), lr=0.1)
    """
    driver = """
    from build import make
    from engine import train_one_epoch

    model, loader, optimizer = make()
    for epoch in range(3):
        train_one_epoch(model, loader, optimizer)
    """
    _project(tmp_path, {"engine.py": ENGINE, "build.py": build, "train.py": driver})
    assert "torch" not in (tmp_path / "train.py").read_text()
    assert _lint("train.py")[0] == [("engine.py", "AO201")]


def test_a_trainer_that_never_names_torch_steps_a_model_of_another_module(
    tmp_path: Path,
) -> None:
    """SPADE: train.py's loop calls `trainer.run_generator_one_step(data)`; the trainer's
    module steps a model of another module (which holds the `.cuda()`) and never writes
    `torch`, and wraps the model in the vendored `DataParallelWithCallback(...,
    device_ids=opt.gpu_ids)`."""
    model = """
    import torch

    class Pix2PixModel(torch.nn.Module):
        def __init__(self, opt):
            super().__init__()
            self.net = torch.nn.Conv2d(3, 3, 3).cuda()

        def forward(self, data):
            return self.net(data.cuda()).mean()

        def create_optimizers(self, opt):
            return torch.optim.Adam(self.net.parameters())
    """
    trainer = """
    from sync_batchnorm import DataParallelWithCallback
    from model import Pix2PixModel

    class Pix2PixTrainer:
        def __init__(self, opt):
            self.model = Pix2PixModel(opt)
            self.optimizer = self.model.create_optimizers(opt)
            self.model = DataParallelWithCallback(self.model, device_ids=opt.gpu_ids)

        def run_one_step(self, data):
            self.optimizer.zero_grad()
            loss = self.model(data)
            loss.backward()
            self.optimizer.step()
    """
    driver = """
    from trainer import Pix2PixTrainer

    trainer = Pix2PixTrainer(opt)
    for epoch in range(3):
        for data in dataloader:
            trainer.run_one_step(data)
    """
    _project(tmp_path, {"model.py": model, "trainer.py": trainer, "train.py": driver})
    assert "torch" not in (tmp_path / "trainer.py").read_text()
    found, _ = _lint("train.py", "--select", "AO201,AO501")
    assert ("trainer.py", "AO201") in found
    assert ("trainer.py", "AO501") in found


@pytest.mark.parametrize("create_graph", [True, False])
def test_a_model_whose_forward_differentiates_a_gradient_is_not_told_to_compile(
    tmp_path: Path, create_graph: bool
) -> None:
    """FFJORD: the ODE function's forward takes `torch.autograd.grad(..., create_graph=True)`
    (the divergence); compile's aot_autograd cannot train through it."""
    model = f"""
    import torch

    class ODEFunc(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 8)

        def forward(self, y):
            f = self.net(y)
            (g,) = torch.autograd.grad(f.sum(), y, create_graph={create_graph})
            return f + g
    """
    driver = """
    import torch
    from odefunc import ODEFunc

    model = ODEFunc().cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for x in loader:
        optimizer.zero_grad()
        model(x.cuda().requires_grad_()).sum().backward()
        optimizer.step()
    """
    _project(tmp_path, {"odefunc.py": model, "train.py": driver})
    found, _ = _lint("train.py", "--select", "AO301")
    assert (("train.py", "AO301") in found) is not create_graph


def test_a_data_parallel_in_the_forward_of_the_trained_model_is_reported(tmp_path: Path) -> None:
    """EDSR: the model's forward runs `nn.parallel.data_parallel(self.model, x, ...)` when
    several GPUs are asked for; the driver only builds `model.Model(args)`."""
    model = """
    import torch
    import torch.nn as nn
    import torch.nn.parallel as P

    class Model(nn.Module):
        def __init__(self, args):
            super().__init__()
            self.device = torch.device('cpu' if args.cpu else 'cuda')
            self.model = nn.Conv2d(3, 3, 3).to(self.device)
            self.n_GPUs = args.n_GPUs

        def forward(self, x):
            if self.n_GPUs > 1:
                return P.data_parallel(self.model, x, range(self.n_GPUs))
            return self.model(x)
    """
    driver = """
    import torch
    import model

    net = model.Model(args)
    optimizer = torch.optim.Adam(net.parameters())
    for x in loader:
        optimizer.zero_grad()
        net(x.cuda()).sum().backward()
        optimizer.step()
    """
    _project(tmp_path, {"model.py": model, "train.py": driver})
    found, said = _lint("train.py", "--select", "AO501")
    assert [f for f in found if f[1] == "AO501"] == [("model.py", "AO501")]
    assert "the model rules AO501" in said
    assert ("model.py", "AO501") not in _lint("train.py", "--no-follow", "--select", "AO501")[0]


ATTENTION = """
import math
import torch
import torch.nn as nn

class SelfAttention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
        return torch.matmul(nn.Softmax(dim=-1)(scores), v)

class Encoder(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.attn = SelfAttention(d)

    @classmethod
    def from_pretrained(cls, path):
        return cls()

    def forward(self, x):
        return self.attn(x)
"""


@pytest.mark.parametrize(
    "built",
    [
        "Encoder()",  # lxmert: `self.model = VQAModel(...)` in the trainer's __init__
        "Encoder.from_pretrained(path)",  # UNITER: a classmethod that builds the class
    ],
)
def test_the_model_a_trainer_holds_is_checked_for_the_model_rules(
    tmp_path: Path, built: str
) -> None:
    """The trainer class keeps its model as `self.model`; the modules that define it (and
    those they take their parts from) are checked for AO609's hand-written attention."""
    trainer = f"""
    import torch
    from encoder import Encoder

    class VQA:
        def __init__(self, path):
            self.model = {built}.cuda()
            self.optim = torch.optim.Adam(self.model.parameters())

        def train(self, loader):
            for x in loader:
                self.optim.zero_grad()
                self.model(x.cuda()).sum().backward()
                self.optim.step()

    if __name__ == "__main__":
        VQA("ckpt").train(loader)
    """
    _project(tmp_path, {"encoder.py": ATTENTION, "train.py": trainer})
    found, said = _lint("train.py", "--select", "AO609")
    assert [f for f in found if f[1] == "AO609"] == [("encoder.py", "AO609")]
    assert "encoder.py, which defines a module" in said


def test_a_loader_factory_that_names_no_device_feeds_a_cuda_training(tmp_path: Path) -> None:
    """PatchTST: `Exp_Main._get_data` hands on what `data_provider(args, flag)` returns;
    `Exp_Main.train` moves every batch with `.float().to(self.device)` on CUDA. The factory's
    DataLoader, in a module that names no device, is told to pin memory."""
    factory = """
    from torch.utils.data import DataLoader

    def data_provider(args, flag):
        data_set = Dataset_Custom(args.root_path, flag=flag)
        data_loader = DataLoader(data_set, batch_size=args.batch_size, num_workers=4)
        return data_set, data_loader
    """
    exp = """
    import torch
    from data_factory import data_provider

    class Exp_Main:
        def __init__(self, args):
            self.args = args
            self.device = torch.device("cuda:0")
            self.model = torch.nn.Linear(8, 1).to(self.device)

        def _get_data(self, flag):
            data_set, data_loader = data_provider(self.args, flag)
            return data_set, data_loader

        def train(self):
            train_data, train_loader = self._get_data(flag="train")
            optimizer = torch.optim.Adam(self.model.parameters())
            for epoch in range(10):
                for batch_x, batch_y in train_loader:
                    batch_x = batch_x.float().to(self.device)
                    optimizer.zero_grad()
                    self.model(batch_x).sum().backward()
                    optimizer.step()
    """
    driver = """
    from exp_main import Exp_Main

    exp = Exp_Main(args)
    exp.train()
    """
    _project(tmp_path, {"data_factory.py": factory, "exp_main.py": exp, "run.py": driver})
    found, said = _lint("run.py", "--select", "AO102")
    assert ("data_factory.py", "AO102") in found
    assert "data_factory.py, which builds the loader" in said
    # its fix tests the device at run time: the device is the callers' to choose
    fixed = CliRunner().invoke(main, ["rewrite", "--diff", "--select", "AO102", "data_factory.py"])
    assert "pin_memory=torch.cuda.is_available()" in fixed.stdout, fixed.output
    # the same factory feeding a loop that never moves its batches: nothing to pin for
    (tmp_path / "exp_main.py").write_text(
        textwrap.dedent(exp).replace("batch_x = batch_x.float().to(self.device)", "pass")
    )
    assert ("data_factory.py", "AO102") not in _lint("run.py", "--select", "AO102")[0]


def test_a_loader_factory_whose_loader_a_solver_keeps_as_an_attribute(tmp_path: Path) -> None:
    """Anomaly-Transformer: `self.train_loader = get_loader_segment(...)` in the Solver's
    `__init__`; `Solver.train` iterates `self.train_loader` and moves each batch with
    `.float().to(self.device)` on CUDA: the factory's loader is told to pin memory."""
    factory = """
    from torch.utils.data import DataLoader

    def get_loader_segment(data_path, batch_size):
        return DataLoader(Segments(data_path), batch_size=batch_size, num_workers=4)
    """
    solver = """
    import torch
    from data_factory import get_loader_segment

    class Solver:
        def __init__(self, config):
            self.train_loader = get_loader_segment(config.data_path, config.batch_size)
            self.device = torch.device("cuda:0")
            self.model = torch.nn.Linear(8, 1).to(self.device)
            self.optimizer = torch.optim.Adam(self.model.parameters())

        def train(self):
            for epoch in range(10):
                for x, _ in self.train_loader:
                    x = x.float().to(self.device)
                    self.optimizer.zero_grad()
                    self.model(x).sum().backward()
                    self.optimizer.step()
    """
    driver = """
    from solver import Solver

    Solver(config).train()
    """
    _project(tmp_path, {"data_factory.py": factory, "solver.py": solver, "main.py": driver})
    found, said = _lint("main.py", "--select", "AO102")
    assert ("data_factory.py", "AO102") in found, said


@pytest.mark.parametrize("inside_main", [False, True])
def test_a_loader_factory_returning_a_dict_of_loaders(tmp_path: Path, inside_main: bool) -> None:
    """egnn / e3_diffusion: `dataloaders, scale = dataset.retrieve_dataloaders(...)` returns a
    dict comprehension of DataLoaders; the epoch loop hands `dataloaders["train"]` to a
    function that moves every batch to CUDA (in e3_diffusion from a `main()` reading the
    module's global). The factory's loader is told to pin memory and keep its workers."""
    factory = """
    from torch.utils.data import DataLoader

    def retrieve_dataloaders(datasets, batch_size, num_workers=4):
        dataloaders = {
            split: DataLoader(ds, batch_size=batch_size, num_workers=num_workers)
            for split, ds in datasets.items()
        }
        return dataloaders, 1.0
    """
    loop = """
    for epoch in range(10):
        train(epoch, dataloaders["train"])
        train(epoch, dataloaders["valid"], partition="valid")
    """
    if inside_main:
        loop = "def main():" + textwrap.indent(textwrap.dedent(loop), "    ") + "main()\n"
    driver = """
    import torch
    from qm9 import dataset

    device = torch.device("cuda")
    dataloaders, scale = dataset.retrieve_dataloaders(datasets, 64)
    model = torch.nn.Linear(8, 1).to(device)
    opt = torch.optim.Adam(model.parameters())

    def train(epoch, loader, partition="train"):
        for data in loader:
            loss = model(data["x"].to(device)).sum()
            if partition == "train":
                opt.zero_grad()
                loss.backward()
                opt.step()
    """
    driver = textwrap.dedent(driver) + "\n" + textwrap.dedent(loop)
    _project(tmp_path, {"qm9/__init__.py": "", "qm9/dataset.py": factory, "main.py": driver})
    found, said = _lint("main.py", "--select", "AO102,AO104")
    assert ("qm9/dataset.py", "AO102") in found, said
    assert ("qm9/dataset.py", "AO104") in found, said
    # the same loaders in a loop that never moves a batch: nothing to pin for
    (tmp_path / "main.py").write_text(driver.replace('data["x"].to(device)', 'data["x"]'))
    assert ("qm9/dataset.py", "AO102") not in _lint("main.py", "--select", "AO102")[0]


@pytest.mark.parametrize("how", ["data_mod", "datamodule=data_mod", "None"])
def test_the_data_module_a_lightning_trainer_fits_on(tmp_path: Path, how: str) -> None:
    """AdaFace: `trainer.fit(trainer_mod, data_mod)` with `data_mod = data.DataModule(...)`, a
    LightningDataModule whose `train_dataloader()` returns a DataLoader with workers and no
    persistent_workers: the Trainer iterates it every epoch, so its module is checked for the
    loader rules. Handed nothing (`fit(trainer_mod)`), the module is not followed."""
    data = """
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader

    class DataModule(pl.LightningDataModule):
        def __init__(self, **kwargs):
            super().__init__()
            self.num_workers = kwargs["num_workers"]

        def train_dataloader(self):
            return DataLoader(self.train_dataset, batch_size=64, num_workers=self.num_workers)
    """
    driver = f"""
    import pytorch_lightning as pl
    import data
    import train_val

    def main(hparams):
        trainer_mod = train_val.Module(**hparams)
        data_mod = data.DataModule(**hparams)
        trainer = pl.Trainer(accelerator="gpu", max_epochs=10)
        trainer.fit(trainer_mod, {how})
    """
    module = """
    import pytorch_lightning as pl
    import torch

    class Module(pl.LightningModule):
        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)
    """
    _project(tmp_path, {"data.py": data, "train_val.py": module, "main.py": driver})
    found, said = _lint("main.py", "--select", "AO104")
    assert (("data.py", "AO104") in found) == (how != "None"), said


@pytest.mark.parametrize("init", [False, True])
def test_a_driver_of_a_folder_without_init_is_followed(tmp_path: Path, init: bool) -> None:
    """GPT2: `src/gpt2/__main__.py` does `from gpt2 import (train_model, ...)`, a folder with
    no `__init__.py` (a namespace package), and dispatches to `train_model`'s subcommand; the
    training in that module is checked, with or without the package's `__init__.py`."""
    driver = """
    import argparse
    from gpt2 import (train_model,
                      evaluate_model)

    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers(dest="subcommands")
    train_model.add_subparser(subparsers)
    args = parser.parse_args()
    args.func(args)
    """
    trainer = """
    import torch

    def train(args):
        model = torch.nn.Linear(8, 1).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
        for step in range(100):
            torch.cuda.empty_cache()
            opt.zero_grad()
            model(torch.randn(4, 8, device="cuda")).sum().backward()
            opt.step()

    def add_subparser(subparsers):
        parser = subparsers.add_parser("train")
        parser.set_defaults(func=train)
    """
    files = {
        "src/gpt2/__main__.py": driver,
        "src/gpt2/train_model.py": trainer,
        "src/gpt2/evaluate_model.py": "def add_subparser(subparsers):\n    pass\n",
    }
    if init:
        files["src/gpt2/__init__.py"] = ""
    _project(tmp_path, files)
    found, said = _lint("src/gpt2/__main__.py", "--select", "AO404")
    assert ("src/gpt2/train_model.py", "AO404") in found, said


@pytest.mark.parametrize("default", ["0", 'int(os.environ.get("LOCAL_RANK", 0))'])
def test_the_module_that_declares_the_scripts_options(tmp_path: Path, default: str) -> None:
    """Point-MAE / SegmenTron / BasicSR: the script calls `parser.get_args()` of a module that
    declares `--local_rank`; that module is checked for AO502 only (the launcher rule), and
    its option is reported unless its default reads the environment."""
    options = f"""
    import argparse
    import os
    from torch.cuda.amp import GradScaler

    SCALER = GradScaler()  # AO901 where every rule runs

    def get_args():
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", type=int, default={default})
        parser.add_argument("--num_workers", type=int, default=0)
        return parser.parse_args()
    """
    driver = """
    import torch
    from utils import parser

    args = parser.get_args()
    torch.cuda.set_device(args.local_rank)
    model = torch.nn.Linear(8, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    for step in range(100):
        opt.zero_grad()
        model(torch.randn(4, 8, device="cuda")).sum().backward()
        opt.step()
    """
    _project(tmp_path, {"utils/__init__.py": "", "utils/parser.py": options, "main.py": driver})
    found, said = _lint("main.py", "--select", "AO502,AO901")
    assert (("utils/parser.py", "AO502") in found) == (default == "0"), said
    assert "which declares the options of main.py (the launcher rule AO502 only)" in said
    assert ("utils/parser.py", "AO901") not in found  # no other rule there


@pytest.mark.parametrize("create_graph", [True, False])
def test_a_helper_module_that_differentiates_a_gradient_stands_compile_down(
    tmp_path: Path, create_graph: bool
) -> None:
    """SIREN: the loss takes `diff_operators.gradient(output, coords)`, an
    `autograd.grad(..., create_graph=True)` of another module, on the model's output: which
    model goes through it cannot be traced from the script, so none is told to compile."""
    helper = f"""
    import torch

    def gradient(y, x):
        return torch.autograd.grad(y, [x], torch.ones_like(y), create_graph={create_graph})[0]
    """
    driver = """
    import torch
    import diff_operators

    model = torch.nn.Linear(2, 1).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for coords in loader:
        coords = coords.cuda().requires_grad_()
        out = model(coords)
        loss = diff_operators.gradient(out, coords).norm()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
    _project(tmp_path, {"diff_operators.py": helper, "train.py": driver})
    found, _ = _lint("train.py", "--select", "AO301")
    assert (("train.py", "AO301") in found) is not create_graph


def test_an_optimizer_built_by_a_function_of_a_project_package(tmp_path: Path) -> None:
    """TabR: `optimizer = lib.make_optimizer(model, **C.optimizer)`, where `lib/__init__.py`
    re-exports lib/deep.py, whose `make_optimizer(module, type) -> optim.Optimizer` picks the
    class with `getattr(optim, type)` over `make_parameter_groups(module)`'s groups."""
    deep = """
    import torch.nn as nn
    from torch import optim

    def make_parameter_groups(model):
        return [{"params": [p for _, m in model.named_modules() for p in m.parameters(False)]}]

    def make_optimizer(module: nn.Module, type: str, **kwargs) -> optim.Optimizer:
        Optimizer = getattr(optim, type)
        return Optimizer(make_parameter_groups(module), **kwargs)
    """
    driver = """
    import torch
    import lib

    model = torch.nn.Linear(8, 1).cuda()
    optimizer = lib.make_optimizer(model, "AdamW", lr=1e-3)
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x.cuda()), y.cuda()).backward()
        optimizer.step()
    """
    _project(
        tmp_path,
        {
            "lib/__init__.py": "from .deep import *  # noqa\n",
            "lib/deep.py": deep,
            "train.py": driver,
        },
    )
    found, _ = _lint("train.py", "--select", "AO301")
    assert ("train.py", "AO301") in found


def test_parameter_groups_handed_to_a_project_optimizer_factory(tmp_path: Path) -> None:
    """tabular-dl-revisiting-models: `lib.make_optimizer(name, [{"params": with_wd}, ...],
    lr, wd)`, the groups drawn from `model.named_parameters()` above: that model is trained."""
    deep = """
    from torch import optim

    def make_optimizer(optimizer, parameter_groups, lr, weight_decay) -> optim.Optimizer:
        Optimizer = {"adamw": optim.AdamW, "sgd": optim.SGD}[optimizer]
        return Optimizer(parameter_groups, lr, weight_decay=weight_decay)
    """
    driver = """
    import torch
    import lib

    model = torch.nn.Linear(8, 1).cuda()
    with_wd = [v for k, v in model.named_parameters() if "bias" not in k]
    without_wd = [v for k, v in model.named_parameters() if "bias" in k]
    optimizer = lib.make_optimizer(
        "adamw", [{"params": with_wd}, {"params": without_wd, "weight_decay": 0.0}], 1e-3, 1e-5
    )
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x.cuda()), y.cuda()).backward()
        optimizer.step()
    """
    _project(
        tmp_path,
        {
            "lib/__init__.py": "from .deep import *  # noqa\n",
            "lib/deep.py": deep,
            "train.py": driver,
        },
    )
    found, _ = _lint("train.py", "--select", "AO301")
    assert ("train.py", "AO301") in found


def test_an_optimizer_built_by_a_module_imported_from_a_package(tmp_path: Path) -> None:
    """PoinTr: `from tools import builder`, `optimizer = builder.build_optimizer(base_model,
    config)` (tools/builder.py builds a torch.optim optimizer over the model's parameters)."""
    builder = """
    from torch import optim

    def build_optimizer(base_model, config):
        return optim.AdamW(base_model.parameters(), lr=config.lr)
    """
    driver = """
    import torch
    from tools import builder

    base_model = torch.nn.Linear(8, 1).cuda()
    optimizer = builder.build_optimizer(base_model, config)
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(base_model(x.cuda()), y.cuda()).backward()
        optimizer.step()
    """
    _project(tmp_path, {"tools/__init__.py": "", "tools/builder.py": builder, "train.py": driver})
    found, _ = _lint("train.py", "--select", "AO301")
    assert ("train.py", "AO301") in found


def test_a_step_function_a_factory_returns_and_the_loop_calls(tmp_path: Path) -> None:
    """score_sde: `train_step_fn = losses.get_step_fn(...)` returns its nested `step_fn`
    (forward, `loss.backward()`, the optimizer step); run_lib's loop calls
    `train_step_fn(state, batch)` on every batch: the step, in fp32 on CUDA, is reported."""
    losses = """
    import torch

    def get_step_fn(model, optimizer):
        def step_fn(batch):
            optimizer.zero_grad()
            loss = model(batch.cuda()).mean()
            loss.backward()
            optimizer.step()
            return loss
        return step_fn
    """
    driver = """
    import torch
    import losses

    model = torch.nn.Linear(8, 1).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    train_step_fn = losses.get_step_fn(model, optimizer)
    for batch in loader:
        train_step_fn(batch)
    """
    _project(tmp_path, {"losses.py": losses, "train.py": driver})
    assert ("losses.py", "AO201") in _lint("train.py")[0]


def test_a_penalty_method_of_another_models_class_leaves_the_policy_reported(
    tmp_path: Path,
) -> None:
    """pytorch-a2c-ppo-acktr-gail: gail.py's `Discriminator.compute_grad_pen` takes a double
    backward through the discriminator itself; the policy the script trains is compiled as
    usual."""
    gail = """
    import torch

    class Discriminator(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = torch.nn.Linear(8, 1)

        def compute_grad_pen(self, data):
            data.requires_grad = True
            out = self.trunk(data)
            grad = torch.autograd.grad(out.sum(), data, create_graph=True)[0]
            return grad.norm()
    """
    driver = """
    import torch
    import gail

    actor_critic = torch.nn.Linear(8, 2).cuda()
    discr = gail.Discriminator().cuda()
    optimizer = torch.optim.Adam(actor_critic.parameters())
    for x in loader:
        optimizer.zero_grad()
        actor_critic(x.cuda()).sum().backward()
        optimizer.step()
    """
    _project(tmp_path, {"gail.py": gail, "train.py": driver})
    assert ("train.py", "AO301") in _lint("train.py", "--select", "AO301")[0]


def test_a_training_helper_that_names_no_device_of_a_cuda_script(tmp_path: Path) -> None:
    """physics_informed: train_2d.py's loop moves batches with `x.to(rank)` and names no
    device or GPU; train_burgers.py picks `cuda:0` and calls it. The helper trains on CUDA:
    its fp32 loop and blocking copies are reported there."""
    helper = """
    import torch

    def train_2d(model, train_loader, optimizer, rank=0):
        for e in range(10):
            for x, y in train_loader:
                x, y = x.to(rank), y.to(rank)
                loss = (model(x) - y).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    """
    driver = """
    import torch
    from train_2d import train_2d

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(8, 1).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    train_2d(model, loader, optimizer, rank=0)
    """
    _project(tmp_path, {"train_2d.py": helper, "train.py": driver})
    found, _ = _lint("train.py", "--select", "AO201,AO103")
    assert ("train_2d.py", "AO201") in found and ("train_2d.py", "AO103") in found
    # the same helper beside a CPU-only script: neither
    (tmp_path / "train.py").write_text(
        textwrap.dedent(driver).replace('"cuda:0" if torch.cuda.is_available() else ', "")
    )
    found, _ = _lint("train.py", "--select", "AO201,AO103")
    assert ("train_2d.py", "AO201") not in found and ("train_2d.py", "AO103") not in found


def test_a_method_of_the_trained_models_class_that_differentiates_a_gradient(
    tmp_path: Path,
) -> None:
    """hamiltonian-nn: `model = HNN(...)`, whose `time_derivative` (not its forward) takes
    `autograd.grad(..., create_graph=True)`; the loss trains through it: no compile advice."""
    hnn = """
    import torch

    class HNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

        def forward(self, x):
            return self.net(x)

        def time_derivative(self, x):
            f = self.forward(x)
            return torch.autograd.grad(f.sum(), x, create_graph=True)[0]
    """
    driver = """
    import torch
    from hnn import HNN

    model = HNN().cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for x, dxdt in loader:
        x = x.cuda().requires_grad_()
        loss = (model.time_derivative(x) - dxdt.cuda()).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
    _project(tmp_path, {"hnn.py": hnn, "train.py": driver})
    assert ("train.py", "AO301") not in _lint("train.py", "--select", "AO301")[0]


def test_a_step_of_a_program_whose_driver_makes_float64_the_default(tmp_path: Path) -> None:
    """PyTorch-RL: ppo_gym.py sets `torch.set_default_dtype(torch.float64)` and calls
    core/ppo.py's `ppo_step` per batch: autocast (float32 only) would change nothing there."""
    ppo = """
    import torch

    def ppo_step(policy, optimizer, states, advantages):
        loss = -(policy(states) * advantages).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
    driver = """
    import torch
    from ppo import ppo_step

    torch.set_default_dtype(torch.float64)
    device = torch.device("cuda")
    policy = torch.nn.Linear(8, 1).to(device)
    optimizer = torch.optim.Adam(policy.parameters())
    for states, advantages in batches:
        ppo_step(policy, optimizer, states, advantages)
    """
    _project(tmp_path, {"ppo.py": ppo, "train.py": driver})
    assert ("ppo.py", "AO201") not in _lint("train.py")[0]
    (tmp_path / "train.py").write_text(
        textwrap.dedent(driver).replace("torch.set_default_dtype(torch.float64)\n", "")
    )
    assert ("ppo.py", "AO201") in _lint("train.py")[0]


def test_float64_behind_a_flag_leaves_the_fp32_step_reported(tmp_path: Path) -> None:
    """hgcn: `if int(args.double_precision): torch.set_default_dtype(torch.float64)`, off by
    default: the default run trains in fp32, so AO201 stands."""
    driver = """
    import torch

    def train(args):
        if int(args.double_precision):
            torch.set_default_dtype(torch.float64)
        model = torch.nn.Linear(8, 1).cuda()
        optimizer = torch.optim.Adam(model.parameters())
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x.cuda()), y.cuda()).backward()
            optimizer.step()
    """
    _project(tmp_path, {"train.py": driver})
    assert ("train.py", "AO201") in _lint("train.py")[0]


def test_a_trainer_class_picked_from_a_table_on_an_extended_sys_path(tmp_path: Path) -> None:
    """FairMOT: `import _init_paths` puts src/lib on sys.path; `from trains.train_factory
    import train_factory` (a dict of trainer classes), `Trainer = train_factory[opt.task]`,
    `trainer.train(...)`: the trainer's loop, in src/lib/trains/base_trainer.py, is followed."""
    base = """
    import torch

    class BaseTrainer:
        def __init__(self, opt, model, optimizer):
            self.model, self.optimizer = model, optimizer

        def train(self, epoch, loader):
            for batch in loader:
                loss = self.model(batch["input"].cuda()).mean()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
    """
    driver = """
    import _init_paths
    import torch
    from trains.train_factory import train_factory

    model = torch.nn.Linear(4, 4).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    Trainer = train_factory[opt.task]
    trainer = Trainer(opt, model, optimizer)
    for epoch in range(10):
        trainer.train(epoch, train_loader)
    """
    _project(
        tmp_path,
        {
            "src/_init_paths.py": "import sys\nsys.path.insert(0, 'lib')\n",
            "src/lib/trains/__init__.py": "",
            "src/lib/trains/base_trainer.py": base,
            "src/lib/trains/mot.py": "from .base_trainer import BaseTrainer\n\n"
            "class MotTrainer(BaseTrainer):\n    pass\n",
            "src/lib/trains/train_factory.py": "from .mot import MotTrainer\n\n"
            "train_factory = {'mot': MotTrainer}\n",
            "src/train.py": driver,
        },
    )
    found, _ = _lint("src/train.py")
    assert ("src/lib/trains/base_trainer.py", "AO201") in found


def test_a_step_a_base_class_of_a_package_runs_through_an_override(tmp_path: Path) -> None:
    """pixel-nerf: `class PixelNeRFTrainer(trainlib.Trainer)` overrides `train_step`, which
    calls `self.calc_losses(...)` (a loop to build rays, then `loss.backward()` outside it);
    `trainlib/__init__.py` re-exports the base, whose `start()` calls `self.train_step(...)`
    per batch. The step is reported (AO201, AO702); `eval_step`, which runs `calc_losses`
    without training, is not."""
    base = """
    import torch

    class Trainer:
        def train_step(self, data, global_step):
            raise NotImplementedError()

        def eval_step(self, data, global_step):
            raise NotImplementedError()

        def start(self):
            for epoch in range(10):
                for data in self.train_data_loader:
                    losses = self.train_step(data, global_step=0)
                    self.optim.step()
                    if epoch % 5 == 0:
                        with torch.no_grad():
                            self.eval_step(data, global_step=0)
    """
    driver = """
    import torch
    import trainlib

    class PixelNeRFTrainer(trainlib.Trainer):
        def calc_losses(self, data, is_train=True):
            rays = []
            for obj in data:
                rays.append(obj.cuda())
            loss = self.net(rays).mean()
            if is_train:
                loss.backward()
            return loss.item()

        def train_step(self, data, global_step):
            return self.calc_losses(data, is_train=True)

        def eval_step(self, data, global_step):
            return self.calc_losses(data, is_train=False)

    trainer = PixelNeRFTrainer()
    trainer.start()
    """
    _project(
        tmp_path,
        {
            "train/trainlib/__init__.py": "from .trainer import Trainer\n",
            "train/trainlib/trainer.py": base,
            "train/train.py": driver,
        },
    )
    result = CliRunner().invoke(
        main,
        [
            "lint",
            "--no-cache",
            "--output-format",
            "json",
            "--select",
            "AO201,AO702",
            "train/train.py",
        ],
    )
    found = sorted((f["code"], f["location"]["row"]) for f in json.loads(result.stdout))
    assert found == [("AO201", 14), ("AO702", 12)]


def test_the_module_that_builds_the_optimizer_is_checked_for_its_options(
    tmp_path: Path,
) -> None:
    """Swin/SimMIM: `optimizer = build_optimizer(config, model)` of optimizer.py builds an
    AdamW without `fused=` for the CUDA training of main.py: AO605 is reported there (where
    the edit goes), and only AO605 (its loader helper is no part of this program), and not
    for a factory of that module nothing calls."""
    optimizer = """
    import torch
    from torch import optim

    def build_optimizer(config, model):
        return optim.AdamW(model.parameters(), lr=config.lr)

    def make_sgd(model):  # no code of the project calls it
        return optim.SGD(model.parameters(), lr=0.1)

    def probe_loader(dataset):  # AO101's business, and not this program's
        return torch.utils.data.DataLoader(dataset, batch_size=8)
    """
    train = """
    import torch
    from optimizer import build_optimizer

    model = torch.nn.Linear(8, 2).cuda()
    optimizer = build_optimizer(config, model)
    for x in loader:
        optimizer.zero_grad()
        model(x.cuda()).sum().backward()
        optimizer.step()
    """
    _project(tmp_path, {"optimizer.py": optimizer, "train.py": train})
    found, said = _lint("train.py", "--select", "AO101,AO201,AO605")
    assert found == [("optimizer.py", "AO605"), ("train.py", "AO201")]  # one AO605: AdamW's
    assert "also checking optimizer.py, which builds the optimizer train.py steps" in said
    assert ("optimizer.py", "AO605") not in _lint("train.py", "--no-follow", "--select", "AO605")[0]
    # fused already: nothing to say there
    fused = optimizer.replace("lr=config.lr)", "lr=config.lr, fused=True)")
    _project(tmp_path, {"optimizer.py": fused})
    assert ("optimizer.py", "AO605") not in _lint("train.py", "--select", "AO605")[0]


def test_a_trainer_class_whose_step_method_runs_backward_builds_a_cuda_optimizer(
    tmp_path: Path,
) -> None:
    """SR3's `DDPM`: the optimizer is built in `__init__` and stepped by
    `optimize_parameters()`, whose `backward()` is in no loop; sr.py's loop calls it and
    never names a device (the class does)."""
    model = """
    import torch

    class DDPM:
        def __init__(self, net):
            self.net = net.to(torch.device("cuda"))
            self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-4)

        def feed_data(self, x):
            self.x = x.to(torch.device("cuda"))

        def optimize_parameters(self):
            self.opt.zero_grad()
            self.net(self.x).sum().backward()
            self.opt.step()
    """
    factory = """
    def create_model(opt):
        from .model import DDPM
        return DDPM(opt.net)
    """
    train = """
    import model as Model

    diffusion = Model.create_model(opt)
    for x in loader:
        diffusion.feed_data(x)
        diffusion.optimize_parameters()
    """
    package = "from .factory import create_model\n"
    files = {"model/__init__.py": package, "model/factory.py": factory, "model/model.py": model}
    _project(tmp_path, {**files, "sr.py": train})
    assert ("model/model.py", "AO605") in _lint("sr.py", "--select", "AO605")[0]


AUTOVC_LOADER = """
import torch
from torch.utils import data

def get_loader(root_dir, batch_size=16, num_workers=0):
    dataset = Utterances(root_dir)
    data_loader = data.DataLoader(dataset=dataset, batch_size=batch_size, num_workers=num_workers)
    return data_loader
"""

AUTOVC_SOLVER = """
import torch

class Solver:
    def __init__(self, vcc_loader, config):
        self.vcc_loader = vcc_loader
        self.G = Generator().to("cuda")
        self.opt = torch.optim.Adam(self.G.parameters(), fused=True)

    def train(self):
        data_loader = self.vcc_loader
        for i in range(100):
            try:
                x = next(data_iter)
            except:
                data_iter = iter(data_loader)
                x = next(data_iter)
            self.G(x.to("cuda", non_blocking=True)).sum().backward()
            self.opt.step()
"""

AUTOVC_MAIN = """
from solver import Solver
from data_loader import get_loader

def main(config):
    loader = get_loader(config.data_dir, config.batch_size)
    solver = Solver(loader, config)
    solver.train()
"""


@pytest.mark.parametrize("default", [0, 4])
def test_a_loader_factory_handed_an_option_whose_default_is_zero(
    tmp_path: Path, default: int
) -> None:
    """egnn: `retrieve_dataloaders(args.batch_size, args.num_workers)` with `--num_workers`
    declared `default=0` in the driver; the factory's DataLoader takes `num_workers=num_workers`.
    AO101 says which option to raise, only when its default is 0."""
    factory = """
    from torch.utils.data import DataLoader

    def retrieve_dataloaders(datasets, batch_size, num_workers):
        return DataLoader(datasets["train"], batch_size=batch_size, num_workers=num_workers)
    """
    driver = f"""
    import argparse
    import torch
    from data import retrieve_dataloaders

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=96)
    parser.add_argument("--num_workers", type=int, default={default})
    args = parser.parse_args()
    loader = retrieve_dataloaders(datasets, args.batch_size, args.num_workers)
    model = torch.nn.Linear(8, 1).cuda()
    opt = torch.optim.Adam(model.parameters(), fused=True)
    for epoch in range(10):
        for x in loader:
            opt.zero_grad()
            model(x.cuda(non_blocking=True)).sum().backward()
            opt.step()
    """
    _project(tmp_path, {"data.py": factory, "main.py": driver})
    result = CliRunner().invoke(main, ["lint", "--no-cache", "--select", "AO101", "main.py"])
    said = "`num_workers` is `args.num_workers` at every call (main.py:9), an option whose"
    assert (said in result.output) == (default == 0), result.output


def test_a_loader_factory_whose_worker_default_no_call_passes(tmp_path: Path) -> None:
    """autovc: `get_loader(..., num_workers=0)` called without `num_workers`; the solver keeps
    the loader as `self.vcc_loader` and draws from it through a local name and `iter()`. The
    factory's module is followed, AO101 names the call that should pass a count, and AO104
    says nothing (persistent workers need workers)."""
    files = {"data_loader.py": AUTOVC_LOADER, "solver.py": AUTOVC_SOLVER}
    _project(tmp_path, {**files, "main.py": AUTOVC_MAIN})
    found, said = _lint("main.py", "--select", "AO101,AO104")
    assert [f for f in found if f[1] != "AO201"] == [("data_loader.py", "AO101")]
    assert "data_loader.py, which builds the loader" in said
    result = CliRunner().invoke(main, ["lint", "--no-cache", "--select", "AO101", "main.py"])
    assert "defaults to 0 in get_loader() and no call passes it: main.py:5" in result.output
    # a call that passes a count: the 0 is not what runs
    passing = AUTOVC_MAIN.replace("config.batch_size)", "config.batch_size, num_workers=4)")
    _project(tmp_path, {"main.py": passing})
    found, _ = _lint("main.py", "--select", "AO101")
    assert ("data_loader.py", "AO101") not in found
    # both files named, the loader iterated epoch after epoch: AO101, no AO104 (0 workers)
    epochs = """
    import torch
    from data_loader import get_loader

    model = torch.nn.Linear(8, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    loader = get_loader("data")
    for epoch in range(10):
        for x in loader:
            model(x.cuda(non_blocking=True)).sum().backward()
            optimizer.step()
    """
    _project(tmp_path, {"main.py": epochs})
    found, _ = _lint("main.py", "data_loader.py", "--select", "AO101,AO104")
    assert [f for f in found if f[1] != "AO201"] == [("data_loader.py", "AO101")]


YOWO_MAIN = """
import sys
import torch
from optimization import *

model = Net().cuda()
optimizer = torch.optim.Adam(model.parameters(), fused=True)
loss_module = RegionLoss(cfg).cuda()
train = getattr(sys.modules[__name__], "train_ucf24")
for epoch in range(10):
    train(cfg, epoch, model, loader, loss_module, optimizer)
"""

YOWO_OPTIMIZATION = """
import torch

def train_ucf24(cfg, epoch, model, loader, loss_module, optimizer):
    model.train()
    loss_module.reset_meters()
    for batch in loader:
        loss = loss_module(model(batch["clip"].cuda()), batch["cls"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def test_a_training_function_picked_by_name_from_the_module_itself(tmp_path: Path) -> None:
    """YOWO: `train = getattr(sys.modules[__name__], "train_ucf24")`, star-imported from
    optimization.py: the training runs there (AO201 found in it); the loss module handed
    to it is run, not trained (no AO301 for `loss_module`)."""
    _project(tmp_path, {"optimization.py": YOWO_OPTIMIZATION, "main.py": YOWO_MAIN})
    found, said = _lint("main.py", "--select", "AO201,AO301")
    assert ("optimization.py", "AO201") in found
    assert "also checking optimization.py" in said
    result = CliRunner().invoke(main, ["lint", "--no-cache", "--select", "AO301", "main.py"])
    assert "model `model`" in result.output and "loss_module" not in result.output


BASICSR_MODEL = """
import torch
from registry import MODEL_REGISTRY

@MODEL_REGISTRY.register()
class SRModel:
    def __init__(self, opt):
        self.net_g = Net().to(torch.device("cuda"))
        self.optimizer_g = torch.optim.Adam(self.net_g.parameters(), fused=True)

    def feed_data(self, data):
        self.lq = data["lq"].to(torch.device("cuda"), non_blocking=True)

    def optimize_parameters(self, step):
        self.optimizer_g.zero_grad()
        self.net_g(self.lq).mean().backward()
        self.optimizer_g.step()
"""

BASICSR_BUILD = """
import importlib
from registry import MODEL_REGISTRY

_modules = [importlib.import_module(f"models.{name}") for name in ("sr_model",)]

def build_model(opt):
    model = MODEL_REGISTRY.get(opt["model_type"])(opt)
    return model
"""

BASICSR_TRAIN = """
from models import build_model

def train_pipeline(opt, loader):
    model = build_model(opt)
    for epoch in range(10):
        for train_data in loader:
            model.feed_data(train_data)
            model.optimize_parameters(epoch)
"""


def test_a_model_class_picked_from_a_registry(tmp_path: Path) -> None:
    """BasicSR (and detectron2-style registries): `MODEL_REGISTRY.get(opt["model_type"])(opt)`
    builds one of the classes decorated `@MODEL_REGISTRY.register()`, modules imported by a
    folder scan: the training in `optimize_parameters` is followed there."""
    registry = "class Registry:\n    def get(self, name):\n        return self._map[name]\n\nMODEL_REGISTRY = Registry()\n"
    files = {
        "registry.py": registry,
        "models/__init__.py": BASICSR_BUILD,
        "models/sr_model.py": BASICSR_MODEL,
        "train.py": BASICSR_TRAIN,
    }
    _project(tmp_path, files)
    found, said = _lint("train.py")
    assert found == [("models/sr_model.py", "AO201")]
    assert "also checking models/sr_model.py, where the training of train.py runs" in said
    # the same class not registered: nothing says it is the one built
    unregistered = BASICSR_MODEL.replace("@MODEL_REGISTRY.register()\n", "")
    _project(tmp_path, {"models/sr_model.py": unregistered})
    assert _lint("train.py")[0] == []


def test_a_script_with_its_own_loop_has_its_loader_factory_checked_for_the_loader_rules(
    tmp_path: Path,
) -> None:
    """SimMIM: main_simmim.py runs its own loop over `build_loader(config)` of data/__init__.py,
    which returns `build_loader_simmim(config)` of data/data_simmim.py: that module is checked
    for the loader's options (AO104 there), not for the other rules (its fp32 helper loop)."""
    data = """
    import torch
    from torch.utils.data import DataLoader

    def build_loader_simmim(config):
        loader = DataLoader(make(config), batch_size=64, num_workers=8, pin_memory=True)
        return loader

    def warm_up(model, loader):  # fp32 training the script does not run
        for x in loader:
            model(x.cuda()).sum().backward()
    """
    package = """
    from .data_simmim import build_loader_simmim

    def build_loader(config):
        return build_loader_simmim(config)
    """
    main = """
    import torch
    from data import build_loader

    model = torch.nn.Linear(8, 2).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    loader = build_loader(config)
    for epoch in range(100):
        for x in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x.cuda(non_blocking=True)).sum()
            loss.backward()
            optimizer.step()
    """
    _project(tmp_path, {"data/__init__.py": package, "data/data_simmim.py": data, "main.py": main})
    found, said = _lint("main.py", "--select", "AO104,AO201")
    assert found == [("data/data_simmim.py", "AO104")]
    assert "data/data_simmim.py, which builds the loader main.py iterates (the loader rules" in said


def test_a_loader_factory_of_an_accelerate_script_is_not_told_to_pin(tmp_path: Path) -> None:
    """Time-LLM: data_factory.py builds the loader without pin_memory; run_main.py hands it to
    `accelerator.prepare(...)`, which places the batches: no AO102 there. The same factory
    under a script that copies the batches itself is told."""
    factory = """
    from torch.utils.data import DataLoader

    def data_provider(args):
        loader = DataLoader(make(args), batch_size=32, num_workers=4, persistent_workers=True)
        return loader
    """
    accelerate = """
    import torch
    from accelerate import Accelerator
    from data_factory import data_provider

    assert torch.cuda.is_available()
    accelerator = Accelerator()
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    train_loader = data_provider(args)
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
    for epoch in range(10):
        for x in train_loader:
            x = x.float().to(accelerator.device)
            accelerator.backward(model(x).sum())
            optimizer.step()
    """
    plain = """
    import torch
    from data_factory import data_provider

    model = torch.nn.Linear(8, 2).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    train_loader = data_provider(args)
    for epoch in range(10):
        for x in train_loader:
            model(x.cuda(non_blocking=True)).sum().backward()
            optimizer.step()
    """
    _project(tmp_path, {"data_factory.py": factory, "run_main.py": accelerate})
    assert ("data_factory.py", "AO102") not in _lint("run_main.py", "--select", "AO102")[0]
    _project(tmp_path, {"run_main.py": plain})
    assert ("data_factory.py", "AO102") in _lint("run_main.py", "--select", "AO102")[0]
