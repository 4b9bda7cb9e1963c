"""`--wrap` binds what the loop really uses (issue 30's first-contact misses): a model placed by
another method of its class, optimizers unpacked from a list handed to the loop, a `None`
placeholder beside the one optimizer, an LBFGS closure, helpers imported from Accelerate."""

from __future__ import annotations

import textwrap

from autoopt.lint.wrap.insert import WrapResult, wrap_source


def wrap(code: str) -> WrapResult:
    return wrap_source(textwrap.dedent(code).lstrip("\n"))


def calls(code: str) -> list[str]:
    result = wrap(code)
    assert not result.declined, result.message
    return list(result.inserted)


def test_a_model_placed_by_another_method_keeps_that_device() -> None:
    """TabNet: `_set_network()` builds the network on `self.device`, `_set_optimizer()` builds
    the optimizer; the call must not move the network to the CPU."""
    assert calls(
        """
        import torch

        class TabModel:
            def __init__(self, device_name="auto"):
                self.device = torch.device(pick(device_name))

            def _set_network(self):
                self.network = TabNet(self.input_dim).to(self.device)

            def _set_optimizer(self):
                self.optimizer = torch.optim.Adam(self.network.parameters())

            def fit(self, X):
                self._set_network()
                self._set_optimizer()
                for epoch in range(10):
                    self._train_epoch(X)

            def _train_epoch(self, X):
                for batch in X:
                    self.optimizer.zero_grad()
                    self.network(batch).sum().backward()
                    self.optimizer.step()
        """
    ) == [
        "self.network, self.optimizer = autoopt.optimize(self.network, "
        "optimizer=self.optimizer, device=self.device)"
    ]


def test_a_model_placed_by_another_method_on_a_flag_is_not_sent_to_the_cpu() -> None:
    found = calls(
        """
        import torch

        class Model:
            def build(self, gpu):
                self.net = Net()
                if gpu:
                    self.net.to(self.where)

            def configure(self):
                self.opt = torch.optim.Adam(self.net.parameters())
                for x in self.loader:
                    self.net(x).sum().backward()
                    self.opt.step()
        """
    )
    assert found == [
        "self.net, self.loader, self.opt = autoopt.optimize(self.net, self.loader, self.opt)"
    ]


def test_a_reload_onto_the_same_device_keeps_the_constructors_placement() -> None:
    """JointBERT: `__init__` places `self.model` on `self.device`; `load_model()` reloads it in
    a `try:` and places it there again. The call in `train()` keeps that device."""
    found = calls(
        """
        import torch

        class Trainer:
            def __init__(self, model, use_cuda):
                self.model = model
                self.device = "cuda" if use_cuda else "cpu"
                self.model.to(self.device)

            def load_model(self, path):
                try:
                    self.model = Model.from_pretrained(path)
                    self.model.to(self.device)
                except Exception:
                    raise

            def train(self, loader):
                optimizer = torch.optim.AdamW(self.model.parameters())
                for x in loader:
                    self.model(x).sum().backward()
                    optimizer.step()
        """
    )
    assert found == [
        "self.model, loader, optimizer = autoopt.optimize(self.model, loader, optimizer, "
        "device=self.device)"
    ]


def test_helpers_imported_from_accelerate_are_no_accelerate_training() -> None:
    assert calls(
        """
        import torch
        from accelerate.utils import set_seed, send_to_device

        set_seed(0)
        model = Net()
        opt = torch.optim.AdamW(model.parameters())
        for x in loader:
            x = send_to_device(x, "cpu")
            model(x).sum().backward()
            opt.step()
        """
    ) == ['model, loader, opt = autoopt.optimize(model, loader, opt, device="cpu")']


def test_a_script_that_builds_an_accelerator_is_still_declined() -> None:
    result = wrap(
        """
        import torch
        from accelerate import Accelerator

        accelerator = Accelerator()
        model = Net()
        opt = torch.optim.AdamW(model.parameters())
        model, opt, loader = accelerator.prepare(model, opt, loader)
        for x in loader:
            accelerator.backward(model(x).sum())
            opt.step()
        """
    )
    assert result.declined and result.reason == "already uses Accelerate"


VITS = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

def run(rank, hps):
    train_loader = torch.utils.data.DataLoader(ds, batch_size=hps.batch_size)
    net_g = SynthesizerTrn(hps).cuda(rank)
    net_d = MultiPeriodDiscriminator().cuda(rank)
    optim_g = torch.optim.AdamW(net_g.parameters(), hps.lr)
    optim_d = torch.optim.AdamW(net_d.parameters(), hps.lr)
    net_g = DDP(net_g, device_ids=[rank])
    net_d = DDP(net_d, device_ids=[rank])
    scaler = torch.amp.GradScaler()
    for epoch in range(hps.epochs):
        train_and_evaluate(rank, epoch, [net_g, net_d], [optim_g, optim_d], scaler,
                           [train_loader, None])

def train_and_evaluate(rank, epoch, nets, optims, scaler, loaders):
    net_g, net_d = nets
    optim_g, optim_d = optims
    train_loader, eval_loader = loaders
    for batch in train_loader:
        y_hat = net_g(batch)
        loss_disc = net_d(y_hat.detach()).mean()
        optim_d.zero_grad()
        scaler.scale(loss_disc).backward()
        scaler.step(optim_d)
        loss_gen = -net_d(y_hat).mean()
        optim_g.zero_grad()
        scaler.scale(loss_gen).backward()
        scaler.step(optim_g)
        scaler.update()
