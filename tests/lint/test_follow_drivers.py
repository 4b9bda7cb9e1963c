"""What a driver tells about the program it runs: the branch a run without options takes, the
precision and cuDNN choices made in a base class or by the driver itself, the device it asks
for, the loaders it hands to training on CUDA, and its command-line defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from .fixtures import keep_cwd
from .test_follow_helpers import _lint_rules
from .test_follow_training import _project

pytestmark = pytest.mark.usefixtures(keep_cwd.__name__)

# A trainer module whose loop runs in fp32 on CUDA (End-to-end-ASR's bin/train_*.py).
SOLVER = """
import torch

class Solver:
    def __init__(self, paras):
        self.model = torch.nn.Linear(4, 2).cuda()
        self.optimizer = torch.optim.Adam(self.model.parameters())

    def exec(self, loader):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(self.model(x.cuda()), y.cuda())
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
"""

# The driver picks the Solver by a flag that is off unless given.
PICKS_BY_FLAG = """
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--lm", action="store_true")
paras = parser.parse_args()
if paras.lm:
    from train_lm import Solver
else:
    from train_asr import Solver
solver = Solver(paras)
solver.exec(loader)
"""


def test_a_solver_picked_by_a_flag_is_the_one_a_run_without_it_takes(tmp_path: Path) -> None:
    _project(tmp_path, {"train_lm.py": SOLVER, "train_asr.py": SOLVER, "main.py": PICKS_BY_FLAG})
    found, said = _lint_rules("main.py", "AO201")
    assert found == [("train_asr.py", "AO201")], said
    # `store_false`: the `if` branch is the default one
    flipped = PICKS_BY_FLAG.replace('"store_true"', '"store_false"')
    (tmp_path / "main.py").write_text(flipped)
    assert _lint_rules("main.py", "AO201")[0] == [("train_lm.py", "AO201")]


# End-to-end-ASR's src/solver.py: apex amp enabled by the base class, under a flag.
BASE_WITH_APEX = """
class BaseSolver:
    def enable_apex(self):
        if self.paras.amp:
            from apex import amp
            self.amp_lib = amp
            self.model, self.opt = self.amp_lib.initialize(self.model, self.opt, opt_level="O1")
"""

SUBCLASS = """
import torch
from solver import BaseSolver

class Solver(BaseSolver):
    def set_model(self):
        self.model = torch.nn.Linear(4, 2).cuda()
        self.opt = torch.optim.Adam(self.model.parameters())
        self.enable_apex()

    def exec(self, loader):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(self.model(x.cuda()), y.cuda())
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
"""


@pytest.mark.parametrize("apex", [True, False])
def test_apex_enabled_by_a_base_class_leaves_the_precision_to_the_script(
    tmp_path: Path, apex: bool
) -> None:
    base = BASE_WITH_APEX if apex else "class BaseSolver:\n    pass\n"
    _project(tmp_path, {"solver.py": base, "train_asr.py": SUBCLASS})
    found, _ = _lint_rules("train_asr.py", "AO201")
    assert found == ([] if apex else [("train_asr.py", "AO201")])


# SCINet: the driver chooses cuDNN's flags at its top level, the Exp module has the convolutions.
EXP = """
import torch

class Exp:
    def train(self, loader):
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3)).cuda()
        opt = torch.optim.Adam(model.parameters())
        for x in loader:
            model(x.cuda()).sum().backward()
            opt.step()
"""


@pytest.mark.parametrize(
    ("settings", "told"),
    [
        ("torch.backends.cudnn.benchmark = False\n", False),
        ("torch.backends.cudnn.deterministic = True\n", False),
        # a seed helper may run only when a seed is given: the default run is still told
        (
            "def set_seed(s):\n    torch.backends.cudnn.deterministic = True\n"
            "    torch.backends.cudnn.benchmark = False\n",
            True,
        ),
    ],
)
def test_cudnn_flags_chosen_by_the_driver_stand_ao601_down(
    tmp_path: Path, settings: str, told: bool
) -> None:
    driver = f"import torch\nfrom exp import Exp\n{settings}Exp().train(loader)\n"
    _project(tmp_path, {"exp.py": EXP, "run.py": driver})
    found, _ = _lint_rules("run.py", "AO601")
    assert found == ([("exp.py", "AO601")] if told else [])


# DeepFM: the model's class picks CUDA unless told otherwise; the driver tells it.
DEEPFM = """
import torch

