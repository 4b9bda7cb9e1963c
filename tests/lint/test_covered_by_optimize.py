"""Rules whose trick autoopt.optimize() applies at run time stay quiet in scripts that call it."""

from __future__ import annotations

from pathlib import Path

from autoopt.lint.engine.analysis import analyze
from autoopt.lint.engine.registry import load_registry

ROOT = Path(__file__).resolve().parents[2]
RULES = load_registry().all()
COVERED = {r.code for r in RULES if r.covered_by_optimize}


def codes(source: str) -> set[str]:
    return {f.code for f in analyze(source, "train.py", RULES).findings}


def test_the_runtime_owns_the_expected_tricks() -> None:
    assert {"AO101", "AO102", "AO103", "AO104", "AO201", "AO301", "AO601", "AO606"} <= COVERED
    assert not {"AO402", "AO403", "AO406", "AO203"} & COVERED  # code habits stay the user's


def test_naive_script_is_told_to_adopt_runtime_tricks() -> None:
    source = (ROOT / "examples" / "naive" / "cnn_train.py").read_text()
    # (no AO101: its loaders serve in-memory TensorDatasets, where workers only add IPC)
    assert {"AO102", "AO201", "AO301"} <= codes(source)


def test_wrapped_script_is_not_told_what_optimize_already_does() -> None:
    source = (ROOT / "examples" / "naive" / "cnn_train.py").read_text()
    wrapped = source.replace(
        "    criterion = nn.CrossEntropyLoss()\n",
        "    criterion = nn.CrossEntropyLoss()\n"
        "    model, train_loader, optimizer = autoopt.optimize(model, train_loader, optimizer)\n",
    ).replace("import torch\n", "import autoopt\nimport torch\n", 1)
    assert "autoopt.optimize(" in wrapped
    found = codes(wrapped)
    assert not found & COVERED, found & COVERED
    assert {"AO402", "AO403"} <= found  # habits optimize() cannot change are still reported


def test_bundled_optimize_examples_have_no_covered_findings() -> None:
    for name in ("cnn.py", "transformer_lm.py"):
        found = codes((ROOT / "examples" / name).read_text())
        assert not found & COVERED, (name, found & COVERED)


def test_a_word_optimize_without_autoopt_does_not_silence_rules() -> None:
    source = (ROOT / "examples" / "naive" / "cnn_train.py").read_text()
    source += "\n\ndef optimize(x):\n    return x\n\noptimize(1)\n"
    assert "AO201" in codes(source)
