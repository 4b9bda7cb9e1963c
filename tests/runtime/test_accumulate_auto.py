"""accumulate="auto": each batch stays one optimizer step, split into the fewest micro-batches
that fit memory_budget; the parameters equal the full batch's (plain torch), schedulers step
once per batch, and the pass stands down (warning + report line) where it cannot keep that."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

import autoopt
from autoopt.runtime.accumulation.micro_batches import choose_parts, part_sizes
from autoopt.runtime.memory import format_bytes, saved_tensor_bytes, state_memory
from autoopt.runtime.report import Status
from tests.runtime.checkpoint_models import GPT
from tests.runtime.torchrun import load_worker, run_two_processes

OFF = {"amp": False, "compile": False, "channels_last": False}
SAMPLES, BATCH, PART = 232, 64, 16  # batches 64, 64, 64, 40
WORKER = Path(__file__).with_name("accumulate_auto_worker.py")


def _net(norm: bool = False) -> nn.Module:
    torch.manual_seed(0)
    middle = nn.BatchNorm1d(32) if norm else nn.Identity()
    return nn.Sequential(nn.Linear(8, 32), middle, nn.Tanh(), nn.Linear(32, 1))


def _data() -> TensorDataset:
    gen = torch.Generator().manual_seed(1)
    return TensorDataset(
        torch.randn(SAMPLES, 8, generator=gen), torch.randn(SAMPLES, 1, generator=gen)
    )


def _loader() -> DataLoader:
    return DataLoader(_data(), batch_size=BATCH)


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _budget_for(model: nn.Module, optimizer: torch.optim.Optimizer, rows: int) -> int:
    """State + what the plain forward saves on `rows` rows of a batch, halfway to `rows + 1`:
    parts of `rows` fit, parts of `rows + 1` do not. Rows are views of a whole batch, as the
    loader's parts are (the batch's storage is held while its parts train)."""
    batch = _data().tensors[0][:BATCH].clone()
    saved = [saved_tensor_bytes(lambda n=n: model(batch[:n])) for n in (rows, rows + 1)]
    return state_memory(model, optimizer).state + sum(saved) // 2


def _train_plain(model: nn.Module, make_opt=_sgd, scheduler: bool = False) -> nn.Module:
    opt = make_opt(model)
    scheds = [_step_lr(opt), _multiplicative_lr(opt)] if scheduler else []
    for x, y in _loader():
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        for sched in scheds:
            sched.step()
    return model


def _step_lr(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def _multiplicative_lr(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.MultiplicativeLR(opt, lambda epoch: 0.9)


def _assert_same(got: nn.Module, want: nn.Module) -> None:
    for a, b in zip(got.parameters(), want.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def _optimize_auto(model: nn.Module, make_opt=_sgd, **options: Any) -> tuple[Any, Any, Any]:
    opt = make_opt(model)
    options.setdefault("memory_budget", _budget_for(model, opt, PART))
    return autoopt.optimize(
        model, _loader(), opt, accumulate="auto", verbose=False, **OFF, **options
    )


def _train(model: nn.Module, loader: Any, opt: torch.optim.Optimizer) -> list[int]:
    """The user's unchanged loop; returns the rows of every batch it saw."""
    rows = []
    for x, y in loader:
        rows.append(len(x))
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return rows


def test_four_micro_batches_give_the_full_batch_parameters_and_say_why() -> None:
    want = _train_plain(_net())
    model, loader, opt = _optimize_auto(_net())
    rows = _train(model, loader, opt)
    # The first batch: probes of 2 rows and of each alone (gradients zeroed), then the batch in
    # 4 parts; the uneven last batch (40 rows) in 3 parts of at most 16.
    assert rows == [2, 1, 1] + [16] * 12 + [14, 13, 13]
    assert len(loader) == 4  # batches: optimizer steps
    _assert_same(model, want)
    result = autoopt.report(model)["accumulate"]
    assert result.status is Status.APPLIED
    batch = _data().tensors[0][:BATCH].clone()
    per_row = saved_tensor_bytes(lambda: model(batch[:2])) - saved_tensor_bytes(
        lambda: model(batch[:1])
    )
    assert "4 micro-batches of <= 16 samples per batch of 64" in result.detail
    assert f"+ {format_bytes(per_row)} per sample" in result.detail
    assert "seeded with its share of the samples, the normaliser the loss" in result.detail