class DeepFM(torch.nn.Module):
    def __init__(self, sizes, use_cuda=True):
        super().__init__()
        self.device = torch.device("cuda" if use_cuda and torch.cuda.is_available() else "cpu")
        self.linear = torch.nn.Linear(sizes, 1)

    def fit(self, loader, optimizer):
        model = self.train().to(device=self.device)
        for x, y in loader:
            x = x.to(device=self.device)
            loss = (model(x) - y).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""


@pytest.mark.parametrize("use_cuda", [False, True])
def test_a_driver_that_asks_the_model_for_the_cpu_gets_no_cuda_advice(
    tmp_path: Path, use_cuda: bool
) -> None:
    driver = f"""
    import torch
    from torch.utils.data import DataLoader
    from deepfm import DeepFM
    loader = DataLoader(data, batch_size=100, num_workers=2)
    model = DeepFM(39, use_cuda={use_cuda})
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model.fit(loader, optimizer)
    """
    _project(tmp_path, {"deepfm.py": DEEPFM, "main.py": driver})
    found, _ = _lint_rules("main.py", "AO102,AO605")
    assert found == ([("main.py", "AO102"), ("main.py", "AO605")] if use_cuda else [])


# ECAPA-TDNN: the driver names no device; the class it hands the loader to copies to CUDA.
ECAPA = """
import torch

class ECAPAModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(4, 2).cuda()
        self.optim = torch.optim.Adam(self.parameters())

    def train_network(self, epoch, loader):
        for data, labels in loader:
            loss = torch.nn.functional.cross_entropy(self.encoder(data.cuda()), labels.cuda())
            self.optim.zero_grad()
            loss.backward()
            self.optim.step()
"""

ECAPA_DRIVER = """
import torch
from model import ECAPAModel
loader = torch.utils.data.DataLoader(data, batch_size=400, shuffle=True, num_workers=4)
s = ECAPAModel()
for epoch in range(10):
    s.train_network(epoch=epoch, loader=loader)
"""


def test_a_loader_handed_to_training_on_cuda_is_told_to_pin(tmp_path: Path) -> None:
    _project(tmp_path, {"model.py": ECAPA, "train.py": ECAPA_DRIVER})
    found, _ = _lint_rules("train.py", "AO102")
    assert found == [("train.py", "AO102")]


# MusicTransformer: a part of each batch moved by a device helper's call.
RUN_MODEL = """
def train_epoch(model, dataloader, opt):
    for batch in dataloader:
        x = batch[0].to(get_device())
        tgt = batch[1].to(get_device())
        model(x, tgt).backward()
        opt.step()
"""

MUSIC_DRIVER = """
import torch
from torch.utils.data import DataLoader
from run_model import train_epoch
device = torch.device("cuda")
model = torch.nn.Linear(4, 2).to(device)
opt = torch.optim.Adam(model.parameters())
train_loader = DataLoader(train_dataset, batch_size=2, num_workers=1)
for epoch in range(10):
    train_epoch(model, train_loader, opt)
"""


def test_batch_parts_moved_to_a_device_helpers_device_are_moved_batches(tmp_path: Path) -> None:
    _project(tmp_path, {"run_model.py": RUN_MODEL, "train.py": MUSIC_DRIVER})
    assert _lint_rules("train.py", "AO102")[0] == [("train.py", "AO102")]


# meshed-memory-transformer: the project's DataLoader subclass, of torch's under an alias.
THIN_LOADER = """
from torch.utils.data import DataLoader as TorchDataLoader

class DataLoader(TorchDataLoader):
    def __init__(self, dataset, *args, **kwargs):
        super().__init__(dataset, *args, collate_fn=dataset.collate_fn(), **kwargs)
"""

THIN_DRIVER = """
import torch
from data import DataLoader
device = torch.device("cuda")
model = torch.nn.Linear(4, 2).to(device)
optim = torch.optim.Adam(model.parameters())
loader = DataLoader(train_dataset, batch_size=50, shuffle=True, num_workers=4)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    model(x).sum().backward()
    optim.step()
"""


def test_a_loader_subclass_of_an_aliased_dataloader_is_told_to_pin(tmp_path: Path) -> None:
    _project(tmp_path, {"data/__init__.py": THIN_LOADER, "train.py": THIN_DRIVER})
    found, _ = _lint_rules("train.py", "AO102")
    assert found == [("train.py", "AO102")]


