"""The mixed-precision codemod of AO201: wrap a training loop's forward and loss in
`torch.autocast`, and route its backward/step/update through one `torch.amp.GradScaler`.

`AutocastPlan` decides whether one loop can be converted (or says why not) and builds the edits;
`_Editor` applies them by node identity."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import ImportItem

from autoopt.lint.engine.rule import Fix, Rule
from autoopt.lint.rewrite.fixes.preconditions import double_backward
from autoopt.lint.tree.edits import block_statement
from autoopt.lint.tree.nodes import (
    calls_in,
    code_of,
    indexed_tree,
    method_name,
    names_in,
    nodes_of_type,
    walk,
)

_BCE = {
    "torch.nn.BCELoss",
    "torch.nn.modules.loss.BCELoss",
    "torch.nn.functional.binary_cross_entropy",
}
_CLIP = {
    "torch.nn.utils.clip_grad_norm_",
    "torch.nn.utils.clip_grad_value_",
    "torch.nn.utils.clip_grad.clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_value_",
}
# Method calls that only move or re-type a batch: statements made of them stay outside autocast.
_SETUP_METHODS = {"to", "cuda", "cpu", "float", "long", "int", "zero_grad", "train", "eval"}
_SETUP_FUNCS = {"next", "len", "enumerate"}

Edit = cst.CSTNode | cst.FlattenSentinel | Callable[[cst.CSTNode], object]


# ----- analysis -----------------------------------------------------------------------------


def _stmt(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code + "\n")


@dataclass
class AutocastPlan:
    """Decides whether one training loop can be converted and builds the edits."""

    rule: Rule
    loop: cst.CSTNode
    backward_calls: list[cst.Call]
    edits: dict[int, tuple[cst.CSTNode, Edit]] = field(default_factory=dict)
    scaler: str = "scaler"
    dtype_name: str = "amp_dtype"
    device_type: str = '"cuda"'
    outer: cst.CSTNode | None = None

    # ----- helpers ---------------------------------------------------------------------------
    @property
    def facts(self):  # noqa: ANN201 - FileFacts, typed in rule.py
        return self.rule.facts

    def statement_of(self, node: cst.CSTNode) -> cst.BaseStatement:
        """The statement in a block that holds `node` (the loop always has one)."""
        stmt = block_statement(node, self.facts.parent)
        assert stmt is not None
        return stmt

    def block_of(self, stmt: cst.CSTNode) -> Sequence[cst.BaseStatement]:
        parent = self.facts.parent(stmt)
        assert isinstance(parent, cst.IndentedBlock | cst.Module)
        return parent.body

    # ----- the plan ----------------------------------------------------------------------------
    def build(self) -> str | None:
        """Fill `self.edits`; return the reason to decline, or None."""
        # (a script on another precision system never gets here: AO201 is silent there)
        module = self.facts.module
        # -- things autocast/GradScaler cannot take
        scope = self.facts.enclosing_scope(self.loop)
        if any(method_name(c) == "numpy" for c in calls_in(scope)):
            return (
                "the script reads tensors with .numpy(), which fails on the bfloat16 outputs "
                "autocast gives (on CPU always, on CUDA where bf16 is supported)"
            )
        for call in nodes_of_type(module, cst.Call):
            names = self.rule.qualified_names(call.func)
            if names & _BCE:
                return (
                    "BCELoss/binary_cross_entropy on probabilities is rejected by autocast; "
                    "use BCEWithLogitsLoss on logits first"
                )
        twice = double_backward(self.rule)
        if twice is not None:
            return twice
        for call in self.backward_calls:
            if not isinstance(call.func, cst.Attribute) or any(
                n.startswith("torch.") for n in self.rule.qualified_names(call.func)
            ):
                return "custom backward call (not loss.backward())"
        optimizers = self._optimizers()
        steps: list[tuple[cst.Call, str]] = []
        for call in calls_in(self.loop, into_scopes=False):
            if m.matches(call.func, m.Attribute(attr=m.Name("step"))):
                owner = code_of(call.func.value)  # type: ignore[attr-defined]
                if owner in optimizers:
                    if call.args or optimizers[owner] == "lbfgs":
                        return "LBFGS-style optimizer.step(closure)"
                    steps.append((call, owner))
        if not steps:
            return "no optimizer step() in the loop (no optimizer object to route through a scaler)"
        if self._hand_update():
            return (
                "parameters are also updated by hand from .grad in the loop; a GradScaler "
                "would leave that update with scaled gradients"
            )
        self._choose_names()
        self._choose_device()
        # -- backward: autocast region before it, scaled loss
        for call in self.backward_calls:
            reason = self._plan_backward(call)
            if reason:
                return reason
        # -- steps, one update per iteration, unscale_ before clipping
        for call, owner in steps:
            self.edits[id(call)] = (call, cst.parse_expression(f"{self.scaler}.step({owner})"))
        reason = self._plan_update([c for c, _ in steps])
        if reason:
            return reason
        reason = self._plan_unscale(steps)
        if reason:
            return reason
        loops = [
            lp for lp in self.facts.enclosing_loops(self.loop) if self.facts.is_training_loop(lp)
        ]
        self.outer = loops[-1] if loops else self.loop
        return None

    def _optimizers(self) -> dict[str, str]:
        """Expressions (as code) that hold an optimizer -> "lbfgs" or "other"."""
        found: dict[str, str] = {}
        for node in walk(self.facts.module):
            kind = type(node)  # exact types: this tests every node of the file
            if kind is cst.Assign and isinstance(node.value, cst.Call):
                names = self.rule.qualified_names(node.value.func)
                opt = {
                    n
                    for n in names
                    if n.startswith("torch.optim.") and "lr_scheduler" not in n and "swa" not in n
                }
                if opt:
                    kind = "lbfgs" if any(n.endswith("LBFGS") for n in opt) else "other"
                    for target in node.targets:
                        found[code_of(target.target)] = kind
            elif (
                kind is cst.Call
                and isinstance(node.func, cst.Attribute)
                and node.func.attr.value == "zero_grad"
            ):
                found.setdefault(code_of(node.func.value), "other")  # type: ignore[attr-defined]
        return found

    def _hand_update(self) -> bool:
        """Whether the loop writes parameters in place from a `.grad` (`p.data.add_(p.grad)`,
        `w -= lr * w.grad`): an update path the scaler cannot unscale for."""
        for node in walk(self.loop):
            if isinstance(node, cst.AugAssign):
                value = node.value
            elif (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in ("add_", "sub_", "addcmul_", "copy_")
            ):
                value = node
            else:
                continue
            if any(a.attr.value == "grad" for a in nodes_of_type(value, cst.Attribute)):
                return True
        return False

    def _choose_names(self) -> None:
        used = names_in(self.facts.module)
        self.scaler = next(
            n for n in ("scaler", "grad_scaler", "amp_scaler", "amp_grad_scaler") if n not in used
        )
        self.dtype_name = next(
            n for n in ("amp_dtype", "autocast_dtype", "amp_autocast_dtype") if n not in used
        )

    def _choose_device(self) -> None:
        """The script's own device: `<device>.type` where it has a device variable."""
        candidates: list[str] = []
        for call in calls_in(self.loop, into_scopes=False):
            if m.matches(call.func, m.Attribute(attr=m.Name("to"))) and call.args:
                first = call.args[0]
                if first.keyword is None or first.keyword.value == "device":
                    candidates.append(code_of(first.value))
            for a in call.args:
                if a.keyword is not None and a.keyword.value == "device":
                    candidates.append(code_of(a.value))
        assigned = self._assignments()
        params = self._params()
        for name in [*candidates, "device"]:
            root = name.split(".")[0]
            if "." in name and name not in assigned and (root in params or root in assigned):
                # `args.device`: the script's own expression, bound where the loop runs
                self.device_type = f"torch.device({name}).type"
                return
            if name not in assigned and name not in params:
                continue
            values = assigned.get(name, [])
            if values and all(
                isinstance(v, cst.Call) and "torch.device" in self.rule.qualified_names(v.func)
                for v in values
            ):
                self.device_type = f"{name}.type"
            else:
                self.device_type = f"torch.device({name}).type"
            return
        self.device_type = '"cuda"' if self.facts.uses_cuda else '"cpu"'

    def _assignments(self) -> dict[str, list[cst.BaseExpression]]:
        """Names (and attribute chains) assigned outside the loop, in its function or at module
        level (where the loop can see them) -> their assigned values."""
        out: dict[str, list[cst.BaseExpression]] = {}
        loop_nodes = {id(n) for n in walk(self.loop, into_scopes=False)}
        scope = self.facts.enclosing_scope(self.loop)
        for node in nodes_of_type(self.facts.module, cst.Assign):
            if id(node) not in loop_nodes and self.facts.enclosing_scope(node) in (
                scope,
                self.facts.module,
            ):
                for target in node.targets:
                    if isinstance(target.target, cst.Name | cst.Attribute):
                        out.setdefault(code_of(target.target), []).append(node.value)
        return out

    def _params(self) -> set[str]:
        scope = self.facts.enclosing_scope(self.loop)
        if isinstance(scope, cst.FunctionDef):
            p = scope.params
            return {x.name.value for x in [*p.posonly_params, *p.params, *p.kwonly_params]}
        return set()

    def _is_boundary(self, stmt: cst.CSTNode) -> bool:
        """A statement that must stay outside autocast: backward, step or clipping in it."""
        for call in calls_in(stmt, into_scopes=False):
            if m.matches(call.func, m.Attribute(attr=m.Name("backward") | m.Name("step"))):
                return True
            if self.rule.qualified_names(call.func) & _CLIP:
                return True
        return False

    def _is_setup(self, stmt: cst.BaseStatement) -> bool:
        """Batch movement, zero_grad, model.train(): kept before the autocast block."""
        if not isinstance(stmt, cst.SimpleStatementLine):
            return False
        for small in stmt.body:
            if isinstance(small, cst.Pass):
                continue
            if not isinstance(small, cst.Expr | cst.Assign | cst.AugAssign | cst.AnnAssign):
                return False
            for call in calls_in(small, into_scopes=False):
                func = call.func
                if isinstance(func, cst.Attribute) and func.attr.value in _SETUP_METHODS:
                    continue
                if isinstance(func, cst.Name) and func.value in _SETUP_FUNCS:
                    continue
                return False
        return True

    def _plan_backward(self, call: cst.Call) -> str | None:
        receiver = call.func.value  # type: ignore[attr-defined]
        stmt = self.statement_of(call)
        region = self._region(stmt)
        bare = receiver.with_changes(lpar=[], rpar=[])
        if region:
            self._wrap(region)
            new_call = cst.parse_expression(f"{self.scaler}.scale(x).backward()")
            scaled = new_call.func.value.with_changes(args=[cst.Arg(bare)])  # type: ignore[attr-defined]
            self.edits[id(call)] = (
                call,
                call.with_changes(func=call.func.with_changes(value=scaled)),  # type: ignore[attr-defined]
            )
            return None
        # Forward and backward in one expression statement: split it, naming the loss.
        if not (
            isinstance(stmt, cst.SimpleStatementLine)
            and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and stmt.body[0].value is call
        ):
            return "could not find the forward/loss statements before backward()"
        used = names_in(self.facts.module)
        loss = next(n for n in ("loss", "amp_loss", "autocast_loss") if n not in used)
        assign = cst.SimpleStatementLine(
            [cst.Assign([cst.AssignTarget(cst.Name(loss))], bare)],
        )
        with_stmt = self._with_stmt([assign]).with_changes(leading_lines=stmt.leading_lines)
        args = "".join(code_of(a) for a in call.args)
        backward = _stmt(f"{self.scaler}.scale({loss}).backward({args})").with_changes(
            trailing_whitespace=stmt.trailing_whitespace
        )
        self.edits[id(stmt)] = (stmt, cst.FlattenSentinel([with_stmt, backward]))
        return None

    def _region(self, stmt: cst.BaseStatement) -> list[cst.BaseStatement]:
        """The forward/loss statements before `stmt`: back to the previous boundary, without
        leading setup statements; looked for in enclosing blocks while empty."""
        while True:
            block = list(self.block_of(stmt))
            k = next(i for i, s in enumerate(block) if s is stmt)
            j = k
            while j > 0 and not self._is_boundary(block[j - 1]):
                j -= 1
            region = block[j:k]
            while region and self._is_setup(region[0]):
                region.pop(0)
            if region or j > 0:
                return region
            owner = self._outer_statement(stmt)
            if owner is None or owner is self.loop:
                return []
            stmt = owner

    def _outer_statement(self, stmt: cst.CSTNode) -> cst.BaseStatement | None:
        """The statement around `stmt` that sits directly in a block (skips else/elif)."""
        cur = self.facts.parent(stmt)
        while cur is not None:
            if isinstance(cur, cst.BaseStatement) and isinstance(
                self.facts.parent(cur), cst.IndentedBlock | cst.Module
            ):
                return cur
            cur = self.facts.parent(cur)
        return None

    def _with_stmt(self, body: list[cst.BaseStatement]) -> cst.With:
        # A device picked at run time: autocast only where it is known to help and work
        # (CPU bf16 is measured by the runtime first, e.g. oneDNN LSTMs reject it).
        enabled = (
            "" if self.device_type.startswith('"') else f', enabled={self.device_type} == "cuda"'
        )
        template = _stmt(
            f"with torch.autocast(device_type={self.device_type}, dtype={self.dtype_name}"
            f"{enabled}):\n    pass"
        )
        assert isinstance(template, cst.With)
        return template.with_changes(body=cst.IndentedBlock(body=body))

    def _wrap(self, region: list[cst.BaseStatement]) -> None:
        first = region[0]
        inner = [first.with_changes(leading_lines=[]), *region[1:]]
        with_stmt = self._with_stmt(inner).with_changes(leading_lines=first.leading_lines)
        self.edits[id(first)] = (first, cst.FlattenSentinel([with_stmt]))
        for stmt in region[1:]:
            self.edits[id(stmt)] = (stmt, cst.RemoveFromParent())

    def _plan_update(self, steps: list[cst.Call]) -> str | None:
        """One `scaler.update()` per iteration: after the last step, in the deepest block that
        holds every step, which must itself step unconditionally before that point."""
        chains = [self._block_chain(self.statement_of(c)) for c in steps]
        depth = 0  # levels whose block is the same for every step
        while all(len(ch) > depth for ch in chains) and all(
            ch[depth][0] is chains[0][depth][0] for ch in chains
        ):
            depth += 1
        if depth == 0:  # pragma: no cover - every chain starts at the loop body
            return "optimizer steps in different blocks"
        level = depth - 1
        if not any(len(ch) == depth for ch in chains):
            return "optimizer steps under different conditions; cannot place one scaler.update()"
        last = chains[-1][level][1]
        update = _stmt(f"{self.scaler}.update()")

        def insert_after(updated: cst.CSTNode) -> cst.FlattenSentinel:
            return cst.FlattenSentinel([updated, update])  # type: ignore[list-item]

        self._compose(last, insert_after)
        return None

    def _block_chain(self, stmt: cst.BaseStatement) -> list[tuple[cst.CSTNode, cst.CSTNode]]:
        """(block, statement in that block) pairs from the loop body down to `stmt`."""
        chain: list[tuple[cst.CSTNode, cst.CSTNode]] = []
        cur: cst.CSTNode = stmt
        while cur is not self.loop:
            parent = self.facts.parent(cur)
            if isinstance(parent, cst.IndentedBlock):
                chain.append((parent, cur))
            assert parent is not None
            cur = parent
        chain.reverse()
        return chain

    def _compose(self, node: cst.CSTNode, after: Callable[[cst.CSTNode], object]) -> None:
        """Register `after(updated node)` as the edit of `node`, on top of any existing edit."""
        previous = self.edits.get(id(node))
        if previous is None:
            self.edits[id(node)] = (node, after)
            return
        first = previous[1]

        def both(updated: cst.CSTNode) -> object:
            mid = first(updated) if callable(first) else first
            return after(mid)  # type: ignore[arg-type]

        self.edits[id(node)] = (node, both)

    def _plan_unscale(self, steps: list[tuple[cst.Call, str]]) -> str | None:
        """`scaler.unscale_(opt)` once per optimizer, before the first statement between a
        backward and that optimizer's step that reads its gradients: torch's clipping, or a call
        of the project's own that is handed the optimizer (a hand-written clip). Gradients
        touched any other way (`.grad`) in between: the fix declines (return the reason)."""
        order = self.facts._order  # source order of nodes
        first_backward = min(order[id(c)] for c in self.backward_calls)
        last_step = max(order[id(c)] for c, _ in steps)
        owners = {owner for _, owner in steps}
        readers: list[tuple[cst.Call, str]] = []
        for call in calls_in(self.loop, into_scopes=False):
            names = self.rule.qualified_names(call.func)
            if names & _CLIP:
                later = [owner for c, owner in steps if order[id(c)] > order[id(call)]]
                readers.append((call, later[0] if later else steps[-1][1]))
                continue
            if not first_backward < order[id(call)] < last_step or any(
                n.startswith("torch.") for n in names
            ):
                continue
            handed = [code_of(a.value) for a in call.args]
            owner = next((o for o in handed if o in owners), None)
            receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
            if owner is not None and (receiver is None or code_of(receiver) not in owners):
                readers.append((call, owner))
        unscaled: set[str] = set()
        for call, owner in readers:
            if owner in unscaled:
                continue  # unscale_ twice before an update is an error in torch
            stmt = self.statement_of(call)
            if any(
                isinstance(a, cst.For | cst.While) and a is not self.loop
                for a in self.facts.ancestors(stmt)
                if order.get(id(a), -1) > order[id(self.loop)]
            ):
                return "gradients are clipped inside a loop within the training loop"
            unscaled.add(owner)
            unscale = _stmt(f"{self.scaler}.unscale_({owner})")

            def insert_before(updated: cst.CSTNode, unscale=unscale) -> cst.FlattenSentinel:
                lead = getattr(updated, "leading_lines", ())
                moved = unscale.with_changes(leading_lines=lead)
                return cst.FlattenSentinel([moved, updated.with_changes(leading_lines=[])])  # type: ignore[attr-defined]

            self._compose(stmt, insert_before)
        reader_nodes = [order[id(c)] for c, _ in readers]
        for attr in nodes_of_type(self.loop, cst.Attribute, into_scopes=False):
            where = order[id(attr)]
            if (
                attr.attr.value == "grad"
                and first_backward < where < last_step
                and not any(r < where for r in reader_nodes)
            ):
                return (
                    "gradients are read (.grad) between backward() and step(): "
                    "they would be scaled; call scaler.unscale_(optimizer) before by hand"
                )
        return None

    # ----- the fix ----------------------------------------------------------------------------
    def fix(self) -> Fix:
        assert self.outer is not None
        edits = {k: v for k, (_, v) in self.edits.items()}
        new_outer = self.outer.visit(_Editor(edits, self._spine()))
        assert isinstance(new_outer, cst.BaseStatement)
        if self.device_type == '"cpu"' or not self.facts.uses_cuda:
            # No CUDA anywhere: CPU bf16. (Mentioning torch.cuda here would also make the
            # script look CUDA-bound to the CUDA-only rules on the next pass.)
            dtype = f"{self.dtype_name} = torch.bfloat16"
        elif self.device_type == '"cuda"':
            dtype = (
                f"{self.dtype_name} = torch.bfloat16 if torch.cuda.is_bf16_supported() "
                "else torch.float16"
            )
        else:
            dtype = (
                f"{self.dtype_name} = torch.bfloat16 if {self.device_type} == "
                '"cpu" or torch.cuda.is_bf16_supported() else torch.float16'
            )
        scaler = (
            f"{self.scaler} = torch.amp.GradScaler({self.device_type}, "
            f"enabled={self.dtype_name} == torch.float16)"
        )
        lead = self.outer.leading_lines  # type: ignore[attr-defined]
        replacement = cst.FlattenSentinel(
            [
                _stmt(dtype).with_changes(leading_lines=lead),
                _stmt(scaler),
                new_outer.with_changes(leading_lines=[]),
            ]
        )
        return Fix(
            replacements={self.outer: replacement},
            description="autocast the forward and loss; route backward/step through a GradScaler",
            add_imports=[ImportItem("torch")],
        )

    def _spine(self) -> set[int] | None:
        """The ids of the edited nodes' ancestors (None when a node is not in the indexed
        tree): the only nodes the edit needs to enter."""
        tree = indexed_tree(self.facts.module)
        nodes = [node for node, _ in self.edits.values()]
        if tree is None or not all(id(node) in tree.rank for node in nodes):
            return None
        return {id(up) for node in nodes for up in tree.ancestors(node)}


class _Editor(cst.CSTTransformer):
    """Applies edits keyed by node identity; an edit may be a node, a sentinel, or a function
    of the updated node (so edits can nest: a step call inside a statement that gains a line).
    With `spine` (the ids of the edited nodes' ancestors) it enters only those: the other
    subtrees are kept as they are instead of being rebuilt node by node (the same code)."""

    def __init__(self, edits: dict[int, Edit], spine: set[int] | None = None) -> None:
        super().__init__()
        self._edits = edits
        self._spine = spine

    def on_visit(self, node: cst.CSTNode) -> bool:
        return self._spine is None or id(node) in self._spine

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # noqa: ANN201
        edit = self._edits.get(id(original_node))
        if edit is None:
            return updated_node
        return edit(updated_node) if callable(edit) else edit
