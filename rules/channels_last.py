"""AO606: a Conv2d network trained on CUDA in the default (NCHW) memory format."""

from __future__ import annotations

import functools

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.conv_models import conv2d_models
from autoopt.lint.program.device import GPU_MARKERS
from autoopt.lint.program.handled import LIBRARY_TRAINER_MARKERS
from autoopt.lint.program.loops import model_input_transfer
from autoopt.lint.program.placement import model_placement, without_placement
from autoopt.lint.program.torch_api import torch_imports
from autoopt.lint.program.trained_models import aliases, mentions, trained_models
from autoopt.lint.tree.calls import with_keyword
from autoopt.lint.tree.edits import block_statement, statement_line
from autoopt.lint.tree.nodes import dotted, nodes_of_type


class ChannelsLast(Rule):
    """
    ## What it does
    Flags a model built from `Conv2d` layers (a class of the file or of another module of the
    project, an `nn.Sequential`, a torchvision or timm CNN) that is moved to the device in a
    script with a GPU path and no `channels_last` anywhere. The placement may come later in
    the same function, inside `if`s however nested and after the `if`/`else` or `with` block
    the model is built in (`if pretrained: model = ... else: model = ...` then
    `elif device.type == "cuda": if distributed: model.cuda()`). The placement may also be
    in the chain that builds it (`ModelBuilder().cuda().train()`), inside the wrapper it is
    handed to (`DistributedDataParallel(Net().cuda())`), or in the project's builder that
    returns it placed (`model = net_factory(...)` whose branches `.cuda()` what they return).
    A model trained by ignite's `create_supervised_trainer` counts as trained.

    ## Why
    cuDNN's fastest convolution kernels, and Tensor Cores under AMP, work on NHWC
    ("channels last") tensors; in NCHW every convolution pays for layout transposes.
    Converting the model (and its 4-D inputs) is typically 1.2–1.5× faster for CNN training
    under AMP on Volta and newer GPUs (MosaicML Composer reports 1.5× on ResNet-101).
    `autoopt.optimize` converts model and inputs when convolutions dominate.

    ## When not to
    - A model whose `forward` flattens activations with `.view(...)` (`x.view(n, -1)`, fewer
      than four sizes): NHWC activations are not contiguous in NCHW order, so it raises ("view
      size is not compatible with input tensor's size and stride"); it needs `.reshape(...)` or
      `torch.flatten(x, 1)` first. Such models (and models built from them) are reported
      without a fix, saying so; `out.view(n, 128, s, s)`, which makes a linear layer's output
      4-D, merges nothing.
    - Scripts with no GPU path (the gain is a CUDA/cuDNN one; see `autoopt.lint.program.device`),
      1-D/3-D convolutions (`Conv1d`, `Conv3d` use other layouts), and scripts that already
      mention `channels_last`. A model of another module that has 3-D convolutions beside its
      2-D ones (PSMNet's cost volume) is not reported: `model.to(memory_format=
      torch.channels_last)` raises on its 5-D weights.
    - A program that switches cuDNN off, or leaves it to a command-line flag that is off by
      default (Rainbow's `torch.backends.cudnn.enabled = args.enable_cudnn`, `store_true`), in
      the file, in the script that imports it, or in a module it imports (crnn-pytorch's
      evaluate.py, imported by train.py): NHWC convolutions are cuDNN's kernels.
    - A model defined in another module of the project (`from models import Net`) is read
      (without importing it) and held to the same test: it must be built from `Conv2d` layers
      and a part that flattens with `.view()` declines the fix. A model whose module cannot be
      found is not flagged.

    ## Fix (unsafe)
    Adds `model = model.to(memory_format=torch.channels_last)` right after the model is placed
    on the device and, when the training loop feeds the model a tensor moved by a simple
    `x = x.to(device)` (or `model(x.to(device))`), adds `memory_format=torch.channels_last` to
    that `.to()`. Unsafe because any `.view()` on activations elsewhere (a loss, a custom
    layer imported from another file) can then fail, and inputs that are not 4-D would make
    the `.to(memory_format=...)` raise.
    """

    code = "AO606"
    name = "channels-last"
    message = "Conv2d model on CUDA in NCHW; convert model and inputs to channels_last"
    fix_safety = FixSafety.UNSAFE
    fix_reason = "a .view() on NHWC activations (or a non-4-D input) raises after the change"
    covered_by_optimize = True  # autoopt.optimize() applies it at run time
    # `from models import Net`, `import resnet as RN`
    triggers = ("Conv2d", "conv2d", "models", "create_model", "from ", "import ")
    requires = (GPU_MARKERS, (".backward(", *LIBRARY_TRAINER_MARKERS))

    VALID = [
        Valid(  # one branch builds a network without convolutions (a ViT by default)
            """
            import torch
            from torch import nn
            from torchvision.models import resnet18
            class ViT(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.proj = nn.Linear(48, 64)
                def forward(self, x):
                    return self.proj(x)
            model = resnet18() if args.cnn else ViT()
            model = model.cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in loader:
                model(x.cuda()).sum().backward()
                opt.step()
            """
        ),
        Valid(  # CPU-only tutorial: no device path
            """
            import torch
            from torch import nn
            model = nn.Sequential(nn.Conv2d(1, 16, 5), nn.Flatten(), nn.LazyLinear(10))
            for images, labels in train_loader:
                loss = criterion(model(images), labels)
                loss.backward()
            """
        ),
        Valid(
            """
            import torch
            from torch import nn
            model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten()).cuda()
            model = model.to(memory_format=torch.channels_last)
            for x in loader:
                model(x.cuda()).sum().backward()
            """
        ),
        Valid(
            """
            import torch
            from torch import nn
            model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten())
            for x in loader:
                model(x).sum().backward()
            """
        ),
        Valid(  # Rainbow: cuDNN left to a flag, off by default
            """
            import torch
            from torch import nn
            parser.add_argument("--enable-cudnn", action="store_true")
            args = parser.parse_args()
            torch.backends.cudnn.enabled = args.enable_cudnn
            model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten()).cuda()
            for x in loader:
                model(x.cuda()).sum().backward()
            """
        ),
        Valid(
            """
            import torch
            from torch import nn
            model = nn.Sequential(nn.Conv1d(3, 8, 3), nn.Flatten()).cuda()
            for x in loader:
                model(x.cuda()).sum().backward()
            """
        ),
        Valid(
            """
            import torch
            from mylib import ResNet
            model = ResNet().to(torch.device("cuda"))
            """
        ),
    ]
    INVALID = [
        Invalid(  # either branch builds a Conv2d network (MedMNIST's resnet18 / ResNet18)
            """
            import torch
            from torch import nn
            from torchvision.models import resnet18
            class Small(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 8, 3)
                def forward(self, x):
                    return self.conv(x)
            device = torch.device("cuda")
            model = resnet18(num_classes=10) if resize else Small()
            model = model.to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in loader:
                model(x.to(device)).sum().backward()
                opt.step()
            """,
            line=12,
            fixed="""
            import torch
            from torch import nn
            from torchvision.models import resnet18
            class Small(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 8, 3)
                def forward(self, x):
                    return self.conv(x)
            device = torch.device("cuda")
            model = resnet18(num_classes=10) if resize else Small()
            model = model.to(device)
            model = model.to(memory_format=torch.channels_last)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in loader:
                model(x.to(device, memory_format=torch.channels_last)).sum().backward()
                opt.step()
            """,
            unsafe=True,
        ),
        Invalid(  # a class chosen into a name, then called (JEM's `model_cls = F if ... else CCF`)
            """
            import torch
            from torch import nn
            class Small(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 8, 3)
                def forward(self, x):
                    return self.conv(x)
            class Big(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 16, 5)
                def forward(self, x):
                    return self.conv(x)
            device = torch.device("cuda")
            model_cls = Small if small else Big
            model = model_cls().to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in loader:
                model(x.to(device)).sum().backward()
                opt.step()
            """,
            line=17,
            fixed="""
            import torch
            from torch import nn
            class Small(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 8, 3)
                def forward(self, x):
                    return self.conv(x)
            class Big(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 16, 5)
                def forward(self, x):
                    return self.conv(x)
            device = torch.device("cuda")
            model_cls = Small if small else Big
            model = model_cls().to(device)
            model = model.to(memory_format=torch.channels_last)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in loader:
                model(x.to(device, memory_format=torch.channels_last)).sum().backward()
                opt.step()
            """,
            unsafe=True,
        ),
        Invalid(  # built on the device by its builder's `device=` (pix2pix's define_G(gpu_id=))
            """
            import torch
            import torch.nn as nn
            class Net(nn.Module):
                def __init__(self, device=None):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 8, 3, device=device)
                def forward(self, x):
                    return self.conv(x)
            device = torch.device("cuda")
            net = Net(device=device)
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for x in loader:
                net(x.to(device)).sum().backward()
                opt.step()
            """,
            line=10,
            fixed="""
            import torch
            import torch.nn as nn
            class Net(nn.Module):
                def __init__(self, device=None):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 8, 3, device=device)
                def forward(self, x):
                    return self.conv(x)
            device = torch.device("cuda")
            net = Net(device=device)
            net = net.to(memory_format=torch.channels_last)
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for x in loader:
                net(x.to(device, memory_format=torch.channels_last)).sum().backward()
                opt.step()
            """,
            unsafe=True,
        ),
        Invalid(  # a zoo's builder handed to the model that wraps it (moco's MoCo)
            """
            import torch
            import torchvision.models as models
            import moco.builder
            model = moco.builder.MoCo(models.__dict__[arch], 128)
            model.cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.03)
            for images, _ in train_loader:
                loss = model(images.cuda()).sum()
                loss.backward()
                optimizer.step()
            """,
            line=5,
            fixed="""
            import torch
            import torchvision.models as models
            import moco.builder
            model = moco.builder.MoCo(models.__dict__[arch], 128)
            model.cuda()
            model = model.to(memory_format=torch.channels_last)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.03)
            for images, _ in train_loader:
                loss = model(images.cuda()).sum()
                loss.backward()
                optimizer.step()
            """,
            unsafe=True,
        ),
        Invalid(  # built in __init__, placed by another method of the trainer (pytorch-wgan)
            """
            import torch
            from torch import nn

            class GAN:
                def __init__(self):
                    self.D = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
                    self.d_optimizer = torch.optim.Adam(self.D.parameters())
                def check_cuda(self, cuda_flag=False):
                    if cuda_flag:
                        self.D.cuda(0)
                def train(self, loader):
                    for x in loader:
                        self.D(x.cuda(0)).mean().backward()
                        self.d_optimizer.step()
            """,
            line=10,
            fixed="""
            import torch
            from torch import nn

            class GAN:
                def __init__(self):
                    self.D = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
                    self.d_optimizer = torch.optim.Adam(self.D.parameters())
                def check_cuda(self, cuda_flag=False):
                    if cuda_flag:
                        self.D.cuda(0)
                        self.D = self.D.to(memory_format=torch.channels_last)
                def train(self, loader):
                    for x in loader:
                        self.D(x.cuda(0)).mean().backward()
                        self.d_optimizer.step()
            """,
            unsafe=True,
        ),
        Invalid(  # `model = nn.DataParallel(model).cuda()` places the model it wraps (CutMix)
            """
            import torch
            from torch import nn

            model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
            model = nn.DataParallel(model).cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
            """,
            line=5,
            fixed="""
            import torch
            from torch import nn

            model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
            model = nn.DataParallel(model).cuda()
            model = model.to(memory_format=torch.channels_last)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
            """,
            unsafe=True,
        ),
        Invalid(  # built and placed by a one-line `if`/`else` (an Atari DQN agent)
            """
            import torch
            from torch import nn
            class QNet(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(4, 32, 8, stride=4)
                def forward(self, x):
                    return self.conv(x).mean((1, 2, 3))
            class Agent:
                def __init__(self, duel, dvc):
                    if duel: self.q_net = QNet().to(dvc)
                    else: self.q_net = QNet().to(dvc)
                    self.opt = torch.optim.Adam(self.q_net.parameters())
                def train(self, s):
                    self.q_net(s).sum().backward()
                    self.opt.step()
            agent = Agent(True, torch.device("cuda"))
            """,
            line=11,
            fixed="""
            import torch
            from torch import nn
            class QNet(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(4, 32, 8, stride=4)
                def forward(self, x):
                    return self.conv(x).mean((1, 2, 3))
            class Agent:
                def __init__(self, duel, dvc):
                    if duel: self.q_net = QNet().to(dvc)
                    else: self.q_net = QNet().to(dvc)
                    self.q_net = self.q_net.to(memory_format=torch.channels_last)
                    self.opt = torch.optim.Adam(self.q_net.parameters())
                def train(self, s):
                    self.q_net(s).sum().backward()
                    self.opt.step()
            agent = Agent(True, torch.device("cuda"))
            """,
            unsafe=True,
        ),
        Invalid(  # a trainer object's model (Graph-WaveNet's engine.trainer)
            """
            import torch
            from torch import nn
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 8, 3)
                def forward(self, x):
                    return self.conv(x).mean((1, 2, 3))
            class Trainer:
                def __init__(self, device):
                    self.model = Net()
                    self.model.to(device)
                    self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
                def train(self, loader, device):
                    for x in loader:
                        self.model(x.to(device)).sum().backward()
                        self.opt.step()
            trainer = Trainer(torch.device("cuda"))
            """,
            line=12,
            fixed="""
            import torch
            from torch import nn
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 8, 3)
                def forward(self, x):
                    return self.conv(x).mean((1, 2, 3))
            class Trainer:
                def __init__(self, device):
                    self.model = Net()
                    self.model.to(device)
                    self.model = self.model.to(memory_format=torch.channels_last)
                    self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
                def train(self, loader, device):
                    for x in loader:
                        self.model(x.to(device)).sum().backward()
                        self.opt.step()
            trainer = Trainer(torch.device("cuda"))
            """,
            unsafe=True,
        ),
        Invalid(  # a torchvision CNN built inside the user's own class (a backbone)
            """
            import torch
            import torchvision


            class Siamese(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.backbone = torchvision.models.resnet18(weights=None)

                def forward(self, x):
                    return self.backbone(x)


            device = torch.device("cuda")
            model = Siamese().to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = model(x.to(device)).sum()
                loss.backward()
                optimizer.step()
            """,
            line=15,
            fixed="""
            import torch
            import torchvision


            class Siamese(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.backbone = torchvision.models.resnet18(weights=None)

                def forward(self, x):
                    return self.backbone(x)


            device = torch.device("cuda")
            model = Siamese().to(device)
            model = model.to(memory_format=torch.channels_last)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = model(x.to(device, memory_format=torch.channels_last)).sum()
                loss.backward()
                optimizer.step()
            """,
            unsafe=True,
        ),
        Invalid(  # a conv model passed into a wrapper model (DDPM(eps_model=UNet()))
            """
            import torch
            from torch import nn


            class UNet(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 3, 3, padding=1)

                def forward(self, x, t):
                    return self.conv(x)


            class DDPM(nn.Module):
                def __init__(self, eps_model, n_steps):
                    super().__init__()
                    self.eps_model = eps_model
                    self.n_steps = n_steps

                def forward(self, x):
                    return (self.eps_model(x, self.n_steps) - x).pow(2).mean()


            device = torch.device("cuda")
            ddpm = DDPM(eps_model=UNet(), n_steps=1000).to(device)
            optimizer = torch.optim.Adam(ddpm.parameters(), lr=2e-4)
            for x in loader:
                loss = ddpm(x.to(device))
                loss.backward()
                optimizer.step()
            """,
            line=25,
            fixed="""
            import torch
            from torch import nn


            class UNet(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 3, 3, padding=1)

                def forward(self, x, t):
                    return self.conv(x)


            class DDPM(nn.Module):
                def __init__(self, eps_model, n_steps):
                    super().__init__()
                    self.eps_model = eps_model
                    self.n_steps = n_steps

                def forward(self, x):
                    return (self.eps_model(x, self.n_steps) - x).pow(2).mean()


            device = torch.device("cuda")
            ddpm = DDPM(eps_model=UNet(), n_steps=1000).to(device)
            ddpm = ddpm.to(memory_format=torch.channels_last)
            optimizer = torch.optim.Adam(ddpm.parameters(), lr=2e-4)
            for x in loader:
                loss = ddpm(x.to(device, memory_format=torch.channels_last))
                loss.backward()
                optimizer.step()
            """,
            unsafe=True,
        ),
        Invalid(  # the loop is ignite's: create_supervised_trainer (ignite's mnist example)
            """
            import torch
            from torch import nn
            from ignite.engine import create_supervised_trainer
            model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.Flatten(), nn.LazyLinear(10))
            device = "cuda" if torch.cuda.is_available() else "cpu"
            model.to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            trainer = create_supervised_trainer(model, optimizer, nn.NLLLoss(), device=device)
            trainer.run(train_loader, max_epochs=10)
            """,
            line=6,
            fixed="""
            import torch
            from torch import nn
            from ignite.engine import create_supervised_trainer
            model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.Flatten(), nn.LazyLinear(10))
            device = "cuda" if torch.cuda.is_available() else "cpu"
            model.to(device)
            model = model.to(memory_format=torch.channels_last)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            trainer = create_supervised_trainer(model, optimizer, nn.NLLLoss(), device=device)
            trainer.run(train_loader, max_epochs=10)
            """,
            unsafe=True,
        ),
        # Flattens with .view(): reported, the fix declined (it would raise).
        Invalid(
            """
            import torch
            from torch import nn
            class LeNet(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(1, 6, 5)
                    self.fc = nn.Linear(6 * 24 * 24, 10)
                def forward(self, x):
                    x = self.conv(x)
                    return self.fc(x.view(x.size(0), -1))
            model = LeNet().to("cuda")
            for x in loader:
                model(x.to("cuda")).sum().backward()
            """,
            line=11,
            message_contains="fix declined",
        ),
        Invalid(  # a GAN generator placed under the legacy `if cuda:` (PyTorch-GAN dcgan)
            """
            import torch
            import torch.nn as nn
            class Generator(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.l1 = nn.Linear(100, 128 * 8 * 8)
                    self.conv = nn.Conv2d(128, 3, 3, padding=1)
                def forward(self, z):
                    out = self.l1(z).view(z.shape[0], 128, 8, 8)
                    return self.conv(out)
            cuda = True if torch.cuda.is_available() else False
            generator = Generator()
            if cuda:
                generator.cuda()
            optimizer_G = torch.optim.Adam(generator.parameters())
            for i, (imgs, _) in enumerate(dataloader):
                g_loss = adversarial_loss(discriminator(generator(z)), valid)
                g_loss.backward()
            """,
            line=14,
            fixed="""
            import torch
            import torch.nn as nn
            class Generator(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.l1 = nn.Linear(100, 128 * 8 * 8)
                    self.conv = nn.Conv2d(128, 3, 3, padding=1)
                def forward(self, z):
                    out = self.l1(z).view(z.shape[0], 128, 8, 8)
                    return self.conv(out)
            cuda = True if torch.cuda.is_available() else False
            generator = Generator()
            if cuda:
                generator.cuda()
                generator = generator.to(memory_format=torch.channels_last)
            optimizer_G = torch.optim.Adam(generator.parameters())
            for i, (imgs, _) in enumerate(dataloader):
                g_loss = adversarial_loss(discriminator(generator(z)), valid)
                g_loss.backward()
            """,
            unsafe=True,
        ),
        Invalid(  # built under a `with` and an `elif`, placed after the `with` (yolov5 classify)
            """
            import torch
            import torchvision
            device = torch.device("cuda")
            with torch_distributed_zero_first(rank):
                if path.endswith(".pt"):
                    model = attempt_load(path)
                elif name in torchvision.models.__dict__:
                    model = torchvision.models.__dict__[name]()
            model = model.to(device)
            for x, y in loader:
                loss_fn(model(x.to(device)), y.to(device)).backward()
            """,
            line=9,
            fixed="""
            import torch
            import torchvision
            device = torch.device("cuda")
            with torch_distributed_zero_first(rank):
                if path.endswith(".pt"):
                    model = attempt_load(path)
                elif name in torchvision.models.__dict__:
                    model = torchvision.models.__dict__[name]()
            model = model.to(device)
            model = model.to(memory_format=torch.channels_last)
            for x, y in loader:
                loss_fn(model(x.to(device, memory_format=torch.channels_last)), y.to(device)).backward()
            """,
            unsafe=True,
        ),
        Invalid(  # built in an if/else, placed two `if`s deep after it (pytorch/examples imagenet)
            """
            import torch
            import torchvision.models as models
            if pretrained:
                model = models.__dict__[arch](pretrained=True)
            else:
                model = models.__dict__[arch]()
            if not use_accel:
                print("slow")
            elif device.type == "cuda":
                if distributed:
                    model.cuda()
                    model = torch.nn.parallel.DistributedDataParallel(model)
            for x, y in loader:
                loss_fn(model(x.cuda()), y.cuda()).backward()
            """,
            line=11,
            fixed="""
            import torch
            import torchvision.models as models
            if pretrained:
                model = models.__dict__[arch](pretrained=True)
            else:
                model = models.__dict__[arch]()
            if not use_accel:
                print("slow")
            elif device.type == "cuda":
                if distributed:
                    model.cuda()
                    model = model.to(memory_format=torch.channels_last)
                    model = torch.nn.parallel.DistributedDataParallel(model)
            for x, y in loader:
                loss_fn(model(x.cuda()), y.cuda()).backward()
            """,
            unsafe=True,
        ),
        Invalid(  # the device from torch.accelerator, passed into train() (pytorch/examples mnist)
            """
            import torch
            import torch.nn as nn
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv1 = nn.Conv2d(1, 32, 3, 1)
                    self.fc1 = nn.Linear(21632, 10)
                def forward(self, x):
                    return self.fc1(torch.flatten(self.conv1(x), 1))
            def train(model, device, train_loader):
                for data, target in train_loader:
                    data, target = data.to(device), target.to(device)
                    loss = F.nll_loss(model(data), target)
                    loss.backward()
            def main():
                device = torch.accelerator.current_accelerator()
                model = Net().to(device)
                train(model, device, train_loader)
            """,
            line=17,
            fixed="""
            import torch
            import torch.nn as nn
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv1 = nn.Conv2d(1, 32, 3, 1)
                    self.fc1 = nn.Linear(21632, 10)
                def forward(self, x):
                    return self.fc1(torch.flatten(self.conv1(x), 1))
            def train(model, device, train_loader):
                for data, target in train_loader:
                    data, target = data.to(device, memory_format=torch.channels_last), target.to(device)
                    loss = F.nll_loss(model(data), target)
                    loss.backward()
            def main():
                device = torch.accelerator.current_accelerator()
                model = Net().to(device)
                model = model.to(memory_format=torch.channels_last)
                train(model, device, train_loader)
            """,
            unsafe=True,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.body = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU())
                    self.head = nn.Linear(16, 10)
                def forward(self, x):
                    return self.head(torch.flatten(self.body(x).mean((2, 3)), 1))

            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
            """,
            line=13,
            fixed="""
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.body = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU())
                    self.head = nn.Linear(16, 10)
                def forward(self, x):
                    return self.head(torch.flatten(self.body(x).mean((2, 3)), 1))

            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            model = model.to(memory_format=torch.channels_last)
            for x, y in loader:
                x, y = x.to(device, memory_format=torch.channels_last), y.to(device)
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
            """,
            unsafe=True,
        ),
        Invalid(
            """
            import torchvision
            net = torchvision.models.resnet18(num_classes=10)
            net.cuda()
            for x, y in loader:
                loss_fn(net(x.cuda()), y.cuda()).backward()
            """,
            line=3,
            fixed="""
            import torchvision
            import torch

            net = torchvision.models.resnet18(num_classes=10)
            net.cuda()
            net = net.to(memory_format=torch.channels_last)
            for x, y in loader:
                loss_fn(net(x.cuda()), y.cuda()).backward()
            """,
            unsafe=True,
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        if "channels_last" in self.context.source or not self.context.program.gpu_path:
            return
        if self.context.program.cudnn_off:
            return
        reported: set[int] = set()
        reported_names: set[str] = set()
        models = conv2d_models(self)
        conv_builds = {id(m.built) for m in models}
        for name, built, flattens, inner in models:
            if inner in reported_names:
                continue  # `trainer = Trainer(model, ...)`: `model` is reported already
            placement = model_placement(self, name, built)
            if (
                placement is None
                and self._handed_on(name, built)
                and self._trained_on_cuda(name)
                and not self._built_otherwise(name, built, conv_builds)
            ):
                # placed where the search does not reach (a trainer's `set_device`, the
                # object that holds it calling `self.cuda(rank)`): reported where it is built
                placement = block_statement(built, self.parent)
                if id(placement) not in reported:
                    reported.add(id(placement))
                    reported_names.add(name)
                    self.report(
                        placement,
                        f"{self.message} (fix declined: the model reaches the device in code "
                        "this fix does not edit; convert it once it is placed)",
                    )
                continue
            # a model built in both branches of an `if` is placed once: report it once
            if placement is None or id(placement) in reported:
                continue
            reported.add(id(placement))
            reported_names.add(name)
            if flattens:
                self.report(
                    placement,
                    f"{self.message} (fix declined: the model flattens activations with "
                    ".view(), which raises on channels_last; use torch.flatten(x, 1) first)",
                )
            else:
                self._report(name, placement)

    def _trained_on_cuda(self, name: str) -> bool:
        """`name` holds a model this file trains (an optimizer over its parameters, a call
        that trains it) in a program that runs on CUDA."""
        if not self.context.program.runs_on_cuda:
            return False
        module = self.context.module
        return any(name in aliases(module, model) for _, model in self._trained)

    def _handed_on(self, name: str, built: cst.Assign) -> bool:
        """The model may be placed where the search does not reach: it is a trainer's
        attribute (`self.G`), handed to a call (`Trainer(opt, model, optimizer)`,
        `nn.DataParallel(model)`) or kept under another name (`self.model = model`). One only
        run and stepped here is not placed at all."""
        if name.startswith("self."):
            return True
        scope = self.facts.enclosing_scope(built)
        for call in nodes_of_type(scope, cst.Call):
            if any(dotted(without_placement(a.value)) == name for a in call.args):
                return True
        for other in nodes_of_type(scope, cst.Assign):  # `self.model, self.opt = model, opt`
            values = other.value.elements if isinstance(other.value, cst.Tuple) else ()
            if other is not built and any(
                dotted(v) == name for v in (other.value, *(e.value for e in values))
            ):
                return True
        return False

    def _built_otherwise(self, name: str, built: cst.Assign, conv_builds: set[int]) -> bool:
        """Another line of the function binds `name` to a model that is not a Conv2d network
        (dino: a ViT by default, a torchvision CNN in an `elif`)."""
        for other in nodes_of_type(self.facts.enclosing_scope(built), cst.Assign):
            if other is built or id(other) in conv_builds or len(other.targets) != 1:
                continue
            value = without_placement(other.value)
            if (
                dotted(other.targets[0].target) == name
                and isinstance(value, cst.Call)
                and not mentions(value, name)  # not `model = DataParallel(model)`
            ):
                return True
        return False

    @functools.cached_property
    def _trained(self) -> list[tuple[cst.Call, str]]:
        return trained_models(self)

    def _report(self, name: str, placement: cst.BaseStatement) -> None:
        new = statement_line(f"{name} = {name}.to(memory_format=torch.channels_last)")
        replacements: dict[cst.CSTNode, cst.CSTNode | cst.FlattenSentinel[cst.BaseStatement]] = {
            placement: cst.FlattenSentinel([placement, new])
        }
        moved = model_input_transfer(self, name)
        if moved is not None:
            replacements[moved] = with_keyword(
                moved, "memory_format", cst.parse_expression("torch.channels_last")
            )
        self.report(
            placement,
            fix=Fix(
                replacements=replacements,
                description="convert the model (and its inputs) to channels_last",
                add_imports=torch_imports(self.context.module),
            ),
        )
