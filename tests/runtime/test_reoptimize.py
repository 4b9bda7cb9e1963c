"""optimize() on a new container holding a module or an optimizer that optimize() already patched:
a clear error up front, naming the fix, with nothing changed (before the check, a second step
chain called itself at `step()`, or the steps were silently skipped)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autoopt

FP16 = {"amp": "fp16", "compile": False, "channels_last": False, "checkpoint": False}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, object]:
    """What a second optimize() could change: attributes, forwards, parameters, the step."""
    return {
        "modules": [(name, dict(m.__dict__)) for name, m in model.named_modules()],
        "params": [(p, p.data.clone()) for p in model.parameters()],
        "opt": dict(opt.__dict__),
        "groups": [dict(g) for g in opt.param_groups],
    }


def _assert_unchanged(before: dict[str, object], model: nn.Module, opt: torch.optim.Optimizer):
    after = _state(model, opt)
    assert [(n, d.keys()) for n, d in before["modules"]] == [  # type: ignore[union-attr]
        (n, d.keys())
        for n, d in after["modules"]  # type: ignore[union-attr]
    ]
    for (_, d0), (_, d1) in zip(before["modules"], after["modules"], strict=True):  # type: ignore[call-overload]
        assert all(d0[k] is d1[k] for k in d0)
    for (p, data), (q, _) in zip(before["params"], after["params"], strict=True):  # type: ignore[call-overload]
        assert p is q and torch.equal(p.data, data)
    assert before["opt"].keys() == after["opt"].keys()  # type: ignore[attr-defined]
    assert all(before["opt"][k] is after["opt"][k] for k in before["opt"])  # type: ignore[index]
    assert before["groups"] == after["groups"]


def _train(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        x, y = torch.randn(16, 8, generator=gen), torch.randint(0, 2, (16,), generator=gen)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def test_a_new_container_over_a_patched_optimizer_is_refused_up_front() -> None:
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net, opt = autoopt.optimize(net, optimizer=opt, verbose=False, **FP16)
    box = nn.Sequential()  # the same submodules (so the same parameters) in a new container
    box.add_module("body", net.body)
    box.add_module("relu", nn.ReLU())
    box.add_module("head", net.head)
    before = _state(box, opt)
    with pytest.raises(ValueError, match=r"optimizer was already given to optimize\(\).*new opt"):
        autoopt.optimize(box, optimizer=opt, verbose=False, **FP16)
    _assert_unchanged(before, box, opt)
    # The first optimize() still trains (its step chain was not replaced).
    start = [p.detach().clone() for p in net.parameters()]
    _train(net, opt)
    assert not all(torch.equal(a, b) for a, b in zip(start, net.parameters(), strict=True))


def test_a_container_of_an_optimized_model_is_refused_up_front() -> None:
    torch.manual_seed(0)
    net = Net()
    net, _ = autoopt.optimize(
        net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), verbose=False, **FP16
    )
    box = nn.Sequential(net, nn.Linear(2, 2))
    opt = torch.optim.SGD(box.parameters(), lr=0.1)  # a fresh optimizer: only the model is reused
    before = _state(box, opt)
    with pytest.raises(ValueError, match=r"submodule '0'.*plain modules"):
        autoopt.optimize(box, optimizer=opt, verbose=False, **FP16)
    _assert_unchanged(before, box, opt)


def test_optimizing_the_container_of_plain_modules_still_works() -> None:
    torch.manual_seed(0)
    box = nn.Sequential(Net(), nn.Linear(2, 2))
    opt = torch.optim.SGD(box.parameters(), lr=0.1)
    box, opt = autoopt.optimize(box, optimizer=opt, verbose=False, **FP16)
    start = [p.detach().clone() for p in box.parameters()]
    _train(box, opt)
    assert all(not torch.equal(a, b) for a, b in zip(start, box.parameters(), strict=True))
