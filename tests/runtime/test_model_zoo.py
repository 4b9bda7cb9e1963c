"""Real architectures from `transformers` (small configs, random init, no downloads) trained a few
steps through `optimize()`, against the same loop in plain torch from the same weights and seeds:
with the defaults, and with each option (`amp="bf16"` against `torch.autocast(bf16)`,
`compile=True`, `tune=True`, `channels_last=True`), and GPT-2's own reentrant gradient
checkpointing under `amp="fp16"` against `torch.autocast(fp16)` + `torch.amp.GradScaler`.
Models: GPT-2, BERT, Llama, T5, ViT, ResNet, ConvNeXt (no torchvision/timm: their CPU wheels do
not load beside this torch).

Dropout stays on as configured (0.1 in most of these): the trials `optimize()` runs on the first
steps must not draw from the RNG, or the dropout masks, and so the losses, differ. The loss is
the model's own (`labels=`); the optimizer is AdamW. Compared at every step: the loss, and the
gradient of every parameter (as one vector: relative L2 error) before `step()`, so a gradient
off by a factor (a scale applied twice, a term missing) fails even where AdamW would hide it; at
the end the parameters, as the error relative to how far eager moved them.

Where a step ran under bf16 autocast (`amp="auto"` on a CPU with native bf16: the trials run
bf16 and fp32 on the first steps, then keep the faster; or `amp="bf16"`), the reference loop
runs that step under `torch.autocast("cpu", torch.bfloat16)` too (`plain_loop.step_configs`).
Tolerances are per dtype (`TOL`): fp32 runs differ only by kernel choice (layout, fused
optimizer); bf16 on both sides runs the same casts, compile fuses and rounds in another order.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime import tune
from autoopt.runtime.report import Report

from .plain_loop import step_configs

transformers = pytest.importorskip("transformers")

STEPS = 3
LR = 1e-3
# Relative errors allowed (gradient vector, loss, parameter update) per computation dtype.
TOL = {"fp32": 1e-4, "bf16": 1e-3, "fp16": 1e-3, "compiled fp32": 1e-3}
VOCAB, CLASSES = 64, 3
Batch = dict[str, torch.Tensor]


def _gpt2(dropout: float = 0.1) -> nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
        bos_token_id=0, eos_token_id=0,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def _bert() -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, num_labels=CLASSES,
    )  # fmt: skip
    return transformers.BertForSequenceClassification(config)


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _t5() -> nn.Module:
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    return transformers.T5ForConditionalGeneration(config)


def _vit() -> nn.Module:
    config = transformers.ViTConfig(
        image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=CLASSES, hidden_dropout_prob=0.1,
    )  # fmt: skip
    return transformers.ViTForImageClassification(config)


def _resnet() -> nn.Module:
    config = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=CLASSES
    )
    return transformers.ResNetForImageClassification(config)


def _convnext() -> nn.Module:
    config = transformers.ConvNextConfig(
        num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=CLASSES,
        drop_path_rate=0.1,  # stochastic depth: random in training, like dropout
    )  # fmt: skip
    return transformers.ConvNextForImageClassification(config)


def _tokens(gen: torch.Generator, length: int = 12) -> torch.Tensor:
    return torch.randint(0, VOCAB, (4, length), generator=gen)


def _lm(gen: torch.Generator) -> Batch:
    ids = _tokens(gen)
    return {"input_ids": ids, "labels": ids}


def _classify_text(gen: torch.Generator) -> Batch:
    return {"input_ids": _tokens(gen), "labels": torch.randint(0, CLASSES, (4,), generator=gen)}


def _seq2seq(gen: torch.Generator) -> Batch:
    return {"input_ids": _tokens(gen), "labels": _tokens(gen, 8)}


def _images(size: int) -> Callable[[torch.Generator], Batch]:
    def batch(gen: torch.Generator) -> Batch:
        return {
            "pixel_values": torch.randn(4, 3, size, size, generator=gen),
            "labels": torch.randint(0, CLASSES, (4,), generator=gen),
        }

    return batch


ZOO: dict[str, tuple[Callable[[], nn.Module], Callable[[torch.Generator], Batch]]] = {
    "gpt2": (_gpt2, _lm),
    "bert": (_bert, _classify_text),
    "llama": (_llama, _lm),
    "t5": (_t5, _seq2seq),
    "vit": (_vit, _images(16)),
    "resnet": (_resnet, _images(32)),
    "convnext": (_convnext, _images(32)),
}


MODELS = list(ZOO)


def _batch(name: str, step: int) -> Batch:
    return ZOO[name][1](torch.Generator().manual_seed(100 + step))


def _loop(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    batches: Iterable[Batch],
    bf16: list[bool] | None = None,
    layouts: list[str | None] | None = None,
) -> tuple[list[float], list[torch.Tensor]]:
    """The user's loop: losses and the gradient vector of each step (before `step()`); `bf16`:
    per step, whether it runs under `torch.autocast(bf16)`; `layouts`: per step, the memory
    format the model and its 4-D inputs take (the layout trial's "channels_last" or
    "contiguous"; None: as they are)."""
    torch.manual_seed(1)  # dropout masks
    losses, grads = [], []
    for step, batch in enumerate(batches):
        layout = layouts[step] if layouts else None
        if layout is not None:
            fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
            model.to(memory_format=fmt)
            batch = {
                k: v.contiguous(memory_format=fmt) if v.dim() == 4 else v for k, v in batch.items()
            }
        with torch.autocast("cpu", torch.bfloat16, enabled=bool(bf16 and bf16[step])):
            loss = model(**batch).loss
        loss.backward()
        losses.append(loss.item())
        grads.append(torch.cat([p.grad.flatten().double() for p in model.parameters()]))
        opt.step()
        opt.zero_grad()
    return losses, grads


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().double() for p in model.parameters()])


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _compare(name: str, dtype: str | None, **options: Any) -> Report:
    """Train `name` through `optimize(**options)` and by hand; assert they agree within
    TOL[dtype] (None: "bf16" where the report says bf16 autocast was kept, else "fp32"). The
    reference autocasts in bf16 where the report says the run did."""
    build, _ = ZOO[name]
    torch.manual_seed(0)
    model = build()
    eager, start = copy.deepcopy(model), copy.deepcopy(model)
    batches = [_batch(name, step) for step in range(STEPS)]  # the loader: a list of batches
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' config notes; the report is checked
        model, loader, opt = autoopt.optimize(model, batches, opt, verbose=False, **options)
    losses, grads = _loop(model, opt, loader)
    report = autoopt.report(model)
    amp = report["amp"]
    kept_bf16 = amp.status.value == "applied" and "bf16" in amp.detail
    # Per step: bf16 where the trials ran that step in bf16 (amp="auto" on a CPU with native
    # bf16: the first steps take turns), else what the report says was kept.
    configs = step_configs(model, STEPS)
    bf16 = [c["amp"] == "bf16" if "amp" in c else kept_bf16 for c in configs]
    # Per step, the layout the layout trial ran that step in (bf16 kernels of the two layouts
    # round apart by more than the bf16 tolerance on some CPUs).
    layouts = [c.get("channels_last") for c in configs]
    if dtype is None:
        dtype = "bf16" if any(bf16) else "fp32"
    assert any(bf16) == (dtype == "bf16"), amp.detail
    eager_losses, eager_grads = _loop(
        eager, torch.optim.AdamW(eager.parameters(), lr=LR), batches, bf16, layouts
    )
    tol = TOL[dtype]
    assert len(losses) == STEPS
    for step in range(STEPS):
        assert losses[step] == pytest.approx(eager_losses[step], rel=tol), f"step {step} loss"
        err = _relative(grads[step], eager_grads[step])
        assert err <= tol, f"step {step}: gradients differ from eager by {err:.3g}"
    ours = autoopt.unwrap(model)
    # As one vector: AdamW moves a parameter whose gradient is pure rounding noise (a key bias,
    # which softmax ignores) by ~lr in a random direction, on either side.
    final, reference, initial = (_flat(m) for m in (ours, eager, start))
    err = _relative(final - initial, reference - initial)
    assert err <= max(tol, 1e-3), f"the parameters' updates differ from eager's by {err:.3g}"
    # The state dict is the plain model's, and loads into it.
    start.load_state_dict(ours.state_dict())
    return report


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_defaults_train_like_eager(name: str) -> None:
    _compare(name, None)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_bf16_trains_like_torch_autocast(name: str) -> None:
    _compare(name, "bf16", amp="bf16")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet", "convnext"])
def test_channels_last_trains_like_eager(name: str) -> None:
    report = _compare(name, "fp32", amp=False, channels_last=True)
    assert report["channels_last"].status.value == "applied", report["channels_last"].detail


@pytest.mark.slow
def test_tune_trains_like_eager(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(tune.CACHE_ENV, str(tmp_path))
    report = _compare("bert", None, tune=True, compile=False)
    tuned = report["tune"]
    assert tuned.status.value == "applied", tuned.detail
    assert "rejected" not in tuned.detail, tuned.detail  # every plan agreed with fp32 eager


@pytest.mark.slow
def test_compile_trains_like_eager() -> None:
    """With its dropout on: autoopt's compile draws eager's masks (red when inductor drew its
    own)."""
    report = _compare("gpt2", "compiled fp32", amp=False, compile=True)
    assert report["compile"].status.value == "applied", report["compile"].detail


@pytest.mark.slow
def test_fp16_with_the_models_own_reentrant_checkpointing_matches_gradscaler() -> None:
    """GPT-2's own `gradient_checkpointing_enable(use_reentrant=True)` under amp="fp16", against
    `torch.autocast(fp16)` + `torch.amp.GradScaler`: every parameter's gradient, the embeddings
    before both checkpointed blocks included (a second unscaling there is a factor 65536)."""
    torch.manual_seed(0)
    model = _gpt2()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # renamed in later transformers; this name still works
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    eager = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt = autoopt.optimize(
            model, optimizer=opt, verbose=False, amp="fp16", compile=False
        )
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=LR)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for step in range(STEPS):
        batch = _batch("gpt2", step)
        torch.manual_seed(step)
        model(**batch).loss.backward()
        torch.manual_seed(step)
        with torch.autocast("cpu", torch.float16):
            loss = eager(**batch).loss
        scaler.scale(loss).backward()
        scaler.unscale_(eager_opt)
        ours = autoopt.unwrap(model).named_parameters()
        for (key, p), q in zip(ours, eager.parameters(), strict=True):
            err = _relative(p.grad.double(), q.grad.double())
            assert err <= TOL["fp16"], f"step {step}, {key}: gradient off by {err:.3g}"
        opt.step()
        opt.zero_grad()
        scaler.step(eager_opt)
        scaler.update()
        eager_opt.zero_grad()
