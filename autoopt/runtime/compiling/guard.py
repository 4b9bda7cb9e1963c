"""Guarding a compiled forward through its first backward.

AOTAutograd compiles the backward lazily, inside the user's `loss.backward()`, where an error
can be neither caught nor undone; and its compiled backward cannot itself be differentiated
(`autograd.grad(..., create_graph=True)` through it, then `.backward()` of the result: "does not
currently support double backward"). `BackwardGuard.probe` runs the compiled forward and the
backward of its outputs' sum as a trial (`replay.trial_forwards`: buffers, RNG and modes put
back; `autograd.grad`, so no `.grad` and no optimizer state is touched), which compiles both
where a failure can still be undone. `BackwardGuard.watch` hooks a forward's outputs: a backward
through them that builds a graph (grad mode on inside the engine: `create_graph=True`) marks a
double backward, at the user's file:line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from autoopt.runtime.compiling.log import Where, user_call_site
from autoopt.runtime.loading.batch import tensors_in
from autoopt.runtime.trials.replay import _grad_of_sum, trial_forwards


class BackwardGuard:
    """What the first backward of one compiled model showed: `probed` once the compiled forward
    and backward ran as a trial; `double_backward` (where) once a backward through the model's
    outputs built a graph."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.probed = False
        self.double_backward: Where | None = None

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def probe(self, compiled: Callable[[], Any]) -> None:
        """Run `compiled()` and the backward of its floating outputs' sum as a trial; raises
        what either raised."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        with trial_forwards(self.model, backward=True):
            _grad_of_sum(compiled(), params)

    def watch(self, out: Any) -> None:
        """Hook `out`'s tensors that require grad: a backward through them with grad mode on
        (create_graph=True) records where it was called from."""
        if self.double_backward is not None or not torch.is_grad_enabled():
            return
        for tensor in tensors_in(out):
            if tensor.requires_grad:
                tensor.register_hook(self._hook)

    def _hook(self, grad: torch.Tensor) -> None:
        if torch.is_grad_enabled() and self.double_backward is None:
            self.double_backward = user_call_site()
