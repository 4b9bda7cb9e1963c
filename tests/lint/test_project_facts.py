"""Project-level facts: rules look into the user's own modules (`from models import Net`), the
results cache follows those modules, and scripts driven by another script are recognised."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autoopt.lint.engine.config import Options
from autoopt.lint.engine.project import load_project
from autoopt.lint.engine.runner import run_lint
from autoopt.lint.program import project_facts

from .fixtures import keep_cwd

pytestmark = pytest.mark.usefixtures(keep_cwd.__name__)

CONV_MODELS = """
import torch.nn as nn

class BasicBlock(nn.Module):
    def __init__(self, planes):
        super().__init__()
        self.conv = nn.Conv2d(planes, planes, 3, padding=1)

class ResNet(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.layer = block(64)
        self.linear = nn.Linear(64, 10)

    def forward(self, x):
        return self.linear(self.layer(x).mean((2, 3)))

def ResNet18():
    return ResNet(BasicBlock)
"""

MLP_MODELS = """
import torch.nn as nn

def ResNet18():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
"""

MAIN = """
import torch
{imports}

device = torch.accelerator.current_accelerator()
net = ResNet18()
net = net.to(device)
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for inputs, targets in trainloader:
    inputs, targets = inputs.to(device), targets.to(device)
    loss = criterion(net(inputs), targets)
    loss.backward()
"""


def _codes(
    root: Path, path: str, *, cache: bool = False, select: tuple[str, ...] = ("AO601", "AO606")
) -> list[str]:
    os.chdir(root)
    options = Options(select=select, no_cache=not cache)
    report = run_lint(load_project([root / path], options), jobs=1)
    return sorted(d.code for p, d in report.diagnostics)


def _write(root: Path, files: dict[str, str]) -> None:
    (root / "pyproject.toml").write_text("[tool.autoopt]\n")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_conv_model_from_a_local_module(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {"models.py": CONV_MODELS, "main.py": MAIN.format(imports="from models import ResNet18")},
    )
    assert _codes(tmp_path, "main.py") == ["AO601", "AO606"]


def test_star_import_of_a_package_that_re_exports(tmp_path: Path) -> None:
    """kuangliu/pytorch-cifar: `from models import *`, models/__init__.py `from .resnet import *`."""
    _write(
        tmp_path,
        {
            "models/__init__.py": "from .vgg import *\nfrom .resnet import *\n",
            "models/vgg.py": "import torch.nn as nn\nclass VGG(nn.Module):\n    pass\n",
            "models/resnet.py": CONV_MODELS,
            "main.py": MAIN.format(imports="from models import *"),
        },
    )
    assert _codes(tmp_path, "main.py") == ["AO601", "AO606"]


def test_a_module_level_alias_of_a_conv_class(tmp_path: Path) -> None:
    """yolov5: models/yolo.py keeps `Model = DetectionModel`; train.py imports `Model`."""
    aliased = CONV_MODELS + "\nResNet18Model = ResNet18\n"
    main = MAIN.format(imports="from models import ResNet18Model").replace(
        "net = ResNet18()", "net = ResNet18Model()"
    )
    _write(tmp_path, {"models.py": aliased, "main.py": main})
    assert _codes(tmp_path, "main.py") == ["AO601", "AO606"]


OPTIMIZER_HELPERS = """
import torch

def smart_optimizer(model, name="SGD", lr=0.01):
    groups = [p for p in model.parameters() if p.requires_grad]
    if name == "Adam":
        return torch.optim.Adam(groups, lr=lr)
    return torch.optim.SGD(groups, lr=lr, momentum=0.9)

def count_parameters(model, trainable=True):
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable)
"""

TRAIN_WITH_HELPER = """
import torch
from utils import {helper}

model = Net().to("cuda")
optimizer = {helper}(model)
for x, y in loader:
    loss_fn(model(x), y).backward()
