"""The shared "can this script run on a GPU" fact (autoopt.lint.program.device)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from autoopt.lint.program.facts import FileFacts


def _device(source: str):  # type: ignore[no-untyped-def]
    module = cst.parse_module(textwrap.dedent(source))
    return FileFacts(cst.MetadataWrapper(module)).device


@pytest.mark.parametrize(
    "source",
    [
        'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")',
        "model = Net().cuda()",
        "device = torch.accelerator.current_accelerator()",
        "use_accel = torch.accelerator.is_available()",
        "cuda = True if torch.cuda.is_available() else False",
        'device = f"cuda:{rank}"',
        'x = x.to("mps")',
        "parser.add_argument('--no-accel', action='store_true')",
        "parser.add_argument('--device', default='cpu')",
        "def train(model, device, loader):\n    model.to(device)",
        "from accelerate import Accelerator\naccelerator = Accelerator()",
        'def train(config):\n    device = torch.device(config["device"])',  # DDPM's config
        "model.to(dist_util.dev())",  # guided-diffusion's helper picks the device
        # Lightning places model and batches on the GPUs its Trainer is told to use
        "import pytorch_lightning as pl\ntrainer = pl.Trainer(gpus=NUM_GPUS)",
        'import lightning as L\ntrainer = L.Trainer(accelerator="gpu", devices=2)',
        "from pytorch_lightning import Trainer\nt = Trainer(accelerator=args.accelerator)",
    ],
)
def test_gpu_path(source: str) -> None:
    facts = _device(source)
    assert facts.gpu_path and facts.why


@pytest.mark.parametrize(
    "source",
    [
        "model = nn.Linear(3, 1)\nfor x, y in loader:\n    model(x).sum().backward()",
        'device = torch.device("cpu")\ndef train(model, device):\n    model.to(device)',
        '"""Train on cuda if you have one."""\n# model.cuda()\nmodel = Net()',
        'trainer = Trainer(accelerator="cpu")',
        'name = "cpu"\ndevice = torch.device(name)',
        "version = packaging.dev(3)",  # a `dev` that takes arguments picks no device
        "import pytorch_lightning as pl\ntrainer = pl.Trainer(gpus=0, max_epochs=5)",
        'import lightning as L\ntrainer = L.Trainer(accelerator="cpu")',
        "trainer = Trainer(gpus=2)",  # no Lightning imported: some other Trainer
    ],
)
def test_no_gpu_path(source: str) -> None:
    assert not _device(source).gpu_path


def test_legacy_tensor_type_names() -> None:
    facts = _device(
        """
        cuda = torch.cuda.is_available()
        Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
        LongTensor = torch.cuda.LongTensor if cuda else torch.LongTensor
        Other = torch.FloatTensor
        """
    )
    assert facts.tensor_type_names == {"Tensor", "LongTensor"}


def test_a_device_attribute_set_from_the_configuration() -> None:
    """denoiser's Solver: `self.device = args.device` (the device a config or flag chose),
    then batches `.to(self.device)`: a GPU path, as `torch.device(args.device)` is."""
    solver = """
    class Solver:
        def __init__(self, args):
            self.device = args.device
    """
    assert _device(solver).gpu_path
    assert _device(solver.replace("args.device", 'cfg["device"]')).gpu_path
    assert not _device(solver.replace("args.device", "args.seed")).gpu_path
