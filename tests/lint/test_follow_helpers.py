"""The program a driver runs reaches the helpers it hands its model to: an evaluation function
of another module (checked for AO403 only), a model class that holds its own training loop, a
trainer class that reads its caller's device, parameter groups a helper makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from .fixtures import keep_cwd
from .test_follow_training import _lint, _project

pytestmark = pytest.mark.usefixtures(keep_cwd.__name__)


def _lint_rules(script: str, codes: str) -> tuple[list[tuple[str, str]], str]:
    """The findings of the rules `codes` (comma-separated) on `script`, and what it said."""
    found, said = _lint(script, "--select", codes)
    return [f for f in found if f[1] in codes.split(",")], said


# federated-learning's models/test.py: the model in eval mode, forwards with autograd on.
EVALUATE = """
import torch
from torch.utils.data import DataLoader

def test_img(net_g, datatest, args):
    net_g.eval()
    total = 0
    for data, target in DataLoader(datatest, batch_size=args.bs):
        data, target = data.cuda(), target.cuda()
        total += torch.nn.functional.cross_entropy(net_g(data), target).item()
    return total
"""

# ... and its models/Update.py: the loop on the device the driver put in `args`.
UPDATE = """
import torch
from torch.utils.data import DataLoader

class LocalUpdate:
    def __init__(self, args, dataset):
        self.args = args
        self.ldr_train = DataLoader(dataset, batch_size=args.local_bs, shuffle=True)

    def train(self, net):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        for images, labels in self.ldr_train:
            images, labels = images.to(self.args.device), labels.to(self.args.device)
            net.zero_grad()
            torch.nn.functional.cross_entropy(net(images), labels).backward()
            optimizer.step()
        return net.state_dict()
"""

# a training epoch of another module (Efficient-3DCNNs' train.py)
ENGINE_LOOP = """
import torch