"""


@pytest.mark.parametrize(
    ("helper", "expected"), [("smart_optimizer", ["AO301"]), ("count_parameters", [])]
)
def test_an_optimizer_built_by_a_project_function(
    tmp_path: Path, helper: str, expected: list[str]
) -> None:
    """yolov5: `optimizer = smart_optimizer(model, ...)` from utils/torch_utils.py trains the
    model (AO301); a helper that builds no optimizer says nothing."""
    _write(
        tmp_path,
        {"utils.py": OPTIMIZER_HELPERS, "main.py": TRAIN_WITH_HELPER.format(helper=helper)},
    )
    assert _codes(tmp_path, "main.py", select=("AO301",)) == expected


def test_a_local_mlp_is_not_convolutional(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {"models.py": MLP_MODELS, "main.py": MAIN.format(imports="from models import ResNet18")},
    )
    assert _codes(tmp_path, "main.py") == []


def test_a_local_model_that_calls_view_is_reported_without_a_fix(tmp_path: Path) -> None:
    viewing = CONV_MODELS.replace("self.layer(x).mean((2, 3))", "self.layer(x).view(x.size(0), -1)")
    _write(
        tmp_path,
        {"models.py": viewing, "main.py": MAIN.format(imports="from models import ResNet18")},
    )
    os.chdir(tmp_path)
    options = Options(select=("AO606",), no_cache=True)
    report = run_lint(load_project([tmp_path / "main.py"], options), jobs=1)
    [(_, found)] = report.diagnostics
    assert "fix declined" in found.message and found.fix_safety == "none"  # it would raise


def test_a_model_from_a_module_that_is_not_there_is_unknown(tmp_path: Path) -> None:
    _write(tmp_path, {"main.py": MAIN.format(imports="from models import ResNet18")})
    assert _codes(tmp_path, "main.py") == []


def test_cache_is_invalidated_when_an_imported_module_changes(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {"models.py": CONV_MODELS, "main.py": MAIN.format(imports="from models import ResNet18")},
    )
    assert _codes(tmp_path, "main.py", cache=True) == ["AO601", "AO606"]
    (tmp_path / "models.py").write_text(MLP_MODELS)
    assert _codes(tmp_path, "main.py", cache=True) == []  # not the stale cached findings
    (tmp_path / "models.py").write_text(CONV_MODELS)
    assert _codes(tmp_path, "main.py", cache=True) == ["AO601", "AO606"]


def test_modules_are_parsed_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(
        tmp_path,
        {
            "models.py": CONV_MODELS,
            "a.py": MAIN.format(imports="from models import ResNet18"),
            "b.py": MAIN.format(imports="from models import ResNet18"),
        },
    )
    parsed: list[Path] = []
    summarize = project_facts.summarize

    def counting(path: Path, data: bytes, tree=None) -> project_facts.ModuleSummary:
        parsed.append(path)
        return summarize(path, data, tree)

    monkeypatch.setattr(project_facts, "summarize", counting)
    os.chdir(tmp_path)
    options = Options(select=("AO601", "AO606"), no_cache=True)
    report = run_lint(load_project([tmp_path / "a.py", tmp_path / "b.py"], options), jobs=1)
    assert sorted(p for p, d in report.diagnostics) == ["a.py", "a.py", "b.py", "b.py"]
    assert [p.name for p in parsed] == ["models.py"]


HOGWILD_TRAIN = """
import torch

def train_epoch(model, device, data_loader, optimizer):
    for data, target in data_loader:
        optimizer.zero_grad()
        loss = F.nll_loss(model(data.to(device)), target.to(device))
        loss.backward()
        optimizer.step()
"""

HOGWILD_MAIN = """
import torch
import torch.multiprocessing as mp
from train import train_epoch

if __name__ == "__main__":
    device = torch.accelerator.current_accelerator()
    model = Net().to(device)
    model.share_memory()
    processes = [mp.Process(target=train_epoch, args=(model, device, loader, opt)) for _ in range(2)]
"""


def test_module_started_by_a_hogwild_script(tmp_path: Path) -> None:
    """pytorch/examples mnist_hogwild: train.py's loop runs in CPU processes sharing one model."""
    _write(tmp_path, {"train.py": HOGWILD_TRAIN})
    os.chdir(tmp_path)
    options = Options(select=("AO103",), no_cache=True)
    alone = run_lint(load_project([tmp_path / "train.py"], options), jobs=1)
    # a device parameter: one finding for the loop's two copies
    assert [d.code for _, d in alone.diagnostics] == ["AO103"]
    (tmp_path / "main.py").write_text(HOGWILD_MAIN)
    driven = run_lint(load_project([tmp_path / "train.py"], options), jobs=1)
    assert driven.diagnostics == []


BATCH_CLASS = """
class NestedTensor:
    def __init__(self, tensors, mask):
        self.tensors, self.mask = tensors, mask

    def to(self, device):
        return NestedTensor(self.tensors.to(device), self.mask.to(device))
"""

ENGINE = """
import torch
{imports}

def train_one_epoch(model, criterion, data_loader, optimizer, device):
    for samples, targets in data_loader:
        samples = samples.to(device)
        loss = criterion(model(samples), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize(
    ("batch_module", "imports", "expected"),
    [
        # detr: engine.py `import util.misc as utils`; util/misc.py defines NestedTensor.to(device)
        (BATCH_CLASS, "import util.misc as utils", []),
        ("from util.other import NestedTensor\n", "from util import misc", []),  # one further
        # the project's class takes non_blocking (or **kwargs): a tensor-like .to(), reported
        (BATCH_CLASS.replace("def to(self, device)", "def to(self, device, **kw)"),
         "import util.misc as utils", ["AO103"]),
        ("", "import util.misc as utils", ["AO103"]),  # no own class anywhere: reported
    ],
)  # fmt: skip
def test_a_batch_of_the_projects_own_class(
    tmp_path: Path, batch_module: str, imports: str, expected: list[str]
) -> None:
    """AO103 would add `non_blocking=True` to a `.to()` that does not take it (TypeError):
    silent where the batch is not proven tensors and the project defines such a `.to()`."""
    _write(
        tmp_path,
        {
            "util/__init__.py": "",
            "util/misc.py": batch_module,
            "util/other.py": BATCH_CLASS,
            "engine.py": ENGINE.format(imports=imports),
        },
    )
    assert _codes(tmp_path, "engine.py", select=("AO103",)) == expected


# ----- facts by weight: what a model's constructor builds, counted as it runs ---------------------
CRNN_MODELS = """
import torch.nn as nn

