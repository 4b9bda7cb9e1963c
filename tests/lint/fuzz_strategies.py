"""Hypothesis strategies that mutate real training code into the shapes real repositories have.

Seeds are every rule's VALID/INVALID examples and `examples/naive/*.py`. A mutant is a seed
after a few libcst-level mutations, each of which keeps the file parseable: identifiers renamed
(to torch-like names too), imports aliased, statements wrapped in `if`/`with`/`try`/`match`/
functions/classes/async defs, snippets inserted (`as` targets, walrus, star targets, match,
`global`/`nonlocal`, f-strings, line continuations, `**kwargs` calls, ...), statements deleted,
decorators, comments, annotations, keyword arguments moved into `**{...}`, arguments dropped,
names turned into attributes/items/calls, strings into f-strings and implicit concatenations.
"""

from __future__ import annotations

import keyword
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import libcst as cst
from hypothesis import assume
from hypothesis import strategies as st
from libcst.helpers import get_full_name_for_node

from autoopt.lint.engine.config import parse_target_version
from autoopt.lint.engine.registry import load_registry
from autoopt.lint.engine.rule import rule_examples

NAIVE = Path(__file__).resolve().parents[2] / "examples" / "naive"


@dataclass(frozen=True)
class Seed:
    """A source to mutate and the torch version its rule example targets (None: any)."""

    name: str
    source: str
    target_version: tuple[int, int] | None = None


def load_seeds() -> list[Seed]:
    """Every rule example (valid and invalid) and every naive example script."""
    seeds: list[Seed] = []
    for rule in load_registry().all():
        for i, example in enumerate(rule_examples(rule)):
            version = getattr(example, "target_version", None)
            seeds.append(
                Seed(
                    f"{rule.code}-{i}",
                    example.code,
                    parse_target_version(version) if version else None,
                )
            )
    for path in sorted(NAIVE.glob("*.py")):
        seeds.append(Seed(path.name, path.read_text(encoding="utf-8")))
    return seeds


# Names real scripts use, including ones that shadow torch's (a rule keyed on the text "compile"
# or "cuda" must not mistake a local `compile` or `cuda` for torch's).
NEW_NAMES = (
    "compile", "torch", "cuda", "T", "nn", "N", "DL", "F", "model", "optimizer", "loss",
    "device", "scaler", "loader", "x", "autocast", "DataLoader", "backward", "step", "_",
)  # fmt: skip
ALIASES = ("T", "N", "DL", "F", "tnn", "_torch", "cuda", "compile", "nn", "amp")

# Statements real training code has, written to exercise `as` targets, walrus, star targets,
# match, scoping statements, f-strings, continuations and `**kwargs` calls.
SNIPPETS = (
    "import torch as T\n",
    "from torch import nn as N\n",
    "from torch.utils.data import DataLoader as DL\n",
    "import torch.nn.functional as F, os as _os\n",
    "from torch.cuda import amp\n",
    "from torch import *\n",
    "x = T.randn(4).cuda()\n",
    "cuda = torch.cuda.is_available()\n",
    'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n',
    "Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor\n",
    "with torch.no_grad() as (b, c):\n    pass\n",
    'with open(__file__) as fh, torch.autocast("cpu") as ac:\n    pass\n',
    "try:\n    model.cuda()\nexcept (RuntimeError, ValueError) as e:\n    print(e)\n",
    "try:\n    pass\nexcept* OSError as eg:\n    pass\n",
    "if (n := len(loader)) > 0:\n    print(n)\n",
    "first, *rest = list(range(3))\n",
    "(a, b), c = (1, 2), 3\n",
    "[model, *others] = [model]\n",
    'kwargs = {"num_workers": 2, "pin_memory": True}\nloader2 = DataLoader([1, 2], **kwargs)\n',
    "loader = torch.utils.data.DataLoader(*args, **vars(opts))\n",
    "loss_fn = lambda out, y=None, *a, **k: out.mean()\n",
    "print(f\"{model!r:>10} {x.shape[0]:d} {'cuda'} {{}}\")\n",
    "total = 1 + \\\n    2\n",
    "value = (loss\n         .item())\n",
    'total: "torch.Tensor" = torch.zeros(1)\n',
    "count: int\n",
    "def _g():\n    global model\n    model = torch.compile(model)\n",
    "def _o():\n    n = 0\n\n    def _i():\n        nonlocal n\n        n += 1\n\n    return _i\n",
    'match device:\n    case "cuda" | torch.device(type="cuda"):\n        model.cuda()\n'
    '    case [a, *rest] if a:\n        pass\n    case {"k": v, **kw}:\n        pass\n'
    "    case _:\n        pass\n",
    "del x\n",
    "@torch.no_grad()\ndef evaluate(model, loader):\n    for x in loader:\n        model(x)\n",
    "async def _a():\n    async with lock as l:\n        async for x in loader:\n            await x\n",
    "class _C(nn.Module):\n    def forward(self, x, /, *, y: int = 0) -> torch.Tensor:\n"
    "        return super().forward(x)\n",
    "torch.backends.cudnn.benchmark = True\n",
    "optimizer.zero_grad(set_to_none=False)\n",
    "model = torch.nn.DataParallel(model)\n",
    "loss.backward(); optimizer.step()\n",
    "for i, (x, y) in enumerate(loader): loss = model(x); loss.backward()\n",
    "x = x.to(device, non_blocking=True) if x is not None else x\n",
    "while True:\n    break\nelse:\n    pass\n",
    "assert torch.cuda.is_available(), 'needs a GPU'\n",
    "x = [y.cuda() for y in loader if y is not None]\n",
    "yield_ = {k: v for k, v in model.state_dict().items()}\n",
)

