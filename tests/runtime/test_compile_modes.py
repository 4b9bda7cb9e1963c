"""compile="max-autotune" / "reduce-overhead": torch.compile's modes passed on, CUDA graphs
ended once input sizes keep changing, and on CPU the same training as torch's own compile."""

from __future__ import annotations

import pytest
import torch

import autoopt
from autoopt.runtime.passes import compile as compile_pass

from .models import MLP, batches, mlp_data, train
from .plain_loop import assert_same_training, train_by_hand

pytestmark = pytest.mark.slow


def fit(compile: object, sizes: list[int] | None = None) -> tuple[torch.nn.Module, list[float]]:
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, compile=compile, amp=False, verbose=False
    )
    return model, train(model, optimizer, loader(sizes), epochs=2)


def loader(sizes: list[int] | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = mlp_data(96)
    if sizes is None:
        return batches(x, y, 32)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [(x[s : s + n], y[s : s + n]) for s, n in zip(starts, sizes, strict=True)]


def by_hand(sizes: list[int] | None = None, **compile_kwargs: object) -> list[float]:
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    run = torch.compile(model, **compile_kwargs) if compile_kwargs else model
    return train_by_hand(run, optimizer, loader(sizes), epochs=2)


def test_reduce_overhead_on_cpu_trains_as_torchs_own_compile_in_that_mode() -> None:
    torch._dynamo.reset()
    model, losses = fit("reduce-overhead")
    result = autoopt.report(model)["compile"]
    assert result.status.value == "applied"
    assert "CUDA graphs capture CUDA kernels only" in result.detail
    assert_same_training(losses, by_hand(mode="reduce-overhead"), None)


def test_a_third_input_size_ends_cuda_graphs_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full batch and a ragged last one keep the mode; a third size compiles the model in the
    default mode from that call on, with one report line."""
    monkeypatch.setattr(compile_pass, "BACKEND", "aot_eager")  # dynamo for real, no codegen
    monkeypatch.setattr(compile_pass, "compile_mode", lambda option: option)
    torch._dynamo.reset()
    compiled_modes: list[object] = []
    compile = torch.compile

    def spy(*args: object, **kwargs: object) -> object:
        compiled_modes.append(kwargs.get("mode"))
        return compile(*args, **kwargs)

    monkeypatch.setattr(torch, "compile", spy)
    sizes = [32, 32, 16, 16]  # two sizes, twice over two epochs: the mode stays
    model, losses = fit("reduce-overhead", sizes)
    assert compiled_modes == ["reduce-overhead"]
    assert not [e for e in autoopt.report(model)["compile"].events if e.kind == "CUDA graphs off"]
    assert_same_training(losses, by_hand(sizes), None)

    compiled_modes.clear()
    sizes = [32, 16, 24, 24]
    model, losses = fit("reduce-overhead", sizes)
    assert compiled_modes == ["reduce-overhead", None]  # recompiled once, in the default mode
    off = [e for e in autoopt.report(model)["compile"].events if e.kind == "CUDA graphs off"]
    assert len(off) == 1 and "default mode" in off[0].reason
    assert_same_training(losses, by_hand(sizes), None)


def test_a_mode_is_named_in_the_report_and_the_compile_cache_key() -> None:
    how, why = compile_pass.choose("max-autotune", torch.device("cuda"))
    assert how == "torch.compile" and "max-autotune" in why
    assert compile_pass.compile_mode("max-autotune") == "max-autotune"
    assert compile_pass.compile_mode(True) is None
    assert compile_pass._cache_extra([], "max-autotune") != compile_pass._cache_extra([])


def test_own_outputs_leaves_cpu_tensors_as_they_are() -> None:
    out = {"logits": torch.randn(2, 3), "aux": [torch.ones(1)]}
    owned = compile_pass.own_outputs(out)
    assert owned["logits"] is out["logits"] and owned["aux"][0] is out["aux"][0]
