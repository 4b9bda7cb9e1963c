"""Compiled graphs that draw eager's random numbers.

Inductor generates its own random numbers by default (a Philox stream seeded once per graph call
from the global generator): a compiled dropout mask, `torch.rand*` or `randn_like` in a forward
differ from eager's, and the global generator ends in another state, so a seeded run that
compiles (or measures compile on its first steps) trains differently from the same run in eager.
Inductor's `fallback_random` makes it call torch's own random kernels, in the graph's order, on
the global generator: the same numbers as eager and the same generator state after a step
(measured on CPU with Dropout, `torch.bernoulli` and `randn_like`, forward and backward). It is
set as an option of autoopt's own `torch.compile` calls only, never in the global config, so the
user's own compiles keep Inductor's defaults.

"eager" and "aot_eager" run torch's own kernels already. Any other backend may generate its own
numbers: `draws_eager_random` says no, and the compile pass says so in its report line and
keeps eager under `deterministic=True`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Backends that run torch's own random kernels in eager's order (measured: Dropout, bernoulli,
# randn_like give eager's numbers and generator state).
_EAGER_KERNELS = ("eager", "aot_eager")


def draws_eager_random(backend: str | Callable[..., Any]) -> bool:
    """Whether `torch.compile(backend=backend)` through `compile_kwargs` draws eager's random
    numbers."""
    return backend == "inductor" or backend in _EAGER_KERNELS


def compile_kwargs(backend: str | Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """`torch.compile` keyword arguments for `backend` with `options` (autoopt's
    `COMPILE_OPTIONS`), Inductor told to use eager's random kernels. Inductor takes a `mode` or
    an `options` dict, not both: a mode is turned into the options it stands for."""
    kwargs = {"backend": backend, **options}
    if backend != "inductor":
        return kwargs
    import torch._inductor

    mode = kwargs.pop("mode", None)
    inductor_options = dict(torch._inductor.list_mode_options(mode) if mode else {})
    inductor_options.update(kwargs.pop("options", None) or {})
    inductor_options["fallback_random"] = True
    return {**kwargs, "options": inductor_options}
