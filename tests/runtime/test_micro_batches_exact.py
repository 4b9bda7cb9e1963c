"""`choose_parts` at its boundaries (each case kills a mutant that survived `make mutation`;
docs/benchmarks/mutation.md). The property throughout: the fewest parts whose largest one fits
the budget by the fit `fixed + per_row * rows`."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import autoopt
from autoopt.runtime.accumulation import loss_shares
from autoopt.runtime.accumulation.accumulator import Accumulator
from autoopt.runtime.accumulation.loss_shares import Normaliser
from autoopt.runtime.accumulation.micro_batches import (
    MicroBatcher,
    choose_parts,
    part_sizes,
    stand_down_line,
    with_rows,
)
from autoopt.runtime.context import DistState
from autoopt.runtime.memory import saved_tensor_bytes, state_memory
from autoopt.runtime.report import Report

STATE = 100


@pytest.mark.parametrize(
    ("rows", "saved_one", "saved_two", "over_state", "parts"),
    [
        (
            8,
            15,
            20,
            50,
            1,
        ),  # fixed 10 + 5 x 8 = 50 = the budget over the state exactly: one part (>= not >)
        (8, 4, 8, 32, 1),  # fixed 0 (not clamped up to 1): 4 x 8 = 32 fits exactly
        (8, 2, 3, 5, 2),  # 1 byte per row, 4 left after fixed 1: 4 rows per part
        (9, 4, 8, 10, 5),  # 2 rows fit (10 // 4, not 2.5): 5 parts, not 4 parts of 3 rows
        (8, 10, 10, -5, 1),  # nothing grows with the rows: one part even over the budget
        (8, 20, 18, 5, 1),  # 2 rows measured smaller than 1 (noise): per row 0, not 1
    ],
)
def test_the_fewest_parts_whose_largest_fits(
    rows: int, saved_one: int, saved_two: int, over_state: int, parts: int
) -> None:
    choice = choose_parts(rows, STATE, saved_one, saved_two, STATE + over_state)
    assert choice.parts == parts, choice
    if choice.per_row and choice.parts > 1:
        assert choice.step_bytes <= choice.budget  # the largest part fits
        one_more = choice.state + choice.fixed + choice.per_row * (choice.part_rows + 1)
        assert one_more > choice.budget or choice.parts == rows  # and no bigger part would


def test_the_report_line_keeps_its_figures_when_even_one_row_exceeds() -> None:
    line = choose_parts(64, STATE, 13, 16, 105).render()
    assert line.startswith("step 113 B for a budget of 105 B (state 100 B + saved activations")
    assert line.endswith("; still exceeds the budget by 8 B at 1 sample")


# Under DDP the ranks agree through all_reduce. In one process, a fake all_reduce stands for a
# second rank: it combines this rank's tensor with the other rank's value by the op it is given,
# as gloo would (the real two-process run is test_accumulate_auto's slow DDP test).
OPS = {"MIN": min, "MAX": max}


def _batcher(
    monkeypatch: pytest.MonkeyPatch | None = None, other: int = 1
) -> tuple[MicroBatcher, list[tuple[str, int]]]:
    """A MicroBatcher over a small model; with `monkeypatch`, under DDP with a second rank that
    holds `other`. Records each all_reduce's op and the value this rank sent."""
    sent: list[tuple[str, int]] = []

    def all_reduce(t: torch.Tensor, op: Any = None) -> None:
        name = str(op).rsplit(".", 1)[-1].upper()
        sent.append((name, int(t.item())))
        t.fill_(OPS[name](int(t.item()), other))

    dist = None
    if monkeypatch is not None:
        monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
        dist = DistState(rank=0, world_size=2, local_rank=0, backend="gloo")
    model = nn.Linear(4, 1)
    batcher = MicroBatcher(
        model, Accumulator(1, auto=True), 10**6, state_memory(model, None), Report(), dist
    )
    return batcher, sent


