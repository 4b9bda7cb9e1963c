"""Bad values on the diagnostics commands are usage errors (exit 2, a clear message), found
before anything is measured."""

from __future__ import annotations

from click.testing import CliRunner

from autoopt.cli import main


def test_bench_rejects_an_unknown_config() -> None:
    result = CliRunner().invoke(main, ["bench", "--config", "nope", "--workload", "mlp"])
    assert result.exit_code == 2
    assert "Invalid value for --config: nope; choose from" in result.output
    assert "eager" in result.output


def test_doctor_rejects_a_model_spec_it_cannot_load_before_measuring(monkeypatch) -> None:
    from autoopt.diagnostics import doctor

    def collect(*args, **kwargs):
        raise AssertionError("measured before the spec was checked")

    monkeypatch.setattr(doctor, "collect", collect)
    result = CliRunner().invoke(main, ["doctor", "--model", "no_such_module_here:build"])
    assert result.exit_code == 2
    assert "Invalid value for --model" in result.output
    assert "no_such_module_here" in result.output
    result = CliRunner().invoke(main, ["doctor", "--model", "torch.nn:Linear"])
    assert result.exit_code == 2  # Linear() needs arguments: a TypeError, said as usage
