"""AO403: an evaluation loop that records autograd graphs it never uses."""

from __future__ import annotations

import functools

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.facts import EVAL_MARKERS, named_like_evaluation
from autoopt.lint.program.index import NO_FORWARD_METHODS
from autoopt.lint.program.placement import RETURN_THE_MODULE
from autoopt.lint.program.torch_api import torch_name
from autoopt.lint.tree.nodes import (
    calls_in,
    code_of,
    contains,
    is_name,
    method_name,
    names_in,
    nodes_of_type,
    walk,
)

_NEEDS_GRAD = (
    "torch.autograd.grad",
    "torch.enable_grad",
    "torch.autograd.grad_mode.enable_grad",
    "torch.set_grad_enabled",
    "torch.autograd.functional.jacobian",
    "torch.autograd.functional.hessian",
    "torch.func.grad",
)
_MODEL_WORDS = (
    "model",
    "net",
    "encoder",
    "decoder",
    "classifier",
    "generator",
    "discriminator",
)
# Helpers that take a model and run no forward (`save_model(model, path)`), by the verb they
# start with, when their code is not the project's to read.
_BOOKKEEPING_VERBS = ("save", "load", "log", "print", "write", "update", "export", "copy")
# Functions that make or fetch a model or its inputs, whatever model word their name holds.
_FACTORY_VERBS = ("create_", "build_", "make_", "get_", "init_", "prepare_", "set_")
# Functions that only produce samples or scores: GAN `sample_images()`, `evaluate()`, ...
_INFERENCE_FUNCTION_WORDS = ("sample", "eval", "valid", "test", "infer", "predict")
_PERIODIC_MESSAGE = (
    "model runs with autograd on for sampling/logging inside the training loop; "
    "wrap it in torch.no_grad()"
)


