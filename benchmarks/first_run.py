"""First contact, end to end: an unseen model's first run with autoopt against eager, the runs
after it, and whether repeated first runs make the same plan.

Workloads (each run is a fresh process, timed from its start to its end: interpreter, imports,
`optimize()`, trials, compiles and every step):

* `cnn`, `transformer`: the demo's examples (examples/cnn.py, examples/transformer_lm.py), their
  `Session` loop for `--steps` steps (default 100) at the demo's batch sizes;
* `mnist`: pytorch/examples' mnist/main.py with synthetic digits
  (benchmarks/scripts/mnist_like.py: 2 epochs of 10 steps), the original against the script
  `autoopt rewrite --wrap` makes of it.

For each workload: `--runs` first runs, each with fresh caches (its own AUTOOPT_COMPILE_CACHE,
AUTOOPT_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR), the first of them followed by `--later` runs
on its caches; every one of them right after an eager run of its own, so each ratio is of a
pair run under the same load. Per run: wall and CPU seconds (the process and its
children: g++ included), the steady-state seconds per step (median of the last half of the
steps, by the wall clock), what the report says the trials cost, and the plan (what each
measured choice kept: layout, amp, compile, the optimizer step). Printed: first run / eager and
later run / eager (wall, CPU), the steady-state speed-up, and how many first runs made the most
common plan. The load average is printed beside every figure: on a shared machine the wall
times move with it.

    python -m benchmarks.first_run --workloads cnn transformer mnist --runs 10 --json out.json
    python -m benchmarks.first_run --workloads mnist --runs 3 --later 1    # a quick look
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MNIST = ROOT / "benchmarks" / "scripts" / "mnist_like.py"
BATCH = {"cnn": 64, "transformer": 32}
PLANNED = ("channels_last", "amp", "compile", "backends")


def plan_of(report: Any) -> dict[str, str]:
    """What each measured choice kept, as the report says it: the pass's status and the head
    of its line (e.g. 'applied: bf16 autocast', 'skipped: eager kept')."""
    plan = {}
    for name in PLANNED:
        if name in report:
            row = report[name]
            head = row.detail.split(":")[0].split(" (")[0]
            plan[name] = f"{row.status.value}: {head}"
    return plan


def child(workload: str, use_autoopt: bool, steps: int, script: str | None) -> None:
    """One run in this process: the loop, every step's end time (an optimizer step hook), and
    the plan and trial figures of the report; one JSON line on stdout."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    ends: list[tuple[float, float]] = []  # (wall, CPU) at every optimizer step's end
    register_optimizer_step_post_hook(
        lambda *_: ends.append((time.perf_counter(), time.process_time()))
    )
    models: list[Any] = []
    if use_autoopt:
        import autoopt

        optimize = autoopt.optimize

        def recording(*args: Any, **kwargs: Any) -> Any:
            out = optimize(*args, **kwargs)
            models.append(out[0] if isinstance(out, tuple) else out)
            return out

        autoopt.optimize = recording  # type: ignore[assignment]
    if workload == "mnist":
        assert script is not None
        sys.argv = [script]
        with open(os.devnull, "w") as quiet:
            stdout, sys.stdout = sys.stdout, quiet
            try:
                runpy.run_path(script, run_name="__main__")
            finally:
                sys.stdout = stdout
    else:
        sys.path.insert(0, str(ROOT / "examples"))
        example = __import__("cnn" if workload == "cnn" else "transformer_lm")
        session = example.Session(use_autoopt, BATCH[workload], verbose=False)
        session.steps(steps)
    walls = [b[0] - a[0] for a, b in zip(ends, ends[1:], strict=False)]
    cpus = [b[1] - a[1] for a, b in zip(ends, ends[1:], strict=False)]
    half = len(walls) // 2
    row: dict[str, Any] = {
        "steps": len(ends),
        "steady_s": statistics.median(walls[half:]) if walls else None,
        "steady_cpu_s": statistics.median(cpus[half:]) if cpus else None,
    }
    if models:
        import autoopt

        report = autoopt.report(models[0])
        row["plan"] = plan_of(report)
        if "trials" in report:
            row["trials"] = report["trials"].figures
            row["trials_line"] = report["trials"].detail
        row["compile_line"] = report["compile"].detail if "compile" in report else ""
    print(json.dumps(row))


