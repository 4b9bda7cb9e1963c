"""AO201: a training loop that runs in full fp32 (no autocast anywhere in the file).

The codemod that converts a loop lives in `autoopt.lint.rewrite.fixes.autocast`."""

from __future__ import annotations

import ast

import libcst as cst

from autoopt.lint.engine.rule import FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.handled import (
    LIBRARY_TRAINER_MARKERS,
    engine_step_functions,
    is_hogwild,
    library_handles_precision,
    library_trainer_calls,
)
from autoopt.lint.program.precision import (
    drives_its_own_precision,
    fp32_beside_apex,
    runs_apex,
)
from autoopt.lint.rewrite.fixes.autocast import AutocastPlan
from autoopt.lint.tree.calls import arg


class AmpAutocast(Rule):
    """Train with automatic mixed precision: `torch.autocast` + `torch.amp.GradScaler`.

    **What.** A loop that calls `.backward()` while nothing in the file uses `autocast` runs every
    matmul and convolution in float32. Wrapping the forward pass and the loss in
    `torch.autocast(device_type=..., dtype=...)` runs them in bfloat16 or float16, and a
    `GradScaler` keeps small float16 gradients from underflowing.

    **Why.** Tensor cores (and CPUs with AVX512-BF16/AMX) run half-precision matmuls several times
    faster than fp32 and the activations take half the memory: on this project's CPU machines bf16
    autocast made a small CNN's training step ~17x faster; on Ampere+ GPUs 2-3x is typical.

    **The fix** (unsafe: it changes the numerics of training) wraps the forward and loss
    statements before each `backward()` in `with torch.autocast(device_type=<your device>.type,
    dtype=amp_dtype):`, creates one scaler before the training loop, and routes the loop through
    it: `scaler.scale(loss).backward()`, `scaler.step(optimizer)` and a single `scaler.update()` per
    iteration (after the last optimizer of a GAN), with `scaler.unscale_(optimizer)` before any
    `clip_grad_norm_`/`clip_grad_value_` so clipping sees true gradients. `amp_dtype` is bfloat16
    on CPU and on GPUs that support it (the scaler is then a pass-through) and float16 with real
    loss scaling on older GPUs (a script with no CUDA in it gets bfloat16). Gradient
    accumulation keeps its `if`: the step and the update stay under it.

    **When not to apply.** A script that already runs another mixed-precision system (apex amp,
    a hand-written loss scale, models cast to `.half()`/`.bfloat16()` or their parameters cast
    in place, `m.weight.data = m.weight.data.bfloat16()`, see
    `autoopt.lint.program.precision`) is not flagged (also where a flag turns apex on: the
    precision is the script's choice, and where a project base class of the trainer enables
    apex: End-to-end-ASR's `BaseSolver.enable_apex()`, and a trainer module whose driver wraps
    the model and optimizer in its own fp16 system: HigherHRNet's `FP16_Optimizer` around
    `do_train`), unless its apex leaves the training in fp32
    (`opt_level="O0"`): then it is reported without a fix. The fix declines, saying
    why, when the loop has no optimizer object
    to route through a scaler (manual updates), uses an LBFGS closure (`step(closure)`), reads tensors with `.numpy()` (which
    fails on bf16 outputs), takes a double backward (`create_graph=True`,
    `torch.autograd.grad`, e.g. a gradient penalty: it needs the scaled-gradient recipe by
    hand), or uses `BCELoss`/`binary_cross_entropy` on
    probabilities, which autocast rejects (switch to `BCEWithLogitsLoss` first). Numerically
    delicate code (large reductions, custom losses in fp16) should be checked after the change;
    the runtime `autoopt.optimize()` does this without editing the loop. Not flagged where a
    library owns the precision: HF Accelerate's `Accelerator(...)` (its `mixed_precision=`
    argument or `accelerate launch --mixed_precision`), Lightning `Trainer(precision=...)` /
    `Fabric(precision=...)`; nor in Hogwild training (`model.share_memory()` of the trained
    model with CPU worker processes, also the module such a script starts); nor in a CPU-only script (no device but
    the CPU, no GPU or distributed launcher in its text: `autoopt.lint.program.device.cpu_only`), whose
    author has not asked for a GPU's mixed precision; nor in a program that makes float64 the
    default dtype (`torch.set_default_dtype(torch.float64)`, here or in the script that
    imports this module: PyTorch-RL's `ppo_gym.py`), where autocast, which casts float32
    only, would change nothing until the float64 goes.

    **ignite.** A `create_supervised_trainer(model, optimizer, loss_fn, ...)` without
    `amp_mode=` in a script with a GPU path trains in float32 too: it is reported without a
    fix (pass `amp_mode="amp", scaler=True`). A step function of the script's own that an
    `Engine(step)` runs on every batch is reported like a step called from a loop (no fix).
    """

    code = "AO201"
    name = "amp-autocast"
    message = "training loop runs in fp32; use torch.autocast and a GradScaler (mixed precision)"
    fix_safety = FixSafety.UNSAFE
    fix_reason = "mixed precision changes the numerics of training"
    covered_by_optimize = True  # autoopt.optimize() applies it at run time
    triggers = (".backward(", *LIBRARY_TRAINER_MARKERS)

    VALID = [
        Valid(  # apex through another name, behind a flag (End-to-end-ASR's BaseSolver)
            """
            import torch

            class BaseSolver:
                def enable_apex(self):
                    if self.paras.amp:
                        from apex import amp
                        self.amp_lib = amp
                        self.model, self.opt = self.amp_lib.initialize(self.model, self.opt)

                def train(self, loader):
                    for x in loader:
                        loss = self.model(x.cuda()).sum()
                        loss.backward()
                        self.opt.step()
            """
        ),
        Valid(  # parameters cast to bf16 in place (modded-nanogpt): its own reduced precision
            """
            import torch
            model = Net().cuda()
            for m in model.modules():
                if isinstance(m, torch.nn.Linear):
                    m.weight.data = m.weight.data.bfloat16()
            for x in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
            """
        ),
        Valid(  # float64 made the default dtype: autocast casts float32 only (PyTorch-RL)
            """
            import torch
            dtype = torch.float64
            torch.set_default_dtype(dtype)
            model = Policy().cuda()
            for x, y in loader:
                loss = loss_fn(model(x.cuda()), y.cuda())
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # built in bf16 by the project's loader (mistral-finetune's load_model)
            """
            import torch
            param_dtype = torch.bfloat16
            model = load_model(folder, param_dtype=param_dtype).cuda()
            for x, y in loader:
                loss = loss_fn(model(x.cuda()), y.cuda())
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # apex amp already runs the loop in mixed precision: silent (not a second scaler)
            """
            import torch
            from apex import amp
            model, optimizer = amp.initialize(model.cuda(), optimizer, opt_level="O1")
            for x, y in loader:
                loss = criterion(model(x.cuda()), y.cuda())
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # hand-written fp16: the model is cast to half
            """
            import torch
            model = Net().cuda().half()
            for x, y in loader:
                loss = criterion(model(x.cuda().half()), y.cuda())
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # ignite's trainer already in mixed precision
            """
            import torch
            from ignite.engine import create_supervised_trainer
            device = "cuda" if torch.cuda.is_available() else "cpu"
            trainer = create_supervised_trainer(
                model, optimizer, loss_fn, device=device, amp_mode="amp", scaler=True
            )
            trainer.run(loader, max_epochs=10)
            """
        ),
        Valid(  # Accelerate decides the precision (argument or launch config)
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator(mixed_precision=args.mixed_precision)
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for batch in loader:
                loss = model(**batch).loss
                accelerator.backward(loss)
                loss.backward()
            """
        ),
        Valid(  # Hogwild: CPU processes updating one shared model
            """
            import torch
            import torch.multiprocessing as mp
            def train(model, loader, optimizer):
                for data, target in loader:
                    loss = F.nll_loss(model(data), target)
                    loss.backward()
                    optimizer.step()
            if __name__ == "__main__":
                model.share_memory()
                for rank in range(4):
                    mp.Process(target=train, args=(model, loader, optimizer)).start()
            """
        ),
        Valid(  # apex amp already runs the loop in mixed precision
            """
            import torch
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x, y in loader:
                loss = loss_fn(model(x), y)
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # the model is cast to half: fp16 training by hand, with a dynamic loss scale
            """
            import torch
            model = Net().cuda().half()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = loss_fn(model(x.half()), y)
                (loss * loss_scale).backward()
                optimizer.step()
            """
        ),
        Valid(
            """
            import torch

            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                with torch.autocast(device_type="cuda", dtype=torch.float16):
                    loss = loss_fn(model(x), y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """
        ),
        Valid(
            """
            import torch
            from torch.amp import autocast

            for x, y in loader:
                with autocast("cpu"):
                    loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(
            """
            import torch

            for x, y in loader:  # evaluation: no backward
                with torch.no_grad():
                    print(model(x))
            """
        ),
        Valid(
            """
            def backward(grad):
                return grad

            for g in grads:
                backward(g)
            """
        ),
        Valid(  # a CPU-only script (no device but the CPU, no GPU words): CUDA AMP is not its concern
            """
            import torch
            device = torch.device("cpu")
            model = Net().to(device)
            optimizer = torch.optim.Adam(model.parameters())
            for step in range(1000):
                x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """
        ),
    ]

    INVALID = [
        Invalid(  # an AMP loop left in comments is not in use (YOLOS's engine.py)
            """
            import torch
            # with torch.cuda.amp.autocast():
            #     outputs = model(samples)
            for samples, targets in loader:
                loss = criterion(model(samples.to("cuda")), targets.to("cuda"))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
            line=4,
            fixed="""
            import torch
            # with torch.cuda.amp.autocast():
            #     outputs = model(samples)
            amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
            scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)
            for samples, targets in loader:
                with torch.autocast(device_type="cuda", dtype=amp_dtype):
                    loss = criterion(model(samples.to("cuda")), targets.to("cuda"))
                    optimizer.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """,
            unsafe=True,
        ),
        Invalid(  # the loop's device is `args.device` (a `device` of another function is not)
            """
            import torch
            def train(args, model, loader, optimizer):
                for x, y in loader:
                    x, y = x.to(args.device), y.to(args.device)
                    optimizer.zero_grad()
                    loss = criterion(model(x), y)
                    loss.backward()
                    optimizer.step()
            def main():
                device = torch.device("cuda")
            """,
            line=3,
            fixed="""
            import torch
            def train(args, model, loader, optimizer):
                amp_dtype = torch.bfloat16 if torch.device(args.device).type == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
                scaler = torch.amp.GradScaler(torch.device(args.device).type, enabled=amp_dtype == torch.float16)
                for x, y in loader:
                    x, y = x.to(args.device), y.to(args.device)
                    optimizer.zero_grad()
                    with torch.autocast(device_type=torch.device(args.device).type, dtype=amp_dtype, enabled=torch.device(args.device).type == "cuda"):
                        loss = criterion(model(x), y)
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
            def main():
                device = torch.device("cuda")
            """,
            unsafe=True,
        ),
        Invalid(  # a CPU GAN that reads its samples with .numpy(): bf16 outputs would fail
            """
            import torch
            for real in loader:
                fake = G(torch.randn(64, 100))
                loss = criterion(D(fake), ones)
                loss.backward()
                opt_g.step()
                samples = fake.detach().numpy()
            torch.cuda.synchronize()
            """,
            line=2,
            message_contains=".numpy()",
        ),
        Invalid(  # the loop is ignite's: reported at the trainer, no fix
            """
            import torch
            from ignite.engine import create_supervised_trainer
            device = "cuda" if torch.cuda.is_available() else "cpu"
            trainer = create_supervised_trainer(model, optimizer, loss_fn, device=device)
            trainer.run(loader, max_epochs=10)
            """,
            line=4,
            message_contains='amp_mode="amp"',
        ),
        # A device variable, forward spread over several statements.
        Invalid(
            """
            import torch
            from torch import nn

            device = torch.device("cuda")
            model = nn.Linear(4, 2).to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            loss_fn = nn.CrossEntropyLoss()

            # training
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                optimizer.zero_grad()
                # forward
                hidden = model(x)
                loss = loss_fn(hidden, y)  # mean over the batch
                loss.backward()
                optimizer.step()
            """,
            line=10,
            fixed="""
            import torch
            from torch import nn

            device = torch.device("cuda")
            model = nn.Linear(4, 2).to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            loss_fn = nn.CrossEntropyLoss()

            # training
            amp_dtype = torch.bfloat16 if device.type == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
            scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                optimizer.zero_grad()
                # forward
                with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=device.type == "cuda"):
                    hidden = model(x)
                    loss = loss_fn(hidden, y)  # mean over the batch
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """,
            unsafe=True,
        ),
        # Epoch loop around the batch loop; clipping; the loss computed in a helper; no device
        # variable but CUDA in use; `import torch` is added.
        Invalid(
            """
            from torch import optim
            from torch.nn.utils import clip_grad_norm_


            def compute_loss(model, batch):
                x, y = batch
                return model(x.cuda()).sub(y.cuda()).pow(2).mean()


            def train(model, loader, epochs):
                opt = optim.AdamW(model.parameters())
                for epoch in range(epochs):
                    for batch in loader:
                        opt.zero_grad()
                        loss = compute_loss(model, batch)
                        loss.backward()
                        clip_grad_norm_(model.parameters(), 1.0)
                        opt.step()
            """,
            line=13,
            fixed="""
            from torch import optim
            from torch.nn.utils import clip_grad_norm_
            import torch


            def compute_loss(model, batch):
                x, y = batch
                return model(x.cuda()).sub(y.cuda()).pow(2).mean()


            def train(model, loader, epochs):
                opt = optim.AdamW(model.parameters())
                amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
                scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)
                for epoch in range(epochs):
                    for batch in loader:
                        opt.zero_grad()
                        with torch.autocast(device_type="cuda", dtype=amp_dtype):
                            loss = compute_loss(model, batch)
                        scaler.scale(loss).backward()
                        scaler.unscale_(opt)
                        clip_grad_norm_(model.parameters(), 1.0)
                        scaler.step(opt)
                        scaler.update()
            """,
            unsafe=True,
        ),
        # A hand-written clip handed the optimizer reads scaled gradients too: one unscale_
        # before the first statement that reads them (a second one would raise in torch).
        Invalid(
            """
            import torch


            def clip_gradient(optimizer, grad_clip):
                for group in optimizer.param_groups:
                    for param in group["params"]:
                        if param.grad is not None:
                            param.grad.data.clamp_(-grad_clip, grad_clip)


            model = torch.nn.Linear(4, 1).cuda()
            optimizer = torch.optim.Adam(model.parameters())
            for x, y in loader:
                loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                clip_gradient(optimizer, 5.0)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            """,
            line=13,
            fixed="""
            import torch


            def clip_gradient(optimizer, grad_clip):
                for group in optimizer.param_groups:
                    for param in group["params"]:
                        if param.grad is not None:
                            param.grad.data.clamp_(-grad_clip, grad_clip)


            model = torch.nn.Linear(4, 1).cuda()
            optimizer = torch.optim.Adam(model.parameters())
            amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
            scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)
            for x, y in loader:
                with torch.autocast(device_type="cuda", dtype=amp_dtype):
                    loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
                    optimizer.zero_grad()
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                clip_gradient(optimizer, 5.0)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            """,
            unsafe=True,
        ),
        # Gradients touched through `.grad` between backward() and step(): no fix (they would
        # be read scaled), the finding stays.
        Invalid(
            """
            import torch

            model = torch.nn.Linear(4, 1).cuda()
            optimizer = torch.optim.Adam(model.parameters())
            for x, y in loader:
                loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                for p in model.parameters():
                    p.grad.clamp_(-1, 1)
                optimizer.step()
            """,
            line=5,
            message_contains="training loop runs in fp32",
        ),
        # Gradient accumulation: step, update (and clipping) stay under the `if`.
        Invalid(
            """
            import torch

            dev = "cuda" if torch.cuda.is_available() else "cpu"
            optimizer = torch.optim.Adam(model.parameters())
            for i, (x, y) in enumerate(loader):
                out = model(x.to(dev))
                loss = criterion(out, y.to(dev)) / accum
                (loss).backward()
                if (i + 1) % accum == 0:
                    torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
                    optimizer.step()
                    optimizer.zero_grad()
            """,
            line=5,
            fixed="""
            import torch

            dev = "cuda" if torch.cuda.is_available() else "cpu"
            optimizer = torch.optim.Adam(model.parameters())
            amp_dtype = torch.bfloat16 if torch.device(dev).type == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
            scaler = torch.amp.GradScaler(torch.device(dev).type, enabled=amp_dtype == torch.float16)
            for i, (x, y) in enumerate(loader):
                with torch.autocast(device_type=torch.device(dev).type, dtype=amp_dtype, enabled=torch.device(dev).type == "cuda"):
                    out = model(x.to(dev))
                    loss = criterion(out, y.to(dev)) / accum
                scaler.scale(loss).backward()
                if (i + 1) % accum == 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
                    scaler.step(optimizer)
                    scaler.update()
                    optimizer.zero_grad()
            """,
            unsafe=True,
        ),
        # A GAN: two optimizers, two backward calls, one scaler and one update per iteration.
        Invalid(
            """
            import torch

            device = torch.device("cuda")
            opt_d = torch.optim.Adam(D.parameters())
            opt_g = torch.optim.Adam(G.parameters())
            for real in loader:
                real = real.to(device)
                opt_d.zero_grad()
                fake = G(torch.randn(real.size(0), 64, device=device))
                loss_d = crit(D(real), ones) + crit(D(fake.detach()), zeros)
                loss_d.backward()
                opt_d.step()
                opt_g.zero_grad()
                loss_g = crit(D(fake), ones)
                loss_g.backward()
                opt_g.step()
            """,
            line=6,
            fixed="""
            import torch

            device = torch.device("cuda")
            opt_d = torch.optim.Adam(D.parameters())
            opt_g = torch.optim.Adam(G.parameters())
            amp_dtype = torch.bfloat16 if device.type == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
            scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
            for real in loader:
                real = real.to(device)
                opt_d.zero_grad()
                with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=device.type == "cuda"):
                    fake = G(torch.randn(real.size(0), 64, device=device))
                    loss_d = crit(D(real), ones) + crit(D(fake.detach()), zeros)
                scaler.scale(loss_d).backward()
                scaler.step(opt_d)
                opt_g.zero_grad()
                with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=device.type == "cuda"):
                    loss_g = crit(D(fake), ones)
                scaler.scale(loss_g).backward()
                scaler.step(opt_g)
                scaler.update()
            """,
            unsafe=True,
        ),
        # No device variable; `scaler` is taken.
        Invalid(
            """
            import torch

            scaler = StandardScaler()
            opt = torch.optim.SGD(net.parameters(), lr=0.01)
            while True:
                opt.zero_grad()
                net(batch()).mean().backward()
                opt.step()
            torch.cuda.synchronize()
            """,
            line=5,
            fixed="""
            import torch

            scaler = StandardScaler()
            opt = torch.optim.SGD(net.parameters(), lr=0.01)
            amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
            grad_scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)
            while True:
                opt.zero_grad()
                with torch.autocast(device_type="cuda", dtype=amp_dtype):
                    loss = net(batch()).mean()
                grad_scaler.scale(loss).backward()
                grad_scaler.step(opt)
                grad_scaler.update()
            torch.cuda.synchronize()
            """,
            unsafe=True,
        ),
        # Declines: no optimizer object (manual update).
        Invalid(
            """
            import torch

            for x, y in loader:
                loss = ((w * x - y) ** 2).mean()
                loss.backward()
                with torch.no_grad():
                    w -= 0.1 * w.grad
            torch.cuda.synchronize()
            """,
            line=3,
            message_contains="no optimizer",
        ),
        # Declines: parameters also updated by hand from .grad on another path (the step is
        # under a flag; a scaler would leave the hand update with scaled gradients).
        Invalid(
            """
            import torch

            if use_opt:
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = loss_fn(model(x), y)
                loss.backward()
                if use_opt:
                    opt.step()
                else:
                    for p in model.parameters():
                        p.data.add_(p.grad, alpha=-0.1)
            torch.cuda.synchronize()
            """,
            line=5,
            message_contains="by hand",
        ),
        # Declines: LBFGS closure.
        Invalid(
            """
            import torch

            opt = torch.optim.LBFGS(model.parameters())
            for x, y in loader:
                def closure():
                    opt.zero_grad()
                    loss = loss_fn(model(x), y)
                    loss.backward()
                    return loss
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step(closure)
            torch.cuda.synchronize()
            """,
            line=4,
            message_contains="LBFGS",
        ),
        # Declines: a gradient penalty (double backward).
        Invalid(
            """
            import torch

            for real in loader:
                opt_d.zero_grad()
                real.requires_grad_(True)
                score = D(real)
                grad, = torch.autograd.grad(score.sum(), real, create_graph=True)
                loss = -score.mean() + 10 * ((grad.norm(2, dim=1) - 1) ** 2).mean()
                loss.backward()
                opt_d.step()
            torch.cuda.synchronize()
            """,
            line=3,
            message_contains="double backward",
        ),
        # Declines: two optimizers stepped under different conditions (no single update point).
        Invalid(
            """
            import torch

            for i, x in enumerate(loader):
                loss = model(x).mean()
                loss.backward()
                if i % 2:
                    opt_a.step()
                else:
                    opt_b.step()
                opt_a.zero_grad()
                opt_b.zero_grad()
            torch.cuda.synchronize()
            """,
            line=3,
            message_contains="different conditions",
        ),
        # A trainer whose step is a method called from the batch loop: reported, not rewritten.
        Invalid(
            """
            import torch
            import torch.nn.functional as F

            class Trainer:
                def _run_batch(self, source, targets):
                    self.optimizer.zero_grad()
                    loss = F.cross_entropy(self.model(source), targets)
                    loss.backward()
                    self.optimizer.step()

                def train(self, loader):
                    for source, targets in loader:
                        self._run_batch(source.to("cuda"), targets.to("cuda"))
            """,
            line=5,
            message_contains="the step runs in _run_batch()",
        ),
        # apex amp at O0 is pure fp32 (FloWaveNet's train_apex.py): reported, no fix.
        Invalid(
            """
            import torch
            from apex import amp

            model, optimizer = amp.initialize(model, optimizer, opt_level="O0")
            for x, y in loader:
                optimizer.zero_grad()
                loss = model(x.cuda()).mean()
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
            """,
            line=5,
            message_contains='opt_level="O0"',
        ),
        # The step an ignite Engine runs on every batch (Glow): the script's own, reported.
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            from ignite.engine import Engine

            def main(model, optimizer, loader):
                def step(engine, batch):
                    optimizer.zero_grad()
                    x, y = batch
                    loss = F.cross_entropy(model(x.to("cuda")), y.to("cuda"))
                    loss.backward()
                    optimizer.step()

                Engine(step).run(loader, max_epochs=2)
            """,
            line=6,
            message_contains="run by an ignite Engine on every batch",
        ),
        # Declines: BCELoss on probabilities.
        Invalid(
            """
            import torch
            import torch.nn as nn

            criterion = nn.BCELoss()
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(torch.sigmoid(model(x)), y)
                loss.backward()
                optimizer.step()
            torch.cuda.synchronize()
            """,
            line=5,
            message_contains="BCEWithLogitsLoss",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        facts = self.facts
        if facts.names_torch_amp or not _torch_program(self):
            return
        if library_handles_precision(self):
            return
        fp32_apex = None
        if facts.other_precision:
            # the script's own precision scheme (apex amp, .half() model, loss scaling) is left
            # alone, unless its apex leaves the training in fp32 (O0, or only when asked)
            fp32_apex = fp32_beside_apex(facts.module, facts.source)
            if fp32_apex is None:
                return
        elif runs_apex(facts.source) or self.context.program.base_class_text_says(runs_apex):
            return  # apex through another name, or a project base class's (`enable_apex()`)
        elif self.context.program.importer_text_says(drives_its_own_precision):
            return  # the driver wraps this module's training in its own fp16 (HigherHRNet)
        if self.context.program.cpu_only:
            return  # a CPU-only program: CUDA mixed precision is not its concern
        program = self.context.program
        if _float64_default(facts.source) or program.importer_text_says(_float64_default):
            return  # autocast only casts float32: the float64 goes first (AO203)
        if facts.device.gpu_path:
            for trainer in library_trainer_calls(self):
                if arg(trainer, "amp_mode") is None:
                    self.report(
                        trainer,
                        f'{self.message} (not fixed: pass amp_mode="amp", scaler=True to '
                        "ignite's create_supervised_trainer)",
                    )
        loops = facts.innermost_training_loops
        step_functions = list(facts.step_functions)
        # the step an ignite `Engine(step)` runs on every batch (Glow): the script's own
        engine_steps = engine_step_functions(self)
        step_functions += [f for f in engine_steps if all(f is not g for g in step_functions)]
        program = self.context.program
        if program.runs_on_cuda or program.serves_cuda_training:
            # steps that a loop of another module runs (`agent.learn()` from main.py)
            step_functions += [
                f for f in program.steps_run_elsewhere if all(f is not g for g in step_functions)
            ]
        if (loops or step_functions) and is_hogwild(self):
            return
        if fp32_apex is not None:
            for where in [*step_functions, *loops]:
                self.report(where, f"{self.message} (fix declined: {fp32_apex})")
            return
        for func in step_functions:
            caller = (
                "run by an ignite Engine on every batch"
                if any(func is f for f in engine_steps)
                else "called from the training loop"
            )
            self.report(
                func,
                f"{self.message} (fix declined: the step runs in {func.name.value}(), {caller}; "
                "put its forward pass and loss under torch.autocast and scale the loss by hand)",
            )
        for loop, backward_calls in loops.items():
            plan = AutocastPlan(self, loop, backward_calls)
            reason = plan.build()
            if reason is not None:
                self.report(loop, f"{self.message} (fix declined: {reason})")
            else:
                self.report(loop, fix=plan.fix())


def _torch_program(rule: Rule) -> bool:
    """The file is torch code: it names torch, or the project modules it imports do (SPADE's
    trainer steps a model of another module and never writes `torch`; a Chainer or MXNet
    script, whose `loss.backward()` looks the same, reaches no torch)."""
    if "torch" in rule.context.source:
        return True
    return rule.context.program.reaches_text_that_says(lambda text: "torch" in text)


def _float64_default(text: str) -> bool:
    """The text makes float64 torch's default dtype, not behind an `if` (hgcn's
    `--double-precision` flag leaves it off): `torch.set_default_dtype(torch.float64)`, or
    through a name bound to it (`dtype = torch.float64`, PyTorch-RL)."""
    if "set_default_dtype" not in text:
        return False
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    float64 = {"float64", "double"}
    bound = {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and _dtype_name(n.value) in float64
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    return _unconditional_default(tree, float64, bound)


def _dtype_name(node: ast.AST) -> str | None:
    """`float64` for `torch.float64` or `float64`; the name for a plain name."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def _unconditional_default(node: ast.AST, float64: set[str], bound: set[str]) -> bool:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If | ast.IfExp | ast.Try):
            continue  # on some runs only
        if (
            isinstance(child, ast.Call)
            and _dtype_name(child.func) == "set_default_dtype"
            and child.args
            and (
                _dtype_name(child.args[0]) in float64
                or (isinstance(child.args[0], ast.Name) and child.args[0].id in bound)
            )
        ):
            return True
        if _unconditional_default(child, float64, bound):
            return True
    return False
