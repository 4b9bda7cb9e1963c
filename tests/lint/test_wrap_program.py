"""--wrap follows the program across modules as the lint's program model does: a class a
package re-exports, an instance called like a function, a method a base class leaves to its
subclasses, a class chosen by a flag, a factory that returns the trainer, a bound method
handed to a call, and a DataParallel wrap made before the model is handed on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from autoopt.lint.wrap.insert import wrap_source

LOADER = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

def make_loader():
    return DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8)
"""


def project(tmp_path: Path, files: dict[str, str]) -> Path:
    """Write the project's files; the path of the script (the first file)."""
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path / next(iter(files))


def wrap(script: Path):
    return wrap_source(script.read_text(), path=script)


def test_a_class_re_exported_by_a_package_and_called_like_a_function(tmp_path: Path) -> None:
    """disentangling-vae: `from disvae import Trainer`, whose `__init__.py` imports it from
    disvae/training.py; `trainer(train_loader)` runs its `__call__`, where the loop is."""
    script = project(
        tmp_path,
        {
            "main.py": """\
                import torch
                from data import make_loader
                from disvae import Trainer

                def main():
                    model = torch.nn.Linear(8, 1)
                    optimizer = torch.optim.Adam(model.parameters())
                    train_loader = make_loader()
                    trainer = Trainer(model, optimizer)
                    trainer(train_loader, epochs=2)
                """,
            "data.py": LOADER,
            "disvae/__init__.py": "from disvae.training import Trainer\n",
            "disvae/training.py": """\
                import torch

                class Trainer:
                    def __init__(self, model, optimizer):
                        self.model = model
                        self.optimizer = optimizer

                    def __call__(self, data_loader, epochs=1):
                        for _ in range(epochs):
                            for x, y in data_loader:
                                self.optimizer.zero_grad()
                                torch.nn.functional.mse_loss(self.model(x), y).backward()
                                self.optimizer.step()
                """,
        },
    )
    result = wrap(script)
    assert not result.declined, result.message
    assert result.inserted == (
        "model, train_loader, optimizer = autoopt.optimize(model, train_loader, optimizer, "
        'device="cpu")',
    )


def test_a_method_left_to_subclasses_and_an_optimizer_the_base_creates(tmp_path: Path) -> None:
    """S3Rec: `Trainer.train` calls `self.iteration(...)`, which only `FinetuneTrainer`
    implements; the optimizer is `Trainer.__init__`'s. The decline names where it is."""
    script = project(
        tmp_path,
        {
            "run.py": """\
                import torch
                from data import make_loader
                from trainers import FinetuneTrainer

                model = torch.nn.Linear(8, 1)
                trainer = FinetuneTrainer(model, make_loader())
                for epoch in range(2):
                    trainer.train(epoch)
                """,
            "data.py": LOADER,
            "trainers.py": """\
                import torch

                class Trainer:
                    def __init__(self, model, loader):
                        self.model = model
                        self.loader = loader
                        self.optim = torch.optim.Adam(self.model.parameters())

                    def train(self, epoch):
                        self.iteration(epoch, self.loader)

                    def iteration(self, epoch, loader):
                        raise NotImplementedError

                class FinetuneTrainer(Trainer):
                    def iteration(self, epoch, loader):
                        for x, y in loader:
                            self.optim.zero_grad()
                            torch.nn.functional.mse_loss(self.model(x), y).backward()
                            self.optim.step()
                """,
        },
    )
    result = wrap(script)
    assert result.declined and result.reason == "optimizer created in another module"
    assert "Trainer.__init__() of" in result.message and "trainers.py" in result.message
    # the loop is reached (through the override), not only the class's constructor
    assert "no .backward() is reached" not in result.message


