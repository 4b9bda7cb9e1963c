"""AO801: random, numpy, torch and CUDA seeded with different values."""

from __future__ import annotations

from collections import Counter

import libcst as cst

from autoopt.lint.engine.rule import Invalid, Rule, Valid
from autoopt.lint.tree.nodes import assignments, calls_in, code_of, nodes_of_type

# qualified name -> the generator it seeds
_SEEDERS = {
    "random.seed": "random",
    "numpy.random.seed": "numpy",
    "torch.manual_seed": "torch",
    "torch.random.manual_seed": "torch",
    "torch.cuda.manual_seed": "cuda",
    "torch.cuda.manual_seed_all": "cuda",
    "torch.cuda.random.manual_seed": "cuda",
    "torch.cuda.random.manual_seed_all": "cuda",
}


class InconsistentSeeds(Rule):
    """
    ## What it does
    Flags seeding calls in one function (or at module level) that give `random`, `numpy`,
    `torch` and `torch.cuda` different seeds — a widely read PyTorch tutorial does exactly this: `fix_seed = 2021`
    for `random`, `numpy` and `torch`, then `torch.cuda.manual_seed_all(0)`.

    ## Why
    A different constant per library is almost always a copy-paste slip, and it is not
    harmless: `torch.manual_seed` also seeds every CUDA device, so a later
    `cuda.manual_seed_all(0)` silently overrides the seed the user thinks the GPU runs with,
    and changing the one "seed" setting no longer changes all the streams. Use one value for
    all of them: `autoopt.seed_everything(seed, deterministic=...)` does it in one call.

    ## When not to
    - Seeds computed on purpose (`seed + rank`, `seed + worker_id`, `int(time.time())`, or a
      variable the function computes them into) are not compared: only literals, names bound
      to a literal, and settings such as `args.seed`, `config["seed"]` or a `seed` parameter
      count.
    - Seeding in different functions (a `worker_init_fn`, an evaluation helper) is separate.
    - Re-seeding the same library later with another value is not this rule's business.

    ## Fix
    None: which of the values the user meant is not knowable.
    """

    code = "AO801"
    name = "inconsistent-seeds"
    message = "random/numpy/torch/cuda seeded with different values; use one seed for all"
    fix_reason = "which of the values was meant is not knowable"
    triggers = ("manual_seed",)
    requires = (("random.seed(", "cuda.manual_seed"),)  # a second library seeded

    VALID = [
        Valid(
            """
            import random
            import numpy as np
            import torch
            seed = 2021
            random.seed(seed)
            np.random.seed(2021)
            torch.manual_seed(seed)
            torch.cuda.manual_seed_all(seed)
            """
        ),
        Valid(
            """
            import random
            import torch
            random.seed(args.seed)
            torch.manual_seed(args.seed + rank)
            """
        ),
        Valid(
            """
            import numpy as np
            import torch
            torch.manual_seed(0)
            def worker_init_fn(worker_id):
                np.random.seed(1234 + worker_id)
            """
        ),
        Valid(
            """
            import torch
            torch.manual_seed(0)
            torch.manual_seed(1)
            """
        ),
        Valid(  # `random` may be numpy's or Python's: which generator it seeds is not known
            """
            try:
                from numpy import random
            except ImportError:
                import random
            import torch
            random.seed(1)
            torch.manual_seed(2)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import random
            import numpy as np
            import torch

            fix_seed = 2021
            random.seed(fix_seed)
            np.random.seed(fix_seed)
            torch.manual_seed(fix_seed)
            if torch.cuda.is_available():
                torch.cuda.manual_seed_all(0)
            """,
            line=10,
            message_contains="seed_everything",
        ),
        Invalid(
            """
            import random
            import torch
            def setup(seed):
                random.seed(42)
                torch.manual_seed(seed)
            """,
            line=5,
        ),
        Invalid(  # a setting from the config beside a literal (GRACE)
            """
            import random
            import torch
            config = load_config()
            torch.manual_seed(config["seed"])
            random.seed(12345)
            """,
            line=5,
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        module_constants = _constants(node)
        self._check_scope(node, module_constants)
        for n in nodes_of_type(node, cst.FunctionDef):
            # a function sees the module's constants unless it rebinds them
            self._check_scope(n, {**module_constants, **_constants(n)})

    def _check_scope(self, scope: cst.Module | cst.FunctionDef, constants: dict[str, str]) -> None:
        first: dict[str, tuple[cst.Call, str]] = {}  # generator -> (first call, its value)
        for call in calls_in(scope, into_scopes=False):
            names = self.qualified_names(call.func)
            generators = {_SEEDERS[q] for q in names if q in _SEEDERS}
            if len(generators) != 1 or len(call.args) != 1:
                continue  # not a seeder, or one of two (which one: unknown)
            generator = generators.pop()
            if generator in first:
                continue
            value = _seed_value(call.args[0].value, constants)
            if value is None:
                return  # a computed seed: deliberate streams, compare nothing here
            first[generator] = (call, value)
        if len(first) < 2:
            return
        counts = Counter(v for _, v in first.values())
        if len(counts) == 1:
            return
        # the most common value is taken as the intended one (ties: the first one seen)
        order = [v for _, v in first.values()]
        majority = max(counts, key=lambda v: (counts[v], -order.index(v)))
        for generator, (call, value) in first.items():
            if value != majority:
                self.report(
                    call,
                    f"{generator} seeded with {value} but the others with {majority}; use one "
                    "seed for all (autoopt.seed_everything(seed))",
                )


def _constants(scope: cst.CSTNode) -> dict[str, str]:
    """Names assigned in `scope`: to their integer literal when assigned exactly once to one,
    else to "" (assigned, value unknown: it shadows an outer constant)."""
    values: dict[str, list[str]] = {}
    for name, value, _ in assignments(scope):
        values.setdefault(name, []).append(code_of(value) if isinstance(value, cst.Integer) else "")
    return {k: v[0] if len(v) == 1 else "" for k, v in values.items()}


def _seed_value(expr: cst.BaseExpression, constants: dict[str, str]) -> str | None:
    """The seed as comparable text: an integer literal, or a name/attribute (its literal when
    known); None for computed seeds."""
    if isinstance(expr, cst.Integer):
        return expr.value
    if isinstance(expr, cst.Subscript) and _keyed_setting(expr):
        return code_of(expr)  # `config["seed"]`: a setting, compared by name
    if isinstance(expr, cst.Name | cst.Attribute):
        text = code_of(expr)
        if text not in constants:
            return text  # a parameter or setting (`seed`, `args.seed`): compared by name
        # a literal it was given, or None: a value computed in the file is deliberate
        return constants[text] or None
    return None


def _keyed_setting(expr: cst.Subscript) -> bool:
    """`config["seed"]`, `cfg['train']['seed']`: a setting read by a literal key."""
    return (
        len(expr.slice) == 1
        and isinstance(expr.slice[0].slice, cst.Index)
        and isinstance(expr.slice[0].slice.value, cst.SimpleString)
        and isinstance(expr.value, cst.Name | cst.Attribute | cst.Subscript)
    )
