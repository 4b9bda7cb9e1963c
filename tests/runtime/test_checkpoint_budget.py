"""checkpoint="auto" under a memory budget: which blocks, exact bytes, exact gradients, report."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.checkpointing.block_checkpoint import STATE_ATTR, Mode, run_block
from autoopt.runtime.checkpointing.checkpoint_plan import (
    BlockCost,
    CheckpointPlan,
    choose_modes,
    describe_blocks,
    memory_plan,
    plan,
)
from autoopt.runtime.memory import saved_tensor_bytes, state_memory
from autoopt.runtime.passes import compile as compile_pass
from autoopt.runtime.report import Status
from tests.runtime.checkpoint_models import GPT, ResNet


def _tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 32, (4, 24), generator=torch.Generator().manual_seed(seed))


def _optimize(
    model: nn.Module, budget: int | str | None
) -> tuple[nn.Module, torch.optim.Optimizer]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return autoopt.optimize(
        model,
        None,
        optimizer,
        amp=False,
        compile=False,
        channels_last=False,  # its different conv kernels would differ from eager by ~1e-6
        memory_budget=budget,
        verbose=False,
    )


def _budget(model: nn.Module, x: torch.Tensor, activations: float) -> tuple[int, int]:
    """(state bytes with AdamW, eager's saved bytes) and a budget leaving `activations` of them."""
    state = state_memory(model, torch.optim.AdamW(model.parameters())).state
    eager = saved_tensor_bytes(lambda: model(x))
    return state + int(activations * eager), eager


def _modes(model: nn.Module) -> list[Mode]:
    return [getattr(b, STATE_ATTR).mode for b in model.blocks]


def test_choose_modes_takes_the_fewest_blocks_then_selective_where_it_fits() -> None:
    costs = [BlockCost(plain=100, selective=40, full=10)] * 4
    base = 1000  # state + activations with every block fully checkpointed
    assert choose_modes(costs, base, budget=1360) == [Mode.PLAIN] * 4  # 1000 + 4 * 90 fits
    # 90 bytes over: one block; its selective extra (30) still fits.
    assert choose_modes(costs, base, budget=1300) == [Mode.SELECTIVE] + [Mode.PLAIN] * 3
    # 140 over: two blocks; with both selective it would be 20 over budget, so one stays full.
    assert choose_modes(costs, base, budget=1220) == [
        Mode.FULL,
        Mode.SELECTIVE,
        Mode.PLAIN,
        Mode.PLAIN,
    ]
    assert choose_modes(costs, base, budget=999) == [Mode.FULL] * 4  # nothing fits: all of them
    # The block that saves most goes first.
    uneven = [BlockCost(50, 20, 10), BlockCost(500, 400, 10)]
    assert choose_modes(uneven, 0, budget=100) == [Mode.PLAIN, Mode.FULL]


def test_an_unmeetable_budget_checkpoints_only_the_blocks_that_save_something() -> None:
    """A block whose checkpoint keeps as much as it saves plainly (its output is all it keeps)
    would only add recomputation: it stays plain even when nothing fits (issue 23)."""
    costs = [BlockCost(100, 40, 10), BlockCost(10, 10, 10), BlockCost(100, 40, 10)]
    assert choose_modes(costs, 1000, budget=999) == [Mode.FULL, Mode.PLAIN, Mode.FULL]


def test_fewest_blocks_bring_the_step_under_the_budget_with_exact_bytes() -> None:
    torch.manual_seed(0)
    plain = GPT(layers=6)
    x = _tokens()
    budget, eager = _budget(plain, x, activations=0.5)
    model, _ = _optimize(copy.deepcopy(plain), budget)
    model(x).sum().backward()
    made = memory_plan(model)
    assert made is not None and made.before.activations == eager
    real = saved_tensor_bytes(lambda: model(x))
    assert made.after.activations == real  # the prediction is exact for a residual stack
    assert made.after.total <= budget and made.excess == 0
    checkpointed = sum(m is not Mode.PLAIN for m in _modes(model))
    assert 0 < checkpointed < 6
    # One block fewer, fully checkpointed (the most it could save), does not fit.
    fewer, _ = _optimize(copy.deepcopy(plain), 10**12)
    plan(fewer, x)  # decided: everything fits, every block plain
    for block in list(fewer.blocks)[: checkpointed - 1]:
        getattr(block, STATE_ATTR).mode = Mode.FULL
    state = made.after.state
    assert state + saved_tensor_bytes(lambda: fewer(x)) > budget


def test_plain_when_the_step_fits_and_nothing_on_cpu_without_a_budget() -> None:
    torch.manual_seed(0)
    plain = GPT(layers=3)
    x = _tokens()
    budget, eager = _budget(plain, x, activations=1.5)
    model, _ = _optimize(copy.deepcopy(plain), budget)
    model(x)
    result = autoopt.report(model)["checkpoint"]
    assert result.status is Status.SKIPPED and "no block" in result.detail
    assert _modes(model) == [Mode.PLAIN] * 3 and saved_tensor_bytes(lambda: model(x)) == eager
    auto, _ = _optimize(copy.deepcopy(plain), "auto")  # on CPU "auto" is no limit
    result = autoopt.report(auto)["checkpoint"]
    assert result.status is Status.SKIPPED and "memory_budget=<bytes>" in result.detail
    assert not hasattr(auto.blocks[0], STATE_ATTR)


def _grads(model: nn.Module, x: torch.Tensor, seed: int) -> list[torch.Tensor]:
    model.zero_grad()
    torch.manual_seed(seed)
    out = model(x)
    (out.square().mean() + out.mean()).backward()
    return [p.grad.clone() for p in model.parameters()]


def _assert_same_steps(plain: nn.Module, model: nn.Module, x: torch.Tensor) -> None:
    """Gradients equal over two steps, the first one (which measures) included."""
    for seed in (1, 2):
        for e, g in zip(_grads(plain, x, seed), _grads(model, x, seed), strict=True):
            torch.testing.assert_close(g, e, atol=1e-6, rtol=0)
    for a, b in zip(plain.buffers(), model.buffers(), strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0)


def test_gradients_equal_eager_with_dropout_on_the_first_step() -> None:
    torch.manual_seed(0)
    plain = GPT(layers=4, dropout=0.2)
    x = _tokens()
    budget, _ = _budget(plain, x, activations=0.3)
    model, _ = _optimize(copy.deepcopy(plain), budget)
    _assert_same_steps(plain, model, x)
    assert any(m is not Mode.PLAIN for m in _modes(model))


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("mode", [Mode.SELECTIVE, Mode.FULL])
def test_a_checkpointed_block_traces_in_one_graph(mode: Mode, norm: bool) -> None:
    """Dynamo traces a block's checkpoint whole (fullgraph=True; with batch norms it runs the
    checkpoint outside the graph, which restores their statistics), with eager's gradients and
    statistics: on main it raised 'checkpoint not implemented for ... context_fn'."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8) if norm else nn.Identity(), nn.GELU())
    block = copy.deepcopy(plain)
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda x: run_block(block.forward, block, mode, (x,), {}),
        backend="eager",
        fullgraph=not norm,
    )
    compiled(x).sum().backward()
    plain(x).sum().backward()
    for p, q in zip(block.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    for a, b in zip(block.buffers(), plain.buffers(), strict=True):
        torch.testing.assert_close(a, b)  # the statistics updated once, as in eager
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt", "resnet"])
def test_the_checkpoint_plan_compiles_selective_and_full_blocks(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compile=True over autoopt's own checkpointing (full and selective blocks, batch norms in
    the ResNet's): dynamo compiles it (on main the selective checkpoint's context_fn failed it
    after the compile had run: 'checkpoint not implemented for ... context_fn'), with eager's
    gradients and statistics."""
    monkeypatch.setattr(compile_pass, "BACKEND", "aot_eager")
    torch.manual_seed(0)
    plain, x, share = (
        (GPT(layers=3, dropout=0.2), _tokens(), 0.6)
        if name == "gpt"
        else (ResNet(blocks=3), torch.randn(4, 3, 8, 8), 0.4)
    )
    budget, _ = _budget(plain, x, activations=share)
    model = copy.deepcopy(plain)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, _ = autoopt.optimize(
        model, None, optimizer, amp=False, compile=True, channels_last=False,
        memory_budget=budget, verbose=False,
    )  # fmt: skip
    _assert_same_steps(plain, model, x)
    modes = [getattr(b, STATE_ATTR).mode for b in model.modules() if hasattr(b, STATE_ATTR)]
    assert Mode.SELECTIVE in modes and Mode.FULL in modes, modes
    assert autoopt.report(model)["compile"].status.value == "applied"


def test_gradients_and_running_stats_equal_eager_for_batchnorm_stages() -> None:
    torch.manual_seed(0)
    plain = ResNet(blocks=3)
    x = torch.randn(4, 3, 8, 8)
    budget, _ = _budget(plain, x, activations=0.4)
    model, _ = _optimize(copy.deepcopy(plain), budget)
    _assert_same_steps(plain, model, x)
    made = memory_plan(model)
    assert made is not None and made.blocks().startswith("stage1.0")
    assert made.after.activations < made.before.activations
    # The plan may overcount (a block's output and the next block's input are one storage,
    # saved by both), never undercount.
    assert saved_tensor_bytes(lambda: model(x)) <= made.after.activations


def test_selective_blocks_give_eager_gradients_and_save_between_plain_and_full() -> None:
    torch.manual_seed(0)
    plain = GPT(layers=3, dropout=0.2)
    x = _tokens()
    model, _ = _optimize(copy.deepcopy(plain), 10**12)  # fits: every block plain
    model(x)
    full_saved = {}
    for mode in (Mode.PLAIN, Mode.SELECTIVE, Mode.FULL):
        for block in model.blocks:
            getattr(block, STATE_ATTR).mode = mode
        full_saved[mode] = saved_tensor_bytes(lambda: model(x))
    assert full_saved[Mode.FULL] < full_saved[Mode.SELECTIVE] < full_saved[Mode.PLAIN]
    for block in model.blocks:
        getattr(block, STATE_ATTR).mode = Mode.SELECTIVE
    _assert_same_steps(plain, model, x)


def test_budget_too_small_checkpoints_every_block_and_says_by_how_much() -> None:
    torch.manual_seed(0)
    plain = GPT(layers=4)
    x = _tokens()
    budget, _ = _budget(plain, x, activations=0.0)
    model, _ = _optimize(copy.deepcopy(plain), budget)
    model(x)
    assert _modes(model) == [Mode.FULL] * 4
    made = memory_plan(model)
    assert made is not None and made.excess == made.after.total - budget > 0
    detail = autoopt.report(model)["checkpoint"].detail
    assert detail.startswith("blocks.0-3 (full): saved activations")
    assert "still exceeds the budget by" in detail


def test_plan_decides_before_the_first_forward_and_once() -> None:
    torch.manual_seed(0)
    plain = GPT(layers=4)
    x = _tokens()
    budget, _ = _budget(plain, x, activations=0.5)
    model, _ = _optimize(copy.deepcopy(plain), budget)
    assert memory_plan(model) is None
    made = plan(model, x)
    assert isinstance(made, CheckpointPlan) and made is memory_plan(model)
    modes = _modes(model)
    assert any(m is not Mode.PLAIN for m in modes)
    model(_tokens(1)).sum().backward()  # a later batch does not decide again
    assert plan(model, x) is made and _modes(model) == modes
    assert plan(plain, x) is None  # not optimized with checkpoint="auto"


def test_report_line_names_the_blocks_and_the_bytes() -> None:
    torch.manual_seed(0)
    plain = GPT(layers=6)
    x = _tokens()
    budget, eager = _budget(plain, x, activations=0.5)
    model, _ = _optimize(copy.deepcopy(plain), budget)
    result = autoopt.report(model)["checkpoint"]
    assert result.status is Status.SKIPPED and "blocks (6 x Block)" in result.detail
    model(x)
    result = autoopt.report(model)["checkpoint"]
    made = memory_plan(model)
    assert made is not None and result.status is Status.APPLIED
    assert result.detail.startswith(made.blocks() + ": saved activations ")
    assert "measured one block at a time" in result.detail


def test_describe_blocks_groups_runs_per_stack_and_mode() -> None:
    modes = {f"blocks.{i}": Mode.FULL for i in range(8)}
    modes |= {"blocks.8": Mode.SELECTIVE, "blocks.9": Mode.SELECTIVE, "blocks.10": Mode.PLAIN}
    modes |= {"0": Mode.FULL, "2": Mode.FULL}
    assert describe_blocks(modes) == (
        "blocks.0-7 (full), blocks.8-9 (selective), 0 (full), 2 (full)"
    )


@pytest.mark.parametrize("layers", [2])
def test_eval_and_no_grad_forwards_do_not_decide(layers: int) -> None:
    model, _ = _optimize(GPT(layers=layers), 1)
    with torch.no_grad():
        model(_tokens())
    model.eval()
    model(_tokens())
    assert memory_plan(model) is None
    assert autoopt.report(model)["checkpoint"].status is Status.SKIPPED


def test_backward_peak_is_the_worst_blocks_backward() -> None:
    """Last block first: a plain block adds its transient buffers; a checkpointed one also saves
    its plain bytes again, less what the blocks after it kept and have freed."""
    from autoopt.runtime.checkpointing.checkpoint_plan import backward_peak

    costs = [BlockCost(100, 40, 10, transient=30)] * 2
    assert backward_peak(costs, [Mode.PLAIN, Mode.PLAIN]) == 30
    assert backward_peak(costs, [Mode.FULL, Mode.PLAIN]) == max(30, 90 + 30 - 100)
    assert backward_peak(costs, [Mode.PLAIN, Mode.FULL]) == 90 + 30
    assert backward_peak(costs, [Mode.SELECTIVE, Mode.SELECTIVE]) == 60 + 30


def test_a_backward_that_cannot_be_measured_leaves_the_plan_standing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The transient term only informs the peak: when measuring it fails the plan is made as
    before, with a warning and a report line, and the peak is the saved bytes'."""
    from autoopt.runtime.checkpointing import checkpoint_plan

    def broken(fn: object, params: object) -> int:
        raise RuntimeError("no backward here")

    monkeypatch.setattr(checkpoint_plan, "backward_transient_bytes", broken)
    torch.manual_seed(0)
    plain = GPT(layers=4)
    x = _tokens()
    budget, _ = _budget(plain, x, activations=0.5)
    model, _ = _optimize(copy.deepcopy(plain), budget)
    with pytest.warns(UserWarning, match="could not measure the backward of blocks.0"):
        made = plan(model, x)
    assert made is not None and made.excess == 0
    assert made.peak == made.after.total
    assert any(m is not Mode.PLAIN for m in _modes(model))
