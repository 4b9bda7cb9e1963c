"""`autoopt bench`: eager, each trick by hand, `optimize()`, `optimize(tune=True)` and the peers
(Accelerate, Lightning Fabric, when installed) timed side by side on reference workloads.

Everything ships in the package, so a pip install runs it: the workloads (`workloads`), the way
each configuration is set up and timed (`harness`), the peers as their users configure them
(`peers`), and what a run shows (`tables`). `benchmarks/` of the repository holds the scripts
that run it for the docs (`python -m benchmarks.run`) and the other benchmarks.
"""

from autoopt.diagnostics.bench.tables import markdown, plot, progress_line

__all__ = ["markdown", "plot", "progress_line"]
