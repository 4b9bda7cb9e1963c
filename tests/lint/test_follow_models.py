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
