"""An index of one module of the user's project, read with `ast` (never imported): its imports,
classes, functions and methods, and for each function what the program model needs to know.

For every function (methods as `Class.method`, the module's own statements as `<module>`):
- its parameters, and the calls it makes (`CallSite`: the callee as a dotted name, the
  arguments as dotted names where they are plain references), with whether each call runs in a
  loop of the function and under `torch.no_grad()`;
- what it does to the names it holds (`uses`: a role per dotted name, `model` -> {"called"},
  `loader` -> {"iterated"}, `optimizer` -> {"stepped"}, ...);
- what it binds (`assigns`, `self_attrs`) and returns, as `Value`s (a call, a reference, a
  choice between values, an element of an unpacked tuple);
- whether it reaches `backward()` by itself (`backward`).

The interprocedural answers (does a call train, which parameters it trains as a model) are
`summaries`' business; this module only reads one file. An index is cached per process by path,
modification time and size, like `project_facts`' summaries.
"""

from __future__ import annotations

import ast
import io
import os
import tokenize
import unicodedata
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from autoopt.lint.program.evaluated import evaluated_names, string_options
from autoopt.lint.program.project_files import record_read
from autoopt.lint.tree.ast_walk import child_nodes, walk
from autoopt.lint.tree.chunks import CHUNK_LINES, LARGE_FILE_LINES, top_level_cuts
from autoopt.lint.tree.encoding import SourceDecodeError, content_digest, decode_source

Dotted = tuple[str, ...]

# Calls on a module-like object that run no forward (everything else called on a model is taken
# as a forward through a method other than `forward`: `model.pi(state)`, `vae.inference(z)`).
NO_FORWARD_METHODS = frozenset(
    {
        "state_dict", "load_state_dict", "parameters", "named_parameters", "buffers",
        "named_buffers", "modules", "named_modules", "children", "named_children", "to", "cuda",
        "cpu", "half", "float", "double", "bfloat16", "type", "train", "eval", "zero_grad",
        "apply", "register_forward_hook", "register_forward_pre_hook", "register_buffer",
        "register_parameter", "register_module", "add_module", "requires_grad_", "share_memory",
        "save_pretrained", "get_parameter", "get_submodule", "compile", "extra_repr", "module",
        "step", "save", "load", "update", "item", "size", "numel", "keys", "values", "items",
        "get", "append", "extend", "format", "join", "split", "detach", "clone", "copy_",
    }
)  # fmt: skip
# Wrappers of an iterable that a loop iterates instead of it (`enumerate(loader)`, `tqdm(loader)`).
ITERATION_WRAPPERS = frozenset(
    # `metric_logger.log_every(loader, ...)`: the DETR/DeiT/MAE logger yields the loader's batches
    {
        "enumerate",
        "tqdm",
        "zip",
        "iter",
        "islice",
        "cycle",
        "trange",
        "list",
        "Bar",
        "chain",
        "log_every",
    }
)


def wraps_iteration(name: str) -> bool:
    """`name` wraps an iterable that a loop iterates instead: one of ITERATION_WRAPPERS, or a
    project's own tqdm (Ultra-Fast-Lane-Detection's `dist_tqdm(loader)`, a tqdm on the main
    process only)."""
    return name in ITERATION_WRAPPERS or name.endswith("tqdm")


NO_GRAD_CONTEXTS = frozenset({"no_grad", "inference_mode"})
# Methods that return the object they are called on (a module placed or cast, in place).
_SAME_OBJECT = frozenset({"to", "cuda", "cpu", "train", "eval", "half", "float", "double"})


@dataclass(frozen=True)
class Value:
    """What an expression evaluates to, as far as the program model follows it.

    kind: "call" (`callee(args)`), "ref" (a dotted name), "choice" (one of `options`: both arms
    of `a if c else b`, the values of `{"adam": Adam(...), ...}[key]`), "item" (element `index`
    of `options[0]` unpacked: `model, opt = build(...)`), "tuple" (a returned tuple), "table"
    (a dict literal, its values in `options`: `MODELS = {"unet": UNet, ...}`), "entry" (an
    entry of the table named `dotted`: `cls = MODELS[args.model]`), "other".

    A callee may end in "[]" (`MODELS[args.model](cfg)`: an entry of the table `MODELS`) or
    "()" (`str2model(name)(args)`: what the call of `str2model` returns); see `callee_of`.
    """

    kind: str
    dotted: Dotted = ()  # the callee ("call") or the name ("ref")
    args: tuple[Dotted | None, ...] = ()
    keywords: tuple[tuple[str, Dotted | None], ...] = ()
    options: tuple[Value, ...] = ()
    index: int = 0
    line: int = 0


OTHER = Value("other")


@dataclass(frozen=True)
class CallSite:
    """One call a function makes."""

    callee: Dotted  # `train` -> ("train",); `self.fit` -> ("self", "fit"); () if not a name
    # each positional argument as a dotted name (`argument_of`; None: other)
    args: tuple[Dotted | None, ...]
    keywords: tuple[tuple[str, Dotted | None], ...]
    line: int
    in_loop: bool  # inside a for/while of its function
    no_grad: bool  # under `with torch.no_grad()` (or the function is decorated so)
    # a bound method handed to another call, which may call it (`retry_call(model.train,
    # tries=3)`): recorded as a call without arguments
    passed: bool = False
    in_if: bool = False  # inside an `if` of its function: it may not run every time


