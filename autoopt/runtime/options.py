"""The options of `optimize()`, validated once, with errors that name the option and its choices."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

import torch

from autoopt.runtime.memory import parse_budget

# torch.compile's modes, passed on as `mode=`: "max-autotune" times Inductor's kernel variants
# (a longer compile), "reduce-overhead" replays CUDA graphs (launch-bound steps, static shapes).
COMPILE_MODES = ("max-autotune", "reduce-overhead")

_CHOICES: dict[str, tuple[Any, ...]] = {
    # "script": the precision is the script's own (its autocast/GradScaler, apex amp, or fp32 it
    # keeps): autoopt adds no autocast and no loss scaling, the other choices are made as usual.
    "amp": ("auto", "bf16", "fp16", "script", False),
    "compile": ("auto", True, False, "jit", *COMPILE_MODES),
    "channels_last": ("auto", True, False),
    "distributed": ("auto", True, False, "ddp", "fsdp"),
}


@dataclass(frozen=True)
class Options:
    """Every switch of `optimize()`; see its docstring for what each does."""

    device: str | torch.device = "auto"
    amp: str | bool = "auto"
    compile: str | bool = "auto"
    channels_last: str | bool = "auto"
    checkpoint: str | bool | int = "auto"
    distributed: str | bool = "auto"
    accumulate: int | str = 1
    memory_budget: int | str | None = "auto"
    deterministic: bool = False
    tune: bool = False
    verbose: bool = True
    compile_cache: str | os.PathLike[str] | bool = "auto"

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            # `True == 1` in Python: compare with identity for bools so 1 is not taken for True.
            if not any(value is a if isinstance(a, bool) else value == a for a in allowed):
                raise ValueError(_bad(name, value, allowed))
        if not _auto_or_false(self.checkpoint) and not (
            isinstance(self.checkpoint, int)
            and not isinstance(self.checkpoint, bool)
            and self.checkpoint >= 1
        ):
            raise ValueError(_bad("checkpoint", self.checkpoint, ("auto", False, "an int >= 1")))
        if not (isinstance(self.accumulate, str) and self.accumulate == "auto") and (
            not isinstance(self.accumulate, int)
            or isinstance(self.accumulate, bool)
            or self.accumulate < 1
        ):
            raise ValueError(_bad("accumulate", self.accumulate, ("auto", "an int >= 1")))
        # Stored parsed: "auto", None or bytes.
        object.__setattr__(self, "memory_budget", parse_budget(self.memory_budget))
        for name in ("deterministic", "tune", "verbose"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(_bad(name, getattr(self, name), (True, False)))
        if not (isinstance(self.compile_cache, str | os.PathLike) or self.compile_cache is False):
            raise ValueError(
                _bad("compile_cache", self.compile_cache, ("auto", False, "a directory"))
            )
        if self.device != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError) as err:
                raise ValueError(
                    f"optimize(device={self.device!r}): not a torch device ({err}); "
                    "use 'auto', 'cpu', 'cuda', 'cuda:1', or a torch.device"
                ) from None

    @classmethod
    def names(cls) -> list[str]:
        """The option names, in signature order."""
        return [f.name for f in fields(cls)]


def _auto_or_false(value: Any) -> bool:
    # By identity: `0 == False` in Python, and 0 is not a valid "off".
    return value is False or (isinstance(value, str) and value == "auto")


def _bad(name: str, value: object, allowed: tuple[Any, ...]) -> str:
    shown = ", ".join(map(_show, allowed))
    return f"optimize({name}={value!r}) is not allowed; {name} must be one of: {shown}"


def _show(value: Any) -> str:
    return value if isinstance(value, str) and value.startswith("an ") else repr(value)


def eager_numerics(options: Options, timed: bool) -> str | None:
    """Why an "auto" choice that changes how fp32 rounds (compile, the layout, bf16, the
    optimizer's kernels, cuDNN's timed algorithms and TF32) keeps eager's kernels instead, as a
    clause for its report line; None when it may go ahead. `timed`: here the choice would be
    made by timing (or by the compile cache's record of a timing), as on CPU.

    One meaning for every pass: `amp=False` asks for fp32 as the user's own eager loop computes
    it, so eager's kernels stay wherever the choice is made; `deterministic=True` asks for the
    same training run after run, so a choice that timing would make stands down (a rule, as on
    CUDA, makes the same choice every run). An explicit option (compile=True, ...) is the
    user's and is not asked about. `amp="script"` is not `amp=False`: the script keeps its own
    precision and the other choices go ahead."""
    if options.deterministic and timed:
        return "deterministic=True: on CPU timing would choose, so runs could differ"
    if options.amp is False:
        return "amp=False keeps eager's fp32 kernels"
    return None