def test_ranks_split_as_the_one_with_the_smallest_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    choice = choose_parts(64, STATE, 13, 16, 158)  # 4 parts of 16 here
    batcher, ops = _batcher(monkeypatch, other=10)
    agreed = batcher._agree(choice, torch.device("cpu"))
    # 10 rows on the other rank: 7 parts of <= 10 rows (10, 9, ...): the same count everywhere
    assert (agreed.parts, agreed.part_rows, agreed.rows) == (7, 10, 64) and ops == [("MIN", 16)]
    assert part_sizes(64, agreed.part_rows) == part_sizes(64, 10)
    batcher, _ = _batcher(monkeypatch, other=20)  # larger parts there: this rank's stand
    assert batcher._agree(choice, torch.device("cpu")) is choice


@pytest.mark.parametrize(
    ("mine", "other", "agreed"),
    [
        (None, 1, None),  # both tell the normaliser
        (None, 0, "another rank could not tell the loss's normaliser (see its warning)"),
        ("my reason", 1, "my reason"),  # this rank's own reason, not the other's
        ("my reason", 0, "my reason"),
    ],
)
def test_every_rank_stands_down_when_one_does(
    monkeypatch: pytest.MonkeyPatch, mine: str | None, other: int, agreed: str | None
) -> None:
    batcher, ops = _batcher(monkeypatch, other=other)
    assert batcher._agree_reason(mine) == agreed
    assert ops == [("MIN", int(mine is None))]


@pytest.mark.parametrize("other", [0, 1])
def test_a_later_batch_is_probed_on_every_rank_when_one_needs_it(
    monkeypatch: pytest.MonkeyPatch, other: int
) -> None:
    """Undecided here (one normaliser left: no) or on the other rank: all ranks probe again."""
    batcher, ops = _batcher(monkeypatch, other=other)
    batch = (torch.ones(8, 4), torch.ones(8, 1))
    assert batcher._undecided(batch, [4, 4]) is bool(other)
    assert ops == [("MAX", 0)]


# `_choose_shares` from the probes' captured gradients (projected per row, `_projected`): the
# pair's rows, then row a alone, then row b alone. A per-sample mean gives each row of the pair
# half the gradient it gets alone.
ROW_A, ROW_B = torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.tensor([[2.0, 1.0, 0.0, 1.0]])
PAIR = torch.cat([ROW_A, ROW_B]) / 2
SPLIT = "auto: 2 micro-batches of <= 4 samples per batch of 8"


