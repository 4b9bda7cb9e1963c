"""`optimize()`, `report()` and `unwrap()`: the runtime's public face."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from autoopt.runtime import pipeline, voice
from autoopt.runtime import tune as tuning
from autoopt.runtime.options import Options
from autoopt.runtime.report import PassResult, Report


def optimize(
    model: nn.Module,
    loader: Any = None,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    device: str | torch.device = "auto",
    amp: str | bool = "auto",
    compile: str | bool = "auto",
    channels_last: str | bool = "auto",
    checkpoint: str | bool | int = "auto",
    distributed: str | bool = "auto",
    accumulate: int | str = 1,
    memory_budget: int | str | None = "auto",
    deterministic: bool = False,
    tune: bool = False,
    verbose: bool = True,
    compile_cache: str | os.PathLike[str] | bool = "auto",
) -> Any:
    """Make an existing training loop fast; the loop itself stays as written.

    Returns the objects it was given, in order: the model alone when only the model is given,
    else a tuple of the model and whichever of `loader` and `optimizer` were given. The model and
    optimizer are the same objects, patched in place (under torchrun the model comes back wrapped
    in DistributedDataParallel, with the original `state_dict` keys, or sharded in place by FSDP2;
    `autoopt.full_state_dict(model)` then gives the plain state dict); the loader comes back
    rebuilt or wrapped so that batches arrive on the device.

    Options ("auto" lets autoopt decide per hardware and model, and say why in the report):
      device: "auto" (CUDA if available, else CPU) or any torch device.
      amp: "auto" | "bf16" | "fp16" | "script" | False. fp16 uses dynamic loss scaling that
        needs no change to the loop; bf16 needs none. "auto" on CPU keeps bf16 only if the
        first batch's forward and backward measure faster with it. False asks for fp32 as the
        eager loop computes it: the "auto" choices that change rounding (compile,
        channels_last, an optimizer step that updates apart from the optimizer's own,
        TF32/cudnn.benchmark) stand down, each with a report line; explicit ones
        (compile=True, ...) still apply. "script" leaves precision to the script (its own
        autocast/GradScaler or apex amp, or an fp32 it keeps): autoopt adds no autocast and no
        loss scaling, and makes the other choices as usual (what `autoopt rewrite --wrap`
        writes for such scripts).
      compile: "auto" | True | False | "jit" (TorchScript) | "max-autotune" |
        "reduce-overhead" (torch.compile's modes: Inductor's kernel variants timed at compile
        time; CUDA graphs, the default mode again once an input size changes). Falls back to
        eager on failure. "auto" compiles on CUDA; on CPU it follows the compile cache's record
        for the model (measured against eager at its first training step when there is none);
        tune=True on CUDA measures both modes too.
      channels_last: "auto" | True | False, for convolutional models.
      checkpoint: "auto" | False | int segments. "auto" acts only under a memory budget (an
        explicit memory_budget, or "auto" on CUDA): at the first training forward it measures
        what each block of the model's repeated block stacks saves for backward and checkpoints
        the fewest blocks (selectively where that is enough) that bring the step under it;
        `autoopt.report(model).memory` then shows the step before and after. An int N runs
        every nn.Sequential of 8+ layers as N checkpointed segments.
      distributed: "auto" | True | False | "ddp" | "fsdp"; under torchrun wraps in DDP, or shards
        in place with FSDP2 ("fsdp", or "auto" when parameters + gradients + optimizer state
        exceed memory_budget); the loader gets a DistributedSampler either way.
      accumulate: N > 1 makes the loop accumulate gradients over N batches per optimizer step;
        "auto" keeps each batch as one optimizer step but splits it into the fewest micro-batches
        that fit memory_budget (gradients as the full batch's for a mean-reduced loss).
      memory_budget: "auto" (free device memory on CUDA, no limit on CPU) | None | bytes (int)
        | a size such as "2GiB" or "800MB": what one training step may hold on the device.
      deterministic: determinism flags instead of speed flags, and on CPU no choice made by
        timing or by the compile cache's record that changes a number (layout, bf16, compile,
        an optimizer step that updates apart from the optimizer's own): the same seeded script
        trains as the eager loop does, run after run.
      tune: time candidate plans on real batches and keep the fastest that agrees with fp32.
      verbose: log the report, and each decision made on the first steps, at INFO on the
        `autoopt` logger (rank 0 only; printed to stderr when logging is not configured);
        False logs them at DEBUG.
      compile_cache: where torch.compile's artifacts are kept across restarts, keyed by model
        structure, input signature, torch version and hardware: "auto" ($AUTOOPT_COMPILE_CACHE,
        else ~/.cache/autoopt/compile), a directory, or False. The report says whether it hit
        and what the first compiled step cost; an entry that cannot be loaded recompiles with a
        warning.

    Environment: AUTOOPT_DISABLE=1 returns the arguments untouched; AUTOOPT_OPTIONS="amp=False,
    compile=True" overrides these options without editing code (the report lists them).
    """
    if voice.disabled():
        voice.say(f"autoopt: {voice.DISABLE_ENV} is set: optimize() changed nothing", verbose)
        given = [model] + [obj for obj in (loader, optimizer) if obj is not None]
        return given[0] if len(given) == 1 else tuple(given)
    settings = dict(
        device=device,
        amp=amp,
        compile=compile,
        channels_last=channels_last,
        checkpoint=checkpoint,
        distributed=distributed,
        accumulate=accumulate,
        memory_budget=memory_budget,
        deterministic=deterministic,
        tune=tune,
        verbose=verbose,
        compile_cache=compile_cache,
    )
    forced = voice.overrides(list(settings))
    options = Options(**{**settings, **forced})
    verbose, tune = options.verbose, options.tune
    pipeline.validate(model, loader, optimizer)  # before tune touches anything
    tuned: PassResult | None = None
    if tune:
        # --- tune=True: measure candidate plans on copies (autoopt.runtime.tune) -------------
        # It returns the user's options with each searched "auto" option decided; the passes
        # below then run with them as if the user had passed them.
        decision = tuning.choose(model, loader, optimizer, options)
        options, tuned = decision.options, decision.result
    ctx = pipeline.prepare(model, loader, optimizer, options, first=tuned)
    returned = ctx.returned_model if ctx.returned_model is not None else model
    ctx.report.overrides = forced
    ctx.report.verbose = verbose
    if ctx.dist is None or ctx.dist.rank == 0:
        voice.say(str(ctx.report), verbose)
    ctx.report.published = True
    given = [returned] + [obj for obj in (ctx.loader, optimizer) if obj is not None]
    if loader is None and ctx.loader is not None:  # a pass never invents a loader
        given.remove(ctx.loader)
    return given[0] if len(given) == 1 else tuple(given)


def report(model: nn.Module) -> Report:
    """What `optimize()` did to this model: every pass, applied / skipped / failed, and why."""
    found = getattr(model, pipeline.APPLIED_ATTR, None)
    if found is None and voice.disabled():  # optimize() returned the model untouched
        return Report(
            [
                PassResult.skipped(
                    "autoopt",
                    f"autoopt is disabled ({voice.DISABLE_ENV} is set): optimize() changed nothing",
                )
            ]
        )
    if found is None:
        raise ValueError("this model was not returned by autoopt.optimize()")
    return found


def unwrap(model: nn.Module) -> nn.Module:
    """The user's own module (through a DDP wrapper); its parameters are the ones being trained."""
    while isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
        model = model.module
    return model


__all__ = ["optimize", "report", "unwrap", "PassResult"]
