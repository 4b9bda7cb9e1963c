"""Mutation testing of the critical modules with mutmut, one module at a time.

`make mutation` (or `python -m benchmarks.mutation [MODULE ...]`) runs mutmut over each module
below with only that module's fast tests, so a run fits a laptop (or two shared CI cores): mutmut
forks from one warm pytest process and, per mutant, runs only the selected tests that executed the
mutated function. Each module runs in its own scratch copy under build/mutation/<name>/ (mutmut
writes its `mutants/` tree beside the sources), so the checkout is never touched.

Prints, per module, killed/total and the diff of every surviving mutant; a survivor needs a test
that kills it or a reason it is equivalent in docs/benchmarks/mutation.md. Not part of CI's time
budget (minutes per module).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the tomli backport autoopt already depends on there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / "build" / "mutation"

# module name -> (the file mutated, pytest arguments selecting the fast tests that exercise it). Keep each selection to the
# tests that are about the module: every mutant reruns the ones that reach its function.
MODULES: dict[str, tuple[str, list[str]]] = {
    "loss_scaling": (
        "autoopt/runtime/scaling/loss_scaling.py",
        ["tests/runtime/test_loss_scaling.py", "tests/runtime/test_loss_scaling_exact.py"],
    ),
    "root_scaling": (
        "autoopt/runtime/scaling/root_scaling.py",
        [
            "tests/runtime/test_loss_scaling.py",
            "tests/runtime/test_loss_scaling_exact.py",
            "tests/runtime/test_root_scaling_exact.py",
            "tests/runtime/test_accumulate.py",
            "tests/runtime/test_equivalence_amp.py",  # autograd.grad and reentrant backwards
            "tests/runtime/test_fp16_reentrant_checkpoint.py",  # leaves unscaled inside it
            "tests/runtime/test_accumulate_auto.py",  # micro-batch shares as seeds
            "-m",
            "not slow",
        ],
    ),
    "device_loader": (
        "autoopt/runtime/loading/device_loader.py",
        [
            "tests/runtime/test_loader.py",
            "tests/runtime/test_device_batches.py",
            "tests/runtime/test_device_loader_exact.py",
        ],
    ),
    "micro_batches": (
        "autoopt/runtime/accumulation/micro_batches.py",
        [
            "tests/runtime/test_accumulate_auto.py",
            "tests/runtime/test_micro_batches_exact.py",
            "tests/runtime/test_accumulate_token_mean.py",  # the normaliser probes
            "-m",
            "not slow",  # not the 2-process DDP test
        ],
    ),
    "accumulate": (
        "autoopt/runtime/passes/accumulate.py",
        [
            "tests/runtime/test_accumulate.py",
            "tests/runtime/test_accumulate_auto.py",
            "tests/runtime/test_accumulate_exact.py",
            "-m",
            "not slow",  # not the 2-process DDP test
        ],
    ),
    "checkpoint_plan": (
        "autoopt/runtime/checkpointing/checkpoint_plan.py",
        [
            "tests/runtime/test_checkpoint_budget.py",
            "tests/runtime/test_block_stacks.py",
            "tests/runtime/test_checkpoint_plan_exact.py",
        ],
    ),
    "forward": (  # the forward and optimizer-step chains
        "autoopt/runtime/forward.py",
        [
            "tests/runtime/test_schedulers.py",  # step stays a bound method schedulers accept
            "tests/runtime/test_copies.py",  # deepcopy / pickle of the patched objects
            "tests/runtime/test_accumulate.py",  # the zero_grad chain
            "tests/runtime/test_backends.py",
            "tests/runtime/test_forward_exact.py",
            "-m",
            "not slow",
        ],
    ),
    "backends": (
        "autoopt/runtime/passes/backends.py",
        ["tests/runtime/test_backends.py", "tests/runtime/test_backends_exact.py"],
    ),
    "rewrite": (
        "autoopt/lint/rewrite/apply.py",
        [
            "tests/lint/test_rewrite.py",
            "tests/lint/test_rewrite_exact.py",
            "tests/lint/test_cli_rewrite.py",
            "tests/lint/test_verify.py",  # rejected edits
            "tests/lint/test_containment.py",  # crashing rules and failing fixes skipped
            "-k",
            # every rule example rewritten with every rule: minutes per mutant of fix_source
            "not test_rewrite_then_lint_leaves_nothing_the_rewrite_could_fix",
        ],
    ),
    # fix safety: what a fix assumes, checked (a fix is safe only where it is proven)
    "preconditions": (
        "autoopt/lint/rewrite/fixes/preconditions.py",
        [
            "tests/lint/test_rule_examples.py",
            "tests/lint/test_rule_fixes.py",
            "tests/lint/test_precision.py",
            "tests/lint/test_project_facts.py",
            "tests/lint/test_preconditions_mutants.py",
        ],
    ),
}

# Passed to every pytest mutmut starts: one process (mutmut forks it), no cache writes.
PYTEST_ARGS = ["-p", "no:xdist", "-p", "no:cacheprovider", "-q"]
_IGNORE = shutil.ignore_patterns("__pycache__")
SHIM_ARGS = ["-p", "tests.mutmut_shim"]

# A pytest plugin for the scratch copy only. mutmut calls every function of a mutated module
# through its trampoline (a frame of mutmut's own); root_scaling finds torch's reentrant
# checkpoint by walking the stack past its own frames and autograd's entry points, so the
# trampoline's frames are added to those it walks past (else every checkpointed fp16 backward
# would look like an unknown reentrant caller, and the unmutated run would already fail).
SHIM = """
import types