@dataclass
class FunctionInfo:
    """One function, method (`Class.method`) or the module's own statements (`<module>`)."""

    qualname: str
    params: tuple[str, ...] = ()  # in order; a method's `self`/`cls` left out
    class_name: str | None = None
    calls: list[CallSite] = field(default_factory=list)
    uses: dict[Dotted, set[str]] = field(default_factory=dict)
    assigns: dict[str, list[Value]] = field(default_factory=dict)
    self_attrs: dict[str, list[Value]] = field(default_factory=dict)
    returns: list[Value] = field(default_factory=list)
    backward: bool = False  # `.backward()` (any receiver), `accelerator.backward(loss)`, ...
    to_device: bool = False  # moves something to a device: `.cuda()`, `.to(self.device)`
    zero_grad: bool = False  # `.zero_grad()` on anything: a training step's bookkeeping
    no_grad: bool = False  # decorated with torch.no_grad() / inference_mode()
    # the line of its first `.item()` / `.tolist()` / `.cpu()` outside any `if` of its own: a
    # read of a tensor on the host each time it runs (0: none)
    host_read: int = 0
    # the line of its first `nn.DataParallel(...)` outside any `if` of its own (0: none): a
    # constructor or factory that spreads the model over the GPUs itself, whatever the
    # arguments (CMC's `InsResNet50.__init__`; not DeepCTR's `if gpus:`)
    data_parallel: int = 0
    # the line of its first request for determinism outside any `if` of its own
    # (`cudnn.deterministic = True`, `torch.use_deterministic_algorithms(True)`): a seed helper
    # that asks for it whenever it runs (AGCRN's `init_seed`); 0: none
    determinism: int = 0
    # every `return` hands back something moved to a device: `return Net().cuda()`, or a name
    # placed before it (`net = UNet().cuda()`, `model.to(device)`): SSL4MIS's `net_factory`
    returns_placed: bool = False
    line: int = 0
    # a method whose body only says "a subclass does this" (`raise NotImplementedError`, `pass`)
    abstract: bool = False
    # the names a loop binds to each batch -> what it iterates (`for data_label in
    # progress_bar` -> ("data_loader",)): a batch handed to a helper that moves it to a
    # device moves the loader's batches (Ultra-Fast-Lane's `inference(net, data_label)`)
    batches: dict[str, Dotted] = field(default_factory=dict)

    def use(self, name: Dotted, role: str) -> None:
        self.uses.setdefault(name, set()).add(role)


@dataclass
class ClassInfo:
    name: str
    bases: tuple[Dotted, ...]
    methods: dict[str, FunctionInfo] = field(default_factory=dict)
    line: int = 0
    # `@MODEL_REGISTRY.register()` / `@registry.register_task("x")`: (registry, kind) pairs,
    # ("MODEL_REGISTRY", ""), ("registry", "task")
    registered: tuple[tuple[str, str], ...] = ()


@dataclass
class ModuleIndex:
    """Everything `index_source` reads off one module."""

    path: Path
    digest: str
    functions: dict[str, FunctionInfo] = field(default_factory=dict)  # qualname -> info
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    # bound name -> (module, imported name, relative level): `from m import f as g` -> g
    imports: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    # bound name -> (module, level): `import a.b as c` -> c: ("a.b", 0); `from . import m` -> m
    module_aliases: dict[str, tuple[str, int]] = field(default_factory=dict)
    star_imports: list[tuple[str, int]] = field(default_factory=list)
    # top-level `Alias = Original` (yolov5's `Model = DetectionModel`)
    aliases: dict[str, str] = field(default_factory=dict)

    @property
    def module_code(self) -> FunctionInfo:
        return self.functions["<module>"]


