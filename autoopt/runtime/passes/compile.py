"""Pass: compile. `torch.compile` of the forward stack, or TorchScript with `compile="jit"`.

The model is not wrapped (no `OptimizedModule`), so `state_dict` keys stay the user's. The
COMPILE layer compiles everything below it: autocast and the channels-last input conversion are
inside the graph; loss-scale hooks and device moves stay outside.

"auto" compiles on CUDA only. On this project's CPU machines compile made a small transformer
17% slower, so on CPU it is skipped; `tune=True` measures it, `compile=True` forces it.

Failures: dynamo/inductor fail lazily, at the first forward (or a later recompile). The layer
catches the error, runs the eager forward instead and, when eager succeeds, stays eager for good
and records FAILED with the fallback in the report. When eager fails too, the error is the
user's (or another pass's), so the eager error is raised and compile is not blamed. A failure in
compiling the backward (AOTAutograd compiles it lazily, inside `loss.backward()`) cannot be
caught here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from autoopt.runtime.context import Context, Forward, ForwardLayer, Stage
from autoopt.runtime.report import PassResult, Report

NAME = "compile"

# What `torch.compile` is called with; module-level so a user (or a test) can choose another
# backend or mode, e.g. `autoopt.runtime.passes.compile.BACKEND = "aot_eager"`.
BACKEND: str | Callable[..., Any] = "inductor"
COMPILE_OPTIONS: dict[str, Any] = {}


def run(ctx: Context) -> PassResult:
    """Register the COMPILE layer (torch.compile) or the TorchScript base forward."""
    choice = ctx.options.compile
    if choice is False:
        return PassResult.skipped(NAME, "compile=False")
    device_type = ctx.device.type if ctx.device is not None else "cpu"
    if choice == "auto" and device_type != "cuda":
        return PassResult.skipped(
            NAME,
            f"not on CUDA ({device_type}): torch.compile made a small transformer 17% slower on "
            "CPU here; pass tune=True to measure it or compile=True to force it",
        )
    if choice == "jit":
        jit = _JitForward(ctx.model, ctx.report)
        ctx.base_forward = jit
        return PassResult.applied(NAME, "TorchScript (script, else trace on the first batch)")
    backend = BACKEND if isinstance(BACKEND, str) else getattr(BACKEND, "__name__", "custom")
    ctx.forward_layers.append(ForwardLayer(NAME, Stage.COMPILE, _compile_layer(ctx.report)))
    why = "compile=True" if choice is True else "CUDA"
    return PassResult.applied(NAME, f"torch.compile (backend {backend!r}; {why})")


def _compile_layer(report: Report) -> Callable[[Forward], Forward]:
    def wrap(forward: Forward) -> Forward:
        compiled = torch.compile(forward, backend=BACKEND, **COMPILE_OPTIONS)
        current: list[Forward] = [compiled]  # one cell: swapped to eager on failure

        def compiled_forward(*args: Any, **kwargs: Any) -> Any:
            fn = current[0]
            if fn is forward:
                return forward(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - any compile error means "run eager"
                out = forward(*args, **kwargs)  # raises the user's own error, if it is one
                current[0] = forward
                _record_failure(report, "torch.compile", err)
                return out

        return compiled_forward

    return wrap


def _record_failure(report: Report, what: str, err: BaseException) -> None:
    message = f"{what} failed: {type(err).__name__}: {_first_line(err)}"
    report.replace(PassResult.failed(NAME, message, "eager forward"))
    warnings.warn(f"autoopt: {message}; falling back to the eager forward", stacklevel=2)


def _first_line(err: BaseException) -> str:
    """A one-line summary; dynamo's wrapper errors name the real error on their next line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = " ".join(lines[:2]) if lines and lines[0].endswith(":") else " ".join(lines[:1])
    return text[:300]


class _JitForward:
    """Stands in for the module's own forward: TorchScript it at the first call (script, else
    trace with that call's inputs), run the script from then on, fall back to eager for good on
    failure. The script shares the module's parameters and buffers, so training updates them.
    It runs inside the autocast layer; tracing itself is done with autocast off, because a
    trace under autocast would bake the casted weights in as constants."""

    def __init__(self, model: nn.Module, report: Report) -> None:
        self.model = model
        self.report = report
        self.script: Any = None
        self.eager: Forward | None = None  # set on failure
        self.__name__ = "forward"  # compose_forward copies metadata onto the outer layer

    def _original(self) -> Forward:
        from autoopt.runtime.forward import original_forward

        return original_forward(self.model)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.eager is not None:
            return self.eager(*args, **kwargs)
        if self.script is None:
            try:
                self.script = self._build(args, kwargs)
            except Exception as err:  # noqa: BLE001 - neither script nor trace: run eager
                return self._fail(err, args, kwargs)
        if self.script.training != self.model.training:  # follow model.train()/eval()
            self.script.train(self.model.training)
        try:
            return self.script(*args, **kwargs)
        except Exception as err:  # noqa: BLE001
            return self._fail(err, args, kwargs)

    def _fail(self, err: BaseException, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        eager = self._original()
        out = eager(*args, **kwargs)  # the user's own error, if eager fails too
        self.eager = eager
        self.script = None
        _record_failure(self.report, "TorchScript", err)
        return out

    def _build(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        model = self.model
        # Scripting and tracing read `model.forward`; hide autoopt's patched forward meanwhile.
        patched = model.__dict__.pop("forward", None)
        try:
            try:
                with warnings.catch_warnings():  # "jit is deprecated": the user asked for it
                    warnings.simplefilter("ignore", DeprecationWarning)
                    return torch.jit.script(model)
            except Exception as script_err:  # noqa: BLE001 - try tracing next
                if kwargs:
                    raise RuntimeError(
                        f"cannot script ({_first_line(script_err)}) nor trace a call with "
                        "keyword arguments"
                    ) from script_err
                device_type = args[0].device.type if args and torch.is_tensor(args[0]) else "cpu"
                with torch.autocast(device_type, enabled=False), warnings.catch_warnings():
                    warnings.simplefilter("ignore", torch.jit.TracerWarning)
                    return torch.jit.trace(model, args, check_trace=False)
        finally:
            if patched is not None:
                model.__dict__["forward"] = patched
