"""The checkpoint planner, exactly: the report line word for word with bytes counted here by
torch's saved-tensor hooks, the plan's edges (a budget met to the byte, one byte over), the
measuring forward with keyword arguments, non-leaf inputs, blocks that do not run and a KV
cache, the fallbacks (no budget, a block that cannot be measured), and the way the planner is
found through a wrapper."""

from __future__ import annotations

import copy
import logging
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import autoopt
from autoopt.runtime.checkpointing import checkpoint_plan
from autoopt.runtime.checkpointing.block_checkpoint import STATE_ATTR, Mode
from autoopt.runtime.checkpointing.checkpoint_plan import (
    PLANNER_ATTR,
    BlockCost,
    CheckpointPlan,
    choose_modes,
    memory_plan,
    plan,
)
from autoopt.runtime.context import Context
from autoopt.runtime.memory import (
    StepMemory,
    backward_transient_bytes,
    format_bytes,
    saved_tensor_bytes,
    state_memory,
)
from autoopt.runtime.options import Options
from autoopt.runtime.passes import checkpoint as checkpoint_pass
from autoopt.runtime.report import Status
from tests.runtime.checkpoint_models import GPT, Block
from tests.runtime.saved_bytes import hooked_saved_bytes

MEASURED = " (measured one block at a time on the first training batch)"


def _planned(result: object) -> str:
    """The checkpoint row's line without its expected cost (seconds measured on the spot),
    which must be there and be a figure when blocks are checkpointed."""
    line, _, cost = result.detail.partition(f"; {checkpoint_plan.EXPECTED} ")
    assert (cost != "") == (result.status is Status.APPLIED), result.detail
    if cost:
        assert cost.endswith(" a step") and result.figures["expected_recompute_s"] >= 0
    return line


def _tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 32, (4, 24), generator=torch.Generator().manual_seed(seed))


def _state(model: nn.Module) -> int:
    return state_memory(model, torch.optim.AdamW(model.parameters())).state


def _optimize(model: nn.Module, budget: int | str | None, **options: object) -> nn.Module:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, _ = autoopt.optimize(
        model,
        None,
        optimizer,
        **{"amp": False, "compile": False, "channels_last": False, "verbose": False, **options},
        memory_budget=budget,
    )
    return model


def _modes(model: nn.Module) -> list[Mode]:
    return [getattr(b, STATE_ATTR).mode for b in model.blocks]


def _line(made: CheckpointPlan, blocks: str) -> str:
    return (
        f"{blocks}: saved activations {format_bytes(made.before.activations or 0)} -> "
        f"{format_bytes(made.after.activations or 0)}; step {format_bytes(made.after.total)} "
        f"for a budget of {format_bytes(made.budget)}"
    )


# --- choose_modes at its edges ------------------------------------------------------------


def test_a_budget_met_to_the_byte_takes_no_more_blocks() -> None:
    costs = [BlockCost(100, 40, 10, full_s=3.0), BlockCost(100, 40, 10, full_s=3.0)]
    # One full block brings 1180 to exactly 1090 (3 s); two selective ones to 1060 (2 s).
    assert choose_modes(costs, 1000, budget=1090) == [Mode.SELECTIVE, Mode.SELECTIVE]
    costs = [BlockCost(100, 40, 10, selective_s=2.0, full_s=3.0)] * 2
    assert choose_modes(costs, 1000, budget=1090) == [Mode.FULL, Mode.PLAIN]
    # Fits as it is, to the byte.
    assert choose_modes(costs, 1000, budget=1180) == [Mode.PLAIN, Mode.PLAIN]


def test_a_single_byte_over_checkpoints_the_block_that_saves_it() -> None:
    assert choose_modes([BlockCost(11, 11, 10)], 1000, budget=1000) == [Mode.FULL]


