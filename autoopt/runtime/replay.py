"""Running a forward again as if an earlier run had not happened: the buffers it updated
(BatchNorm running statistics, counters, any buffer) and the RNG states it consumed (dropout)
are put back first."""

from __future__ import annotations

import torch
from torch import nn


class Replay:
    """A module's buffers and the RNG states, taken before a forward, to restore before rerun."""

    def __init__(self, module: nn.Module) -> None:
        # By owner and name: a later `module.to(memory_format=...)` may replace 4-D buffers.
        self.buffers = [
            (owner, name, buffer.clone())
            for owner in module.modules()
            for name, buffer in owner._buffers.items()
            if buffer is not None
        ]
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def restore(self) -> None:
        """Put the buffers' values and the RNG states back as they were."""
        with torch.no_grad():
            for owner, name, saved in self.buffers:
                live = owner._buffers.get(name)
                if live is not None:
                    live.copy_(saved)
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
