"""`rewrite --wrap` on scripts shaped like real ones (tests/lint/fixtures/wrap/): what is
inserted, where, or why the script is declined."""

from __future__ import annotations

import difflib
from pathlib import Path

import libcst as cst
import pytest

from autoopt.lint.wrap import wrap_source

FIXTURES = Path(__file__).parent / "fixtures" / "wrap"


def insertions(old: str, new: str) -> list[tuple[str, str]]:
    """(line before, inserted line) for each line `new` adds to `old`; nothing is removed."""
    out: list[tuple[str, str]] = []
    before = ""
    for line in difflib.ndiff(old.splitlines(), new.splitlines()):
        assert not line.startswith("- "), f"a line was removed: {line}"
        if line.startswith("+ "):
            out.append((before.strip(), line[2:]))
        elif line.startswith("  "):
            before = line[2:]
    return out


IMPORT = "import autoopt"

WRAPPED = {
    "main_train_split.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "train_loader = DataLoader(data, batch_size=16)",
            "    model, train_loader, optimizer = autoopt.optimize(model, train_loader, optimizer)",
        ),
    ],
    "factory_optimizer.py": [
        ("from torch.utils.data import DataLoader", IMPORT),
        (
            "loader = DataLoader(list(torch.randn(32, 8)), batch_size=8)",
            "model, loader, optimizer = autoopt.optimize(model, loader, optimizer, amp=False)"
            "  # autoopt: amp=False (own autocast/GradScaler)",
        ),
    ],
    "optimizer_choice.py": [
        ("from torch.utils.data import DataLoader", IMPORT),
        (
            "loader = DataLoader(torch.randn(16, 4), batch_size=4)",
            "net, loader, opt = autoopt.optimize(net, loader, opt)",
        ),
    ],
    "gan.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "dataloader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=16)",
            "generator, dataloader, optimizer_G = autoopt.optimize(generator, dataloader, "
            "optimizer_G)",
        ),
        (
            "dataloader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=16)",
            "discriminator, optimizer_D = autoopt.optimize(discriminator, optimizer=optimizer_D)",
        ),
    ],
    "helper_module/train.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "data_loader = DataLoader(data, batch_size=12)",
            "    model, data_loader, optimizer = autoopt.optimize(model, data_loader, optimizer)",
        ),
    ],
    "get_batch.py": [
        ("import torch", IMPORT),
        (
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)",
            "model, optimizer = autoopt.optimize(model, optimizer=optimizer)",
        ),
    ],
    "trainer_class.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "train_data = DataLoader(dataset, batch_size=8)",
            "    model, train_data, optimizer = autoopt.optimize(model, train_data, optimizer)",
        ),
    ],
    "own_amp.py": [
        ("from torch.utils.data import DataLoader", IMPORT),
        (
            "loader = DataLoader(torch.randn(32, 8), batch_size=8)",
            "model, loader, optimizer = autoopt.optimize(model, loader, optimizer, amp=False)"
            "  # autoopt: amp=False (own autocast/GradScaler)",
        ),
    ],
    "own_ddp.py": [
        ("from torch.nn.parallel import DistributedDataParallel as DDP", IMPORT),
        (
            "loader = torch.utils.data.DataLoader(torch.randn(32, 8), batch_size=8)",
            "    model, loader, optimizer = autoopt.optimize(model, loader, optimizer, "
            "distributed=False)  # autoopt: distributed=False (own DDP/FSDP/DataParallel wrap)",
        ),
    ],
    "compiled.py": [
        ("import torch", IMPORT),
        (
            "loader = torch.utils.data.DataLoader(torch.randn(32, 8), batch_size=8)",
            "model, loader, optimizer = autoopt.optimize(model, loader, optimizer, "
            "compile=False)  # autoopt: compile=False (own torch.compile)",
        ),
    ],
    "mnist_device.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)",
            "    model, train_loader, optimizer = autoopt.optimize(model, train_loader, optimizer, "
            "device=device)",
        ),
    ],
    "config_device.py": [
        ("import torch", IMPORT),
        (
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)",
            "model, optimizer = autoopt.optimize(model, optimizer=optimizer, device=device)",
        ),
    ],
    "args_device.py": [
        ("from torch.utils.data import DataLoader", IMPORT),
        (
            "loader = DataLoader(torch.randn(48, 8), batch_size=16)",
            "model, loader, optimizer = autoopt.optimize(model, loader, optimizer, "
            "device=args.device)",
        ),
    ],
    "iter_next.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "train_loader = DataLoader(self.dataset, batch_size=8, shuffle=True)",
            "        model, train_loader, self.optimizer = autoopt.optimize(model, train_loader, "
            "self.optimizer)",
        ),
    ],
    "shared_optimizer.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        *[
            (
                "dataloader = DataLoader(TensorDataset(torch.randn(48, 8), torch.randn(48, 8)), "
                "batch_size=16)",
                line + "  # autoopt: amp=False (an optimizer spans several models)",
            )
            for line in (
                "D_A, dataloader, optimizer_D_A = autoopt.optimize(D_A, dataloader, "
                "optimizer_D_A, amp=False)",
                "G_AB = autoopt.optimize(G_AB, amp=False)",
                "G_BA = autoopt.optimize(G_BA, amp=False)",
            )
        ],
    ],
}

DECLINED = {
    "accelerate_script.py": ("already uses Accelerate", "accelerator.prepare"),
    "hogwild.py": ("Hogwild", "shared memory"),
    "ddp_before_optimizer.py": (
        "model wrapped in DDP/FSDP before the optimizer",
        "optimize() must get the bare model",
    ),
}


def wrap_fixture(name: str):
    path = FIXTURES / name
    return path.read_text(), wrap_source(path.read_text(), path=path)


@pytest.mark.parametrize("name", sorted(WRAPPED))
def test_inserts_the_call_where_the_objects_exist(name: str) -> None:
    source, result = wrap_fixture(name)
    assert not result.declined, result.message
    assert insertions(source, result.source) == WRAPPED[name]
    cst.parse_module(result.source)
    # Idempotent: a second run changes nothing.
    again = wrap_source(result.source, path=FIXTURES / name)
    assert not again.changed and again.message == "already calls autoopt.optimize()"


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_declines_scripts_that_already_do_it_their_way(name: str) -> None:
    source, result = wrap_fixture(name)
    reason, detail = DECLINED[name]
    assert result.declined and result.source == source
    assert result.reason == reason
    assert detail in result.message


def test_the_loop_in_a_local_module_is_found_only_through_that_module(tmp_path: Path) -> None:
    """Without engine.py beside it, the script has no backward: the helper was what counted."""
    script = (FIXTURES / "helper_module" / "train.py").read_text()
    (tmp_path / "train.py").write_text(script)
    result = wrap_source(script, path=tmp_path / "train.py")
    assert result.declined and result.reason == "no training loop"
