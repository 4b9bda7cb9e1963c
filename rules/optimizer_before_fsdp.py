"""AO505: an optimizer built over a model's parameters before the model is sharded by FSDP."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Invalid, Rule, Valid
from autoopt.lint.tree.nodes import calls_in, dotted

SHARD = (
    "torch.distributed.fsdp.fully_shard",
    "torch.distributed._composable.fsdp.fully_shard",
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
)


class OptimizerBeforeFsdp(Rule):
    """
    ## What it does
    Flags an optimizer created over `model.parameters()` before `fully_shard(model)` or
    `FullyShardedDataParallel(model)` in the same function, when no optimizer is created over
    the model again after the sharding.

    ## Why is this bad?
    Sharding replaces the model's parameters (FSDP2 swaps in DTensor shards; FSDP1 flattens them
    into a `FlatParameter`). The optimizer still holds the old, unsharded tensors: it steps
    parameters the model no longer uses, so training silently does nothing, and the full
    parameters stay in memory on every rank (accelerate#4022 is Accelerate swapping them back).

    ## Example
    `opt = AdamW(model.parameters())` then `fully_shard(model)`.

    ## Use instead
    Shard first, then build the optimizer: `fully_shard(model)`;
    `opt = AdamW(model.parameters())`.

    ## Fix safety
    No fix: moving the optimizer may move code that depends on it.

    ## When not to
    - An optimizer built again after the sharding (the first one is then unused).
    - Models that are not the sharded one.
    """

    code = "AO505"
    name = "optimizer-before-fsdp"
    message = (
        "optimizer holds the parameters from before FSDP sharded the model; build it after sharding"
    )
    triggers = ("fully_shard", "FullyShardedDataParallel")
    requires = (".parameters(",)

    VALID = [
        Valid(
            """
            import torch
            from torch.distributed.fsdp import fully_shard
            fully_shard(model)
            optimizer = torch.optim.AdamW(model.parameters())
            """
        ),
        Valid(
            """
            import torch
            from torch.distributed.fsdp import fully_shard
            optimizer = torch.optim.AdamW(other.parameters())
            fully_shard(model)
            """
        ),
        Valid(
            """
            import torch
            from torch.distributed.fsdp import fully_shard
            optimizer = torch.optim.AdamW(model.parameters())
            fully_shard(model)
            optimizer = torch.optim.AdamW(model.parameters())
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import fully_shard
            def setup(model):
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
                for layer in model.layers:
                    fully_shard(layer)
                fully_shard(model)
                return model, optimizer
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
            net = FSDP(net)
            """,
            line=3,
        ),
    ]

    def _optimizer_over(self, call: cst.Call) -> str | None:
        """`m` for `torch.optim.X(m.parameters(), ...)`."""
        if not any(q.startswith("torch.optim.") for q in self.qualified_names(call.func)):
            return None
        if not call.args:
            return None
        first = call.args[0].value
        if (
            isinstance(first, cst.Call)
            and isinstance(first.func, cst.Attribute)
            and first.func.attr.value == "parameters"
        ):
            return dotted(first.func.value)
        return None

    def _scan(self, body: cst.CSTNode) -> None:
        events: list[tuple[str, str, cst.Call]] = []  # (kind, model, call) in source order
        for call in calls_in(body, into_scopes=False):
            model = self._optimizer_over(call)
            if model is not None:
                events.append(("opt", model, call))
            elif self.is_call_to(call, *SHARD) and call.args:
                target = dotted(call.args[0].value)
                if target is not None:
                    events.append(("shard", target, call))
        for i, (kind, model, call) in enumerate(events):
            if kind != "opt":
                continue
            later = events[i + 1 :]
            shard = next(
                (j for j, (k, m, _) in enumerate(later) if (k, m) == ("shard", model)), None
            )
            if shard is None:
                continue
            if any((k, m) == ("opt", model) for k, m, _ in later[shard + 1 :]):
                continue  # built again over the sharded parameters
            self.report(call)

    def visit_Module(self, node: cst.Module) -> None:
        self._scan(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scan(node)