def dotted_of(node: ast.AST | None) -> Dotted | None:
    """`a.b.c` -> ("a", "b", "c"); None for anything but a chain of names."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return tuple(reversed(parts))
    return None


def argument_of(node: ast.AST) -> Dotted | None:
    """What `dotted_of` names, and an entry of a named container as the container's name and
    "[]" (`train(epoch, dataloaders["train"])` -> ("dataloaders", "[]"))."""
    found = dotted_of(node)
    if found is None and isinstance(node, ast.Subscript):
        held = dotted_of(node.value)
        return (*held, "[]") if held is not None else None
    return found


# Names handed to calls that are never a function of the project to call back.
_NOT_CALLABLES = frozenset({"args", "opt", "cfg", "config", "self", "torch", "np", "os"})
# Keywords that hand a function to run (`launch_job(func=train)`, `Process(target=run)`).
_FUNCTION_KEYWORDS = frozenset({"func", "fn", "function", "target", "main_func"})


def callee_of(func: ast.expr) -> Dotted | None:
    """What a call's `func` names: a dotted name, or a model class picked at run time, from a
    table (`MODELS[args.model]` -> ("MODELS", "[]")) or by a function that returns a class
    (`str2model(args.model_name)` -> ("str2model", "()")); None for anything else."""
    found = argument_of(func)  # a dotted name, or an entry of a table
    if found is not None:
        return found
    if isinstance(func, ast.Call) and (factory := dotted_of(func.func)) is not None:
        return (*factory, "()")
    return None


def parse_tree(data: bytes | str) -> ast.Module | None:
    r"""`ast.parse(data)`, or None for a file that does not parse (its SyntaxWarnings, such as
    `"\("` in the user's strings, are not ours to report)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return ast.parse(data)
        except (SyntaxError, ValueError, RecursionError):
            pass
        try:  # `x.cuda(async=True)` of torch < 0.4: `async` is a name before Python 3.7
            return ast.parse(data, feature_version=(3, 6))
        except (SyntaxError, ValueError, RecursionError):
            return None


# The last few trees parsed from disk: `project_facts` summarises the same modules the index
# reads, and one parse serves both.
_TREES: dict[tuple[str, int, int], ast.Module | None] = {}
_MAX_TREES = 16


def file_tree(path: str, stat: os.stat_result, data: bytes) -> ast.Module | None:
    """The tree of a project module's `data` (shared between the program model's index and
    `project_facts`' summary of the same file)."""
    key = (path, stat.st_mtime_ns, stat.st_size)
    if key not in _TREES:
        if len(_TREES) >= _MAX_TREES:
            del _TREES[next(iter(_TREES))]
        _TREES[key] = parse_tree(data)
    return _TREES[key]


# The trees of the last few texts `rewrite`'s verification parsed (`parse_python` keeps them
# here): the index of an edited text, asked by the analysis that follows, takes its tree instead
# of a second `ast.parse` of the same text.
TEXT_TREES: dict[str, ast.Module] = {}
_TEXT_TREES_KEPT = 4


def keep_text_tree(text: str, tree: ast.Module) -> None:
    """Remember `tree` as the parse of `text` in `TEXT_TREES` (the last few texts only)."""
    if text not in TEXT_TREES and len(TEXT_TREES) >= _TEXT_TREES_KEPT:
        del TEXT_TREES[next(iter(TEXT_TREES))]
    TEXT_TREES[text] = tree


def share_file_tree(path: str, text: str, raw: bytes) -> None:
    """`raw`, `text` in UTF-8, is what the file at `path` holds: the parse `file_tree` still
    keeps of the file becomes `text`'s in `TEXT_TREES` (a rewrite's verification then reads the
    original text's names without parsing it again). Only where Python reads those bytes as
    UTF-8 (no BOM, no other coding cookie): their parse is then the parse of `text`."""
    path = os.path.abspath(path)
    try:
        stat = os.stat(path)
    except OSError:
        return
    tree = _TREES.get((path, stat.st_mtime_ns, stat.st_size))
    if tree is None or stat.st_size != len(raw):
        return
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError:
        return
    if encoding == "utf-8":
        keep_text_tree(text, tree)


def index_source(path: Path, data: bytes | str, tree: ast.Module | None = None) -> ModuleIndex:
    """The index of a module's source (a file that does not parse gives an empty index);
    `tree`: its parse, when the caller has it."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    index = ModuleIndex(path, content_digest(raw))
    module_code = FunctionInfo("<module>")
    index.functions["<module>"] = module_code
    scanner = _Scanner(module_code, None)
    if tree is None and _is_large(data):
        # a long file, a run of top-level statements at a time: `ast`'s whole tree of a 50k-line
        # file is 180 MB, on top of the lint's own tree of it
        text = data if isinstance(data, str) else data.decode("utf-8", "surrogateescape")
        # runs a fifth of the lint's parse's (its tree is alive meanwhile); the cut points are
        # those the lint's parse found: no second whole `ast` parse
        cuts = top_level_cuts(text, max(1, CHUNK_LINES // 5))
        if cuts is not None:
            lines = text.splitlines(keepends=True)
            for lo, hi in zip(cuts, cuts[1:], strict=False):
                chunk = parse_tree("".join(lines[lo:hi]))
                if chunk is None:
                    break
                ast.increment_lineno(chunk, lo)
                _index_body(chunk.body, index, scanner)
            else:
                return index
            index = ModuleIndex(path, index.digest)  # a run that does not parse alone: whole
            module_code = FunctionInfo("<module>")
            index.functions["<module>"] = module_code
            scanner = _Scanner(module_code, None)
    if tree is None and isinstance(data, str):
        tree = TEXT_TREES.get(data)
    tree = tree if tree is not None else parse_tree(data)
    if tree is not None:
        if (b"eval(" if isinstance(data, bytes) else "eval(") in data:
            scanner.options = string_options(tree)  # for `eval(args.runner)(...)`
        _index_body(tree.body, index, scanner)
    return index


def _is_large(data: bytes | str) -> bool:
    return data.count("\n" if isinstance(data, str) else b"\n") >= LARGE_FILE_LINES  # type: ignore[arg-type]


def _index_body(body: list[ast.stmt], index: ModuleIndex, scanner: _Scanner) -> None:
    """Index top-level statements: imports, functions, classes, the module's own code."""
    # the flags are read only where an `if`/`else` can import a name twice
    branches = any(isinstance(s, ast.If) and s.orelse for s in body)
    _read_imports(body, index, _flag_defaults(body) if branches else {})
    _read_local_imports(body, index)
    top_level: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            index.functions[stmt.name] = _scan_function(stmt, None, scanner.options)
        elif isinstance(stmt, ast.ClassDef):
            _index_class(stmt, index, scanner.options)
        else:
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
                and isinstance(stmt.value, ast.Name)
            ):
                index.aliases[stmt.targets[0].id] = stmt.value.id
            top_level.append(stmt)
    scanner.scan_body(top_level)


def _read_imports(
    body: list[ast.stmt], index: ModuleIndex, flags: dict[str, bool], kept: bool = False
) -> None:
    """Imports at the top level, also inside `try:`/`if:` blocks (optional dependencies). Of
    an `if`/`else` that binds a name in both branches, the branch a run without options takes
    wins where the test is a command-line flag of this module (End-to-end-ASR's `if paras.lm:
    from bin.train_lm import Solver` / `else: from bin.train_asr import Solver`, `--lm` a
    `store_true`), else the `if` branch; `kept`: names already bound stay."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            taken = _flag_test(stmt.test, flags)
            first, second = (stmt.orelse, stmt.body) if taken is False else (stmt.body, stmt.orelse)
            _read_imports(first, index, flags, kept)
            _read_imports(second, index, flags, kept=True)
            continue
        if isinstance(stmt, ast.Try):
            _read_imports(stmt.body, index, flags, kept)
            for handler in stmt.handlers:
                _read_imports(handler.body, index, flags, kept)
            continue
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    if not (kept and alias.asname in index.module_aliases):
                        index.module_aliases[alias.asname] = (alias.name, 0)
                else:  # `import a.b` binds `a`
                    top = alias.name.split(".")[0]
                    index.module_aliases.setdefault(top, (top, 0))
        elif isinstance(stmt, ast.ImportFrom):
            module = stmt.module or ""
            for alias in stmt.names:
                if alias.name == "*":
                    index.star_imports.append((module, stmt.level))
                elif not (kept and (alias.asname or alias.name) in index.imports):
                    index.imports[alias.asname or alias.name] = (module, alias.name, stmt.level)


def _flag_defaults(body: list[ast.stmt]) -> dict[str, bool]:
    """The module's boolean command-line flags (`add_argument("--lm", action="store_true")`)
    by destination -> their value when not given."""
    flags: dict[str, bool] = {}
    for stmt in body:
        for node in ast.walk(stmt) if isinstance(stmt, ast.Expr | ast.If) else ():
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                continue
            names = [a.value for a in node.args if isinstance(a, ast.Constant)]
            long = [n for n in names if isinstance(n, str) and n.startswith("--")]
            keywords = {k.arg: k.value for k in node.keywords if k.arg}
            dest = keywords.get("dest")
            if isinstance(dest, ast.Constant) and isinstance(dest.value, str):
                name = dest.value
            elif long:
                name = long[0][2:].replace("-", "_")
            else:
                continue
            action = keywords.get("action")
            default = keywords.get("default")
            if isinstance(default, ast.Constant) and isinstance(default.value, bool):
                flags[name] = default.value
            elif isinstance(action, ast.Constant) and action.value in ("store_true", "store_false"):
                flags[name] = action.value == "store_false"
    return flags


def _flag_test(test: ast.expr, flags: dict[str, bool]) -> bool | None:
    """The value of an `if` test that reads one flag (`args.lm`, `not args.lm`) in a run
    without options; None for any other test."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        value = _flag_test(test.operand, flags)
        return None if value is None else not value
    if isinstance(test, ast.Attribute) and isinstance(test.value, ast.Name):
        return flags.get(test.attr)
    return None