class BidirectionalLSTM(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.rnn = nn.LSTM(n_in, n_in, bidirectional=True)
        self.embedding = nn.Linear(n_in * 2, n_out)

class CRNN(nn.Module):
    def __init__(self, n_class):
        super().__init__()
        cnn = nn.Sequential()

        def conv_relu(i):
            cnn.add_module(f"conv{i}", nn.Conv2d(64, 64, 3, 1, 1))

        conv_relu(0)
        conv_relu(1)
        conv_relu(2)
        self.cnn = cnn
        self.rnn = nn.Sequential(BidirectionalLSTM(64, 64), BidirectionalLSTM(64, n_class))
"""

VGG_MODELS = """
import torch.nn as nn

class VGG(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        layers = []
        for v in cfg:
            layers += [nn.Conv2d(3, v, 3, padding=1), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512), nn.Linear(512, 10))
"""


@pytest.mark.parametrize(("models", "name"), [(CRNN_MODELS, "CRNN"), (VGG_MODELS, "VGG")])
def test_layers_count_as_often_as_the_constructor_builds_them(
    tmp_path: Path, models: str, name: str
) -> None:
    """meijieru/crnn.pytorch: one `nn.Conv2d` in a helper the constructor calls seven times
    outweighs the two Linear layers of its LSTM head; a VGG builds its convolutions in a loop
    over its configuration and three Linear layers after them. Both are convolutional."""
    main = MAIN.format(imports=f"from models import {name}").replace(
        "net = ResNet18()", f"net = {name}(10)"
    )
    _write(tmp_path, {"models.py": models, "main.py": main})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == ["AO606"]


REGISTRY_PACKAGE = {
    "core/__init__.py": "",
    "core/models/__init__.py": "",
    "core/models/fcn.py": CONV_MODELS.replace("def ResNet18", "def get_fcn"),
    "core/models/psp.py": CONV_MODELS.replace("def ResNet18", "def get_psp"),
    "core/models/model_zoo.py": (
        "from .fcn import *\nfrom .psp import *\n\n"
        "_models = {'fcn': get_fcn, 'psp': get_psp}\n\n"
        "def get_segmentation_model(model, **kwargs):\n"
        "    return _models[model](**kwargs)\n"
    ),
}


def test_a_model_from_a_table_of_builders(tmp_path: Path) -> None:
    """Tramac/awesome-semantic-segmentation: `get_segmentation_model(...)` picks from a
    module-level table of builders the module star-imports: weighed as the table's entries."""
    main = MAIN.format(imports="from core.models.model_zoo import get_segmentation_model").replace(
        "net = ResNet18()", "net = get_segmentation_model(args.model)"
    )
    _write(tmp_path, {**REGISTRY_PACKAGE, "main.py": main})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == ["AO606"]
    # the same table over dense models: not convolutional
    mlp = {k: v.replace(CONV_MODELS, MLP_MODELS) for k, v in REGISTRY_PACKAGE.items()}
    mlp["core/models/fcn.py"] = MLP_MODELS.replace("def ResNet18", "def get_fcn")
    mlp["core/models/psp.py"] = MLP_MODELS.replace("def ResNet18", "def get_psp")
    _write(tmp_path, {**mlp, "main.py": main})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == []


VICREG_MAIN = """
import torch
from torch import nn
import resnet

class VICReg(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.backbone = resnet.__dict__[args.arch](zero_init_residual=True)

    def forward(self, x):
        return self.backbone(x)

model = VICReg(args).cuda(gpu)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    model(x.cuda(gpu, non_blocking=True)).sum().backward()
    optimizer.step()
"""


# akamaster/pytorch_resnet_cifar10: the table's model itself
DIRECT_TABLE_MAIN = VICREG_MAIN.replace(
    "model = VICReg(args).cuda(gpu)", "model = resnet.__dict__[args.arch]().cuda(gpu)"
)


@pytest.mark.parametrize("main", [VICREG_MAIN, DIRECT_TABLE_MAIN])
@pytest.mark.parametrize(("models", "expected"), [(CONV_MODELS, ["AO606"]), (MLP_MODELS, [])])
def test_a_model_from_a_module_used_as_a_table(
    tmp_path: Path, main: str, models: str, expected: list[str]
) -> None:
    """facebookresearch/vicreg: `resnet.__dict__[args.arch](...)` of the project's resnet.py
    inside the file's model class, or as the model itself: convolutional when that module's
    models are."""
    _write(tmp_path, {"resnet.py": models, "main.py": main})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == expected


SELECTION = """
import torch.nn as nn

class channel_selection(nn.Module):
    def forward(self, x):
        return x
"""


@pytest.mark.parametrize(("models", "expected"), [(CONV_MODELS, ["AO606"]), (MLP_MODELS, [])])
def test_a_package_that_star_imports_its_models_used_as_a_table(
    tmp_path: Path, models: str, expected: list[str]
) -> None:
    """Eric-mingjie/network-slimming: `models.__dict__[args.arch](...)` where
    models/__init__.py star-imports its model modules and a building block they share
    (`channel_selection`, itself no model): convolutional when the models are."""
    main = DIRECT_TABLE_MAIN.replace("import resnet", "import models").replace(
        "resnet.__dict__", "models.__dict__"
    )
    package = {
        "models/__init__.py": "from __future__ import absolute_import\n\n"
        "from .vgg import *\nfrom .channel_selection import *\n",
        "models/vgg.py": "from .channel_selection import channel_selection\n" + models,
        "models/channel_selection.py": SELECTION,
    }
    _write(tmp_path, {**package, "main.py": main})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == expected


@pytest.mark.parametrize(("dense", "expected"), [(1, ["AO606"]), (2, [])])
def test_a_star_imported_zoo_is_convolutional_when_most_of_its_modules_are(
    tmp_path: Path, dense: int, expected: list[str]
) -> None:
    """facebookresearch/mixup-cifar10: `models.__dict__[args.model]()` over a package that
    star-imports vgg, lenet, resnet, ...: LeNet's dense layers outweigh its convolutions, the
    zoo is still a zoo of CNNs; a package mostly of dense models is not."""
    main = DIRECT_TABLE_MAIN.replace("import resnet", "import models").replace(
        "resnet.__dict__", "models.__dict__"
    )
    conv = ["vgg", "resnet"][: 3 - dense]
    mlp = [f"mlp{i}" for i in range(dense)]
    package = {f"models/{name}.py": CONV_MODELS for name in conv}
    package |= {f"models/{name}.py": MLP_MODELS for name in mlp}
    package["models/__init__.py"] = "".join(f"from .{n} import *\n" for n in [*conv, *mlp])
    _write(tmp_path, {**package, "main.py": main})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == expected


MOCO_MAIN = """
import torch
from functools import partial
import torchvision.models as torchvision_models
from moco.builder import MoCo

model = MoCo(partial(torchvision_models.__dict__[args.arch], zero_init_residual=True), 256)
model.cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    model(x.cuda()).sum().backward()
    optimizer.step()
"""


def test_a_wrapper_model_handed_a_zoo_builder(tmp_path: Path) -> None:
    """facebookresearch/moco-v3: the builder of a torchvision CNN handed to the project's
    wrapper class through `functools.partial`."""
    builder = "import torch.nn as nn\nclass MoCo(nn.Module):\n    def __init__(self, base, dim):\n        super().__init__()\n        self.encoder = base(num_classes=dim)\n"
    _write(tmp_path, {"moco/__init__.py": "", "moco/builder.py": builder, "main.py": MOCO_MAIN})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == ["AO606"]


BUILDER_CLASS = (
    CONV_MODELS
    + """

class ModelBuilder:
    @staticmethod
    def build_encoder(arch="resnet18"):
        return ResNet18()
"""
)


def test_a_static_builder_method_of_a_project_class(tmp_path: Path) -> None:
    """CSAILVision/semantic-segmentation: `ModelBuilder.build_encoder(...)`."""
    main = MAIN.format(imports="from models import ModelBuilder").replace(
        "net = ResNet18()", "net = ModelBuilder.build_encoder(arch='resnet18')"
    )
    _write(tmp_path, {"models.py": BUILDER_CLASS, "main.py": main})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == ["AO606"]


TRAINER_MODULE = """
import torch

class Trainer:
    def __init__(self, model, optimizer, loader, device):
        self.model, self.optimizer, self.loader, self.device = model, optimizer, loader, device

    def train(self):
        for x, y in self.loader:
            loss = self.model(x.to(self.device)).sum()
            loss.backward()
            self.optimizer.step()
"""


def test_tf32_belongs_to_the_script_that_starts_the_program(tmp_path: Path) -> None:
    """AO602 in victoresque/pytorch-template's trainer/trainer.py (only definitions, imported
    by train.py): the program-wide switch goes in the driver, not the trainer module."""
    _write(tmp_path, {"trainer.py": TRAINER_MODULE.replace("device):", "device='cuda'):")})
    assert _codes(tmp_path, "trainer.py", select=("AO602",)) == ["AO602"]  # nobody imports it
    (tmp_path / "train.py").write_text("from trainer import Trainer\nprint(Trainer)\n")
    assert _codes(tmp_path, "trainer.py", select=("AO602",)) == []


def test_a_module_imported_in_a_list_of_imports_is_the_drivers(tmp_path: Path) -> None:
    """mrdbourke/pytorch-deep-learning's going_modular: `import data_setup, engine, utils` in
    train.py imports engine.py too (its AO602 belongs to train.py)."""
    engine = TRAINER_MODULE.replace("device):", "device='cuda'):")
    _write(tmp_path, {"engine.py": engine, "utils.py": "", "data_setup.py": ""})
    (tmp_path / "train.py").write_text(
        "import data_setup, engine as eng, utils\nprint(eng.Trainer)\n"
    )
    assert _codes(tmp_path, "engine.py", select=("AO602",)) == []


EXP_BASIC = """
import torch

class Exp_Basic(object):
    def __init__(self, args):
        self.args = args
        self.device = self._acquire_device()
        self.model = self._build_model().to(self.device)

    def _acquire_device(self):
        if self.args.use_gpu:
            return torch.device("cuda:{}".format(self.args.gpu))
        return torch.device("cpu")
"""

EXP = """
import torch
from torch.utils.data import DataLoader
from exp_basic import Exp_Basic

class Exp(Exp_Basic):
    def _build_model(self):
        return torch.nn.Linear(4, 2)

    def train(self, dataset):
        loader = DataLoader(dataset, batch_size=8, num_workers=2)
        opt = torch.optim.Adam(self.model.parameters())
        for x, y in loader:
            opt.zero_grad()
            out = self.model(x.float().to(self.device))
            torch.nn.functional.mse_loss(out, y.to(self.device)).backward()
            opt.step()
"""


def test_a_device_a_base_class_of_another_module_sets(tmp_path: Path) -> None:
    """Crossformer: `.to(self.device)` where `Exp_Basic.__init__` of exp_basic.py picks
    "cuda:N" when asked: the loader and the copies are checked as on a GPU. A program that
    never runs on CUDA (the base picks only the CPU) is not."""
    _write(tmp_path, {"exp_basic.py": EXP_BASIC, "exp.py": EXP})
    assert _codes(tmp_path, "exp.py", select=("AO102", "AO103")) == ["AO102", "AO103"]
    cpu_only = EXP_BASIC.replace('"cuda:{}".format(self.args.gpu)', '"cpu"')
    _write(tmp_path, {"exp_basic.py": cpu_only, "exp.py": EXP})
    assert _codes(tmp_path, "exp.py", select=("AO102", "AO103")) == []


@pytest.mark.parametrize("conv", ["nn.Conv1d", "nn.Conv2d"])
def test_a_conv1d_network_with_one_2d_upsampler_is_not_a_conv2d_model(
    tmp_path: Path, conv: str
) -> None:
    """FloWaveNet: a WaveNet of Conv1d layers beside one 1-channel ConvTranspose2d in the
    upsampler is no channels_last candidate; the same network of Conv2d layers is."""
    models = f"""
import torch.nn as nn

class ResBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.filter_conv = {conv}(c, c, 3)
        self.gate_conv = {conv}(c, c, 3)
        self.res_conv = {conv}(c, c, 1)

class Flowavenet(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.blocks = nn.ModuleList([ResBlock(64) for _ in range(4)])
        self.upsample = nn.ConvTranspose2d(1, 1, (3, 32), stride=(1, 16))
"""
    main = MAIN.format(imports="from models import Flowavenet").replace(
        "net = ResNet18()", "net = Flowavenet(10)"
    )
    _write(tmp_path, {"models.py": models, "main.py": main})
    expected = ["AO606"] if conv == "nn.Conv2d" else []
    assert _codes(tmp_path, "main.py", select=("AO606",)) == expected


def test_a_conv_nd_dispatcher_still_makes_a_conv2d_model(tmp_path: Path) -> None:
    """guided/minimal-diffusion: `conv_nd(dims, ...)` returns nn.Conv1d, nn.Conv2d or
    nn.Conv3d; a U-Net built of `conv_nd(2, ...)` is a Conv2d model (the dispatcher's 1-D and
    3-D branches do not weigh against it)."""
    models = """
import torch.nn as nn

def conv_nd(dims, *args, **kwargs):
    if dims == 1:
        return nn.Conv1d(*args, **kwargs)
    elif dims == 2:
        return nn.Conv2d(*args, **kwargs)
    return nn.Conv3d(*args, **kwargs)

class UNet(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.a = conv_nd(2, 3, 64, 3)
        self.b = conv_nd(2, 64, 64, 3)
        self.head = nn.Linear(64, n)
"""
    main = MAIN.format(imports="from models import UNet").replace(
        "net = ResNet18()", "net = UNet(10)"
    )
    _write(tmp_path, {"models.py": models, "main.py": main})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == ["AO606"]


@pytest.mark.parametrize("count", [0, 4])
def test_a_worker_count_read_from_a_config_module(tmp_path: Path, count: int) -> None:
    """OpenAI-CLIP: `import config as CFG`, `DataLoader(..., num_workers=CFG.num_workers)`
    where config.py sets `num_workers = 0`: the default run loads in-process (reported, the
    change belongs in config.py); a count above 0 there is left alone."""
    main = """
import torch
import config as CFG

loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=CFG.num_workers)
for x, y in loader:
    loss = model(x.to(CFG.device)).sum()
    loss.backward()
"""
    config = f"import torch\n\nnum_workers = {count}\ndevice = torch.device('cuda')\n"
    _write(tmp_path, {"config.py": config, "main.py": main})
    expected = ["AO101"] if count == 0 else []
    assert _codes(tmp_path, "main.py", select=("AO101",)) == expected


def test_the_cache_follows_the_config_module_a_count_is_read_from(tmp_path: Path) -> None:
    main = """
import torch
import config as CFG

loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=CFG.num_workers)
for x, y in loader:
    model(x.to(CFG.device)).sum().backward()
"""
    _write(tmp_path, {"config.py": "num_workers = 0\ndevice = 'cuda'\n", "main.py": main})
    assert _codes(tmp_path, "main.py", cache=True, select=("AO101",)) == ["AO101"]
    (tmp_path / "config.py").write_text("num_workers = 8\ndevice = 'cuda'\n")
    assert _codes(tmp_path, "main.py", cache=True, select=("AO101",)) == []


YACS_CONFIG = """
from yacs.config import CfgNode as CN

_C = CN()
_C.DATALOADER = CN()
_C.DATALOADER.batch_size = 32
_C.DATALOADER.num_workers = {count}
"""

YACS_LOADER = """
import torch
from torch.utils.data import DataLoader

def create_dataloader(split, cfg):
    num_workers = cfg.DATALOADER.num_workers
    return DataLoader(dataset(split), cfg.DATALOADER.batch_size, num_workers=num_workers)
"""

YACS_MAIN = """
import torch
from configs import get_cfg_defaults
from dataloader import create_dataloader

cfg = get_cfg_defaults()
loader = create_dataloader("train", cfg)
model = Net().to("cuda")
for x, y in loader:
    model(x.to("cuda")).sum().backward()
"""


@pytest.mark.parametrize(
    ("count", "yaml", "expected"),
    [
        (0, None, ["AO101"]),
        (0, "  num_workers: 0\n", ["AO101"]),
        (4, None, []),
        (0, "  num_workers: 8\n", []),
    ],
)
def test_a_worker_count_read_from_a_yacs_default(
    tmp_path: Path, count: int, yaml: str | None, expected: list[str]
) -> None:
    """SimpleView: `num_workers = cfg.DATALOADER.num_workers` in the loader's builder, where
    configs.py declares the yacs default `_C.DATALOADER.num_workers = 0`: reported (the change
    belongs in configs.py), unless the default is above 0 or a YAML config of the project sets
    the key to another value (which a run loads over the default)."""
    files = {
        "configs.py": YACS_CONFIG.format(count=count),
        "dataloader.py": YACS_LOADER,
        "main.py": YACS_MAIN,
    }
    if yaml is not None:
        files["configs/run_1.yaml"] = "DATALOADER:\n" + yaml
    _write(tmp_path, files)
    assert _codes(tmp_path, "dataloader.py", select=("AO101",)) == expected


@pytest.mark.parametrize("stop", ["sys.exit(1)", "print('no GPU')\n        sys.exit(1)"])
def test_a_script_that_stops_without_cuda_after_logging_why_is_cuda_only(
    tmp_path: Path, stop: str
) -> None:
    """P-DARTS: `if not torch.cuda.is_available(): logging.info('No GPU device available');
    sys.exit(1)` at the top of main(): CUDA-only by design, its `.cuda()` calls are not
    reported (the message line kept the stop from being seen)."""
    main = f"""
import logging
import sys
import torch
import torch.nn as nn

def main():
    if not torch.cuda.is_available():
        logging.info("No GPU device available")
        {stop}
    criterion = nn.CrossEntropyLoss()
    criterion = criterion.cuda()
    model = Network().cuda()
    for x, y in loader:
        loss = criterion(model(x.cuda()), y.cuda())
        loss.backward()
"""
    _write(tmp_path, {"train_search.py": main})
    assert _codes(tmp_path, "train_search.py", select=("AO603",)) == []


FACTORY_PLACES = """
from models import ResNet18

def net_factory(net_type="resnet"):
    if net_type == "resnet":
        net = ResNet18().cuda()
    else:
        net = None
    return net
"""


@pytest.mark.parametrize(
    ("factory", "reported"),
    [
        (FACTORY_PLACES, True),
        # placed in place, then returned (SGC's `get_model`: `model.cuda()`)
        (FACTORY_PLACES.replace("ResNet18().cuda()", "ResNet18()\n        net.cuda()"), True),
        (FACTORY_PLACES.replace("ResNet18().cuda()", "ResNet18()"), False),  # never placed
        # moved back to the host before it is returned: not on the device
        (FACTORY_PLACES.replace("ResNet18().cuda()", "ResNet18().cuda().cpu()"), False),
    ],
)
def test_a_factory_that_returns_what_it_placed(
    tmp_path: Path, factory: str, reported: bool
) -> None:
    """SSL4MIS: `model = net_factory(net_type=args.model, ...)`, whose branches build
    `UNet(...).cuda()` and `return net`: the model is placed by the line that builds it."""
    main = MAIN.format(imports="from factory import net_factory").replace(
        "net = ResNet18()\nnet = net.to(device)\n", "net = net_factory(args.model)\n"
    )
    assert "net.to(device)" not in main
    _write(tmp_path, {"models.py": CONV_MODELS, "factory.py": factory, "main.py": main})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == (["AO606"] if reported else [])


@pytest.mark.parametrize(
    ("built", "reported"),
    [
        ("ResNet18().cuda().train()", True),  # pysot's `ModelBuilder().cuda().train()`
        ("ResNet18().train().to(device)", True),
        ("ResNet18().cuda().cpu()", False),  # moved back to the host
        # placed inside the wrapper it is handed to (XMem's trainer)
        ("torch.nn.parallel.DistributedDataParallel(ResNet18().cuda(), device_ids=[0])", True),
        ("torch.nn.DataParallel(ResNet18())", False),
    ],
)
def test_a_placement_under_methods_that_keep_the_module(
    tmp_path: Path, built: str, reported: bool
) -> None:
    main = MAIN.format(imports="from models import ResNet18").replace(
        "net = ResNet18()\nnet = net.to(device)\n", f"net = {built}\n"
    )
    assert built in main and "net.to(device)" not in main
    _write(tmp_path, {"models.py": CONV_MODELS, "main.py": main})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == (["AO606"] if reported else [])


def _diagnostics(root: Path, path: str, select: tuple[str, ...]) -> list[tuple[str, str, bool]]:
    """(code, message, fixable) of each finding."""
    os.chdir(root)
    report = run_lint(load_project([root / path], Options(select=select, no_cache=True)), jobs=1)
    return sorted((d.code, d.message, d.fix_safety != "none") for _, d in report.diagnostics)


POSE_MAIN = """
import torch
import models

model = eval("models." + cfg.MODEL.NAME + ".get_pose_net")(cfg, is_train=True)
model = torch.nn.DataParallel(model).cuda()
optimizer = torch.optim.Adam(model.parameters())
for x, y in loader:
    criterion(model(x.cuda()), y.cuda()).backward()
    optimizer.step()
"""


@pytest.mark.parametrize(("models", "expected"), [(CONV_MODELS, ["AO606"]), (MLP_MODELS, [])])
def test_a_model_picked_by_an_evaluated_module_path(
    tmp_path: Path, models: str, expected: list[str]
) -> None:
    """HRNet and the pose-estimation code copied from it: `eval("models." + name +
    ".get_pose_net")(cfg)` is the function of that name in the modules of the package."""
    builder = models + "\ndef get_pose_net(cfg, is_train):\n    return ResNet18()\n"
    _write(
        tmp_path,
        {"models/__init__.py": "import models.pose_resnet\n", "models/pose_resnet.py": builder},
    )
    _write(tmp_path, {"main.py": POSE_MAIN})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == expected
    # a package the script does not import is not read
    _write(tmp_path, {"main.py": POSE_MAIN.replace("import models\n", "")})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == []


TEMPLATE_MAIN = """
import torch
import model.model as module_arch
from trainer import Trainer

def main(config):
    model = config.init_obj("arch", module_arch)
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model = model.to(device)
    trainer = Trainer(model, device=device)
    optimizer = torch.optim.Adam(model.parameters())
    for x, y in loader:
        criterion(model(x.to(device)), y.to(device)).backward()
        optimizer.step()
"""


@pytest.mark.parametrize(("models", "expected"), [(CONV_MODELS, ["AO606"]), (MLP_MODELS, [])])
def test_a_model_picked_from_a_module_handed_to_a_call(
    tmp_path: Path, models: str, expected: list[str]
) -> None:
    """victoresque/pytorch-template: `config.init_obj("arch", module_arch)` picks a class of
    the project module it is handed; the trainer built around the model is not reported a
    second time."""
    files = {"model/__init__.py": "", "model/model.py": models, "trainer.py": TRAINER}
    _write(tmp_path, {**files, "main.py": TEMPLATE_MAIN})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == expected


TIMM_MAIN = """
import torch
from timm.models import create_model
import models.convnets

model = create_model(args.model, num_classes=10)
model.to(torch.device("cuda"))
optimizer = torch.optim.AdamW(model.parameters())
for x, y in loader:
    criterion(model(x.cuda()), y.cuda()).backward()
    optimizer.step()
"""


@pytest.mark.parametrize(("models", "expected"), [(CONV_MODELS, ["AO606"]), (MLP_MODELS, [])])
def test_a_model_registered_with_timm(tmp_path: Path, models: str, expected: list[str]) -> None:
    """ConvNeXt/DeiT-style repositories: `create_model(args.model)` builds one of the models
    the imported project modules register with `@register_model`."""
    registered = (
        "from timm.models.registry import register_model\n"
        + models
        + "\n@register_model\ndef small_net(**kwargs):\n    return ResNet18()\n"
    )
    _write(
        tmp_path,
        {"models/__init__.py": "", "models/convnets.py": registered, "main.py": TIMM_MAIN},
    )
    assert _codes(tmp_path, "main.py", select=("AO606",)) == expected


PLACED_BY_TRAINER = """
import torch
from models import ResNet18
from trainer import Trainer

model = ResNet18()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
trainer = Trainer(model, optimizer)
trainer.set_device("cuda")
trainer.train(loader)
"""

TRAINER = """
class Trainer:
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def set_device(self, device):
        self.model = self.model.to(device)
        self.device = device

    def train(self, loader):
        for x, y in loader:
            loss = self.model(x.to(self.device)).sum()
            loss.backward()
            self.optimizer.step()
"""


def test_a_trained_conv_model_placed_where_the_search_does_not_reach(tmp_path: Path) -> None:
    """CenterNet/FairMOT: the model is placed by a trainer's `set_device` in another module.
    Reported where it is built, without a fix (the placement is not in this file); not in a
    program that never runs on CUDA."""
    _write(
        tmp_path, {"models.py": CONV_MODELS, "trainer.py": TRAINER, "main.py": PLACED_BY_TRAINER}
    )
    found = _diagnostics(tmp_path, "main.py", ("AO606",))
    assert [(code, fixable) for code, _, fixable in found] == [("AO606", False)]
    assert "fix declined" in found[0][1]
    # a device of the user's choosing in a program that never names CUDA
    chosen = PLACED_BY_TRAINER.replace('trainer.set_device("cuda")', "trainer.set_device(device)")
    chosen = chosen.replace(
        "model = ResNet18()", "device = torch.device(args.device)\nmodel = ResNet18()"
    )
    _write(tmp_path, {"main.py": chosen})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == []


def test_a_model_another_branch_builds_as_a_dense_network_is_not_reported_unplaced(
    tmp_path: Path,
) -> None:
    """facebookresearch/dino: a ViT by default, a CNN in an `elif`; with its placement out of
    reach, the model is not known to be a Conv2d network."""
    models = (
        CONV_MODELS + "\ndef Dense():\n    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))\n"
    )
    main = PLACED_BY_TRAINER.replace(
        "model = ResNet18()\n",
        "if args.dense:\n    model = Dense()\nelse:\n    model = ResNet18()\n",
    ).replace("from models import ResNet18", "from models import Dense, ResNet18")
    _write(tmp_path, {"models.py": models, "trainer.py": TRAINER, "main.py": main})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == []
    _write(tmp_path, {"main.py": PLACED_BY_TRAINER})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == ["AO606"]


AUDIO_TRANSFORMER = """
import timm
import torch.nn as nn

class AST(nn.Module):
    def __init__(self):
        super().__init__()
        self.v = timm.create_model("{name}", pretrained=False)
        self.v.patch_embed.proj = nn.Conv2d(1, 768, kernel_size=16, stride=10)
        self.head = nn.Linear(768, 527)

    def forward(self, x):
        return self.head(self.v(x))
"""


@pytest.mark.parametrize(
    ("name", "expected"), [("vit_deit_base_distilled_patch16_384", []), ("resnet50", ["AO606"])]
)
def test_a_zoo_transformer_backbone_weighs_as_dense_layers(
    tmp_path: Path, name: str, expected: list[str]
) -> None:
    """YuanGongND/ast: a timm ViT with its patch embedding replaced by a `Conv2d` is a
    transformer, not a convolutional network; the same class around a ResNet is one."""
    main = MAIN.format(imports="from models import AST").replace("ResNet18()", "AST()")
    _write(tmp_path, {"models.py": AUDIO_TRANSFORMER.format(name=name), "main.py": main})
    assert _codes(tmp_path, "main.py", select=("AO606",)) == expected


def test_a_worker_option_declared_in_a_package_module(tmp_path: Path) -> None:
    """MACE: `from mace import tools`, `args = tools.build_default_arg_parser().parse_args()`,
    the parser in mace/tools/arg_parser.py re-exported by the package: `--num_workers`
    defaults to 0 there (AO101, without a fix, naming the module)."""
    parser = (
        "import argparse\n\ndef build_default_arg_parser():\n"
        "    parser = argparse.ArgumentParser()\n"
        '    parser.add_argument("--num_workers", type=int, default=0)\n'
        "    return parser\n"
    )
    main = (
        "import torch\nfrom torch.utils.data import DataLoader\nfrom pkg import tools\n\n"
        "args = tools.build_default_arg_parser().parse_args()\n"
        "loader = DataLoader(dataset, batch_size=8, num_workers=args.num_workers)\n"
        "model = torch.nn.Linear(8, 2).cuda()\n"
        "for x in loader:\n    model(x.cuda()).sum().backward()\n"
    )
    files = {
        "pkg/__init__.py": "",
        "pkg/tools/__init__.py": "from .arg_parser import build_default_arg_parser\n",
        "pkg/tools/arg_parser.py": parser,
        "main.py": main,
    }
    _write(tmp_path, files)
    found = _diagnostics(tmp_path, "main.py", ("AO101",))
    assert [(code, fixable) for code, _, fixable in found] == [("AO101", False)]
    assert "pkg/tools/arg_parser.py" in found[0][1]
