"""What `eval(<string>)` names when the string is spelt in the module: a class or function picked
by a command-line option (ncsn's `eval(args.runner)(args, config)` with `--runner` defaulting to
"AnnealRunner"), or built around one (`eval("genotypes.%s" % args.arch)`,
`eval(f"models.{args.model}")`). Read with `ast`; nothing is evaluated.
"""

from __future__ import annotations

import ast
import itertools
import re

Dotted = tuple[str, ...]

_MAX_NAMES = 8  # the choices of one option, crossed with another's: a handful at most
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def string_options(tree: ast.Module) -> dict[str, tuple[str, ...]]:
    """The module's command-line options that hold strings, by destination: the values a run
    can give them, the default first, then the choices (`add_argument("--runner",
    default="AnnealRunner")` -> {"runner": ("AnnealRunner",)})."""
    options: dict[str, tuple[str, ...]] = {}
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        dest = _destination(node, keywords)
        if dest is None:
            continue
        values = [_string(keywords.get("default"))]
        choices = keywords.get("choices")
        if isinstance(choices, ast.List | ast.Tuple):
            values += [_string(c) for c in choices.elts]
        kept = tuple(dict.fromkeys(v for v in values if v is not None))
        if kept:
            options[dest] = kept
    return options


def evaluated_names(expr: ast.expr, options: dict[str, tuple[str, ...]]) -> list[Dotted]:
    """The dotted names `eval(expr)` may evaluate: `expr` a string literal, an option of the
    module (`args.runner`), or those joined by `+`, `%` or an f-string; [] where any part is
    something else, or the result is not a dotted name."""
    pieces = _pieces(expr, options)
    if pieces is None:
        return []
    names: list[Dotted] = []
    for parts in itertools.islice(itertools.product(*pieces), _MAX_NAMES):
        text = "".join(parts).strip()
        if not _DOTTED.fullmatch(text):
            return []
        names.append(tuple(text.split(".")))
    return list(dict.fromkeys(names))


def _pieces(expr: ast.expr, options: dict[str, tuple[str, ...]]) -> list[tuple[str, ...]] | None:
    """`expr` as a run of pieces, each the strings it may be; None where one is not known."""
    if (text := _string(expr)) is not None:
        return [(text,)]
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return [options[expr.attr]] if expr.attr in options else None
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        left, right = _pieces(expr.left, options), _pieces(expr.right, options)
        return None if left is None or right is None else left + right
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod):
        # `"genotypes.%s" % args.arch`: one `%s`, one value
        template, value = _string(expr.left), _pieces(expr.right, options)
        if template is None or value is None or template.count("%") != 1 or "%s" not in template:
            return None
        before, after = template.split("%s")
        return [(before,), *value, (after,)]
    if isinstance(expr, ast.JoinedStr):
        out: list[tuple[str, ...]] = []
        for part in expr.values:
            if isinstance(part, ast.FormattedValue):
                if part.conversion != -1 or part.format_spec is not None:
                    return None
                found = _pieces(part.value, options)
            else:
                found = _pieces(part, options)
            if found is None:
                return None
            out += found
        return out
    return None


def _destination(call: ast.Call, keywords: dict[str | None, ast.expr]) -> str | None:
    """Where argparse stores the option: `dest=`, else its first long name."""
    dest = _string(keywords.get("dest"))
    if dest is not None:
        return dest
    names = [s for a in call.args if (s := _string(a)) is not None]
    long = [n for n in names if n.startswith("--")]
    return long[0][2:].replace("-", "_") if long else None


def _string(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None
