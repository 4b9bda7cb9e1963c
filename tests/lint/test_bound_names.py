"""The bound-names pass (autoopt.lint.rewrite.bound_names): for each read of a name, whether every path
reaching it has bound the name. Each construct has a "bound" and a "maybe unbound" case; the
expected answer lists the maybe-unbound reads as `name@line`."""

from __future__ import annotations

import ast
import textwrap

import pytest

from autoopt.lint.rewrite.bound_names import maybe_unbound, maybe_unbound_counts


def unbound(code: str) -> list[str]:
    tree = ast.parse(textwrap.dedent(code).lstrip("\n"))
    return [f"{read.name}@{read.line}" for read in maybe_unbound(tree)]


CASES = {
    # ----- if / elif / else
    "if-without-else": (
        """
        if flag:
            x = 1
        print(x)
        """,
        ["x@3"],
    ),
    "if-else-both-bind": (
        """
        if flag:
            x = 1
        else:
            x = 2
        print(x)
        """,
        [],
    ),
    "elif-chain-without-else": (
        """
        if a:
            x = 1
        elif b:
            x = 2
        print(x)
        """,
        ["x@5"],
    ),
    "elif-chain-with-else": (
        """
        if a:
            x = 1
        elif b:
            x = 2
        else:
            x = 3
        print(x)
        """,
        [],
    ),
    "else-branch-returns": (
        """
        def f(flag):
            if flag:
                x = 1
            else:
                return None
            return x
        """,
        [],
    ),
    "else-branch-raises": (
        """
        if flag:
            x = 1
        else:
            raise SystemExit(1)
        print(x)
        """,
        [],
    ),
    "else-branch-exits": (
        """
        import sys
        if flag:
            x = 1
        else:
            sys.exit(1)
        print(x)
        """,
        [],
    ),
    "the-same-test-again": (
        """
        if args.amp:
            scaler = make()
        for batch in loader:
            if args.amp:
                scaler.step(opt)
        """,
        [],
    ),
    "the-negated-test-else": (
        """
        if not args.amp:
            pass
        else:
            scaler = make()
        if args.amp:
            scaler.step(opt)
        if not args.amp:
            print("fp32")
        else:
            scaler.update()
        """,
        [],
    ),
    "the-same-test-in-a-conjunction": (
        """
        if args.amp:
            scaler = make()
        for step, batch in enumerate(loader):
            if args.amp and step % 4 == 0:
                scaler.step(opt)
        """,
        [],
    ),
    "another-test": (
        """
        if args.amp:
            scaler = make()
        if args.fp16:
            scaler.step(opt)
        """,
        ["scaler@4"],
    ),
    "else-branch-asserts-false": (
        """
        if flag:
            x = 1
        else:
            assert False, "unreachable"
        print(x)
        """,
        [],
    ),
    "else-branch-asserts-a-test": (
        """
        if flag:
            x = 1
        else:
            assert other
        print(x)
        """,
        ["x@5"],
    ),
    "constant-true-and-false": (
        """
        if True:
            x = 1
        if False:
            y = 1
        else:
            y = 2
        print(x, y)
        """,
        [],
    ),
    "asked-of-locals": (
        """
        def f(data):
            if data:
                names = load(data)
            if "names" not in locals():
                names = {}
            return names
        """,
        [],
    ),
    # ----- loops
    "bound-in-for-body-read-after": (
        """
        for batch in loader:
            loss = step(batch)
        print(loss, batch)
        """,
        ["loss@3", "batch@3"],
    ),
    "bound-before-for": (
        """
        loss = 0.0
        for batch in loader:
            loss = step(batch)
        print(loss)
        """,
        [],
    ),
    "for-target-in-body": (
        """
        for x, (y, z) in loader:
            print(x, y, z)
        """,
        [],
    ),
    "for-else-bound-in-both": (
        """
        for item in items:
            if item:
                found = item
                break
        else:
            found = None
        print(found)
        """,
        [],
    ),
    "for-break-before-binding": (
        """
        for item in items:
            if item:
                break
            found = item
        else:
            found = None
        print(found)
        """,
        ["found@7"],
    ),
    "bound-in-while-body-read-after": (
        """
        while running():
            x = 1
        print(x)
        """,
        ["x@3"],
    ),
    "while-true-left-by-break": (
        """
        while True:
            x = read()
            if x:
                break
        print(x)
        """,
        [],
    ),
    "while-true-break-before-binding": (
        """
        while True:
            if done():
                break
            x = read()
        print(x)
        """,
        ["x@5"],
    ),
    "while-walrus-test": (
        """
        while line := read():
            print(line)
        print(line)
        """,
        [],
    ),
    "continue-skips-binding": (
        """
        def f(items):
            for item in items:
                if item is None:
                    continue
                x = item
                print(x)
        """,
        [],
    ),
    # ----- try
    "bound-in-try-read-in-except": (
        """
        try:
            y = compute()
        except ValueError:
            print(y)
        """,
        ["y@4"],
    ),
    "bound-in-try-read-after": (
        """
        try:
            y = compute()
        except ValueError:
            pass
        print(y)
        """,
        ["y@5"],
    ),
    "import-or-none": (
        """
        try:
            import apex
        except ImportError:
            apex = None
        print(apex)
        """,
        [],
    ),
    "import-or-raise": (
        """
        try:
            import apex
        except ImportError:
            raise
        print(apex)
        """,
        [],
    ),
    "try-else-binds": (
        """
        try:
            import apex
        except ImportError:
            has_apex = False
        else:
            has_apex = True
        print(has_apex)
        """,
        [],
    ),
    "except-as-is-unbound-after": (
        """
        try:
            run()
        except ValueError as err:
            print(err)
        print(err)
        """,
        ["err@5"],
    ),
    "finally-binds": (
        """
        try:
            run()
        finally:
            done = True
        print(done)
        """,
        [],
    ),
    "finally-reads-a-try-name": (
        """
        try:
            handle = open_it()
        finally:
            handle.close()
        """,
        ["handle@4"],
    ),
    # ----- with, match
    "with-target": (
        """
        with open(path) as fh:
            data = fh.read()
        print(fh, data)
        """,
        [],
    ),
    "match-without-wildcard": (
        """
        match command:
            case "sgd":
                opt = 1
            case "adam":
                opt = 2
        print(opt)
        """,
        ["opt@6"],
    ),
    "match-with-wildcard-and-captures": (
        """
        match command:
            case [first, *rest]:
                opt = first
            case {"k": value, **others}:
                opt = value
            case _:
                opt = None
        print(opt)
        """,
        [],
    ),
    # ----- del
    "read-after-del": (
        """
        x = 1
        del x
        print(x)
        """,
        ["x@3"],
    ),
    "rebound-after-del": (
        """
        x = 1
        del x
        x = 2
        print(x)
        """,
        [],
    ),
    # ----- scopes
    "function-reads-a-conditional-global": (
        """
        if flag:
            optimizer = make()
        def step():
            optimizer.step()
        """,
        [],
    ),
    "function-local-bound-in-branch": (
        """
        def train(args):
            if args.use_sgd:
                optimizer = make()
            optimizer.step()
        """,
        ["optimizer@4"],
    ),
    "parameters-are-bound": (
        """
        def f(a, /, b, *args, c=1, **kw):
            return a, b, args, c, kw
        """,
        [],
    ),
    "global-declaration": (
        """
        def init():
            global model
            if flag:
                model = make()
            model.train()
        """,
        [],
    ),
    "nonlocal-declaration": (
        """
        def outer():
            count = 0
            def bump():
                nonlocal count
                count += 1
            return bump
        """,
        [],
    ),
    "closure-reads-later-binding": (
        """
        def outer():
            def inner():
                return late
            late = 1
            return inner
        """,
        [],
    ),
    "imports-bind": (
        """
        import torch.nn as nn
        import os.path
        from torch import optim as o
        print(nn, os, o)
        """,
        [],
    ),
    "conditional-import": (
        """
        if use_apex:
            from apex import amp
        amp.initialize()
        """,
        ["amp@3"],
    ),
    "star-import-binds-anything": (
        """
        if flag:
            x = 1
        from helpers import *
        print(x)
        """,
        [],
    ),
    "class-body": (
        """
        class C:
            if flag:
                size = 1
            width = size
        """,
        ["size@4"],
    ),
    "class-body-falls-back-to-module": (
        """
        size = 2
        class C:
            if flag:
                size = 1
            width = size
        """,
        [],
    ),
    # ----- expressions: comprehensions, lambdas, walrus, and/or, if-else
    "comprehension-variable": (
        """
        squares = [i * i for i in range(3) if i]
        pairs = {k: v for k, v in items}
        print(squares, pairs)
        """,
        [],
    ),
    "comprehension-variable-does-not-leak": (
        """
        def f(items):
            total = [item for item in items]
            return total, item
        """,
        [],  # `item` is not a local of f: a global (pyflakes' concern), not a maybe-unbound
    ),
    "comprehension-reads-conditional-name-now": (
        """
        if flag:
            scale = 2
        values = [scale * v for v in data]
        """,
        ["scale@3"],
    ),
    "lambda-body-runs-later": (
        """
        fn = lambda: late
        late = 1
        """,
        [],
    ),
    "lambda-default-runs-now": (
        """
        if flag:
            base = 1
        fn = lambda x=base: x
        """,
        ["base@3"],
    ),
    "walrus-binds": (
        """
        if (n := count()) > 0:
            pass
        print(n)
        """,
        [],
    ),
    "walrus-in-comprehension-may-not-run": (
        """
        def f(items):
            found = [y for x in items if (y := x)]
            return y
        """,
        ["y@3"],
    ),
    "walrus-after-or-may-not-run": (
        """
        ok = ready() or (fallback := make())
        print(fallback)
        """,
        ["fallback@2"],
    ),
    "walrus-in-both-branches-of-if-expression": (
        """
        v = (a := 1) if flag else (a := 2)
        print(a)
        """,
        [],
    ),
    # ----- a read binds the rest of its path
    "second-read-after-an-unguarded-read": (
        """
        if flag:
            optimizer = make()
        scheduler = sched(optimizer)
        optimizer.zero_grad()
        """,
        ["optimizer@3"],
    ),
    "unreachable-code": (
        """
        def f():
            return 1
            print(never)
            never = 2
        """,
        [],
    ),
}


@pytest.mark.parametrize(("code", "expected"), CASES.values(), ids=list(CASES))
def test_maybe_unbound(code: str, expected: list[str]) -> None:
    assert unbound(code) == expected


def test_the_word_language_model_shape() -> None:
    """The real case (examples' word_language_model): the optimizer exists only under a flag;
    its reads under the same flag are bound, one on the default path is not."""
    code = """
    import torch
    if args.use_sgd:
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        if args.use_sgd:
            optimizer.step()
        else:
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
    """
    assert unbound(code) == []
    edited = code.replace(
        "        loss = criterion", "        optimizer.zero_grad()\n        loss ="
    )
    assert unbound(edited) == ["optimizer@5"]


def test_counts_are_by_name() -> None:
    tree = ast.parse("if a:\n    x = y = 1\nprint(x)\ndel x\nprint(y)\n")
    assert maybe_unbound_counts(tree) == {"x": 1, "y": 1}


def test_a_long_expression_is_walked_without_recursion() -> None:
    """A generated file's 2,000-term sum: the expression walk keeps its own stack."""
    code = "if a:\n    y = 1\nz = y" + " + y" * 2_000 + "\n"
    assert unbound(code) == ["y@3"]  # the first read; past it `y` is bound