# SCINet: the loader's worker count is an option the driver that imports the module declares.
EXP_LOADER = """
import torch
from torch.utils.data import DataLoader

class Exp:
    def __init__(self, args):
        self.args = args

    def train(self, data):
        loader = DataLoader(data, batch_size=32, num_workers=self.args.num_workers)
        model = torch.nn.Linear(4, 2).cuda()
        opt = torch.optim.Adam(model.parameters())
        for x in loader:
            model(x.cuda()).sum().backward()
            opt.step()
"""


@pytest.mark.parametrize(("default", "told"), [(0, True), (4, False)])
def test_a_worker_count_defaulted_to_0_by_the_importing_driver_is_told(
    tmp_path: Path, default: int, told: bool
) -> None:
    driver = f"""
    import argparse
    from exp import Exp
    parser = argparse.ArgumentParser()
    parser.add_argument("--num_workers", type=int, default={default})
    args = parser.parse_args()
    Exp(args).train(data)
    """
    _project(tmp_path, {"exp.py": EXP_LOADER, "run.py": driver})
    found, _ = _lint_rules("run.py", "AO101")
    assert found == ([("exp.py", "AO101")] if told else [])


# End-to-end-ASR's src/optim.py: the project's optimizer class builds torch's by name.
OPTIM = """
import torch

class Optimizer:
    def __init__(self, parameters, optimizer, lr):
        self.opt = getattr(torch.optim, optimizer)(parameters, lr=lr)

    def step(self):
        self.opt.step()

    def zero_grad(self):
        self.opt.zero_grad()
"""

# ... stepped by the base class's `backward(loss)` in another module (its src/solver.py)
BASE_STEPS = """
class BaseSolver:
    def backward(self, loss):
        loss.backward()
        self.optimizer.step()
"""

SET_MODEL = """
import torch
from optim import Optimizer
from solver import BaseSolver

class Solver(BaseSolver):
    def set_model(self):
        self.model = torch.nn.Linear(4, 2).cuda()
        model_paras = [{"params": self.model.parameters()}]
        self.optimizer = Optimizer(model_paras, "Adam", 1e-3)

    def exec(self, loader):
        for x in loader:
            self.backward(self.model(x.cuda()).sum())
"""


def test_a_model_trained_by_the_projects_optimizer_class_is_told_to_compile(
    tmp_path: Path,
) -> None:
    _project(tmp_path, {"optim.py": OPTIM, "solver.py": BASE_STEPS, "train_asr.py": SET_MODEL})
    found, _ = _lint_rules("train_asr.py", "AO301")
    assert found == [("train_asr.py", "AO301")]


# DnCNN: the moved batch handed every step to a helper of another module that reads it on the host.
PSNR = """
def batch_psnr(img, clean):
    img = img.data.cpu().numpy()
    return float(((img - clean.data.cpu().numpy()) ** 2).mean())
"""


@pytest.mark.parametrize(("read", "told"), [("every step", False), ("now and then", True)])
def test_a_batch_a_helper_reads_on_the_host_needs_no_non_blocking(
    tmp_path: Path, read: str, told: bool
) -> None:
    call = "psnr = batch_psnr(out, img)"
    if read == "now and then":  # inside a block, under an `if` (brain-segmentation's)
        call = f"with torch.no_grad():\n            if i % 10 == 0:\n                {call}"
    driver = f"""
    import torch
    from utils import batch_psnr
    model = torch.nn.Linear(4, 4).cuda()
    opt = torch.optim.Adam(model.parameters())
    for i, img in enumerate(loader):
        img = img.cuda()
        out = model(img)
        out.sum().backward()
        opt.step()
        {call}
    """
    _project(tmp_path, {"utils.py": PSNR, "train.py": driver})
    found, _ = _lint_rules("train.py", "AO103")
    assert found == ([("train.py", "AO103")] if told else [])


# TimeSformer: tools/run_net.py hands its training function to a launcher of the project.
LAUNCHER = """
def launch_job(cfg, init_method, func):
    func(cfg=cfg)
"""

TRAIN_NET = """
import torch
import models.optimizer as optim

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)

def build_trainer(cfg):
    model = Net().cuda()
    optimizer = optim.construct_optimizer(model, cfg)
    return model, optimizer

def train(cfg):
    model, optimizer = build_trainer(cfg)
    for epoch in range(10):
        {rebuild}
        for x in loader:
            model(x.cuda()).sum().backward()
            optimizer.step()
"""