def _tokens_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Rows 0 and 1 count 3 labels each (samples and tokens weigh them alike); the second half
    of the batch is padded (-100), so the two weigh its parts differently."""
    labels = torch.ones(8, 3, dtype=torch.long)
    labels[4:, 1:] = -100
    return torch.ones(8, 4), labels


def _choose(
    batcher: MicroBatcher, captures: list[dict[Any, torch.Tensor]], batch: Any = None
) -> None:
    batch = batch if batch is not None else (torch.ones(8, 4), torch.ones(8, 1))
    batcher.captures = captures
    batcher._line = SPLIT
    batcher._choose_shares(loss_shares.candidates(batch, 8), batch, 0, 1, [4, 4])


def _stood_down(batcher: MicroBatcher, reason: str) -> None:
    assert batcher.stood_down and batcher.shares is None
    assert batcher.report["accumulate"].detail == stand_down_line(reason)


def test_the_normaliser_is_read_from_the_outputs_both_probes_reached() -> None:
    """An output only the pair and row a reached says nothing about row b: left out."""
    batcher, _ = _batcher()
    only_two = ("inner", 0, 4)
    _choose(
        batcher, [{"out": PAIR, only_two: PAIR}, {"out": ROW_A, only_two: ROW_A}, {"out": ROW_B}]
    )
    assert batcher.shares == Normaliser("samples") and not batcher.stood_down
    assert batcher.report["accumulate"].detail == (
        f"{SPLIT}; each part's backward is seeded with its share of the samples, the "
        "normaliser the loss was measured to divide by (gradients at the outputs of two samples "
        "alone and together), so gradients equal the full batch's"
    )


def test_no_output_reached_by_every_probe_stands_down() -> None:
    batcher, _ = _batcher()
    with pytest.warns(UserWarning):
        _choose(batcher, [{"out": PAIR}, {"other": ROW_A}, {"out": ROW_B}])
    _stood_down(batcher, "the loss's gradient reached no per-sample output of the model")


@pytest.mark.parametrize("mixed", ["a", "b", "both"])
def test_rows_that_mix_stand_down(mixed: str) -> None:
    """A pair row that is no multiple of the row alone (a loss that mixes rows, batch norm):
    no normaliser rebuilds it."""
    pair = PAIR.clone()
    if mixed in ("a", "both"):
        pair[0] = torch.tensor([4.0, 3.0, 2.0, 1.0])
    if mixed in ("b", "both"):
        pair[1] = torch.tensor([0.0, 1.0, 0.0, 5.0])
    batcher, _ = _batcher()
    with pytest.warns(UserWarning):
        _choose(batcher, [{"out": pair}, {"out": ROW_A}, {"out": ROW_B}])
    _stood_down(
        batcher,
        "the loss is not a sum over samples divided by the samples, the labelled tokens "
        "(entries != -100) or a mask's count (measured on two samples of the first batch), so "
        "no weighting of the parts rebuilds its gradient",
    )


def test_normalisers_the_probes_cannot_tell_apart_but_the_parts_can_stand_down() -> None:
    batcher, _ = _batcher()
    with pytest.warns(UserWarning):
        _choose(batcher, [{"out": PAIR}, {"out": ROW_A}, {"out": ROW_B}], _tokens_batch())
    _stood_down(
        batcher,
        "two neighbouring samples of a batch cannot tell the loss's normaliser apart between "
        "the samples, the entries of batch[1] != -100, the entries of batch[1][:, 1:] != -100, "
        "which weight its parts differently",
    )


def test_under_ddp_a_rank_that_stood_down_tells_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batcher, sent = _batcher(monkeypatch, other=1)
    batcher.stood_down = True  # during its probes
    batcher._choose_shares([], (torch.ones(8, 4),), 0, 1, [4, 4])
    assert sent == [("MIN", 0)]


def test_under_ddp_a_rank_stands_down_for_its_own_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    batcher, sent = _batcher(monkeypatch, other=1)  # the other rank could tell
    with pytest.warns(UserWarning):
        _choose(batcher, [{"out": PAIR}, {"other": ROW_A}, {"out": ROW_B}])
    assert sent == [("MIN", 0)]
    _stood_down(batcher, "the loss's gradient reached no per-sample output of the model")


# A later batch probed again (`_later`): the first batch has no padding, so samples and labelled
# tokens weigh its rows alike; the second is padded. Compared with plain torch on whole batches.


def _later_run(
    loss_of: Any, second_rows: int
) -> tuple[list[int], float, list[warnings.WarningMessage], nn.Module]:
    from tests.runtime.hf_models import Recording, padded_batches, rel, tiny_lm, train

    batches = padded_batches()
    batches[0]["labels"] = batches[0]["input_ids"].clone()
    batches[0]["attention_mask"] = torch.ones_like(batches[0]["input_ids"])
    batches[1] = {k: v[:second_rows] for k, v in batches[1].items()}
    want, _ = train(tiny_lm(), batches, loss_of)
    model = tiny_lm()
    state = state_memory(model, Recording(model.parameters())).state
    budget = state + saved_tensor_bytes(lambda: loss_of(tiny_lm(), batches[0])) // 3
    rows: list[int] = []

    def counting(model: nn.Module, batch: Any) -> torch.Tensor:
        rows.append(len(batch["labels"]))
        return loss_of(model, batch)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, model = train(
            model, batches, counting, accumulate="auto", checkpoint=False, memory_budget=budget
        )
    return rows, rel(got.grads, want.grads), caught, model


def test_a_later_batch_of_two_parts_is_probed_before_it_is_split() -> None:
    """Its 2 parts hold different token counts: probed (3 probes), then weighted by tokens, and
    its probes close their cycle with the parts (no 'step() was not called' warning)."""
    from tests.runtime.hf_models import lm_loss

    rows, error, caught, _ = _later_run(lm_loss, second_rows=4)
    assert rows == [2, 1, 1] + [2] * 4 + [2, 1, 1] + [2, 2]
    assert error < 1e-5
    assert [str(w.message) for w in caught if "autoopt" in str(w.message)] == []


def test_a_later_batch_no_normaliser_rebuilds_stands_down_and_runs_whole() -> None:
    """A loss divided by the batch's longest row: the padded batch's probes match no count, so
    it stands down there and that batch comes whole (the first, split, still rebuilt exactly)."""
    from tests.runtime.hf_models import VOCAB

    def max_token_loss(model: nn.Module, batch: Any) -> torch.Tensor:
        labels = batch["labels"][:, 1:]
        logits = model(batch["input_ids"])[:, :-1].reshape(-1, VOCAB)
        ce = F.cross_entropy(logits, labels.reshape(-1), ignore_index=-100, reduction="sum")
        return ce / (labels != -100).sum(1).max() / len(labels)

    rows, error, caught, model = _later_run(max_token_loss, second_rows=8)
    assert rows == [2, 1, 1] + [2] * 4 + [2, 1, 1] + [8]
    assert error < 1e-5
    assert any("stands down" in str(w.message) for w in caught)
    assert "no weighting of the parts rebuilds" in autoopt.report(model)["accumulate"].detail


# `decide` at the first probe's forward, on Linear-Tanh-Linear over 4 features: Tanh's output is
# saved (8 float32 per row, 32 B) and the first layer's input, a view of the 2-row probe (32 B
# whatever the rows). Parts of 4 rows fit 32 + 4 x 32 over the state.
LINE_TAIL = (
    "measured on 1 and 2 samples of the first batch; optimizer.step(), zero_grad() and LR "
    "schedulers act once per batch"
)


def _deciding(
    monkeypatch: pytest.MonkeyPatch | None = None, other: int = 1, over_state: int | None = 160
) -> tuple[MicroBatcher, list[tuple[str, int]]]:
    batcher, sent = _batcher(monkeypatch, other)
    batcher.root = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    batcher.state = state_memory(batcher.root, None)
    if over_state is not None:
        batcher.budget_option = batcher.state.state + over_state
    else:
        batcher.budget_option = None
    batcher.probe, batcher.rows = 2, 8
    return batcher, sent


def _decide(batcher: MicroBatcher, *args: Any) -> None:
    args = args or (torch.randn(2, 4),)
    batcher.decide(batcher.root, args, {})


def test_the_decision_its_report_line_and_memory_section() -> None:
    batcher, _ = _deciding()
    _decide(batcher)
    assert batcher.part_rows == 4 and not batcher.stood_down
    choice = choose_parts(8, batcher.state.state, 64, 96, batcher.state.state + 160)
    assert batcher.report["accumulate"].detail == (
        "auto: 2 micro-batches of <= 4 samples per batch of 8 (fewer for a smaller last batch; "
        "the first batch is probed first on 2 samples, then on each alone, their gradients "
        f"zeroed): {choice.render()}, {LINE_TAIL}"
    )
    memory = batcher.report.memory
    assert memory is not None and memory.budget == batcher.state.state + 160
    assert (memory.before.activations, memory.after.activations) == (32 + 32 * 8, 32 + 32 * 4)
    assert memory.before.state == memory.after.state == batcher.state.state


def test_under_ddp_the_decision_is_the_ranks_smallest_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batcher, sent = _deciding(monkeypatch, other=2)  # the other rank fits parts of 2
    _decide(batcher)
    assert batcher.part_rows == 2 and sent == [("MIN", 4)]
    detail = batcher.report["accumulate"].detail
    assert detail.startswith("auto: 4 micro-batches of <= 2 samples per batch of 8 (")
    assert detail.endswith(f"{LINE_TAIL}; DDP all-reduces on the last micro-batch only")


def test_a_batch_that_fits_says_so() -> None:
    batcher, _ = _deciding(over_state=10**6)
    _decide(batcher)
    choice = choose_parts(8, batcher.state.state, 64, 96, batcher.state.state + 10**6)
    assert batcher.report["accumulate"].detail == (
        "auto: a batch of 8 samples fits, batches stay whole (after a probe of 2 samples whose "
        f"gradients are zeroed): {choice.render()}, measured on 1 and 2 samples of the first batch"
    )


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("no probe rows", "the model's inputs have no dimension of the first micro-batch's 2 rows"),
        (
            "a scalar input",
            "the model's inputs have no dimension of the first micro-batch's 2 rows",
        ),
        ("no budget", "memory_budget=None sets no limit on cpu"),
        ("unmeasurable", "could not measure the forward (ValueError: one row is not enough)"),
    ],
)
def test_what_decide_cannot_do_stands_down_with_its_reason(case: str, reason: str) -> None:
    batcher, _ = _deciding(over_state=None if case == "no budget" else 160)
    args: tuple[Any, ...] = (torch.randn(2, 4),)
    if case == "no probe rows":
        args = (torch.randn(3, 4),)
    elif case == "a scalar input":
        args = (torch.tensor(2.0),)
    elif case == "unmeasurable":

        def forward(x: torch.Tensor) -> torch.Tensor:
            if len(x) == 1:
                raise ValueError("one row is not enough")
            return batcher.root(x)

        with pytest.warns(UserWarning):
            batcher.decide(forward, args, {})
        _stood_down(batcher, reason)
        return
    with pytest.warns(UserWarning):
        _decide(batcher, *args)
    _stood_down(batcher, reason)


def test_one_dimensional_inputs_are_rows_too() -> None:
    """Token ids of shape (rows,) into an embedding: measured and split like any batch."""
    batcher, _ = _deciding()
    batcher.root = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 1))
    _decide(batcher, torch.tensor([1, 2]))
    assert not batcher.stood_down and batcher.part_rows is not None


def test_with_rows_cuts_and_repeats_rows_and_leaves_the_rest() -> None:
    ids, scalar, other = torch.tensor([5, 6]), torch.tensor(3.0), torch.ones(3, 2)
    grown = with_rows((ids, scalar, other), 2, 5)
    assert grown[0].tolist() == [5, 6, 5, 6, 5]
    assert grown[1] is scalar and grown[2] is other
    assert with_rows((ids,), 2, 1)[0].tolist() == [5]


# The user's loop through optimize(), compared with the same loop in plain torch on whole
# batches: a regression net on (x, y) batches, mean squared error.


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))


def _batches(*rows: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [(torch.randn(n, 4, generator=gen), torch.randn(n, 1, generator=gen)) for n in rows]


def _loop(model: nn.Module, loader: Any, opt: torch.optim.Optimizer, forwards: int = 1) -> list:
    rows = []
    for batch in loader:
        x, y = batch[0], batch[1]
        rows.append(len(x))
        opt.zero_grad()
        for _ in range(forwards - 1):
            model(x)
        F.mse_loss(model(x), y).backward()
        opt.step()
    return rows


def _run(
    batches: list[Any], part: int, forwards: int = 1, before: bool = False, train: bool = True
) -> tuple[list[int], list[str], nn.Module]:
    """Rows seen, autoopt's warnings, the model; its parameters checked against plain torch."""
    plain = _net()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    _loop(plain, batches, opt)
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = batches[0][0]
    per_row = saved_tensor_bytes(lambda: model(x[:2])) - saved_tensor_bytes(lambda: model(x[:1]))
    fixed = saved_tensor_bytes(lambda: model(x[:1])) - per_row
    budget = state_memory(model, opt).state + fixed + per_row * part
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, loader, opt = autoopt.optimize(
            model,
            batches,
            opt,
            accumulate="auto",
            memory_budget=budget,
            amp=False,
            compile=False,
            verbose=False,
        )
        if before:  # a training forward before the loop (a warm-up, a shape check)
            model(torch.randn(3, 4))
        model.train(train)
        rows = _loop(model, loader, opt, forwards)
    for got, want in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    return rows, [str(w.message) for w in caught if "autoopt" in str(w.message)], model


