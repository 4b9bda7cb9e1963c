"""Do rewritten and wrapped training scripts still run? Each script of benchmarks/corpus/runs.json
is executed on the CPU for a few optimizer steps on tiny synthetic data, as the original, after
`autoopt rewrite` (safe fixes), after `autoopt rewrite --unsafe-fixes` and after
`autoopt rewrite --wrap`, each in a scratch copy of its repository (fetched by
benchmarks/corpus/fetch.py; --split test fetches the held-out repositories).

How a script is made to run (benchmarks/run_shims/, first on PYTHONPATH of the runs only): a
sitecustomize ends the process with exit code 0 after AUTOOPT_RUN_STEPS optimizer steps (a global
optimizer step hook) and gives torch.compile the `aot_eager` backend (dynamo and AOTAutograd,
without inductor's C++ build; AUTOOPT_RUN_COMPILE_BACKEND=inductor for the real one); stand-in
`torchvision` (synthetic datasets, transforms, small models) and `gym` (CartPole) packages
replace the real ones. What a script needs beyond that is in its runs.json entry: command-line
arguments, `replace` (exact text substitutions made in the script, or in another file of its
repository, before any variant is made, e.g. a hard-coded "cuda:0"), `files` (tiny data files written into the copy), `cuda_as_cpu` (`.cuda()` leaves tensors and
modules on the CPU, for a script that calls it unconditionally). CUDA is hidden
(CUDA_VISIBLE_DEVICES=""), one thread per run.

    python benchmarks/run_scripts.py --json out/runs.json            # every script, 4 variants
    python benchmarks/run_scripts.py --split test --only makemore    # one script

Runs go two at a time by default (-j; the variants of one script side by side, test scripts
first), each process on one thread: on the shared 2-core machine more would only queue.

A variant `pass`es when it reaches the step count (or ends with exit code 0); it `breaks` when the
original passes and the variant fails (a `timeout` is listed apart: tracing a model for
torch.compile on a loaded CPU can take minutes). Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
SHIMS = HERE / "run_shims"
SPEC = CORPUS / "runs.json"
ROOTS = {"dev": CORPUS / "_repos", "test": CORPUS / "_repos_test"}
MARKER = "AUTOOPT_RUN: reached"
ACTIVE = "AUTOOPT_RUN: shim active"
# variant -> the rewrite that makes it (None: the script as it is)
VARIANTS = {
    "original": None,
    "safe": ("rewrite",),
    "unsafe": ("rewrite", "--unsafe-fixes"),
    "wrap": ("rewrite", "--wrap"),
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def last_error(text: str) -> str:
    """The exception line of a traceback (else the last non-empty line)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0].strip()
        if head.endswith(("Error", "Exception", "Interrupt", "Exit")) and " " not in head:
            return line.strip()[:300]
    return lines[-1].strip()[:300] if lines else ""


def prepare(entry: dict, root: Path, tmp: Path) -> tuple[Path, Path]:
    """Copy the entry's repository into TMP, apply its `replace` and `files`; returns the script
    to run and the file the variants edit (the script itself unless the entry names `edit`)."""
    source = root / entry["repo"].replace("/", "+")
    if not source.is_dir():
        raise SystemExit(
            f"{source} not found: run benchmarks/corpus/fetch.py --split {entry['split']}"
        )
    copy = tmp / source.name
    shutil.copytree(source, copy, symlinks=True)
    script = copy / entry["script"]
    for item in entry.get("replace", []):
        # [old, new] in the script, or [file, old, new] in another file of the repository
        file, old, new = (script, *item) if len(item) == 2 else (copy / item[0], *item[1:])
        text = file.read_text(encoding="utf-8")
        if old not in text:
            raise SystemExit(f"{entry['name']}: replace target {old!r} not in {file.name}")
        file.write_text(text.replace(old, new), encoding="utf-8")
    for rel, content in entry.get("files", {}).items():
        target = copy / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    return script, copy / entry.get("edit", entry["script"])


def make_variant(script: Path, variant: str) -> dict:
    """Run the variant's rewrite on SCRIPT in place; what it did."""
    args = VARIANTS[variant]
    if args is None:
        return {"changed": False}
    before = script.read_text(encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "autoopt", *args, str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    summary = [line for line in proc.stderr.strip().splitlines() if line.strip()][-2:]
    return {"changed": script.read_text(encoding="utf-8") != before, "rewrite": summary}


def execute(entry: dict, script: Path, steps: int, timeout: int) -> dict:
    """Run SCRIPT with the shims; pass, finished, fail or timeout, and the error line."""
    repo_root = script.parents[len(Path(entry["script"]).parts) - 1]
    cwd = repo_root / entry.get("cwd", str(Path(entry["script"]).parent))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SHIMS), str(repo_root)]),
        "AUTOOPT_RUN_SHIM": "1",
        "AUTOOPT_RUN_STEPS": str(steps),
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        "WANDB_MODE": "disabled",
        "AUTOOPT_RUN_CUDA_AS_CPU": "1" if entry.get("cuda_as_cpu") else "0",
    }
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, str(script), *entry.get("args", [])],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        out = (
            (exc.stderr or b"").decode(errors="replace")
            if isinstance(exc.stderr, bytes)
            else (exc.stderr or "")
        )
        return {"status": "timeout", "error": last_error(out), "seconds": timeout}
    seconds = round(time.perf_counter() - start, 1)
    if ACTIVE not in proc.stderr:
        status, error = "fail", "the run shim was not loaded: " + last_error(proc.stderr)
    elif MARKER in proc.stdout:
        status, error = "pass", ""
    elif proc.returncode == 0:
        status, error = "finished", ""
    else:
        status, error = "fail", last_error(proc.stderr or proc.stdout)
    return {"status": status, "error": error, "rc": proc.returncode, "seconds": seconds}


