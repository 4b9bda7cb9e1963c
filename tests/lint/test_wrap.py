"""`rewrite --wrap`: the one-line autoopt.optimize() insertion."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from autoopt.lint.wrap.insert import wrap_source


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


SCRIPT = src(
    """
    import torch
    from torch.utils.data import DataLoader

    net = Net()  # the model
    train_loader = DataLoader(ds, batch_size=32, shuffle=True)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for epoch in range(3):
        for x, y in enumerate(train_loader):
            opt.zero_grad()
            loss_fn(net(x), y).backward()
            opt.step()
    """
)


def test_inserts_after_the_optimizer_with_the_scripts_names() -> None:
    result = wrap_source(SCRIPT)
    expected = SCRIPT.replace("DataLoader\n", "DataLoader\nimport autoopt\n", 1).replace(
        "lr=1e-3)\n",
        'lr=1e-3)\nnet, train_loader, opt = autoopt.optimize(net, train_loader, opt, device="cpu")\n',
    )
    assert result.source == expected
    assert not result.declined and result.changed
    assert "autoopt.optimize(net, train_loader, opt, device=" in result.message


def test_is_idempotent() -> None:
    once = wrap_source(SCRIPT).source
    twice = wrap_source(once)
    assert twice.source == once
    assert not twice.changed and "already" in twice.message


def test_loader_created_after_optimizer_moves_the_insertion_point() -> None:
    code = src(
        """
        import torch
        import autoopt

        def main():
            model = build()
            optimizer = torch.optim.SGD(
                [{"params": model.head.parameters()}, {"params": model.body.parameters()}],
                lr=0.1,
            )
            loader = torch.utils.data.DataLoader(ds)
            for batch in tqdm(loader):
                model(batch).sum().backward()
                optimizer.step()
        """
    )
    result = wrap_source(code)
    assert result.source == code.replace(
        "DataLoader(ds)\n",
        "DataLoader(ds)\n    model, loader, optimizer = autoopt.optimize(model, loader, optimizer, "
        'device="cpu")\n',
    )
    cst.parse_module(result.source)


def test_loader_passed_as_parameter_and_self_attributes() -> None:
    code = src(
        """
        import torch

        class Trainer:
            def fit(self, train_loader):
                self.opt = torch.optim.Adam(self.model.parameters())
                for x in train_loader:
                    self.model(x).sum().backward()
                    self.opt.step()
        """
    )
    result = wrap_source(code)
    assert (
        "        self.opt = torch.optim.Adam(self.model.parameters())\n"
        "        self.model, train_loader, self.opt = autoopt.optimize("
        'self.model, train_loader, self.opt, device="cpu")\n'
    ) in result.source
    assert result.source.startswith("import torch\nimport autoopt\n")


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (
            """
            import torch
            for x in loader:
                x.sum().backward()
            """,
            "no optimizer is stepped",
        ),
        (
            """
            import torch
            opt = make_optimizer(cfg)
            for x in loader:
                f(x).sum().backward()
                opt.step()
            """,
            "cannot tell which model",
        ),
        (
            """
            import torch
            opt = torch.optim.Adam(model.parameters())
            """,
            "no .backward() is reached",
        ),
        (
            """
            import torch
            for x in loader:
                opt = torch.optim.Adam(model.parameters())
                model(x).sum().backward()
                opt.step()
            """,
            "`opt` is created inside the loop `for x in loader`, which trains",
        ),
        (  # the project's scheduler class takes the optimizer first; the trainer runs it
            """
            import torch
            from solver import WarmupMultiStepLR
            from engine.trainer import do_train
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scheduler = WarmupMultiStepLR(optimizer, [40, 70])
            do_train(cfg, model, train_loader, optimizer, scheduler)
            """,
            "`optimizer` is handed to `do_train(...)`",
        ),
        (  # re-created at a learning-rate drop (overhaul-distillation)
            """
            import torch
            for epoch in range(epochs):
                if epoch == 0:
                    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                elif epoch == epochs // 2:
                    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
                for x in loader:
                    model(x).sum().backward()
                    optimizer.step()
            """,
            "create `optimizer` once before `for epoch in range(epochs)`",
        ),
        (  # a project's DataParallel subclass before the optimizer (EfficientDet)
            """
            import torch
            model = Net().cuda()
            if n_gpu > 1:
                model = CustomDataParallel(model, n_gpu)
            opt = torch.optim.AdamW(model.parameters())
            for x in loader:
                model(x).sum().backward()
                opt.step()
            """,
            "wraps the model in CustomDataParallel before the optimizer exists",
        ),
        (  # the dataset re-sampled in place each epoch (NCF's negatives)
            """
            import torch
            model = Net().cuda()
            opt = torch.optim.Adam(model.parameters())
            for epoch in range(20):
                train_loader.dataset.ng_sample()
                for x in train_loader:
                    model(x).sum().backward()
                    opt.step()
            """,
            "changes the loader's dataset in place (`train_loader.dataset.ng_sample()`)",
        ),
        (  # the loop is a Trainer's of another module (pytorch-template, CenterNet)
            """
            import torch
            from trainer import Trainer
            model = Net().cuda()
            opt = torch.optim.Adam(model.parameters())
            model, opt, start = load_checkpoint(model, path, opt)
            sched = torch.optim.lr_scheduler.StepLR(opt, 30)
            warmup = get_linear_schedule_with_warmup(opt, 100, 1000)
            trainer = Trainer(model, opt, loader)
            trainer.train()
            """,
            "`opt` is handed to `Trainer(...)`, whose training loop --wrap cannot follow",
        ),
        (  # ... and the model wrapped before the optimizer exists: that says it all
            """
            import torch
            from trainer import Trainer
            model = Net().cuda()
            if n_gpu > 1:
                model = torch.nn.DataParallel(model)
            opt = config.init_obj("optimizer", torch.optim, model.parameters())
            trainer = Trainer(model, opt, loader)
            trainer.train()
            """,
            "wraps the model in DataParallel before the optimizer exists",
        ),
        (
            """
            import torch
            import lightning as L
            opt = torch.optim.Adam(model.parameters())
            for x in loader:
                model(x).sum().backward()
                opt.step()
            """,
            "Lightning",
        ),
        (  # learn2learn's MAML: per-task clones adapted through differentiable steps
            """
            import learn2learn as l2l
            import torch
            model = Net().cuda()
            maml = l2l.algorithms.MAML(model, lr=0.5)
            opt = torch.optim.Adam(maml.parameters())
            for batch in tasks:
                learner = maml.clone()
                learner.adapt(loss_fn(learner(batch.x), batch.y))
                loss_fn(learner(batch.x), batch.y).backward()
                opt.step()
            """,
            "l2l.algorithms.MAML",
        ),
        (  # minRF: `rf = RF(model)` before the optimizer, the loop runs `rf.forward(x, c)`
            """
            import torch
            model = DiT().cuda()
            rf = RF(model)
            optimizer = torch.optim.Adam(model.parameters())
            loader = torch.utils.data.DataLoader(data, batch_size=256)
            for x, c in loader:
                optimizer.zero_grad()
                loss = rf.forward(x.cuda(), c.cuda())
                loss.backward()
                optimizer.step()
            """,
            "the loop trains `model` through `rf`",
        ),
    ],
)
def test_declines_with_a_reason(code: str, reason: str) -> None:
    code = src(code)
    result = wrap_source(code)
    assert result.declined
    assert reason in result.message
    assert result.source == code


def test_an_optimizer_never_stepped_is_not_wrapped() -> None:
    """Only what the loop steps counts: an unused second optimizer is not a second pair."""
    code = src(
        """
        import torch
        opt_d = torch.optim.Adam(D.parameters())
        opt_g = torch.optim.Adam(G.parameters())
        for x in loader:
            D(x).sum().backward()
            opt_d.step()
        """
    )
    assert wrap_source(code).inserted == (
        'D, loader, opt_d = autoopt.optimize(D, loader, opt_d, device="cpu")',
    )


def test_scheduler_steps_are_not_optimizers() -> None:
    code = src(
        """
        import torch
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(opt, 10)
        for x in loader:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            scheduler.step()
        """
    )
    assert wrap_source(code).inserted == (
        'model, loader, opt = autoopt.optimize(model, loader, opt, device="cpu")',
    )


def test_reference_trainer_shape() -> None:
    """torchvision's classification reference: parameter groups built in a variable, an if/elif
    optimizer choice, the loop in train_one_epoch over `metric_logger.log_every(loader)`, its own
    GradScaler, and a DDP wrap after the optimizer."""
    code = src(
        """
        import torch

        def train_one_epoch(model, optimizer, data_loader, scaler):
            for x in metric_logger.log_every(data_loader, 10):
                optimizer.zero_grad()
                scaler.scale(model(x).sum()).backward()
                scaler.step(optimizer)
                scaler.update()

        def main(args):
            data_loader = torch.utils.data.DataLoader(dataset, batch_size=32)
            model = build(args)
            if args.norm_weight_decay is None:
                parameters = model.parameters()
            else:
                parameters = split_params(model)
            if args.opt == "sgd":
                optimizer = torch.optim.SGD(parameters, lr=0.1)
            elif args.opt == "adamw":
                optimizer = torch.optim.AdamW(parameters, lr=0.1)
            else:
                raise RuntimeError(args.opt)
            scaler = torch.cuda.amp.GradScaler() if args.amp else None
            if args.distributed:
                model = torch.nn.parallel.DistributedDataParallel(model)
            for epoch in range(args.epochs):
                train_one_epoch(model, optimizer, data_loader, scaler)
        """
    )
    result = wrap_source(code)
    line = (
        "    model, data_loader, optimizer = autoopt.optimize(model, data_loader, optimizer, "
        'amp="script", distributed=False)  # autoopt: amp="script" (own autocast/GradScaler), '
        "distributed=False (own DDP/FSDP/DataParallel wrap)\n"
    )
    assert "        raise RuntimeError(args.opt)\n" + line + "    scaler = " in result.source


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (
            """
            import torch
            class Layer(torch.nn.Linear):
                def __init__(self):
                    super().__init__(4, 4)
                    self.opt = torch.optim.Adam(self.parameters())

                def train_layer(self, batches):
                    for x in batches:
                        self.opt.zero_grad()
                        self(x).sum().backward()
                        self.opt.step()
            """,
            "inside the model's own class",
        ),
        (
            """
            import torch
            from torch.distributed.rpc import RRef
            def run(env, policy):
                optimizer = torch.optim.Adam(policy.parameters())
                for state in env:
                    policy(state).sum().backward()
                    env.step(state)
                    optimizer.step()
                    optimizer.zero_grad()
            run(make_env(), Policy())
            """,
            "torch.distributed.rpc",
        ),
        (
            """
            import torch
            from torch.distributed.fsdp import fully_shard
            model = Net()
            fully_shard(model)
            optimizer = torch.optim.Adam(model.parameters())
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
            """,
            "before the optimizer exists",
        ),
        (
            """
            import torch
            def train(rank, model, loader):
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                for x in loader:
                    model(x).sum().backward()
                    optimizer.step()
            """,
            "run --wrap on the script that builds the model and calls train()",
        ),
    ],
)
def test_declines_what_it_cannot_wrap_safely(code: str, reason: str) -> None:
    result = wrap_source(src(code))
    assert result.declined and reason in result.message


def test_env_step_with_an_argument_is_not_an_optimizer() -> None:
    code = src(
        """
        import torch
        optimizer = torch.optim.Adam(policy.parameters())
        def main():
            for episode in range(10):
                state, reward = env.step(policy(state))
                reward.backward()
                optimizer.step()
                optimizer.zero_grad()
        main()
        """
    )
    assert wrap_source(code).inserted == (
        'policy, optimizer = autoopt.optimize(policy, optimizer=optimizer, device="cpu")',
    )


def inserted(code: str) -> list[str]:
    result = wrap_source(src(code))
    assert not result.declined, result.message
    return list(result.inserted)


@pytest.mark.parametrize(
    ("placement", "device"),
    [
        # pytorch/examples mnist: a device chosen from flags, the model built onto it.
        (
            'device = torch.device("cuda" if use_cuda else "cpu")\nmodel = Net().to(device)',
            "device",
        ),
        # nanoGPT: a config variable, then `model.to(device)` on its own line.
        ("device = 'cuda'\nmodel = Net()\nmodel.to(device)", "device"),
        ("args = parser.parse_args()\nmodel = Net().to(args.device)", "args.device"),
        ("dev = pick()\nmodel = Net()\nmodel = model.to(dev)", "dev"),
        ("model = Net()\nmodel.cuda()", '"cuda"'),
        # pytorch/examples mnist today: the device is bound in both branches of an if/else.
        (
            "if use_accel:\n    device = torch.accelerator.current_accelerator()\n"
            'else:\n    device = torch.device("cpu")\nmodel = Net().to(device)',
            "device",
        ),
        ("model = Net()\nmodel.to(dtype)\nmodel.to(device='cpu')", "'cpu'"),
    ],
)
def test_the_call_keeps_the_scripts_own_device(placement: str, device: str) -> None:
    code = f"""
        import torch
        {textwrap.indent(placement, "        ").lstrip()}
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            model(x).sum().backward()
            opt.step()
        """
    assert inserted(code) == [
        f"model, loader, opt = autoopt.optimize(model, loader, opt, device={device})"
    ]


@pytest.mark.parametrize(
    "placement",
    [
        "model = Net()\nmodel.cuda(args.gpu)",  # not expressible as device=
        # placed on one path only (the other keeps the model where it is built)
        "if use_accel:\n    device = 'cuda'\n    model = Net().to(device)\nelse:\n    model = Net()",
        # never placed, in a script with a GPU path elsewhere: optimize() picks, as torch would
        "model = Net()\ntorch.cuda.manual_seed(0)",
    ],
)
def test_the_device_is_left_to_optimize_when_the_script_does_not_fix_one(
    placement: str,
) -> None:
    code = f"""
        import torch
        {textwrap.indent(placement, "        ").lstrip()}
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            model(x).sum().backward()
            opt.step()
        """
    assert inserted(code) == ["model, loader, opt = autoopt.optimize(model, loader, opt)"]


@pytest.mark.parametrize(
    ("placement", "device"),
    [
        # A CPU-only script (nothing about a GPU anywhere): its own code expects CPU tensors.
        ("model = Net()", '"cpu"'),
        # The GPU only behind a flag: the script's own choice, CPU otherwise.
        ("model = Net()\nif use_cuda:\n    model.cuda()", '"cuda" if use_cuda else "cpu"'),
        ("model = Net()\nif args.cuda:\n    model.to(dev)", 'dev if args.cuda else "cpu"'),
        (
            "model = Net()\nmodel = model.cuda() if args.gpu else model",
            '"cuda" if args.gpu else "cpu"',
        ),
    ],
)
def test_a_cpu_only_or_flag_gated_script_keeps_its_device(placement: str, device: str) -> None:
    code = f"""
        import torch
        {textwrap.indent(placement, "        ").lstrip()}
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            model(x).sum().backward()
            opt.step()
        """
    assert inserted(code) == [
        f"model, loader, opt = autoopt.optimize(model, loader, opt, device={device})"
    ]


@pytest.mark.parametrize(
    "placement",
    [
        # moved inside the loop, with the loop's own variable: `device=d` cannot be read at the
        # call, and optimize() would keep moving the inputs to the device it chose
        "for d in devices:\n    model.to(d)\n    for x in loader:",
        # a device defined after the call, the placement not a statement of its own
        "dev = pick()\nnet = model.to(dev)\nfor x in loader:",
        # ... or something between the optimizer and the placement uses the model
        "dev = pick()\nmodel.apply(init)\nmodel.to(dev)\nfor x in loader:",
        # not expressible as device= (imagenet's `model.cuda(args.gpu)` after the optimizer)
        "model.cuda(args.gpu)\nfor x in loader:",
    ],
)
def test_a_model_placed_after_the_call_where_it_cannot_say_so_is_declined(placement: str) -> None:
    """optimize() moves the inputs to the device it was given or chose: a model the script
    moves afterwards to a device the call cannot name would get inputs elsewhere."""
    loop = textwrap.indent(placement, "    ")
    body = textwrap.indent(
        "model(x).sum().backward()\nopt.step()", "    " * (2 + ("for d" in placement))
    )
    code = (
        "import torch\ndef main():\n    model = Net()\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n" + loop + "\n" + body + "\n"
    )
    result = wrap_source(code)
    assert result.declined and result.reason == "model moved after the call", result.message
    assert "put `model` on its device before the optimizer is created" in result.message


def test_the_call_follows_a_placement_after_the_optimizer() -> None:
    """nanoVLM: the device is picked after the optimizer and the model placed there by a
    statement of its own, nothing between them using the model: the call goes after it."""
    assert inserted(
        """
        import torch
        def main():
            model = Net()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            dev = pick()
            model.to(dev)
            for x in loader:
                model(x).sum().backward()
                opt.step()
        """
    ) == ["model, loader, opt = autoopt.optimize(model, loader, opt, device=dev)"]


def test_a_later_placement_on_the_calls_device_is_no_move() -> None:
    """VainF DeepLabV3+, pytorch-deeplab-xception: the model is placed again after the
    optimizer, on the device the call names (or under the flag the call's device reads)."""
    assert inserted(
        """
        import torch
        def main(args):
            model = Net()
            if args.cuda:
                model = model.cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            if args.cuda:
                model = torch.nn.DataParallel(model).cuda()
            for x in loader:
                model(x).sum().backward()
                opt.step()
        """
    ) == [
        'model, loader, opt = autoopt.optimize(model, loader, opt, device="cuda" if args.cuda '
        'else "cpu", distributed=False)  # autoopt: distributed=False (own DDP/FSDP/DataParallel '
        "wrap)"
    ]


def test_a_projects_data_parallel_class_after_the_call_is_the_scripts_own_wrap() -> None:
    """DANet: `self.model = DataParallelModel(self.model).cuda()` (encoding's subclass of
    DataParallel) after the optimizer: the call leaves the wrap to the script."""
    assert inserted(
        """
        import torch
        from encoding.parallel import DataParallelModel
        def main(args):
            model = Net()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            if args.cuda:
                model = DataParallelModel(model).cuda()
            for x in loader:
                model(x).sum().backward()
                opt.step()
        """
    ) == [
        'model, loader, opt = autoopt.optimize(model, loader, opt, device="cuda" if args.cuda '
        'else "cpu", distributed=False)  # autoopt: distributed=False (own DDP/FSDP/DataParallel '
        "wrap)"
    ]


@pytest.mark.parametrize("advance", ["next(data_iter)", "data_iter.__next__()"])
def test_a_loader_drawn_with_iter_and_next_is_passed(advance: str) -> None:
    """minGPT's Trainer: `data_iter = iter(train_loader)`, `next(data_iter)` in a while loop,
    re-created on StopIteration; FixMatch advances it with the method."""
    code = """
        import torch
        from torch.utils.data import DataLoader

        def run(model, dataset):
            optimizer = torch.optim.AdamW(model.parameters())
            train_loader = DataLoader(dataset, batch_size=4)
            data_iter = iter(train_loader)
            while True:
                try:
                    batch = next(data_iter)
                except StopIteration:
                    data_iter = iter(train_loader)
                    batch = next(data_iter)
                model(batch).sum().backward()
                optimizer.step()

        run(Net(), data)
        """.replace("next(data_iter)", advance)
    assert inserted(code) == [
        "model, train_loader, optimizer = autoopt.optimize(model, train_loader, optimizer, "
        'device="cpu")'
    ]


def test_one_optimizer_over_several_models_wraps_each_model_in_fp32() -> None:
    """cyclegan: `Adam(itertools.chain(G_AB.parameters(), G_BA.parameters()))`. optimize()
    takes no optimizer over another model's parameters, and fp16 loss scaling needs the
    optimizer: each model gets its own call, without the optimizer, with amp off."""
    code = """
        import itertools
        import torch
        G_AB, G_BA, D_A = Gen(), Gen(), Disc()
        optimizer_G = torch.optim.Adam(itertools.chain(G_AB.parameters(), G_BA.parameters()))
        optimizer_D_A = torch.optim.Adam(D_A.parameters())
        for batch in dataloader:
            optimizer_G.zero_grad()
            loss(G_AB(batch), G_BA(batch)).backward()
            optimizer_G.step()
            optimizer_D_A.zero_grad()
            D_A(batch).sum().backward()
            optimizer_D_A.step()
        """
    why = '  # autoopt: amp="script" (an optimizer spans several models)'
    assert inserted(code) == [
        "D_A, dataloader, optimizer_D_A = autoopt.optimize(D_A, dataloader, optimizer_D_A, "
        'device="cpu", amp="script")' + why,
        'G_AB = autoopt.optimize(G_AB, device="cpu", amp="script")' + why,
        'G_BA = autoopt.optimize(G_BA, device="cpu", amp="script")' + why,
    ]


def test_a_device_held_by_the_trainer_object_is_used() -> None:
    code = """
        import torch
        class Trainer:
            def run(self):
                self.model = self.model.to(self.device)
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
                for x in self.loader:
                    self.model(x).sum().backward()
                    self.optimizer.step()
        """
    assert inserted(code) == [
        "self.model, self.loader, self.optimizer = autoopt.optimize(self.model, self.loader, "
        "self.optimizer, device=self.device)"
    ]


def test_an_optimizer_is_never_passed_as_a_model() -> None:
    """`opt = restore(opt)` re-binds the optimizer through a helper, and `opt.state_dict()`
    makes it look like a module: optimize() must still get only the models."""
    code = """
        import torch
        params = list(enc.parameters()) + list(dec.parameters())
        opt = torch.optim.Adam(params)
        opt = restore(opt)
        for x in loader:
            dec(enc(x)).sum().backward()
            opt.step()
        torch.save(opt.state_dict(), "opt.pt")
        """
    lines = inserted(code)
    assert [line.split(" = ")[0] for line in lines] == ["dec, loader", "enc"]
    assert not any("optimize(opt" in line for line in lines)


def test_a_model_built_in_an_if_elif_chain_and_read_after_it_is_bound() -> None:
    """nanoGPT: `model` is built in if/elif branches without an else, then `model.to(device)`
    runs on every path: wherever the call goes after that read, the model exists."""
    code = """
        import torch
        device = "cuda"
        if init_from == "scratch":
            model = GPT(conf)
        elif init_from == "resume":
            model = load(ckpt)
        model.to(device)
        optimizer = torch.optim.AdamW(model.parameters())
        for x in loader:
            model(x).sum().backward()
            optimizer.step()
        """
    assert inserted(code) == [
        "model, loader, optimizer = autoopt.optimize(model, loader, optimizer, device=device)"
    ]


def test_a_batch_drawn_once_before_the_call_keeps_the_loader() -> None:
    """`next(iter(loader))` (a batch to log) uses its iterator up at once: the loader is still
    the one the loop iterates, and goes to optimize()."""
    code = """
        import torch
        model = Net()
        loader = DataLoader(ds)
        images, labels = next(iter(loader))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            model(x).sum().backward()
            optimizer.step()
        """
    assert inserted(code)[0].startswith("model, loader, optimizer = ")


@pytest.mark.parametrize(
    "bar", ["pbar = trange(steps)", "pbar = tqdm.trange(steps)", "pbar = tqdm(range(steps))"]
)
def test_a_progress_bar_over_step_numbers_is_no_loader(bar: str) -> None:
    """The loop iterates step numbers; batches come from `get_batch()`: no loader to pass."""
    code = f"""
        import torch
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        {bar}
        for step in pbar:
            model(get_batch()).sum().backward()
            optimizer.step()
        """
    assert inserted(code) == [
        'model, optimizer = autoopt.optimize(model, optimizer=optimizer, device="cpu")'
    ]


def test_a_placement_beside_the_call_under_main_is_not_a_flag() -> None:
    """pytorch/examples gat: everything under `if __name__ == "__main__":`; the model is placed
    there whenever the call runs, so the device is the script's, not `... if __name__ ...`."""
    code = """
        import torch
        if __name__ == "__main__":
            device = torch.device("cuda")
            net = Net().to(device)
            optimizer = torch.optim.Adam(net.parameters())
            for x in loader:
                net(x).sum().backward()
                optimizer.step()
        """
    assert inserted(code) == [
        "net, loader, optimizer = autoopt.optimize(net, loader, optimizer, device=device)"
    ]


def test_a_torchtext_iterator_is_no_loader_for_optimize() -> None:
    """keon/seq2seq: batches from torchtext's `BucketIterator` are its own `Batch` objects, not
    a DataLoader's: the call binds the model and the optimizer only."""
    result = wrap_source(
        src(
            """
        import torch
        from torchtext.data import BucketIterator

        def main():
            train_iter = BucketIterator(train, batch_size=32)
            model = Seq2Seq().cuda()
            optimizer = torch.optim.Adam(model.parameters())
            for batch in train_iter:
                optimizer.zero_grad()
                model(batch.src).sum().backward()
                optimizer.step()
        """
        )
    )
    assert result.inserted == (
        'model, optimizer = autoopt.optimize(model, optimizer=optimizer, device="cuda")',
    )


def test_a_shared_actor_copy_beside_a_trained_learner_is_wrapped() -> None:
    """TorchBeast: the actors' processes share `model` (an inference copy); the optimizer
    trains `learner_model`: an ordinary loop, wrapped. Sharing the trained model itself is
    Hogwild, declined."""
    code = """
        import torch
        import torch.multiprocessing as mp
        def train(flags):
            model = Net()
            model.share_memory()
            actors = [mp.Process(target=act, args=(model,)) for _ in range(4)]
            learner_model = Net().to(device=flags.device)
            optimizer = torch.optim.RMSprop(learner_model.parameters(), lr=1e-3)
            for batch in batches:
                loss = learner_model(batch).sum()
                loss.backward()
                optimizer.step()
        """
    assert inserted(code) == [
        "learner_model, batches, optimizer = autoopt.optimize(learner_model, batches, optimizer, "
        "device=flags.device)"
    ]
    hogwild = wrap_source(src(code.replace("model.share_memory()", "learner_model.share_memory()")))
    assert hogwild.declined and hogwild.reason == "Hogwild"


def test_a_run_per_seed_that_builds_its_model_and_a_probe_optimizer_are_wrapped() -> None:
    """GraphMAE: each pass of the seed loop builds a model and its optimizer, then trains: the
    call goes in the loop. The linear probe's optimizer, created by an evaluation function,
    trains a classifier to score the model: it is no second place for the call."""
    code = """
        import torch
        def probe_evaluation(model, graph):
            clf = torch.nn.Linear(16, 4)
            optimizer_f = torch.optim.Adam(clf.parameters(), lr=1e-2)
            for _ in range(100):
                loss = clf(model.embed(graph)).sum()
                loss.backward()
                optimizer_f.step()
        def main(seeds, graph, device):
            for seed in seeds:
                model = build_model()
                model.to(device)
                optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
                for epoch in range(10):
                    loss = model(graph)
                    loss.backward()
                    optimizer.step()
                probe_evaluation(model, graph)
        """
    assert inserted(code) == [
        "model, optimizer = autoopt.optimize(model, optimizer=optimizer, device=device)"
    ]