"""


def test_optimizers_unpacked_from_a_list_handed_to_the_loop_are_followed() -> None:
    """VITS: `optim_g, optim_d = optims`, the list built by the caller; the loader likewise."""
    options = (
        'amp="script", distributed=False)  # autoopt: amp="script" (own autocast/GradScaler), '
        "distributed=False (own DDP/FSDP/DataParallel wrap)"
    )
    assert calls(VITS) == [
        f"net_g, train_loader, optim_g = autoopt.optimize(net_g, train_loader, optim_g, {options}",
        f"net_d, optim_d = autoopt.optimize(net_d, optimizer=optim_d, {options}",
    ]


def test_a_none_placeholder_is_no_second_optimizer() -> None:
    """`self.optimizer = None` in `__init__`, the optimizer itself built in `fit()`, stepped in
    `_step()`: one optimizer, created in `fit()`."""
    assert calls(
        """
        import torch

        class Trainer:
            def __init__(self, model):
                self.model = model
                self.optimizer = None

            def fit(self, loader):
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
                for x in loader:
                    self._step(x)

            def _step(self, x):
                self.optimizer.zero_grad()
                self.model(x).sum().backward()
                self.optimizer.step()

        Trainer(Net()).fit(loader)
        """
    ) == [
        "self.model, loader, self.optimizer = autoopt.optimize(self.model, loader, "
        'self.optimizer, device="cpu")'
    ]


def test_an_lbfgs_closure_is_the_training_step() -> None:
    """pytorch/examples time_sequence_prediction: the backward runs in a closure that
    `optimizer.step(closure)` calls; fp32, since loss scaling cannot check such a step first."""
    assert calls(
        """
        import torch

        seq = Sequence()
        optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8)
        for i in range(15):
            def closure():
                optimizer.zero_grad()
                loss = criterion(seq(input), target)
                loss.backward()
                return loss
            optimizer.step(closure)
        """
    ) == [
        'seq, optimizer = autoopt.optimize(seq, optimizer=optimizer, device="cpu", amp="script")'
        '  # autoopt: amp="script" (the optimizer steps through a closure: loss scaling cannot '
        "check it first)"
    ]


def test_a_model_handed_to_a_function_that_runs_every_epoch_is_wrapped_there() -> None:
    """cnn-text-classification's train(): nothing here calls it, but it builds the optimizer
    and runs all the epochs itself, so it runs once: the call goes there, with its device."""
    assert calls(
        """
        import torch

        def train(train_iter, model, args):
            if args.cuda:
                model.cuda()
            optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
            for epoch in range(1, args.epochs + 1):
                for batch in train_iter:
                    optimizer.zero_grad()
                    model(batch.text).sum().backward()
                    optimizer.step()
        """
    ) == [
        "model, train_iter, optimizer = autoopt.optimize(model, train_iter, optimizer, "
        'device="cuda" if args.cuda else "cpu")'
    ]


def test_an_optimizer_created_in_a_function_called_every_epoch_is_declined() -> None:
    """Text-Classification-Pytorch: train_model() creates Adam each time the epoch loop calls
    it, over the same model: optimize() would wrap that model again on every epoch."""
    result = wrap(
        """
        import torch

        def train_model(model, train_iter, epoch):
            optim = torch.optim.Adam(model.parameters())
            for batch in train_iter:
                optim.zero_grad()
                model(batch).sum().backward()
                optim.step()

        model = Net()
        for epoch in range(10):
            train_model(model, train_iter, epoch)
        """
    )
    assert result.declined and result.reason == "optimizer created inside the loop"
    assert "`optim` is created inside train_model(), which `for epoch in range(10)` calls" in (
        result.message
    )
    assert "create `optim` once, before `for epoch in range(10)`" in result.message


def test_a_function_started_by_a_hogwild_script_beside_it_is_declined(tmp_path) -> None:
    """mnist_hogwild: train.py's train() is what main.py's processes run on a shared model."""
    (tmp_path / "main.py").write_text(
        "import torch.multiprocessing as mp\nfrom train import train\n"
        "model.share_memory()\np = mp.Process(target=train, args=(model,))\n"
    )
    code = textwrap.dedent(
        """
        import torch

        def train(model, loader, epochs):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(epochs):
                for x in loader:
                    model(x).sum().backward()
                    optimizer.step()
        """
    )
    result = wrap_source(code, path=tmp_path / "train.py")
    assert result.declined and result.reason == "Hogwild"


def test_parameter_groups_read_from_named_parameters_name_the_model() -> None:
    """BERT fine-tunes: `param_optimizer = list(model.named_parameters())`, read by the
    comprehensions of the groups handed to the optimizer."""
    found = calls(
        """
        import torch

        def main():
            model = Bert()
            loader = DataLoader(ds)
            param_optimizer = list(model.named_parameters())
            no_decay = ["bias", "LayerNorm.weight"]
            groups = [
                {"params": [p for n, p in param_optimizer if not any(d in n for d in no_decay)]},
                {"params": [p for n, p in param_optimizer if any(d in n for d in no_decay)]},
            ]
            optimizer = AdamW(groups, lr=2e-5)
            for batch in loader:
                model(batch).sum().backward()
                optimizer.step()
        """
    )
    assert found == [
        'model, loader, optimizer = autoopt.optimize(model, loader, optimizer, device="cpu")'
    ]


def test_a_models_own_parameter_method_and_a_tuple_alias() -> None:
    """pytorch-deeplab-xception: groups from `model.get_1x_lr_params()`, then
    `self.model, self.optimizer = model, optimizer`; the loop trains self.model."""
    found = calls(
        """
        import torch

        class Trainer:
            def __init__(self, args):
                model = DeepLab()
                train_params = [{"params": model.get_1x_lr_params()},
                                {"params": model.get_10x_lr_params()}]
                optimizer = torch.optim.SGD(train_params, lr=args.lr)
                self.model, self.optimizer = model, optimizer

            def training(self, loader):
                for x in loader:
                    self.optimizer.zero_grad()
                    self.model(x).sum().backward()
                    self.optimizer.step()

        Trainer(args).training(loader)
        """
    )
    assert found == [
        "self.model, self.optimizer = autoopt.optimize(self.model, optimizer=self.optimizer, "
        'device="cpu")'
    ]


def test_a_model_chosen_in_branches_whose_else_raises_is_bound() -> None:
    """pytorch-video-recognition: `if/elif` build the model, `else: raise NotImplementedError`."""
    found = calls(
        """
        import torch

        def train_model(name, loader):
            if name == "C3D":
                model = C3D()
            elif name == "R3D":
                model = R3D()
            else:
                print("We only implemented C3D and R3D models.")
                raise NotImplementedError
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(3):
                for x in loader:
                    model(x).sum().backward()
                    optimizer.step()

        train_model("C3D", loader)
        """
    )
    assert found == [
        'model, loader, optimizer = autoopt.optimize(model, loader, optimizer, device="cpu")'
    ]


def test_the_call_goes_before_apex_amp_and_a_checkpoint_restore() -> None:
    """tacotron2: Adam, then `amp.initialize` under the fp16 flag, the loader, and a restore
    that hands back the same optimizer: the call right after Adam, precision left to apex."""
    found = calls(
        """
        import torch

        def load_checkpoint(path, model, optimizer):
            optimizer.load_state_dict(torch.load(path)["optimizer"])
            return model, optimizer, 1e-3, 0

        def train(hparams, checkpoint_path):
            model = load_model(hparams)
            optimizer = torch.optim.Adam(model.parameters(), lr=hparams.lr)
            if hparams.fp16_run:
                from apex import amp
                model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
            train_loader = prepare_dataloaders(hparams)
            if checkpoint_path is not None:
                model, optimizer, lr, it = load_checkpoint(checkpoint_path, model, optimizer)
            for epoch in range(hparams.epochs):
                for batch in train_loader:
                    loss = model(batch)
                    if hparams.fp16_run:
                        with amp.scale_loss(loss, optimizer) as scaled_loss:
                            scaled_loss.backward()
                    else:
                        loss.backward()
                    optimizer.step()

        train(hparams, None)
        """
    )
    assert found == [
        'model, optimizer = autoopt.optimize(model, optimizer=optimizer, device="cpu", amp="script", '
        'compile=False)  # autoopt: amp="script" (own apex amp), compile=False (apex amp casts and '
        "patches the model after the call)"
    ]


def test_an_optimizer_re_bound_to_a_wrapper_class_is_declined_with_the_hand_edit() -> None:
    """swav: `optimizer = LARC(optimizer=optimizer, ...)`: the loop steps the wrapper."""
    result = wrap(
        """
        import torch
        from apex.parallel.LARC import LARC

        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer = LARC(optimizer=optimizer, trust_coefficient=0.001)
        for x in loader:
            model(x).sum().backward()
            optimizer.step()
        """
    )
    assert result.declined and result.reason == "optimizer wrapped in a class"
    assert "`optimizer = LARC(optimizer=optimizer, trust_coefficient=0.001)` wraps" in (
        result.message
    )
    assert "before LARC wraps it" in result.message


TRAIN_BUILDS_OPTIMIZER = """
import torch

