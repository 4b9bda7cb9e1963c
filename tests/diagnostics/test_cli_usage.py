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


def test_the_runtime_commands_without_torch_say_what_to_install(monkeypatch) -> None:
    """autoopt installs without torch (lint and rewrite never need it): doctor, bench and
    selftest then exit 2 naming what to install, never a traceback."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else find_spec(name)
    )
    for command in (["doctor"], ["bench", "--list"], ["selftest", "--quick"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 2, (command, result.output)
        assert f"autoopt {command[0]} needs PyTorch" in result.output
        assert 'pip install "autoopt[torch]"' in result.output