# Compound statements to wrap statements in; `{body}` is replaced by the wrapped statements.
WRAPPERS = (
    "if cuda:\n    pass\n",
    "if __name__ == '__main__':\n    pass\nelse:\n    pass\n",
    "with torch.no_grad():\n    pass\n",
    "with ctx() as (a, b), other as c:\n    pass\n",
    "try:\n    pass\nexcept Exception as e:\n    raise\n",
    "try:\n    pass\nfinally:\n    print('done')\n",
    "def _wrapped(*args, **kwargs):\n    pass\n",
    "async def _wrapped_async():\n    pass\n",
    "class _Wrapped:\n    pass\n",
    "for _epoch in range(2):\n    pass\n",
    "while True:\n    pass\n",
    "match args:\n    case _:\n        pass\n",
)

DECORATORS = (
    "torch.no_grad()",
    "torch.compile",
    "functools.lru_cache(maxsize=None)",
    "(lambda f: f)",
    "staticmethod",
    "torch.inference_mode()",
)

COMMENTS = (
    "# noqa",
    "# noqa: AO201",
    "# type: ignore",
    "# torch.cuda.synchronize()",
    "# fmt: off",
    "# autoopt: noqa",
    '# """ not a string',
)

ANNOTATIONS = ("torch.Tensor", "int", '"nn.Module"', "Any", "list[int] | None")


# ----- where statements are -------------------------------------------------------------------


def _bodies(module: cst.Module) -> list[cst.Module | cst.IndentedBlock]:
    """Every statement list of the module: the module itself and every indented block."""
    found: list[cst.Module | cst.IndentedBlock] = [module]

    class _Collect(cst.CSTVisitor):
        def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
            found.append(node)

    module.visit(_Collect())
    return found


def _with_body(
    module: cst.Module, body: cst.Module | cst.IndentedBlock, statements: list[cst.BaseStatement]
) -> cst.Module:
    """`module` with the statements of `body` (one of its statement lists) replaced."""
    if not statements:
        statements = [cst.SimpleStatementLine([cst.Pass()])]
    if body is module:
        return module.with_changes(body=statements)
    new = module.deep_replace(body, body.with_changes(body=statements))
    assert isinstance(new, cst.Module)
    return new


def _nodes(
    module: cst.Module, kind: type | tuple[type, ...], *, in_imports: bool = True
) -> list[cst.CSTNode]:
    """The nodes of type `kind` in `module` (not those inside import statements unless
    `in_imports`: `import a.b` must stay a dotted name)."""
    found: list[cst.CSTNode] = []

    class _Collect(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, kind):
                found.append(node)
            return in_imports or not isinstance(node, cst.Import | cst.ImportFrom)

    module.visit(_Collect())
    return found


