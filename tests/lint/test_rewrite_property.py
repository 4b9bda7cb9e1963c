"""Property: fixing with every rule never crashes, always yields parsable code that passes
verification, and each rule's fixes reach their fixed point in one pass — on real code (a sample of torch's own sources, biased towards
files with `.backward(`/`DataLoader(` where rules can fire) and on generated training scripts
(hypothesis) that exercise the AMP fix's shapes: epoch loops, clipping, accumulation, GANs,
helpers, comments."""

from __future__ import annotations

import os
from pathlib import Path

import libcst as cst
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoopt.lint.engine.analysis import active_rules
from autoopt.lint.engine.registry import load_registry
from autoopt.lint.engine.suppress import filter_findings
from autoopt.lint.rewrite.apply import fix_source

SAMPLE_SIZE = 10  # every n-th file of torch; with HOT_SIZE keeps this module near 30 s
HOT_SIZE = 4  # files with training-like code
MAX_BYTES = 40_000  # skip generated giants: they cost time and test nothing new


def _sample() -> list[Path]:
    root = Path(torch.__file__).parent
    files = sorted(
        p
        for p in root.rglob("*.py")
        if os.path.getsize(p) <= MAX_BYTES and "_vendor" not in p.parts
    )
    picked = files[:: max(1, len(files) // SAMPLE_SIZE)][:SAMPLE_SIZE]
    hot = [p for p in files if ".backward(" in p.read_text(encoding="utf-8", errors="replace")]
    picked += [p for p in hot[:: max(1, len(hot) // HOT_SIZE)][:HOT_SIZE] if p not in picked]
    return picked


RULES = load_registry().all()
AMP = next(r for r in RULES if r.code == "AO201")
FILES = _sample()


@pytest.mark.slow
@pytest.mark.parametrize(
    "path", FILES, ids=[str(p.relative_to(Path(torch.__file__).parent)) for p in FILES]
)
def test_fix_every_rule_is_total_and_idempotent(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    try:
        cst.parse_module(source)
    except cst.ParserSyntaxError:  # pragma: no cover - syntax libcst does not know yet
        pytest.skip("libcst cannot parse this file")
    first = fix_source(source, RULES, unsafe=True, path=str(path))
    assert not first.skipped, first.skipped  # no rule crashed or broke the file
    assert not first.rejected, first.rejected  # no fix failed verification
    cst.parse_module(first.source)  # the output parses
    compile(first.source, str(path), "exec")  # ... and is valid Python to CPython too
    assert_one_pass_per_rule(source, str(path))


def assert_one_pass_per_rule(source: str, path: str = "<string>") -> None:
    """Idempotence that can fail: each rule's fixes, applied once (one pass), leave nothing for
    that rule to fix. `fix_source` loops to a fixed point, so a second call on its output is a
    no-op by construction; with `max_passes=2` a fix that does not resolve its own finding (or
    reports again on its own output) makes pass 2 fix again and raises `RewriteError`."""
    for rule in active_rules(RULES, source):
        once = fix_source(source, [rule], unsafe=True, path=path, max_passes=2)
        assert once.passes <= 2


def test_sample_is_real() -> None:
    assert len(FILES) >= SAMPLE_SIZE // 2
    assert RULES


# ----- generated training scripts --------------------------------------------------------------


@st.composite
def training_scripts(draw: st.DrawFn) -> str:
    """A plausible training script built from the shapes AO201 must handle."""
    # The device is the script's run-time choice (a CPU-only script gets no AO201 at all); the
    # scripts run here on the CPU.
    choice = '"cuda" if torch.cuda.is_available() else "cpu"'
    device = draw(st.sampled_from([f"torch.device({choice})", choice, None]))
    epochs = draw(st.booleans())
    clip = draw(st.booleans())
    accumulate = draw(st.booleans())
    gan = draw(st.booleans())
    helper = draw(st.booleans())
    comment = draw(st.sampled_from(["", "  # keep me", "  # noqa: AO201"]))
    fused = draw(st.booleans())  # forward + backward in one statement
    lines = ["import torch", "from torch import nn", ""]
    if helper:
        lines += ["def compute_loss(model, x):", "    return model(x).pow(2).mean()", ""]
    if device:
        lines.append(f"device = {device}")
    dev = "device" if device else f"({choice})"
    lines.append(f"model = nn.Linear(4, 4).to({dev})")
    lines.append("optimizer = torch.optim.SGD(model.parameters(), lr=0.1)")
    if gan:
        lines.append("critic = nn.Linear(4, 1)")
        lines.append("opt_c = torch.optim.Adam(critic.parameters())")
    lines.append("loader = torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4)")
    ind = ""
    if epochs:
        lines.append("for epoch in range(2):")
        ind = "    "
    lines.append(f"{ind}for i, x in enumerate(loader):{comment}")
    body = ind + "    "
    lines.append(f"{body}x = x.to({dev})")
    lines.append(f"{body}# forward")
    loss_expr = "compute_loss(model, x)" if helper else "model(x).pow(2).mean()"
    if fused:
        lines.append(f"{body}({loss_expr}).backward()")
    else:
        lines.append(f"{body}out = {loss_expr}")
        lines.append(f"{body}loss = out / 2")
        lines.append(f"{body}loss.backward()")
    step_ind = body
    if accumulate:
        lines.append(f"{body}if (i + 1) % 2 == 0:")
        step_ind = body + "    "
    if clip:
        lines.append(f"{step_ind}torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)")
    lines.append(f"{step_ind}optimizer.step()")
    lines.append(f"{step_ind}optimizer.zero_grad()")
    if gan:
        lines.append(f"{body}opt_c.zero_grad()")
        lines.append(f"{body}critic(x).mean().backward()")
        lines.append(f"{body}opt_c.step()")
    return "\n".join(lines) + "\n"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_scripts())
def test_generated_training_scripts(source: str) -> None:
    first = fix_source(source, RULES, unsafe=True, finding_filter=filter_findings)
    assert not first.skipped, first.skipped
    assert not first.rejected, first.rejected
    compile(first.source, "<generated>", "exec")
    assert_one_pass_per_rule(source)
    amp = fix_source(source, [AMP], unsafe=True, finding_filter=filter_findings)
    if "noqa: AO201" in source:
        assert amp.source == source
    elif "opt_c" in source and "if (i + 1)" in source:
        # the critic steps every iteration, the model only under the `if`: still one update
        assert amp.source.count(".update()") == 1
    if amp.changed:
        assert "import torch" in amp.source and "torch.autocast(" in amp.source
        assert amp.source.count("GradScaler(") == 1
        # the comments outside the changed statements survive
        for line in source.splitlines():
            if line.strip().startswith("#") or "# keep me" in line:
                assert line.strip() in amp.source
