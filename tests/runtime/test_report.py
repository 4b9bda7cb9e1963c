"""The report: one entry per pass, readable, printed once unless verbose=False."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

import autoopt
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
