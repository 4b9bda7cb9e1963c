"""Compile you can see: graph breaks, recompiles and compile errors in the report with the
user's file:line (read at compiles only), `explain_compile`, and regional compile."""

from __future__ import annotations

import copy
import inspect
from typing import Any

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime import forward
from autoopt.runtime.compiling import log as compile_log
from autoopt.runtime.passes import compile as compile_pass
from autoopt.runtime.report import Event

from .models import MLP


@pytest.fixture(autouse=True)
def eager_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo for real (breaks and recompiles are dynamo's), no inductor codegen."""
    monkeypatch.setattr(compile_pass, "BACKEND", "eager")


def line_of(func: Any, text: str) -> int:
    """The line number of the first source line of `func` containing `text`."""
    lines, first = inspect.getsourcelines(func)
    return first + next(i for i, line in enumerate(lines) if text in line)


class Breaks(MLP):
    """A data-dependent branch on `.item()`: dynamo cannot trace it and breaks the graph."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.net(x)
        if h.sum().item() > 0:
            h = h * 2
        return h


class ByShape(MLP):
    """A forward dynamo specializes on the batch size (dynamic=False)."""


def compiled(model: nn.Module) -> nn.Module:
    return autoopt.optimize(model, compile=True, amp=False, verbose=False)


def of_kind(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e.kind == kind]


def test_a_graph_break_is_reported_at_the_users_file_and_line() -> None:
    model = compiled(Breaks())
    model(torch.randn(4, 16))
    result = autoopt.report(model)["compile"]
    breaks = of_kind(result.events, "graph break")
    assert [(e.filename, e.lineno) for e in breaks] == [
        (__file__, line_of(Breaks.forward, ".item()"))
    ]
    assert "item()" in breaks[0].reason
    text = str(autoopt.report(model))
    assert f"graph break at tests/runtime/test_compile_visible.py:{breaks[0].lineno}" in text
    row = next(r for r in autoopt.report(model).to_dict() if r["pass"] == "compile")
    assert row["events"][0]["file"] == __file__ and row["events"][0]["kind"] == "graph break"


def test_a_recompile_is_reported_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_pass, "COMPILE_OPTIONS", {"dynamic": False})
    model = compiled(ByShape())
    model(torch.randn(4, 16))
    assert of_kind(autoopt.report(model)["compile"].events, "recompile") == []
    model(torch.randn(8, 16))  # another batch size: the guard on the shape fails
    recompiles = of_kind(autoopt.report(model)["compile"].events, "recompile")
    assert len(recompiles) == 1
    assert recompiles[0].filename == inspect.getsourcefile(MLP)
    assert recompiles[0].lineno == inspect.getsourcelines(MLP.forward)[1]
    assert (
        "size mismatch" in recompiles[0].reason and "expected 4, actual 8" in recompiles[0].reason
    )


def test_a_recompile_entered_through_autoopts_forward_chain_is_reported_at_the_users_code() -> None:
    class Metrics:  # the fields of torch's CompilationMetrics that the events read
        co_filename = inspect.getsourcefile(forward)
        co_firstlineno = 28
        recompile_reason = "tensor 'x' size mismatch at index 0"
        fail_type = None

    origin = ("train.py", 12)
    [event] = compile_log._metrics_events(Metrics(), origin)
    assert (event.kind, event.filename, event.lineno) == ("recompile", "train.py", 12)


def test_records_are_read_only_when_dynamo_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    original = compile_log.events_since
    monkeypatch.setattr(
        compile_log, "events_since", lambda *args: reads.append(1) or original(*args)
    )
    model = compiled(Breaks())
    x = torch.randn(4, 16)
    for _ in range(5):
        model(x)
    assert len(reads) == 1  # the first call compiled; the next four hit dynamo's cache
    assert len(autoopt.report(model)["compile"].events) == 1  # the break, once


def failing_backend(gm: Any, example_inputs: Any) -> Any:
    raise RuntimeError("this backend cannot compile anything")


def test_a_fallback_to_eager_names_where_compile_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_pass, "BACKEND", failing_backend)
    model = compiled(MLP())
    with pytest.warns(UserWarning, match="falling back to the eager forward"):
        model(torch.randn(4, 16))
    result = autoopt.report(model)["compile"]
    assert result.status.value == "failed" and result.fallback == "eager forward"
    errors = of_kind(result.events, "compile error")
    assert errors and "cannot compile anything" in errors[0].reason
    assert errors[0].filename == inspect.getsourcefile(MLP)


def test_explain_compile_lists_breaks_and_recompiles_and_leaves_the_model_alone() -> None:
    torch.manual_seed(0)
    model = Breaks()
    before = copy.deepcopy(model.state_dict())
    events = autoopt.explain_compile(model, torch.randn(4, 16), torch.randn(8, 16), dynamic=False)
    assert (__file__, line_of(Breaks.forward, ".item()")) in {
        (e.filename, e.lineno) for e in of_kind(events, "graph break")
    }
    assert of_kind(events, "recompile")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert "forward" not in model.__dict__  # nothing patched on the user's model


# --- regional compile ------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 16), nn.GELU(), nn.Linear(16, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(x)


class TinyGPT(nn.Module):
    def __init__(self, blocks: int = 3, vocab: int = 11, d: int = 8) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(blocks))
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_repeated_blocks_are_found_and_plain_stacks_are_not() -> None:
    found = compile_pass.repeated_blocks(TinyGPT())
    assert found is not None and found[0] == "blocks" and len(found[1]) == 3
    assert compile_pass.repeated_blocks(MLP()) is None  # Linear, ReLU, Linear: no blocks
    assert compile_pass.repeated_blocks(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))) is None


def counting_backend(calls: list[int]) -> Any:
    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        calls.append(1)
        return gm.forward

    return backend


def test_regional_compile_compiles_one_block_graph_and_matches_eager_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(compile_pass, "BACKEND", counting_backend(calls))
    monkeypatch.setattr(compile_pass, "REGIONAL", True)  # on CPU the rule compiles it whole
    torch.manual_seed(0)
    reference = TinyGPT()
    model = compiled(copy.deepcopy(reference))
    assert "regional: each of the 3 Block blocks" in autoopt.report(model)["compile"].detail
    tokens = torch.randint(0, 11, (2, 5))
    out, expected = model(tokens), reference(tokens)
    out.square().mean().backward()
    expected.square().mean().backward()
    torch.testing.assert_close(out, expected)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert calls == [1]  # the three blocks share one graph: compiled once, not three times
    assert all(b._compiled_call_impl is not None for b in model.blocks)
    assert list(model.state_dict()) == list(reference.state_dict())


def test_regional_off_compiles_the_whole_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_pass, "REGIONAL", False)
    model = compiled(TinyGPT())
    model(torch.randint(0, 11, (2, 5)))
    assert "whole forward (REGIONAL=False)" in autoopt.report(model)["compile"].detail
    assert all(b._compiled_call_impl is None for b in model.blocks)


def test_the_rule_compiles_blocks_regionally_on_cuda_and_the_whole_forward_on_cpu() -> None:
    model = TinyGPT()
    blocks, why = compile_pass.choose_regions(model, None, torch.device("cuda"))
    assert blocks == list(model.blocks) and why.startswith("regional")
    blocks, why = compile_pass.choose_regions(model, None, torch.device("cpu"))
    assert blocks == [] and why.startswith("whole forward on cpu")
    assert "REGIONAL=True forces it" in why
    compiled_on_cpu = compiled(TinyGPT())
    compiled_on_cpu(torch.randint(0, 11, (2, 5)))
    assert "whole forward on cpu" in autoopt.report(compiled_on_cpu)["compile"].detail
    assert all(b._compiled_call_impl is None for b in compiled_on_cpu.blocks)


def test_a_copy_of_a_regionally_compiled_model_runs_its_own_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compile_pass, "REGIONAL", True)
    torch.manual_seed(0)
    model = compiled(TinyGPT())
    tokens = torch.randint(0, 11, (2, 5))
    model(tokens)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(1.0)
    torch.testing.assert_close(twin(tokens), _eager(twin, tokens))
    torch.testing.assert_close(model(tokens), _eager(model, tokens))  # the original is its own


def _eager(model: TinyGPT, tokens: torch.Tensor) -> torch.Tensor:
    plain = TinyGPT()
    plain.load_state_dict(model.state_dict())
    return plain(tokens)


def test_regional_failure_falls_back_to_the_eager_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_pass, "BACKEND", failing_backend)
    monkeypatch.setattr(compile_pass, "REGIONAL", True)
    torch.manual_seed(0)
    reference = TinyGPT()
    model = compiled(copy.deepcopy(reference))
    assert "regional" in autoopt.report(model)["compile"].detail
    tokens = torch.randint(0, 11, (2, 5))
    with pytest.warns(UserWarning, match="falling back to the eager forward"):
        out = model(tokens)
    torch.testing.assert_close(out, reference(tokens))
    assert autoopt.report(model)["compile"].status.value == "failed"
    assert all(b._compiled_call_impl is None for b in model.blocks)