def _replace(module: cst.Module, old: cst.CSTNode, new: cst.CSTNode) -> cst.Module:
    out = module.deep_replace(old, new)
    assert isinstance(out, cst.Module)
    return out


# ----- mutations ------------------------------------------------------------------------------

Mutation = Callable[[st.DrawFn, cst.Module], cst.Module]


class _Rename(cst.CSTTransformer):
    def __init__(self, old: str, new: str, *, skip_attributes: bool = False) -> None:
        super().__init__()
        self.old, self.new, self.skip_attributes = old, new, skip_attributes

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if self.skip_attributes:  # rename `x` in `x.y` but not `y`
            node.value.visit(self)
            return False
        return True

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
        if self.skip_attributes:
            return updated.with_changes(value=original.value.visit(self))
        return updated

    def visit_ImportAlias(self, node: cst.ImportAlias) -> bool:
        return not self.skip_attributes  # the imported name itself keeps its spelling

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        return updated.with_changes(value=self.new) if updated.value == self.old else updated


def rename_identifier(draw: st.DrawFn, module: cst.Module) -> cst.Module:
    """Every occurrence of one identifier becomes another (possibly a torch-like) name."""
    names = sorted(
        {n.value for n in _nodes(module, cst.Name) if not n.value.startswith("__")}  # type: ignore[attr-defined]
    )
    if not names:
        return module
    old = draw(st.sampled_from(names))
    new = draw(st.sampled_from(NEW_NAMES) | st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True))
    assume(not keyword.iskeyword(new) and not keyword.issoftkeyword(new) or new == "_")
    out = module.visit(_Rename(old, new))
    assert isinstance(out, cst.Module)
    return out


def alias_import(draw: st.DrawFn, module: cst.Module) -> cst.Module:
    """`import torch` -> `import torch as T` (uses renamed), `from m import n` -> `... as N`,
    `import torch.nn` -> `import torch.nn as N` (`torch.nn.X` uses become `N.X`)."""
    aliases = [
        a
        for a in _nodes(module, cst.ImportAlias)
        if a.asname is None and not _in_future_import(module, a)  # type: ignore[attr-defined]
    ]
    if not aliases:
        return module
    alias = draw(st.sampled_from(aliases))
    assert isinstance(alias, cst.ImportAlias)
    new_name = draw(st.sampled_from(ALIASES))
    dotted = get_full_name_for_node(alias.name)
    assert dotted is not None
    module = _replace(module, alias, alias.with_changes(asname=cst.AsName(name=cst.Name(new_name))))
    if "." not in dotted:
        out = module.visit(_Rename(dotted, new_name, skip_attributes=True))
    else:
        out = module.visit(_ReplaceDotted(dotted, new_name))
    assert isinstance(out, cst.Module)
    return out


def _in_future_import(module: cst.Module, alias: cst.CSTNode) -> bool:
    return any(
        isinstance(s, cst.ImportFrom)
        and get_full_name_for_node(s.module) == "__future__"  # type: ignore[arg-type]
        and any(a is alias for a in s.names)  # type: ignore[union-attr]
        for s in _nodes(module, cst.ImportFrom)
    )


class _ReplaceDotted(cst.CSTTransformer):
    """`a.b` (a whole attribute chain spelled so) becomes the name `new`."""

    def __init__(self, dotted: str, new: str) -> None:
        super().__init__()
        self.dotted, self.new = dotted, new

    def visit_ImportAlias(self, node: cst.ImportAlias) -> bool:
        return False

    def leave_Attribute(
        self, original: cst.Attribute, updated: cst.Attribute
    ) -> cst.BaseExpression:
        if get_full_name_for_node(original) == self.dotted:
            return cst.Name(self.new)
        return updated


def _pick_span(
    draw: st.DrawFn, module: cst.Module
) -> tuple[cst.Module | cst.IndentedBlock, int, int]:
    body = draw(st.sampled_from(_bodies(module)))
    n = len(body.body)
    start = draw(st.integers(0, max(0, n - 1)))
    stop = draw(st.integers(start, n))
    return body, start, stop


