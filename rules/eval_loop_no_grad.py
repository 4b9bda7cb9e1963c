"""AO403: an evaluation loop that records autograd graphs it never uses."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.facts import EVAL_MARKERS
from autoopt.lint.nodes import calls_in, code_of, is_name, method_name, walk
from autoopt.lint.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.torch_api import torch_name

_NEEDS_GRAD = (
    "torch.autograd.grad",
    "torch.enable_grad",
    "torch.autograd.grad_mode.enable_grad",
    "torch.set_grad_enabled",
    "torch.autograd.functional.jacobian",
    "torch.autograd.functional.hessian",
    "torch.func.grad",
)
_MODEL_WORDS = ("model", "net", "encoder", "decoder", "classifier")


class EvalLoopNoGrad(Rule):
    """
    ## What it does
    Flags an evaluation loop — a `for` loop after `model.eval()` (or in a function named like
    `evaluate`/`validate`/`test`) that runs the model and never calls `backward()` — that is not
    under `torch.no_grad()` / `torch.inference_mode()`.

    ## Why
    `model.eval()` only switches dropout and batch-norm to inference behaviour; it does not stop
    autograd. Without `no_grad`, every forward pass stores its activations for a backward pass
    that never comes: evaluation uses about as much memory as training (often 2-3x what it
    needs, so smaller batches) and runs slower (seeds 001, 003, 004).

    ## When not to
    - The function is already decorated with `@torch.no_grad()` / `@torch.inference_mode()`, or
      the loop is inside such a `with`.
    - Evaluation that needs gradients: the loop calls `torch.autograd.grad`, `backward()`,
      `enable_grad()`, or sets `requires_grad` (saliency maps, adversarial examples,
      gradient-based metrics).
    - Loops that run no model (over `named_parameters()`, over metrics).

    ## Fix (safe)
    Wraps the loop in `with torch.no_grad():` (adding `import torch` if needed). Outputs are the
    same values; they no longer carry `grad_fn`, which only code that differentiates them would
    notice, and that code is excluded above.
    """

    code = "AO403"
    name = "eval-loop-no-grad"
    message = "evaluation loop runs the model with autograd on; wrap it in torch.no_grad()"
    fix_safety = FixSafety.SAFE
    fix_reason = "no gradient is taken in the loop, so its results are the same without autograd"
    triggers = EVAL_MARKERS  # `.eval()` before the loop, or an evaluation function's name

    VALID = [
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
    ]
    INVALID = [
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

    def visit_For(self, node: cst.For) -> None:
        facts = self.facts
        if not facts.is_eval_loop(node) or facts.in_no_grad(node):
            return
        if any(facts.is_eval_loop(outer) for outer in facts.enclosing_loops(node)):
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

    def _runs_model(self, loop: cst.For) -> bool:
        """The loop calls the module that was put in eval mode, or something named like a
        model."""
        scope = self.facts.enclosing_scope(loop)
        evaluated = {
            code_of(c.func.value)
            for c in self.facts.eval_calls
            if isinstance(c.func, cst.Attribute) and self.facts.enclosing_scope(c) is scope
        }
        for call in calls_in(loop.body, into_scopes=False):
            if not isinstance(call.func, cst.Name | cst.Attribute) or self.facts.in_no_grad(call):
                continue  # a model call already under `with torch.no_grad():` inside the loop
            text = code_of(call.func)
            last = text.rsplit(".", 1)[-1].lower()
            if text in evaluated or any(w in last for w in _MODEL_WORDS):
                return True
        return False

    def _needs_grad(self, loop: cst.For) -> bool:
        for n in walk(loop, into_scopes=False):
            if isinstance(n, cst.Call) and (
                method_name(n) in ("backward", "requires_grad_")
                or self.refers_to(n.func, *_NEEDS_GRAD)
            ):
                return True
            if isinstance(n, cst.Attribute) and n.attr.value == "requires_grad":
                return True
            if isinstance(n, cst.Arg) and is_name(n.keyword, "requires_grad"):
                return True
        return False