def test_a_class_chosen_by_a_flag_and_one_a_factory_returns(tmp_path: Path) -> None:
    """iTransformer's `Exp = A` or `Exp = B`, then `exp = Exp(args)`; pytorch-3dunet's
    `trainer = create_trainer(config)`: the decline names where each optimizer is created."""
    experiments = """\
        import torch

        class Exp{name}:
            def __init__(self, args):
                self.model = torch.nn.Linear(8, 1)

            def train(self, loader):
                optim = torch.optim.Adam(self.model.parameters())
                for x, y in loader:
                    optim.zero_grad()
                    torch.nn.functional.mse_loss(self.model(x), y).backward()
                    optim.step()
        """
    script = project(
        tmp_path,
        {
            "run.py": """\
                import sys
                from data import make_loader
                from exp_a import ExpA
                from exp_b import ExpB

                if sys.argv[1:] == ["b"]:
                    Exp = ExpB
                else:
                    Exp = ExpA
                exp = Exp(sys.argv)
                exp.train(make_loader())
                """,
            "data.py": LOADER,
            "exp_a.py": experiments.format(name="A"),
            "exp_b.py": experiments.format(name="B"),
        },
    )
    result = wrap(script)
    assert result.declined and result.reason == "optimizer created in another module"
    assert "ExpA.train() of" in result.message and "ExpB.train() of" in result.message

    script = project(
        tmp_path,
        {
            "train3d.py": """\
                from trainer import create_trainer

                trainer = create_trainer({"lr": 0.1})
                trainer.fit()
                """,
            "trainer.py": """\
                import torch
                from data import make_loader

                def create_trainer(config):
                    model = torch.nn.Linear(8, 1)
                    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
                    return UNetTrainer(model, optimizer, make_loader())

                class UNetTrainer:
                    def __init__(self, model, optimizer, loader):
                        self.model, self.optimizer, self.loader = model, optimizer, loader

                    def fit(self):
                        for x, y in self.loader:
                            self.optimizer.zero_grad()
                            torch.nn.functional.mse_loss(self.model(x), y).backward()
                            self.optimizer.step()
                """,
        },
    )
    result = wrap(script)
    assert result.declined and result.reason == "optimizer created in another module"
    assert "create_trainer() of" in result.message


def test_a_bound_method_handed_to_a_call_and_an_optimizer_a_member_holds(tmp_path: Path) -> None:
    """lightweight-gan: `retry_call(model.train, tries=3)` runs the Trainer's `train`, which
    steps `self.GAN.G_opt`, created by the `LightweightGAN` the Trainer builds."""
    script = project(
        tmp_path,
        {
            "cli.py": """\
                from retry.api import retry_call
                from gan import Trainer

                def run_training():
                    model = Trainer()
                    for _ in range(10):
                        retry_call(model.train, tries=3)
                """,
            "gan.py": """\
                import torch

                class LightweightGAN(torch.nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.G = torch.nn.Linear(8, 8)
                        self.G_opt = torch.optim.Adam(self.G.parameters())

                class Trainer:
                    def __init__(self):
                        self.GAN = LightweightGAN()

                    def train(self):
                        self.GAN.G_opt.zero_grad()
                        self.GAN.G(torch.randn(4, 8)).sum().backward()
                        self.GAN.G_opt.step()
                """,
        },
    )
    result = wrap(script)
    assert result.declined and result.reason == "optimizer created in another module"
    assert "LightweightGAN.__init__() of" in result.message


def test_a_dataparallel_wrap_before_the_model_is_handed_to_another_module(tmp_path: Path) -> None:
    """bottom-up-attention-vqa: `model = nn.DataParallel(model).cuda()`, then `train(model,
    ...)` of train.py builds the optimizer: no file holds the bare model where it is created."""
    script = project(
        tmp_path,
        {
            "main.py": """\
                import torch
                from data import make_loader
                from train import train

                if __name__ == "__main__":
                    model = torch.nn.Linear(8, 1)
                    model = torch.nn.DataParallel(model)
                    train(model, make_loader(), 2)
                """,
            "data.py": LOADER,
            "train.py": """\
                import torch

                def train(model, loader, epochs):
                    optim = torch.optim.Adamax(model.parameters())
                    for _ in range(epochs):
                        for x, y in loader:
                            torch.nn.functional.mse_loss(model(x), y).backward()
                            optim.step()
                            optim.zero_grad()
                """,
        },
    )
    result = wrap(script)
    assert result.declined and result.reason == "model wrapped in DDP/FSDP before the optimizer"
    assert "`model = torch.nn.DataParallel(model)`" in result.message


IJEPA = """\
    import copy
    import torch
    from data import make_loader
    from helper import init_model, init_opt, load_checkpoint

    def main(model_name="vit_small"):
        encoder, predictor = init_model(model_name=model_name)
        target_encoder = copy.deepcopy(encoder)
        loader = make_loader()
        optimizer = init_opt(encoder=encoder, predictor=predictor, lr=1e-3)
        encoder, predictor, target_encoder, optimizer = load_checkpoint(
            encoder=encoder, predictor=predictor, target_encoder=target_encoder, opt=optimizer
        )
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(predictor(encoder(x)), y).backward()
            optimizer.step()
    """

IJEPA_HELPER = """\
    import torch

    def init_model(model_name):
        return torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)

    def init_opt(encoder, predictor, lr):
        groups = [
            {"params": [p for n, p in encoder.named_parameters() if "bias" not in n]},
            {"params": [p for n, p in predictor.named_parameters()]},
        ]
        return torch.optim.AdamW(groups, lr=lr)

    def load_checkpoint(encoder, predictor, target_encoder, opt):
        return encoder, predictor, target_encoder, opt
    """


