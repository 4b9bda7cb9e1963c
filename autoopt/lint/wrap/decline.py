"""Why `--wrap` leaves a file alone: one constructor per reason, so every decline is worded in
one place (the short reason for the run's summary, the detail for the file's line)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Decline:
    """Why a file is left alone: `reason` for the summary, `detail` for the file's line."""

    reason: str
    detail: str = ""


# ----- what the script already does ---------------------------------------------------------
def accelerate() -> Decline:
    return Decline(
        "already uses Accelerate",
        "the script already runs Hugging Face Accelerate (accelerator.prepare/backward)",
    )


def lightning() -> Decline:
    return Decline("already uses Lightning", "training runs inside a Lightning Trainer")


def ignite() -> Decline:
    # `Engine(train_step)` / `create_supervised_trainer`: the library drives the loop
    return Decline(
        "already uses ignite",
        "training runs inside an ignite Engine (the library drives the loop)",
    )


def rpc() -> Decline:
    return Decline(
        "RPC training",
        "training runs over torch.distributed.rpc (remote modules, distributed autograd)",
    )


def hogwild() -> Decline:
    return Decline(
        "Hogwild",
        "Hogwild training (a model in shared memory stepped by several processes)",
    )


def own_precision(why: str) -> Decline:
    return Decline(
        "another mixed-precision system",
        f"the script already runs its own reduced precision: {why}; optimize()'s AMP "
        "would stack a second one on it",
    )


def loss_scaler(callee: str, func: str) -> Decline:
    return Decline(
        "another mixed-precision system",
        f"the script already runs its own mixed precision: its loss scaler "
        f"does the backward and steps the optimizer (`{callee}(...)` in "
        f"{func}()); optimize()'s AMP would stack a second one on it",
    )


# ----- finding the loop and its optimizers ------------------------------------------------------
def no_training_loop() -> Decline:
    return Decline("no training loop", "no .backward() is reached from this file")


def no_optimizer() -> Decline:
    return Decline("no optimizer", "no optimizer is stepped where .backward() runs")


def optimizers_in_collection(expr: str) -> Decline:
    return Decline(
        "optimizers kept in a collection",
        f"the optimizers stepped through `{expr}` are not named where it is "
        "built: no optimizer to hand to optimize()",
    )


def handed_in(expr: str, kind: str, param: str, callee: str) -> Decline:
    return Decline(
        "optimizer created in another module",
        f"`{expr}` comes in as the {kind} `{param}` of {callee}, which nothing here calls: "
        "it is created in another module; wrap the script that builds it",
    )


def optimizer_not_found(expr: str, func: str) -> Decline:
    return Decline(
        "optimizer not created in this file",
        f"cannot find where `{expr}` (stepped in {func}()) is created",
    )


def optimizers_in_several_functions() -> Decline:
    return Decline(
        "optimizers created in several functions",
        "the optimizers are created in different functions: no single place for the call",
    )


def optimizer_in_module(path: object) -> Decline:
    return Decline(
        "optimizer created in another module",
        f"the optimizer is created in {path}: wrap that file instead",
    )


# ----- binding the model ---------------------------------------------------------------------
def parallel_before_optimizer(detail: str) -> Decline:
    return Decline("model wrapped in DDP/FSDP before the optimizer", detail)


def optimizer_wrapper(expr: str, wrapper: str, methods: set[str]) -> Decline:
    return Decline(
        "optimizer wrapped in a class",
        f"`{expr}` is a {wrapper}, which steps the torch optimizer it holds in "
        f"{'/'.join(f'{m}()' for m in sorted(methods))}: optimize() needs the "
        "optimizer itself (AMP's loss scaling lives in its step) and cannot reach "
        "it there",
    )


def unknown_model(expr: str) -> Decline:
    return Decline(
        "cannot tell the model",
        f"cannot tell which model's .parameters() feed `{expr}`",
    )


def optimizer_inside_model(expr: str) -> Decline:
    return Decline(
        "optimizer inside the model",
        f"`{expr}` is built over self.parameters() inside the model's own class",
    )


def model_from_outside(model: str, func: str) -> Decline:
    return Decline(
        "model built outside this file",
        f"the model `{model}` is a parameter of {func}(), which nothing "
        "here calls: wrap the script that builds the model",
    )


def optimizers_over_one_model(count: int) -> Decline:
    return Decline(
        "several optimizers over one model",
        f"{count} optimizers step the same model; optimize() takes one per model",
    )


# ----- the insertion point -------------------------------------------------------------------
def unrelated_blocks() -> Decline:
    return Decline("placement", "the optimizer and the loop are in unrelated blocks")


def created_in_loop() -> Decline:
    return Decline(
        "optimizer created inside the loop",
        "training starts before the optimizer and loader exist (or creates them)",
    )


def model_unbound(model: str) -> Decline:
    return Decline(
        "model not bound at the call",
        f"the model `{model}` is not bound on every path where the call goes",
    )


def trained_through(model: str, target: str) -> Decline:
    return Decline(
        "model trained through another object",
        f"the loop trains `{model}` through `{target}`, built from it before "
        "the optimizer exists: optimize() would not reach the model it calls",
    )
