"""The report: one entry per pass, readable, printed once unless verbose=False."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import autoopt
from autoopt.runtime.memory import state_memory
from autoopt.runtime.report import PassResult, Report, Status

from .models import MLP


def test_report_table_and_lookup() -> None:
    report = Report()
    report.add(PassResult.applied("amp", "bf16 autocast"))
    report.add(PassResult.skipped("compile", "not on CUDA"))
    report.replace(PassResult.failed("compile", "boom", "eager forward"))
    text = str(report)
    assert text.splitlines()[0] == "autoopt report"
    assert "compile" in text and "failed" in text and "boom -> eager forward" in text
    assert report["compile"].status is Status.FAILED
    assert report.applied() == ["amp"]
    assert report.to_dict()[1] == {
        "pass": "compile",
        "status": "failed",
        "applied": False,
        "reason": "boom",
        "detail": "boom",
        "fallback": "eager forward",
        "figures": {},
        "events": [],
    }
    assert report.to_dict()[0]["reason"] is None and report.to_dict()[0]["applied"]
    with pytest.raises(KeyError, match="no pass named 'x'"):
        report["x"]


def test_every_pass_is_reported_and_printed_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="autoopt"):
        model = autoopt.optimize(MLP())
    assert sum("autoopt report" in r.getMessage() for r in caplog.records) == 1
    report = autoopt.report(model)
    for name in ("device", "amp", "compile", "channels_last", "backends"):
        assert name in report
        assert report[name].detail  # applied says what, skipped says why


def test_verbose_false_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    autoopt.optimize(MLP(), verbose=False)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_report_of_a_plain_model_is_an_error() -> None:
    with pytest.raises(ValueError, match="not returned by autoopt.optimize"):
        autoopt.report(MLP())


def test_the_report_goes_to_the_autoopt_logger(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="autoopt"):
        autoopt.optimize(MLP())
    (record,) = [r for r in caplog.records if "autoopt report" in r.getMessage()]
    assert record.name == "autoopt" and record.levelno == logging.INFO
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="autoopt"):
        autoopt.optimize(MLP(), verbose=False)
    assert [r.levelno for r in caplog.records if "autoopt report" in r.getMessage()] == [
        logging.DEBUG
    ]


def test_only_rank_zero_speaks(monkeypatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("RANK", "1")
    with caplog.at_level(logging.DEBUG, logger="autoopt"):
        autoopt.optimize(MLP())
    assert not caplog.records


def test_a_decision_made_after_optimize_returned_is_said_when_made(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = autoopt.optimize(MLP(), verbose=False)
    with caplog.at_level(logging.DEBUG, logger="autoopt"):
        autoopt.report(model).replace(PassResult.failed("compile", "boom", "eager forward"))
    assert [r.getMessage() for r in caplog.records] == [
        "autoopt: compile failed: boom -> eager forward"
    ]
    assert caplog.records[0].levelno == logging.DEBUG  # verbose=False


def test_autoopt_disable_returns_the_arguments_untouched(monkeypatch) -> None:
    monkeypatch.setenv("AUTOOPT_DISABLE", "1")
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    forward = model.forward
    returned = autoopt.optimize(model, None, optimizer, amp="bf16")
    assert returned == (model, optimizer)
    assert model.forward == forward and not hasattr(model, "_autoopt_applied")
    report = autoopt.report(model)  # an answer, not an exception (it raised on main)
    assert "autoopt is disabled (AUTOOPT_DISABLE is set)" in str(report)
    assert report.to_dict()[0]["status"] == "skipped" and not report.applied()
    monkeypatch.delenv("AUTOOPT_DISABLE")
    with pytest.raises(ValueError, match="not returned by autoopt.optimize"):
        autoopt.report(model)


def test_autoopt_options_override_the_call_and_are_shown(monkeypatch) -> None:
    monkeypatch.setenv("AUTOOPT_OPTIONS", "amp=False, channels_last=false")
    model = autoopt.optimize(MLP(), amp="bf16", verbose=False)
    report = autoopt.report(model)
    assert report["amp"].status is Status.SKIPPED
    assert report.overrides == {"amp": False, "channels_last": False}
    assert "options set by AUTOOPT_OPTIONS: amp=False, channels_last=False" in str(report)
    monkeypatch.setenv("AUTOOPT_OPTIONS", "ampp=False")
    with pytest.raises(ValueError, match="AUTOOPT_OPTIONS=.*'ampp=False' is not name=value"):
        autoopt.optimize(MLP())


def test_without_logging_configured_the_report_is_printed_to_stderr() -> None:
    # A plain script: no logging set up anywhere, so autoopt's own stderr handler prints it.
    code = (
        "import torch, autoopt\n"
        "autoopt.optimize(torch.nn.Linear(2, 2))\n"
        "autoopt.optimize(torch.nn.Linear(2, 2), verbose=False)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("autoopt report") == 1 and done.stdout == ""


# A number the report shows, with its unit: times, bytes, shares, ratios, counts of steps.
_SHOWN = re.compile(
    r"(?<![\w.-])(\d+(?:\.\d+)?) ?(ms|s|min|B|KiB|MiB|GiB|%|x|steps|rounds|modules)(?![\w])"
)
_SCALE = {
    "ms": 1e-3, "s": 1.0, "min": 60.0, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30,
    "%": 1e-2, "x": 1.0, "steps": 1, "rounds": 1, "modules": 1,
}  # fmt: skip


def _unfigured(result: PassResult) -> list[str]:
    """The numbers a report line shows that are no field of its figures (to 3 significant
    digits, as shown; a ratio 'Nx' may be 1 + a lead)."""
    values = [abs(v) for v in result.figures.values()]
    missing = []
    for number, unit in _SHOWN.findall(result.detail):
        shown = float(number) * _SCALE[unit]
        candidates = values + ([v + 1 for v in values] if unit == "x" else [])
        tolerance = max(0.051 * shown, 0.006 if unit == "%" else 0.0)
        if shown and not any(abs(v - shown) <= tolerance for v in candidates):
            missing.append(f"{number} {unit}")
    return missing


def test_every_number_a_report_line_shows_is_one_of_its_figures(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 31: the decisions' timings were only inside `detail` strings. Trials (layout,
    amp, a compile the run cannot repay), the optimizer step's timing, a checkpoint plan and
    its measured cost: each line's numbers are fields of its row's `figures`."""
    from autoopt.runtime import hardware

    from .checkpoint_models import GPT
    from .models import SmallCNN, cnn_data

    monkeypatch.setattr(hardware, "cpu_supports_bf16", lambda: True)  # the amp trial runs
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = cnn_data(8 * 40)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    model, loader, optimizer = autoopt.optimize(
        model, loader, optimizer, compile_cache=tmp_path, verbose=False
    )
    for xb, yb in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        optimizer.step()
    gpt = GPT(layers=4)
    tokens = torch.randint(0, 32, (4, 24))
    budget = state_memory(gpt, torch.optim.AdamW(gpt.parameters())).state + 2 * 2**20 // 10
    gpt_optimizer = torch.optim.AdamW(gpt.parameters(), lr=1e-3)
    gpt, gpt_optimizer = autoopt.optimize(
        gpt, None, gpt_optimizer, amp=False, compile=False, memory_budget=budget, verbose=False
    )
    for _ in range(8):
        gpt_optimizer.zero_grad()
        gpt(tokens).sum().backward()
        gpt_optimizer.step()
    rows = [*autoopt.report(model).results, autoopt.report(gpt)["checkpoint"]]
    for name in ("channels_last", "amp", "compile", "backends", "trials"):
        assert autoopt.report(model)[name].figures, name  # measured, and said
    assert autoopt.report(gpt)["checkpoint"].figures.get("measured_recompute_s")
    missing = {r.name: _unfigured(r) for r in rows if _unfigured(r)}
    assert not missing, {n: (m, autoopt.report(model).to_dict()) for n, m in missing.items()}


@pytest.mark.parametrize("cost_s", [0.00663, 0.0421, 1.3])
def test_the_trials_cost_is_a_figure_at_the_precision_it_is_shown(cost_s: float) -> None:
    """A trials cost of a few milliseconds ('6.63 ms') was kept as `cost_s` rounded to the
    millisecond (0.007): the line's number was no figure (flaky with the machine's speed)."""
    from torch import nn

    from autoopt.runtime.report import Report
    from autoopt.runtime.trials.choices import Trials

    trials = Trials(model=nn.Linear(1, 1), report=Report())
    trials.cost_s = cost_s
    trials._report_schedule(gain=cost_s / 7)
    row = trials.report["trials"]
    assert row.figures["cost_s"] == pytest.approx(cost_s, rel=1e-4)
    assert not _unfigured(row), row.detail