def test_the_models_an_optimizer_factory_reads_and_only_bindings_before_it(
    tmp_path: Path,
) -> None:
    """ijepa: `init_opt(encoder=encoder, predictor=predictor)` builds one optimizer over both
    (each gets a call without it); `model_name` names a model and is none; what
    `load_checkpoint(...)` rebinds after the optimizer says nothing about what it trains."""
    script = project(tmp_path, {"train.py": IJEPA, "data.py": LOADER, "helper.py": IJEPA_HELPER})
    result = wrap(script)
    assert not result.declined, result.message
    calls = [line.split(" = ", 1)[1] for line in result.inserted]
    assert [c.split("(", 2)[1].split(",")[0].rstrip(")") for c in calls] == [
        "encoder",
        "predictor",
    ]
    assert all('amp="script"' in c for c in calls)


def test_torchmeta_meta_learning_is_declined_and_a_model_held_by_a_plain_object(
    tmp_path: Path,
) -> None:
    """pytorch-maml: a torchmeta MetaModule trained through differentiable inner steps on
    BatchMetaDataLoader's tasks is declined as meta-learning; without torchmeta, the optimizer
    over `benchmark.model.parameters()` is never paired with `benchmark` (a namedtuple)."""
    maml = """\
        import torch
        from torchmeta.utils.data import BatchMetaDataLoader
        from data import make_loader
        from bench import get_benchmark

        benchmark = get_benchmark()
        loader = make_loader()
        meta_optimizer = torch.optim.Adam(benchmark.model.parameters(), lr=1e-3)
        for x, y in loader:
            meta_optimizer.zero_grad()
            torch.nn.functional.mse_loss(benchmark.model(x), y).backward()
            meta_optimizer.step()
        """
    bench = """\
        import collections
        import torch

        Benchmark = collections.namedtuple("Benchmark", "model loss")

        def get_benchmark():
            return Benchmark(torch.nn.Linear(8, 1), None)
        """
    script = project(tmp_path, {"train.py": maml, "data.py": LOADER, "bench.py": bench})
    result = wrap(script)
    assert result.declined and result.reason == "meta-learning wrapper"
    assert "torchmeta" in result.message

    script.write_text(
        textwrap.dedent(maml).replace("from torchmeta.utils.data import BatchMetaDataLoader\n", "")
    )
    result = wrap(script)
    assert result.declined and result.reason == "cannot tell the model", result.inserted


def test_a_package_class_by_attribute_and_an_optimizer_wrapper_stepped_as_step(
    tmp_path: Path,
) -> None:
    """GRU4REC: `trainer = lib.Trainer(model, optim=optimizer)` of the package `lib`, whose
    loop steps `self.optim.step()`, a `lib.Optimizer` that holds the torch optimizer and steps
    it in its own `step()`: declined as a wrapper class (optimize() needs the optimizer)."""
    script = project(
        tmp_path,
        {
            "main.py": """\
                import torch
                import lib

                model = torch.nn.Linear(8, 1)
                optimizer = lib.Optimizer(model.parameters(), lr=0.1)
                trainer = lib.Trainer(model, optim=optimizer)
                trainer.train(0, 3)
                """,
            "lib/__init__.py": "from .optimizer import Optimizer\nfrom .trainer import Trainer\n",
            "lib/optimizer.py": """\
                import torch

                class Optimizer:
                    def __init__(self, params, lr):
                        self.optimizer = torch.optim.Adam(params, lr=lr)

                    def zero_grad(self):
                        self.optimizer.zero_grad()

                    def step(self):
                        self.optimizer.step()
                """,
            "lib/trainer.py": """\
                import torch

                class Trainer:
                    def __init__(self, model, optim):
                        self.model, self.optim = model, optim

                    def train(self, start, end):
                        for epoch in range(start, end):
                            self.optim.zero_grad()
                            self.model(torch.randn(4, 8)).sum().backward()
                            self.optim.step()
                """,
        },
    )
    result = wrap(script)
    assert result.declined and result.reason == "optimizer wrapped in a class", result.message
    assert "lib.Optimizer, a wrapper class" in result.message


