"""The module paths from before the runtime's regrouping keep working for one release: each one
docs/development.md lists under "Where each module moved from" imports (or reads) with a
DeprecationWarning naming its new path, and gives the object that lives there."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest

from autoopt.runtime import moved

DOC = Path(__file__).resolve().parents[2] / "docs" / "development.md"


def moves() -> list[tuple[str, str]]:
    text = DOC.read_text()
    block = text[text.index("Where each module moved from") :].split("```")[1]
    return [tuple(line.split(" -> ")) for line in block.strip().splitlines()]  # type: ignore[misc]


def resolve(path: str) -> object:
    """The module `path` names, else the attribute its last part names, imported as a user's
    line does (a statement of this file)."""
    owner, name = path.rsplit(".", 1)
    # find_spec imports `owner`: an old owner path warns there, not at the user's line below
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            module = importlib.util.find_spec(path) is not None
        except ModuleNotFoundError:  # `owner` is a module, not a package
            module = False
    if module:
        code = f"import {path}\nfound = sys.modules[{path!r}]"
    else:
        code = f"from {owner} import {name} as found"
    namespace: dict[str, object] = {"sys": sys}
    exec(compile(code, __file__, "exec"), namespace)
    return namespace["found"]


@pytest.mark.parametrize(("old", "new"), moves())
def test_an_old_path_warns_and_gives_the_new_object(old: str, new: str) -> None:
    target = resolve(new)
    if old in moved.PACKAGES:  # a module that became a package: its old names still answer
        name = next(
            n for n in vars(target) if not n.startswith("_") and n not in vars(resolve(old))
        )
        with pytest.warns(DeprecationWarning, match=f"moved to {new}.{name}"):
            assert resolve(f"{old}.{name}") is getattr(target, name)
        return
    sys.modules.pop(old, None)  # a module already imported under its old path warns no more
    with pytest.warns(DeprecationWarning, match=f"moved to {new}") as caught:
        found = resolve(old)
    assert caught[0].filename == __file__  # said at the line that used the old path
    if isinstance(target, type(sys)):  # a module: its names are the new module's
        public = [n for n in vars(target) if not n.startswith("_")]
        assert public and all(getattr(found, n) is getattr(target, n) for n in public)
    else:
        assert found is target