class EvalLoopNoGrad(Rule):
    """
    ## What it does
    Flags model inference that records autograd graphs it never uses, outside
    `torch.no_grad()` / `torch.inference_mode()`:
    - an evaluation loop — a `for` loop after `model.eval()` or `model.train(False)` (or in
      a function named like `evaluate`/`validate`/`test`, or over a loader named so:
      `testing_data_loader`) that runs the model and never calls `backward()`;
    - a sampling function with no loop that runs a model and returns nothing
      (`def sample_images(...)`, which saves a GAN's samples to disk), or an evaluation
      function with no loop that runs the model it put in eval mode;
    - a function that runs a model only to hand back host values (every `return` is
      `.item()`, `.cpu().numpy()`, `float(...)` or detached): an RL agent's `get_action(state)`
      in a rollout, which no caller can differentiate;
    - sampling every N steps inside the training loop (`if i % 100 == 0:
      fake = netG(fixed_noise)` to save images), reported without a fix.

    ## Why
    `model.eval()` only switches dropout and batch-norm to inference behaviour; it does not stop
    autograd. Without `no_grad`, every forward pass stores its activations for a backward pass
    that never comes: evaluation uses about as much memory as training (often 2-3x what it
    needs, so smaller batches) and runs slower (as widely read PyTorch tutorials teach).

    ## When not to
    - The function is already decorated with `@torch.no_grad()` / `@torch.inference_mode()`, or
      the loop is inside such a `with`.
    - Evaluation that needs gradients: the loop calls `torch.autograd.grad`, `backward()`,
      `enable_grad()`, or sets `requires_grad` (saliency maps, adversarial examples,
      gradient-based metrics).
    - Loops that run no model (over `named_parameters()`, over metrics).
    - A sampling function that returns a tensor that keeps its graph (its caller may
      differentiate it), and
      periodic blocks of the training loop that step an optimizer or call `backward()`.
    - A model whose parameters the file freezes (`.requires_grad_(False)` when built, and
      never turned back on by name) and deep copies of one (stylegan2-ada's `G_ema`): its
      forward records no graph.

    ## Fix (safe)
    Wraps the loop in `with torch.no_grad():`, or decorates the sampling function with
    `@torch.no_grad()` (adding `import torch` if needed). Outputs are the
    same values; they no longer carry `grad_fn`, which only code that differentiates them would
    notice, and that code is excluded above.
    """

    code = "AO403"
    name = "eval-loop-no-grad"
    message = "evaluation loop runs the model with autograd on; wrap it in torch.no_grad()"
    fix_safety = FixSafety.SAFE
    fix_reason = "no gradient is taken in the loop, so its results are the same without autograd"
    # `.eval()` before the loop, an evaluation or sampling function, or a training loop
    triggers = (*EVAL_MARKERS, "def sample", ".backward(")

    VALID = [
        Valid(  # detectron2's inference_on_dataset: no_grad entered on an ExitStack
            """
            import torch
            from contextlib import ExitStack
            def inference_on_dataset(model, data_loader):
                model.eval()
                results = []
                with ExitStack() as stack:
                    stack.enter_context(torch.no_grad())
                    for inputs in data_loader:
                        results.append(model(inputs))
                return results
            """
        ),
        Valid(  # REINFORCE keeps the log-probability for the backward pass of the episode
            """
            import torch
            class Agent:
                def __init__(self, policy):
                    self.policy = policy
                    self.optim = torch.optim.Adam(self.policy.parameters())
                    self.log_probs = []
                def select_action(self, state):
                    m = torch.distributions.Categorical(self.policy(torch.as_tensor(state)))
                    action = m.sample()
                    self.log_probs.append(m.log_prob(action))
                    return action.item()
                def finish_episode(self):
                    torch.stack(self.log_probs).sum().backward()
            """
        ),
        Valid(  # the function hands back a tensor its caller may differentiate
            """
            import torch
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            def score(x):
                model.eval()
                out = model(x)
                return out.mean()
            score(x).backward()
            """
        ),
        Valid(  # every forward of the evaluation function is under no_grad (BasicSR's test)
            """
            import torch

            class SRModel:
                def test(self):
                    if hasattr(self, "net_g_ema"):
                        self.net_g_ema.eval()
                        with torch.no_grad():
                            self.output = self.net_g_ema(self.lq)
                    else:
                        self.net_g.eval()
                        with torch.no_grad():
                            self.output = self.net_g(self.lq)
                        self.net_g.train()
            """
        ),
        Valid(  # a sampling function whose result the caller may differentiate
            """
            import torch
            def sample(generator, z):
                return generator(z)
            """
        ),
        Valid(  # the periodic block is gradient accumulation, not sampling
            """
            import torch
            for i, (x, y) in enumerate(loader):
                loss = model(x).sum() / 4
                loss.backward()
                if (i + 1) % 4 == 0:
                    model_ema.update(model)
                    optimizer.step()
            """
        ),
        Valid(  # a test function that never puts the model in eval mode
            """
            import torch
            def test_forward_shape():
                model = Net()
                out = model(torch.zeros(1, 3))
                assert out.shape == (1, 10)
            """
        ),
        Valid(  # autograd switched off for the rest of the script
            """
            import torch
            torch.set_grad_enabled(False)
            model.eval()
            for x, y in test_loader:
                print(model(x).argmax(1) == y)
            """
        ),
        Valid(  # the evaluation function is only ever called under no_grad
            """
            import torch

            def evaluate(model, loader):
                model.eval()
                correct = 0
                for x, y in loader:
                    correct += (model(x).argmax(1) == y).sum()
                return correct

            with torch.no_grad():
                print(evaluate(model, val_loader))
            """
        ),
        Valid(  # the model call is under no_grad inside the loop (HF Accelerate examples)
            """
            import torch
            model.eval()
            for step, batch in enumerate(eval_dataloader):
                batch.to(accelerator.device)
                with torch.no_grad():
                    outputs = model(**batch)
                predictions = outputs.logits.argmax(dim=-1)
            """
        ),
        Valid(
            """
            import torch
            model.eval()
            with torch.no_grad():
                for x, y in val_loader:
                    correct += (model(x).argmax(1) == y).sum().item()
            """
        ),
        Valid(  # a model's own decoding loop in its inference method (Tacotron 2's decoder):
            # the caller chooses the grad mode
            """
            import torch

            class Decoder(torch.nn.Module):
                def inference(self, memory):
                    outputs = []
                    decoder_input = self.go_frame(memory)
                    while True:
                        decoder_input = self.prenet(decoder_input)
                        outputs.append(decoder_input)
                        if len(outputs) == self.max_steps:
                            break
                    return outputs
            """
        ),
        Valid(  # DPR: the forward helper turns autograd off itself when the model is in eval
            # mode; `create_biencoder_input` makes the batch (a factory, not a forward)
            """
            import torch

            def biencoder_fwd_pass(model, batch):
                if model.training:
                    return model(batch)
                with torch.no_grad():
                    return model(batch)

            def validate(biencoder, loader):
                biencoder.eval()
                for samples in loader:
                    batch = biencoder.create_biencoder_input(samples)
                    loss = biencoder_fwd_pass(biencoder, batch)
            """
        ),
        Valid(  # decorated with a name bound to torch's no-grad modes (TabM)
            """
            import torch

            def run(model, loaders, compiled):
                evaluation_mode = torch.no_grad if compiled else torch.inference_mode
                if compiled:
                    evaluation_mode = torch.no_grad

                @evaluation_mode()
                def evaluate(loader):
                    model.eval()
                    for x, y in loader:
                        correct += (model(x).argmax(1) == y).sum()
            """
        ),
        Valid(  # decorated helper
            """
            import torch
            @torch.inference_mode()
            def evaluate(model, loader):
                model.eval()
                for x, y in loader:
                    out = model(x)
            """
        ),
        Valid(  # evaluation that needs gradients (saliency)
            """
            import torch
            model.eval()
            for x, y in loader:
                x.requires_grad_(True)
                score = model(x).max()
                saliency = torch.autograd.grad(score, x)[0]
            """
        ),
        Valid(  # no forward pass in the loop
            """
            model.eval()
            for name, p in model.named_parameters():
                print(name, p.shape)
            """
        ),
        Valid(  # periodic samples from a frozen copy (stylegan2-ada's netG_ema): no graph
            """
            import copy
            import torch
            netG = Generator().requires_grad_(False).to(device)
            netG_ema = copy.deepcopy(netG).eval()
            for step, (x, c) in enumerate(loader):
                for module in (netG,):  # unfrozen for its step, as stylegan2-ada's phases
                    module.requires_grad_(True)
                loss = netG(x, c).mean()
                loss.backward()
                optimizer.step()
                if step % 100 == 0:
                    images = netG_ema(z, c).cpu()
            """
        ),
    ]
    INVALID = [
        Invalid(  # `model.train(False)` is `model.eval()` (reproduce-chexnet's predictions)
            """
            import torch

            def make_predictions(model, dataloader):
                model.train(False)
                for inputs, labels in dataloader:
                    probs = model(inputs.cuda()).cpu().numpy()
            """,
            line=5,
            fixed="""
            import torch

            def make_predictions(model, dataloader):
                model.train(False)
                with torch.no_grad():
                    for inputs, labels in dataloader:
                        probs = model(inputs.cuda()).cpu().numpy()
            """,
        ),
        Invalid(  # torch < 0.4's `Variable(y, requires_grad=False)` asks for no gradient
            """
            import torch
            from torch.autograd import Variable

            def valid(model, loader):
                model.eval()
                for x, y in loader:
                    y = Variable(y, requires_grad=False)
                    loss = criterion(model(x), y)
                    print(loss.item())
            """,
            line=6,
            fixed="""
            import torch
            from torch.autograd import Variable

            def valid(model, loader):
                model.eval()
                with torch.no_grad():
                    for x, y in loader:
                        y = Variable(y, requires_grad=False)
                        loss = criterion(model(x), y)
                        print(loss.item())
            """,
        ),
        Invalid(  # an RL test's episode loop after model.eval() (TorchBeast's test())
            """
            import torch

            def test(model, env, episodes):
                model.eval()
                returns = []
                observation = env.initial()
                while len(returns) < episodes:
                    policy = model(observation)
                    observation = env.step(policy["action"])
                    if observation["done"]:
                        returns.append(observation["episode_return"])
            """,
            line=7,
            fixed="""
            import torch

            def test(model, env, episodes):
                model.eval()
                returns = []
                observation = env.initial()
                with torch.no_grad():
                    while len(returns) < episodes:
                        policy = model(observation)
                        observation = env.step(policy["action"])
                        if observation["done"]:
                            returns.append(observation["episode_return"])
            """,
        ),
        Invalid(  # sampling through the DDP wrapper's module every N steps (glow-tts)
            """
            import torch
            for batch_idx, (x, y) in enumerate(train_loader):
                optimizer_g.zero_grad()
                loss_g = generator(x, y).mean()
                loss_g.backward()
                optimizer_g.step()
                if batch_idx % log_interval == 0:
                    y_gen = generator.module(x[:1], gen=True)
                    save_image(y_gen)
            """,
            line=8,
        ),
        Invalid(  # the unwrapped model put in eval mode, its forward called by name
            # (MusicTransformer: `mt` is the DataParallel wrapper of `single_mt`)
            """
            import torch
            single_mt = MusicTransformer()
            mt = torch.nn.DataParallel(single_mt)
            for b in range(steps):
                loss = criterion(mt(batch_x), batch_y)
                loss.backward()
                scheduler.step()
                if b % 100 == 0:
                    single_mt.eval()
                    prediction, weights = single_mt.forward(eval_x)
                    log(prediction, weights)
            """,
            line=10,
        ),
        Invalid(  # the epoch's test pass over a loader named for it (pix2pix)
            """
            import torch
            for epoch in range(10):
                for x, y in training_data_loader:
                    optimizer.zero_grad()
                    loss_fn(net_g(x), y).backward()
                    optimizer.step()
                for x, y in testing_data_loader:
                    prediction = net_g(x)
                    psnr = loss_fn(prediction, y).item()
            """,
            line=7,
            fixed="""
            import torch
            for epoch in range(10):
                for x, y in training_data_loader:
                    optimizer.zero_grad()
                    loss_fn(net_g(x), y).backward()
                    optimizer.step()
                with torch.no_grad():
                    for x, y in testing_data_loader:
                        prediction = net_g(x)
                        psnr = loss_fn(prediction, y).item()
            """,
        ),
        Invalid(  # the model runs in a helper method of the same object (Informer's Exp)
            """
            import torch
            class Exp:
                def _process_one_batch(self, x):
                    return self.model(x.to(self.device))
                def vali(self, loader):
                    self.model.eval()
                    total = []
                    for x, y in loader:
                        pred = self._process_one_batch(x)
                        total.append(torch.nn.functional.mse_loss(pred.detach(), y).item())
                    return sum(total) / len(total)
            """,
            line=8,
            fixed="""
            import torch
            class Exp:
                def _process_one_batch(self, x):
                    return self.model(x.to(self.device))
                def vali(self, loader):
                    self.model.eval()
                    total = []
                    with torch.no_grad():
                        for x, y in loader:
                            pred = self._process_one_batch(x)
                            total.append(torch.nn.functional.mse_loss(pred.detach(), y).item())
                    return sum(total) / len(total)
            """,
        ),
        Invalid(  # an RL agent's action: the policy runs with autograd on for a numpy action
            """
            import torch
            class Agent:
                def __init__(self, policy):
                    self.policy = policy
                    self.optim = torch.optim.Adam(self.policy.parameters())
                def select_action(self, state):
                    action, _ = self.policy.sample(torch.as_tensor(state))
                    return action.detach().cpu().numpy()[0]
                def update(self, loss):
                    loss.backward()
                    self.optim.step()
            """,
            line=6,
            fixed="""
            import torch
            class Agent:
                def __init__(self, policy):
                    self.policy = policy
                    self.optim = torch.optim.Adam(self.policy.parameters())
                @torch.no_grad()
                def select_action(self, state):
                    action, _ = self.policy.sample(torch.as_tensor(state))
                    return action.detach().cpu().numpy()[0]
                def update(self, loss):
                    loss.backward()
                    self.optim.step()
            """,
            message_contains="host values",
        ),
        Invalid(  # PPO's rollout: the action and a detached log-probability (PPO-for-Beginners)
            """
            import torch
            from torch.distributions import MultivariateNormal
            class PPO:
                def __init__(self, actor):
                    self.actor = actor
                    self.actor_optim = torch.optim.Adam(self.actor.parameters())
                def get_action(self, obs):
                    mean = self.actor(obs)
                    dist = MultivariateNormal(mean, self.cov_mat)
                    action = dist.sample()
                    log_prob = dist.log_prob(action)
                    return action.detach().numpy(), log_prob.detach()
                def learn(self, loss):
                    self.actor_optim.zero_grad()
                    loss.backward()
                    self.actor_optim.step()
            """,
            line=7,
            fixed="""
            import torch
            from torch.distributions import MultivariateNormal
            class PPO:
                def __init__(self, actor):
                    self.actor = actor
                    self.actor_optim = torch.optim.Adam(self.actor.parameters())
                @torch.no_grad()
                def get_action(self, obs):
                    mean = self.actor(obs)
                    dist = MultivariateNormal(mean, self.cov_mat)
                    action = dist.sample()
                    log_prob = dist.log_prob(action)
                    return action.detach().numpy(), log_prob.detach()
                def learn(self, loss):
                    self.actor_optim.zero_grad()
                    loss.backward()
                    self.actor_optim.step()
            """,
            message_contains="host values",
        ),
        Invalid(  # GAN samples saved every N batches (PyTorch-GAN cyclegan)
            """
            import torch
            def sample_images(batches_done):
                imgs = next(iter(val_dataloader))
                G_AB.eval()
                fake_B = G_AB(imgs["A"].type(Tensor))
                save_image(fake_B, "images/%s.png" % batches_done, normalize=False)
            """,
            line=2,
            fixed="""
            import torch
            @torch.no_grad()
            def sample_images(batches_done):
                imgs = next(iter(val_dataloader))
                G_AB.eval()
                fake_B = G_AB(imgs["A"].type(Tensor))
                save_image(fake_B, "images/%s.png" % batches_done, normalize=False)
            """,
        ),
        Invalid(  # fixed-noise samples every 100 iterations (pytorch/examples dcgan)
            """
            import torch
            optimizerG = torch.optim.Adam(netG.parameters(), lr=0.0002)
            for epoch in range(25):
                for i, data in enumerate(dataloader):
                    errG = criterion(netD(netG(noise)), label)
                    errG.backward()
                    optimizerG.step()
                    if i % 100 == 0:
                        fake = netG(fixed_noise)
                        vutils.save_image(fake.detach(), "fake_samples.png", normalize=True)
            """,
            line=9,
            message_contains="sampling/logging",
        ),
        Invalid(
            """
            import torch
            def validate(model, loader):
                model.eval()
                total = 0
                # accuracy over the validation set
                for x, y in loader:
                    pred = model(x).argmax(1)
                    total += (pred == y).sum().item()
                return total
            """,
            line=6,
            fixed="""
            import torch
            def validate(model, loader):
                model.eval()
                total = 0
                # accuracy over the validation set
                with torch.no_grad():
                    for x, y in loader:
                        pred = model(x).argmax(1)
                        total += (pred == y).sum().item()
                return total
            """,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            net.eval()
            for batch in DataLoader(test_set, batch_size=64):
                logits = net(batch["x"])
            """,
            line=3,
            fixed="""
            from torch.utils.data import DataLoader
            import torch

            net.eval()
            with torch.no_grad():
                for batch in DataLoader(test_set, batch_size=64):
                    logits = net(batch["x"])
            """,
        ),
    ]

    def visit_For(self, node: cst.For | cst.While) -> None:
        facts = self.facts
        if not facts.is_eval_loop(node, whiles=True) or facts.in_no_grad(node):
            return
        if any(facts.is_eval_loop(outer, whiles=True) for outer in facts.enclosing_loops(node)):
            return  # the outermost evaluation loop gets the report
        if not self._runs_model(node) or self._needs_grad(node):
            return
        if not isinstance(self.parent(node), cst.IndentedBlock | cst.Module):
            return
        torch, imports = torch_name(self)
        wrapped = cst.With(
            items=[cst.WithItem(item=cst.parse_expression(f"{torch}.no_grad()"))],
            body=cst.IndentedBlock(body=[node.with_changes(leading_lines=())]),
            leading_lines=node.leading_lines,
        )
        self.report(
            node,
            fix=Fix(
                replacements={node: wrapped},
                description="wrap in torch.no_grad()",
                add_imports=imports,
            ),
        )

    def visit_While(self, node: cst.While) -> None:
        """An episode loop after `model.eval()` (an RL agent's `test()`): as a `for` loop."""
        self.visit_For(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        """A sampling/evaluation function without a loop: runs a model, returns nothing; or
        any function that runs a model only to hand back host values (an RL agent's
        `select_action(state)` returning `action.cpu().numpy()`, a trainer's `eval(x, y)`
        returning `loss.item()`)."""
        facts = self.facts
        words = node.name.value.lower()
        if not node.body.body or facts.in_no_grad(node.body) or self._needs_grad(node):
            return
        if _returns_host_values(node) and self._host_result_function(node):
            return
        if not any(w in words for w in _INFERENCE_FUNCTION_WORDS) or _returns_value(node):
            return
        if nodes_of_type(node.body, (cst.For, cst.While), into_scopes=False):
            return  # loops are visit_For's (evaluation loops) or not inference at all
        evaluated = self._evaluated(node)
        # a forward inside `with torch.no_grad():` records nothing (BasicSR's `test()`)
        calls = [c for c in self._model_calls(node.body, evaluated) if not facts.in_no_grad(c)]
        if "sample" not in words:  # `def test_x()` in a test suite: only after `model.eval()`
            calls = [c for c in calls if code_of(c.func) in evaluated]
        if not calls:
            return
        torch, imports = torch_name(self)
        decorator = cst.Decorator(decorator=cst.parse_expression(f"{torch}.no_grad()"))
        self.report(
            node,
            "sampling function runs the model with autograd on; decorate it with @torch.no_grad()",
            fix=Fix(
                replacements={node: node.with_changes(decorators=[decorator, *node.decorators])},
                description="decorate with @torch.no_grad()",
                add_imports=imports,
            ),
        )

    def _host_result_function(self, node: cst.FunctionDef) -> bool:
        """Reports `node` when it runs a model (one put in eval mode here, one an optimizer
        trains, one named like a model, or a method of one: `self.policy.sample(s)`) and keeps
        nothing of what it computes: no loop, no optimizer step, nothing stored (no
        `.append()`, no attribute or item assigned), so no graph can be used later."""
        if node.name.value.startswith("__") or node.name.value == "forward":
            return False
        body = list(walk(node.body, into_scopes=False))
        if any(isinstance(n, _KEEPS) for n in body) or _steps_optimizer(node.body):
            return False
        if any(method_name(c) in _STORES for c in calls_in(node.body, into_scopes=False)):
            return False
        if any(
            isinstance(n, cst.Assign | cst.AugAssign | cst.AnnAssign)
            and any(isinstance(t, cst.Attribute | cst.Subscript) for t in _targets(n))
            for n in body
        ):
            return False
        modules = self._evaluated(node) | self._trained_modules
        if not any(
            self._runs_module(c, modules)
            for c in calls_in(node.body, into_scopes=False)
            if not self.facts.in_no_grad(c)
        ):
            return False
        torch, imports = torch_name(self)
        decorator = cst.Decorator(decorator=cst.parse_expression(f"{torch}.no_grad()"))
        self.report(
            node,
            "runs the model with autograd on only to return host values; "
            "decorate it with @torch.no_grad()",
            fix=Fix(
                replacements={node: node.with_changes(decorators=[decorator, *node.decorators])},
                description="decorate with @torch.no_grad()",
                add_imports=imports,
            ),
        )
        return True

    def _runs_module(self, call: cst.Call, modules: set[str]) -> bool:
        """`call` runs a model: one of `modules` or one named like a model, or a method of one
        of `modules` that is not bookkeeping (`self.policy.sample(s)`, `net.forward(x)`)."""
        if not isinstance(call.func, cst.Name | cst.Attribute):
            return False
        text = code_of(call.func)
        if text in modules or _named_like_model(text):
            return not self._runs_no_forward(call)
        if isinstance(call.func, cst.Attribute) and code_of(call.func.value) in modules:
            attr = call.func.attr.value
            return attr not in NO_FORWARD_METHODS and not attr.startswith(_BOOKKEEPING_VERBS)
        return False

    def visit_If(self, node: cst.If) -> None:
        """Sampling every N steps inside the training loop (`if i % 100 == 0: netG(noise)`)."""
        facts = self.facts
        if not _periodic(node.test) or facts.training_loop_of(node) is None:
            return
        if facts.in_no_grad(node) or self._needs_grad(node) or _steps_optimizer(node.body):
            return
        # what the block puts in eval mode is what it samples with (MusicTransformer's
        # `single_mt.eval()` then `single_mt.forward(x)`, the unwrapped DataParallel model)
        evaluated = {
            code_of(c.func.value)
            for c in facts.eval_calls
            if isinstance(c.func, cst.Attribute) and contains(node.body, c)
        }
        calls = [
            c
            for c in self._model_calls(node.body, evaluated)
            if not facts.in_no_grad(c) and not self._evaluation_loop_elsewhere(c)
        ]
        if calls:
            self.report(calls[0], _PERIODIC_MESSAGE)

    def _evaluation_loop_elsewhere(self, call: cst.Call) -> bool:
        """`evaluate_model(model, val_iterator)`: a function of the project named for
        evaluation that iterates a loader it is handed; its loop is told where it is written
        (the fix belongs there, not at this call)."""
        name = code_of(call.func).rsplit(".", 1)[-1]
        return named_like_evaluation(name) and any(
            "loader" in roles for _, roles in self.context.program.argument_roles(call)
        )

    def _model_calls(self, body: cst.CSTNode, evaluated: set[str]) -> list[cst.Call]:
        """Calls of a model in `body`: one put in eval mode, one whose `parameters()` an
        optimizer trains, or one named like a model (`netG`, `generator`); a call of the
        project's own code only when it runs a forward with autograd on (`save_model(model)`
        runs none; an `evaluate()` decorated with no_grad neither)."""
        trained = self._trained_modules
        found = []
        for call in calls_in(body, into_scopes=False):
            if not isinstance(call.func, cst.Name | cst.Attribute):
                continue
            text = _model_text(call.func)
            if text not in evaluated and text not in trained and not _named_like_model(text):
                continue
            if text in self._frozen_models:
                continue
            if self._runs_no_forward(call):
                continue
            found.append(call)
        return found

    def _runs_no_forward(self, call: cst.Call) -> bool:
        """The call runs no forward with autograd on: the project's code says so, or it is a
        library helper named for bookkeeping (`save_model`, `load_model`, `log_model`)."""
        runs = self.context.program.runs_forward_with_grad(call)
        if runs is not None:
            return not runs
        last = code_of(call.func).rsplit(".", 1)[-1].lower()
        return last.startswith(_BOOKKEEPING_VERBS)

    @functools.cached_property
    def _frozen_models(self) -> set[str]:
        """Models whose parameters the file freezes: built with `.requires_grad_(False)` in
        their chain (stylegan2-ada's `G = ...train().requires_grad_(False).to(device)`), frozen
        by a `G.requires_grad_(False)` line, or deep copies of a frozen one (`G_ema =
        copy.deepcopy(G).eval()`). Their forward records no graph: nothing to save."""
        module = self.context.module
        toggled: dict[str, set[str]] = {"False": set(), "True": set()}
        for c in calls_in(module):
            if method_name(c) == "requires_grad_" and isinstance(c.func, cst.Attribute):
                flag = code_of(c.args[0].value) if c.args else "True"
                if flag in toggled and isinstance(self.parent(c), cst.Expr):
                    toggled[flag].add(code_of(c.func.value))
        frozen = toggled["False"] - toggled["True"]  # a GAN's D, unfrozen for its own step
        bound: list[tuple[str, cst.BaseExpression]] = [
            (code_of(t.target), a.value)
            for a in nodes_of_type(module, cst.Assign)
            for t in a.targets
            if isinstance(t.target, cst.Name | cst.Attribute)
        ]
        changed = True
        while changed:
            changed = False
            for name, value in bound:
                if (
                    name not in frozen
                    and name not in toggled["True"]
                    and (_freezes(value) or _copies_one_of(self, value, frozen))
                ):
                    frozen.add(name)
                    changed = True
        return frozen

    @functools.cached_property
    def _trained_modules(self) -> set[str]:
        """`netG` for every `netG.parameters()` in the file (what optimizers train)."""
        return {
            code_of(c.func.value)
            for c in calls_in(self.context.module)
            if isinstance(c.func, cst.Attribute) and c.func.attr.value == "parameters"
        }

    def _evaluated(self, scope: cst.CSTNode) -> set[str]:
        """Modules put in eval mode in `scope` (`G_AB` for `G_AB.eval()`)."""
        return {
            code_of(c.func.value)
            for c in self.facts.eval_calls
            if isinstance(c.func, cst.Attribute) and self.facts.enclosing_scope(c) is scope
        }

    def _runs_model(self, loop: cst.For | cst.While) -> bool:
        """The loop calls the module that was put in eval mode, or something named like a
        model."""
        evaluated = self._evaluated(self.facts.enclosing_scope(loop))
        for call in calls_in(loop.body, into_scopes=False):
            if not isinstance(call.func, cst.Name | cst.Attribute) or self.facts.in_no_grad(call):
                continue  # a model call already under `with torch.no_grad():` inside the loop
            text = _model_text(call.func)
            if text in self._frozen_models:
                continue
            if (text in evaluated or _named_like_model(text)) and not self._runs_no_forward(call):
                return True
            if evaluated and self._runs_evaluated_model(call, evaluated):
                return True
        return False

    def _runs_evaluated_model(self, call: cst.Call, evaluated: set[str]) -> bool:
        """A call of the project's code that runs a module put in eval mode here with autograd
        on: a method of the same object (`self._process_one_batch(...)` running `self.model`),
        or a helper handed the module (`predict_batch(model, x)`)."""
        program = self.context.program
        summary = program.call_summary(call)
        if any(
            key in evaluated and "forward" in roles
            for key, roles in summary.roles.items()
            if key.startswith("self.")
        ):
            return True
        return any(  # (one that runs it under no_grad too picks the mode itself)
            "forward" in roles
            and "forward_no_grad" not in roles
            and code_of(arg.value) in evaluated
            for arg, roles in program.argument_roles(call)
        )

    def _needs_grad(self, loop: cst.For) -> bool:
        for n in nodes_of_type(loop, _GRAD_NODES, into_scopes=False):
            kind = type(n)
            # `requires_grad=False` / `requires_grad_(False)` (torch < 0.4's
            # `Variable(targets, requires_grad=False)`) asks for no gradient
            off = kind is not cst.Attribute and _turns_grad_off(n)
            if (
                kind is cst.Call
                and not off
                and (
                    method_name(n) in ("backward", "requires_grad_")
                    or self.refers_to(n.func, *_NEEDS_GRAD)
                )
            ):
                return True
            if kind is cst.Attribute and n.attr.value == "requires_grad":
                return True
            if kind is cst.Arg and is_name(n.keyword, "requires_grad") and not off:
                return True
        return False


def _turns_grad_off(node: cst.CSTNode) -> bool:
    """`requires_grad=False` (an argument) or `x.requires_grad_(False)`."""
    if isinstance(node, cst.Arg):
        return is_name(node.value, "False")
    return (
        isinstance(node, cst.Call)
        and method_name(node) == "requires_grad_"
        and bool(node.args)
        and is_name(node.args[0].value, "False")
    )


# The nodes `_needs_grad` looks at (read off the tree's index, not by testing every node).
_GRAD_NODES = (cst.Call, cst.Attribute, cst.Arg)


def _model_text(func: cst.BaseExpression) -> str:
    """`generator` for `generator.module(...)`: the model a DDP/DataParallel wrapper holds is
    the model (glow-tts samples through it); `model` for `model.forward(x)`."""
    return code_of(func).removesuffix(".forward").removesuffix(".module")


def _freezes(value: cst.BaseExpression) -> bool:
    """`Net().requires_grad_(False).to(device)`: the chain freezes what it builds."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        if (
            value.func.attr.value == "requires_grad_"
            and value.args
            and is_name(value.args[0].value, "False")
        ):
            return True
        value = value.func.value
    return False


def _copies_one_of(rule: Rule, value: cst.BaseExpression, frozen: set[str]) -> bool:
    """`copy.deepcopy(G).eval()`: a deep copy (under module-keeping methods) of a frozen
    model."""
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in RETURN_THE_MODULE
    ):
        value = value.func.value  # `.eval()`, `.to(device)`
    return (
        isinstance(value, cst.Call)
        and rule.is_call_to(value, "copy.deepcopy")
        and bool(value.args)
        and code_of(value.args[0].value) in frozen
    )


def _named_like_model(text: str) -> bool:
    """`netG`, `self.generator`, `model`: the last part names a model (not a factory or getter
    named for one: DPR's `biencoder.create_biencoder_input(...)`, `build_model(cfg)`)."""
    last = text.rsplit(".", 1)[-1].lower()
    return any(w in last for w in _MODEL_WORDS) and not last.startswith(_FACTORY_VERBS)


def _returns_value(func: cst.FunctionDef) -> bool:
    return any(
        n.value is not None for n in nodes_of_type(func.body, cst.Return, into_scopes=False)
    ) or bool(nodes_of_type(func.body, cst.Yield, into_scopes=False))


# What a host-result function must not do: loop, yield, or keep a value beyond the call.
_KEEPS = (cst.For, cst.While, cst.Yield, cst.Global, cst.Nonlocal, cst.Lambda)
_STORES = frozenset({"append", "extend", "insert", "add", "push", "put", "store", "register_hook"})
# (`.detach()`: a tensor no caller can differentiate, as the doc says)
_HOST_METHODS = frozenset({"item", "tolist", "numpy", "detach"})
_HOST_BUILTINS = frozenset({"float", "int", "bool"})
_HOST_LIBRARIES = ("np.", "numpy.", "math.", "random.")


def _targets(node: cst.Assign | cst.AugAssign | cst.AnnAssign) -> list[cst.BaseExpression]:
    if isinstance(node, cst.Assign):
        return [t.target for t in node.targets]
    return [node.target]


_BINDINGS = (cst.Assign, cst.AugAssign, cst.AnnAssign)


def _returns_host_values(func: cst.FunctionDef) -> bool:
    """Every `return` hands back host values only (`.item()`, `.cpu().numpy()`, `float(x)`,
    tuples of them, or names bound only to them): nothing a caller could differentiate."""
    returns = nodes_of_type(func.body, cst.Return, into_scopes=False)
    if not returns or any(r.value is None for r in returns):
        return False
    assigned: dict[str, list[cst.BaseExpression]] = {}
    for n in nodes_of_type(func.body, _BINDINGS, into_scopes=False):
        if isinstance(n, cst.Assign):
            for t in n.targets:
                if isinstance(t.target, cst.Name):
                    assigned.setdefault(t.target.value, []).append(n.value)
                else:
                    for name in names_in(t.target):
                        assigned.setdefault(name, []).append(cst.Name("__unknown__"))
        elif isinstance(n, cst.AugAssign | cst.AnnAssign) and isinstance(n.target, cst.Name):
            assigned.setdefault(n.target.value, []).append(cst.Name("__unknown__"))
    return all(_host_value(r.value, assigned, 0) for r in returns if r.value is not None)


def _host_value(
    expr: cst.BaseExpression, assigned: dict[str, list[cst.BaseExpression]], depth: int
) -> bool:
    if depth > 4:
        return False
    if isinstance(expr, cst.Integer | cst.Float | cst.SimpleString):
        return True
    if isinstance(expr, cst.Subscript):
        return _host_value(expr.value, assigned, depth + 1)
    if isinstance(expr, cst.Tuple | cst.List):
        return bool(expr.elements) and all(
            _host_value(e.value, assigned, depth + 1) for e in expr.elements
        )
    if isinstance(expr, cst.IfExp):
        return _host_value(expr.body, assigned, depth + 1) and _host_value(
            expr.orelse, assigned, depth + 1
        )
    if isinstance(expr, cst.Call):
        func = expr.func
        if isinstance(func, cst.Name):
            return func.value in _HOST_BUILTINS
        if method_name(expr) in _HOST_METHODS or code_of(func).startswith(_HOST_LIBRARIES):
            return True  # `.item()`, `np.random.randint(n)`
        # a method of a host value (`action.reshape(shape)` of a numpy array)
        return isinstance(func, cst.Attribute) and _host_value(func.value, assigned, depth + 1)
    if isinstance(expr, cst.Name):
        values = assigned.get(expr.value)
        if not values:
            return False
        # `action = action[0] if ... else action.reshape(...)`: its other values decide
        others = {**assigned, expr.value: [cst.Integer("0")]}
        return all(_host_value(v, others, depth + 1) for v in values)
    return False


def _periodic(test: cst.BaseExpression) -> bool:
    """`i % 100 == 0`, `batches_done % opt.sample_interval == 0`: true every N steps."""
    return any(
        isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Modulo)
        for n in walk(test)
    )


def _steps_optimizer(body: cst.CSTNode) -> bool:
    """The block steps an optimizer or a scaler (gradient accumulation's `if`)."""
    return any(method_name(c) in ("step", "backward") for c in calls_in(body))