def train_epoch(epoch, data_loader, model, criterion, optimizer):
    model.train()
    for inputs, targets in data_loader:
        loss = criterion(model(inputs.cuda()), targets.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""

FEDERATED = """
import copy
import torch
from models.update import LocalUpdate
from models.test import test_img

args = parse()
args.device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
net_glob = torch.nn.Linear(4, 2).to(args.device)
net_glob.train()
for round in range(10):
    local = LocalUpdate(args, dataset)
    net_glob.load_state_dict(local.train(net=copy.deepcopy(net_glob)))
net_glob.eval()
print(test_img(net_glob, dataset_test, args))
"""


def test_an_evaluation_helper_of_another_module_is_checked_for_ao403_only(
    tmp_path: Path,
) -> None:
    _project(
        tmp_path,
        {"models/update.py": UPDATE, "models/test.py": EVALUATE, "main_fed.py": FEDERATED},
    )
    found, said = _lint_rules("main_fed.py", "AO403,AO103,AO603")
    # AO403 in the evaluation helper; not its .cuda() (AO603) nor its copies (AO103)
    assert ("models/test.py", "AO403") in found
    assert not [f for f in found if f[0] == "models/test.py" and f[1] != "AO403"]
    assert "also checking models/test.py, which evaluates a model main_fed.py trains" in said


def test_an_evaluation_helper_called_under_no_grad_is_not_followed(tmp_path: Path) -> None:
    """melgan: `with torch.no_grad(): validate(hp, args, generator, ...)`: the caller switched
    autograd off, so the helper's loop is not told to."""
    _project(
        tmp_path,
        {
            "models/update.py": UPDATE,
            "models/test.py": EVALUATE,
            "main_fed.py": FEDERATED.replace(
                "print(test_img(net_glob, dataset_test, args))",
                "with torch.no_grad():\n    print(test_img(net_glob, dataset_test, args))",
            ),
        },
    )
    found, said = _lint_rules("main_fed.py", "AO403")
    assert found == [] and "models/test.py" not in said


def test_a_callable_handed_to_a_helper_is_not_a_model_it_evaluates(tmp_path: Path) -> None:
    """cleanrl's dqn.py hands `make_env` (a function it calls) to `evaluate(...)`: the helper
    calls it, but the script never treats it as a module."""
    _project(
        tmp_path,
        {
            "evals.py": """
            import torch

            def evaluate(model_path, make_env, episodes):
                env = make_env()
                model = torch.load(model_path)
                model.eval()
                for _ in range(episodes):
                    model(torch.tensor(env.reset()))
            """,
            "dqn.py": """
            import torch
            from evals import evaluate

            def make_env():
                return Env()

            q_network = torch.nn.Linear(4, 2).cuda()
            optimizer = torch.optim.Adam(q_network.parameters())
            for step in range(100):
                optimizer.zero_grad()
                q_network(torch.randn(8, 4).cuda()).sum().backward()
                optimizer.step()
            evaluate("q.pt", make_env, 10)
            """,
        },
    )
    found, said = _lint_rules("dqn.py", "AO403")
    assert found == [] and "evals.py" not in said


def test_a_training_helper_reading_its_callers_device_gets_the_loader_rules(
    tmp_path: Path,
) -> None:
    """The batches go to `self.args.device`, which the driver sets to CUDA when available:
    the loader should pin its memory and the copies not block."""
    _project(
        tmp_path,
        {"models/update.py": UPDATE, "models/test.py": EVALUATE, "main_fed.py": FEDERATED},
    )
    found, _ = _lint_rules("main_fed.py", "AO102,AO103")
    assert ("models/update.py", "AO102") in found and ("models/update.py", "AO103") in found


TRAINER_CLASS = {
    # InsightFace: the device in a config, the model and its optimizer built in a trainer
    # class, parameter groups from a helper that splits the model's parameters
    "config.py": """
    import torch

    def get_config():
        conf = Config()
        conf.device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        return conf
    """,
    "model.py": """
    from torch.nn import Conv2d, Linear, Module

    class Backbone(Module):
        def __init__(self):
            super().__init__()
            self.conv = Conv2d(3, 8, 3)
            self.fc = Linear(8, 2)

        def forward(self, x):
            return self.fc(self.conv(x).mean((2, 3)))
    """,
    "utils.py": """
    def separate_bn_paras(modules):
        paras_only_bn, paras_wo_bn = [], []
        for layer in modules.modules():
            paras_wo_bn.extend(layer.parameters(recurse=False))
        return paras_only_bn, paras_wo_bn
    """,
    "learner.py": """
    import torch
    from torch import optim
    from model import Backbone
    from utils import separate_bn_paras

    class FaceLearner:
        def __init__(self, conf, loader):
            self.model = Backbone().to(conf.device)
            self.loader = loader
            paras_only_bn, paras_wo_bn = separate_bn_paras(self.model)
            self.optimizer = optim.SGD(
                [{"params": paras_wo_bn, "weight_decay": 5e-4}, {"params": paras_only_bn}],
                lr=0.1,
            )

        def train(self, conf, epochs):
            self.model.train()
            for e in range(epochs):
                for imgs, labels in self.loader:
                    imgs, labels = imgs.to(conf.device), labels.to(conf.device)
                    self.optimizer.zero_grad()
                    loss = torch.nn.functional.cross_entropy(self.model(imgs), labels)
                    loss.backward()
                    self.optimizer.step()
    """,
    "train.py": """
    from config import get_config
    from learner import FaceLearner

    if __name__ == "__main__":
        conf = get_config()
        learner = FaceLearner(conf, make_loader(conf))
        learner.train(conf, 20)
    """,
}


def test_a_model_trained_through_a_helpers_parameter_groups_is_compiled(tmp_path: Path) -> None:
    """`paras_only_bn, paras_wo_bn = separate_bn_paras(self.model)`: the groups are the
    model's parameters, so the model is the one the optimizer trains (AO301)."""
    _project(tmp_path, TRAINER_CLASS)
    found, _ = _lint_rules("train.py", "AO301")
    assert found == [("learner.py", "AO301")]


def test_a_conv_model_of_a_trainer_class_on_its_callers_device_gets_the_cuda_rules(
    tmp_path: Path,
) -> None:
    """The trainer reads `conf.device`, chosen by the driver's config: cuDNN's autotuner and
    channels_last apply to the convolutional model it trains."""
    _project(tmp_path, TRAINER_CLASS)
    found, _ = _lint_rules("train.py", "AO601,AO606")
    assert found == [("learner.py", "AO601"), ("learner.py", "AO606")]


def test_a_model_class_with_its_own_training_loop_is_where_the_training_runs(
    tmp_path: Path,
) -> None:
    """CloserLookFewShot: `train(...)` calls `model.train_loop(epoch, loader, optimizer)` on a
    parameter; the model class's `train_loop` runs the backward in fp32 on CUDA (AO201) and
    reads the loss every step (AO702). Its module is checked as training code."""
    _project(
        tmp_path,
        {
            "baselinetrain.py": """
            import torch
            import torch.nn as nn

            class BaselineTrain(nn.Module):
                def __init__(self, classes):
                    super().__init__()
                    self.fc = nn.Linear(8, classes)

                def forward(self, x):
                    return self.fc(x.cuda())

                def train_loop(self, epoch, loader, optimizer):
                    total = 0
                    for x, y in loader:
                        optimizer.zero_grad()
                        loss = nn.functional.cross_entropy(self.forward(x), y.cuda())
                        loss.backward()
                        optimizer.step()
                        total = total + loss.item()
            """,
            "train.py": """
            import torch
            from baselinetrain import BaselineTrain

            def train(base_loader, model, stop_epoch):
                optimizer = torch.optim.Adam(model.parameters())
                for epoch in range(stop_epoch):
                    model.train()
                    model.train_loop(epoch, base_loader, optimizer)

            if __name__ == "__main__":
                model = BaselineTrain(10).cuda()
                train(loader, model, 100)
            """,
        },
    )
    found, said = _lint_rules("train.py", "AO201,AO702")
    assert found == [("baselinetrain.py", "AO201"), ("baselinetrain.py", "AO702")]
    assert "also checking baselinetrain.py, where the training of train.py runs" in said


def test_a_script_that_only_evaluates_a_model_with_a_training_method_is_not_followed(
    tmp_path: Path,
) -> None:
    """The same model class, built by a script that never calls its `train_loop`: the class is
    a model definition there (the model rules only), not the script's training."""
    _project(
        tmp_path,
        {
            "baselinetrain.py": """
            import torch.nn as nn

            class BaselineTrain(nn.Module):
                def train_loop(self, loader, optimizer):
                    for x, y in loader:
                        optimizer.zero_grad()
                        nn.functional.cross_entropy(self(x.cuda()), y.cuda()).backward()
                        optimizer.step()
            """,
            "test.py": """
            import torch
            from baselinetrain import BaselineTrain

            model = BaselineTrain().cuda()
            model.eval()
            with torch.no_grad():
                for x, _ in loader:
                    model(x.cuda())
            """,
        },
    )
    found, said = _lint_rules("test.py", "AO201")
    assert found == [] and "where the training of test.py runs" not in said


def test_cudnn_left_to_a_flag_by_the_importing_script_stands_channels_last_down(
    tmp_path: Path,
) -> None:
    """Rainbow: main.py sets `torch.backends.cudnn.enabled = args.enable_cudnn` (a
    `store_true` flag: off by default) and builds the Agent of agent.py, whose conv DQN goes to `args.device`:
    NHWC convolutions are cuDNN's, so agent.py is not told to use channels_last."""
    agent = """
    import torch
    from torch import nn

    class Agent:
        def __init__(self, args):
            self.online_net = nn.Sequential(nn.Conv2d(4, 32, 8), nn.Flatten()).to(device=args.device)
            self.optimiser = torch.optim.Adam(self.online_net.parameters())

        def learn(self, states):
            self.optimiser.zero_grad()
            self.online_net(states.to(device="cuda")).sum().backward()
            self.optimiser.step()
    """
    main = """
    import torch
    from agent import Agent

    parser.add_argument("--enable-cudnn", action="store_true")
    args = parser.parse_args()
    args.device = torch.device("cuda")
    torch.backends.cudnn.enabled = {}
    dqn = Agent(args)
    for step in range(100):
        dqn.learn(memory.sample())
    """
    _project(tmp_path, {"agent.py": agent, "main.py": main.format("args.enable_cudnn")})
    assert _lint_rules("agent.py", "AO606")[0] == []
    # on, or left to a config whose default is on (HRNet's `config.CUDNN.ENABLED`): reported
    for setting in ("True", "config.CUDNN.ENABLED"):
        _project(tmp_path, {"agent.py": agent, "main.py": main.format(setting)})
        assert _lint_rules("agent.py", "AO606")[0] == [("agent.py", "AO606")], setting


def test_a_model_handed_to_training_is_followed_into_its_evaluation(tmp_path: Path) -> None:
    """Efficient-3DCNNs: main.py never sets the model's mode nor reads its parameters (the
    factory returns them); it hands `model` to `train_epoch` of train.py, which trains it, and
    to `val_epoch` of validation.py, whose forwards run with autograd on."""
    _project(
        tmp_path,
        {
            "train.py": ENGINE_LOOP,
            "validation.py": """
            import torch

            def val_epoch(epoch, data_loader, model, criterion):
                model.eval()
                for inputs, targets in data_loader:
                    with torch.no_grad():
                        targets = targets.cuda()
                    loss = criterion(model(inputs), targets)
            """,
            "main.py": """
            import torch
            from model import generate_model
            from train import train_epoch
            from validation import val_epoch

            model, parameters = generate_model(opt)
            optimizer = torch.optim.SGD(parameters, lr=0.1)
            for i in range(10):
                train_epoch(i, train_loader, model, criterion, optimizer)
                val_epoch(i, val_loader, model, criterion)
            """,
        },
    )
    found, said = _lint_rules("main.py", "AO403")
    assert found == [("validation.py", "AO403")]


def test_a_model_factory_that_wraps_in_data_parallel_is_checked_for_ao501(
    tmp_path: Path,
) -> None:
    """Efficient-3DCNNs' `generate_model(opt)` of model.py builds the network and wraps it in
    `nn.DataParallel` before handing it back: AO501 is reported there."""
    _project(
        tmp_path,
        {
            "model.py": """
            from torch import nn

            def generate_model(opt):
                model = nn.Sequential(nn.Linear(8, 2))
                model = model.cuda()
                model = nn.DataParallel(model, device_ids=None)
                return model, model.parameters()
            """,
            "main.py": """
            import torch
            from model import generate_model

            model, parameters = generate_model(opt)
            optimizer = torch.optim.SGD(parameters, lr=0.1)
            for x, y in loader:
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
                optimizer.step()
            """,
        },
    )
    found, said = _lint_rules("main.py", "AO501")
    assert ("model.py", "AO501") in found
    assert "also checking model.py, which defines a module main.py runs" in said


def test_a_helper_handed_the_model_to_wrap_is_not_a_model_factory(tmp_path: Path) -> None:
    """CenterNet's `DataParallel(module, device_ids, chunk_sizes)` helper and ignite's
    `auto_model(model)` wrap what they are given: the project's (or library's) own parallel
    scheme, not a factory of the model."""
    _project(
        tmp_path,
        {
            "data_parallel.py": """
            import torch

            def DataParallel(module, device_ids=None, chunk_sizes=None):
                return torch.nn.DataParallel(module, device_ids)
            """,
            "main.py": """
            import torch
            from data_parallel import DataParallel

            model = DataParallel(torch.nn.Linear(8, 2).cuda(), device_ids=[0, 1])
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
                optimizer.step()
            """,
        },
    )
    found, said = _lint_rules("main.py", "AO501")
    assert ("data_parallel.py", "AO501") not in found and "data_parallel.py" not in said


def test_a_model_with_3d_convolutions_is_not_told_to_use_channels_last(tmp_path: Path) -> None:
    """PSMNet: 2-D feature extraction and a Conv3d cost volume in the model's module;
    `model.to(memory_format=torch.channels_last)` raises on the 5-D weights, so AO606 is not
    reported. The same model without the Conv3d is."""
    model = """
    from torch import nn

    class Features(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.Sequential(nn.Conv2d(3, 32, 3), nn.Conv2d(32, 32, 3))

    class PSMNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = Features()
            self.dres = nn.Sequential({})

        def forward(self, left):
            return self.dres(self.features.convs(left).unsqueeze(2))
    """
    main = """
    import torch
    from models import PSMNet

    model = PSMNet().cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for imgL, disp in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.smooth_l1_loss(model(imgL.cuda()), disp.cuda())
        loss.backward()
        optimizer.step()
    """
    _project(tmp_path, {"models.py": model.format("nn.Conv3d(32, 32, 3)"), "main.py": main})
    assert _lint_rules("main.py", "AO606")[0] == []
    _project(tmp_path, {"models.py": model.format("nn.ReLU()"), "main.py": main})
    assert _lint_rules("main.py", "AO606")[0] == [("main.py", "AO606")]
    # guided-diffusion's `conv_nd(dims, ...)` builds Conv3d only for dims=3: not counted
    conv_nd = """
    def conv_nd(dims, *args):
        return nn.Conv2d(*args) if dims == 2 else nn.Conv3d(*args)
    """
    models = model.format("conv_nd(2, 32, 32, 3)") + conv_nd
    _project(tmp_path, {"models.py": models, "main.py": main})
    assert _lint_rules("main.py", "AO606")[0] == [("main.py", "AO606")]


# MART's mart.py: the loss the training step calls every step with the model, making its
# adversarial noise on the host and moving it by hand.
MART_LOSS = """
import torch
import torch.nn.functional as F

def mart_loss(model, x_natural, y, optimizer):
    x_adv = x_natural.detach() + 0.001 * torch.randn(x_natural.shape).cuda().detach()
    logits = model(x_natural)
    return F.cross_entropy(logits, y) + F.cross_entropy(model(x_adv), y)

def unused_helper(x):
    return x.cuda()
"""

MART = """
import torch
from mart import mart_loss

use_cuda = torch.cuda.is_available()
device = torch.device("cuda" if use_cuda else "cpu")

def train(model, device, train_loader, optimizer):
    for data, target in train_loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = mart_loss(model=model, x_natural=data, y=target, optimizer=optimizer)
        loss.backward()
        optimizer.step()

model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(10):
    train(model, device, train_loader, optimizer)
"""


def test_a_loss_the_training_step_runs_on_the_model_is_checked_for_the_step_rules(
    tmp_path: Path,
) -> None:
    """MART: `mart_loss(model=model, x_natural=data, ...)` in the loop that steps: its
    `torch.randn(shape).cuda()` is made and moved every step (AO603, AO608); a script with a
    backward of its own is not a driver, so its helpers were never read."""
    _project(tmp_path, {"mart.py": MART_LOSS, "train.py": MART})
    found, said = _lint_rules("train.py", "AO603,AO608,AO201")
    assert ("mart.py", "AO603") in found and ("mart.py", "AO608") in found
    assert not [f for f in found if f[0] == "mart.py" and f[1] not in ("AO603", "AO608")]
    assert "also checking mart.py, whose functions the training step of train.py runs" in said
    # a call under no_grad (an evaluation's attack) leads nowhere
    (tmp_path / "train.py").write_text(
        MART.replace("loss = mart_loss(", "with torch.no_grad():\n            loss = mart_loss(")
    )
    found, said = _lint_rules("train.py", "AO603,AO608")
    assert not [f for f in found if f[0] == "mart.py"]
