"""autoopt.runtime has no import circles: `tune` runs the passes through `pipeline` and never
imports `optimize` (which imports tune)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import autoopt.runtime

RUNTIME = Path(autoopt.runtime.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(RUNTIME.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """The runtime modules `tree` imports anywhere (in functions too, and under
    `if TYPE_CHECKING:`: a mechanism that names its pass's types still depends on the pass)."""
    found: set[str] = set()
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        todo.extend(ast.iter_child_nodes(node))
    return found & modules


def import_graph() -> dict[str, set[str]]:
    """Each module of autoopt.runtime -> the modules of autoopt.runtime it imports."""
    files = {_module_name(p): p for p in RUNTIME.rglob("*.py")}
    modules = set(files)
    return {
        name: _imports(ast.parse(path.read_text()), modules) - {name}
        for name, path in files.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle a depth-first walk meets (as module lists, first == last)."""
    found: list[list[str]] = []
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = "open"
        stack.append(name)
        for dep in sorted(graph[name]):
            if state.get(dep) == "open":
                found.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)
    return found


def test_the_runtime_has_no_import_circle() -> None:
    graph = import_graph()
    assert "autoopt.runtime.tune.apply" in graph  # the walk saw the package
    assert "autoopt.runtime.pipeline" in graph["autoopt.runtime.tune.apply"]
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]


def test_tune_imports_without_optimize() -> None:
    code = (
        "import sys, autoopt.runtime.tune as t; "
        "assert 'autoopt.runtime.optimize' not in sys.modules, 'optimize imported'; "
        "print(t.Plan().label)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "fp32"
