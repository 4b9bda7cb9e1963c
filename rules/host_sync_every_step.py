"""AO702: a host-device synchronisation on every training step."""

from __future__ import annotations

import functools

import libcst as cst

from autoopt.lint.engine.rule import Invalid, Rule, Valid
from autoopt.lint.program.facts import FileFacts, local_callee
from autoopt.lint.program.handled import engine_step_functions
from autoopt.lint.program.index import HOST_READS
from autoopt.lint.program.torch_api import TENSOR_FACTORIES
from autoopt.lint.tree.calls import arg
from autoopt.lint.tree.nodes import (
    calls_in,
    code_of,
    contains,
    int_literal,
    is_name,
    method_name,
    names_in,
    nodes_of_type,
    walk,
)

_CONVERSIONS = ("float", "int")
# Checks whose result a condition reads on the host (`if torch.isnan(loss).any():`).
_CHECKS = ("isnan", "isinf", "isfinite")
# The same checks, and the reductions a check ends in, called as the loss's methods
_METHOD_CHECKS = frozenset({*_CHECKS, "any", "all"})
_VALUE_ITERATORS = ("items", "values", "parameters", "named_parameters")
_METADATA = ("shape", "size", "ndim", "dim", "dtype", "device")
_KEPT_ADVICE = {
    "appended": "to append to a history; append loss.detach() and read the values once per epoch",
    "accumulated": "to add to a running metric; accumulate loss.detach() on the device and call "
    ".item() when logging",
}
# Loggers that read a tensor they are handed on the host (TensorBoard, tqdm).
_LOGGING_METHODS = frozenset(
    {"add_scalar", "add_scalars", "set_postfix", "set_postfix_str", "set_description"}
)


