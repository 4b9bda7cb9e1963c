"""Tricks that a library, or the way the script runs, already takes care of.

- Hugging Face Accelerate: `Accelerator(...)` decides mixed precision (its `mixed_precision=`
  argument, or `accelerate config` / `accelerate launch --mixed_precision` when the argument is
  absent) and `accelerator.prepare(loader)` places every batch on the device itself.
- Lightning: `Trainer(precision=...)` / `Fabric(precision=...)` run the forward under autocast;
  both move batches to the device for the user.
- Hogwild training (`model.share_memory()` and one `multiprocessing.Process(target=train)` per
  CPU worker, as in pytorch/examples mnist_hogwild): the processes update one shared model on
  the CPU, so GPU copies, mixed precision and torch.compile are not what this design is about.
  A module whose functions such a script starts (`from train import train`) counts too.
"""

from __future__ import annotations

from pathlib import Path

from autoopt.lint.nodes import calls_in
from autoopt.lint.project_facts import sibling_importers_text
from autoopt.lint.rule import Rule

ACCELERATOR = ("accelerate.Accelerator", "accelerate.accelerator.Accelerator")
LIGHTNING = (
    "lightning.Trainer",
    "lightning.pytorch.Trainer",
    "pytorch_lightning.Trainer",
    "lightning.Fabric",
    "lightning.fabric.Fabric",
    "lightning_fabric.Fabric",
)


def _constructs(rule: Rule, names: tuple[str, ...], keyword: str | None = None) -> bool:
    for call in calls_in(rule.context.module):
        if rule.is_call_to(call, *names) and (
            keyword is None
            or any(a.keyword is not None and a.keyword.value == keyword for a in call.args)
        ):
            return True
    return False


def uses_accelerate(rule: Rule) -> bool:
    """The file builds an `accelerate.Accelerator`."""
    return "Accelerator" in rule.context.source and _constructs(rule, ACCELERATOR)


def library_handles_precision(rule: Rule) -> bool:
    """Mixed precision is the library's to set: an Accelerate `Accelerator` (its argument or the
    launch config), Lightning `Trainer(precision=...)`/`Fabric(precision=...)`."""
    source = rule.context.source
    return uses_accelerate(rule) or (
        "precision" in source and _constructs(rule, LIGHTNING, keyword="precision")
    )


def library_places_batches(rule: Rule) -> bool:
    """Batches reach the device through the library (`accelerator.prepare(loader)`, Lightning)."""
    source = rule.context.source
    if uses_accelerate(rule) and ".prepare(" in source:
        return True
    return ("Trainer" in source or "Fabric" in source) and _constructs(rule, LIGHTNING)


def is_hogwild(rule: Rule) -> bool:
    """Hogwild training: this file, or a script next to it that imports it, shares the model's
    memory (`share_memory()`) between `multiprocessing` processes."""
    if _hogwild_text(rule.context.source):
        return True
    return any(_hogwild_text(text) for text in sibling_importers_text(Path(rule.context.path)))


def _hogwild_text(source: str) -> bool:
    return ".share_memory()" in source and "Process(" in source