def test_a_full_fit_to_the_byte_still_turns_selective_when_that_costs_nothing() -> None:
    """Selective keeps nothing beyond the inputs here (its kept outputs are the inputs'
    size): at an exact fit it costs no byte more and recomputes less, so it is taken."""
    assert choose_modes([BlockCost(100, 10, 10)], 1000, budget=1000) == [Mode.SELECTIVE]


def test_a_step_that_saves_nothing_renders_zero_bytes_and_an_exact_fit_does_not_exceed() -> None:
    state = StepMemory(600, 600, 1200)
    made = CheckpointPlan(2400, state.with_activations(0), state.with_activations(0), {}, {})
    assert made.excess == 0
    assert made.render() == (
        f"no block: saved activations 0 B -> 0 B; step {format_bytes(2400)} for a budget of "
        f"{format_bytes(2400)}"
    )
    over = CheckpointPlan(2399, state.with_activations(0), state.with_activations(0), {}, {})
    assert over.excess == 1 and over.render().endswith("; still exceeds the budget by 1 B")


# --- the plan made at the first training forward ---------------------------------------


def test_the_report_line_and_the_memory_section_are_the_measured_bytes() -> None:
    torch.manual_seed(0)
    plain = GPT(layers=4)
    x = _tokens()
    eager = hooked_saved_bytes(lambda: plain(x), plain)
    budget = _state(plain) + eager // 2
    model = _optimize(copy.deepcopy(plain), budget)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every block's backward measured
        model(x).sum().backward()
    made = memory_plan(model)
    assert made is not None and made.before.activations == eager
    assert made.after.activations == saved_tensor_bytes(lambda: model(x))
    assert made.after.total <= budget < made.before.total
    result = autoopt.report(model)["checkpoint"]
    assert result.status is Status.APPLIED
    assert _planned(result) == _line(made, made.blocks()) + MEASURED
    memory = autoopt.report(model).memory
    assert memory is not None and (memory.before, memory.after) == (made.before, made.after)
    assert memory.budget == budget
    # Each block's costs: measured alone on its real input, the mask (the caller's) left out.
    inputs: list[torch.Tensor] = []
    hooks = [b.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for b in plain.blocks]
    with torch.no_grad():
        plain(x)
    for hook in hooks:
        hook.remove()
    mask = torch.ones(24, 24, dtype=torch.bool).tril()
    for i, (block, h) in enumerate(zip(plain.blocks, inputs, strict=True)):
        cost = made.costs[f"blocks.{i}"]
        fresh = h.detach().requires_grad_(True).clone()
        assert cost.plain == hooked_saved_bytes(lambda: block(fresh, mask=mask), plain, mask)  # noqa: B023
        assert cost.full == h.numel() * h.element_size()
        transient = backward_transient_bytes(
            lambda: block(fresh, mask=mask),  # noqa: B023
            block.parameters(),
        )
        assert cost.transient == transient > 0
    # The peak holds the step and, on top, the backward's buffers at its worst block.
    assert made.peak > made.after.total


def test_a_step_that_fits_says_no_block_and_keeps_eager() -> None:
    torch.manual_seed(0)
    plain = GPT(layers=2)
    x = _tokens()
    model = _optimize(copy.deepcopy(plain), 10**12)
    model(x)
    made = memory_plan(model)
    assert made is not None and made.after == made.before
    result = autoopt.report(model)["checkpoint"]
    assert result.status is Status.SKIPPED
    assert _planned(result) == _line(made, "no block") + MEASURED


def test_the_memory_section_is_said_once_at_the_level_verbose_asks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    torch.manual_seed(0)
    plain = GPT(layers=2)
    x = _tokens()
    budget = _state(plain) + hooked_saved_bytes(lambda: plain(x), plain) // 2
    for verbose, level in ((True, logging.INFO), (False, logging.DEBUG)):
        model = _optimize(copy.deepcopy(plain), budget, verbose=verbose)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="autoopt"):
            model(x).sum().backward()
        report = autoopt.report(model)
        assert report.memory is not None
        said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "autoopt"]
        assert said == [
            (level, f"autoopt: checkpoint applied: {report['checkpoint'].detail}"),
            (level, "\n".join(report.memory.render())),
        ]


