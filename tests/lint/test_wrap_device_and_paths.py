"""`--wrap` keeps the script's own device choice and names only objects bound on every path
(issue 21: the call without `device=` moved the model off the script's device on a CUDA
machine; an optimizer created only under a flag raised NameError when the flag was off)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from autoopt.lint.wrap.insert import wrap_source


def _inserted(code: str) -> list[str]:
    result = wrap_source(textwrap.dedent(code).lstrip("\n"))
    assert not result.declined, result.message
    return [line.strip() for line in result.source.splitlines() if "autoopt.optimize(" in line]


def test_model_placed_in_each_branch_keeps_that_device() -> None:
    """word_language_model / yolov5: the architecture is chosen in an if/else, each branch
    places the model with the script's own `.to(device)`."""
    calls = _inserted(
        """
        import torch
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if args.model == "Transformer":
            model = TransformerModel(args.emsize).to(device)
        else:
            model = RNNModel(args.emsize).to(device)
        optimizer = torch.optim.AdamW(model.parameters())
        for x, y in batches():
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        """
    )
    assert calls == [
        "model, optimizer = autoopt.optimize(model, optimizer=optimizer, device=device)"
    ]


def test_branches_placing_on_different_devices_leave_the_choice_to_optimize() -> None:
    calls = _inserted(
        """
        import torch
        if args.big:
            model = Big().to("cuda:1")
        else:
            model = Small().to(device)
        optimizer = torch.optim.AdamW(model.parameters())
        for x, y in batches():
            loss_fn(model(x), y).backward()
            optimizer.step()
        """
    )
    assert len(calls) == 1 and "device=" not in calls[0]


def test_optimizer_bound_only_under_a_flag_is_not_passed() -> None:
    """pytorch/examples word_language_model: `if args.use_optimizer: optimizer = AdamW(...)`,
    else the script steps the parameters by hand. Passing `optimizer` raises NameError without
    the flag: the model goes alone, in fp32."""
    calls = _inserted(
        """
        import torch
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = RNNModel().to(device)
        if args.use_optimizer:
            optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        for x, y in batches():
            model.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            if args.use_optimizer:
                optimizer.step()
            else:
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-args.lr)
        """
    )
    assert len(calls) == 1
    assert calls[0].startswith('model = autoopt.optimize(model, device=device, amp="script")')
    assert "`optimizer` exists only on some paths" in calls[0]


def test_optimizer_chosen_by_an_if_elif_chain_the_loop_steps_is_passed() -> None:
    """federated-learning's baseline_main.py: `if args.optimizer == "sgd": optimizer = SGD(...)`
    / `elif args.optimizer == "adam": optimizer = Adam(...)`, no `else`, and the loop calls
    `optimizer.step()` unconditionally: any other choice raises there anyway, so the call
    passes the optimizer. A loop that steps it only under a flag does not count."""
    script = """
        import torch
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if __name__ == "__main__":
            model = Net().to(device)
            if args.optimizer == "sgd":
                optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
            elif args.optimizer == "adam":
                optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
            for x, y in batches():
                optimizer.zero_grad()
                loss_fn(model(x.to(device)), y.to(device)).backward()
                optimizer.step()
        """
    assert _inserted(script) == [
        "model, optimizer = autoopt.optimize(model, optimizer=optimizer, device=device)"
    ]
    flagged = script.replace("                optimizer.zero_grad()\n", "").replace(
        "                optimizer.step()",
        "                if args.step:\n                    optimizer.step()",
    )
    (call,) = _inserted(flagged)
    assert "`optimizer` exists only on some paths" in call
    # handed to the model's own step method outside any `if` (DeepVO's
    # `M_deepvo.step(t_x, t_y, optimizer)`): a path that binds none raises there too
    handed = script.replace(
        "                optimizer.zero_grad()\n"
        "                loss_fn(model(x.to(device)), y.to(device)).backward()\n"
        "                optimizer.step()",
        "                model.step(x.to(device), y.to(device), optimizer)",
    ).replace(
        "        import torch\n",
        "        import torch\n"
        "        class Net(torch.nn.Module):\n"
        "            def step(self, x, y, optimizer):\n"
        "                optimizer.zero_grad()\n"
        "                loss = loss_fn(self(x), y)\n"
        "                loss.backward()\n"
        "                optimizer.step()\n"
        "                return loss\n",
    )
    assert "model.step(" in handed and "def step" in handed
    assert _inserted(handed) == [
        "model, optimizer = autoopt.optimize(model, optimizer=optimizer, device=device)"
    ]


TRAINER_MODULE = """
class Trainer:
    def __init__(self, *args, **kwargs):
        self.model = kwargs["model"]
        self.optimizer = kwargs.get("optimizer")
        self.device = kwargs["device"]

    def train(self, train_loader):
        for epoch in range(10):
            for images, labels in train_loader:
                loss = self.model(images.to(self.device)).sum()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
"""

ENTRY = """
import torch
from torch.utils.data import DataLoader
from trainer import Trainer

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = ResNetSimCLR(base_model="resnet18").to(device)
optimizer = torch.optim.Adam(model.parameters(), 3e-4)
loader = DataLoader(ds, batch_size=256, shuffle=True, drop_last=True)
simclr = Trainer(model=model, optimizer=optimizer, device=device)
simclr.train(loader)
"""


def test_objects_handed_to_a_trainer_class_through_kwargs(tmp_path: Path) -> None:
    """SimCLR-style: the entry file builds model, optimizer and loader and hands them to a
    trainer class of another module as keyword arguments (`self.optimizer =
    kwargs["optimizer"]`): the optimizer is created in the entry file, so it is wrapped there
    (it was declined as "created in another module")."""
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "trainer.py").write_text(TRAINER_MODULE)
    (tmp_path / "run.py").write_text(ENTRY)
    result = wrap_source(ENTRY, path=tmp_path / "run.py")
    assert not result.declined, result.message
    assert (
        "drop_last=True)\n"
        "model, loader, optimizer = autoopt.optimize(model, loader, optimizer, device=device)\n"
        "simclr = Trainer("
    ) in result.source


def test_branches_and_a_later_guarded_placement_on_the_same_device() -> None:
    """yolov5: `.to(device)` in both branches of `if pretrained:`, later `if cuda and RANK !=
    -1:` re-places the SyncBatchNorm-converted model on the same device."""
    calls = _inserted(
        """
        import torch
        def train(hyp, opt, device):
            if pretrained:
                model = Model(cfg).to(device)
            else:
                model = Model(cfg).to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            if cuda and RANK != -1:
                model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model).to(device)
            for x, y in loader:
                loss_fn(model(x.to(device)), y).backward()
                optimizer.step()
        """
    )
    assert len(calls) == 1 and "device=device" in calls[0]


def test_a_bare_cuda_after_set_device_is_a_move_the_call_cannot_name() -> None:
    """point-transformer: the optimizer first, then `torch.cuda.set_device(gpu)` and
    `DistributedDataParallel(model.cuda(), device_ids=[gpu])`; `device="cuda"` at the call
    would be GPU 0 on every rank."""
    result = wrap_source(
        textwrap.dedent(
            """
            import torch

            def main_worker(gpu, args):
                model = Net()
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                if args.distributed:
                    torch.cuda.set_device(gpu)
                    model = torch.nn.parallel.DistributedDataParallel(
                        model.cuda(), device_ids=[gpu]
                    )
                else:
                    model = torch.nn.DataParallel(model.cuda())
                for x, y in loader:
                    optimizer.zero_grad()
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            """
        ).lstrip("\n")
    )
    assert result.declined
    assert "on a device the call cannot name there" in result.message