def _read_local_imports(body: list[ast.stmt], index: ModuleIndex) -> None:
    """Imports inside functions and classes (benchmarking-gnns' `from train.x import
    train_epoch_sparse as train_epoch` where the model type is known; pix2pixHD's
    `create_model`): what the names mean there, unless the module's own imports say otherwise."""
    for stmt in body:
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for node in ast.walk(stmt):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name != "*":
                        local = (node.module or "", alias.name, node.level)
                        index.imports.setdefault(alias.asname or alias.name, local)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        index.module_aliases.setdefault(alias.asname, (alias.name, 0))
                    else:
                        top = alias.name.split(".")[0]
                        index.module_aliases.setdefault(top, (top, 0))


def _index_class(
    cls: ast.ClassDef, index: ModuleIndex, options: dict[str, tuple[str, ...]]
) -> None:
    bases = tuple(d for d in (dotted_of(b) for b in cls.bases) if d is not None)
    info = ClassInfo(cls.name, bases, line=cls.lineno, registered=_registrations(cls))
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            method = _scan_function(stmt, cls.name, options)
            info.methods[stmt.name] = method
            index.functions[method.qualname] = method
    index.classes[cls.name] = info


def _scan_function(
    func: ast.FunctionDef | ast.AsyncFunctionDef,
    cls: str | None,
    options: dict[str, tuple[str, ...]],
) -> FunctionInfo:
    args = func.args
    params = [a.arg for a in (*args.posonlyargs, *args.args)]
    static = any(dotted_of(d) == ("staticmethod",) for d in func.decorator_list)
    if cls is not None and params and not static:
        params = params[1:]
    params += [a.arg for a in args.kwonlyargs]
    info = FunctionInfo(
        f"{cls}.{func.name}" if cls else func.name,
        tuple(params),
        class_name=cls,
        line=func.lineno,
        no_grad=any(_is_no_grad(d) for d in func.decorator_list),
        abstract=cls is not None and all(map(_placeholder, func.body)),
    )
    scanner = _Scanner(info, cls, options, _on_by_default(args))
    scanner.scan_body(func.body)
    info.returns_placed = bool(scanner.returns_placed) and all(scanner.returns_placed)
    return info


def _on_by_default(args: ast.arguments) -> frozenset[str]:
    """The parameters whose default is `True`."""
    positional = [*args.posonlyargs, *args.args]
    pairs = [
        *zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True),
        *((a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None),
    ]
    return frozenset(a.arg for a, d in pairs if isinstance(d, ast.Constant) and d.value is True)


def _placeholder(stmt: ast.stmt) -> bool:
    """A statement of a method left for subclasses: a docstring, `pass`, `...`, `raise
    NotImplementedError`."""
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return True
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        raised = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return dotted_of(raised) == ("NotImplementedError",)
    return False


def _is_no_grad(expr: ast.expr) -> bool:
    """`torch.no_grad()`, `@torch.no_grad`, `torch.inference_mode()`,
    `torch.set_grad_enabled(False)`."""
    target = expr.func if isinstance(expr, ast.Call) else expr
    name = dotted_of(target)
    if not name:
        return False
    if name[-1] in NO_GRAD_CONTEXTS:
        return True
    return (
        name[-1] == "set_grad_enabled"
        and isinstance(expr, ast.Call)
        and bool(expr.args)
        and isinstance(expr.args[0], ast.Constant)
        and expr.args[0].value is False
    )


def _iterated(expr: ast.expr) -> list[Dotted]:
    """The names a loop over `expr` iterates: `loader`, `enumerate(loader)`, `tqdm(loader)`,
    `zip(a, b)`, `iter(loader)`."""
    name = argument_of(expr)  # also `loaders[phase]`: an entry of the dict `loaders`
    if name is not None:
        return [name]
    if isinstance(expr, ast.Call):
        callee = dotted_of(expr.func)
        if callee and wraps_iteration(callee[-1]):
            # zip and chain iterate every argument; the others their first (`enumerate(x,
            # start)`, `log_every(loader, print_freq, header)`)
            iterables = expr.args if callee[-1] in ("zip", "chain") else expr.args[:1]
            found: list[Dotted] = []
            for a in iterables:
                found.extend(_iterated(a))
            return found
    return []


def _names_a_device(call: ast.Call) -> bool:
    """`.to(device)`, `.to(self.device)`, `.to("cuda")`: the argument is a device (not a dtype)."""
    first = (
        call.args[0]
        if call.args
        else next((k.value for k in call.keywords if k.arg == "device"), None)
    )
    if isinstance(first, ast.Constant):
        return isinstance(first.value, str) and first.value.startswith(("cuda", "mps", "xpu"))
    name = dotted_of(first) if first is not None else None
    return bool(name) and "device" in name[-1].lower()