OPTIMIZER = """
import torch

def construct_optimizer(model, cfg):
    return torch.optim.SGD(model.parameters(), lr=cfg.lr)
"""

RUN_NET = """
from misc import launch_job
from train_net import train

def get_func(cfg):
    train_func = train
    return train_func

def main():
    cfg = load_config()
    train = get_func(cfg)
    launch_job(cfg=cfg, init_method="tcp://localhost:9999", func=train)

if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("rebuilt", [False, True])
def test_a_training_function_handed_to_a_launcher_is_followed(
    tmp_path: Path, rebuilt: bool
) -> None:
    # a model rebuilt inside the epoch loop (TimeSformer's multigrid cycle) is no place for a
    # compile; once built, it is told once (not also for the `cfg` its builder reads)
    rebuild = "if cfg.long_cycle:\n            model, optimizer = build_trainer(cfg)"
    files = {
        "misc.py": LAUNCHER,
        "models/__init__.py": "",
        "models/optimizer.py": OPTIMIZER,
        "train_net.py": TRAIN_NET.replace("{rebuild}", rebuild if rebuilt else "pass"),
        "run_net.py": RUN_NET,
    }
    _project(tmp_path, files)
    found, said = _lint_rules("run_net.py", "AO201,AO301")
    assert "also checking train_net.py" in said
    expected = [("train_net.py", "AO201")] + ([] if rebuilt else [("train_net.py", "AO301")])
    assert found == expected


def test_a_model_built_from_a_config_is_what_its_optimizer_trains(tmp_path: Path) -> None:
    """TimeSformer's `model = build_model(cfg)`, then `optim.construct_optimizer(model, cfg)`
    of a package at the root: the model is trained, not the `cfg` it is built from."""
    trainer = """
    import vision.models.optimizer as optim

    def build_trainer(cfg):
        model = build_model(cfg)
        optimizer = optim.construct_optimizer(model, cfg)
        return model, optimizer

    def train(cfg):
        model, optimizer = build_trainer(cfg)
        for epoch in range(10):
            for x in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
    """
    files = {
        "vision/__init__.py": "",
        "vision/models/__init__.py": "",
        "vision/models/optimizer.py": OPTIMIZER,
        "tools/train_net.py": trainer,
    }
    _project(tmp_path, files)
    found, _ = _lint_rules("tools/train_net.py", "AO301")
    assert found == [("tools/train_net.py", "AO301")]


# End-to-end-ASR's src/data.py: two loader builders, the ASR training builds one of them.
DATA = """
from torch.utils.data import DataLoader

def load_dataset(n_jobs, data):
    return DataLoader(data, batch_size=16, num_workers={workers})

def load_textset(data):
    # text held in RAM: no worker processes needed (the language model's loader)
    return DataLoader(data, batch_size=16, num_workers=0)
"""

ASR_TRAINER = """
import torch
from data import load_dataset

class Solver:
    def load_data(self, n_jobs):
        self.tr_set = load_dataset(n_jobs, self.data)

    def exec(self):
        model = torch.nn.Linear(4, 2).cuda()
        opt = torch.optim.Adam(model.parameters())
        for x in self.tr_set:
            model(x.cuda()).sum().backward()
            opt.step()
"""

ASR_MAIN = """
from train_asr import Solver
solver = Solver()
solver.load_data(6)
solver.exec()
"""


@pytest.mark.parametrize(("workers", "told"), [("n_jobs", False), ("0", True)])
def test_a_loader_module_reports_the_loaders_the_training_builds_only(
    tmp_path: Path, workers: str, told: bool
) -> None:
    data = DATA.replace("{workers}", workers)
    _project(tmp_path, {"data.py": data, "train_asr.py": ASR_TRAINER, "main.py": ASR_MAIN})
    found, said = _lint_rules("main.py", "AO101")
    assert "also checking data.py" in said
    assert found == ([("data.py", "AO101")] if told else [])


# DrQA: scripts/reader/train.py hands the model to its own train(); the class is a package's.
DOC_READER = """
import torch

class DocReader:
    def __init__(self):
        self.network = torch.nn.Linear(4, 2).cuda()
        self.optimizer = torch.optim.Adamax(self.network.parameters())

    def update(self, ex):
        loss = self.network(ex.cuda()).sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()
