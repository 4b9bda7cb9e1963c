"""Each step of `--wrap`'s analysis on its own (autoopt/lint/wrap/: loop, origins, bind, anchor,
options, device, call, decline), on the smallest code that shows it."""

from __future__ import annotations

import inspect
import textwrap

import libcst as cst

from autoopt.lint.wrap import decline
from autoopt.lint.wrap.anchor import defined, place_call
from autoopt.lint.wrap.bind import Pairing, loader_of, models_of, pair_models
from autoopt.lint.wrap.call import Pair, Plan
from autoopt.lint.wrap.codebase import CodeBase, Func
from autoopt.lint.wrap.decline import Decline
from autoopt.lint.wrap.device import device_for
from autoopt.lint.wrap.loop import OptimizerWrappers, find_training, training_functions
from autoopt.lint.wrap.options import own_options, wrapped_before
from autoopt.lint.wrap.origins import Bound, bind_optimizers
from autoopt.lint.wrap.tree import assignments_of, bound_to

TRAIN_IN_HELPER = """
import torch

def train(model, loader, optimizer, scaler):
    for x in loader:
        optimizer.zero_grad()
        scaler.scale(model(x).sum()).backward()
        scaler.step(optimizer)
        scheduler.step()

def main():
    model = Net().to(device)
    optimizer = torch.optim.SGD(
        [{"params": model.head.parameters()}, {"params": model.body.parameters()}], lr=0.1
    )
    loader = torch.utils.data.DataLoader(ds)
    scaler = torch.amp.GradScaler()
    for epoch in range(3):
        train(model, loader, optimizer, scaler)
"""


def code_of(text: str) -> CodeBase:
    return CodeBase(cst.parse_module(textwrap.dedent(text).lstrip("\n")), None)


def function(code: CodeBase, name: str) -> Func:
    return Func(code.script, code.script.functions[name])


def bound(code: CodeBase) -> Bound:
    trainers = training_functions(code)
    found = bind_optimizers(code, find_training(code, trainers, OptimizerWrappers(code)))
    assert isinstance(found, Bound), found
    return found


def test_find_the_loop_reaches_the_helper_and_steps_only_optimizers() -> None:
    code = code_of(TRAIN_IN_HELPER)
    trainers = training_functions(code)
    assert {f.name for f in trainers} == {"train", "main"}
    training = find_training(code, trainers, OptimizerWrappers(code))
    # `scaler.step(optimizer)` steps the optimizer; `scheduler.step()` is no optimizer
    assert [(u.func.name, u.expr) for u in training.uses] == [("train", "optimizer")]


def test_bind_follows_the_optimizer_back_to_where_it_is_created() -> None:
    code = code_of(TRAIN_IN_HELPER)
    found = bound(code)
    assert found.home == function(code, "main")
    assert [o.expr for o in found.optimizers] == ["optimizer"]
    assert isinstance(found.optimizers[0].entry, cst.Call)  # through `train(...)`


def test_bind_the_model_from_parameter_groups_and_the_loader_through_the_call() -> None:
    code = code_of(TRAIN_IN_HELPER)
    main = function(code, "main")
    (assign,) = assignments_of(main, "optimizer")
    assert models_of(main, bound_to(assign, "optimizer")) == {"model"}
    loader = loader_of(code, main, training_functions(code))
    assert loader is not None and loader[0] == "loader"


def test_pairing_never_takes_an_optimizer_for_a_model() -> None:
    code = code_of(TRAIN_IN_HELPER)
    found = bound(code)
    pairing = pair_models(code, found.home, found.optimizers, found.stepped)
    assert isinstance(pairing, Pairing)
    assert [(p.model, p.optimizer) for p in pairing.pairs] == [("model", "optimizer")]


def test_the_insertion_point_follows_the_last_object_created() -> None:
    code = code_of(TRAIN_IN_HELPER)
    found = bound(code)
    trainers = training_functions(code)
    loader = loader_of(code, found.home, trainers)
    plan = place_call(
        code, found.home, found.optimizers, loader, [Pair("model", "optimizer")], trainers, {}
    )
    assert isinstance(plan, Plan)
    assert cst.Module([plan.anchor]).code.startswith("loader = ")  # type: ignore[list-item]
    # the script's own GradScaler turns optimize()'s AMP off
    assert plan.options == {"amp": "own autocast/GradScaler"}