def train(model, device, config):
    train_loader = DataLoader(ds)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    for epoch in range(config.epochs):
        for images in train_loader:
            optimizer.zero_grad()
            model(images.to(device)).sum().backward()
            optimizer.step()

if __name__ == "__main__":
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Yolov4()
    if torch.cuda.device_count() > 1:
        model = torch.nn.{wrap}(model)
    model.to(device=device)
    train(model=model, config=cfg, device=device)
"""


def test_a_dataparallel_made_by_the_caller_before_the_optimizer_is_declined() -> None:
    """YOLOv4: `__main__` wraps the model in DataParallel, then train() builds the optimizer."""
    result = wrap(TRAIN_BUILDS_OPTIMIZER.replace("{wrap}", "DataParallel"))
    assert result.declined and result.reason == "model wrapped in DDP/FSDP before the optimizer"
    assert "before it is handed to train(), which creates the optimizer" in result.message
    assert "move the wrap into train(), below the optimizer" in result.message


def test_a_ddp_made_by_the_caller_is_left_to_the_script() -> None:
    """detectron2's plain_train_net: `if distributed: model = DDP(model)`, then do_train()."""
    found = calls(TRAIN_BUILDS_OPTIMIZER.replace("{wrap}", "parallel.DistributedDataParallel"))
    assert len(found) == 1 and "distributed=False" in found[0]


def test_an_optimizer_stepped_through_a_wrapper_class_it_cannot_read_is_declined() -> None:
    """FastSpeech2: `model, optimizer = get_model(...)` from another module, stepped as
    `optimizer.step_and_update_lr()`: a ScheduledOptim, not a torch optimizer."""
    result = wrap(
        """
        import torch
        from utils.model import get_model

        model, optimizer = get_model(args, configs, device, train=True)
        for batch in loader:
            model(batch).sum().backward()
            optimizer.step_and_update_lr()
            optimizer.zero_grad()
        """
    )
    assert result.declined and result.reason == "optimizer wrapped in a class"
    assert "through `step_and_update_lr()`" in result.message


def test_an_optimizer_wrapper_class_of_a_local_module_is_declined(tmp_path) -> None:
    """LSTNet: `optim = Optim.Optim(model.parameters(), ...)`, a class of the local module
    Optim.py that builds the torch optimizer and steps it in its own step(); it was wrapped as
    `optimize(model, optimizer=optim)`, which would get no torch optimizer."""
    (tmp_path / "Optim.py").write_text(
        textwrap.dedent(
            """
            import torch.optim as optim

            class Optim(object):
                def __init__(self, params, lr, max_grad_norm):
                    self.params = list(params)
                    self.optimizer = optim.Adam(self.params, lr=lr)
                    self.max_grad_norm = max_grad_norm

                def step(self):
                    self.optimizer.step()
            """
        )
    )
    code = textwrap.dedent(
        """
        import torch
        import Optim

        model = Net()
        optim = Optim.Optim(model.parameters(), 0.001, 10.0)
        for epoch in range(10):
            for x in loader:
                model.zero_grad()
                model(x).sum().backward()
                optim.step()
        """
    )
    result = wrap_source(code, path=tmp_path / "main.py")
    assert result.declined and result.reason == "optimizer wrapped in a class"
    assert "`optim` is an instance of Optim.Optim, a wrapper class that steps" in result.message


META = """
import torch
from torch import nn, optim

class Meta(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.net = Learner(args)
        self.meta_optim = optim.Adam(self.net.parameters(), lr=1e-3)

    def forward(self, x_spt, y_spt, x_qry, y_qry):
        loss_q = self.net(x_qry).sum()
        self.meta_optim.zero_grad()
        loss_q.backward()
        self.meta_optim.step()
        return loss_q
"""


def test_an_optimizer_stepped_inside_a_modules_forward_is_declined(tmp_path) -> None:
    """MAML-Pytorch's meta.py: Meta builds meta_optim in __init__ and steps it in forward();
    it was wrapped inside __init__ (with device="cpu" for a module the driver moves to CUDA)."""
    result = wrap_source(textwrap.dedent(META), path=tmp_path / "meta.py")
    assert result.declined and result.reason == "optimizer stepped inside a model's forward"
    assert "Meta.forward() steps `self.meta_optim` itself" in result.message


def test_a_driver_that_calls_the_meta_learner_is_declined_for_it(tmp_path) -> None:
    """MAML-Pytorch's driver: `maml = Meta(args).to(device)`, then `maml(x_spt, ...)` per
    batch: the backward is reached through the instance's forward (it said 'no .backward() is
    reached from this file')."""
    (tmp_path / "meta.py").write_text(textwrap.dedent(META))
    code = textwrap.dedent(
        """
        import torch
        from meta import Meta

        def main(args):
            device = torch.device("cuda")
            maml = Meta(args).to(device)
            for epoch in range(10):
                for x_spt, y_spt, x_qry, y_qry in loader:
                    accs = maml(x_spt.to(device), y_spt, x_qry, y_qry)
        """
    )
    result = wrap_source(code, path=tmp_path / "train.py")
    assert result.declined and result.reason == "optimizer stepped inside a model's forward"