def test_optimizers_a_trainer_of_another_module_holds_in_a_collection(tmp_path: Path) -> None:
    """XLM: the Trainer of xlm/trainer.py builds its optimizers in a dict and steps them
    with `for optimizer in optimizers`: the decline names that class, not the collection."""
    script = project(
        tmp_path,
        {
            "train.py": """\
                import torch
                from trainer import Trainer

                model = torch.nn.Linear(8, 1)
                trainer = Trainer(model)
                for step in range(10):
                    trainer.step(model(torch.randn(4, 8)).sum())
                """,
            "trainer.py": """\
                import torch

                class Trainer:
                    def __init__(self, model):
                        self.optimizers = {"model": torch.optim.Adam(model.parameters())}

                    def step(self, loss):
                        optimizers = [self.optimizers[k] for k in self.optimizers]
                        for optimizer in optimizers:
                            optimizer.zero_grad()
                        loss.backward()
                        for optimizer in optimizers:
                            optimizer.step()
                """,
        },
    )
    result = wrap(script)
    assert result.declined and result.reason == "optimizer created in another module"
    assert "Trainer.step() of" in result.message and "trainer.py" in result.message


def test_a_batcher_of_another_library_is_no_loader(tmp_path: Path) -> None:
    """ConvE: batches from spodernet's `StreamBatcher`, no torch DataLoader: the call binds
    the model and the optimizer only (as for torchtext's iterators)."""
    script = project(
        tmp_path,
        {
            "main.py": """\
                import torch
                from spodernet.preprocessing.batching import StreamBatcher

                model = torch.nn.Linear(8, 1)
                opt = torch.optim.Adam(model.parameters())
                train_batcher = StreamBatcher("FB15k", "train", 128)
                for epoch in range(3):
                    for i, batch in enumerate(train_batcher):
                        opt.zero_grad()
                        model(batch).sum().backward()
                        opt.step()
                """
        },
    )
    result = wrap(script)
    assert result.inserted == ('model, opt = autoopt.optimize(model, optimizer=opt, device="cpu")',)


def test_an_agent_bound_in_branches_to_classes_of_two_modules(tmp_path: Path) -> None:
    """TD3: `policy = TD3.TD3(...)` or `policy = OurDDPG.DDPG(...)` by a flag, then
    `policy.train(...)`: both classes are followed, and the decline names both files."""
    agent = """\
        import torch

        class {name}:
            def __init__(self):
                self.actor = torch.nn.Linear(4, 2)
                self.actor_optimizer = torch.optim.Adam(self.actor.parameters())

            def train(self, batch):
                self.actor_optimizer.zero_grad()
                self.actor(batch).sum().backward()
                self.actor_optimizer.step()
        """
    script = project(
        tmp_path,
        {
            "main.py": """\
                import sys
                import torch
                import TD3
                import OurDDPG

                if sys.argv[1:] == ["ddpg"]:
                    policy = OurDDPG.DDPG()
                else:
                    policy = TD3.TD3()
                for t in range(100):
                    policy.train(torch.randn(8, 4))
                """,
            "TD3.py": agent.format(name="TD3"),
            "OurDDPG.py": agent.format(name="DDPG"),
        },
    )
    result = wrap(script)
    assert result.declined and result.reason == "optimizer created in another module"
    assert "TD3.__init__() of" in result.message and "DDPG.__init__() of" in result.message


def test_a_module_level_loader_and_the_optimizer_under_the_main_guard(tmp_path: Path) -> None:
    """FloWaveNet: `train_loader = DataLoader(...)` at the module's top, read by `train()`;
    the model and optimizer built under `if __name__ == "__main__":` after a data-dependent
    init reads one batch: the call goes after the optimizer, with the loader."""
    script = project(
        tmp_path,
        {
            "train.py": """\
                import torch
                from torch.utils.data import DataLoader, TensorDataset

                train_loader = DataLoader(TensorDataset(torch.randn(16, 8)), batch_size=4)

                def train(model, optimizer):
                    for (x,) in train_loader:
                        optimizer.zero_grad()
                        model(x).sum().backward()
                        optimizer.step()

                if __name__ == "__main__":
                    model = torch.nn.Linear(8, 1)
                    (x_seed,) = next(iter(train_loader))
                    with torch.no_grad():
                        model(x_seed)
                    optimizer = torch.optim.Adam(model.parameters())
                    for epoch in range(2):
                        train(model, optimizer)
                """
        },
    )
    result = wrap(script)
    assert result.inserted == (
        "model, train_loader, optimizer = autoopt.optimize(model, train_loader, optimizer, "
        'device="cpu")',
    ), result.message


def test_a_function_picked_from_a_dispatch_table(tmp_path: Path) -> None:
    """TransUNet: `trainer = {'Synapse': trainer_synapse}` then `trainer[name](args, net)`;
    the optimizer and the loop are trainer_synapse's, in trainer.py."""
    script = project(
        tmp_path,
        {
            "train.py": """\
                import torch
                from trainer import trainer_synapse

                net = torch.nn.Linear(8, 1)
                trainer = {'Synapse': trainer_synapse,}
                trainer[dataset_name](args, net, "out")
                """,
            "data.py": LOADER,
            "trainer.py": """\
                import torch
                from data import make_loader

                def trainer_synapse(args, model, snapshot_path):
                    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
                    for x, y in make_loader():
                        optimizer.zero_grad()
                        torch.nn.functional.mse_loss(model(x), y).backward()
                        optimizer.step()
                """,
        },
    )
    result = wrap(script)
    assert result.declined and result.reason == "optimizer created in another module"
    assert "trainer_synapse() of" in result.message and "trainer.py" in result.message


