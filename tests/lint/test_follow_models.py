"""What the project's other modules tell about a script's models and data: the host-built
tensors its models' forwards copy every step, a model built from another module's layers
through `import networks`, and a dataset a project method builds in memory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoopt.cli import main

from .fixtures import keep_cwd
from .test_follow_training import _project

pytestmark = pytest.mark.usefixtures(keep_cwd.__name__)


def _findings(script: str, codes: str) -> list[tuple[str, str, int]]:
    result = CliRunner().invoke(
        main, ["lint", "--no-cache", "--output-format", "json", "--select", codes, script]
    )
    assert result.exit_code in (0, 1), result.output
    return sorted(
        (os.path.relpath(f["filename"]).replace(os.sep, "/"), f["code"], f["location"]["row"])
        for f in json.loads(result.stdout)
    )


# MolCLR's utils/nt_xent.py and CurveNet's helpers: a module the script trains, whose forward
# (and what it calls in its module) builds tensors on the host and copies them every step.
LOSS = """
import torch
from torch import nn

def positions(n, device):
    return torch.arange(n).to(device)  # every step

def make_head():
    return Head()

class Head(nn.Module):  # built by NTXent: its forward runs too (Towards-Realtime-MOT's YOLOLayer)
    def forward(self, z):
        return z * torch.ones(1).to(z.device)  # every step

class NTXent(nn.Module):
    def __init__(self, device):
        super().__init__()
        self.device = device
        self.scale = torch.ones(1).to(device)  # once
        self.head = make_head()

    def labels(self, n):
        return torch.zeros(2 * n).to(self.device).long()  # every step

    def forward(self, z):
        if self.reduction == "mean":  # one configuration's branch
            z = z / torch.ones(1).to(z.device)
        z = self.head(z)
        return (z + positions(z.shape[0], z.device)).sum() + self.labels(4).sum()

def unused(n, device):
    return torch.ones(n).to(device)  # never

class Other(nn.Module):  # defined beside it, never built
    def forward(self, z):
        return z + torch.zeros(1).to(z.device)
"""

TRAIN = """
import torch
from loss import NTXent