from mutmut.mutation import trampoline

from autoopt.runtime.scaling import root_scaling


def _codes(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


root_scaling._AUTOGRAD_ENTRIES.update(
    c for f in vars(trampoline).values() if hasattr(f, "__code__") for c in _codes(f.__code__)
)
"""


def _config(module: str, tests: list[str], timeout_multiplier: float | None = None) -> str:
    """pyproject.toml for the scratch copy: the project's own plus a [tool.mutmut] for one module."""
    text = (ROOT / "pyproject.toml").read_text()
    base = tomllib.loads(text).get("tool", {}).get("mutmut", {})
    if base:  # drop the project's [tool.mutmut]: this one replaces it
        head, _, tail = text.partition("[tool.mutmut]")
        rest = tail.split("\n[", 1)
        text = head + ("[" + rest[1] if len(rest) == 2 else "")
    # options pass through; test files not written yet are left out
    existing = [
        t for t in tests if t.startswith("-") or not t.endswith(".py") or (ROOT / t).exists()
    ]
    return text + (
        "\n[tool.mutmut]\n"
        'source_paths = ["autoopt/"]\n'
        f"only_mutate = {json.dumps([module])}\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(existing)}\n"
        f"pytest_add_cli_args = {json.dumps(base.get('pytest_add_cli_args', PYTEST_ARGS) + SHIM_ARGS)}\n"
        + (f"timeout_multiplier = {timeout_multiplier}\n" if timeout_multiplier else "")
    )


def run_module(
    name: str, mutmut: str, again: bool = False, timeout_multiplier: float | None = None
) -> dict[str, object]:
    """Run mutmut over one module in a fresh scratch copy; return its counts and survivors.
    With `again`, reuse the last run's copy: take the checkout's tests as they are now and rerun
    only the mutants that were not killed (tests were added; the source is unchanged)."""
    module, tests = MODULES[name]
    work = SCRATCH / name
    names: list[str] = []
    if again and (work / "mutants").is_dir():
        listing = subprocess.run(
            [mutmut, "results"], cwd=work, capture_output=True, text=True, check=True
        ).stdout
        rows = [ln.strip().rpartition(": ") for ln in listing.splitlines()]
        names = [mutant for mutant, _, status in rows if mutant and status != "killed"]
        shutil.rmtree(work / "tests")
    else:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        shutil.copytree(ROOT / "autoopt", work / "autoopt", ignore=_IGNORE)
    shutil.copytree(ROOT / "tests", work / "tests", ignore=_IGNORE)
    (work / "tests" / "mutmut_shim.py").write_text(SHIM)
    shutil.copy(ROOT / "setup.py", work / "setup.py")
    (work / "pyproject.toml").write_text(_config(module, tests, timeout_multiplier))
    # One thread per process: mutmut forks each mutant's run from a warm pytest, and GNU
    # OpenMP's pool does not survive a fork (children hang in their first parallel op once the
    # parent has run one: every mutant then times out).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(work / "mutmut.log", "a" if names else "w") as log:
        subprocess.run(
            [mutmut, "run", *names],
            cwd=work,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
            env=env,
        )
    subprocess.run([mutmut, "export-cicd-stats"], cwd=work, capture_output=True, check=True)
    stats = json.loads((work / "mutants" / "mutmut-cicd-stats.json").read_text())
    listing = subprocess.run(
        [mutmut, "results"], cwd=work, capture_output=True, text=True, check=True
    ).stdout
    survivors = {}
    for line in listing.splitlines():
        mutant, _, status = line.strip().rpartition(": ")
        if status in ("survived", "no tests", "timeout", "suspicious"):
            survivors[mutant] = status
    diffs = _diffs(work, module, list(survivors), mutmut)
    survivors = {m: f"{status}: {diffs.get(m, '')}" for m, status in survivors.items()}
    return {"module": module, "tests": tests, **stats, "survivors": survivors}


# Run in the scratch copy by mutmut's own interpreter: each mutant's diff as one line, in one
# process (`mutmut show` per mutant starts a process each, minutes for a few hundred).
_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
out = {}
for name in sys.stdin.read().split():
    diff = get_diff_for_mutant(name, path=sys.argv[1]).splitlines()
    out[name] = " | ".join(ln for ln in diff if ln[:1] in "+-" and ln[:3] not in ("+++", "---"))
print(json.dumps(out))
"""


def _diffs(work: Path, module: str, names: list[str], mutmut: str) -> dict[str, str]:
    """The one-line diff of each mutant in `names`."""
    python = Path(mutmut).with_name(Path(sys.executable).name)
    shown = subprocess.run(
        [str(python), "-c", _DIFFS, module],
        cwd=work,
        input="\n".join(names),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(shown.stdout)


def main(argv: list[str] | None = None) -> int:
    """Run the modules named on the command line (all by default) and print their scores."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"any of {', '.join(MODULES)} (default: all)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--again",
        action="store_true",
        help="rerun only the last run's survivors, against the tests as they are now",
    )
    parser.add_argument(
        "--timeout-multiplier",
        type=float,
        help="mutmut's (default 15): a mutant is a timeout after about this many times its tests' "
        "time; lower it where mutants hang (root_scaling's reentrant-backward ones)",
    )
    args = parser.parse_args(argv)
    unknown = set(args.modules) - set(MODULES)
    if unknown:
        parser.error(f"unknown modules {sorted(unknown)}; choose from {', '.join(MODULES)}")
    mutmut = shutil.which("mutmut", path=str(Path(sys.executable).parent))
    if mutmut is None:
        sys.exit("mutmut is not installed: pip install -e '.[mutation]'")
    results = []
    for name in args.modules or list(MODULES):
        result = run_module(name, mutmut, args.again, args.timeout_multiplier)
        results.append(result)
        killed, total = result["killed"], result["total"]
        score = 100.0 * killed / total if total else 0.0
        print(f"{name}: {killed}/{total} killed ({score:.1f}%), {len(result['survivors'])} left")
        for mutant, diff in result["survivors"].items():
            print(f"  {mutant}\n      {diff}")
        sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
