"""The `autoopt.optimize(...)` statements `--wrap` writes: one per model/optimizer pair, with the
script's own names and the options the script already covers."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst


@dataclass
class Pair:
    """One `autoopt.optimize` call: the model expression, and the optimizer (None for a model
    stepped by an optimizer over several models), loader and device where the script has them."""

    model: str
    optimizer: str | None
    loader: str | None = None
    device: str | None = None  # where the script itself puts the model (`model.to(device)`)
    # the model may be None (`model_fine = None`, built under an `if`): the call goes under it
    guard: str | None = None


@dataclass
class Plan:
    """The calls to insert after `anchor` (a statement of `file`), and their shared options."""

    anchor: cst.CSTNode
    pairs: list[Pair]
    options: dict[str, str] = field(default_factory=dict)  # option -> why (for the comment)
    # module globals the call rebinds from inside `scope`, a function (`global train_loader`)
    globals_: tuple[str, ...] = ()
    scope: cst.CSTNode | None = None

    def lines(self) -> list[str]:
        """The statements to insert, in order."""
        opts = "".join(f", {name}={_off(name)}" for name in self.options)
        why = ", ".join(f"{name}={_off(name)} ({reason})" for name, reason in self.options.items())
        comment = f"  # autoopt: {why}" if why else ""
        out = []
        for p in self.pairs:
            device = f", device={p.device}" if p.device else ""
            given = [p.model, *([p.loader] if p.loader else [])]
            args = list(given)
            if p.optimizer:
                given.append(p.optimizer)
                args.append(p.optimizer if p.loader else f"optimizer={p.optimizer}")
            call = f"{', '.join(given)} = autoopt.optimize({', '.join(args)}{device}{opts})"
            out.append(f"if {p.guard}: {call}{comment}" if p.guard else f"{call}{comment}")
        return out


def _off(name: str) -> str:
    """The value that hands option `name` to the script. amp="script", not amp=False: every amp
    reason (the script's own autocast/GradScaler or apex amp, an optimizer over several models,
    a closure step, an optimizer bound on some paths only) rules out autoopt's autocast and loss
    scaling, not compile, the layout or the optimizer step, which amp=False would also stand
    down (it asks for eager's fp32 kernels)."""
    return '"script"' if name == "amp" else "False"