def test_a_zeroed_scheduling_wrapper_is_an_optimizer_not_a_scheduler() -> None:
    """BERT-pytorch: `self.optim_schedule` (a ScheduledOptim) is zeroed and stepped: an
    optimizer's wrapper, though its name says schedule (it was "no optimizer is stepped")."""
    result = wrap(
        """
        import torch

        class BERTTrainer:
            def __init__(self, bert, with_cuda):
                self.model = BERTLM(bert)
                if with_cuda and torch.cuda.device_count() > 1:
                    self.model = torch.nn.DataParallel(self.model)
                self.optim = torch.optim.Adam(self.model.parameters())
                self.optim_schedule = ScheduledOptim(self.optim, n_warmup_steps=10)

            def iteration(self, loader):
                for data in loader:
                    loss = self.model(data).sum()
                    self.optim_schedule.zero_grad()
                    loss.backward()
                    self.optim_schedule.step_and_update_lr()
        """
    )
    assert result.declined and result.reason == "optimizer wrapped in a class"
    assert "`self.optim_schedule` through `step_and_update_lr()`" in result.message


def test_a_scheduler_named_wrapper_stepped_as_step_is_an_optimizer() -> None:
    """MusicTransformer: `scheduler = CustomSchedule(d, optimizer=opt)`, a class of the file
    whose `step()` sets the rate and steps the optimizer, is the loop's only step (it was "no
    optimizer is stepped"); a torch LR scheduler beside a plain optimizer stays a scheduler."""
    code = """
        import torch

        class CustomSchedule:
            def __init__(self, d_model, optimizer=None):
                self.optimizer = optimizer

            def step(self):
                for p in self.optimizer.param_groups:
                    p["lr"] = 0.1
                self.optimizer.step()

        mt = Net()
        opt = torch.optim.Adam(mt.parameters(), lr=0)
        scheduler = CustomSchedule(512, optimizer=opt)
        for x in loader:
            scheduler.optimizer.zero_grad()
            mt(x).sum().backward()
            scheduler.step()
        """
    result = wrap(code)
    assert result.declined and result.reason == "optimizer wrapped in a class"
    assert "`scheduler` is an instance of CustomSchedule" in result.message
    plain = code.replace(
        "scheduler = CustomSchedule(512, optimizer=opt)",
        "scheduler = torch.optim.lr_scheduler.StepLR(opt, 10)",
    ).replace("scheduler.optimizer.zero_grad()", "opt.zero_grad()")
    plain = plain.replace("scheduler.step()", "opt.step()\n            scheduler.step()")
    assert not wrap(plain).declined


def test_a_ddp_before_the_optimizer_is_named_before_the_loss_scaler() -> None:
    """ConvNeXt's main.py: DDP before the optimizer, and a loss scaler object in the loop of
    engine.py: the first thing to change is the wrap."""
    result = wrap(
        """
        import torch

        def train_one_epoch(model, loader, optimizer, loss_scaler):
            for x in loader:
                loss = model(x).sum()
                if loss_scaler is None:
                    loss.backward()
                    optimizer.step()
                else:
                    loss_scaler(loss, optimizer, parameters=model.parameters())

        def main(args):
            model = Net().cuda()
            if args.distributed:
                model = torch.nn.parallel.DistributedDataParallel(model)
            optimizer = torch.optim.AdamW(model.parameters())
            for epoch in range(3):
                train_one_epoch(model, loader, optimizer, NativeScaler())
        """
    )
    assert result.declined and result.reason == "model wrapped in DDP/FSDP before the optimizer"


def test_a_config_handed_to_the_optimizer_builder_is_not_the_model() -> None:
    """Prototypical Networks, hysts' classification: `optim = init_optim(options, model)` with
    `options.cuda` and `options.train.epochs` read as fields: the model is `model`."""
    found = calls(
        """
        import torch

        def main(options):
            device = "cuda" if options.cuda else "cpu"
            model = init_protonet(options).to(device)
            optim = init_optim(options, model)
            for epoch in range(options.train.epochs):
                for x in loader:
                    model(x).sum().backward()
                    optim.step()
        """
    )
    assert found == ["model, loader, optim = autoopt.optimize(model, loader, optim, device=device)"]


def test_a_parallel_wrap_by_a_helper_of_the_project(tmp_path) -> None:
    """hysts' classification: `model = apply_data_parallel_wrapper(config, model)`, a helper of
    the project that wraps in DDP: the script's own wrap, so the call says distributed=False."""
    (tmp_path / "helpers.py").write_text(
        "import torch.nn as nn\n\n"
        "def wrap_model(config, model):\n"
        "    return nn.parallel.DistributedDataParallel(model, device_ids=[config.rank])\n"
    )
    code = textwrap.dedent(
        """
        import torch
        from helpers import wrap_model

        model = Net().to("cuda")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model = wrap_model(config, model)
        for x in loader:
            model(x).sum().backward()
            optimizer.step()
        """
    )
    result = wrap_source(code, path=tmp_path / "train.py")
    assert not result.declined, result.message
    assert "distributed=False" in result.inserted[-1]


def test_a_factory_that_places_the_model_on_a_device_of_its_own() -> None:
    """Prototypical Networks: `init_protonet(opt)` picks `device = "cuda:0" if ... opt.cuda
    else "cpu"` itself and returns the model placed there: the call carries that choice."""
    found = calls(
        """
        import torch

        def init_protonet(opt):
            device = "cuda:0" if torch.cuda.is_available() and opt.cuda else "cpu"
            model = ProtoNet().to(device)
            return model

        def main(options):
            model = init_protonet(options)
            optim = torch.optim.Adam(model.parameters())
            for x in loader:
                model(x).sum().backward()
                optim.step()
        """
    )
    assert found == [
        "model, loader, optim = autoopt.optimize(model, loader, optim, "
        'device="cuda:0" if torch.cuda.is_available() and options.cuda else "cpu")'
    ]