def test_adam_with_clipping_in_the_loop() -> None:
    """Clipping acts on the last part only, on the whole batch's gradient."""

    def adam(model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.Adam(model.parameters(), lr=1e-2)

    plain = _net()
    opt = adam(plain)
    for x, y in _loader():
        opt.zero_grad()
        F.mse_loss(plain(x), y).backward()
        nn.utils.clip_grad_norm_(plain.parameters(), 0.5)
        opt.step()
    model, loader, opt = _optimize_auto(_net(), adam)
    for x, y in loader:
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
    _assert_same(model, plain)


def test_schedulers_step_once_per_batch() -> None:
    want = _train_plain(_net(), scheduler=True)
    model = _net()
    opt = _sgd(model)
    before = _step_lr(opt)  # made before optimize()
    budget = _budget_for(model, opt, PART)
    model, loader, opt = autoopt.optimize(
        model, _loader(), opt, accumulate="auto", memory_budget=budget, verbose=False, **OFF
    )
    after = _multiplicative_lr(opt)  # made after (the two chain)
    micro_batches = 0
    for x, y in loader:
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        before.step()  # every iteration, i.e. every micro-batch
        after.step()
        micro_batches += 1
    assert micro_batches == 18
    assert before.last_epoch == after.last_epoch == 4
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * (0.5 * 0.9) ** 4)
    _assert_same(model, want)


def test_checkpointing_comes_first_then_micro_batches_fit_what_it_cannot() -> None:
    """A GPT with its blocks in an nn.ModuleList: a budget the full batch meets with every block
    checkpointed keeps batches whole (checkpointing does it); one that needs parts of 4 rows
    even with every block checkpointed gets 4 parts, and the checkpoint plan is made for them."""

    class Checkpointed(nn.Module):
        def __init__(self, block: nn.Module) -> None:
            super().__init__()
            self.block = block

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.block, x, mask=mask, use_reentrant=False)

    def gpt() -> nn.Module:
        torch.manual_seed(0)
        return GPT(layers=3, width=16)

    tokens = torch.randint(0, 32, (40, 12), generator=torch.Generator().manual_seed(2))
    all_full = gpt()
    all_full.blocks = nn.ModuleList(Checkpointed(b) for b in all_full.blocks)
    batch = tokens[:16].clone()

    def budget(rows: int, opt: torch.optim.Optimizer) -> int:
        saved = [saved_tensor_bytes(lambda n=n: all_full(batch[:n])) for n in (rows, rows + 1)]
        return state_memory(all_full, opt).state + sum(saved) // 2

    def lm_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x)[:, :-1].reshape(-1, 32), x[:, 1:].reshape(-1))

    plain = gpt()
    opt = _sgd(plain)
    for (x,) in DataLoader(TensorDataset(tokens), batch_size=16):
        opt.zero_grad()
        lm_loss(plain, x).backward()
        opt.step()
    for rows, parts in ((16, 1), (4, 4)):
        model = gpt()
        opt = _sgd(model)
        loader = DataLoader(TensorDataset(tokens), batch_size=16)
        model, loader, opt = autoopt.optimize(
            model,
            loader,
            opt,
            accumulate="auto",
            memory_budget=budget(rows, opt),
            verbose=False,
            **OFF,
        )
        seen, saved = [], []
        for (x,) in loader:
            seen.append(len(x))
            opt.zero_grad()
            out: list[torch.Tensor] = []
            saved.append(saved_tensor_bytes(lambda m=model, x=x, out=out: out.append(m(x))))
            F.cross_entropy(out[0][:, :-1].reshape(-1, 32), x[:, 1:].reshape(-1)).backward()
            opt.step()
        # No micro-batch, probes included (their forward runs in eval mode), holds more than
        # the budget allows.
        limit = budget(rows, _sgd(gpt())) - state_memory(model, opt).state
        assert max(saved) <= limit
        report = autoopt.report(model)
        assert report["checkpoint"].status is Status.APPLIED  # blocks.0-2 checkpointed
        if parts == 1:
            assert seen == [2, 16, 16, 8]  # the probe, then whole batches
            assert report["accumulate"].status is Status.SKIPPED
            assert "a batch of 16 samples fits" in report["accumulate"].detail
        else:
            assert seen == [2, 1, 1] + [4] * 10
            assert "4 micro-batches of <= 4 samples" in report["accumulate"].detail
            assert "with every block checkpointed" in report["accumulate"].detail
        _assert_same(model, plain)


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("batchnorm", "BatchNorm1d: its batch statistics would change"),
        ("no budget", "memory_budget=None: no limit"),
        ("auto budget on cpu", "memory_budget='auto' sets no limit on cpu"),
        ("unsplittable batches", "cannot be split without guessing"),
    ],
)
def test_stands_down_with_a_warning_and_keeps_batches_whole(case: str, match: str) -> None:
    model = _net(norm=case == "batchnorm")
    want = _train_plain(copy.deepcopy(model))
    opt = _sgd(model)
    budget = {"no budget": None, "auto budget on cpu": "auto"}.get(case, 10_000)
    loader: Any = _loader()
    if case == "unsplittable batches":  # a batch that carries names: no way to cut them too
        loader = [(x, y, [f"sample {i}" for i in range(len(x))]) for x, y in loader]
    with pytest.warns(UserWarning, match=match):
        model, loader, opt = autoopt.optimize(
            model, loader, opt, accumulate="auto", memory_budget=budget, verbose=False, **OFF
        )
        rows = [len(batch[0]) for batch in _steps(model, loader, opt)]
    assert rows == [64, 64, 64, 40]
    result = autoopt.report(model)["accumulate"]
    assert result.status is Status.SKIPPED and "stood down" in result.detail
    assert match in result.detail
    _assert_same(model, want)