def _device_move(expr: ast.expr) -> ast.Call | None:
    """The `.cuda()` / `.to(<device>)` call ending the chain `expr` is (`Net().cuda().train()`
    too: methods that return the module itself), or None."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        attr = expr.func.attr
        if attr == "cuda" or (attr == "to" and _names_a_device(expr)):
            return expr
        if attr not in _SAME_OBJECT or attr == "cpu":
            return None
        expr = expr.func.value
    return None


def _copied_name(expr: ast.expr) -> str | None:
    """`data` for `data["L"]`, `batch[0].float()`, `x` itself: the name whose contents a
    `.to(device)` / `.cuda()` on `expr` copies (not `self.x`, nor a module's attribute)."""
    while True:
        if isinstance(expr, ast.Subscript):
            expr = expr.value
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
            expr = expr.func.value  # `x.float().cuda()`
        else:
            break
    return expr.id if isinstance(expr, ast.Name) and expr.id != "self" else None


def _reads_on_the_host(body: list[ast.stmt]) -> bool:
    """A statement of `body` itself (not one nested in a block) reads a tensor on the host:
    `return x.item()`, `v = loss.cpu()`."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in HOST_READS
        and not node.args
        for stmt in body
        if isinstance(stmt, ast.Return | ast.Assign | ast.Expr | ast.AugAssign)
        for node in ast.walk(stmt)
    )


def _steps_an_environment(call: ast.Call) -> bool:
    """`env.step(action)`, `self.test_env.step(a)`: the step of an object named for an
    environment, given a value (its action), as an RL agent steps it; `optimizer.step()`,
    `optimizer.step(closure)` and `scaler.step(optimizer)` are not this."""
    if len(call.args) != 1 or call.keywords:
        return False
    arg = call.args[0]
    if isinstance(arg, ast.Lambda):
        return False
    owner = dotted_of(call.func.value) if isinstance(call.func, ast.Attribute) else None
    return bool(owner) and "env" in owner[-1].lower() and not isinstance(arg, ast.Constant)


def _is_true(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _type_test(test: ast.expr) -> bool:
    """`isinstance(x, T)`, `hasattr(t, "item")` (SFA3D's `to_python_float`), or `not` them:
    a test of a value's type, not of a clock or a flag."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    return (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id in ("isinstance", "hasattr")
    )


def _string_choice(test: ast.expr) -> bool:
    """`args.task == "regression"`: a comparison with a string (a clock is a number)."""
    return isinstance(test, ast.Compare) and any(
        isinstance(side, ast.Constant) and isinstance(side.value, str)
        for side in (test.left, *test.comparators)
    )


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in walk(node) if isinstance(n, ast.Name)}


HOST_READS = ("item", "cpu", "tolist")  # methods that wait for a tensor's value on the host


