"""Run the benchmark suite, or merge results of several runs, and write JSON, Markdown and PNG.

    python -m benchmarks.run                                   # the whole suite (= autoopt bench)
    python -m benchmarks.run --workload cnn --steps 5          # a subset
    python -m benchmarks.run --merge a.json b.json --json all.json --markdown all.md --plot all.png

Merging lets the suite run one workload per invocation (partial results survive an interrupted
run); the machine figures of the first file are kept and the load averages of all are listed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from autoopt.diagnostics import bench
from autoopt.diagnostics.bench.harness import SETTLE_STEPS, run_suite


def merge(paths: list[Path]) -> dict[str, Any]:
    """One results document from several (same schema), workloads in the order given."""
    docs = [json.loads(p.read_text()) for p in paths]
    merged = dict(docs[0])
    merged["workloads"] = [w for d in docs for w in d["workloads"]]
    merged["machine"] = dict(docs[0]["machine"])
    merged["machine"]["load_avg_start"] = docs[0]["machine"].get("load_avg_start")
    merged["machine"]["load_avg_end"] = docs[-1]["machine"].get("load_avg_end")
    merged["machine"]["load_avg_per_run"] = [
        [d["machine"].get("load_avg_start"), d["machine"].get("load_avg_end")] for d in docs
    ]
    return merged


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", action="append", help="repeatable; default: all")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=SETTLE_STEPS)
    parser.add_argument("--isolate", action="store_true", help="each configuration alone")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--threads", type=int, help="torch intra-op threads")
    parser.add_argument("--merge", nargs="+", type=Path, help="merge these result files")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    if args.merge:
        results = merge(args.merge)
    else:
        results = run_suite(
            args.workload,
            steps=args.steps,
            repeats=args.repeats,
            warmup=args.warmup,
            isolate=args.isolate,
            clock=args.clock,
            threads=args.threads,
            progress=bench.progress_line,
        )
    table = bench.markdown(results)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.markdown:
        args.markdown.write_text(table)
    if args.plot:
        bench.plot(results, args.plot)


if __name__ == "__main__":
    main()