def test_a_model_class_brought_by_a_star_import_trains_itself(tmp_path) -> None:
    """TextCNN: `from model import *` brings the class whose `run_epoch` holds the loop; the
    optimizer is handed to `model.add_optimizer(...)`: the call goes before that hand-over."""
    (tmp_path / "model.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            class TextCNN(nn.Module):
                def add_optimizer(self, optimizer):
                    self.optimizer = optimizer

                def run_epoch(self, iterator):
                    for batch in iterator:
                        self.optimizer.zero_grad()
                        self(batch.text).sum().backward()
                        self.optimizer.step()
            """
        )
    )
    code = textwrap.dedent(
        """
        import torch
        from model import *

        model = TextCNN()
        model.cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.add_optimizer(optimizer)
        for epoch in range(10):
            model.run_epoch(dataset.train_iterator)
        """
    ).lstrip("\n")
    result = wrap_source(code, path=tmp_path / "train.py")
    assert not result.declined, result.message
    assert list(result.inserted) == [
        'model, optimizer = autoopt.optimize(model, optimizer=optimizer, device="cuda")'
    ]
    lines = result.source.splitlines()
    assert lines.index("model.add_optimizer(optimizer)") > lines.index(
        'model, optimizer = autoopt.optimize(model, optimizer=optimizer, device="cuda")'
    )


def test_parameter_lists_a_model_holds_feed_the_optimizer() -> None:
    """GCNII: `optim.Adam([dict(params=model.params1, ...), dict(params=model.params2, ...)])`."""
    assert calls(
        """
        import torch
        device = torch.device("cuda")
        model = GCNII(nfeat=8).to(device)
        optimizer = torch.optim.Adam(
            [dict(params=model.params1, weight_decay=0.01), dict(params=model.params2)], lr=0.01
        )
        for epoch in range(100):
            optimizer.zero_grad()
            model(features).sum().backward()
            optimizer.step()
        """
    ) == ["model, optimizer = autoopt.optimize(model, optimizer=optimizer, device=device)"]


def test_an_optimizer_the_model_builds_itself() -> None:
    """pytorch-book: `optimizer = model.get_optimizer(lr, weight_decay)` (BasicModule)."""
    assert calls(
        """
        import torch
        device = torch.device("cuda")
        model = Net()
        model.to(device)
        optimizer = model.get_optimizer(0.1, 1e-4)
        for x in loader:
            optimizer.zero_grad()
            model(x.to(device)).sum().backward()
            optimizer.step()
        """
    ) == ["model, loader, optimizer = autoopt.optimize(model, loader, optimizer, device=device)"]


def test_an_iterator_taken_only_to_look_at_a_batch_leaves_the_loader_to_the_call() -> None:
    """pytorchTutorial: `dataiter = iter(train_loader)` shows a few images before training;
    nothing reads it afterwards, so the loader goes to optimize() too. An iterator the
    training reads keeps the call without the loader."""
    code = """
    import torch
    device = torch.device("cuda")
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=4)
    dataiter = iter(train_loader)
    images, labels = next(dataiter)
    model = ConvNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        for images, labels in train_loader:
            optimizer.zero_grad()
            model(images.to(device)).sum().backward()
            optimizer.step()
    """
    assert calls(code) == [
        "model, train_loader, optimizer = autoopt.optimize(model, train_loader, optimizer, "
        "device=device)"
    ]
    reread = code.replace("optimizer.step()", "optimizer.step()\n            next(dataiter)")
    assert calls(reread) == [
        "model, optimizer = autoopt.optimize(model, optimizer=optimizer, device=device)"
    ]


def test_each_optimizer_a_factory_returns_pairs_with_the_model_it_reads() -> None:
    """SRGAN-PyTorch's train_gan.py: `g_optimizer, d_optimizer = define_optimizer(g_model,
    d_model, config)` builds each over one model: a call per pair, each with its optimizer
    (not one over both models, which would leave both calls without an optimizer)."""
    found = calls(
        """
        import torch
        from torch import optim

        def define_optimizer(g_model, d_model, config):
            g_optimizer = optim.Adam(g_model.parameters(), config.lr)
            d_optimizer = optim.Adam(d_model.parameters(), config.lr)
            return g_optimizer, d_optimizer

        def main(config):
            g_model, d_model = Generator().cuda(), Discriminator().cuda()
            g_optimizer, d_optimizer = define_optimizer(g_model, d_model, config)
            for x in loader:
                d_optimizer.zero_grad()
                d_model(x).mean().backward()
                d_optimizer.step()
                g_optimizer.zero_grad()
                g_model(x).mean().backward()
                g_optimizer.step()
        """
    )
    assert found == [
        "d_model, loader, d_optimizer = autoopt.optimize(d_model, loader, d_optimizer)",
        "g_model, g_optimizer = autoopt.optimize(g_model, optimizer=g_optimizer)",
    ]


def test_the_loader_is_the_one_whose_loop_steps_the_optimizer() -> None:
    """MART: the evaluation's PGD attack runs a backward over the test loader (with a
    throwaway SGD over the input, never stepped); the loader for optimize() is the one the
    loop that steps the optimizer iterates."""
    found = calls(
        """
        import torch
        import torch.nn as nn

        train_loader = torch.utils.data.DataLoader(trainset, batch_size=128, shuffle=True)
        test_loader = torch.utils.data.DataLoader(testset, batch_size=200)

        def train(model, train_loader, optimizer):
            for data, target in train_loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(data), target).backward()
                optimizer.step()

        def attack(model, X, y):
            X_pgd = X.clone().requires_grad_()
            opt = torch.optim.SGD([X_pgd], lr=1e-3)
            opt.zero_grad()
            nn.functional.cross_entropy(model(X_pgd), y).backward()
            return X_pgd.grad.sign()

        def evaluate(model, test_loader):
            for data, target in test_loader:
                attack(model, data, target)

        def main():
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(10):
                train(model, train_loader, optimizer)
                evaluate(model, test_loader)

        main()
        """
    )
    assert found == [
        'model, train_loader, optimizer = autoopt.optimize(model, train_loader, optimizer, device="cpu")'
    ]


def test_a_progress_bar_bound_twice_is_read_where_the_loop_reads_it() -> None:
    """seq2seq-summarizer: `prog_bar` is a tqdm over a range for the training batches and a
    tqdm over another range for validation; reading the bindings crashed (an internal error,
    nothing inserted)."""
    found = calls(
        """
        import torch
        from tqdm import tqdm

        def train(batches, model, n_batches, n_epochs):
            optimizer = torch.optim.Adam(model.parameters())
            for epoch in range(n_epochs):
                prog_bar = tqdm(range(1, n_batches + 1))
                for batch_count in prog_bar:
                    batch = next(batches)
                    optimizer.zero_grad()
                    model(batch).sum().backward()
                    optimizer.step()
                prog_bar = tqdm(range(1, 10))
                for batch_count in prog_bar:
                    model(next(batches))

        train(make_batches(), Net(), 100, 3)
        """
    )
    assert found == [
        'model, optimizer = autoopt.optimize(model, optimizer=optimizer, device="cpu")'
    ]


def test_loaders_zipped_together_give_a_call_without_a_loader() -> None:
    """revgrad: `zip(source_loader, target_loader)`, the batches concatenated before
    `.to(device)`; handing one loader to optimize() would put its batches alone on the device
    and `torch.cat` would mix devices."""
    found = calls(
        """
        import torch

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Net().to(device)
        source_loader = torch.utils.data.DataLoader(source, batch_size=32, shuffle=True)
        target_loader = torch.utils.data.DataLoader(target, batch_size=32, shuffle=True)
        optim = torch.optim.Adam(model.parameters())
        for epoch in range(10):
            for (source_x, source_y), (target_x, _) in zip(source_loader, target_loader):
                x = torch.cat([source_x, target_x]).to(device)
                optim.zero_grad()
                model(x).sum().backward()
                optim.step()
        """
    )
    assert found == ["model, optim = autoopt.optimize(model, optimizer=optim, device=device)"]


def test_a_factory_returning_the_model_and_its_optimizer_pairs_them() -> None:
    """Performance-RNN: `model, optimizer = load_session()`, the function building both, the
    optimizer over its own local model; was declined as "cannot tell which model"."""
    found = calls(
        """
        import torch

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

        def load_session():
            model = PerformanceRNN(**config).to(device)
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            return model, optimizer

        model, optimizer = load_session()
        for batch in batches:
            model.zero_grad()
            model(batch).sum().backward()
            optimizer.step()
        """
    )
    assert found == ["model, batches, optimizer = autoopt.optimize(model, batches, optimizer)"]


def test_a_data_parallel_wrap_in_the_constructor_comes_before_the_optimizer() -> None:
    """EEG-Conformer: `__init__` wraps `self.model` in DataParallel, `train()` builds the Adam
    over it; 2s-AGCN: the constructor calls `self.load_model()` (the wrap), then
    `self.load_optimizer()`."""
    for code in (
        """
        import torch
        import torch.nn as nn

        class ExP:
            def __init__(self):
                self.model = Conformer().cuda()
                self.model = nn.DataParallel(self.model, device_ids=[0])

            def train(self):
                self.optimizer = torch.optim.Adam(self.model.parameters())
                for img, label in self.dataloader:
                    self.optimizer.zero_grad()
                    self.model(img).sum().backward()
                    self.optimizer.step()

        ExP().train()
        """,
        """
        import torch
        import torch.nn as nn

        class Processor:
            def __init__(self, arg):
                self.load_model()
                self.load_optimizer()

            def load_model(self):
                self.model = Model().cuda()
                self.model = nn.DataParallel(self.model, device_ids=[0, 1])

            def load_optimizer(self):
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def train(self):
                for x in self.loader:
                    self.optimizer.zero_grad()
                    self.model(x).sum().backward()
                    self.optimizer.step()

        Processor(arg).train()
        """,
    ):
        result = wrap(code)
        assert result.declined and "DataParallel before the optimizer exists" in result.message


def test_a_modules_train_mode_is_no_stepping_wrapper_and_a_frozen_wrap_is_not_the_model() -> None:
    """FourCastNet: the Trainer's own `train()` steps the optimizer, so `self.model.train()`
    read as a wrapper's step declined the script ("wraps the torch optimizer"); the DDP wrap
    of the frozen `self.model_wind` before the optimizer is not the trained model's."""
    found = calls(
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel

        class Trainer:
            def __init__(self, params):
                self.device = torch.cuda.current_device()
                if params.precip:
                    self.model_wind = Wind().to(self.device)
                    self.model_wind = DistributedDataParallel(self.model_wind, device_ids=[0])
                self.model = AFNONet(params).to(self.device)
                self.optimizer = torch.optim.Adam(self.model.parameters(), lr=params.lr)
                self.model = DistributedDataParallel(self.model, device_ids=[0])

            def train(self):
                for epoch in range(10):
                    self.model.train()
                    for data in self.train_data_loader:
                        self.model.zero_grad()  # the model's, as FourCastNet does
                        self.model(data).sum().backward()
                        self.optimizer.step()

        Trainer(params).train()
        """
    )
    assert found == [
        "self.model, self.train_data_loader, self.optimizer = autoopt.optimize(self.model, "
        "self.train_data_loader, self.optimizer, device=self.device, distributed=False)  "
        "# autoopt: distributed=False (own DDP/FSDP/DataParallel wrap)"
    ]


def test_a_dataset_changed_in_place_by_the_name_the_loader_was_built_over() -> None:
    """world-models: `dataset_train.load_next_buffer()` each epoch, for `train_loader =
    DataLoader(dataset_train, ...)`."""
    result = wrap(
        """
        import torch

        dataset_train = RolloutObservationDataset("datasets/carracing")
        train_loader = torch.utils.data.DataLoader(dataset_train, batch_size=32, num_workers=2)
        model = VAE().to(device)
        optimizer = torch.optim.Adam(model.parameters())

        def train(epoch):
            dataset_train.load_next_buffer()
            for data in train_loader:
                optimizer.zero_grad()
                model(data.to(device)).sum().backward()
                optimizer.step()

        for epoch in range(10):
            train(epoch)
        """
    )
    assert result.declined and "dataset_train.load_next_buffer()" in result.message


def test_a_dataset_reset_each_epoch_for_a_loader_made_anew_each_epoch_is_no_decline() -> None:
    """dfdc: `data_train.reset(epoch, seed)`, then `DataLoader(data_train, ...)` built in the
    epoch loop: the call goes before the loop without the loader, so nothing keeps the
    dataset as it was (was declined as a dataset changed in place)."""
    result = wrap(
        """
        import torch

        def main():
            data_train = DeepFakeDataset()
            model = Net().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(10):
                data_train.reset(epoch, 0)
                train_loader = torch.utils.data.DataLoader(data_train, batch_size=32)
                for x, y in train_loader:
                    optimizer.zero_grad()
                    model(x.cuda()).sum().backward()
                    optimizer.step()
        """
    )
    assert result.inserted == (
        'model, optimizer = autoopt.optimize(model, optimizer=optimizer, device="cuda")',
    ), result.message


def test_an_optimizer_wrapper_a_factory_returns_is_declined_as_a_wrapper() -> None:
    """end2end-asr: `opt = init_optimizer(args, model, "noam")` returns `NoamOpt(...)`, a
    plain class stepping the Adam it holds; was declined as "model not bound on every path"."""
    result = wrap(
        """
        import torch

        class NoamOpt:
            def __init__(self, warmup, optimizer):
                self.optimizer = optimizer

            def step(self):
                self.optimizer.step()

        def init_optimizer(args, model, opt_type="noam"):
            if opt_type == "noam":
                opt = NoamOpt(args.warmup, torch.optim.Adam(model.parameters()))
            else:
                opt = None
            return opt

        if args.model == "TRFS":
            model = Transformer()
            opt = init_optimizer(args, model, "noam")
        else:
            print("not supported")
        for x in loader:
            opt.optimizer.zero_grad()
            model(x).sum().backward()
            opt.step()
        """
    )
    assert result.declined and "an instance of NoamOpt" in result.message


def test_parameter_groups_appended_in_a_loop_over_the_models_parameters() -> None:
    """F3Net: `for name, param in net.named_parameters(): base.append(param)` / `head`, then
    `SGD([{'params': base}, {'params': head}])`; was "cannot tell which model"."""
    found = calls(
        """
        import torch

        net = Network(cfg)
        net.cuda()
        base, head = [], []
        for name, param in net.named_parameters():
            if "bkbone" in name:
                base.append(param)
            else:
                head.append(param)
        optimizer = torch.optim.SGD([{"params": base}, {"params": head}], lr=0.05)
        for image, mask in loader:
            optimizer.zero_grad()
            net(image.cuda()).sum().backward()
            optimizer.step()
        """
    )
    assert found == [
        'net, loader, optimizer = autoopt.optimize(net, loader, optimizer, device="cuda")'
    ]


def test_parameter_groups_added_with_plus_equals_in_a_loop_over_the_named_parameters() -> None:
    """faster-rcnn: `for key, value in dict(net.named_parameters()).items(): params +=
    [{'params': [value], ...}]`, then `SGD(params)`; was "cannot tell which model"."""
    found = calls(
        """
        import torch

        net = Network(cfg)
        params = []
        for key, value in dict(net.named_parameters()).items():
            if value.requires_grad:
                params += [{"params": [value], "lr": 0.01}]
        optimizer = torch.optim.SGD(params, momentum=0.9)
        for image, target in loader:
            optimizer.zero_grad()
            net(image).sum().backward()
            optimizer.step()
        """
    )
    assert found == [
        'net, loader, optimizer = autoopt.optimize(net, loader, optimizer, device="cpu")'
    ]


def test_parameter_groups_of_a_models_submodules_gathered_by_helpers() -> None:
    """lightweight-human-pose: `Adam([{'params': get_parameters_conv(net.model, 'weight')},
    {'params': get_parameters_bn(net.cpm, 'bias')}])`: the helpers gather the parameters of
    the model's parts, so the model is `net`; was "cannot tell which model"."""
    found = calls(
        """
        import torch
        from modules.get_parameters import get_parameters_bn, get_parameters_conv

        net = PoseEstimationWithMobileNet()
        optimizer = torch.optim.Adam([
            {"params": get_parameters_conv(net.model, "weight")},
            {"params": get_parameters_bn(net.cpm.trunk, "bias"), "weight_decay": 0},
        ], lr=4e-5)
        for batch in loader:
            optimizer.zero_grad()
            net(batch).sum().backward()
            optimizer.step()
        """
    )
    assert found == [
        'net, loader, optimizer = autoopt.optimize(net, loader, optimizer, device="cpu")'
    ]


def test_an_optimizer_over_the_wrapped_models_module_still_sees_the_wrap() -> None:
    """`model = DDP(model)` then `Adam(model.module.parameters())`: the wrap is the trained
    model's (the filter that skips a frozen model's wrap must not skip this one)."""
    result = wrap(
        """
        import torch

        model = Net().cuda()
        model = torch.nn.DataParallel(model)
        optimizer = torch.optim.Adam(model.module.parameters())
        for x in loader:
            optimizer.zero_grad()
            model(x.cuda()).sum().backward()
            optimizer.step()
        """
    )
    assert result.declined and "DataParallel before the optimizer exists" in result.message


def test_wraps_of_an_alias_or_through_a_placement_are_the_trained_models() -> None:
    """faster-rcnn (bubbliiiing): `model_train = model.train()` wrapped in DataParallel,
    the optimizer over `model.parameters()`; style-based-gan: `discriminator =
    nn.DataParallel(Discriminator()).cuda()`. Both are the trained models' wraps."""
    for code in (
        """
        import torch

        model = Net()
        model_train = model.train()
        if Cuda:
            model_train = torch.nn.DataParallel(model_train)
            model_train = model_train.cuda()
        optimizer = torch.optim.Adam(model.parameters())
        for x in loader:
            optimizer.zero_grad()
            model_train(x).sum().backward()
            optimizer.step()
        """,
        """
        import torch
        from torch import nn

        discriminator = nn.DataParallel(Discriminator()).cuda()
        d_optimizer = torch.optim.Adam(discriminator.parameters())
        for x in loader:
            d_optimizer.zero_grad()
            discriminator(x.cuda()).sum().backward()
            d_optimizer.step()
        """,
    ):
        result = wrap(code)
        assert result.declined and "DataParallel before the optimizer exists" in result.message


def test_a_dataset_method_whose_value_is_used_is_a_read() -> None:
    """DeepLabV3Plus: `train_dst.decode_target(target)` in the loop reads the dataset (a colour
    map for images to save): no change in place."""
    found = calls(
        """
        import torch

        train_dst = VOCSegmentation(root)
        train_loader = torch.utils.data.DataLoader(train_dst, batch_size=16, num_workers=2)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for images, labels in train_loader:
            optimizer.zero_grad()
            model(images).sum().backward()
            optimizer.step()
            shown = train_dst.decode_target(labels)
        """
    )
    assert found == [
        "model, train_loader, optimizer = autoopt.optimize(model, train_loader, optimizer, "
        'device="cpu")'
    ]


def test_an_optimizer_over_a_module_list_of_unnamed_parts_declines() -> None:
    """SimKD: `trainable_list = nn.ModuleList([])` gets `model_s` and, under a flag, parts of
    a criterion (`criterion_kd.embed_s`); the SGD is built over it and the loop runs another
    list's first module. A ModuleList has no forward: declined naming it (it wrapped the
    ModuleList)."""
    result = wrap(
        """
        import torch
        from torch import nn, optim

        model_s = Student().cuda()
        trainable_list = nn.ModuleList([])
        trainable_list.append(model_s)
        if opt.distill == "crd":
            criterion_kd = CRDLoss(opt)
            trainable_list.append(criterion_kd.embed_s)
        optimizer = optim.SGD(trainable_list.parameters(), lr=0.05)
        for x, y in loader:
            optimizer.zero_grad()
            model_s(x.cuda()).sum().backward()
            optimizer.step()
        """
    )
    assert result.declined and "`trainable_list`, an nn.ModuleList" in result.message
    assert not result.inserted


def test_an_optimizer_printed_is_not_handed_to_a_trainer() -> None:
    """simple-nmt: `print(optimizer)` after building it is no trainer the optimizer is handed
    to; the decline names the call that trains (it said "handed to `print(...)`")."""
    result = wrap(
        """
        import torch
        from trainer import SingleTrainer

        def main(config):
            model = Seq2Seq(config)
            optimizer = torch.optim.Adam(model.parameters())
            print(optimizer)
            trainer = SingleTrainer(config)
            trainer.train(model, optimizer, train_loader)

        main(None)
        """
    )
    assert result.declined and "handed to `trainer.train(...)`" in result.message
    assert "print" not in result.message


NERF_FACTORY = """
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

def create_nerf(args):
    embed_fn, input_ch = get_embedder(args.multires, i=args.i_embed)
    if args.i_embed == 1:
        embedding_params = list(embed_fn.parameters())
    model = NeRF(input_ch).to(device)
    grad_vars = list(model.parameters())
    model_fine = None
    if args.N_importance > 0:
        model_fine = NeRF(input_ch).to(device)
        grad_vars += list(model_fine.parameters())
    if args.i_embed == 1:
        optimizer = RAdam([{"params": grad_vars}, {"params": embedding_params}], lr=args.lrate)
    else:
        optimizer = torch.optim.Adam(params=grad_vars, lr=args.lrate)
    render_kwargs_train = {"network_fn": model, "network_fine": model_fine}
    return render_kwargs_train, grad_vars, optimizer

def train(args):
    render_kwargs_train, grad_vars, optimizer = create_nerf(args)
    for i in range(args.N_iters):
        optimizer.zero_grad()
        loss = render(rays[i], **render_kwargs_train)
        loss.backward()
        optimizer.step()
"""


def test_models_a_factory_keeps_to_itself_get_their_calls_there() -> None:
    """nerf / HashNeRF: `create_nerf(args)` builds `model`, `model_fine` and the Adam over
    their `grad_vars`, and returns render settings, not the models: the calls go inside it
    after the optimizer, one per model in the script's precision, `model_fine` under its
    None guard; `embed_fn`, whose parameters join only under `if args.i_embed == 1` (a
    function otherwise), is left to the script. It said "cannot tell which model"."""
    found = [line.split("  #")[0] for line in calls(NERF_FACTORY)]
    assert found == [
        'model = autoopt.optimize(model, device=device, amp="script")',
        # (the "cpu" branch is the path where model_fine stays None: the guard skips it)
        "if model_fine is not None: model_fine = autoopt.optimize(model_fine, "
        'device=device if args.N_importance > 0 else "cpu", amp="script")',
    ]


def test_a_factory_that_returns_its_model_keeps_the_call_with_the_caller() -> None:
    """Performance-RNN's `model, optimizer = load_session()`: the caller holds both, so the
    call stays there (the factory is not entered)."""
    found = calls(
        """
        import torch

        def load_session():
            model = PerformanceRNN().cuda()
            optimizer = torch.optim.Adam(model.parameters())
            return model, optimizer

        def train():
            model, optimizer = load_session()
            for x in loader:
                optimizer.zero_grad()
                model(x.cuda()).sum().backward()
                optimizer.step()

        train()
        """
    )
    assert found == ["model, loader, optimizer = autoopt.optimize(model, loader, optimizer)"]


def test_a_loss_scaler_under_another_name_steps_the_optimizer() -> None:
    """NVAE: `grad_scalar = GradScaler(2**10)`, then `grad_scalar.scale(loss).backward()` and
    `grad_scalar.step(cnn_optimizer)`: what scales the loss is the scaler, whatever its name
    (it said "no optimizer is stepped where .backward() runs")."""
    found = calls(
        """
        import torch
        from torch.cuda.amp import GradScaler, autocast

        def train(train_queue, model, cnn_optimizer, grad_scalar):
            for x in train_queue:
                cnn_optimizer.zero_grad()
                with autocast():
                    loss = model(x.cuda()).sum()
                grad_scalar.scale(loss).backward()
                grad_scalar.step(cnn_optimizer)
                grad_scalar.update()

        def main(args):
            model = AutoEncoder(args).cuda()
            cnn_optimizer = torch.optim.Adamax(model.parameters(), 1e-2)
            grad_scalar = GradScaler(2**10)
            train_queue = torch.utils.data.DataLoader(dataset, batch_size=8)
            for epoch in range(args.epochs):
                train(train_queue, model, cnn_optimizer, grad_scalar)
        """
    )
    assert len(found) == 1 and found[0].startswith(
        "model, train_queue, cnn_optimizer = autoopt.optimize(model, train_queue, cnn_optimizer"
    )
    assert 'amp="script"' in found[0]


def test_a_loader_wrapped_by_tqdm_in_a_with_statement_is_the_loop_s() -> None:
    """DDPM (zoubohao): `with tqdm(dataloader, dynamic_ncols=True) as tqdmDataLoader:` then
    `for images, labels in tqdmDataLoader:`: the loader is the one the loop draws from (the call
    went without it)."""
    found = calls(
        """
        import torch
        from tqdm import tqdm

        def train(modelConfig):
            device = torch.device(modelConfig["device"])
            dataloader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True)
            net_model = UNet().to(device)
            optimizer = torch.optim.AdamW(net_model.parameters(), lr=1e-4)
            for e in range(modelConfig["epoch"]):
                with tqdm(dataloader, dynamic_ncols=True) as tqdmDataLoader:
                    for images, labels in tqdmDataLoader:
                        optimizer.zero_grad()
                        net_model(images.to(device)).sum().backward()
                        optimizer.step()
        """
    )
    assert found == [
        "net_model, dataloader, optimizer = autoopt.optimize(net_model, dataloader, optimizer, "
        "device=device)"
    ]


def test_a_parameter_list_a_helper_may_extend_leaves_the_optimizer_to_the_script() -> None:
    """Deep-Metric-Learning-Baselines: `criterion, to_optim = losses.loss_select(opt.loss,
    opt, to_optim)` adds the loss's own parameters under the default loss; the optimizer was
    handed to optimize() with the model, which refuses an optimizer holding parameters that are
    not the model's (ValueError at start-up). The model gets its call without it."""
    script = """
        import torch
        import losses

        model = Net().cuda()
        to_optim = [{"params": model.parameters(), "lr": 1e-5}]
        criterion, to_optim = losses.loss_select(opt.loss, opt, to_optim)
        optimizer = torch.optim.Adam(to_optim)
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x.cuda()), y.cuda()).backward()
            optimizer.step()
        """
    assert calls(script) == [
        'model, loader = autoopt.optimize(model, loader, device="cuda", amp="script")'
        '  # autoopt: amp="script" (the optimizer also trains what losses.loss_select() adds to'
        " its parameters)"
    ]
    # a list only read by a call (`print(to_optim)`) or rebound from one that is not handed it
    # keeps the pair
    plain = script.replace(
        "criterion, to_optim = losses.loss_select(opt.loss, opt, to_optim)",
        "criterion = losses.loss_select(opt.loss, opt, to_optim)",
    )
    assert calls(plain) == [
        'model, loader, optimizer = autoopt.optimize(model, loader, optimizer, device="cuda")'
    ]
    # nor a settings object a helper hands back, read for the learning rate (open-unmix's
    # `args, ... = data.load_datasets(parser, args)`, then `Adam(unmix.parameters(),
    # lr=args.lr)`)
    settings = script.replace(
        'to_optim = [{"params": model.parameters(), "lr": 1e-5}]\n'
        "        criterion, to_optim = losses.loss_select(opt.loss, opt, to_optim)\n"
        "        optimizer = torch.optim.Adam(to_optim)",
        "args = losses.setup(args)\n"
        "        criterion = losses.Loss()\n"
        "        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)",
    )
    assert "losses.setup(args)" in settings
    assert calls(settings) == [
        'model, loader, optimizer = autoopt.optimize(model, loader, optimizer, device="cuda")'
    ]