class _Scanner:
    """One pass over a function's body (nested functions included: a closure handed to
    `optimizer.step(closure)` trains with its function)."""

    def __init__(
        self,
        info: FunctionInfo,
        cls: str | None,
        options: dict[str, tuple[str, ...]] | None = None,
        on_by_default: frozenset[str] = frozenset(),
    ) -> None:
        self.info = info
        self.cls = cls
        self.loops = 0
        self.ifs = 0  # `if` blocks around the statement (a read under one may be throttled)
        self.no_grad = 1 if info.no_grad else 0
        # loop variable -> the iterated name (`for x, y in loader`: x, y -> loader)
        self.batch_of: dict[str, Dotted] = {}
        self.statement_call: ast.Call | None = None  # the call an expression statement makes
        self.aliases: dict[str, list[Dotted]] = {}  # `it = tqdm(loader)`: it -> [loader]
        # a name bound to a part of another: `imgL = sample["left"]`, `x, y = batch` -> the
        # whole (GwcNet's `train_sample(sample)` copies its batch's entries so)
        self.part_of: dict[str, str] = {}
        self.placed: set[str] = set()  # names moved to a device so far (`net = Net().cuda()`)
        self.returns_placed: list[bool] = []  # for each `return`: it hands back a placed value
        # the module's string options (`--runner AnnealRunner`): what `eval(args.runner)` names
        self.options = options if options is not None else {}
        self.on_by_default = on_by_default  # the function's parameters defaulting to True

    def evaluated(self, func: ast.expr) -> list[Dotted]:
        """The names `func`, a call of `eval` on a string spelt here, may be (see
        `evaluated_names`); [] for anything else."""
        if (
            isinstance(func, ast.Call)
            and isinstance(func.func, ast.Name)
            and func.func.id == "eval"
            and len(func.args) == 1
            and not func.keywords
        ):
            return evaluated_names(func.args[0], self.options)
        return []

    def iterated(self, expr: ast.expr) -> list[Dotted]:
        """`_iterated`, through the names bound to an iteration wrapper above and the dicts
        of loaders (`loaders = {"train": loader_train, ...}`, `loaders[phase]`)."""
        found: list[Dotted] = []
        for name in _iterated(expr):
            if name[-1] == "[]":
                found.extend(
                    option.dotted
                    for value in self.info.assigns.get(name[0], ())
                    if len(name) == 2
                    if value.kind == "table"
                    for option in value.options
                    if option.kind == "ref"
                )
                continue
            found.extend(self.aliases.get(name[0], [name]) if len(name) == 1 else [name])
        return found

    def scan_body(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self.stmt(stmt)

    def stmt(self, node: ast.stmt) -> None:
        if isinstance(node, ast.For | ast.AsyncFor):
            self.expr(node.iter)
            for name in self.iterated(node.iter):
                self.info.use(name, "iterated")
                if self.loops:
                    self.info.use(name, "iterated_in_loop")
                for target in _names_in(node.target):
                    self.batch_of[target] = name
                    self.info.batches[target] = name
            self.loops += 1
            self.scan_body(node.body)
            self.loops -= 1
            self.scan_body(node.orelse)
            return
        if isinstance(node, ast.While):
            self.expr(node.test)
            self.loops += 1
            self.scan_body(node.body)
            self.loops -= 1
            self.scan_body(node.orelse)
            return
        if isinstance(node, ast.If):
            self.expr(node.test)
            # both arms read a tensor on the host (GPT2's `_to_value`: `.item()` of the
            # all-reduced copy, else of the tensor): no arm throttles the read
            either = _reads_on_the_host(node.body) and _reads_on_the_host(node.orelse)
            # a type dispatch (`if isinstance(v, torch.Tensor): return v.item()`, GwcNet's
            # tensor2float) or a configuration's choice (`if args.task == "regression"`) runs
            # its arm on every call or on none: no throttle either
            either = either or _type_test(node.test) or _string_choice(node.test)
            # `if deterministic:` on a parameter that defaults to True (PointPillars'
            # `setup_seed(seed=0, deterministic=True)`): its arm runs on a call that leaves it
            either = either or (
                isinstance(node.test, ast.Name) and node.test.id in self.on_by_default
            )
            self.ifs += 0 if either else 1
            self.scan_body(node.body)
            self.scan_body(node.orelse)
            self.ifs -= 0 if either else 1
            return
        if isinstance(node, ast.With | ast.AsyncWith):
            guarded = any(_is_no_grad(item.context_expr) for item in node.items)
            for item in node.items:
                self.expr(item.context_expr)
            self.no_grad += guarded
            self.scan_body(node.body)
            self.no_grad -= guarded
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            self.scan_body(node.body)  # a closure runs with its function (LBFGS, hooks)
            return
        if isinstance(node, ast.ClassDef):
            return
        if isinstance(node, ast.Assign):
            self.expr(node.value)
            value = self.value(node.value)
            if isinstance(node.value, ast.Call) and (
                not isinstance(node.value.func, ast.Attribute)
                or wraps_iteration(node.value.func.attr)  # `tqdm.tqdm(enumerate(loader))`
            ):
                wrapped = self.iterated(node.value)  # `it = tqdm(loader)`: iterating `it`
                for target in node.targets:  # iterates the loader
                    if wrapped and isinstance(target, ast.Name):
                        self.aliases[target.id] = wrapped
            if (
                not self.ifs
                and not self.info.determinism
                and _is_true(node.value)
                and any(
                    (dotted_of(t) or ())[-2:] == ("cudnn", "deterministic") for t in node.targets
                )
            ):
                self.info.determinism = node.lineno
            for target in node.targets:
                self.bind(target, value)
                self.bind_parts(target, node.value)
                if isinstance(target, ast.Name) and _device_move(node.value) is not None:
                    self.placed.add(target.id)
            return
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            self.expr(node.value)
            self.bind(node.target, self.value(node.value))
            annotation = dotted_of(node.annotation)
            if annotation and annotation[-1][:1].isupper():
                # `bpr: utils.BPRLoss = loss_class`: an instance of the class it names
                self.bind(node.target, Value("call", annotation, line=node.lineno))
            return
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            self.statement_call = node.value  # called for its effect: `dataset.resample()`
        if isinstance(node, ast.Return) and node.value is not None:
            self.expr(node.value)
            returned = node.value
            self.returns_placed.append(
                _device_move(returned) is not None
                or (isinstance(returned, ast.Name) and returned.id in self.placed)
            )
            self.info.returns.append(self.value(node.value))
            return
        for child in child_nodes(node):
            if isinstance(child, ast.stmt):
                self.stmt(child)
            elif isinstance(child, ast.expr):
                self.expr(child)
            elif isinstance(child, ast.excepthandler | ast.match_case):
                self.scan_body(child.body)

    def bind(self, target: ast.expr, value: Value) -> None:
        if isinstance(target, ast.Name):
            self.info.assigns.setdefault(target.id, []).append(value)
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
        ):
            self.info.self_attrs.setdefault(target.attr, []).append(value)
        elif isinstance(target, ast.Tuple | ast.List):
            for i, element in enumerate(target.elts):
                if isinstance(element, ast.Starred):
                    break
                if value.kind == "tuple" and len(value.options) == len(target.elts):
                    # `self.model, self.data = model, data`: each name its own value
                    self.bind(element, value.options[i])
                    continue
                self.bind(element, Value("item", options=(value,), index=i, line=value.line))
        # `x.dataset.attr = ...`: the loader's dataset changed in place
        if isinstance(target, ast.Attribute):
            owner = dotted_of(target.value)
            if owner and len(owner) >= 2 and owner[-1] == "dataset":
                self.info.use(owner[:-1], "dataset_mutated")

    def value(self, node: ast.expr) -> Value:
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr in _SAME_OBJECT:
                # `Net().to(device)`, `model.cuda()`: the receiver itself
                return self.value(node.func.value)
            own = _own_attribute(node)
            if own is not None:  # `getattr(sys.modules[__name__], "train_ava")`: that name
                return Value("ref", (own,), line=line)
            args = tuple(dotted_of(a) for a in node.args if not isinstance(a, ast.Starred))
            keywords = tuple((k.arg, dotted_of(k.value)) for k in node.keywords if k.arg)
            if names := self.evaluated(node.func):  # `eval(args.runner)(args, config)`
                built = [Value("call", n, args, keywords, line=line) for n in names]
                return built[0] if len(built) == 1 else Value("choice", options=tuple(built))
            callee = callee_of(node.func)
            if callee is None:
                return OTHER
            return Value("call", callee, args, keywords, line=line)
        name = dotted_of(node)
        if name is not None:
            return Value("ref", name, line=line)
        if isinstance(node, ast.IfExp):
            return Value("choice", options=(self.value(node.body), self.value(node.orelse)))
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict):
            return Value("choice", options=tuple(self.value(v) for v in node.value.values if v))
        if isinstance(node, ast.Subscript) and (table := dotted_of(node.value)) is not None:
            return Value("entry", table, line=line)
        if isinstance(node, ast.Dict):
            return Value("table", options=tuple(self.value(v) for v in node.values if v), line=line)
        if isinstance(node, ast.Tuple | ast.List):
            return Value("tuple", options=tuple(self.value(e) for e in node.elts), line=line)
        return OTHER

    def expr(self, node: ast.expr) -> None:
        subs = list(walk(node))
        for sub in subs:  # first: what a comprehension's names are elements of
            if isinstance(sub, ast.comprehension):
                for name in self.iterated(sub.iter):
                    self.info.use(name, "iterated")
                self.elements_of_a_batch(sub)
        for sub in subs:
            if isinstance(sub, ast.Call):
                self.call(sub)

    def bind_parts(self, target: ast.expr, value: ast.expr) -> None:
        """`imgL = sample["left"]`, `a, b = s["a"], s["b"]`, `x, y = batch`: the names bound
        to parts of a name (`part_of`); a name bound to anything else is no part any more."""
        if isinstance(target, ast.Tuple | ast.List):
            if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(target.elts):
                for sub_target, sub_value in zip(target.elts, value.elts, strict=True):
                    self.bind_parts(sub_target, sub_value)
                return
            whole = value.id if isinstance(value, ast.Name) else None
            for name in _names_in(target):
                self._part(name, whole)
            return
        if isinstance(target, ast.Name):
            inner = value.value if isinstance(value, ast.Subscript) else None
            self._part(target.id, inner.id if isinstance(inner, ast.Name) else None)

    def _part(self, name: str, whole: str | None) -> None:
        if whole is None or whole == "self" or whole == name:
            self.part_of.pop(name, None)
        else:
            self.part_of[name] = self.part_of.get(whole, whole)

    def elements_of_a_batch(self, comp: ast.comprehension) -> None:
        """`tuple(t.to(device) for t in batch)`, `{k: v.cuda() for k, v in batch.items()}`:
        the comprehension's names are parts of a batch of the loader `batch` came from."""
        source = comp.iter
        if (
            isinstance(source, ast.Call)
            and isinstance(source.func, ast.Attribute)
            and source.func.attr in ("items", "values")
        ):
            source = source.func.value
        if isinstance(source, ast.Name) and source.id in self.batch_of:
            for name in _names_in(comp.target):
                self.batch_of[name] = self.batch_of[source.id]

    def call(self, node: ast.Call) -> None:
        info = self.info
        func = node.func
        callee = dotted_of(func) or ()
        if isinstance(func, ast.Attribute):
            attr = func.attr
            owner = dotted_of(func.value)
            if attr in ("backward", "manual_backward"):
                info.backward = True
            elif _device_move(node) is node:
                info.to_device = True
                copied = _copied_name(func.value)
                copied = self.part_of.get(copied, copied) if copied is not None else None
                # `data["L"].to(self.device)`: what `data` holds is copied (not a name bound
                # anew first: `x = torch.Tensor(x)` is a new host tensor, audioset_tagging_cnn)
                if copied is not None and copied not in info.assigns:
                    waits = not any(k.arg == "non_blocking" for k in node.keywords)
                    info.use((copied,), "copied_blocking" if waits else "copied_non_blocking")
            elif attr == "zero_grad":
                info.zero_grad = True
            elif attr in HOST_READS and not node.args and not self.ifs and not info.host_read:
                info.host_read = node.lineno
            if attr in ("to", "cuda") and owner is None:
                self._converted_batch_moved(func.value)
            if owner is not None:
                self.method_use(owner, attr, node)
            elif isinstance(func.value, ast.Call) and (built := callee_of(func.value.func)):
                # `Trainer(...).fit()`: the method of the class just built (the arguments are
                # the constructor's: this call records none); `super().__init__(a, b)`: the
                # base's method, with these arguments
                mine = built == ("super",)
                site = CallSite(
                    built + (attr,),
                    tuple(dotted_of(a) for a in node.args if not isinstance(a, ast.Starred))
                    if mine
                    else (),
                    tuple((k.arg, dotted_of(k.value)) for k in node.keywords if k.arg)
                    if mine
                    else (),
                    node.lineno,
                    self.loops > 0,
                    self.no_grad > 0,
                )
                info.calls.append(site)
        elif callee and callee[-1] == "next" and node.args:  # `next(iter(loader))`
            for name in self.iterated(node.args[0]):
                info.use(name, "iterated")
                if self.loops:
                    info.use(name, "iterated_in_loop")
        if (
            callee
            and callee[-1] == "DataParallel"
            and (len(callee) == 1 or callee[0] in ("nn", "torch"))
            and not self.ifs
            and not info.data_parallel
        ):
            info.data_parallel = node.lineno
        if (
            callee
            and callee[-1] == "use_deterministic_algorithms"
            and node.args
            and _is_true(node.args[0])
            and not self.ifs
            and not info.determinism
        ):
            info.determinism = node.lineno
        callees = [callee] if callee else []
        if callee:
            info.use(callee, "called_no_grad" if self.no_grad else "called")
        elif evaluated := self.evaluated(func):  # `eval(args.runner)(...)`: what it names
            callees = evaluated
        elif chosen := callee_of(func):  # `MODELS[name](cfg)`: a call site, no name's use
            callees = [chosen]
        for called in callees:
            info.calls.append(
                CallSite(
                    called,
                    tuple(argument_of(a) for a in node.args if not isinstance(a, ast.Starred)),
                    tuple((k.arg, argument_of(k.value)) for k in node.keywords if k.arg),
                    node.lineno,
                    self.loops > 0,
                    self.no_grad > 0,
                    in_if=self.ifs > 0,
                )
            )
        functions = {k.value for k in node.keywords if k.arg in _FUNCTION_KEYWORDS}
        for handed in (*node.args, *(k.value for k in node.keywords)):
            # a bound method: `model.train`, not `self.x` or `args.x`; or a function: of the
            # module or one it imports, or handed as one (TimeSformer's `launch_job(cfg=cfg,
            # func=train)`), not a local value or a parameter (`train(model, device)`)
            name = dotted_of(handed)
            if (
                name is not None
                and name[0] not in _NOT_CALLABLES
                and (
                    len(name) == 2
                    or (
                        isinstance(handed, ast.Name)
                        and (handed in functions or name[0] not in {*info.params, *info.assigns})
                    )
                )
            ):
                site = CallSite(name, (), (), node.lineno, self.loops > 0, self.no_grad > 0, True)
                info.calls.append(site)

    def _converted_batch_moved(self, value: ast.expr) -> None:
        """`batch_x.float().to(self.device)`: a batch converted on the host, then moved; or a
        part of it (`batch[0].to(get_device())`, MusicTransformer)."""
        while (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)) or isinstance(
            value, ast.Subscript
        ):
            value = value.func.value if isinstance(value, ast.Call) else value.value
        if isinstance(value, ast.Name) and value.id in self.batch_of:
            self.info.use(self.batch_of[value.id], "batches_moved")

    def method_use(self, owner: Dotted, attr: str, node: ast.Call) -> None:
        info = self.info
        if attr == "step":
            # an optimizer's step takes nothing or a closure; an environment's takes the
            # action (`self.env.step(action)`, an RL agent): no optimizer
            if not _steps_an_environment(node):
                info.use(owner, "stepped")
        elif attr == "zero_grad":
            info.use(owner, "zero_grad")
        elif attr == "train":
            info.use(owner, "train_mode")
        elif attr == "eval":
            info.use(owner, "eval_mode")
        elif attr in ("parameters", "named_parameters"):
            info.use(owner, "parameters")
        elif attr in ("named_modules", "modules"):
            info.use(owner, "submodules")  # a module: TabR's make_parameter_groups(model, ...)
        elif attr == "forward":
            info.use(owner, "called_no_grad" if self.no_grad else "called")
        elif attr not in NO_FORWARD_METHODS:
            info.use(owner, "method_called_no_grad" if self.no_grad else "method_called")
            if self.loops and node is self.statement_call:  # `dataset.resample()` per epoch
                info.use(owner, "method_called_in_loop")
        if len(owner) == 1 and _device_move(node) is not None:
            self.placed.add(owner[0])  # `net.cuda()`, `model.to(device)`: placed in place
        if attr in ("to", "cuda") and owner[0] in self.batch_of:
            info.use(self.batch_of[owner[0]], "batches_moved")
        if len(owner) >= 2 and owner[-1] == "dataset" and attr not in NO_FORWARD_METHODS:
            info.use(owner[:-1], "dataset_mutated")  # `loader.dataset.ng_sample()`


