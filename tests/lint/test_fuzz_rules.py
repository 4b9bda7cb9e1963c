"""Fuzzing every rule and every fix (hypothesis).

Inputs: programs generated from Python's grammar (hypothesmith), the same programs spliced into
real training code, and mutants of real training code (every rule's examples and
examples/naive/, see `fuzz_strategies`). Properties:

- analysis raises nothing, for every rule, even when the text pre-filter would have skipped it;
- `fix_source(..., unsafe=True)` raises nothing, its output parses (libcst and CPython), and a
  second pass over the output changes nothing;
- on mutants, `rewrite --wrap` (`wrap_source`) too: valid output, nothing new the second time.

Deterministic under CI=true (the "ci" profile in tests/conftest.py). `FUZZ_EXAMPLES=2000` raises
the number of examples of every test for a long local run.
"""

from __future__ import annotations

import os
import warnings

import hypothesmith
import libcst as cst
from hypothesis import HealthCheck, currently_in_test_context, given, note, reject, settings
from hypothesis import strategies as st

from autoopt.lint.engine.analysis import active_rules, run_rules
from autoopt.lint.engine.registry import load_registry
from autoopt.lint.engine.suppress import filter_findings
from autoopt.lint.rewrite.apply import fix_source
from autoopt.lint.wrap.insert import wrap_source

from .fuzz_strategies import Mutant, Seed, compiles, load_seeds, mutants

RULES = load_registry().all()
SEEDS = load_seeds()


def _examples(default: int) -> int:
    """`default` examples (keeps the module under a minute on 2 cores), or FUZZ_EXAMPLES."""
    return int(os.environ.get("FUZZ_EXAMPLES", default))


def _fuzz(default: int) -> settings:
    return settings(
        max_examples=_examples(default),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def check_every_rule_analyzes(source: str, target_version: tuple[int, int] | None) -> None:
    """The text pre-filter and then every rule, forced on whatever the pre-filter says (a rule
    must not rely on its triggers being in the text to stay total), visit the file without
    raising. (`fix_source` below runs the rules as `lint` does, pre-filter included.)"""
    active_rules(RULES, source, target_version)
    analysis = run_rules(cst.parse_module(source), source, "fuzz.py", RULES, target_version)
    # The engine contains a rule's exception as a crash record: for the fuzzer it is a failure.
    assert not analysis.crashes, [crash.describe() for crash in analysis.crashes]


def check_fixes(source: str, target_version: tuple[int, int] | None) -> None:
    """Fixing with every rule (unsafe fixes too) yields valid Python and is idempotent. With a
    `noqa` in the file, suppressions apply as in `autoopt rewrite`."""
    options = {
        "unsafe": True,
        "target_version": target_version,
        "path": "fuzz.py",
        "finding_filter": filter_findings if "noqa" in source else None,
    }
    first = fix_source(source, RULES, **options)
    assert not first.skipped, first.skipped  # a crashed rule or a fix that broke the file
    _note(f"fixed ({[f.code for f in first.applied]}):\n{first.source}")
    _assert_valid_python(first.source)
    _assert_same_newlines(source, first.source)
    second = fix_source(first.source, RULES, **options)
    assert not second.applied, [f.code for f in second.applied]
    assert second.source == first.source


def check_wrap(source: str) -> None:
    """`rewrite --wrap` yields valid Python and wraps nothing the second time."""
    first = wrap_source(source, path="fuzz.py")
    _note(f"wrapped ({first.message}):\n{first.source}")
    _assert_valid_python(first.source)
    _assert_same_newlines(source, first.source)
    assert wrap_source(first.source, path="fuzz.py").source == first.source


def _note(text: str) -> None:
    """Shown with a failing example; the checks also run outside hypothesis (known bugs)."""
    if currently_in_test_context():
        note(text)


def _assert_same_newlines(before: str, after: str) -> None:
    """A file with one newline style keeps it (a fix adds no `\n` to a CRLF file)."""
    if "\r" not in before:
        assert "\r" not in after, "fixes added CR newlines"
    elif before.count("\n") == before.count("\r\n"):
        assert after.count("\n") == after.count("\r\n"), "fixes mixed LF into CRLF"


def _assert_valid_python(source: str) -> None:
    cst.parse_module(source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # valid code with a dubious call
        compile(source, "fuzz.py", "exec", dont_inherit=True)


def _parseable(source: str) -> str:
    if not compiles(source):
        reject()  # grammar-valid, yet libcst or this CPython does not take it
    return source


# ----- generated programs ---------------------------------------------------------------------


@_fuzz(15)
@given(hypothesmith.from_grammar())
def test_grammar_programs(source: str) -> None:
    source = _parseable(source)
    check_every_rule_analyzes(source, None)
    check_fixes(source, None)


@_fuzz(2)
@given(hypothesmith.from_node())
def test_node_programs(source: str) -> None:
    source = _parseable(source)
    check_every_rule_analyzes(source, None)
    check_fixes(source, None)


@_fuzz(10)
@given(st.sampled_from(SEEDS), hypothesmith.from_grammar(), st.booleans())
def test_grammar_programs_spliced_into_training_code(
    seed: Seed, generated: str, before: bool
) -> None:
    """A generated program before or after a real training script: the rules fire and see
    strange code around what they fix."""
    source = _parseable(generated + seed.source if before else seed.source + "\n" + generated)
    check_every_rule_analyzes(source, seed.target_version)
    check_fixes(source, seed.target_version)


# ----- mutated training code ------------------------------------------------------------------


@_fuzz(30)
@given(mutants(SEEDS))
def test_mutated_training_code(mutant: Mutant) -> None:
    note(f"seed {mutant.seed}, mutations {mutant.mutations}:\n{mutant.source}")
    check_every_rule_analyzes(mutant.source, mutant.target_version)
    check_fixes(mutant.source, mutant.target_version)
    check_wrap(mutant.source)


def test_seeds_cover_every_rule_and_the_naive_examples() -> None:
    names = {s.name for s in SEEDS}
    assert {r.code for r in RULES} <= {n.split("-")[0] for n in names}
    assert sum(n.endswith(".py") for n in names) >= 5


def test_asname_beside_kwargs_dataloader_regression() -> None:
    """Found by `test_mutated_training_code` (an `import ... as` snippet beside a `**kwargs`
    DataLoader): the `'AsName' object has no attribute 'target'` crash issue 9 reports from real
    repositories."""
    source = (
        "import torch as T\n"
        "from torch.utils.data import DataLoader\n"
        'kwargs = {"num_workers": 2}\n'
        "loader = DataLoader([1, 2], **kwargs)\n"
    )
    check_every_rule_analyzes(source, None)
    check_fixes(source, None)