def wrap_statements(draw: st.DrawFn, module: cst.Module) -> cst.Module:
    """A run of statements moves into an `if`/`with`/`try`/`def`/`class`/loop/`match`."""
    body, start, stop = _pick_span(draw, module)
    statements = list(body.body)
    inner = statements[start:stop] or [cst.SimpleStatementLine([cst.Pass()])]
    wrapper = cst.parse_statement(draw(st.sampled_from(WRAPPERS)))
    assert isinstance(wrapper, cst.BaseCompoundStatement)
    if isinstance(wrapper, cst.Match):
        case = wrapper.cases[0]
        new_case = case.with_changes(body=case.body.with_changes(body=inner))
        wrapped: cst.BaseStatement = wrapper.with_changes(cases=[new_case])
    else:
        block = wrapper.body
        assert isinstance(block, cst.IndentedBlock)
        if isinstance(wrapper, cst.FunctionDef) and draw(st.booleans()):
            # `global` for the names the moved statements bind keeps them module-level
            inner = [cst.parse_statement("global model, loader, optimizer\n"), *inner]
        wrapped = wrapper.with_changes(body=block.with_changes(body=inner))
    replacement = [wrapped]
    if isinstance(wrapper, cst.FunctionDef) and draw(st.booleans()):
        call = "_wrapped()\n" if not wrapper.asynchronous else "asyncio.run(_wrapped_async())\n"
        replacement.append(cst.parse_statement(call))
    return _with_body(module, body, statements[:start] + replacement + statements[stop:])


def insert_snippet(draw: st.DrawFn, module: cst.Module) -> cst.Module:
    """Statements from `SNIPPETS` go in at some position of some block."""
    body = draw(st.sampled_from(_bodies(module)))
    statements = list(body.body)
    at = draw(st.integers(0, len(statements)))
    snippet = cst.parse_module(draw(st.sampled_from(SNIPPETS))).body
    return _with_body(module, body, statements[:at] + list(snippet) + statements[at:])


def delete_statement(draw: st.DrawFn, module: cst.Module) -> cst.Module:
    """One statement (simple or compound, with everything inside it) is gone."""
    body = draw(st.sampled_from(_bodies(module)))
    statements = list(body.body)
    if not statements:
        return module
    at = draw(st.integers(0, len(statements) - 1))
    return _with_body(module, body, statements[:at] + statements[at + 1 :])


def add_decorator(draw: st.DrawFn, module: cst.Module) -> cst.Module:
    defs = _nodes(module, (cst.FunctionDef, cst.ClassDef))
    if not defs:
        return module
    node = draw(st.sampled_from(defs))
    assert isinstance(node, cst.FunctionDef | cst.ClassDef)
    decorator = cst.Decorator(cst.parse_expression(draw(st.sampled_from(DECORATORS))))
    return _replace(module, node, node.with_changes(decorators=[decorator, *node.decorators]))


def add_comment(draw: st.DrawFn, module: cst.Module) -> cst.Module:
    """A comment at the end of a line or on a line of its own."""
    lines = _nodes(module, cst.SimpleStatementLine)
    if not lines:
        return module
    line = draw(st.sampled_from(lines))
    assert isinstance(line, cst.SimpleStatementLine)
    comment = cst.Comment(draw(st.sampled_from(COMMENTS)))
    if draw(st.booleans()):
        new = line.with_changes(
            trailing_whitespace=cst.TrailingWhitespace(cst.SimpleWhitespace("  "), comment)
        )
    else:
        new = line.with_changes(leading_lines=[*line.leading_lines, cst.EmptyLine(comment=comment)])
    return _replace(module, line, new)


def keywords_to_kwargs(draw: st.DrawFn, module: cst.Module) -> cst.Module:
    """`f(a, k=v)` -> `f(a, **{"k": v})` or `f(a, **dict(k=v))`: options in a `**kwargs`."""
    calls = [c for c in _nodes(module, cst.Call) if any(a.keyword for a in c.args)]  # type: ignore[attr-defined]
    if not calls:
        return module
    call = draw(st.sampled_from(calls))
    assert isinstance(call, cst.Call)
    keep = [a for a in call.args if a.keyword is None and not a.star]
    stars = [a for a in call.args if a.star]
    moved = [a for a in call.args if a.keyword is not None]
    if draw(st.booleans()):
        elements = [
            cst.DictElement(cst.SimpleString(f'"{a.keyword.value}"'), a.value)  # type: ignore[union-attr]
            for a in moved
        ]
        packed: cst.BaseExpression = cst.Dict(elements)
    else:
        packed = cst.Call(
            cst.Name("dict"), [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in moved]
        )
    args = [*(a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in keep + stars)]
    args.append(cst.Arg(packed, star="**"))
    return _replace(module, call, call.with_changes(args=args))