def prepare_variant(entry: dict, variant: str, tmp: Path) -> dict:
    """Copy the entry's repository into TMP and make VARIANT there (nothing run yet)."""
    script, target = prepare(entry, ROOTS[entry["split"]], tmp)
    made = make_variant(target, variant)
    text = target.read_text(encoding="utf-8")
    return {"script": script, "made": made, "digest": hashlib.sha256(text.encode()).hexdigest()}


def judge(entry: dict, outcomes: dict[str, dict], variants: list[str]) -> dict:
    """One entry's result: each variant's outcome, and whether it breaks what the original ran."""
    edits = entry.get("edit", entry["script"])
    result: dict = {"name": entry["name"], "split": entry["split"]}
    result["script"] = f"{entry['repo']}/{edits}"
    result |= {v: outcomes[v] for v in variants}
    original = result.get("original", {}).get("status")
    for variant in variants:
        if variant == "original":
            continue
        status = result[variant]["status"]
        # a timeout is reported, not counted: compiling on a loaded CPU can outlast any limit
        result[variant]["breaks"] = original in ("pass", "finished") and status == "fail"
    return result


def run_all(entries: list[dict], variants: list[str], steps: int, timeout: int, jobs: int, done):
    """Every (entry, variant) run, JOBS at a time: the variants of one script run side by side,
    not one after another. All variants are made first (the rewrites are cheap); a variant whose
    edited file is byte-identical to an earlier variant of the same script is not run again
    (its outcome is that one's, with `same_as`): what runs is exactly what would have run.
    DONE(result) is called for each entry as soon as all its variants are in."""
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(max_workers=jobs) as pool:

        def made(entry: dict, variant: str) -> dict:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="autoopt-run-")))
            return prepare_variant(entry, variant, tmp)

        prepared = {(e["name"], v): pool.submit(made, e, v) for e in entries for v in variants}

        def execute_variant(entry: dict, variant: str) -> dict:
            ready = prepared[(entry["name"], variant)].result()
            outcome = dict(ready["made"])
            if variant != "original" and not ready["made"]["changed"]:
                return outcome | {"status": "unchanged", "error": ""}
            for earlier in variants[: variants.index(variant)]:
                other = prepared[(entry["name"], earlier)].result()
                if other["digest"] == ready["digest"] and (
                    earlier == "original" or other["made"]["changed"]
                ):
                    return outcome | {"same_as": earlier}  # filled in from EARLIER below
            t = entry.get("timeout", timeout)
            return outcome | execute(entry, ready["script"], steps, t)

        runs = {
            (e["name"], v): pool.submit(execute_variant, e, v) for e in entries for v in variants
        }
        for entry in entries:
            outcomes: dict[str, dict] = {}
            for variant in variants:
                outcome = runs[(entry["name"], variant)].result()
                if "same_as" in outcome:
                    same = outcomes[outcome["same_as"]]
                    outcome |= {
                        k: same[k] for k in ("status", "error", "rc", "seconds") if k in same
                    }
                outcomes[variant] = outcome
                log(
                    f"[run] {entry['name']} {variant}: {outcome['status']} {outcome.get('error', '')}"
                )
            done(judge(entry, outcomes, variants))


def print_table(results: list[dict], variants: list[str]) -> None:
    print("| script | split | " + " | ".join(variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    for r in results:
        cells = []
        for v in variants:
            o = r[v]
            cell = o["status"] + (" (BREAKS)" if o.get("breaks") else "")
            if o.get("error"):
                cell += f": {o['error'][:140]}"
            cells.append(cell.replace("|", "\\|"))
        print(f"| {r['script']} | {r['split']} | " + " | ".join(cells) + " |")
    runnable = [r for r in results if r.get("original", {}).get("status") in ("pass", "finished")]
    print(f"\n{len(results)} scripts, {len(runnable)} run as originals")
    for v in variants:
        if v == "original":
            continue
        ran = [r for r in runnable if r[v]["status"] != "unchanged"]
        ok = [r for r in ran if r[v]["status"] in ("pass", "finished")]
        broken = [r["name"] for r in runnable if r[v].get("breaks")]
        print(f"{v}: {len(ok)} of {len(ran)} changed scripts still run; broken: {broken}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", choices=("dev", "test", "all"), default="all")
    parser.add_argument("--only", action="append", help="entry names (runs.json `name`)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per run")
    parser.add_argument("--json", type=Path, help="write the full results here")
    parser.add_argument(
        "-j", "--jobs", type=int, default=2, help="runs at once (variants of one script too)"
    )
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    entries = [
        e
        for e in json.loads(SPEC.read_text(encoding="utf-8"))["scripts"]
        if (args.split == "all" or e["split"] == args.split)
        and (e["name"] in args.only if args.only else "skip" not in e)
    ]
    results: list[dict] = []

    def save() -> None:  # after every script: a run cut short leaves its results behind
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            payload = {
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "steps": args.steps,
                "results": results,
            }
            args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")

    def done(result: dict) -> None:
        results.append(result)
        save()

    started = time.perf_counter()
    run_all(entries, variants, args.steps, args.timeout, args.jobs, done)
    log(
        f"[run] {len(entries)} scripts, {len(variants)} variants, jobs {args.jobs}: "
        f"{time.perf_counter() - started:.0f} s"
    )
    print_table(results, variants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