def _registrations(cls: ast.ClassDef) -> tuple[tuple[str, str], ...]:
    """The registries a class decorator adds it to: `@ARCH_REGISTRY.register()` (BasicSR,
    mmcv-style) -> ("ARCH_REGISTRY", ""); `@registry.register_task("pretrain")` (LAVIS,
    MiniGPT-4) -> ("registry", "task")."""
    found = []
    for decorator in cls.decorator_list:
        func = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = dotted_of(func)
        if name and len(name) >= 2 and name[-1].startswith("register"):
            found.append((name[-2], name[-1][len("register") :].strip("_")))
    return tuple(found)


def _own_attribute(call: ast.Call) -> str | None:
    """`getattr(sys.modules[__name__], "name")` (YOWO picks its train function so): "name"."""
    if not (
        isinstance(call.func, ast.Name)
        and call.func.id == "getattr"
        and len(call.args) == 2
        and isinstance(call.args[1], ast.Constant)
        and isinstance(call.args[1].value, str)
    ):
        return None
    owner = call.args[0]
    if (
        isinstance(owner, ast.Subscript)
        and dotted_of(owner.value) == ("sys", "modules")
        and isinstance(owner.slice, ast.Name)
        and owner.slice.id == "__name__"
    ):
        return call.args[1].value
    return None