def test_a_helper_object_that_wraps_its_own_modules_is_not_the_model(tmp_path: Path) -> None:
    """EDSR: `_loss = loss.Loss(args)` wraps its own loss modules in DataParallel and is handed
    to `Trainer(args, _model, _loss)`, whose optimizer is built over `my_model` (and `args`,
    by `utility.make_optimizer(args, self.model)`), not `my_loss`: the
    decline names where the optimizer is, not a DataParallel wrap of the model."""
    script = project(
        tmp_path,
        {
            "main.py": """\
                import torch
                from loss import Loss
                from trainer import Trainer

                def main():
                    _model = torch.nn.Linear(8, 1)
                    _loss = Loss(args) if not args.test_only else None
                    t = Trainer(args, _model, _loss)
                    t.train()
                """,
            "loss.py": """\
                import torch

                class Loss(torch.nn.Module):
                    def __init__(self, args):
                        super().__init__()
                        self.loss_module = torch.nn.DataParallel(torch.nn.L1Loss())

                    def forward(self, a, b):
                        return self.loss_module(a, b)
                """,
            "data.py": LOADER,
            "utility.py": """\
                import torch

                def make_optimizer(args, target):
                    return torch.optim.Adam(target.parameters(), lr=args.lr)
                """,
            "trainer.py": """\
                import utility
                from data import make_loader

                class Trainer:
                    def __init__(self, args, my_model, my_loss):
                        self.model = my_model
                        self.loss = my_loss
                        self.optimizer = utility.make_optimizer(args, self.model)

                    def train(self):
                        for x, y in make_loader():
                            self.optimizer.zero_grad()
                            self.loss(self.model(x), y).backward()
                            self.optimizer.step()
                """,
        },
    )
    result = wrap(script)
    assert result.declined and result.reason == "optimizer created in another module"
    assert "Trainer.__init__() of" in result.message, result.message


def test_a_step_function_a_factory_returns(tmp_path: Path) -> None:
    """score_sde: `train_step_fn = losses.get_step_fn(model, optimizer)` returns its nested
    `step_fn` (forward, backward, optimizer step), which the loop calls on every batch: the
    loop's backward is reached through it."""
    script = project(
        tmp_path,
        {
            "train.py": """\
                import torch
                import losses
                from data import make_loader

                def main():
                    model = torch.nn.Linear(8, 1)
                    optimizer = torch.optim.Adam(model.parameters())
                    train_step_fn = losses.get_step_fn(model, optimizer)
                    for x, y in make_loader():
                        train_step_fn(x, y)
                """,
            "data.py": LOADER,
            "losses.py": """\
                import torch

                def get_step_fn(model, optimizer):
                    def step_fn(x, y):
                        optimizer.zero_grad()
                        loss = torch.nn.functional.mse_loss(model(x), y)
                        loss.backward()
                        optimizer.step()
                        return loss
                    return step_fn
                """,
        },
    )
    result = wrap(script)
    assert not result.declined, result.message
    assert result.inserted[-1].startswith("model, optimizer = autoopt.optimize(model, ")


def test_a_factory_that_imports_its_class_in_each_branch(tmp_path: Path) -> None:
    """KAIR: `define_Model(opt)` does `from models.model_plain import ModelPlain as M` in one
    branch and `from models.model_gan import ModelGAN as M` in another, then `return M(opt)`;
    the loop calls `model.optimize_parameters()`, whose optimizers those classes create."""
    model_class = """\
        import torch

        class {name}:
            def __init__(self, opt):
                self.net = torch.nn.Linear(8, 1)
                self.optimizer = torch.optim.Adam(self.net.parameters())

            def feed_data(self, data):
                self.x, self.y = data

            def optimize_parameters(self):
                self.optimizer.zero_grad()
                torch.nn.functional.mse_loss(self.net(self.x), self.y).backward()
                self.optimizer.step()
        """
    script = project(
        tmp_path,
        {
            "main.py": """\
                from models.select_model import define_Model
                from data import make_loader

                def main(opt):
                    model = define_Model(opt)
                    for data in make_loader():
                        model.feed_data(data)
                        model.optimize_parameters()
                """,
            "data.py": LOADER,
            "models/__init__.py": "",
            "models/select_model.py": """\
                def define_Model(opt):
                    if opt["model"] == "plain":
                        from models.model_plain import ModelPlain as M
                    else:
                        from models.model_gan import ModelGAN as M
                    m = M(opt)
                    return m
                """,
            "models/model_plain.py": model_class.format(name="ModelPlain"),
            "models/model_gan.py": model_class.format(name="ModelGAN"),
        },
    )
    result = wrap(script)
    assert result.declined and result.reason == "optimizer created in another module"
    assert "ModelPlain.__init__() of" in result.message, result.message
    assert "ModelGAN.__init__() of" in result.message, result.message