def test_no_training_forward_on_the_probe_stands_down_mid_batch_exactly() -> None:
    """A loop that trains in eval mode (no dropout/batch norm to switch) never gives the probe a
    training forward: the probe's gradient is zeroed and the first batch comes whole, so the
    first step is still the full batch's."""
    want = _train_plain(_net())
    model, loader, opt = _optimize_auto(_net())
    model.eval()
    with pytest.warns(UserWarning, match="no training forward of the model ran"):
        rows = _train(model, loader, opt)
    assert rows == [2, 64, 64, 64, 40]
    _assert_same(model, want)


def _steps(model: nn.Module, loader: Any, opt: torch.optim.Optimizer) -> list[Any]:
    seen = []
    for batch in loader:
        seen.append(batch)
        opt.zero_grad()
        F.mse_loss(model(batch[0]), batch[1]).backward()
        opt.step()
    return seen


def test_choose_parts_takes_the_fewest_that_fit() -> None:
    # state 100, saved 10 + 3 per row: parts of 16 rows fit 158, 17 do not.
    choice = choose_parts(64, 100, 13, 16, 158)
    assert (choice.parts, choice.part_rows, choice.step_bytes, choice.excess) == (4, 16, 158, 0)
    assert choose_parts(64, 100, 13, 16, 10**6).parts == 1
    tight = choose_parts(64, 100, 13, 16, 105)  # not even one row fits
    assert (tight.parts, tight.part_rows, tight.excess) == (64, 1, 8)
    assert "still exceeds the budget by 8 B" in tight.render()
    uneven = choose_parts(10, 100, 13, 16, 122)  # 4 rows fit: 3 parts of 4, 3, 3
    assert (uneven.parts, uneven.part_rows) == (3, 4)
    assert part_sizes(62, 16) == [16, 16, 15, 15] and part_sizes(40, 16) == [14, 13, 13]


@pytest.mark.slow
def test_ddp_two_processes_equal_one_process_on_the_global_batch(tmp_path: Path) -> None:
    r0, r1 = run_two_processes(WORKER, tmp_path, timeout=180)
    worker = load_worker(WORKER)
    assert r0["final"] == r1["final"]
    assert r0["rows"] == r1["rows"] == worker.EXPECTED_ROWS
    assert r0["syncs"] == r1["syncs"] == worker.SAMPLES // (2 * worker.BATCH)  # one per batch
    assert "DDP all-reduces on the last micro-batch only" in r0["report"]
    # One process, the global batch: both ranks' shards of every step, one mean loss.
    data = worker.make_data()
    model = worker.make_model()
    opt = worker.make_optimizer(model)
    for step in range(worker.SAMPLES // (2 * worker.BATCH)):
        idx = torch.arange(step * 2 * worker.BATCH, (step + 1) * 2 * worker.BATCH)
        x, y = data[idx]
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(torch.tensor(r0["final"][name]), value, atol=1e-6, rtol=1e-5)


def test_probe_backward_leaves_every_grad_as_it_was() -> None:
    """A probe's backward adds nothing: a `.grad` that was None stays None (eager's first
    backward creates it), one that held values keeps them."""
    from autoopt.runtime.accumulation.micro_batches import _zero_parameter_gradients

    model = _net()
    first, last = model[0], model[3]
    last.weight.grad = torch.ones_like(last.weight)
    with _zero_parameter_gradients(model):
        model(torch.randn(4, 8)).sum().backward()
    assert first.weight.grad is None and first.bias.grad is None
    assert torch.equal(last.weight.grad, torch.ones_like(last.weight))
