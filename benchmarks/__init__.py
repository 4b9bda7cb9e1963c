"""The benchmarks of the repository. The suite `autoopt bench` runs ships in the package
(`autoopt.diagnostics.bench`); its old paths here still import, with a DeprecationWarning."""

from autoopt.moved import redirect

redirect(
    {
        f"benchmarks.{name}": f"autoopt.diagnostics.bench.{name}"
        for name in ("harness", "workloads", "peers")
    }
)
