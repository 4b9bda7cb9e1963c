"""Click commands of the diagnostics: doctor and bench."""

from __future__ import annotations

import functools
import json
import os
import sys
import time

import click


def _require_torch(command: str) -> None:
    """Exit 2 with what to install when torch is not (autoopt installs without it)."""
    from autoopt.torch_missing import missing

    why = missing(command)
    if why:
        from autoopt.cli.options import fail

        fail(why)


def _described(err: Exception) -> str:
    """An exception as one line: its message, with its type where the message needs it (a
    SyntaxError or whatever the user's module raised on import)."""
    if isinstance(err, ImportError | ValueError | TypeError | AttributeError):
        return str(err)
    return f"{type(err).__name__}: {err}"


def _writable(path: str | None, hint: str) -> None:
    """A usage error (exit 2) now, before a long run, when `path` cannot be written later."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise click.BadParameter(f"{path}: the folder {folder} does not exist", param_hint=hint)
    if not os.access(folder, os.W_OK):
        raise click.BadParameter(f"{path}: the folder {folder} is not writable", param_hint=hint)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option(
    "--model",
    "model_spec",
    metavar="MODULE:ATTR",
    help="Summarise this model (an nn.Module, or a class/factory called with no arguments) "
    "and show the plan optimize() would make for it.",
)
@click.option(
    "--input",
    "input_spec",
    metavar="MODULE:ATTR",
    help="An example input for --model's forward (a tensor, a tuple of arguments, or a "
    "function returning one): doctor lists the graph breaks and recompiles torch.compile meets.",
)
@click.option(
    "--memory-budget",
    default="auto",
    show_default=True,
    metavar="SIZE",
    help="What one training step may hold on the device, for --model's memory plan: 'auto' "
    "(free CUDA memory, no limit on CPU), 'none', bytes, or a size such as 2GiB or 800MB.",
)
def doctor(
    as_json: bool, model_spec: str | None, input_spec: str | None, memory_budget: str
) -> None:
    """Report torch, CUDA, devices, CPU features, environment and what optimize() would do."""
    _require_torch("autoopt doctor")
    from autoopt.diagnostics import doctor as doctor_module
    from autoopt.runtime.memory import parse_budget

    if input_spec and not model_spec:
        raise click.BadParameter("needs --model", param_hint="--input")
    try:
        budget = None if memory_budget.lower() == "none" else parse_budget(memory_budget)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--memory-budget") from err
    model = example = None
    # Load what the specs name before any measurement: a typo is a usage error (exit 2) at once.
    for hint, spec in (("--model", model_spec), ("--input", input_spec)):
        if spec is None:
            continue
        try:
            if hint == "--model":
                model = doctor_module.load_model(spec)
            else:
                example = doctor_module.load_object(spec)
        except Exception as err:  # the user's module runs here: whatever it raises is theirs
            raise click.BadParameter(f"{spec}: {_described(err)}", param_hint=hint) from err
    if model is not None and not as_json:
        click.echo("doctor: measuring the model (compile events, memory plan)...", err=True)
    try:
        info = doctor_module.collect(model_spec, input_spec, budget, model=model, example=example)
    except (ImportError, AttributeError, ValueError, TypeError) as err:
        raise click.ClickException(f"--model {model_spec}: {err}") from err
    click.echo(json.dumps(info, indent=2) if as_json else doctor_module.render(info))


@click.command()
@click.option(
    "--workload",
    "workloads",
    multiple=True,
    metavar="NAME",
    help="Run this workload (repeatable; default: all).",
)
@click.option(
    "--config",
    "configs",
    multiple=True,
    metavar="NAME",
    help="Run only this configuration (repeatable; eager is always run).",
)
@click.option("--steps", default=10, show_default=True, help="Timed steps per repeat.")
@click.option("--repeats", default=3, show_default=True, help="Timed blocks per configuration.")
@click.option(
    "--warmup",
    default=10,
    show_default=True,
    help="Untimed warm-up steps (10: the steps optimize()'s optimizer-step timing takes).",
)
@click.option(
    "--isolate/--no-isolate",
    default=False,
    show_default=True,
    help="Run each configuration alone in its own process (clean memory figures and compiler "
    "caches) instead of interleaving the timed blocks of a workload's configurations in one.",
)
@click.option(
    "--clock",
    type=click.Choice(["wall", "cpu"]),
    default="wall",
    show_default=True,
    help="Time the steps by the wall clock, or by the process's CPU time (CPU only: does not "
    "grow with other jobs' load on a shared machine; use with --threads 1).",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    help="torch intra-op threads (default: torch's own choice).",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write results here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a PNG chart.")
@click.option(
    "--markdown", "md_path", type=click.Path(dir_okay=False), help="Write the Markdown table."
)
@click.option("--list", "list_only", is_flag=True, help="List workloads and configurations.")
def bench(
    workloads: tuple[str, ...],
    configs: tuple[str, ...],
    steps: int,
    repeats: int,
    warmup: int,
    isolate: bool,
    clock: str,
    threads: int | None,
    json_path: str | None,
    plot_path: str | None,
    md_path: str | None,
    list_only: bool,
) -> None:
    """Benchmark eager, each trick, optimize(), optimize(tune=True) and the peers side by side."""
    _require_torch("autoopt bench")
    from autoopt.diagnostics import bench as bench_module
    from autoopt.diagnostics.bench import harness, peers

    if list_only:
        for name, w in harness.WORKLOADS.items():
            click.echo(f"{name:<12} {w.description}")
            click.echo(f"{'':<12} configs: {', '.join(harness.config_names(w))}")
        click.echo(f"peers: {peers.describe(sorted(set(harness.PEERS.values())))}")
        return
    unknown = [w for w in workloads if w not in harness.WORKLOADS]
    if unknown:
        raise click.BadParameter(
            f"{', '.join(unknown)}; choose from {', '.join(harness.WORKLOADS)}",
            param_hint="--workload",
        )
    chosen = [harness.WORKLOADS[w] for w in workloads] or list(harness.WORKLOADS.values())
    known = {name for w in chosen for name in harness.config_names(w)}
    unknown = [c for c in configs if c not in known]
    if unknown:
        raise click.BadParameter(
            f"{', '.join(unknown)}; choose from {', '.join(sorted(known))} (`autoopt bench --list`)",
            param_hint="--config",
        )
    if steps < 1 or repeats < 1 or warmup < 0:
        raise click.BadParameter("--steps and --repeats must be >= 1, --warmup >= 0")
    for path, hint in ((json_path, "--json"), (md_path, "--markdown"), (plot_path, "--plot")):
        _writable(path, hint)
    run = functools.partial(
        harness.run_suite,
        list(workloads) or None,
        configs=list(configs) or None,
        steps=steps,
        repeats=repeats,
        warmup=warmup,
        isolate=isolate,
        clock=clock,
        threads=threads,
    )
    if sys.stderr.isatty():
        with click.progressbar(
            length=1, label="benchmarking", file=sys.stderr, item_show_func=lambda s: s
        ) as bar:

            def show(label: str, done: int, total: int) -> None:
                bar.length = total
                bar.update(done - bar.pos, label)

            results = run(progress=show)
    else:  # a log or a pipe: a progress bar would print nothing until the end
        results = run(progress=bench_module.progress_line)
    table = bench_module.markdown(results)
    click.echo(table)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)
        click.echo(f"wrote {json_path}", err=True)
    if md_path:
        with open(md_path, "w") as f:
            f.write(table)
        click.echo(f"wrote {md_path}", err=True)
    if plot_path:
        try:
            bench_module.plot(results, plot_path)
        except RuntimeError as err:
            raise click.ClickException(str(err)) from err
        click.echo(f"wrote {plot_path}", err=True)


@click.command()
@click.option("--quick", is_flag=True, help="Small models, few steps, no compile on CPU (CI).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--device", default=None, help="Device to test (default: cuda if present, else cpu).")
@click.option("-v", "--verbose", is_flag=True, help="Also what optimize() reported for each check.")
def selftest(quick: bool, as_json: bool, device: str | None, verbose: bool) -> None:
    """Prove each pass on this machine against the same loop written with torch's own tools."""
    started = time.perf_counter()
    _require_torch("autoopt selftest")
    from autoopt.diagnostics import selftest as selftest_module

    try:
        where = selftest_module.describe_device(device)
    except (RuntimeError, AssertionError) as err:
        raise click.BadParameter(str(err), param_hint="--device") from err
    # Under torchrun every rank checks and rank 0 reports.
    reports = os.environ.get("RANK", "0") == "0"
    show = reports and not as_json
    live = show and sys.stdout.isatty()
    rows = []
    with selftest_module.check_threads(quick, device) as threads:
        if show:
            click.echo(selftest_module.header(where, quick, threads), nl=False)
        for name, check in selftest_module.planned_checks(quick=quick, device=device):
            if live:  # what runs now, replaced by its result (a check can take a while)
                click.echo(f"{'...':<9}{name}", nl=False)
            elif as_json and reports:
                click.echo(f"selftest: {name} ...", err=True)
            row = selftest_module.run_check(name, check)
            rows.append(row)
            if show:
                click.echo("\r\x1b[K" if live else "", nl=False)
                click.echo(selftest_module.row_lines(row, verbose), nl=False)
                sys.stdout.flush()
    code = 1 if any(r.failed for r in rows) else 0
    if as_json and reports:
        payload = {"device": where, "checks": selftest_module.to_json(rows)}
        click.echo(json.dumps(payload, indent=2))
    elif show:
        click.echo(selftest_module.verdict(rows, time.perf_counter() - started), nl=False)
    selftest_module.finish(code)


COMMANDS: list[click.Command] = [doctor, bench, selftest]