class Trunk(nn.Module):
    """Blocks over features computed outside (a non-leaf input); the keyword arguments change
    what runs: `depth` drops the last blocks (layer drop), `gain` scales the input."""

    def __init__(self, layers: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(16, 2, 0.0) for _ in range(layers))

    def forward(
        self, h: torch.Tensor, *, gain: torch.Tensor | None = None, depth: int | None = None
    ) -> torch.Tensor:
        if gain is not None:
            h = h * gain
        for block in list(self.blocks)[:depth]:
            h = block(h)
        return h


def test_keyword_arguments_non_leaf_inputs_and_blocks_that_do_not_run() -> None:
    torch.manual_seed(0)
    plain = Trunk()
    leaf = torch.randn(4, 24, 16, requires_grad=True)
    weight = torch.randn(16, requires_grad=True)

    def loss(model: nn.Module) -> torch.Tensor:
        h = torch.tanh(leaf)  # non-leaf tensors, as a backbone's features are
        out = model(h, gain=weight * 2, depth=3)
        return out.square().mean()

    eager_bytes = hooked_saved_bytes(
        lambda: plain(torch.tanh(leaf), gain=weight * 2, depth=3), plain
    )
    budget = _state(plain) + eager_bytes // 2
    model = _optimize(copy.deepcopy(plain), budget)
    want = torch.autograd.grad(loss(plain), [leaf, weight, *plain.parameters()], allow_unused=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = torch.autograd.grad(
            loss(model), [leaf, weight, *model.parameters()], allow_unused=True
        )
    for g, w in zip(got, want, strict=True):
        if w is None:  # the dropped block's parameters
            assert g is None
        else:
            torch.testing.assert_close(g, w, atol=1e-6, rtol=0)
    made = memory_plan(model)
    assert made is not None and made.before.activations == eager_bytes
    assert set(made.costs) == {"blocks.0", "blocks.1", "blocks.2"}
    assert _modes(model)[3] is Mode.PLAIN
    result = autoopt.report(model)["checkpoint"]
    assert result.status is Status.APPLIED
    assert _planned(result) == (
        _line(made, made.blocks())
        + MEASURED
        + "; 1 block(s) did not run in that forward and stay plain"
    )


def test_a_block_that_cannot_be_measured_runs_plainly_with_a_warning() -> None:
    """A block that refuses saved-tensor hooks (so it cannot be checkpointed either): the plan
    falls back to no checkpointing, and training is eager's."""

    class Private(Block):
        def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
            with torch.autograd.graph.disable_saved_tensors_hooks("keeps its own saved tensors"):
                return super().forward(x, mask)

    torch.manual_seed(0)
    plain = GPT(layers=3)
    plain.blocks = nn.ModuleList(Private(16, 2, 0.0) for _ in range(3))
    x = _tokens()
    model = _optimize(copy.deepcopy(plain), _state(plain) + 1)
    message = "could not measure the blocks (RuntimeError: keeps its own saved tensors)"
    with pytest.warns(UserWarning) as caught:
        model(x).square().mean().backward()
    assert [str(w.message) for w in caught] == [
        f"autoopt checkpoint: {message}; running without it"
    ]
    result = autoopt.report(model)["checkpoint"]
    assert (result.status, result.detail, result.fallback) == (
        Status.FAILED,
        message,
        "no checkpointing",
    )
    assert _modes(model) == [Mode.PLAIN] * 3 and memory_plan(model) is None
    plain(x).square().mean().backward()
    for p, q in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=0)