def run(
    workload: str, use_autoopt: bool, steps: int, caches: dict[str, str], script: Path | None
) -> dict[str, Any]:
    """A fresh process: wall and CPU seconds (its children included), and what it printed."""
    env = dict(os.environ, **caches)
    command = [sys.executable, "-m", "benchmarks.first_run", "--child", workload]
    command += ["--steps", str(steps)] + (["--autoopt"] if use_autoopt else [])
    if script is not None:
        command += ["--script", str(script)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    row: dict[str, Any] = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}
    row["load"] = round(os.getloadavg()[0], 1)
    if done.returncode or not lines:
        row["error"] = done.stderr[-800:]
        return row
    row.update(json.loads(lines[-1]))
    return row


def fresh_caches(root: str) -> dict[str, str]:
    return {
        "AUTOOPT_COMPILE_CACHE": os.path.join(root, "compile"),
        "AUTOOPT_CACHE_DIR": os.path.join(root, "tune"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),
    }


def wrapped_mnist(into: Path) -> Path:
    """The mnist script as `autoopt rewrite --wrap` leaves it (a copy in `into`)."""
    target = into / "mnist_wrapped.py"
    target.write_text(MNIST.read_text())
    subprocess.run(
        [sys.executable, "-m", "autoopt", "rewrite", "--wrap", str(target)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return target


def workload_rows(workload: str, runs: int, later: int, steps: int) -> dict[str, Any]:
    """Every autoopt run right after an eager run of its own (load that comes and goes falls on
    both; each ratio is of a pair): `runs` first runs, the first one followed by `later` runs
    on its caches."""
    scratch = Path(tempfile.mkdtemp(prefix=f"ao-first-{workload}-"))
    original = MNIST if workload == "mnist" else None
    wrapped = wrapped_mnist(scratch) if workload == "mnist" else None
    rows: dict[str, Any] = {"eager": [], "first": [], "later": []}

    def pair(kind: str, caches: dict[str, str]) -> None:
        eager = run(workload, False, steps, fresh_caches(str(scratch / "eager")), original)
        mine = run(workload, True, steps, caches, wrapped)
        mine["eager"] = eager
        rows["eager"].append(eager)
        rows[kind].append(mine)
        print(f"[{workload}] {kind} run: {mine}", file=sys.stderr, flush=True)

    for i in range(runs):
        caches = fresh_caches(str(scratch / f"run{i}"))
        pair("first", caches)
        if i == 0:
            for _ in range(later):
                pair("later", caches)
    return rows


def summary(workload: str, rows: dict[str, Any]) -> str:
    """Medians of the paired ratios (autoopt run / the eager run before it), the steady-state
    speed-up, and how many first runs made the most common plan."""
    ok = {
        k: [r for r in rows[k] if "error" not in r and "error" not in r["eager"]]
        for k in ("first", "later")
    }
    plans = collections.Counter(json.dumps(r.get("plan"), sort_keys=True) for r in ok["first"])
    common, same = plans.most_common(1)[0] if plans else ("{}", 0)

    def ratio(key: str, group: list[dict[str, Any]]) -> str:
        values = [r[key] / r["eager"][key] for r in group if r["eager"].get(key)]
        return f"{statistics.median(values):.2f}" if values else "-"

    runs = ok["first"] + ok["later"]
    loads = [r["load"] for r in runs] + [r["eager"]["load"] for r in runs]
    return (
        f"{workload}: first run / eager {ratio('wall_s', ok['first'])} wall, "
        f"{ratio('cpu_s', ok['first'])} CPU; later run / eager {ratio('wall_s', ok['later'])} "
        f"wall, {ratio('cpu_s', ok['later'])} CPU; steady-state speed-up (eager / autoopt "
        f"seconds a step) {_inverse(ratio('steady_s', runs))} wall, "
        f"{_inverse(ratio('steady_cpu_s', runs))} CPU; the same plan in {same} of "
        f"{len(rows['first'])} first runs ({common}); load {min(loads, default=0)}-"
        f"{max(loads, default=0)}"
    )


def _inverse(text: str) -> str:
    return f"{1 / float(text):.2f}x" if text != "-" else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["cnn", "transformer", "mnist"])
    parser.add_argument("--runs", type=int, default=10, help="first runs, fresh caches each")
    parser.add_argument("--later", type=int, default=2, help="runs on the first run's caches")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--autoopt", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--script", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.autoopt, args.steps, args.script)
        return
    results = {}
    for workload in args.workloads:
        results[workload] = workload_rows(workload, args.runs, args.later, args.steps)
        print(summary(workload, results[workload]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
