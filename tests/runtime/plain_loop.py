"""The training loop of `models.train`, written with torch's own tools instead of optimize():
`torch.autocast` + `torch.amp.GradScaler` for amp, `torch.compile` / channels_last by hand. Tests
compare optimize()'s run with this one instead of only checking that the loss falls."""

from __future__ import annotations

import torch
from torch import nn

import autoopt
from autoopt.runtime.trials import choices as trials


def step_configs(model: nn.Module, steps: int) -> list[dict[str, str]]:
    """The configuration of the measured choices (layout, amp) each of the first `steps`
    training steps of an optimized model ran under: the trials' log, then the winners ({}: the
    model measured nothing)."""
    found = trials.of_model(autoopt.unwrap(model))
    if found is None:
        return [{} for _ in range(steps)]
    log = dict(found.log)
    return [log.get(i + 1, found.winners) for i in range(steps)]


def train_by_hand(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: object,
    epochs: int = 1,
    clip: float | None = 1.0,
    dtype: torch.dtype | None = None,
    channels_last: bool = False,
    configs: list[dict[str, str]] | None = None,
) -> list[float]:
    """Every step's loss of the loop torch documents for `dtype` autocast on CPU (None: fp32).
    `configs` (`step_configs`): per step, the layout and bf16-or-fp32 that step ran under."""
    loss_fn = nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    losses = []
    step = 0
    for _ in range(epochs):
        for x, y in loader:  # type: ignore[attr-defined]
            config = configs[step] if configs else {}
            step += 1
            step_dtype = {"bf16": torch.bfloat16, "fp32": None}.get(config.get("amp", ""), dtype)
            layout = config.get("channels_last")
            if layout is not None:
                fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
                model.to(memory_format=fmt)
                x = x.contiguous(memory_format=fmt)
            elif channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            optimizer.zero_grad()
            with torch.autocast(
                "cpu", dtype=step_dtype or torch.bfloat16, enabled=step_dtype is not None
            ):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            if clip is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(optimizer)
            scaler.update()
            losses.append(loss.item())
    return losses


def amp_dtype(detail: str, applied: bool) -> torch.dtype | None:
    """The autocast dtype optimize()'s amp report line says it chose (None: fp32)."""
    if not applied:
        return None
    return torch.float16 if detail.startswith("fp16") else torch.bfloat16


def assert_same_training(
    got: list[float], expected: list[float], dtype: torch.dtype | None
) -> None:
    """Per-step losses equal within the rounding of `dtype`: fp32 kernels differ in summation
    order only (1e-4); bf16 keeps 8 mantissa bits and fp16 11, and the drift grows over steps."""
    rtol = {None: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}[dtype]
    assert len(got) == len(expected)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=rtol, atol=rtol)