device = "cuda"
model = torch.nn.Linear(4, 4).to(device)
criterion = NTXent(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    loss = criterion(model(x.to(device)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_models_forward_reports_the_tensors_it_builds_on_the_host(tmp_path: Path) -> None:
    _project(tmp_path, {"loss.py": LOSS, "train.py": TRAIN})
    lines = LOSS.lstrip("\n").splitlines()
    every_step = [i for i, line in enumerate(lines, 1) if line.endswith("# every step")]
    assert len(every_step) == 3
    # not the constructor's, a configuration's branch, a function no forward calls, nor the
    # forward of a class the script never builds
    assert _findings("train.py", "AO608") == [("loss.py", "AO608", i) for i in every_step]


# DRIT: src/model.py's DRIT builds `networks.Dis(...)` after `import networks`; the driver
# builds DRIT and trains it on CUDA.
NETWORKS = """
from torch import nn

class Dis(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.Conv2d(8, 1, 3))

    def forward(self, x):
        return self.layers(x)
"""

MODEL = """
import networks
import torch

class DRIT(torch.nn.Module):
    def __init__(self, opts):
        super().__init__()
        self.dis = networks.Dis()
"""

DRIVER = """
import torch
from model import DRIT

model = DRIT(opts).cuda()
optimizer = torch.optim.Adam(model.parameters())
for x in loader:
    model.dis(x.cuda()).sum().backward()
    optimizer.step()
"""


def test_a_model_made_of_an_imported_modules_convolutions_is_convolutional(
    tmp_path: Path,
) -> None:
    _project(tmp_path, {"networks.py": NETWORKS, "model.py": MODEL, "train.py": DRIVER})
    assert _findings("train.py", "AO601") == [("train.py", "AO601", 4)]
    # the same model of Linear layers: not a convolutional network
    (tmp_path / "networks.py").write_text(NETWORKS.replace("nn.Conv2d", "nn.Linear"))
    assert _findings("train.py", "AO601") == []


# The BERT classifier's pybert/io/bert_processor.py: a method that returns a TensorDataset.
PROCESSOR = """
import torch
from torch.utils.data import TensorDataset

class Processor:
    def create_dataset(self, features):
        ids = torch.tensor(features)
        dataset = TensorDataset(ids, ids)
        return dataset
"""

RUN = """
import torch
from torch.utils.data import DataLoader
from processor import Processor

processor = Processor()
train_dataset = processor.create_dataset(features)
loader = DataLoader(train_dataset, batch_size=32)
model = torch.nn.Linear(4, 2).cuda()
for x, y in loader:
    model(x.cuda()).sum().backward()
"""


def test_a_dataset_a_project_method_builds_in_memory_needs_no_workers(tmp_path: Path) -> None:
    _project(tmp_path, {"processor.py": PROCESSOR, "run.py": RUN})
    assert _findings("run.py", "AO101") == []
    # a dataset class of the project's own: its items may be read from disk
    own = PROCESSOR.replace("dataset = TensorDataset(ids, ids)", "dataset = Records(ids)")
    (tmp_path / "processor.py").write_text(own)
    assert _findings("run.py", "AO101") == [("run.py", "AO101", 7)]


GAN_MODELS = """
from torch import nn

class Generator32(nn.Module):
    def __init__(self, z_dim):
        super().__init__()
        self.main = nn.Sequential(nn.ConvTranspose2d(z_dim, 64, 4), nn.Conv2d(64, 3, 3))

    def forward(self, z):
        return self.main(z.view(-1, self.z_dim, 1, 1))

class Mlp(nn.Module):
    def __init__(self, z_dim):
        super().__init__()
        self.main = nn.Linear(z_dim, 3)
"""

GAN = """
import torch
import models.dcgan as models

net_G_models = {
    'cnn32': models.Generator32,
}
device = torch.device('cuda:0')
net_G = net_G_models[arch](128).to(device)
optim_G = torch.optim.Adam(net_G.parameters())
for z in batches:
    net_G(z.to(device)).mean().backward()
    optim_G.step()
"""


def test_a_model_picked_from_a_dict_of_the_projects_classes_in_the_script(
    tmp_path: Path,
) -> None:
    """pytorch-gan-collections: `net_G_models[FLAGS.arch](z_dim)` where the script's own
    dict names `models.Generator32` of `import source.models.dcgan as models`."""
    _project(tmp_path, {"models/__init__.py": "", "models/dcgan.py": GAN_MODELS, "gan.py": GAN})
    assert _findings("gan.py", "AO601,AO606") == [("gan.py", "AO601", 8), ("gan.py", "AO606", 8)]
    # one entry that is no convolutional network: the table is not one
    two = GAN.replace(
        "'cnn32': models.Generator32,", "'cnn32': models.Generator32, 'mlp': models.Mlp,"
    )
    (tmp_path / "gan.py").write_text(two)
    assert _findings("gan.py", "AO601,AO606") == []


def test_a_model_picked_from_a_dict_the_function_builds(tmp_path: Path) -> None:
    """CurricularFace: `BACKBONE_DICT = {'IR_101': IR_101, ...}` inside `main_worker()`, then
    `backbone = BACKBONE_DICT[name](size)`: the function's own table is read like the
    module's (it was read only at the module's top level)."""
    inside = "def main(arch):\n" + "".join(
        f"    {line}\n" if line else "\n" for line in GAN.strip().splitlines()[2:]
    )
    script = "import torch\nimport models.dcgan as models\n\n" + inside + "\nmain('cnn32')\n"
    _project(tmp_path, {"models/__init__.py": "", "models/dcgan.py": GAN_MODELS, "gan.py": script})
    assert [code for _, code, _ in _findings("gan.py", "AO601,AO606")] == ["AO601", "AO606"]


CRNN_EVALUATE = """
import torch

torch.backends.cudnn.enabled = False

def evaluate(model, loader):
    pass
"""

CRNN_TRAIN = """
import torch
from torch import nn
from evaluate import evaluate

model = nn.Sequential(nn.Conv2d(1, 64, 3), nn.ReLU(), nn.Conv2d(64, 64, 3))
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = model.to(device)
optimizer = torch.optim.Adam(model.parameters())
for x in loader:
    model(x.to(device)).sum().backward()
    optimizer.step()
"""


def test_cudnn_switched_off_by_an_imported_module(tmp_path: Path) -> None:
    """crnn-pytorch: train.py imports evaluate.py, which sets `cudnn.enabled = False` at
    import: the program never runs cuDNN, so neither benchmarking nor channels-last helps."""
    _project(tmp_path, {"evaluate.py": CRNN_EVALUATE, "train.py": CRNN_TRAIN})
    assert _findings("train.py", "AO601,AO606") == []
    (tmp_path / "evaluate.py").write_text(
        CRNN_EVALUATE.replace("enabled = False", "enabled = True")
    )
    assert _findings("train.py", "AO601,AO606") == [
        ("train.py", "AO601", 5),
        ("train.py", "AO606", 7),
    ]


THIN_DP = """
import torch

class DataParallel(torch.nn.DataParallel):
    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)
"""

WAVE_U_NET = """
import torch
import model_utils

model = Net()
if torch.cuda.is_available():
    model = model_utils.DataParallel(model)
    model.cuda()
optimizer = torch.optim.Adam(model.parameters())
for x in loader:
    model(x.cuda()).sum().backward()
    optimizer.step()
"""


def test_a_projects_thin_subclass_of_data_parallel_is_data_parallel(tmp_path: Path) -> None:
    """Wave-U-Net: `model_utils.DataParallel`, a subclass of `nn.DataParallel` adding only
    `__getattr__`: the same scatter, replicate and gather. One with its own gather (a
    tutorial's balanced `DataParallelModel`) is the user's own class."""
    _project(tmp_path, {"model_utils.py": THIN_DP, "train.py": WAVE_U_NET})
    assert _findings("train.py", "AO501") == [("train.py", "AO501", 6)]
    balanced = THIN_DP + "\n    def gather(self, outputs, output_device):\n        return outputs\n"
    (tmp_path / "model_utils.py").write_text(balanced)
    assert _findings("train.py", "AO501") == []


LANE_LOADER = """
import torch

def get_train_loader(batch_size, distributed):
    dataset = LaneClsDataset()
    if distributed:
        sampler = torch.utils.data.distributed.DistributedSampler(dataset)
    else:
        sampler = torch.utils.data.RandomSampler(dataset)
    train_loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=4)
    return train_loader, 56
"""

LANE_TRAIN = """
import torch
import tqdm
from dataloader import get_train_loader

def dist_tqdm(obj, *args, **kwargs):
    return tqdm.tqdm(obj, *args, **kwargs) if is_main() else obj

def inference(net, data_label):
    img, cls_label = data_label
    img, cls_label = img.cuda(), cls_label.long().cuda()
    return net(img), cls_label

def train(net, data_loader, optimizer):
    progress_bar = dist_tqdm(data_loader)
    for b_idx, data_label in enumerate(progress_bar):
        out, label = inference(net, data_label)
        torch.nn.functional.cross_entropy(out, label).backward()
        optimizer.step()

def main():
    torch.distributed.init_process_group(backend="nccl")
    train_loader, cls_num_per_lane = get_train_loader(32, True)
    net = Net().cuda()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for epoch in range(10):
        train(net, train_loader, optimizer)
"""


def test_batches_a_helper_moves_through_a_projects_own_tqdm(tmp_path: Path) -> None:
    """Ultra-Fast-Lane-Detection: the loader comes from a factory (with a DistributedSampler),
    is iterated through the project's `dist_tqdm(data_loader)`, and each batch is handed to
    `inference(net, data_label)`, which moves it with `.cuda()`."""
    _project(tmp_path, {"dataloader.py": LANE_LOADER, "train.py": LANE_TRAIN})
    assert _findings("dataloader.py", "AO102,AO503") == [
        ("dataloader.py", "AO102", 9),
        ("dataloader.py", "AO503", 6),
    ]


F3NET = """
from torch import nn

class F3Net(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 64, 3), nn.ReLU(), nn.Conv2d(64, 1, 3))

    def forward(self, x):
        return self.body(x)
"""

F3NET_TRAIN = """
import torch
import dataset
from net import F3Net

def train(Dataset, Network):
    cfg = Dataset.Config()
    loader = torch.utils.data.DataLoader(Dataset.Data(cfg), batch_size=32, num_workers=8)
    net = Network(cfg)
    net.cuda()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    for image, mask in loader:
        optimizer.zero_grad()
        net(image.cuda()).sum().backward()
        optimizer.step()

if __name__ == "__main__":
    train(dataset, F3Net)
"""


def test_a_model_class_handed_to_the_training_function(tmp_path: Path) -> None:
    """F3Net: `train(dataset, F3Net)`, and `net = Network(cfg)` inside: the class every call
    hands in is the model's (AO601, AO606); two calls handing different classes say nothing."""
    _project(tmp_path, {"net.py": F3NET, "train.py": F3NET_TRAIN})
    assert _findings("train.py", "AO601,AO606") == [
        ("train.py", "AO601", 8),
        ("train.py", "AO606", 9),
    ]
    two = F3NET_TRAIN + "    train(dataset, Mlp)\n"
    (tmp_path / "train.py").write_text(
        two.replace("from net import F3Net", "from net import F3Net, Mlp")
    )
    (tmp_path / "net.py").write_text(F3NET + "\nclass Mlp(nn.Module):\n    pass\n")
    assert _findings("train.py", "AO601,AO606") == []