def test_unmeasured_backwards_are_named_in_the_warning_and_the_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(fn: object, params: object) -> int:
        raise RuntimeError("no backward here")

    monkeypatch.setattr(checkpoint_plan, "backward_transient_bytes", broken)
    torch.manual_seed(0)
    plain = GPT(layers=2)
    x = _tokens()
    budget = _state(plain) + hooked_saved_bytes(lambda: plain(x), plain) // 2
    model = _optimize(copy.deepcopy(plain), budget)
    with pytest.warns(UserWarning) as caught:
        made = plan(model, x)
    assert made is not None
    assert [str(w.message) for w in caught] == [
        "autoopt checkpoint: could not measure the backward of "
        "blocks.0 (RuntimeError: no backward here), blocks.1 (RuntimeError: no backward here); "
        "the planned peak leaves their buffers out"
    ]
    assert _planned(autoopt.report(model)["checkpoint"]) == (
        _line(made, made.blocks())
        + MEASURED
        + "; the peak leaves out the backward buffers of 2 block(s) whose backward could not "
        "be measured"
    )


class Gated(Block):
    """A block scaled by a tensor its caller makes and shares with every block (no grad)."""

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * gate


class GatedStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Gated(16, 2, 0.0) for _ in range(3))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        gate = torch.full((24, 16), 0.5)
        for block in self.blocks:
            h = block(h, gate)
        return h


def test_a_tensor_the_caller_shares_is_not_counted_in_each_blocks_costs() -> None:
    """The block saves the gate for backward; it is the caller's (counted once in the
    forward's bytes), so no block's costs hold it."""
    torch.manual_seed(0)
    plain = GatedStack()
    h = torch.randn(4, 24, 16, requires_grad=True)
    budget = _state(plain) + hooked_saved_bytes(lambda: plain(h), plain) // 2
    model = _optimize(copy.deepcopy(plain), budget)
    made = plan(model, h)
    assert made is not None
    gate = torch.full((24, 16), 0.5)
    fresh = h.detach().requires_grad_(True).clone()
    block = plain.blocks[0]
    alone = hooked_saved_bytes(lambda: block(fresh, gate), plain, gate)
    assert alone < hooked_saved_bytes(lambda: block(fresh, gate), plain)  # it does save the gate
    assert made.costs["blocks.0"].plain == alone


# --- no budget, and "auto" on a GPU (faked) ---------------------------------------------


def _planned_for_cuda(model: nn.Module) -> None:
    """The checkpoint pass of an optimize() on a (faked) CUDA device with memory_budget="auto"."""
    ctx = Context(
        Options(memory_budget="auto"),
        model,
        None,
        torch.optim.AdamW(model.parameters()),
        device=torch.device("cuda", 0),
    )
    result = checkpoint_pass.run(ctx)
    assert result is not None and "blocks chosen at the first training forward" in result.detail
    ctx.report.add(result)


def test_auto_is_the_free_gpu_memory_and_no_budget_without_a_gpu(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    plain = GPT(layers=3)
    x = _tokens()
    free = _state(plain) + hooked_saved_bytes(lambda: plain(x), plain) // 2
    # The model is where it was planned for: the budget is what the GPU has free.
    model = copy.deepcopy(plain)
    _planned_for_cuda(model)
    monkeypatch.setattr(checkpoint_plan, "module_device", lambda m: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 4 * free))
    with caplog.at_level(logging.DEBUG, logger="autoopt"):
        made = plan(model, x)
    # Decided before optimize() has shown its report: nothing is said yet, the section neither.
    assert [r for r in caplog.records if r.name == "autoopt"] == []
    assert made is not None and made.budget == free
    assert any(m is not Mode.PLAIN for m in _modes(model))
    monkeypatch.undo()
    # The model is on the host at its first step: nothing to plan for, every block plain.
    model = copy.deepcopy(plain)
    _planned_for_cuda(model)
    planner = getattr(model, PLANNER_ATTR)
    assert plan(model, x) is None
    assert planner.report["checkpoint"].status is Status.SKIPPED
    assert planner.report["checkpoint"].detail == "no memory budget to plan for"
    assert _modes(model) == [Mode.PLAIN] * 3 and planner.report.memory is None


# --- the planner's other users -----------------------------------------------------------