"""

DRQA_TRAIN = """
from drqa.reader import DocReader

def train(args, data_loader, model):
    for ex in data_loader:
        model.update(ex)

def main(args, loader):
    model = DocReader()
    for epoch in range(10):
        train(args, loader, model)
"""


def test_a_model_handed_to_the_scripts_own_loop_is_followed_to_its_class(tmp_path: Path) -> None:
    files = {
        "drqa/__init__.py": "",
        "drqa/reader/__init__.py": "from .model import DocReader\n",
        "drqa/reader/model.py": DOC_READER,
        "scripts/reader/train.py": DRQA_TRAIN,
    }
    _project(tmp_path, files)
    found, said = _lint_rules("scripts/reader/train.py", "AO201")
    assert found == [("drqa/reader/model.py", "AO201")], said


# deep-person-reid: `import torchreid`, whose packages hand on the engine a factory builds; the
# base Engine's loop calls `self.forward_backward`, which the subclasses define.
ENGINE = """
class Engine:
    def __init__(self, model):
        self.model = model

    def run(self, loader):
        for epoch in range(10):
            self.train(loader)

    def train(self, loader):
        for data in loader:
            self.forward_backward(data)

    def forward_backward(self, data):
        raise NotImplementedError
"""

SOFTMAX_ENGINE = """
import torch
from ..engine import Engine

class SoftmaxEngine(Engine):
    def forward_backward(self, data):
        self.model(data.cuda()).sum().backward()
"""

OTHER_PROJECT = """
import torch
from reid.engine.engine import Engine

class DMLEngine(Engine):
    def forward_backward(self, data):
        self.model(data.cuda()).sum().backward()
"""

REID_MAIN = """
import torch
import reid

def build_engine(model):
    return reid.engine.SoftmaxEngine(model)

def main(loader):
    model = torch.nn.Linear(4, 2).cuda()
    engine = build_engine(model)
    engine.run(loader)
"""


def test_a_packaged_engine_runs_the_subclass_the_script_can_import_only(tmp_path: Path) -> None:
    files = {
        "reid/__init__.py": "from reid import engine\n",
        "reid/engine/__init__.py": "from .engine import Engine\nfrom .image import SoftmaxEngine\n",
        "reid/engine/engine.py": ENGINE,
        "reid/engine/image/__init__.py": "from .softmax import SoftmaxEngine\n",
        "reid/engine/image/softmax.py": SOFTMAX_ENGINE,
        "projects/dml/dml.py": OTHER_PROJECT,
        "scripts/main.py": REID_MAIN,
    }
    # many modules of the project import the package (its tools, its other projects)
    files |= {f"tools/tool{i}.py": "import reid\n" for i in range(30)}
    _project(tmp_path, files)
    found, said = _lint_rules("scripts/main.py", "AO201")
    assert found == [("reid/engine/image/softmax.py", "AO201")], said


# attention-is-all-you-need: `train = TranslationDataset(...)` handed to an iterator in the data
# preparation is a local value, not a call of the script's own `train()`.
SCHEDULED_OPTIM = """
class ScheduledOptim:
    def __init__(self, optimizer):
        self._optimizer = optimizer

    def zero_grad(self):
        self._optimizer.zero_grad()

    def step_and_update_lr(self):
        self._optimizer.step()
"""

TRANSLATE = """
import torch
from torch import nn
from optim import ScheduledOptim


def prepare(opt, device):
    train = TranslationDataset(opt.data)
    return BucketIterator(train, batch_size=opt.batch_size, device=device)


def train_epoch(model, data, optimizer):
    for x in data:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step_and_update_lr()


def main(opt):
    device = torch.device("cuda")
    data = prepare(opt, device)
    model = nn.Linear(4, 2).to(device)
    optimizer = ScheduledOptim(torch.optim.Adam(model.parameters()))
    train(model, data, optimizer, device, opt)


def train(model, data, optimizer, device, opt):
    for epoch in range(3):
        train_epoch(model, data, optimizer)
"""


def test_a_local_value_handed_to_a_call_is_not_a_function_it_runs(tmp_path: Path) -> None:
    _project(tmp_path, {"optim.py": SCHEDULED_OPTIM, "train.py": TRANSLATE})
    found, _ = _lint_rules("train.py", "AO301")
    assert found == [("train.py", "AO301")]