# ----- the per-process cache ----------------------------------------------------------------------
_MAX_BYTES = 2_000_000  # a "module" larger than this is data, not code: not read
_INDEXES: dict[tuple[str, int, int], ModuleIndex] = {}


def load_index(path: Path | str) -> ModuleIndex | None:
    """The index of the module at `path` (read and parsed once per process; None if unreadable
    or too large to be code)."""
    path = os.path.abspath(path)
    try:
        stat = os.stat(path)
        key = (path, stat.st_mtime_ns, stat.st_size)
        found = _INDEXES.get(key)
        if found is None:
            if stat.st_size > _MAX_BYTES:
                return None
            with open(path, "rb") as handle:
                data = handle.read()
            # a long file is indexed a run of statements at a time, never parsed whole here
            tree = None if _is_large(data) else file_tree(path, stat, data)
            found = _INDEXES[key] = index_source(Path(path), data, tree)
    except OSError:
        return None
    record_read(path, found.digest)
    return found


def may_name(path: Path | str, word: str, exact: bool = False) -> bool:
    """Whether the module at `path` can name `word` (an identifier) at all: False only when its
    text holds no such identifier, as Python reads one (decoded by its coding cookie, a non-ASCII
    name NFKC-normalized). A question about callers of `word` (`Program.callers`) then skips
    the module without indexing it; it is recorded as read all the same, as `load_index` would
    (the results cache drops an entry when a file it consulted changes). True when in doubt: a
    file indexed already, unreadable, too large or not decodable, a `word` such as `<module>`.
    `exact`: a file indexed already is read too, so that the answer does not depend on what
    this process indexed before (a decision that counts modules must not)."""
    if not word.isidentifier():
        return True
    path = os.path.abspath(path)
    try:
        stat = os.stat(path)
        indexed = (path, stat.st_mtime_ns, stat.st_size) in _INDEXES
        if (indexed and not exact) or stat.st_size > _MAX_BYTES:
            return True
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return True
    if word.encode("utf-8") in data:
        return True
    if not data.isascii():
        try:
            text = decode_source(data).text
        except SourceDecodeError:
            return True
        if word in unicodedata.normalize("NFKC", text):
            return True
    record_read(path, content_digest(data))
    return False
