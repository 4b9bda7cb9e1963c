"""The report: one entry per pass, readable, printed once unless verbose=False."""

from __future__ import annotations

import pytest

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
        "detail": "boom",
        "fallback": "eager forward",
    }
    with pytest.raises(KeyError, match="no pass named 'x'"):
        report["x"]


def test_every_pass_is_reported_and_printed_once(capsys: pytest.CaptureFixture[str]) -> None:
    model = autoopt.optimize(MLP())
    err = capsys.readouterr().err
    assert err.count("autoopt report") == 1
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