class HostSyncEveryStep(Rule):
    """
    ## What it does
    Flags, inside the step loop of training (the innermost loop that calls `backward()`, or a
    step function such as `_run_batch` called from a batch loop or run by ignite's
    `Engine(train_step)`, or a loop that hands its loss and optimizer to a callable running
    backward and step, timm's `loss_scaler(loss, optimizer, ...)`), calls that copy a tensor to
    the host on every step: `.item()`, `.cpu()`, `.tolist()`, and `print(loss)` of the tensor
    that is back-propagated, `float(loss)` / `int(loss)`, `"%.3f" % loss` (the `%`
    formatting reads it with float(), whatever takes the text: `logging.info(...)`), a
    `torch.isnan/isinf/isfinite(...)` check read by an `if`, `while` or `assert` (its truth
    value is read on the host: `if torch.isnan(loss).any(): raise ...`; also in method form
    on the loss: `loss.isnan().any()`, `loss.ne(loss).any()`); also `total += loss.item()`,
    `meter.update(loss.item())` and `history.append(loss.item())`, a running metric or a
    history read on the host every step (keep `loss.detach()` and read it once per epoch),
    also in a loop over the step's own values inside the step loop (`for k, v in
    losses.items():`, or the keys of the dict the step returns: VoteNet's `for key in
    end_points: stat_dict[key] += end_points[key].item()`). A Lightning `training_step` is a
    step function too. A call, on every step, of a function of the project that reads a tensor
    on the host outside any `if` of its own (glow-tts's `commons.clip_grad_value_(...)`, its
    `.item()` per parameter), or in a method of the same object it calls every time
    (ChangeFormer's `_collect_running_batch_states()` calling `self._update_metric()`), is
    reported at the call, naming where the read is.

    ## Why
    CUDA runs asynchronously: the Python loop normally queues the next step's kernels while
    the GPU still computes the current one. Reading a value on the host waits for all queued
    work to finish, so each step starts with an idle GPU and ends with an idle CPU; on small
    and medium models this costs 5–30% of throughput. Logging every N steps (or keeping a
    running sum on the device) removes the stall from the other N-1 steps.

    ## When not to
    - A CPU-only script: no device runs ahead of the host, so there is nothing to wait for.
    - Under a logging condition: inside an `if` whose test uses `%` or `==`
      (`if step % 100 == 0:`, `if i == 0:`, or names bound to such tests: `late = step % 2000
      == 0; if early or late:`) — logging every N steps is fine. An `if` that
      runs a training step itself (`.backward()` in its body: a GAN's generator step
      `if i % n_critic == 0:`) is a step schedule, not a logging condition: the sync there
      is paid on every step it runs. Nor is a test of which process this is (`if args.rank %
      ngpus_per_node == 0:`, `if local_rank == 0:`): that process reads on every step. A
      test against a logging interval or the time of the last log is one (vicreg's `if
      args.rank == 0 and current_time - last_logging > args.log_freq_time:`). A comparison
      with a string is a configuration's choice, not a clock (`if args.task == "regression":`
      runs on every step or on none: cgcnn), and a loop of the step's own over a `range`
      (`for idx in range(num_stages):` reading each stage's loss, HigherHRNet) runs on every
      step.
    - A running metric kept on the device (`total += loss.detach()`, `.item()` when logging).
      AO402's fix writes that form (`total += loss.detach()`), so the two never disagree.
    - Once per epoch (in the epoch loop, after the step loop), in evaluation loops, and in
      nested helper functions. A step function (backward outside any loop of its own) counts
      when a loop runs it, in this file or in a module of the project that imports it.
    - A value the algorithm needs on the host: an RL action handed to an environment's
      `env.step(action)` (`q.argmax().cpu().numpy()`); also a model's forward that reads on
      the host (`lengths.cpu()` to pack sequences): that is the model's computation.

    ## Fix
    None: whether a value is needed on every step is the user's call.
    """

    code = "AO702"
    name = "host-sync-every-step"
    message = "host-device sync on every training step; log every N steps instead"
    fix_reason = "whether a value is needed on the host every step is the user's call"
    # No text pre-filter of the syncs themselves: a step loop may read on the host only through
    # a helper of another module (`commons.clip_grad_value_(...)`).
    # `zero_grad(`: a loop whose backward runs in a callable it hands loss and optimizer to
    requires = ((".backward(", "zero_grad(", "def training_step"),)

    VALID = [
        Valid(  # rank 0 logs once every `log_freq_time` seconds (vicreg)
            """
            import time
            import torch
            for step, (x, y) in enumerate(loader):
                loss = model(x.cuda(), y.cuda())
                loss.backward()
                optimizer.step()
                current_time = time.time()
                if args.rank == 0 and current_time - last_logging > args.log_freq_time:
                    print(dict(step=step, loss=loss.item()))
                    last_logging = current_time
            """
        ),
        Valid(  # `.data[0]` of something that is no loss (a batch's first sample), and of the
            # loss under a logging condition
            """
            import torch
            model = Net().cuda()
            for i, (x, y) in enumerate(loader):
                optimizer.zero_grad()
                loss = loss_fn(model(x.cuda()), y.cuda())
                loss.backward()
                optimizer.step()
                first = x.data[0]
                if i % 100 == 0:
                    print(loss.data[0])
            """
        ),
        Valid(  # the NaN check under a logging condition, and one in the `if`'s body only
            """
            import torch
            device = torch.device("cuda")
            for step, x in enumerate(loader):
                loss = model(x.to(device)).sum()
                loss.backward()
                optimizer.step()
                if step % 100 == 0 and torch.isnan(loss).any():
                    raise RuntimeError("NaN loss")
                if debug:
                    bad = torch.isnan(loss)
            """
        ),
        Valid(  # once per epoch: the loop around the data loop iterates no loader
            """
            import torch
            device = torch.device("cuda")
            for epoch in range(10):
                batches = make_batches()
                for x in batches:
                    loss = model(x.to(device)).sum()
                    loss.backward()
                    optimizer.step()
                print(loss.item())
            """
        ),
        Valid(  # an evaluation step run by an Engine: no backward, not a training step
            """
            from ignite.engine import Engine
            def eval_step(engine, batch):
                x, y = batch
                return {"loss": criterion(model(x), y).item()}
            def train_step(engine, batch):
                loss = criterion(model(batch[0]), batch[1])
                loss.backward()
            evaluator = Engine(eval_step)
            """
        ),
        Valid(
            """
            for step, (x, y) in enumerate(loader):
                loss = loss_fn(model(x), y)
                loss.backward()
                if step % 100 == 0:
                    print(f"step {step}: {loss.item():.4f}")
            """
        ),
        Valid(  # a shape is host metadata: int() of it reads nothing back (self-critical)
            """
            import torch
            for x, y in loader:
                loss = criterion(model(x.to(device)), y.to(device))
                loss = torch.topk(loss, k=int(loss.shape[0] * 0.9), largest=False)[0].mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # the step is timed: synchronize() first, so the read waits for nothing more
            """
            import time
            import torch
            for step in range(max_steps):
                t0 = time.time()
                x, y = next_batch()
                loss = model(x.to(device), y.to(device))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                torch.cuda.synchronize()
                print(f"step {step} | loss {loss.item():.4f} | dt {time.time() - t0:.3f}s")
            """
        ),
        Valid(  # a pass over other batches inside the step loop is an evaluation, not the
            # step's own logging (only loops over the step's values count: `.items()`)
            """
            for x, y in loader:
                loss = loss_fn(model(x.to(device)), y.to(device))
                loss.backward()
                optimizer.step()
                for xv, yv in probe_batches:
                    correct += (model(xv).argmax(1) == yv).sum().item()
            """
        ),
        Valid(  # the helper reads on the host only on logging steps (its own condition, or the
            # caller's)
            """
            class Trainer:
                def record(self, step, loss):
                    if step % self.log_every == 0:
                        self.history.append(loss.item())

                def record_norms(self):
                    self.norms.append(self.model.weight.grad.norm().item())

                def train(self, loader):
                    for step, (x, y) in enumerate(loader):
                        loss = self.loss_fn(self.model(x), y)
                        loss.backward()
                        self.record(step, loss)
                        if step % 100 == 0:
                            self.record_norms()
                        self.optimizer.step()
            model.to(device)
            """
        ),
        Valid(
            """
            total = 0.0
            for x, y in loader:
                loss = loss_fn(model(x), y)
                loss.backward()
                total += loss.detach()
            print(total.item())
            """
        ),
        Valid(
            """
            for step, (x, y) in enumerate(loader):
                loss = loss_fn(model(x), y)
                loss.backward()
                if step % 100 == 0:
                    total += loss.item()
            """
        ),
        Valid(
            """
            for epoch in range(10):
                for x, y in loader:
                    loss = loss_fn(model(x), y)
                    loss.backward()
                print(epoch, loss.item())
            """
        ),
        Valid(  # float() of a Python number, and of the loss under a logging condition
            """
            for step, (x, y) in enumerate(loader):
                loss = loss_fn(model(x), y)
                loss.backward()
                lr = float(scheduler.get_last_lr()[0])
                if step % 50 == 0:
                    print(float(loss))
            """
        ),
        Valid(  # a Lightning validation step is not a training step
            """
            import lightning as L
            class Model(L.LightningModule):
                def validation_step(self, batch, batch_idx):
                    self.log("val", self.loss(self(batch)).item())
            """
        ),
        Valid(  # the logger is handed a host value, or the loss's shape
            """
            for step, x in enumerate(loader):
                loss = model(x).mean()
                loss.backward()
                writer.add_scalar("lr", scheduler.get_last_lr()[0], step)
                pbar.set_postfix(shape=str(loss.shape))
            model.to(device)
            """
        ),
        Valid(  # a CPU-only script: no device runs ahead, the read waits for nothing
            """
            for x, y in loader:
                loss = loss_fn(model(x), y)
                loss.backward()
                history.append(loss.item())
            """
        ),
        Valid(  # once per epoch, after a function that runs the whole step loop
            """
            def train(loader):
                for x, y in loader:
                    loss_fn(model(x), y).backward()
                return loss

            for epoch in range(10):
                loss = train(loader)
                print(epoch, loss.item())
            """
        ),
        Valid(
            """
            model.eval()
            for x, y in val_loader:
                preds.append(model(x).argmax(1).cpu())
            """
        ),
        Valid(  # training predictions collected on the host for a metric: not the loss
            """
            for x, y in loader:
                out = model(x)
                loss_fn(out, y).backward()
                preds.append(out.argmax(1).cpu())
                optimizer.step()
            model.to(device)
            """
        ),
        Valid(  # an RL action for the environment: the host value is the algorithm's
            """
            import torch
            for global_step in range(total_timesteps):
                q_values = q_network(torch.Tensor(obs).to(device))
                actions = torch.argmax(q_values, dim=1).cpu().numpy()
                next_obs, rewards, dones, infos = envs.step(actions)
                obs = next_obs
                loss = ((q_network(batch.obs) - batch.target) ** 2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # the logging condition bound to names first (monodepth2)
            """
            for batch_idx, (x, y) in enumerate(loader):
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                early_phase = batch_idx % 250 == 0 and step < 2000
                late_phase = step % 2000 == 0
                if early_phase or late_phase:
                    log_time(batch_idx, loss.cpu().data)
                step += 1
            model.to(device)
            """
        ),
        Valid(  # a helper of the file that syncs, called only under a logging condition
            """
            def log_metrics(loss):
                print(loss.item())
            for step, (x, y) in enumerate(loader):
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                if step % 100 == 0:
                    log_metrics(loss)
            model.to(device)
            """
        ),
        Valid(  # host tensors made for a plot in a helper run every step (ssd.pytorch)
            """
            import torch
            def update_plot(it, loc):
                viz.line(X=torch.ones((1, 3)).cpu() * it, Y=torch.Tensor([loc]).unsqueeze(0).cpu())
            for x, y in loader:
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                update_plot(step, 1.0)
            model.to(device)
            """
        ),
        Valid(  # the same text every 100 steps
            """
            import logging
            import torch
            for step, (volume, label) in enumerate(trainloader):
                loss = criterion(model(volume.cuda()), label.cuda())
                loss.backward()
                optimizer.step()
                if step % 100 == 0:
                    logging.info("step %d: loss %.3f" % (step, loss))
            """
        ),
        Valid(  # a string of other values: no tensor is formatted
            """
            import logging
            import torch
            for step, (volume, label) in enumerate(trainloader):
                loss = criterion(model(volume.cuda()), label.cuda())
                loss.backward()
                optimizer.step()
                logging.info("step %d of %s" % (step, name))
            """
        ),
    ]
    INVALID = [
        Invalid(  # a configuration's choice, not a clock: its arm runs on every step (cgcnn)
            """
            for x, y in loader:
                loss = criterion(model(x.cuda()), y.cuda())
                if args.task == "regression":
                    losses.update(loss.data.cpu(), y.size(0))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
            line=4,
        ),
        Invalid(  # a loop over the stages' losses, inside the step: run on every step
            """
            for images, target in loader:
                losses = criterion(model(images.cuda()), target.cuda())
                loss = 0
                for idx in range(num_stages):
                    if losses[idx] is not None:
                        meters[idx].update(losses[idx].item(), images.size(0))
                        loss = loss + losses[idx]
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
            line=6,
        ),
        Invalid(  # the first process of each node reads the loss on every step (bts)
            """
            import torch
            for step, batch in enumerate(loader):
                loss = model(batch.cuda()).mean()
                loss.backward()
                optimizer.step()
                if args.rank % ngpus_per_node == 0:
                    print("loss", loss.cpu().item())
            """,
            line=7,
        ),
        Invalid(  # a step method hands its metrics to a helper that reads them (GPT2)
            """
            import torch
            class Trainer:
                def _to_value(self, tensor):
                    if self.distributed:
                        return (tensor / self.gpus).item()
                    else:
                        return tensor.item()
                def _train_step(self, model, optimizer, data):
                    optimizer.zero_grad()
                    metrics = {"loss": model(data.cuda()).mean()}
                    metrics["loss"].backward()
                    optimizer.step()
                    return {k: self._to_value(v) for k, v in metrics.items()}
                def train(self, model, optimizer, loader):
                    for step in range(1000):
                        self.recorder.record(self._train_step(model, optimizer, next(loader)))
            """,
            line=13,
            message_contains="self._to_value() reads a tensor on the host",
        ),
        Invalid(  # summed over the keys of the dict the step returns (VoteNet's end_points)
            """
            import torch
            device = torch.device("cuda")
            for batch in loader:
                end_points = net(batch.to(device))
                loss, end_points = criterion(end_points)
                loss.backward()
                optimizer.step()
                for key in end_points:
                    if "loss" in key:
                        stat_dict[key] += end_points[key].item()
            """,
            line=10,
            message_contains="running metric",
        ),
        Invalid(  # read in the iterable of a loop inside the step (lxmert's train accuracy)
            """
            import torch
            for ids, x, target in train_loader:
                logit = model(x.cuda())
                loss = criterion(logit, target.cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                for qid, l in zip(ids, logit.argmax(1).cpu().numpy()):
                    answers[qid] = l
            """,
            line=8,
        ),
        Invalid(  # over the step's loss terms by name (FairMOT's `for l in avg_loss_stats`)
            """
            import torch
            for batch in train_loader:
                loss, loss_stats = model(batch["input"].cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                for l in avg_loss_stats:
                    avg_loss_stats[l].update(loss_stats[l].mean().item())
            """,
            line=8,
        ),
        Invalid(  # torch < 0.4's `.data[0]` of the loss, printed every step (WassersteinGAN)
            """
            import torch
            model = Net().cuda()
            for x, y in loader:
                optimizer.zero_grad()
                errD = loss_fn(model(x.cuda()), y.cuda())
                errD.backward()
                optimizer.step()
                print(errD.data[0])
            """,
            line=8,
            message_contains=".data[0]",
        ),
        Invalid(  # a NaN guard read by an `if` on every step (diffwave's learner)
            """
            import torch
            device = torch.device("cuda")
            for x in loader:
                loss = model(x.to(device)).sum()
                loss.backward()
                optimizer.step()
                if torch.isnan(loss).any():
                    raise RuntimeError("NaN loss")
            """,
            line=7,
        ),
        Invalid(  # a metric summed on the host every step (mixup-cifar10)
            """
            for x, y in loader:
                out = model(x)
                loss = loss_fn(out, y)
                correct += out.argmax(1).eq(y).cpu().sum()
                loss.backward()
                optimizer.step()
            model.to(device)
            """,
            line=4,
        ),
        Invalid(  # a loss helper of the file that reads its metrics every step (RAFT)
            """
            def sequence_loss(pred, gt):
                loss = (pred - gt).abs().mean()
                metrics = {"epe": loss.item()}
                return loss, metrics
            for x, y in loader:
                loss, metrics = sequence_loss(model(x), y)
                loss.backward()
                optimizer.step()
            model.to(device)
            """,
            line=3,
        ),
        Invalid(  # the backward in a loop over the step's micro-batches (hysts' subdivision)
            """
            import torch
            device = torch.device("cuda")
            for step, (data, targets) in enumerate(train_loader):
                data_chunks, target_chunks = data.chunk(4), targets.chunk(4)
                for data_chunk, target_chunk in zip(data_chunks, target_chunks):
                    loss = loss_fn(model(data_chunk.to(device)), target_chunk.to(device))
                    loss.backward()
                optimizer.step()
                loss = loss.item()
            """,
            line=9,
        ),
        Invalid(  # backward and step inside timm's NativeScaler: loss_scaler(loss, optimizer) (MAE)
            """
            def train_one_epoch(model, data_loader, optimizer, loss_scaler):
                optimizer.zero_grad()
                for samples, _ in data_loader:
                    loss = model(samples)
                    loss_value = loss.item()
                    loss_scaler(loss, optimizer, parameters=model.parameters())
                    optimizer.zero_grad()
            model.to(device)
            """,
            line=5,
        ),
        Invalid(  # the step function ignite's Engine runs once per batch (ignite's cifar10)
            """
            from ignite.engine import Engine
            def train_step(engine, batch):
                x, y = batch
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                return {"batch loss": loss.item()}
            trainer = Engine(train_step)
            model.to(device)
            """,
            line=7,
        ),
        # A running metric: `.item()` every step (AO402's fix writes `.detach()` instead).
        Invalid(
            """
            total = 0.0
            for x, y in loader:
                loss = loss_fn(model(x), y)
                loss.backward()
                total += loss.item()
            model.to(device)
            """,
            line=5,
            message_contains="accumulate loss.detach()",
        ),
        Invalid(
            """
            for x, y in loader:
                loss = loss_fn(model(x), y)
                loss.backward()
                losses_m.update(loss.item(), x.size(0))
            model.to(device)
            """,
            line=4,
            message_contains="accumulate loss.detach()",
        ),
        Invalid(  # a per-step history read on the host every step (Informer)
            """
            for x, y in loader:
                loss = loss_fn(model(x), y)
                train_loss.append(loss.item())
                loss.backward()
            model.to(device)
            """,
            line=3,
            message_contains="append loss.detach()",
        ),
        Invalid(  # the loss copied to the host for a history (TextCNN's run_epoch)
            """
            for x, y in loader:
                loss = loss_fn(model(x), y)
                loss.backward()
                losses.append(loss.data.cpu().numpy())
                optimizer.step()
            model.to(device)
            """,
            line=4,
            message_contains="append loss.detach()",
        ),
        Invalid(  # float() of the loss tensor is .item() (PyG's reddit example)
            """
            for batch in loader:
                loss = loss_fn(model(batch), batch.y)
                loss.backward()
                total_loss += float(loss) * batch.num_graphs
            model.to(device)
            """,
            line=4,
        ),
        Invalid(  # TensorBoard and tqdm read the loss tensor on the host (pytorch-ddpm)
            """
            for step, x in enumerate(loader):
                loss = model(x).mean()
                loss.backward()
                writer.add_scalar("loss", loss, step)
                pbar.set_postfix(loss="%.3f" % loss)
            model.to(device)
            """,
            line=4,
            message_contains="add_scalar",
        ),
        Invalid(  # Lightning runs training_step once per batch
            """
            import lightning as L
            class Model(L.LightningModule):
                def training_step(self, batch, batch_idx):
                    loss = self.loss(self(batch))
                    self.log_dict({"loss": loss.item()})
                    return loss
            model.to(device)
            """,
            line=5,
        ),
        Invalid(  # the generator's step every n_critic batches, printed each time (wgan_gp)
            """
            for i, (imgs, _) in enumerate(dataloader):
                d_loss = critic_loss(imgs)
                d_loss.backward()
                optimizer_D.step()
                if i % n_critic == 0:
                    g_loss = generator_loss()
                    g_loss.backward()
                    optimizer_G.step()
                    print("[D loss: %f] [G loss: %f]" % (d_loss.item(), g_loss.item()))
            model.to(device)
            """,
            line=9,
        ),
        Invalid(  # a NaN test in method form read by the `if` (SimpleView)
            """
            import torch
            for x, y in loader:
                loss = criterion(model(x.cuda()), y.cuda())
                if loss.ne(loss).any():
                    continue
                loss.backward()
                optimizer.step()
            """,
            line=4,
            message_contains="read as a condition",
        ),
        Invalid(  # `%` formatting reads the loss with float(), whatever takes the text (MC-Net)
            """
            import logging
            import torch
            for volume, label in trainloader:
                loss = criterion(model(volume.cuda()), label.cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                logging.info("iteration %d : loss : %03f" % (iter_num, loss))
            """,
            line=8,
            message_contains="`%` formatting of the loss tensor",
        ),
        # The backward runs in a step helper; the meter update stays in the batch loop (timm).
        Invalid(
            """
            def train_one_epoch(model, loader):
                def _backward(loss):
                    loss.backward()
                    optimizer.step()
                for x, y in loader:
                    loss = loss_fn(model(x), y)
                    _backward(loss)
                    losses_m.update(loss.item(), x.size(0))
            model.to(device)
            """,
            line=8,
            message_contains="accumulate loss.detach()",
        ),
        # The step runs in a method called from the batch loop.
        Invalid(
            """
            class Trainer:
                def _run_batch(self, x, y):
                    loss = self.loss_fn(self.model(x), y)
                    loss.backward()
                    self.optimizer.step()
                    print(loss.item())

                def train(self, loader):
                    for x, y in loader:
                        self._run_batch(x, y)
            model.to(device)
            """,
            line=6,
        ),
        Invalid(
            """
            for x, y in loader:
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                print(loss)
            model.to(device)
            """,
            line=6,
        ),
        Invalid(  # a synchronize at the step's start does not make a later read free
            """
            import torch
            for step in range(max_steps):
                torch.cuda.synchronize()
                x, y = next_batch()
                loss = model(x.to(device), y.to(device))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                print(f"step {step} | loss {loss.item():.4f}")
            """,
            line=9,
        ),
        Invalid(  # the backward runs in a loss scaler: the synchronize is the step's own sync
            """
            import torch
            for idx, (samples, targets) in enumerate(data_loader):
                loss = criterion(model(samples.cuda()), targets.cuda())
                grad_norm = loss_scaler(loss, optimizer, parameters=model.parameters())
                optimizer.zero_grad()
                torch.cuda.synchronize()
                loss_meter.update(loss.item(), targets.size(0))
            """,
            line=7,
        ),
        # The step loop steps after a loop of micro-batch backwards (lucidrains' PaLM).
        Invalid(
            """
            for i in range(num_batches):
                for __ in range(GRADIENT_ACCUMULATE_EVERY):
                    loss = model(next(train_loader).to(device))
                    loss.backward()
                print(f"training loss: {loss.item()}")
                optim.step()
                optim.zero_grad()
            """,
            line=5,
        ),
        # A loop over the step's losses, inside the step loop; the generator's step every
        # n_critic batches is a step schedule, not a logging condition.
        Invalid(
            """
            def train_D(x):
                loss = d_loss(D(x), D(G(z())))
                loss.backward()
                D_optimizer.step()
                return {"d_loss": loss}

            def train_G():
                loss = g_loss(D(G(z())))
                loss.backward()
                G_optimizer.step()
                return {"g_loss": loss}

            for it, x in enumerate(loader):
                d_losses = train_D(x.to(device))
                for k, v in d_losses.items():
                    writer.add_scalar(k, v.cpu(), it)
                if it % n_critic == 0:
                    g_losses = train_G()
                    for k, v in g_losses.items():
                        writer.add_scalar(k, v.cpu().numpy(), it)
            """,
            line=20,
        ),
        # A helper that reads every gradient norm on the host, run on every step: reported at
        # the call (the same holds for a helper in another module of the project: glow-tts's
        # `commons.clip_grad_value_`).
        Invalid(
            """
            class Trainer:
                def record_grad_norms(self):
                    for p in self.model.parameters():
                        self.norms.append(p.grad.norm().item())

                def train(self, loader):
                    for x, y in loader:
                        loss = self.loss_fn(self.model(x), y)
                        loss.backward()
                        self.record_grad_norms()
                        self.optimizer.step()
            model.to(device)
            """,
            line=10,
            message_contains="record_grad_norms() reads a tensor on the host",
        ),
        Invalid(
            """
            for i, (x, y) in enumerate(loader):
                out = model(x)
                loss = loss_fn(out, y)
                loss.backward()
                bar.set_postfix(loss=loss.item(), acc=(out.argmax(1) == y).float().mean().cpu())
            model.to(device)
            """,
            line=5,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        name = method_name(node)
        builtin = node.func.value if isinstance(node.func, cst.Name) else None
        # print(loss), writer.add_scalar("loss", loss, step), pbar.set_postfix(loss=loss)
        is_print = builtin == "print" or (builtin is None and name in _LOGGING_METHODS)
        converts = builtin in _CONVERSIONS
        if name not in HOST_READS and not is_print and not converts:
            if not self._check_read_as_a_condition(node):
                self._check_callee(node)
            return
        if builtin is not None and not self.refers_to(node.func, f"builtins.{builtin}"):
            return
        if self._cpu_only:
            return  # nothing runs ahead of the host: reading a value waits for nothing
        if name == "cpu" and self._made_on_host(node):
            return  # `torch.ones(1, 3).cpu()`: a host tensor's copy waits for nothing
        loop = self._step_loop(node)
        if loop is None:
            return
        if converts and not self._converts_the_loss(node, loop):
            return
        kept = self._kept_on_host(node, loop)
        if kept == "logged" or self._after_a_synchronize(node, loop):
            return
        what = f"{builtin}()" if converts else f".{name}()"
        if kept is not None:  # a history or a running metric: say how to keep it on the device
            # `.cpu()` kept only of the loss itself (`losses.append(loss.data.cpu().numpy())`):
            # other tensors collected on the host may be what the loop is for
            # a running metric summed on the host (`correct += pred.eq(y).cpu().sum()`) syncs
            if (
                name == "item"
                or converts
                or (name == "cpu" and (kept == "accumulated" or self._of_the_loss(node, loop)))
            ):
                self.report(node, f"{what} syncs with the GPU every step {_KEPT_ADVICE[kept]}")
            return
        if is_print:
            losses = self._backward_names(loop)
            # the loss itself (`loss`, `'%.3f' % loss`, f"{loss}"), not an attribute of it
            printed = {
                n.value
                for a in node.args
                for n in walk(a.value)
                if isinstance(n, cst.Name) and not isinstance(self.parent(n), cst.Attribute)
            }
            has_item = any(
                isinstance(n, cst.Call) and method_name(n) in HOST_READS
                for a in node.args
                for n in walk(a.value)
            )
            if has_item or not (printed & losses):
                return  # the .item() inside reports itself; other prints are not tensors
            shown = "print()" if builtin == "print" else f".{name}()"
            self.report(node, f"{shown} of the loss tensor syncs with the GPU every step")
            return
        if name == "cpu" and self._inside_sync(node):
            return  # `.cpu().numpy()` / `.cpu().item()`: one sync, reported once
        if self._feeds_an_environment(node, loop):
            return  # the host value is the algorithm's (an RL action for `env.step`)
        self.report(node, f"{what} syncs with the GPU every training step; log every N steps")

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        """`"loss %.3f" % loss` (MC-Net's `logging.info("... %03f" % (iter_num, loss))`): `%`
        formatting reads the back-propagated tensor with float(), whatever takes the text;
        inside a print() it is that print's finding."""
        if not isinstance(node.operator, cst.Modulo) or not isinstance(
            node.left, cst.SimpleString | cst.ConcatenatedString
        ):
            return
        right = node.right
        items = [e.value for e in right.elements] if isinstance(right, cst.Tuple) else [right]
        names = {i.value for i in items if isinstance(i, cst.Name)}
        if not names or self._cpu_only:
            return
        loop = self._step_loop(node)  # type: ignore[arg-type]
        if loop is None or not names & self._backward_names(loop):
            return
        if any(
            isinstance(anc, cst.Call) and self._prints(anc)
            for anc in self.context.facts.ancestors(node)
        ):
            return
        kept = self._kept_on_host(node, loop)  # type: ignore[arg-type]
        if kept == "logged" or self._after_a_synchronize(node, loop):  # type: ignore[arg-type]
            return
        self.report(
            node,
            "`%` formatting of the loss tensor reads it with float(), a sync with the GPU every "
            "step; log every N steps",
        )

    def _prints(self, call: cst.Call) -> bool:
        """`print(...)` or a logger's method AO702 reads as printing (`writer.add_scalar`)."""
        if isinstance(call.func, cst.Name):
            return call.func.value == "print"
        return method_name(call) in _LOGGING_METHODS

    def visit_Subscript(self, node: cst.Subscript) -> None:
        """`loss.data[0]`: torch < 0.4's spelling of `loss.item()` (WassersteinGAN's
        `errD.data[0]`, deepcluster's `losses.update(loss.data[0])`), of a tensor whose
        `backward()` the step loop calls or named as a loss."""
        value = node.value
        if not (
            isinstance(value, cst.Attribute)
            and value.attr.value == "data"
            and isinstance(value.value, cst.Name)
            and len(node.slice) == 1
            and isinstance(node.slice[0].slice, cst.Index)
            and int_literal(node.slice[0].slice.value) == 0
        ):
            return
        if self._cpu_only:
            return
        loop = self._step_loop(node)  # type: ignore[arg-type]
        if loop is None:
            return
        tensor = value.value.value
        if tensor not in self._backward_names(loop) and not _named_as_a_loss(tensor):
            return
        kept = self._kept_on_host(node, loop)  # type: ignore[arg-type]
        if kept == "logged" or self._after_a_synchronize(node, loop):  # type: ignore[arg-type]
            return
        advice = (
            _KEPT_ADVICE[kept] if kept is not None else "every training step; log every N steps"
        )
        self.report(
            node,
            f".data[0] (torch < 0.4's .item()) syncs with the GPU {advice}",
        )

    def _check_read_as_a_condition(self, node: cst.Call) -> bool:
        """`if torch.isnan(loss).any(): raise ...` / `assert torch.isfinite(loss)`: a tensor
        check whose truth value the `if`, `while` or `assert` reads on the host, every step it
        runs (diffwave's NaN guard). True when `node` is such a check (reported or not)."""
        if not any(
            self.refers_to(node.func, f"torch.{check}") for check in _CHECKS
        ) and not self._checks_the_loss(node):
            return False
        test = self._test_holding(node)
        if test is None or self._cpu_only:
            return True
        if (
            isinstance(test, cst.BooleanOperation)
            and isinstance(test.operator, cst.And)
            and self._logging_condition(test.left, node)
        ):
            return True  # `if step % 100 == 0 and torch.isnan(loss).any():`
        loop = self._step_loop(node)
        if loop is None or self._kept_on_host(node, loop) == "logged":
            return True
        self.report(
            node,
            f"`{code_of(node.func)}(...)` read as a condition syncs with the GPU every training "
            "step; check every N steps (or keep the check on the device: "
            "torch._assert_async, torch.nan_to_num)",
        )
        return True

    def _checks_the_loss(self, node: cst.Call) -> bool:
        """A check in method form on the back-propagated tensor: `loss.isnan().any()`,
        SimpleView's NaN test `loss.ne(loss).any()` (the chain starts at the loss and ends in
        a reduction or a check)."""
        if method_name(node) not in _METHOD_CHECKS or not isinstance(node.func, cst.Attribute):
            return False
        root: cst.BaseExpression = node.func.value
        while isinstance(root, cst.Call | cst.Attribute):
            root = root.func if isinstance(root, cst.Call) else root.value
        if not isinstance(root, cst.Name):
            return False
        loop = self._step_loop(node)
        return loop is not None and root.value in self._backward_names(loop)

    def _test_holding(self, node: cst.CSTNode) -> cst.BaseExpression | None:
        """The test of the `if`, `while` or `assert` that `node` is part of (a node of a body
        meets its suite, or its statement, first)."""
        for anc in self.context.facts.ancestors(node):
            if isinstance(anc, cst.If | cst.While | cst.Assert):
                return anc.test
            if isinstance(anc, cst.BaseSuite | cst.BaseStatement) and not isinstance(
                anc, cst.SimpleStatementLine
            ):
                return None
        return None

    def _after_a_synchronize(self, node: cst.Call, loop: cst.CSTNode) -> bool:
        """`torch.cuda.synchronize()` runs earlier in the same step, after its backward
        (build-nanogpt times each step so): the GPU is done by then, so reading a value after
        it waits for nothing more. One before the backward (at the step's start) is no help."""
        facts = self.context.facts
        inside = list(calls_in(loop, into_scopes=False))
        backwards = [b for b in facts.backward_calls if any(b is c for c in inside)]
        if not backwards:
            return False  # the backward runs in a callable (a loss scaler): not known done
        return any(
            method_name(c) == "synchronize"
            and self.refers_to(c.func, "torch.cuda.synchronize")
            and (facts.enclosing_loops(c) or [None])[0] is loop
            and facts.before(c, node)
            and all(facts.before(b, c) for b in backwards)
            for c in inside
        )

    def _check_callee(self, node: cst.Call) -> None:
        """A project function that reads a tensor on the host, called on every step of a step
        loop here (`commons.clip_grad_value_(params)`, whose `.item()` is in commons.py):
        reported at the call, where the step runs it; also in a step function outside any
        loop of its own (GPT2's `_train_step` returning `{k: self._to_value(v) ...}`)."""
        facts = self.context.facts
        if self._cpu_only:
            return
        if not facts.enclosing_loops(node) and facts.enclosing_scope(node) not in self._steps:
            return
        found = self.context.program.host_read_in_callee(node)
        if found is None:
            return
        loop = self._step_loop(node)
        if loop is None or self._kept_on_host(node, loop) == "logged":
            return
        path, line = found
        callee = code_of(node.func)
        self.report(
            node,
            f"{callee}() reads a tensor on the host ({path}:{line}) on every training step; "
            "log every N steps",
        )

    @functools.cached_property
    def _steps(self) -> list[cst.CSTNode]:
        """The functions of the file that call backward() (outside any loop of their own):
        a step each, whose caller's loop runs them."""
        facts = self.context.facts
        return [
            facts.enclosing_scope(b) for b in facts.backward_calls if not facts.enclosing_loops(b)
        ]

    @property
    def _cpu_only(self) -> bool:
        return self.context.program.cpu_only

    def _converts_the_loss(self, node: cst.Call, loop: cst.CSTNode) -> bool:
        """`float(loss)`, `int(loss.detach())`: a conversion of the back-propagated tensor
        (reading a Python number back costs nothing; an `.item()` inside reports itself)."""
        if len(node.args) != 1:
            return False
        value = node.args[0].value
        if any(isinstance(n, cst.Call) and method_name(n) in HOST_READS for n in walk(value)):
            return False
        # `int(loss.shape[0] * rate)`: the shape is known on the host, nothing is read back
        names = {
            n.value for n in walk(value) if isinstance(n, cst.Name) and not self._reads_metadata(n)
        }
        return bool(names & self._backward_names(loop))

    def _reads_metadata(self, name: cst.Name) -> bool:
        """`name.shape`, `name.size(...)`, `name.ndim`, `name.dim()`: host-side metadata."""
        parent = self.parent(name)
        return isinstance(parent, cst.Attribute) and parent.attr.value in _METADATA

    def _of_the_loss(self, node: cst.Call, loop: cst.CSTNode) -> bool:
        """`loss.cpu()`, `loss.data.cpu()`, `loss.detach().cpu()`: the back-propagated tensor."""
        receiver = node.func.value if isinstance(node.func, cst.Attribute) else None
        while isinstance(receiver, cst.Attribute | cst.Call):
            if isinstance(receiver, cst.Call):
                if method_name(receiver) != "detach":
                    return False
                receiver = receiver.func
            elif receiver.attr.value in ("data", "detach"):
                receiver = receiver.value
            else:
                return False
        return isinstance(receiver, cst.Name) and receiver.value in self._backward_names(loop)

    def _step_loop(self, node: cst.Call) -> cst.CSTNode | None:
        """The innermost loop around `node` if it is a step loop (calls backward() itself, not
        only in a nested loop), or the step function `node` is in (outside any loop of it)."""
        facts = self.context.facts
        loops = facts.enclosing_loops(node)
        if loops and isinstance(loops[0], cst.For) and contains(loops[0].iter, node):
            # `for qid, l in zip(ques_id, label.cpu().numpy()):` (lxmert): the read runs once
            # per iteration of the loop around that `for`, not of the `for` itself
            loops = loops[1:]
        if not loops:
            scope = facts.enclosing_scope(node)
            steps = [*facts.step_functions, *engine_step_functions(self)]
            if any(scope is f for f in steps) or _lightning_training_step(scope):
                return scope
            # a step function that a batch loop of the project runs (`engine.train(x, y)` from
            # train.py's loop, `agent.update_parameters(...)`): the backward here, outside any
            # loop of its own, the loop in its caller
            backward_here = any(
                facts.enclosing_scope(b) is scope and not facts.enclosing_loops(b)
                for b in facts.backward_calls
            )
            if (
                backward_here
                and isinstance(scope, cst.FunctionDef)
                and self.context.program.called_in_a_loop(scope)
            ):
                return scope
            if backward_here and self._called_by_a_step(scope):
                return scope
            return self._step_loop_calling(scope)
        loop = loops[0]
        if not facts.is_training_loop(loop):
            if self._delegated_step(loop):
                return loop
            # `for k, v in losses.items(): writer.add_scalar(k, v.cpu())` in the step loop: a
            # loop over the step's own values, run on every step
            if (
                len(loops) < 2
                or not (_over_values(loop) or _over_step_output(loop, loops[1]))
                or not facts.is_training_loop(loops[1])
            ):
                return None
            loop = loops[1]
        # the loop's own step: backward() itself or a call to a step function (`_backward(loss)`)
        steps = {f.name.value for f in facts.step_functions}
        own_backward = any(
            (facts.enclosing_loops(b) or [None])[0] is loop
            or _micro_batch_loop(facts.enclosing_loops(b), loop, facts)
            for b in [
                *facts.backward_calls,
                *(c for c in facts.backward_helper_calls if local_callee(c) in steps),
            ]
        )
        return loop if own_backward else None

    def _called_by_a_step(self, scope: cst.CSTNode) -> bool:
        """`scope` is called once by a step function a loop of the project runs (CORL's
        `trainer.train(batch)` per step, calling `self._update_v(...)`, where the backward and
        `v_loss.item()` are)."""
        if not isinstance(scope, cst.FunctionDef):
            return False
        facts = self.context.facts
        steps = self.context.program.steps_run_elsewhere
        return any(
            local_callee(c) == scope.name.value
            and not facts.enclosing_loops(c)
            and any(facts.enclosing_scope(c) is step for step in steps)
            for c in facts.backward_helper_calls
        )

    def _made_on_host(self, node: cst.Call) -> bool:
        """`node` (`<x>.cpu()`) reads a tensor a torch factory made on the host just before
        (`torch.ones((1, 3)).cpu()`, `torch.Tensor([a, b]).unsqueeze(0).cpu()`)."""
        receiver = node.func.value if isinstance(node.func, cst.Attribute) else None
        while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
            if self.is_call_to(receiver, *TENSOR_FACTORIES, "torch.Tensor"):
                break
            receiver = receiver.func.value
        return (
            isinstance(receiver, cst.Call)
            and self.is_call_to(receiver, *TENSOR_FACTORIES, "torch.Tensor")
            and arg(receiver, "device") is None
        )

    def _step_loop_calling(self, scope: cst.CSTNode) -> cst.CSTNode | None:
        """A function of the file that a step loop of the file calls on every step, not under a
        logging condition (RAFT's `loss, metrics = sequence_loss(...)`): that loop."""
        if not isinstance(scope, cst.FunctionDef) or self.parent(scope) is not self.context.module:
            return None
        for call in self._calls_by_name.get(scope.name.value, ()):
            if self.facts.enclosing_scope(call) is scope:
                continue
            loops = self.facts.enclosing_loops(call)
            if not loops or self._step_loop(call) is not loops[0]:
                continue
            if self._kept_on_host(call, loops[0]) != "logged":
                return loops[0]
        return None

    @functools.cached_property
    def _calls_by_name(self) -> dict[str, list[cst.Call]]:
        """The file's calls of a plain name (`sequence_loss(...)`), by that name."""
        found: dict[str, list[cst.Call]] = {}
        for call in calls_in(self.context.module):
            if isinstance(call.func, cst.Name):
                found.setdefault(call.func.value, []).append(call)
        return found

    def _delegated_step(self, loop: cst.CSTNode) -> bool:
        """`loop` hands its loss and its optimizer to a callable that runs the backward and the
        step: timm's NativeScaler idiom `loss_scaler(loss, optimizer, parameters=...)` (DeiT,
        MAE, BEiT, ConvNeXt), in files with no `.backward()` of their own. The optimizer: a
        name whose `.zero_grad()` the loop's function calls; the loss: a name bound in the loop."""
        optimizers = {
            c.func.value.value
            for c in calls_in(self.context.facts.enclosing_scope(loop), into_scopes=False)
            if isinstance(c.func, cst.Attribute)
            and c.func.attr.value == "zero_grad"
            and isinstance(c.func.value, cst.Name)
        }
        bound: set[str] = set()
        for n in nodes_of_type(loop, cst.Assign, into_scopes=False):
            for t in n.targets:
                bound |= names_in(t.target)
        for call in calls_in(loop, into_scopes=False):
            positional = [a.value for a in call.args if a.keyword is None and not a.star]
            if isinstance(call.func, cst.Name) and len(positional) >= 2:
                loss, optimizer = positional[:2]
                if (
                    isinstance(loss, cst.Name)
                    and loss.value in bound
                    and isinstance(optimizer, cst.Name)
                    and optimizer.value in optimizers
                ):
                    return True
        return False

    def _kept_on_host(self, node: cst.Call, loop: cst.CSTNode) -> str | None:
        """ "logged": under a condition true on some steps only; "appended": to a list;
        "accumulated": added to a running metric (`total += loss.item()`, or a
        meter's `.update(loss.item())`); None: used right away."""
        child: cst.CSTNode = node
        kept = None
        for anc in self.context.facts.ancestors(node):
            if anc is loop:
                break
            if (
                isinstance(anc, cst.If)
                and child is not anc.test
                and self._logging_condition(anc.test, node)
                and not self._runs_a_step(anc)
            ):
                return "logged"
            if isinstance(anc, cst.Call) and method_name(anc) == "append" and child is not anc.func:
                return "appended"
            if isinstance(anc, cst.AugAssign) or (
                isinstance(anc, cst.Call) and method_name(anc) == "update" and child is not anc.func
            ):
                kept = kept or "accumulated"
            child = anc
        return kept

    def _logging_condition(self, test: cst.BaseExpression, node: cst.CSTNode) -> bool:
        """A logging test, written in the `if` or bound to the names it reads
        (`early = i % freq == 0 and step < 2000; late = step % 2000 == 0; if early or late:`,
        monodepth2)."""
        if _logging_test(test):
            return True
        names = [n.value for n in walk(test) if isinstance(n, cst.Name)]
        if not names:
            return False
        facts = self.context.facts
        assigned = facts.assigned_in(facts.enclosing_scope(node))
        for name in names:
            bound = assigned.get(name)
            if not bound or not all(_logging_test(value) for value, _ in bound):
                return False
        return True

    def _feeds_an_environment(self, node: cst.Call, loop: cst.CSTNode) -> bool:
        """The host value is handed to an environment's `step(action)` in the loop (gym's
        `env.step(q.argmax().cpu().numpy())`, directly or through the name it is bound to):
        the next step needs it on the host, so the sync is the algorithm, not logging. An
        optimizer's `step()` takes no such argument."""
        bound: set[str] = set()
        holder = self.parent(node)
        while isinstance(holder, cst.Call | cst.Attribute | cst.Arg):
            holder = self.parent(holder)  # `.cpu().numpy()`, `np.array(x.cpu())`
        if isinstance(holder, cst.Assign):
            for t in holder.targets:
                bound |= names_in(t.target)
        for call in calls_in(loop, into_scopes=False):
            if method_name(call) != "step" or not call.args:
                continue
            for a in call.args:
                if any(n is node for n in walk(a.value)) or names_in(a.value) & bound:
                    return True
        return False

    def _runs_a_step(self, branch: cst.If) -> bool:
        """The `if` calls `.backward()` in its body, or a step function of the file
        (`G_loss_dict = train_G()`): a step schedule (a GAN's generator step every `n_critic`
        batches), not a logging condition."""
        facts = self.context.facts
        steps = {f.name.value for f in facts.step_functions}
        return any(
            any(a is branch.body for a in facts.ancestors(b))
            for b in [
                *facts.backward_calls,
                *(c for c in facts.backward_helper_calls if local_callee(c) in steps),
            ]
        )

    def _inside_sync(self, node: cst.Call) -> bool:
        parent = self.parent(node)
        if isinstance(parent, cst.Attribute) and parent.attr.value in ("item", "tolist", "numpy"):
            grand = self.parent(parent)
            return isinstance(grand, cst.Call) and parent.attr.value != "numpy"
        return False

    def _backward_names(self, loop: cst.CSTNode) -> set[str]:
        """Names whose `.backward()` is called in `loop` (`loss` in `loss.backward()`); one walk
        per loop, however many calls of it ask."""
        cache: dict[int, tuple[cst.CSTNode, set[str]]] = self.__dict__.setdefault("_losses", {})
        found = cache.get(id(loop))
        if found is not None and found[0] is loop:
            return found[1]
        names: set[str] = set()
        for n in walk(loop, into_scopes=False):
            if (
                isinstance(n, cst.Call)
                and method_name(n) == "backward"
                and isinstance(n.func, cst.Attribute)
                and isinstance(n.func.value, cst.Name)
            ):
                names.add(n.func.value.value)
        cache[id(loop)] = (loop, names)
        return names


def _over_values(loop: cst.CSTNode) -> bool:
    """`for k, v in losses.items()`, `for p in model.parameters()`, `for l in loss_stats`, `for
    i in range(n)`: a loop over a dict's or a model's values, over a name that holds the step's
    metrics, or over a range (the training loop's own, without a backward: run on every step),
    not over batches."""
    it = loop.iter if isinstance(loop, cst.For) else None
    if isinstance(it, cst.Name):  # `for l in avg_loss_stats:` (FairMOT): the step's metrics
        return any(word in it.value.lower() for word in _METRIC_WORDS)
    if isinstance(it, cst.Call) and is_name(it.func, "range"):
        return True  # `for idx in range(cfg.LOSS.NUM_STAGES)` (HigherHRNet): the stages' losses
    return isinstance(it, cst.Call) and method_name(it) in _VALUE_ITERATORS


_METRIC_WORDS = ("loss", "stat", "meter", "metric")


def _over_step_output(loop: cst.CSTNode, step: cst.CSTNode) -> bool:
    """`for key in end_points:` where the step loop binds `end_points` from a call on every
    step (VoteNet's `loss, end_points = criterion(end_points, config)`): the step's outputs."""
    it = loop.iter if isinstance(loop, cst.For) else None
    if not isinstance(it, cst.Name):
        return False
    for node in walk(step):
        if node is loop:
            continue
        if (
            isinstance(node, cst.Assign)
            and isinstance(node.value, cst.Call)
            and any(it.value in names_in(t.target) for t in node.targets)
        ):
            return True
    return False


def _micro_batch_loop(loops: list[cst.CSTNode], step: cst.CSTNode, facts: FileFacts) -> bool:
    """The backward's innermost loop (`loops[0]`) sits right inside the step loop `step`, which
    iterates a loader (`enumerate(train_loader)`): a loop over the step's micro-batches
    (`for chunk in zip(data_chunks, target_chunks)`), so `step` is the loop that steps. An
    epoch loop (`for epoch in range(n)`) iterates no loader. Or `step` itself steps and zeroes
    an optimizer after that loop, which steps none (PaLM's `for __ in
    range(GRADIENT_ACCUMULATE_EVERY): loss.backward()`, then `optim.step()`)."""
    if len(loops) < 2 or loops[1] is not step:
        return False
    if isinstance(step, cst.For) and "loader" in code_of(step.iter).lower():
        return True
    return bool(_optimizers_stepped(step, facts)) and not _optimizers_stepped(loops[0], facts)


def _optimizers_stepped(loop: cst.CSTNode, facts: FileFacts) -> set[str]:
    """Names both `.step()`ped and `.zero_grad()`ed in `loop`'s own body (an optimizer, not a
    scheduler)."""
    found: dict[str, set[str]] = {"step": set(), "zero_grad": set()}
    for c in calls_in(loop.body, into_scopes=False):  # type: ignore[attr-defined]
        name = method_name(c)
        own = name in found and isinstance(c.func, cst.Attribute)
        if own and facts.enclosing_loops(c)[0] is loop:
            found[name].add(code_of(c.func.value))  # type: ignore[union-attr]
    return found["step"] & found["zero_grad"]


def _logging_test(test: cst.BaseExpression) -> bool:
    """`step % N == 0`, `i == 0`: a condition true on some steps only (not a test of which
    process this is, `args.rank % ngpus_per_node == 0`, true on every step of that one)."""
    for n in walk(test):
        periodic = isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Modulo)
        equal = (
            isinstance(n, cst.Comparison)
            and any(isinstance(c.operator, cst.Equal) for c in n.comparisons)
            and not _against_a_string(n)
        )
        if (periodic or equal) and not _tests_the_process(n):
            return True
        if isinstance(n, cst.Comparison) and _names_a_logging_clock(n):
            return True  # vicreg's `current_time - last_logging > args.log_freq_time`
    return False


def _against_a_string(test: cst.Comparison) -> bool:
    """`args.task == "regression"`: a configuration's choice, true on every step or on none
    (a clock is a number)."""
    sides = [test.left, *(c.comparator for c in test.comparisons)]
    return any(isinstance(s, cst.SimpleString | cst.ConcatenatedString) for s in sides)


def _names_a_logging_clock(test: cst.Comparison) -> bool:
    """A comparison against a logging interval or the time of the last log
    (`now - last_logging > log_freq_time`, `step - last_log >= log_interval`)."""
    names = {n.value.lower() for n in walk(test) if isinstance(n, cst.Name)}
    return any(("log" in name and "logit" not in name) or "interval" in name for name in names)


# Words of the names that tell processes apart (`rank`, `local_rank`, `ngpus_per_node`).
_PROCESS_WORDS = ("rank", "gpu", "node", "world")
# Holders of settings, not what a test is about (`args.rank`: the test is on `rank`).
_HOLDERS = frozenset({"args", "opt", "opts", "self", "cfg", "config", "hparams", "hp", "FLAGS"})


def _tests_the_process(expr: cst.CSTNode) -> bool:
    """Every name `expr` reads (beside holders and literals) names a process: bts's
    `args.rank % ngpus_per_node == 0`, `local_rank == 0`."""
    names = {n.value for n in walk(expr) if isinstance(n, cst.Name)} - _HOLDERS
    return bool(names) and all(any(w in name.lower() for w in _PROCESS_WORDS) for name in names)


def _lightning_training_step(scope: cst.CSTNode | None) -> bool:
    """A method `training_step(self, batch, ...)`: Lightning runs it once per batch."""
    if not isinstance(scope, cst.FunctionDef) or scope.name.value != "training_step":
        return False
    params = [p.name.value for p in scope.params.params]
    return len(params) >= 2 and params[0] == "self"


def _named_as_a_loss(name: str) -> bool:
    """`loss`, `errD_real`, `g_loss`: the names losses go by in old GAN scripts."""
    lowered = name.lower()
    return "loss" in lowered or lowered.startswith("err")
