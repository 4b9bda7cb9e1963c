"""`--wrap` is verified like every fix, but advice the runtime makes relevant is not a break: a
script with 84-wide layers gets AO610's tensor-core advice once optimize() runs AMP, and must
still be wrapped (found on the held-out corpus: a cleanrl DQN was declined for it)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from autoopt.cli import main

SCRIPT = """\
import torch
from torch import nn

model = nn.Sequential(nn.Linear(84, 84), nn.ReLU(), nn.Linear(84, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
data = torch.utils.data.TensorDataset(torch.randn(64, 84), torch.randint(0, 2, (64,)))
loader = torch.utils.data.DataLoader(data, batch_size=8)
for x, y in loader:
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
"""


def test_wrap_is_not_declined_for_advice_it_makes_relevant(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["rewrite", "--wrap", "train.py"])
    assert result.exit_code == 0, result.output
    assert "autoopt.optimize(model, loader, optimizer" in (tmp_path / "train.py").read_text()
    assert "declined" not in result.stderr or "declined 0" in result.stderr