@pytest.mark.parametrize("rows", [2, 8])
def test_batches_that_fit_stay_whole_without_a_warning(rows: int) -> None:
    """One probe of 2 rows, then every batch whole; the probe closes its cycle with the batch."""
    seen, caught, model = _run(_batches(rows, rows), part=rows)
    assert seen == [2, rows, rows] and caught == []
    assert "batches stay whole" in autoopt.report(model)["accumulate"].detail


def test_a_forward_before_the_loop_decides_nothing() -> None:
    seen, caught, _ = _run(_batches(8, 8), part=4, before=True)
    assert seen == [2, 1, 1, 4, 4, 4, 4] and caught == []


def test_a_first_batch_that_fits_then_a_larger_one_in_parts() -> None:
    """The first batch fits, so no normaliser was measured: the larger one is probed (2 rows,
    then each alone) before its parts."""
    seen, caught, _ = _run(_batches(4, 8), part=4)
    assert seen == [2, 4, 2, 1, 1, 4, 4] and caught == []


def test_batches_of_one_sample_stand_down() -> None:
    seen, caught, model = _run(_batches(1, 1), part=1)
    assert seen == [1, 1]
    reason = "batches of 1 sample: nothing to split"
    assert caught == [f"autoopt accumulate='auto' stands down: {reason}; batches stay whole"]
    assert autoopt.report(model)["accumulate"].detail == stand_down_line(reason)