def test_an_optimizer_handed_in_and_rebuilt_inside_the_loop(tmp_path: Path) -> None:
    """pysot: `train(loader, model, optimizer)` rebuilds `optimizer = build_opt(model.module,
    epoch)` inside its loop once the backbone is unfrozen; the decline says so (before any
    question of which model feeds it)."""
    script = project(
        tmp_path,
        {
            "train.py": """\
                import torch
                from data import make_loader

                def build_opt(model, epoch=0):
                    params = [p for p in model.parameters() if p.requires_grad]
                    return torch.optim.SGD(params, lr=0.01)

                def train(loader, model, optimizer):
                    for idx, (x, y) in enumerate(loader):
                        if idx == 10:
                            optimizer = build_opt(model.module, idx)
                        optimizer.zero_grad()
                        torch.nn.functional.mse_loss(model(x), y).backward()
                        optimizer.step()

                def main():
                    model = torch.nn.Linear(8, 1)
                    optimizer = build_opt(model)
                    train(make_loader(), model, optimizer)
                """,
            "data.py": LOADER,
        },
    )
    result = wrap(script)
    assert result.declined and result.reason == "optimizer created inside the loop", result.message


def test_a_training_function_picked_by_a_flag_into_a_local_name(tmp_path: Path) -> None:
    """vnet: `if nll: train = train_nll` / `else: train = train_dice`, then `train(args, model,
    loader, optimizer)`: the optimizer is followed to its creation, after the DataParallel."""
    script = project(
        tmp_path,
        {
            "train.py": """\
                import torch
                from data import make_loader

                def train_nll(model, loader, optimizer):
                    for x, y in loader:
                        torch.nn.functional.mse_loss(model(x), y).backward()
                        optimizer.step()

                def train_dice(model, loader, optimizer):
                    for x, y in loader:
                        torch.nn.functional.l1_loss(model(x), y).backward()
                        optimizer.step()

                def main(nll=False):
                    model = torch.nn.Linear(8, 1)
                    model = torch.nn.parallel.DataParallel(model)
                    if nll:
                        train = train_nll
                    else:
                        train = train_dice
                    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                    for epoch in range(2):
                        train(model, make_loader(), optimizer)
                """,
            "data.py": LOADER,
        },
    )
    result = wrap(script)
    assert result.declined and result.reason == "model wrapped in DDP/FSDP before the optimizer"


def test_a_decline_sending_to_the_trainers_file_says_why_it_would_decline_there(
    tmp_path: Path,
) -> None:
    """Swin-Unet: the optimizer is created in trainer.py, which wraps the model in
    DataParallel first: one run says both."""
    script = project(
        tmp_path,
        {
            "main.py": """\
                import torch
                from trainer import trainer_synapse

                if __name__ == "__main__":
                    net = torch.nn.Linear(8, 1)
                    trainer_synapse(net)
                """,
            "data.py": LOADER,
            "trainer.py": """\
                import torch
                from data import make_loader

                def trainer_synapse(model):
                    model = torch.nn.DataParallel(model)
                    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
                    for x, y in make_loader():
                        torch.nn.functional.mse_loss(model(x), y).backward()
                        optimizer.step()
                """,
        },
    )
    result = wrap(script)
    assert result.declined and result.reason == "optimizer created in another module"
    assert "trainer_synapse() of" in result.message
    assert "there, `model = torch.nn.DataParallel(model)`" in result.message
    assert (
        "in " + str(tmp_path / "trainer.py") in result.message or "in trainer.py" in result.message
    )


