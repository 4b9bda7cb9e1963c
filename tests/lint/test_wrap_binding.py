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
        "amp=False, distributed=False)  # autoopt: amp=False (own autocast/GradScaler), "
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
        'seq, optimizer = autoopt.optimize(seq, optimizer=optimizer, device="cpu", amp=False)'
        "  # autoopt: amp=False (the optimizer steps through a closure: loss scaling cannot "
        "check it first)"
    ]
