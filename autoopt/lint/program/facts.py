"""Training-loop facts about one file, computed once and shared by every rule.

"Training loop": a `for`/`while` whose body (not counting nested functions) calls `.backward()`.
"Evaluation loop": a `for` over something, with no `.backward()` in it, that runs after
`<model>.eval()` in the same function (or is inside a function whose name says eval/valid/test).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, QualifiedNameProvider
from libcst.metadata.base_provider import LazyValue

from autoopt.lint.program.device import DeviceFacts, cpu_only, device_facts
from autoopt.lint.program.precision import built_in_reduced_precision, other_precision_system
from autoopt.lint.tree import metadata
from autoopt.lint.tree.nodes import (
    SCOPE_TYPES,
    assignments,
    calls_in,
    dotted,
    is_name,
    nodes_of_type,
)
from autoopt.lint.tree.text import strip_prose

Loop = cst.For | cst.While
Scope = cst.FunctionDef | cst.Module

_NO_GRAD = {
    "torch.no_grad",
    "torch.inference_mode",
    "torch.autograd.no_grad",
    "torch.autograd.grad_mode.no_grad",
    "torch.autograd.grad_mode.inference_mode",
}
# A request for determinism that is not a literal False (a flag may be True by default).
_DETERMINISM = re.compile(
    r"deterministic\s*=\s*(?!\s*False\b)\S"
    r"|use_deterministic_algorithms\(\s*(?!False\b)\S"
)
# `torch.no_grad` as written where `torch` itself cannot be resolved (a star import brought it).
_NO_GRAD_SPELLINGS = ("torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad")
# How many calls deep a helper may hide `.backward()` (loop -> train_one_epoch -> step -> backward).
_HELPER_DEPTH = 3
_EVAL_WORDS = ("eval", "valid", "test", "infer", "predict")
# Text that any evaluation loop's file contains (a `.eval()` call, or a function named like
# evaluation): rules about evaluation loops use it as their pre-filter.
EVAL_MARKERS = (
    ".eval()",
    ".train(False)",
    *(f"def {w}" for w in _EVAL_WORDS),
    *(f"def {p}_{w}" for p in ("run", "do") for w in ("eval", "valid", "test")),
)


def named_like_evaluation(name: str) -> bool:
    """`evaluate`, `val_loader`, `run_test`: a name that says evaluation, not training."""
    lowered = name.lower()
    return any(w in lowered for w in (*_EVAL_WORDS, "val_")) or lowered.startswith("val")


def _iterated_leaf(expr: cst.BaseExpression) -> str | None:
    """`test_loader` for `test_loader`, `self.test_loader`, `enumerate(test_loader)` or
    `tqdm(test_loader)`: the last name of what a loop iterates."""
    while isinstance(expr, cst.Call) and expr.args and isinstance(expr.func, cst.Name):
        expr = expr.args[0].value  # enumerate(...), tqdm(...), iter(...)
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        return expr.attr.value
    return None


class FileFacts:
    """Lazily computed facts; each property walks the tree at most once."""

    def __init__(
        self,
        wrapper: MetadataWrapper,
        source: str | None = None,
        *,
        project_training_calls: Callable[[], list[cst.Call]] | None = None,
    ) -> None:
        """`source`: the text the module was parsed from, if known (else generated on demand;
        libcst round-trips, so the two are equal, and generating costs about a parse).
        `project_training_calls`: the file's calls that train through the project's other
        code (the program model's answer, asked only when the loops are)."""
        self.module = wrapper.module
        self._parents = metadata.install(wrapper)
        self._qnames = wrapper.resolve(QualifiedNameProvider)
        self._source = source
        self._project_training_calls = project_training_calls
        self._assigned: dict[int, dict[str, list[tuple[cst.BaseExpression, cst.Assign]]]] = {}

    # ----- tree navigation --------------------------------------------------------------------
    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self._parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """Parents of `node`, innermost first, up to the module."""
        return self._parents.tree.ancestors(node)  # climbs by rank: one lookup, not one a step

    def enclosing_scope(self, node: cst.CSTNode) -> Scope:
        """The function (or the module) that contains `node`."""
        for anc in self.ancestors(node):
            if type(anc) is cst.FunctionDef:  # (exact types: see `nodes.SCOPE_TYPES`)
                return anc
        return self.module

    def under_an_if(self, node: cst.CSTNode) -> bool:
        """`node` runs only under an `if` of its own function (or of the module's code)."""
        for anc in self.ancestors(node):
            if type(anc) is cst.FunctionDef:
                return False
            if type(anc) is cst.If:
                return True
        return False

    @functools.cached_property
    def defined_names(self) -> frozenset[str]:
        """Classes and functions the file defines at its top level."""
        return frozenset(
            s.name.value for s in self.module.body if isinstance(s, cst.ClassDef | cst.FunctionDef)
        )

    @functools.cached_property
    def imported_names(self) -> frozenset[str]:
        """Names the file's imports bind (`engine` of `import engine` or `from . import
        engine`, `model` of `from retinanet import model`; star imports bind none here)."""
        found: set[str] = set()
        for node in nodes_of_type(self.module, (cst.Import, cst.ImportFrom)):
            if isinstance(node.names, cst.ImportStar):
                continue
            for alias in node.names:
                bound = alias.asname.name if alias.asname is not None else alias.name
                name = dotted(bound)
                if name is not None:
                    found.add(name.split(".")[0])
        return frozenset(found)

    def assigned_in(
        self, scope: cst.CSTNode
    ) -> dict[str, list[tuple[cst.BaseExpression, cst.Assign]]]:
        """Name (or attribute chain) -> its `(value, assignment)`s in `scope`, in source order
        (not in nested functions or classes): `nodes.assignments` read once per scope."""
        found = self._assigned.get(id(scope))
        if found is None:
            found = {}
            for target, value, assign in assignments(scope):
                found.setdefault(target, []).append((value, assign))
            self._assigned[id(scope)] = found
        return found

    def enclosing_loops(self, node: cst.CSTNode) -> list[Loop]:
        """Loops around `node` within its function, innermost first."""
        loops: list[Loop] = []
        for anc in self.ancestors(node):
            kind = type(anc)
            if kind in SCOPE_TYPES:
                break
            if kind is cst.For or kind is cst.While:
                loops.append(anc)  # type: ignore[arg-type]
        return loops

    def qualified_names(self, node: cst.CSTNode) -> AbstractSet[str]:
        if type(self._qnames) is metadata.QualifiedNames:
            return self._qnames.names(node)  # kept per node, shared with the rules
        found = self._qnames.get(node, set())
        if isinstance(found, LazyValue):  # libcst >= 1.5 resolves this provider lazily
            found = found()
        return {q.name for q in found}

    @property
    def source(self) -> str:
        if self._source is None:
            self._source = self.module.code
        return self._source

    # ----- training / evaluation loops -------------------------------------------------------
    @functools.cached_property
    def backward_calls(self) -> list[cst.Call]:
        """Every `<expr>.backward(...)` call in the file (including `scaler.scale(l).backward()`)."""
        return [
            c
            for c in list(calls_in(self.module))
            if isinstance(c.func, cst.Attribute) and c.func.attr.value == "backward"
        ]

    @functools.cached_property
    def training_calls(self) -> list[cst.Call]:
        """Calls that train through a function, method or class of the project (another module
        or this one): `train_one_epoch(model, loader, ...)`, `trainer.fit()`."""
        if self._project_training_calls is None:
            return []
        return self._project_training_calls()

    @property
    def trains(self) -> bool:
        """The file trains: a loop here calls `backward()`, or a call here trains elsewhere."""
        return bool(self.training_loops or self.training_calls)

    @functools.cached_property
    def training_points(self) -> list[cst.CSTNode]:
        """Where the file trains, in source order: its training loops (outermost), and the calls
        that train elsewhere outside those loops (`do_train(cfg, model, ...)`)."""
        loops = [
            loop
            for loop in self.training_loops
            if not any(
                other is not loop and self._parents.encloses(other, loop)
                for other in self.training_loops
            )
        ]
        calls = [
            call
            for call in self.training_calls
            if not any(self._parents.encloses(loop, call) for loop in loops)
        ]
        return sorted([*loops, *calls], key=lambda n: self._order[id(n)])

    @functools.cached_property
    def training_loops(self) -> list[Loop]:
        """Loops containing a `.backward()` call within the same function, or a call to a function
        or method of this file that calls it (`self._run_batch(x, y)`, `train_one_epoch(...)`),
        or a call that trains through the project's other code, outermost first."""
        found: dict[int, Loop] = {}
        calls = [*self.backward_calls, *self.backward_helper_calls, *self.training_calls]
        for call in [*calls, *self._optimizer_steps]:
            for loop in self.enclosing_loops(call):
                found.setdefault(id(loop), loop)
        return sorted(found.values(), key=lambda n: self._depth(n))

    @functools.cached_property
    def _optimizer_steps(self) -> list[cst.Call]:
        """`<opt>.step()` calls whose receiver the same function also zeroes
        (`phase.opt.zero_grad(set_to_none=True)` ... `phase.opt.step()`): an optimizer stepped
        where the backward runs in code no one can resolve (stylegan2-ada's
        `loss.accumulate_gradients(...)` of a class built from a config string)."""
        zeroed: dict[tuple[int, str], bool] = {}
        steps: list[tuple[int, str, cst.Call]] = []
        for call in calls_in(self.module):
            if not isinstance(call.func, cst.Attribute):
                continue
            method, receiver = call.func.attr.value, dotted(call.func.value)
            if receiver is None or method not in ("zero_grad", "step"):
                continue
            scope = id(self.enclosing_scope(call))
            if method == "zero_grad":
                zeroed[(scope, receiver)] = True
            elif not call.args:
                steps.append((scope, receiver, call))
        return [call for scope, receiver, call in steps if (scope, receiver) in zeroed]

    @functools.cached_property
    def backward_helpers(self) -> set[str]:
        """Names of this file's functions and methods that call `.backward()`, directly or through
        other functions of this file (at most `_HELPER_DEPTH` calls deep), and the names bound
        to one of them (`_helper_aliases`)."""
        return self._backward_defs | set(self._helper_aliases)

    @functools.cached_property
    def _helper_aliases(self) -> dict[str, str]:
        return _aliases_of(self.module, self._backward_defs)

    @functools.cached_property
    def _backward_defs(self) -> set[str]:
        """`backward_helpers` without the aliases."""
        defs: dict[str, list[cst.FunctionDef]] = {}
        for node in nodes_of_type(self.module, cst.FunctionDef):
            defs.setdefault(node.name.value, []).append(node)
        found = {self.enclosing_scope(c) for c in self.backward_calls}
        names = {f.name.value for f in found if isinstance(f, cst.FunctionDef)}
        for _ in range(_HELPER_DEPTH):
            grown = {
                name
                for name, funcs in defs.items()
                if name not in names
                and any(local_callee(c) in names for f in funcs for c in calls_in(f.body))
            }
            if not grown:
                break
            names |= grown
        return names

    @functools.cached_property
    def backward_helper_calls(self) -> list[cst.Call]:
        """Calls `f(...)` / `self.f(...)` of a function in `backward_helpers`, outside `f` itself."""
        helpers = self.backward_helpers
        out = []
        for call in calls_in(self.module):
            name = local_callee(call)
            if name in helpers:
                scope = self.enclosing_scope(call)
                if not (isinstance(scope, cst.FunctionDef) and scope.name.value == name):
                    out.append(call)
        return out

    @functools.cached_property
    def step_functions(self) -> list[cst.FunctionDef]:
        """Functions that run one training step: they call `.backward()` outside any loop of
        their own and are called from a training loop (`for b in loader: self._run_batch(b)`)."""
        aliases = self._helper_aliases
        called_in_loop = {
            aliases.get(name, name)
            for c in self.backward_helper_calls
            if self.enclosing_loops(c) and (name := local_callee(c)) is not None
        }
        found: dict[int, cst.FunctionDef] = {}
        for call in self.backward_calls:
            scope = self.enclosing_scope(call)
            if (
                isinstance(scope, cst.FunctionDef)
                and not self.enclosing_loops(call)
                and scope.name.value in called_in_loop
            ):
                found.setdefault(id(scope), scope)
        return list(found.values())

    @functools.cached_property
    def innermost_training_loops(self) -> dict[cst.CSTNode, list[cst.Call]]:
        """Each innermost loop around `.backward()` calls (within their function), with those
        calls, in source order: the loops a per-step rewrite (autocast, a scaler) edits."""
        groups: dict[int, tuple[cst.CSTNode, list[cst.Call]]] = {}
        for call in self.backward_calls:
            loops = self.enclosing_loops(call)
            if loops:
                groups.setdefault(id(loops[0]), (loops[0], []))[1].append(call)
        return {loop: calls for loop, calls in groups.values()}

    def is_training_loop(self, loop: cst.CSTNode) -> bool:
        return any(loop is t for t in self.training_loops)

    def training_loop_of(self, node: cst.CSTNode) -> Loop | None:
        """The innermost training loop around `node` (None if it is not in one)."""
        for loop in self.enclosing_loops(node):
            if self.is_training_loop(loop):
                return loop
        return None

    def in_training_loop(self, node: cst.CSTNode) -> bool:
        return self.training_loop_of(node) is not None

    @functools.cached_property
    def eval_calls(self) -> list[cst.Call]:
        """Every `<expr>.eval()` call with no arguments, and its spelling `<expr>.train(False)`
        (reproduce-chexnet's `model.train(False)` before its prediction loop)."""
        return [
            c
            for c in list(calls_in(self.module))
            if isinstance(c.func, cst.Attribute)
            and (
                (not c.args and c.func.attr.value == "eval")
                or (
                    c.func.attr.value == "train"
                    and len(c.args) == 1
                    and (c.args[0].keyword is None or c.args[0].keyword.value == "mode")
                    and is_name(c.args[0].value, "False")
                )
            )
        ]

    def is_eval_loop(self, loop: cst.CSTNode, whiles: bool = False) -> bool:
        """A `for` (or, with `whiles`, a `while`: an RL test's episode loop) with no backward
        inside that follows `.eval()` in its function (or whose function is named like
        evaluation)."""
        kinds = (cst.For, cst.While) if whiles else cst.For
        if not isinstance(loop, kinds) or self.is_training_loop(loop):
            return False
        if any(self._parents.encloses(loop, call) for call in self.backward_calls):
            return False
        scope = self.enclosing_scope(loop)
        # a `while` counts only after `.eval()`: in a method named for inference it is more
        # often the model's own decoding loop (Tacotron 2's `Decoder.inference`)
        if (
            isinstance(loop, cst.For)
            and isinstance(scope, cst.FunctionDef)
            and any(w in scope.name.value.lower() for w in _EVAL_WORDS)
        ):
            return True
        iterated = _iterated_leaf(loop.iter) if isinstance(loop, cst.For) else None
        if (
            iterated is not None
            and "loader" in iterated.lower()
            and named_like_evaluation(iterated)
        ):
            return True  # `for batch in testing_data_loader:` in the epoch loop (pix2pix)
        for call in self.eval_calls:
            if self.enclosing_scope(call) is not scope or not self.before(call, loop):
                continue
            # ... and no .train() between that eval() and the loop
            if not any(
                self.enclosing_scope(t) is scope and self.before(call, t) and self.before(t, loop)
                for t in self.train_calls
            ):
                return True
        return False

    @functools.cached_property
    def train_calls(self) -> list[cst.Call]:
        return [
            c
            for c in list(calls_in(self.module))
            if isinstance(c.func, cst.Attribute) and c.func.attr.value == "train"
        ]

    # ----- gradient mode -----------------------------------------------------------------------
    def in_no_grad(self, node: cst.CSTNode, _depth: int = 0) -> bool:
        """Inside `with torch.no_grad()/inference_mode()/set_grad_enabled(False)`, in a function
        decorated with no_grad/inference_mode, or in a function of this file that is only ever
        called from such places (`with torch.no_grad(): evaluate(model, loader)`)."""
        if self._grad_switched_off_before(node):
            return True
        for anc in self.ancestors(node):
            if isinstance(anc, cst.With) and (
                any(self._is_no_grad(i.item) for i in anc.items) or self._enters_no_grad(anc, node)
            ):
                return True
            if isinstance(anc, cst.FunctionDef):
                if any(self._is_no_grad(d.decorator) for d in anc.decorators):
                    return True
                if _depth < _HELPER_DEPTH and self._only_called_in_no_grad(anc, _depth):
                    return True
        return False

    def _enters_no_grad(self, block: cst.With, node: cst.CSTNode) -> bool:
        """`with ExitStack() as stack:` whose body enters no_grad on every path before `node`
        (detectron2's `stack.enter_context(torch.no_grad())`, a statement of the block)."""
        stacks = {
            item.asname.name.value
            for item in block.items
            if isinstance(item.item, cst.Call)
            and (dotted(item.item.func) or "").endswith("ExitStack")
            and item.asname is not None
            and isinstance(item.asname.name, cst.Name)
        }
        if not stacks or not isinstance(block.body, cst.IndentedBlock):
            return False
        for stmt in block.body.body:
            if not isinstance(stmt, cst.SimpleStatementLine) or not self.before(stmt, node):
                continue
            for small in stmt.body:
                call = small.value if isinstance(small, cst.Expr) else None
                if (
                    isinstance(call, cst.Call)
                    and isinstance(call.func, cst.Attribute)
                    and call.func.attr.value == "enter_context"
                    and isinstance(call.func.value, cst.Name)
                    and call.func.value.value in stacks
                    and call.args
                    and self._is_no_grad(call.args[0].value)
                ):
                    return True
        return False

    def _grad_switched_off_before(self, node: cst.CSTNode) -> bool:
        """A `torch.set_grad_enabled(False)` statement runs earlier in `node`'s function (an
        evaluation script that switches autograd off once), and no `(True)` after it."""
        scope = self.enclosing_scope(node)
        last = None
        for call, enabled in self._grad_switches:
            if self.enclosing_scope(call) is scope and self.before(call, node):
                last = enabled
        return last is False

    @functools.cached_property
    def _grad_switches(self) -> list[tuple[cst.Call, bool]]:
        """`torch.set_grad_enabled(<bool>)` calls that are statements of their own."""
        if "set_grad_enabled" not in self.source:
            return []
        found = []
        for call in calls_in(self.module):
            holder = self.parent(call)
            if not isinstance(holder, cst.Expr) or not call.args:
                continue
            names = self.qualified_names(call.func)
            if names & {"torch.set_grad_enabled", "torch.autograd.set_grad_enabled"}:
                flag = call.args[0].value
                if m.matches(flag, m.Name("False") | m.Name("True")):
                    found.append((call, m.matches(flag, m.Name("True"))))
        return found

    def _only_called_in_no_grad(self, func: cst.FunctionDef, depth: int) -> bool:
        calls = self._local_calls.get(func.name.value, [])
        return bool(calls) and all(self.in_no_grad(c, depth + 1) for c in calls)

    @functools.cached_property
    def _local_calls(self) -> dict[str, list[cst.Call]]:
        """Calls that may run a function or method of this file, by its name."""
        found: dict[str, list[cst.Call]] = {}
        for call in calls_in(self.module):
            name = local_callee(call)
            if name is not None:
                found.setdefault(name, []).append(call)
        return found

    def _is_no_grad(self, expr: cst.BaseExpression) -> bool:
        target = expr.func if isinstance(expr, cst.Call) else expr
        names = self.qualified_names(target)
        if names & _NO_GRAD:
            return True
        if not names and (dotted(target) or "").endswith(_NO_GRAD_SPELLINGS):
            # `torch` bound by a star import of the project (`from modeling.deeplab import *`):
            # no qualified name resolves, the spelling is torch's
            return True
        if isinstance(expr, cst.Call) and names & {
            "torch.set_grad_enabled",
            "torch.autograd.set_grad_enabled",
        }:
            return bool(expr.args) and m.matches(expr.args[0].value, m.Name("False"))
        if isinstance(target, cst.Name):
            return self._bound_to_no_grad(target)
        return False

    def _bound_to_no_grad(self, name: cst.Name) -> bool:
        """`name` is bound, in the nearest scope that binds it, only to torch's no-grad modes
        (TabM: `evaluation_mode = torch.no_grad` or `torch.inference_mode`, then
        `@evaluation_mode()`)."""
        for scope in self.ancestors(name):
            if not isinstance(scope, cst.FunctionDef | cst.Module):
                continue
            values = [value for value, _ in self.assigned_in(scope).get(name.value, ())]
            if values:
                return all(self._no_grad_mode(v) for v in values)
        return False

    def _no_grad_mode(self, value: cst.BaseExpression) -> bool:
        """`torch.no_grad`, `torch.inference_mode`, or `a if flag else b` of those."""
        if isinstance(value, cst.IfExp):
            return self._no_grad_mode(value.body) and self._no_grad_mode(value.orelse)
        return bool(self.qualified_names(value) & _NO_GRAD)

    # ----- whole-file facts ------------------------------------------------------------------
    @functools.cached_property
    def other_precision(self) -> str | None:
        """The mixed-precision scheme the script runs other than torch's autocast/GradScaler
        (apex amp, a model cast to half/bf16 or built so, hand-written loss scaling), or None."""
        return other_precision_system(self.module, self.source) or built_in_reduced_precision(
            self.module
        )

    @functools.cached_property
    def names_torch_amp(self) -> bool:
        """The text names torch's own AMP (`autocast`, `GradScaler`): the script has chosen its
        mixed precision already."""
        code = strip_prose(self.source)  # an AMP loop left in comments (YOLOS) is not in use
        return "autocast" in code or "GradScaler" in code

    @functools.cached_property
    def uses_cuda(self) -> bool:
        """The script runs (or can run) on CUDA: `.cuda()`, a "cuda" device string, torch.cuda."""
        s = self.source
        return ".cuda(" in s or "'cuda" in s or '"cuda' in s or "torch.cuda" in s

    @functools.cached_property
    def device(self) -> DeviceFacts:
        """Whether the script has a GPU path (CUDA, torch.accelerator, a device flag or a device
        parameter; see `autoopt.lint.program.device`): the gate of every rule about a CUDA trick."""
        return device_facts(self.module, self.parent)

    @functools.cached_property
    def cpu_only(self) -> bool:
        """The script trains on the CPU and nowhere else (`autoopt.lint.program.device.cpu_only`): advice
        for CUDA runs (mixed precision with a GradScaler) does not apply to it."""
        return cpu_only(self.device, self.source)

    @functools.cached_property
    def switches_determinism_on(self) -> bool:
        """`cudnn.deterministic = True` or `torch.use_deterministic_algorithms(True)`, literally
        (see `requests_determinism` for any spelling)."""
        s = self.source
        return (
            "deterministic = True" in s
            or "deterministic=True" in s
            or "use_deterministic_algorithms(True" in s
        )

    @functools.cached_property
    def requests_determinism(self) -> bool:
        """Determinism may be asked for, in any spelling: `cudnn.deterministic = True`, or set
        from a flag (`= args.torch_deterministic`, True by default in cleanrl), or
        `torch.use_deterministic_algorithms(<anything but False>)`, or `deterministic=True`
        handed to a library (Lightning's Trainer)."""
        return bool(_DETERMINISM.search(strip_prose(self.source)))

    # ----- positions ------------------------------------------------------------------------------
    def _depth(self, node: cst.CSTNode) -> int:
        return sum(1 for _ in self.ancestors(node))

    def before(self, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        """`a` comes before `b` in source order (both in this module)."""
        return self._order[id(a)] < self._order[id(b)]

    @property
    def _order(self) -> Mapping[int, int]:
        """id(node) -> rank in source order."""
        return self._parents.order


def _aliases_of(module: cst.Module, helpers: set[str]) -> dict[str, str]:
    """`backwards = partial(loss_backwards, self.fp16)` (lucidrains' stylegan2), `step =
    train_step`: alias -> the helper of `helpers` it calls."""
    found: dict[str, str] = {}
    for assign in nodes_of_type(module, cst.Assign):
        value = assign.value
        if isinstance(value, cst.Call) and (dotted(value.func) or "").endswith("partial"):
            value = value.args[0].value if value.args else value
        if isinstance(value, cst.Name) and value.value in helpers:
            for target in assign.targets:
                if isinstance(target.target, cst.Name):
                    found[target.target.value] = value.value
    return found


def local_callee(call: cst.Call) -> str | None:
    """`f` for `f(...)` and `self.f(...)`/`cls.f(...)`: a call that can reach a def of this file."""
    func = call.func
    if type(func) is cst.Name:
        return func.value
    # (exact types, not libcst matchers: this runs for every call of a file, several times)
    if (
        type(func) is cst.Attribute
        and type(func.value) is cst.Name
        and func.value.value in ("self", "cls")
    ):
        return func.attr.value
    return None