@pytest.mark.parametrize(
    ("forwards", "train", "reason"),
    [
        (2, True, "the loop did not run one training forward per micro-batch"),
        (1, False, "no training forward of the model ran on the probe"),
    ],
)
def test_a_loop_the_probes_cannot_read_stands_down(forwards: int, train: bool, reason: str) -> None:
    seen, caught, model = _run(_batches(8, 8), part=4, forwards=forwards, train=train)
    assert seen == [2, 8, 8]
    assert caught == [f"autoopt accumulate='auto' stands down: {reason}; batches stay whole"]
    assert autoopt.report(model)["accumulate"].detail == stand_down_line(reason)


def test_batches_that_cannot_be_split() -> None:
    """A first batch with names: stands down. A later one, once split: runs whole, with a
    warning."""
    named = [(x, y, [f"sample {i}" for i in range(len(x))]) for x, y in _batches(8, 8)]
    seen, caught, model = _run(named, part=4)
    assert seen == [8, 8]
    reason = (
        "the first batch (tuple) is not tensors with one first dimension, so it cannot be split "
        "without guessing"
    )
    assert caught == [f"autoopt accumulate='auto' stands down: {reason}; batches stay whole"]
    later: list[Any] = _batches(8)
    later += [named[1]]
    seen, caught, _ = _run(later, part=4)
    assert seen == [2, 1, 1, 4, 4, 8]
    assert caught == ["autoopt accumulate='auto': a batch that cannot be split runs whole"]