def test_a_decline_sending_to_several_files_says_why_the_first_would_decline(
    tmp_path: Path,
) -> None:
    """Point-MAE: `run_net()` of the pretraining runner or of the fine-tuning runner, chosen
    by a flag, creates the optimizer after wrapping the model in DataParallel: the decline
    names both files and says, naming it, why --wrap would decline in the first."""
    runner = """\
        import torch
        from data import make_loader

        def run_net(args):
            model = torch.nn.DataParallel(torch.nn.Linear(8, 1).cuda())
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            for x, y in make_loader():
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
        """
    script = project(
        tmp_path,
        {
            "main.py": """\
                import torch
                from runner_pretrain import run_net as pretrain
                from runner_finetune import run_net as finetune

                if __name__ == "__main__":
                    if args.finetune:
                        finetune(args)
                    else:
                        pretrain(args)
                """,
            "data.py": LOADER,
            "runner_pretrain.py": runner,
            "runner_finetune.py": runner,
        },
    )
    result = wrap(script)
    assert result.declined and result.reason == "optimizer created in another module"
    assert "runner_pretrain.py" in result.message and "runner_finetune.py" in result.message
    assert "py, `model = torch.nn.DataParallel(" in result.message, result.message


def test_a_decline_sending_to_several_files_is_the_same_under_every_hash_seed(
    tmp_path: Path,
) -> None:
    """pytorch-a2c-ppo-acktr-gail: the optimizers are created in three modules; the file whose
    own --wrap outcome the decline tells was the first of a set of paths, so its second
    sentence changed with PYTHONHASHSEED. It is the first creation in the program's order."""
    plain = RUNNER_MAKING_OPTIMIZER.format(model="torch.nn.Linear(8, 1)")
    parallel = RUNNER_MAKING_OPTIMIZER.format(model="torch.nn.DataParallel(torch.nn.Linear(8, 1))")
    script = project(
        tmp_path,
        {
            "main.py": """\
                from runner_a import run_net as first
                from runner_b import run_net as second

                if __name__ == "__main__":
                    first()
                    second()
                """,
            "data.py": LOADER,
            "runner_a.py": parallel,
            "runner_b.py": plain,
        },
    )
    code = "import sys; from autoopt.lint.wrap.insert import wrap_source as w; from pathlib import Path; "
    code += "p = Path(sys.argv[1]); print(w(p.read_text(), path=p).message)"
    messages = {
        subprocess.run(
            [sys.executable, "-c", code, str(script)],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in range(6)
    }
    assert len(messages) == 1, messages
    message = messages.pop()
    assert "in " + str(tmp_path / "runner_a.py") + ", `model = torch.nn.DataParallel(" in message


RUNNER_MAKING_OPTIMIZER = """\
    import torch
    from data import make_loader

    def run_net():
        model = {model}
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in make_loader():
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    """


POINTER_MODEL = """\
    import torch


    class Model({base}):
        def __init__(self):
            {init}self.encoder = torch.nn.Linear(8, 4)
            self.decoder = torch.nn.Linear(4, 1)

        def __call__(self, x):
            return self.decoder(self.encoder(x))
    """

POINTER_TRAIN = """\
    import torch
    from data import make_loader
    from model import Model


    class Train:
        def setup_train(self):
            self.model = Model()
            params = list(self.model.encoder.parameters()) + list(self.model.decoder.parameters())
            self.optimizer = torch.optim.Adagrad(params, lr=0.15)

        def train_iters(self):
            self.setup_train()
            for x, y in make_loader():
                self.optimizer.zero_grad()
                torch.nn.functional.mse_loss(self.model(x), y).backward()
                self.optimizer.step()


    if __name__ == "__main__":
        Train().train_iters()
    """


def test_the_modules_a_plain_object_holds_get_a_call_each(tmp_path: Path) -> None:
    """pointer_summarizer: `class Model(object)` holds encoder and decoder, and one Adagrad
    is built over both: optimize() takes modules, so each part gets its call (one optimizer
    over several models: amp="script"); a holder that is an nn.Module is the model."""
    plain = POINTER_MODEL.replace("{base}", "object").replace("{init}", "")
    script = project(tmp_path, {"train.py": POINTER_TRAIN, "data.py": LOADER, "model.py": plain})
    calls = [line.split(" = ", 1)[1].split("  #")[0] for line in wrap(script).inserted]
    assert [c.split(",")[0] for c in calls] == [
        "autoopt.optimize(self.model.decoder",
        "autoopt.optimize(self.model.encoder",
    ]
    assert all('amp="script"' in c and "optimizer=" not in c for c in calls)
    module = POINTER_MODEL.replace("{base}", "torch.nn.Module").replace(
        "{init}", "super().__init__()\n        "
    )
    (tmp_path / "model.py").write_text(textwrap.dedent(module))
    calls = [line.split(" = ", 1)[1] for line in wrap(script).inserted]
    assert [c.split(",")[0] for c in calls] == ["autoopt.optimize(self.model"]


def test_a_star_re_export_and_a_base_constructor_called_through_super(tmp_path: Path) -> None:
    """crnn-audio-classification: `from train import Trainer` where train/__init__.py says
    `from train.trainer import *`; `Trainer.__init__` hands the optimizer to
    `super(Trainer, self).__init__(...)`, which keeps it as `self.optimizer`, and the base's
    `train()` runs the subclass's `_train_epoch`. Was "no .backward() is reached"."""
    script = project(
        tmp_path,
        {
            "run.py": """\
                import torch
                from data import make_loader
                from train import Trainer

                def main():
                    model = torch.nn.Linear(8, 1)
                    optimizer = torch.optim.Adam(model.parameters())
                    loader = make_loader()
                    trainer = Trainer(model, optimizer, data_loader=loader)
                    trainer.train()
                """,
            "data.py": LOADER,
            "train/__init__.py": "from train.trainer import *\n",
            "train/base_trainer.py": """\
                class BaseTrainer:
                    def __init__(self, model, optimizer):
                        self.model = model
                        self.optimizer = optimizer

                    def train(self):
                        for epoch in range(3):
                            self._train_epoch(epoch)
                """,
            "train/trainer.py": """\
                import torch
                from .base_trainer import BaseTrainer

                class Trainer(BaseTrainer):
                    def __init__(self, model, optimizer, data_loader):
                        super(Trainer, self).__init__(model, optimizer)
                        self.data_loader = data_loader

                    def _train_epoch(self, epoch):
                        for x, y in self.data_loader:
                            self.optimizer.zero_grad()
                            torch.nn.functional.mse_loss(self.model(x), y).backward()
                            self.optimizer.step()
                """,
        },
    )
    result = wrap(script)
    assert not result.declined, result.message
    assert result.inserted == (
        'model, loader, optimizer = autoopt.optimize(model, loader, optimizer, device="cpu")',
    )


def test_an_optimizer_an_object_of_a_local_class_holds(tmp_path: Path) -> None:
    """generative-inpainting: `trainer = Trainer(config)`, `trainer_module = trainer.module`
    (or `trainer`), and the loop steps `trainer_module.optimizer_d`: the optimizers are
    created in `Trainer.__init__` of trainer.py. Was "no optimizer is stepped"."""
    script = project(
        tmp_path,
        {
            "train.py": """\
                import torch
                from data import make_loader
                from trainer import Trainer

                def main():
                    trainer = Trainer(config)
                    trainer = torch.nn.parallel.DataParallel(trainer, device_ids=[0, 1])
                    trainer_module = trainer.module
                    for x, y in make_loader():
                        loss = trainer(x, y)
                        trainer_module.optimizer_d.zero_grad()
                        loss.backward()
                        trainer_module.optimizer_d.step()
                """,
            "data.py": LOADER,
            "trainer.py": """\
                import torch

                class Trainer(torch.nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        self.netD = torch.nn.Linear(8, 1)
                        self.optimizer_d = torch.optim.Adam(self.netD.parameters())

                    def forward(self, x, y):
                        return torch.nn.functional.mse_loss(self.netD(x), y)
                """,
        },
    )
    result = wrap(script)
    assert result.declined
    assert "the optimizer is created in Trainer.__init__() of " in result.message
    assert "trainer.py, which this script runs" in result.message


def test_a_loop_in_a_package_at_the_root_stepping_what_it_cannot_name_is_pointed_at(
    tmp_path: Path,
) -> None:
    """prototypical-networks: scripts/train/few_shot/run_train.py runs `main()` of its sibling
    train.py, which hands `getattr(optim, name)` (the class, uncalled) to `Engine.train` of
    the root's protonets/engine.py (a package its setup.py installs), where the optimizer is
    built and stepped through a dict (`state["optimizer"].step()`). The decline named main()
    as where the optimizer was created; the package, three folders up, was not read."""
    script = project(
        tmp_path,
        {
            "scripts/train/few_shot/run_train.py": """\
                from train import main

                main({"optim": "Adam"})
                """,
            "scripts/train/few_shot/train.py": """\
                import torch
                import torch.optim as optim
                from protonets.engine import Engine

                def main(opt):
                    model = torch.nn.Linear(8, 1)
                    engine = Engine()
                    engine.train(model=model, optim_method=getattr(optim, opt["optim"]))
                """,
            "protonets/__init__.py": "",
            "protonets/engine.py": """\
                class Engine:
                    def train(self, **kwargs):
                        state = {"model": kwargs["model"]}
                        state["optimizer"] = kwargs["optim_method"](state["model"].parameters())
                        for x in range(10):
                            state["optimizer"].zero_grad()
                            state["model"](x).sum().backward()
                            state["optimizer"].step()
                """,
            "setup.py": "",
        },
    )
    result = wrap(script)
    assert result.declined, result.message
    assert "(Engine.train() of protonets/engine.py)" in result.message.replace(
        str(tmp_path) + "/", ""
    ), result.message
    assert "main()" not in result.message
