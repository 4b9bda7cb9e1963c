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
- PyTorch-Ignite: `create_supervised_trainer(model, optimizer, loss_fn, device=...)` runs the
  training loop (forward, backward, step) and copies every batch to `device`; `Engine(step)`
  calls the file's `step(engine, batch)` once per batch. Such files train with no loop or
  `.backward()` of their own in sight.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from autoopt.lint.engine.rule import Rule
from autoopt.lint.program.project_facts import sibling_importers_text
from autoopt.lint.program.trained_models import trained_models
from autoopt.lint.tree.calls import arg
from autoopt.lint.tree.nodes import calls_in, dotted, is_name, nodes_of_type

ACCELERATOR = ("accelerate.Accelerator", "accelerate.accelerator.Accelerator")
LIGHTNING = (
    "lightning.Trainer",
    "lightning.pytorch.Trainer",
    "pytorch_lightning.Trainer",
    "lightning.Fabric",
    "lightning.fabric.Fabric",
    "lightning_fabric.Fabric",
)

IGNITE_SUPERVISED_TRAINER = (
    "ignite.engine.create_supervised_trainer",
    "ignite.engine.engine.create_supervised_trainer",
)
IGNITE_ENGINE = ("ignite.engine.Engine", "ignite.engine.engine.Engine")
# Text of a file whose training loop a library runs (a rule's `requires` beside ".backward(").
LIBRARY_TRAINER_MARKERS = ("create_supervised_trainer(",)


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
    launch config), Lightning `Trainer(precision=...)`/`Fabric(precision=...)`, transformers'
    `TrainingArguments` (`--fp16`, `--bf16`, `--tf32` on the command line)."""
    source = rule.context.source
    return (
        uses_accelerate(rule)
        or ("precision" in source and _constructs(rule, LIGHTNING, keyword="precision"))
        or uses_hf_training_arguments(rule)
    )


def uses_hf_training_arguments(rule: Rule) -> bool:
    """The file imports transformers' `TrainingArguments` (or a subclass of it,
    `Seq2SeqTrainingArguments`): the HF Trainer's flags set the precision."""
    if "TrainingArguments" not in rule.context.source:
        return False
    for node in nodes_of_type(rule.context.module, cst.ImportFrom):
        module = dotted(node.module) if node.module is not None else None
        if module is None or module.split(".")[0] != "transformers":
            continue
        if isinstance(node.names, cst.ImportStar):
            return True
        if any(dotted(a.name).endswith("TrainingArguments") for a in node.names):
            return True
    return False


def library_places_batches(rule: Rule) -> bool:
    """Batches reach the device through the library (`accelerator.prepare(loader)`, Lightning),
    here or in the script that imports this loader factory (Time-LLM's run_main.py)."""
    source = rule.context.source
    if uses_accelerate(rule) and ".prepare(" in source:
        return True
    if ("Trainer" in source or "Fabric" in source) and _constructs(rule, LIGHTNING):
        return True
    return "DataLoader" in source and rule.context.program.importer_text_says(_prepares_loaders)


def _prepares_loaders(text: str) -> bool:
    """An Accelerate script that hands its objects to `accelerator.prepare(...)`."""
    return "Accelerator(" in text and ".prepare(" in text


def is_hogwild(rule: Rule) -> bool:
    """Hogwild training: this file, or a script next to it that imports it, shares the model's
    memory (`share_memory()`) between `multiprocessing` processes."""
    if _hogwild_text(rule.context.source):
        return not _shares_only_untrained_models(rule)
    return any(_hogwild_text(text) for text in sibling_importers_text(Path(rule.context.path)))


def _hogwild_text(source: str) -> bool:
    return ".share_memory()" in source and "Process(" in source


def _shares_only_untrained_models(rule: Rule) -> bool:
    """The models the file shares (`model.share_memory()`) are none of those its optimizers
    train: TorchBeast's actors run a shared inference copy while one learner process trains
    `learner_model`, an ordinary training loop."""
    shared = {
        dotted(c.func.value)
        for c in calls_in(rule.context.module)
        if isinstance(c.func, cst.Attribute) and c.func.attr.value == "share_memory"
    }
    if None in shared:
        return False  # `Net().share_memory()`: which model is shared cannot be told
    trained = {model for _, model in trained_models(rule)}
    return bool(trained) and not (shared & trained)


def library_trainer_calls(rule: Rule) -> list[cst.Call]:
    """Calls that hand the model and optimizer to a library that runs the whole training loop:
    ignite's `create_supervised_trainer(model, optimizer, loss_fn, ...)`."""
    if not any(m in rule.context.source for m in LIBRARY_TRAINER_MARKERS):
        return []
    return [
        c for c in calls_in(rule.context.module) if rule.is_call_to(c, *IGNITE_SUPERVISED_TRAINER)
    ]


def library_moves_batches(rule: Rule) -> bool:
    """A library trainer copies the batches to a device: `create_supervised_trainer(...,
    device=device)` (without `device` its batches stay where the loader puts them)."""
    devices = (arg(c, "device", 3) for c in library_trainer_calls(rule))
    return any(d is not None and not is_name(d.value, "None") for d in devices)


def engine_step_functions(rule: Rule) -> list[cst.FunctionDef]:
    """Functions of the file that an ignite `Engine(step)` runs once per batch and that call
    `.backward()` (a training step, not an evaluation step)."""
    if "Engine(" not in rule.context.source:
        return []
    stepped = {
        c.args[0].value.value
        for c in calls_in(rule.context.module)
        if rule.is_call_to(c, *IGNITE_ENGINE) and c.args and isinstance(c.args[0].value, cst.Name)
    }
    facts = rule.facts
    found: dict[int, cst.FunctionDef] = {}
    for call in facts.backward_calls:
        scope = facts.enclosing_scope(call)
        if isinstance(scope, cst.FunctionDef) and scope.name.value in stepped:
            found.setdefault(id(scope), scope)
    return list(found.values())