def test_a_name_bound_only_inside_a_later_loop_is_not_defined_at_the_call() -> None:
    code = code_of(
        """
        def main():
            model = Net()
            optimizer = make(model)
            for epoch in range(3):
                device = pick(epoch)
        """
    )
    main = function(code, "main")
    (anchor,) = assignments_of(main, "optimizer")
    assert defined(code, main, "model", anchor)
    assert not defined(code, main, "device", anchor)


def test_options_the_script_covers_itself() -> None:
    code = code_of(
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        def train(model):
            with torch.autocast("cuda"):
                loss = model(x)
            loss.backward()

        model = DDP(torch.compile(Net()))
        train(model)
        """
    )
    assert set(own_options(code, training_functions(code))) == {"amp", "compile", "distributed"}


def test_the_device_is_the_flags_own_choice() -> None:
    code = code_of(
        """
        def main(args):
            model = Net()
            if args.cuda:
                model.cuda()
            optimizer = make(model)
        """
    )
    main = function(code, "main")
    (anchor,) = assignments_of(main, "optimizer")
    assert device_for(code, main, "model", anchor) == '"cuda" if args.cuda else "cpu"'


def test_the_call_is_written_with_the_scripts_names_and_the_reasons() -> None:
    plan = Plan(
        cst.parse_statement("pass"),
        [Pair("net", "opt", "loader", "device"), Pair("disc", None)],
        {"amp": "own autocast/GradScaler"},
    )
    assert plan.lines() == [
        'net, loader, opt = autoopt.optimize(net, loader, opt, device=device, amp="script")'
        '  # autoopt: amp="script" (own autocast/GradScaler)',
        'disc = autoopt.optimize(disc, amp="script")  # autoopt: amp="script" (own autocast/GradScaler)',
    ]


def test_every_decline_states_the_reason_and_the_change_to_make() -> None:
    given = {
        "str": "x",
        "int": 2,
        "object": "x",
        "set[str]": {"step"},
        "list[str]": ["`optimizer` in main()", "`optimizer` in init()"],
        "list[str] | None": ["Engine.train() of protonets/engine.py"],
        "ParallelWrap": decline.ParallelWrap("net = nn.DataParallel(net)", "DataParallel"),
        "bool": True,
        "Path | None": None,
        "str | None": "train()",
    }
    made = [
        f
        for f in vars(decline).values()
        if inspect.isfunction(f)
        and f.__module__ == decline.__name__
        and not f.__name__.startswith("_")  # the module's own helpers make no decline
    ]
    assert len(made) > 20
    for make in made:
        params = inspect.signature(make).parameters.values()
        found = make(*(given[p.annotation] for p in params))
        assert isinstance(found, Decline)
        assert found.reason and found.detail and found.change, make.__name__
        assert found.message.endswith(found.change)


def test_a_parallel_wrap_before_the_optimizer_names_the_edit() -> None:
    found = decline.parallel_before_optimizer(
        decline.ParallelWrap("net = torch.nn.DataParallel(net)", "DataParallel")
    )
    assert "`net = torch.nn.DataParallel(net)` wraps the model in DataParallel before" in (
        found.detail
    )
    assert "create the optimizer above that line" in found.change
    assert "torchrun" in found.change
    ddp = decline.parallel_before_optimizer(
        decline.ParallelWrap(
            "model = make(model)", "DistributedDataParallel", "make", "if args.distributed"
        )
    )
    assert "(in `if args.distributed`)" in ddp.detail and "through make()" in ddp.detail
    assert "create the optimizer above `if args.distributed`" in ddp.change
    assert "torchrun" not in ddp.change


def test_the_wrap_is_quoted_with_the_branch_that_holds_it() -> None:
    code = code_of(
        """
        import torch

        def main():
            net = Net().to(device)
            if device == "cuda":
                # several GPUs
                net = torch.nn.DataParallel(net)  # make parallel
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        """
    )
    main = function(code, "main")
    (anchor,) = assignments_of(main, "optimizer")
    assert wrapped_before(code, main, anchor) == decline.ParallelWrap(
        "net = torch.nn.DataParallel(net)", "DataParallel", None, 'if device == "cuda"'
    )