def test_with_checkpointing_the_memory_before_is_the_whole_batch_in_eager() -> None:
    """checkpoint="auto" plans the micro-batch; the memory section's before is the user's whole
    batch with every block plain (its fit on 1 and 2 rows of the batch, as eager saves them),
    its after the checkpointed micro-batch."""
    from tests.runtime.checkpoint_models import GPT

    def gpt() -> nn.Module:
        torch.manual_seed(0)
        return GPT(layers=3, width=16)

    tokens = torch.randint(0, 32, (32, 12), generator=torch.Generator().manual_seed(2))
    batches = [(tokens[:16].clone(),), (tokens[16:].clone(),)]
    x = batches[0][0]
    one, two = (saved_tensor_bytes(lambda n=n: gpt()(x[:n])) for n in (1, 2))
    eager = one - (two - one) + (two - one) * 16  # fixed + per row x 16
    model = gpt()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = state_memory(model, opt).state
    model, loader, opt = autoopt.optimize(
        model,
        batches,
        opt,
        accumulate="auto",
        checkpoint="auto",
        memory_budget=state + eager // 6,
        amp=False,
        compile=False,
        verbose=False,
    )
    for (x,) in loader:
        opt.zero_grad()
        F.cross_entropy(model(x)[:, :-1].reshape(-1, 32), x[:, 1:].reshape(-1)).backward()
        opt.step()
    report = autoopt.report(model)
    assert "with every block checkpointed" in report["accumulate"].detail
    memory = report.memory
    assert memory is not None and memory.before.activations == eager
    assert memory.after.activations is not None
    assert memory.after.activations < eager // 6 and memory.budget == state + eager // 6
