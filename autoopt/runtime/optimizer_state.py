"""The optimizer's checkpoints hold the user's choices, not autoopt's.

`optimizer.state_dict()` is what a user saves to resume, maybe into a plain optimizer on another
machine. autoopt's choices stay out of it: the `fused`/`foreach` flags it set come back as the
user had them, and state tensors of channels-last parameters come back contiguous. Loading any
checkpoint (plain or not) into an optimized optimizer puts autoopt's flags back and lays the
state out like its parameters. All through torch's optimizer state-dict hooks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class UserFlags:
    """State-dict post hook: the param groups carry the user's `fused`/`foreach` values."""

    def __init__(self, user: dict[str, Any]) -> None:
        self.user = user

    def __call__(self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
        for group in state_dict["param_groups"]:  # fresh dicts, made by state_dict()
            for key, value in self.user.items():
                if key in group:
                    group[key] = value


class AutooptFlags:
    """Load-state-dict pre hook: loaded param groups get autoopt's flags back (before torch
    moves the `step` state, which a fused step wants on the parameter's device)."""

    def __init__(self, ours: dict[str, Any]) -> None:
        self.ours = ours

    def __call__(
        self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
    ) -> dict[str, Any]:
        groups = [{**group, **self.ours} for group in state_dict["param_groups"]]
        return {**state_dict, "param_groups": groups}  # the caller's dict stays untouched


def contiguous_state(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    """State-dict post hook: state tensors in the default (contiguous) layout."""
    state = state_dict["state"]
    for key, values in state.items():
        if any(isinstance(v, torch.Tensor) and not v.is_contiguous() for v in values.values()):
            # A new dict: the one in `state_dict` is the optimizer's live state.
            state[key] = {
                k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in values.items()
            }


def state_like_params(optimizer: torch.optim.Optimizer) -> None:
    """Load-state-dict post hook: each state tensor laid out like its parameter."""
    for param, values in optimizer.state.items():
        for key, value in values.items():
            if (
                isinstance(value, torch.Tensor)
                and value.shape == param.shape
                and value.stride() != param.stride()
            ):
                values[key] = torch.empty_like(param, dtype=value.dtype).copy_(value)


def hide_flags(
    optimizer: torch.optim.Optimizer, user: dict[str, Any], ours: dict[str, Any]
) -> None:
    """Keep the flags autoopt set (`ours`) out of the optimizer's state dict (`user` instead)."""
    optimizer.register_state_dict_post_hook(UserFlags(user))
    optimizer.register_load_state_dict_pre_hook(AutooptFlags(ours))


def keep_state_contiguous(optimizer: torch.optim.Optimizer) -> None:
    """Save state contiguous; load it in the layout of the (channels-last) parameters."""
    optimizer.register_state_dict_post_hook(contiguous_state)
    optimizer.register_load_state_dict_post_hook(state_like_params)


def repoint(
    optimizer: torch.optim.Optimizer,
    new: dict[int, torch.Tensor],
    convert: Callable[[torch.Tensor, torch.Tensor, Any], Any] | None = None,
) -> None:
    """Point the optimizer at replaced parameters: `new` maps the id of each old parameter (still
    alive) to its replacement; param groups and existing state follow, each state value passed
    through `convert(old, new, value)` when given (e.g. to shard it like the new parameter)."""
    for group in optimizer.param_groups:
        group["params"] = [new.get(id(p), p) for p in group["params"]]
    for old in list(optimizer.state):
        replacement = new.get(id(old))
        if replacement is None:
            continue
        state = optimizer.state.pop(old)
        if convert is not None:
            state = {key: convert(old, replacement, value) for key, value in state.items()}
        optimizer.state[replacement] = state