def test_the_plan_is_found_through_a_wrapper_and_only_on_optimized_models() -> None:
    torch.manual_seed(0)
    plain = GPT(layers=3)
    x = _tokens()
    budget = _state(plain) + hooked_saved_bytes(lambda: plain(x), plain) // 2
    wrapped = nn.DataParallel(_optimize(copy.deepcopy(plain), budget))  # `.module`, as DDP
    assert memory_plan(wrapped) is None
    made = plan(wrapped, x)
    assert made is not None and memory_plan(wrapped) is made
    assert memory_plan(wrapped.module) is made
    assert memory_plan(plain) is None and plan(plain, x) is None


def test_saved_with_every_block_is_eager_or_torchs_own_checkpoint_and_decides_nothing() -> None:
    """What `accumulate="auto"` asks before the plan is made: the bytes with every block plain
    (eager's) or fully checkpointed (torch.utils.checkpoint by hand on every block)."""
    torch.manual_seed(0)
    plain = GPT(layers=3)
    x = _tokens()
    model = _optimize(copy.deepcopy(plain), _state(plain) + 1)
    planner = getattr(model, PLANNER_ATTR)
    forward = autoopt.unwrap(model).forward
    by_hand = copy.deepcopy(plain)
    for block in by_hand.blocks:
        block.forward = lambda *a, _f=block.forward, **k: checkpoint(
            _f, *a, use_reentrant=False, **k
        )
    assert planner.saved_with_every_block(Mode.PLAIN, forward, (x,), {}) == hooked_saved_bytes(
        lambda: plain(x), plain
    )
    assert planner.saved_with_every_block(Mode.FULL, forward, (x,), {}) == saved_tensor_bytes(
        lambda: by_hand(x)
    )
    # Nothing decided, every block back to plain: the first training forward still plans.
    assert not planner.decided and _modes(model) == [Mode.PLAIN] * 3
    assert saved_tensor_bytes(lambda: model(x)) < hooked_saved_bytes(lambda: plain(x), plain)
    assert memory_plan(model) is not None


# --- a transformers KV cache ------------------------------------------------------------


@pytest.mark.parametrize("by_keyword", [True, False], ids=["keyword", "positional"])
def test_a_kv_cache_is_left_out_of_checkpointed_blocks_and_a_filled_one_is_never_written(
    by_keyword: bool,
) -> None:
    """GPT-2's default use_cache=True: the line says the checkpointed blocks run without the
    cache. A cache the user passes holding a prefix: its blocks run plainly (their bytes are in
    the forward's), the measuring forward writes into a copy, and the gradients are eager's."""
    pytest.importorskip("transformers")
    from transformers import DynamicCache

    from tests.runtime.hf_models import gpt2

    ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    prefix = torch.randint(1, 64, (2, 4), generator=torch.Generator().manual_seed(1))
    plain = gpt2()
    budget = _state(plain) + saved_tensor_bytes(lambda: plain(ids).logits) // 2
    model = _optimize(gpt2(), budget)
    model(ids).logits.sum().backward()
    made = memory_plan(model)
    assert made is not None
    assert _planned(autoopt.report(model)["checkpoint"]) == (
        _line(made, made.blocks())
        + MEASURED
        + "; checkpointed blocks run without the KV cache in training (use_cache=False, as "
        "transformers' gradient checkpointing)"
    )

    def loss(m: nn.Module) -> torch.Tensor:
        cache = DynamicCache(config=m.config)
        with torch.no_grad():
            m(prefix, past_key_values=cache, use_cache=True)
        if by_keyword:
            out = m(ids, past_key_values=cache, use_cache=True)
        else:
            out = m(ids, cache, use_cache=True)
        assert cache.get_seq_length(0) == 12  # the prefix and this batch, once each
        return out.logits.square().mean()

    model = _optimize(gpt2(), budget)
    loss(model).backward()
    loss(plain).backward()
    made = memory_plan(model)
    assert made is not None and made.blocks() == ""
    assert set(made.costs.values()) == {BlockCost(0, 0, 0)}
    for p, q in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5)