def reshape_assignment(draw: st.DrawFn, module: cst.Module) -> cst.Module:
    """`x = v` -> annotated, walrus, tuple/star unpacking or a lambda call."""
    assigns = [
        a
        for a in _nodes(module, cst.Assign)
        if len(a.targets) == 1 and isinstance(a.targets[0].target, cst.Name)  # type: ignore[attr-defined]
    ]
    if not assigns:
        return module
    node = draw(st.sampled_from(assigns))
    assert isinstance(node, cst.Assign)
    name = node.targets[0].target
    value = node.value
    shape = draw(st.sampled_from(("annotated", "walrus", "tuple", "star", "list", "lambda")))
    if shape == "annotated":
        annotation = cst.Annotation(cst.parse_expression(draw(st.sampled_from(ANNOTATIONS))))
        new: cst.BaseSmallStatement = cst.AnnAssign(name, annotation, value)
    elif shape == "walrus":
        new = cst.Expr(cst.NamedExpr(name, value, lpar=[cst.LeftParen()], rpar=[cst.RightParen()]))
    elif shape == "tuple":
        new = cst.Assign(
            [cst.AssignTarget(cst.Tuple([cst.Element(name), cst.Element(cst.Name("_"))]))],
            cst.Tuple([cst.Element(value), cst.Element(cst.Name("None"))]),
        )
    elif shape == "star":
        new = cst.Assign(
            [
                cst.AssignTarget(
                    cst.Tuple([cst.Element(name), cst.StarredElement(cst.Name("_rest"))])
                )
            ],
            cst.List([cst.Element(value)]),
        )
    elif shape == "list":
        new = cst.Assign(
            [cst.AssignTarget(cst.List([cst.Element(name)]))], cst.List([cst.Element(value)])
        )
    else:
        new = node.with_changes(
            value=cst.Call(
                cst.Lambda(cst.Parameters(), value, lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            )
        )
    return _replace(module, node, new)


def drop_arguments(draw: st.DrawFn, module: cst.Module) -> cst.Module:
    """A call loses some of its arguments (`x.to()`, `DataLoader()`, `torch.compile()`)."""
    calls = [c for c in _nodes(module, cst.Call) if c.args]  # type: ignore[attr-defined]
    if not calls:
        return module
    call = draw(st.sampled_from(calls))
    assert isinstance(call, cst.Call)
    kept = [a for a in call.args if draw(st.booleans())]
    if kept:
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return _replace(module, call, call.with_changes(args=kept))


# What a name can stand for in real code: an attribute, an item, a call, a conditional.
EXPRESSIONS = ("self.{}", "{}[0]", "get_{}()", "({})", "({} if cuda else None)", "{}.module", "*{}")


def complicate_name(draw: st.DrawFn, module: cst.Module) -> cst.Module:
    """A name that is read (not assigned, not imported) becomes a more complex expression."""
    names = [
        n
        for n in _nodes(module, (cst.Call, cst.Arg, cst.Attribute), in_imports=False)
        if isinstance(n, cst.Call)
        and isinstance(n.func, cst.Name)
        or isinstance(n, cst.Arg)
        and isinstance(n.value, cst.Name)
        or isinstance(n, cst.Attribute)
        and isinstance(n.value, cst.Name)
    ]
    if not names:
        return module
    node = draw(st.sampled_from(names))
    template = draw(st.sampled_from(EXPRESSIONS))
    if isinstance(node, cst.Arg):
        if template == "*{}":  # `f(*x)`: a starred argument
            if node.keyword is not None or node.star:
                return module
            return _replace(module, node, node.with_changes(star="*"))
        new = cst.parse_expression(template.format(node.value.value))  # type: ignore[attr-defined]
        return _replace(module, node, node.with_changes(value=new))
    if template == "*{}":
        return module
    if isinstance(node, cst.Call):
        func = cst.parse_expression(template.format(node.func.value))  # type: ignore[attr-defined]
        return _replace(module, node, node.with_changes(func=func))
    assert isinstance(node, cst.Attribute)
    value = cst.parse_expression(template.format(node.value.value))  # type: ignore[attr-defined]
    return _replace(module, node, node.with_changes(value=value))


def reshape_string(draw: st.DrawFn, module: cst.Module) -> cst.Module:
    """`"cuda"` -> `f"cuda"`, `"cu" "da"`, `'cuda'` or `"cuda:{}".format(0)`-like shapes."""
    strings = [
        s
        for s in _nodes(module, cst.SimpleString)
        if s.prefix == ""
        and len(s.value) >= 3
        and s.quote in ('"', "'")  # type: ignore[attr-defined]
        and not any(c in s.value for c in "{}\\")  # type: ignore[attr-defined]
    ]
    if not strings:
        return module
    node = draw(st.sampled_from(strings))
    assert isinstance(node, cst.SimpleString)
    text = node.value[1:-1]
    cut = draw(st.integers(0, len(text)))
    shapes = (
        f'f"{text}"',
        f'"{text[:cut]}" "{text[cut:]}"',
        f'f"{text[:cut]}{{0}}{text[cut:]}"',
        f'("{text}")',
    )
    if '"' in text:
        return module
    return _replace(module, node, cst.parse_expression(draw(st.sampled_from(shapes))))


def restyle_indent(draw: st.DrawFn, module: cst.Module) -> cst.Module:
    """Tabs or two-space indentation (blocks that follow the file's default follow it)."""
    return module.with_changes(default_indent=draw(st.sampled_from(("\t", "  ", "        "))))


MUTATIONS: tuple[Mutation, ...] = (
    rename_identifier,
    alias_import,
    wrap_statements,
    insert_snippet,
    delete_statement,
    add_decorator,
    add_comment,
    keywords_to_kwargs,
    reshape_assignment,
    drop_arguments,
    complicate_name,
    reshape_string,
    restyle_indent,
)


@dataclass(frozen=True)
class Mutant:
    """A mutated seed: its source, the seed's name and the mutations applied (for reports)."""

    source: str
    seed: str
    mutations: tuple[str, ...]
    target_version: tuple[int, int] | None


def mutants(
    seeds: list[Seed], max_mutations: int = 4, script_every: int = 8
) -> st.SearchStrategy[Mutant]:
    """Seeds after 1..`max_mutations` mutations; every mutant parses with libcst and CPython."""

    # Whole scripts are few beside ~190 rule examples but have the most shapes: one draw in
    # `script_every` (not more: fixing a whole script is ~10x the cost of an example).
    whole = [s for s in seeds if s.name.endswith(".py")]
    parts = [s for s in seeds if not s.name.endswith(".py")] or whole

    @st.composite
    def _mutant(draw: st.DrawFn) -> Mutant:
        pool = whole if whole and draw(st.integers(0, script_every - 1)) == 0 else parts
        seed = draw(st.sampled_from(pool))
        module = cst.parse_module(seed.source)
        applied = []
        for mutation in draw(
            st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=max_mutations)
        ):
            module = mutation(draw, module)
            applied.append(mutation.__name__)
        source = module.code
        if draw(st.integers(0, 9)) == 0:  # Windows line endings, everywhere
            source = source.replace("\r\n", "\n").replace("\n", "\r\n")
            applied.append("crlf")
        # Mutations may make code CPython rejects (`return` moved into a class, `continue` into
        # a def); such code is no input a linter must handle.
        assume(compiles(source))
        return Mutant(source, seed.name, tuple(applied), seed.target_version)

    return _mutant()


def compiles(source: str) -> bool:
    """`source` parses with libcst and compiles with CPython."""
    try:
        cst.parse_module(source)
        with warnings.catch_warnings():  # `None(...)`-like warnings: valid code all the same
            warnings.simplefilter("ignore", SyntaxWarning)
            compile(source, "<mutant>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, cst.ParserSyntaxError):
        return False
    return True
