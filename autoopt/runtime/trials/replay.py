"""Running a forward again as if an earlier run had not happened: the buffers it updated
(BatchNorm running statistics, counters, any buffer) and the RNG states it consumed (dropout)
are put back first."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from autoopt.runtime.loading.batch import tensors_in
from autoopt.runtime.memory import not_counted


class Replay:
    """A module's buffers and the RNG states (and with `parameters`, its parameters' values),
    taken before a forward, to restore before a rerun."""

    def __init__(self, module: nn.Module, parameters: bool = False) -> None:
        # By owner and name: a later `module.to(memory_format=...)` may replace 4-D buffers.
        self.buffers = [
            (owner, name, buffer.clone())
            for owner in module.modules()
            for name, buffer in owner._buffers.items()
            if buffer is not None
        ]
        # A forward that writes its weights in place (rare) must not keep a trial's writes.
        self.params = (
            [(p, p._version, p.detach().clone()) for p in module.parameters()] if parameters else []
        )
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def restore(self) -> None:
        """Put the buffers' (and parameters') values and the RNG states back as they were."""
        with torch.no_grad():
            for owner, name, saved in self.buffers:
                live = owner._buffers.get(name)
                if live is not None:
                    live.copy_(saved)
            for param, version, saved in self.params:
                if param._version != version:
                    param.copy_(saved)
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


_open_trials = 0  # trial_forwards contexts entered and not yet left


def in_trial() -> bool:
    """Whether a forward now is a trial (`trial_forwards`): layers that measure or decide at
    the first real forward let it through as it is."""
    return _open_trials > 0


@contextlib.contextmanager
def trial_forwards(module: nn.Module, backward: bool = False) -> Iterator[None]:
    """Forwards run inside are trials: afterwards the parameters, buffers, RNG states and
    train/eval modes are as they were before. Without `backward` they run in eval mode without
    gradients; with it in the module's own mode, gradients on, outside inference mode. What
    the trials save for backward is not counted by a memory measurement around them
    (`memory.not_counted`)."""
    global _open_trials
    replay = Replay(module, parameters=True)
    modes = [(m, m.training) for m in module.modules()]
    if not backward:
        module.eval()
    _open_trials += 1
    try:
        with (
            torch.inference_mode(False),
            torch.set_grad_enabled(backward),
            not_counted(),
        ):
            yield
    finally:
        _open_trials -= 1
        for m, training in modes:
            m.training = training
        replay.restore()


def _grad_of_sum(out: object, params: list[torch.Tensor]) -> None:
    losses = [t.float().sum() for t in tensors_in(out) if t.is_floating_point() and t.requires_grad]
    if losses and params:
        # This graph is the trial's own, freed here (a compiled backward refuses retain_graph
        # with donated buffers).
        torch.autograd.grad(sum(losses), params, allow_unused=True)
