"""AO306 on whole scripts: silent where the dataset's size is a multiple of the batch size, and
so no veto on AO301's compile fix there (the verification step refuses a fix that a rule would
flag: a false positive of AO306 costs a script its compile)."""

from __future__ import annotations

from autoopt.lint.engine.analysis import analyze
from autoopt.lint.engine.registry import load_registry
from autoopt.lint.rewrite.apply import fix_source

RULES = load_registry().all()
BY_CODE = {r.code: r for r in RULES}

SCRIPT = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_tokens(n):
    tokens = torch.randint(0, 100, (n, 17))
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def main(steps):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loader = DataLoader(make_tokens(SIZE), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 100)).to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    for inputs, targets in loader:
        loss = nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def codes(source: str) -> set[str]:
    return {f.code for f in analyze(source, "train.py", RULES).findings}


def test_a_dataset_sized_as_a_multiple_of_the_batch_is_not_ragged() -> None:
    compiled = SCRIPT.replace(
        "    optimizer = torch.optim",
        '    model.compile(mode="reduce-overhead")\n    optimizer = torch.optim',
    )
    assert "AO306" not in codes(compiled.replace("SIZE", "32 * steps"))
    assert "AO306" in codes(compiled.replace("SIZE", "1000"))  # not known to divide
    assert "AO306" in codes(compiled.replace("SIZE", "33 * steps"))


def test_the_compile_fix_is_kept_where_batches_do_not_change_shape() -> None:
    """AO301 inserts a plain `model.compile()`: a ragged last batch costs it one recompile under
    torch's automatic dynamic shapes, so AO306 is silent and does not refuse the fix."""
    rules = [BY_CODE["AO301"], BY_CODE["AO306"]]
    for size in ("32 * steps", "1000"):
        fixed = fix_source(SCRIPT.replace("SIZE", size), rules)
        assert "model.compile()" in fixed.source, fixed.rejected
    assert "AO306" not in codes(fixed.source)


LOOPS = """
import torch
from torch.utils.data import DataLoader, TensorDataset


def evaluate(model, loader):
    with torch.no_grad():
        for x, y in loader:
            x = x.to("cpu")
            model(x)


def main(steps):
    x = torch.randn(SIZE, 20)
    y = x.sum(1)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    val_loader = DataLoader(TensorDataset(x[:100], y[:100]), batch_size=VAL)
    model = torch.nn.Linear(20, 1)
    model.compile(mode="reduce-overhead")
    for epoch in range(3):
        for xb, yb in loader:
            torch.nn.functional.mse_loss(model(xb).squeeze(1), yb).backward()
        model.eval()
        for xb, yb in val_loader:
            model(xb)
        model.train()
"""


def test_names_are_followed_and_evaluation_batches_do_not_count() -> None:
    def found(size: str, val: str = "16") -> bool:
        return "AO306" in codes(LOOPS.replace("SIZE", size).replace("VAL", val))

    assert not found("32 * steps")  # x is rebound in evaluate() too: any binding counts
    assert not found("32 * steps", val="64")  # a ragged loader in evaluation after .eval()
    assert not found("640")  # a literal multiple of the literal batch size
    assert found("1000") and found("steps")


def test_the_rewritten_examples_are_not_flagged() -> None:
    """Each of them compiles a model fed by a loader whose dataset is a multiple of its batch."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "examples" / "rewritten"
    flagged = {p.name for p in root.glob("*.py") if "AO306" in codes(p.read_text())}
    assert not flagged
