"""What fixes assume, checked (`autoopt.lint.rewrite.fixes.preconditions`), at the edges the rule
examples did not reach: AO301 is silent exactly for a model the script differentiates through a
gradient of (compiling it would fail), and fixes every other. Each case kills mutants that survived
`make mutation` (docs/benchmarks/mutation.md)."""

from __future__ import annotations

import textwrap

import pytest
from autoopt.rules.torch_compile_model import TorchCompileModel

from autoopt.lint.engine.analysis import analyze

LOOP = """
import torch
model = Net().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = model(x).sum()
    {backward}
    opt.step()
"""


def _message(backward: str) -> str:
    source = textwrap.dedent(LOOP.format(backward=backward))
    findings = analyze(source, "<string>", [TorchCompileModel]).findings
    if not findings:
        return "silent"
    (finding,) = findings
    return finding.message if finding.fix is None else "fixed"


@pytest.mark.parametrize(
    ("backward", "want"),
    [
        ("loss.backward()", "fixed"),
        ("loss.backward(create_graph=False)", "fixed"),
        ("loss.backward(retain_graph=True)", "fixed"),
        ("loss.backward(None, True)", "fixed"),  # positional retain_graph: no create_graph
        ("loss.backward(create_graph=True)", "silent"),
        # behind a flag (timm's `create_graph=is_second_order`): reported, never fixed
        (
            "loss.backward(create_graph=flag)",
            "model `model` is trained without torch.compile (not fixed: the script may run a"
            " double backward (create_graph=<a flag>), which torch.compile's aot_autograd does"
            " not support)",
        ),
        ("torch.autograd.grad(loss, x, create_graph=True)[0].sum().backward()", "silent"),
    ],
)
def test_compile_is_silent_exactly_for_a_certain_double_backward(backward: str, want: str) -> None:
    assert _message(backward) == want


TRANSFER = """
import torch
from torch.utils.data import DataLoader, default_collate
loader = DataLoader({loader_args})
model = Net().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in {iterated}:
    x = x.cuda()
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
"""


def _non_blocking_safety(loader_args: str, iterated: str = "loader") -> str:
    from autoopt.rules.to_device_non_blocking import ToDeviceNonBlocking

    source = textwrap.dedent(TRANSFER.format(loader_args=loader_args, iterated=iterated))
    findings = analyze(source, "<string>", [ToDeviceNonBlocking]).findings
    (finding,) = [f for f in findings if f.fix is not None]
    return finding.fix_safety.value


@pytest.mark.parametrize(
    ("loader_args", "iterated", "safety"),
    [
        ("data, batch_size=8", "loader", "safe"),
        ("data, batch_size=8, collate_fn=None", "loader", "safe"),
        ("data, batch_size=8, collate_fn=default_collate", "loader", "safe"),
        ("data, 8, False, None, None, 0, None", "loader", "safe"),  # collate_fn=None, 7th
        ("data, 8, False, None, None, 0, my_collate", "loader", "unsafe"),
        ("data, batch_size=8, collate_fn=my_collate", "loader", "unsafe"),
        ("data, **options", "loader", "unsafe"),  # **options may hold a collate_fn
        ("data, batch_size=8", "enumerate(loader)", "safe"),
        ("data, batch_size=8", "tqdm.tqdm(loader)", "safe"),
        ("data, batch_size=8", "sorted(loader)", "unsafe"),  # not a pass-through
        ("data, batch_size=8", "iter()", "unsafe"),
        ("data, batch_size=8", "loaders[0]", "unsafe"),
    ],
)
def test_non_blocking_is_safe_exactly_for_a_default_collate_loader(
    loader_args: str, iterated: str, safety: str
) -> None:
    assert _non_blocking_safety(loader_args, iterated) == safety


PIN = """
import torch
from torch.utils.data import DataLoader
{setup}
loader = DataLoader(data, batch_size=8)
for x in loader:
    x = {move}
{after}
"""

CUDA_DEVICE = 'torch.device("cuda" if torch.cuda.is_available() else "cpu")'


def _pin_value(source: str) -> str:
    """The `pin_memory=` value AO102's fix writes: the script's own test of a CUDA run."""
    from autoopt.rules.dataloader_pin_memory import DataLoaderPinMemory

    findings = analyze(textwrap.dedent(source), "<string>", [DataLoaderPinMemory]).findings
    (finding,) = [f for f in findings if f.fix is not None]
    return finding.fix.description.removeprefix("pin_memory=")


@pytest.mark.parametrize(
    ("setup", "move", "after", "want"),
    [
        (f"device = {CUDA_DEVICE}", "x.to(device)", "", 'device.type == "cuda"'),
        # bound after the loader: not usable there
        ("", "x.to(device)", f"device = {CUDA_DEVICE}", "torch.cuda.is_available()"),
        # bound in another function: not in the loader's scope
        (
            f"def setup():\n    device = {CUDA_DEVICE}\n    return device",
            "x.to(device)",
            "",
            "torch.cuda.is_available()",
        ),
        # another function's binding is skipped, the module's one after it is used
        (
            f"def setup():\n    device = {CUDA_DEVICE}\n    return device\ndevice = {CUDA_DEVICE}",
            "x.to(device)",
            "",
            'device.type == "cuda"',
        ),
        ("", "x.cuda()", "", "True"),  # always CUDA: no runtime test
        ("", "x.cuda()", 'y = x.to("cpu")', "torch.cuda.is_available()"),
        ("", "x.cuda()", "y = x.to('cpu')", "torch.cuda.is_available()"),
    ],
)
def test_pin_memory_uses_the_scripts_own_cuda_test(
    setup: str, move: str, after: str, want: str
) -> None:
    assert _pin_value(PIN.format(setup=setup, move=move, after=after)) == want


def test_pin_memory_uses_a_device_bound_in_the_loaders_function() -> None:
    source = f"""
import torch
from torch.utils.data import DataLoader
def main():
    device = {CUDA_DEVICE}
    loader = DataLoader(data, batch_size=8)
    for x in loader:
        x = x.to(device)
"""
    assert _pin_value(source) == 'device.type == "cuda"'


@pytest.mark.parametrize(
    ("rebind", "iterated", "safety"),
    [
        ("", "loader + extra", "unsafe"),  # neither a name nor a pass-through call
        ("loader = wrap(loader)", "loader", "unsafe"),  # bound to a loader and to something else
    ],
)
def test_non_blocking_is_unsafe_for_a_batch_source_not_proven_a_loader(
    rebind: str, iterated: str, safety: str
) -> None:
    from autoopt.rules.to_device_non_blocking import ToDeviceNonBlocking

    source = textwrap.dedent(TRANSFER.format(loader_args="data, batch_size=8", iterated=iterated))
    source = source.replace("model = Net()", f"{rebind}\nmodel = Net()")
    findings = analyze(source, "<string>", [ToDeviceNonBlocking]).findings
    (finding,) = [f for f in findings if f.fix is not None]
    assert finding.fix_safety.value == safety


TWO_MODELS = """
import torch
model = Net().cuda()
disc = Disc().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = model(x).sum()
    loss.backward()
    opt.step()
    {other}
"""


@pytest.mark.parametrize(
    ("other", "why"),
    [
        (
            "penalty = torch.autograd.grad(disc(x).sum(), x, create_graph=True)[0]",
            "double backward (torch.autograd.grad, e.g. a gradient penalty)",
        ),
        (
            "penalty = torch.autograd.grad(disc(x).sum(), x)[0]",
            "double backward (torch.autograd.grad, e.g. a gradient penalty)",
        ),
        ("disc(x).sum().backward(create_graph=True)", "double backward (create_graph=True)"),
    ],
)
def test_compile_declined_names_the_double_backward_it_saw(other: str, why: str) -> None:
    """Another model's double backward: AO301 declines `model` and says which kind it saw."""
    source = textwrap.dedent(TWO_MODELS.format(other=other))
    (finding,) = analyze(source, "<string>", [TorchCompileModel]).findings
    assert finding.fix is None
    assert f"the script runs a {why}, which" in finding.message


def _outcomes(source: str) -> dict[str, str]:
    """AO301 per model: "declined" (reported, no fix) or "fixed"; a model left out is silent
    (compile cannot train it: a double backward runs through it, or the trace was lost)."""
    import re

    analysis = analyze(textwrap.dedent(source), "<string>", [TorchCompileModel])
    assert analysis.crashes == []
    found = {}
    for finding in analysis.findings:
        (model,) = re.findall(r"model `([^`]+)`", finding.message)
        found[model] = "declined" if finding.fix is None else "fixed"
    return found


GAN = """
import torch
G = Generator().cuda()
D = Discriminator().cuda()
E = Encoder().cuda()
opt_g = torch.optim.Adam(G.parameters())
opt_d = torch.optim.Adam(D.parameters())
opt_e = torch.optim.Adam(E.parameters())
{defs}
for x in loader:
    z = noise()
    {penalty}
    G(z).mean().backward()
    opt_g.step()
    D(x).mean().backward()
    opt_d.step()
    E(x).mean().backward()
    opt_e.step()
"""


def _gan(penalty: str, defs: str = "") -> dict[str, str]:
    return _outcomes(GAN.format(penalty=penalty, defs=textwrap.dedent(defs)))


PENALTY = "torch.autograd.grad({}, x, create_graph=True)"

TWO_OUTPUTS = "out_d = D(x)\n    out_e = E(x)\n    " + PENALTY.format("out_d.sum() + out_e.sum()")


@pytest.mark.parametrize(
    ("penalty", "defs"),
    [
        # two penalties, one per model: both are differentiated twice
        (PENALTY.format("D(x).sum()") + "\n    " + PENALTY.format("E(x).sum()"), ""),
        # one penalty over the outputs of two models, each traced through its own name
        (TWO_OUTPUTS, ""),
        # the penalty's function takes both models: what each parameter is passed
        (
            "gp(D, E, x)",
            """
            def gp(c1, c2, x):
                return torch.autograd.grad(c1(x).sum() + c2(x).sum(), x, create_graph=True)
            """,
        ),
    ],
)
def test_compile_is_silent_for_every_model_a_penalty_runs_through(penalty: str, defs: str) -> None:
    assert _gan(penalty, defs) == {"G": "declined"}


GP = """
def gp(critic, x):
    return torch.autograd.grad(critic(x).sum(), x, create_graph=True)
"""


@pytest.mark.parametrize(
    ("penalty", "defs", "want"),
    [
        # the critic is the penalty function's parameter: D is what its call passes, by name
        ("gp(D, x)", GP, {"G": "declined", "E": "declined"}),
        ("gp(critic=D, x=x)", GP, {"G": "declined", "E": "declined"}),
        # a call that does not pass the critic: any model may be the one, all silent
        ("gp(D, x)\n    gp(x=x)", GP, {}),
        # a torch function imported by name is no module: the trace goes on to D
        (
            "out = D(x)\n    " + PENALTY.format("softplus(out).sum()"),
            "from torch.nn.functional import softplus",
            {"G": "declined", "E": "declined"},
        ),
        # a penalty with no outputs in sight (a wrapper's own call): all silent
        ("closure(create_graph=True)", "", {}),
        # an attribute or keyword is no data name: `.fake`, `dim=` do not reach `fake = G(z)`
        (
            "fake = G(z)\n    out = D(x)\n    " + PENALTY.format("out.fake.sum(dim=1)"),
            "",
            {"G": "declined", "E": "declined"},
        ),
        # ... nor a parameter `dim` of the penalty's function
        (
            "gp2(D, x, 1)",
            """
            def gp2(critic, x, dim):
                out = critic(x)
                return torch.autograd.grad(out.sum(dim=0), x, create_graph=True)
            """,
            {"G": "declined", "E": "declined"},
        ),
        # a name rebound from itself: the trace ends (the module is out of sight), all silent
        ("out = D(x)\n    out = out.mean()\n    " + PENALTY.format("out"), "", {}),
    ],
)
def test_compile_declines_exactly_the_models_outside_the_penalty(
    penalty: str, defs: str, want: dict[str, str]
) -> None:
    assert _gan(penalty, defs) == want


SOLVER = """
import torch
class Solver:
    def build(self):
        self.G = Generator().cuda()
        self.D = Discriminator().cuda()
        self.g_opt = torch.optim.Adam(self.G.parameters())
        self.d_opt = torch.optim.Adam(self.D.parameters())
    {defs}
    def train(self):
        for x in self.loader:
            {penalty}
            self.D(x).mean().backward()
            self.d_opt.step()
            self.G(x).mean().backward()
            self.g_opt.step()
"""


@pytest.mark.parametrize(
    ("penalty", "defs"),
    [
        # the critic held by the solver, called in the penalty itself
        ("torch.autograd.grad(self.D(x).sum(), x, create_graph=True)", ""),
        # ... through a local alias: `D` is the leaf of the model `self.D`
        ("D = self.D\n            torch.autograd.grad(D(x).sum(), x, create_graph=True)", ""),
        # a penalty method: its first parameter after `self` is the critic
        (
            "self.gp(self.D, x)",
            """def gp(self, critic, x):
        return torch.autograd.grad(critic(x).sum(), x, create_graph=True)""",
        ),
        # ... a classmethod, after `cls`
        (
            "self.gp(self.D, x)",
            """@classmethod
    def gp(cls, critic, x):
        return torch.autograd.grad(critic(x).sum(), x, create_graph=True)""",
        ),
        # ... passed through another holder: `self.nets.D` has the leaf `D`
        (
            "self.gp(self.nets.D, x)",
            """def gp(self, critic, x):
        return torch.autograd.grad(critic(x).sum(), x, create_graph=True)""",
        ),
    ],
)
def test_compile_is_silent_for_a_solvers_critic_trained_through_a_penalty(
    penalty: str, defs: str
) -> None:
    assert _outcomes(SOLVER.format(penalty=penalty, defs=defs)) == {"self.G": "declined"}


def test_compile_is_never_inserted_inside_the_training_loop() -> None:
    """DirectVoxGO (the rule's example): a new optimizer for the scaled-up grids inside the
    training loop (after `model.act_shift -= ...`, which updates an attribute and rebinds
    nothing) is no place for `model.compile()`: the one fix goes where the model is built (the
    example's own check compares the fixed text of its reported line only)."""
    (example,) = [e for e in TorchCompileModel.INVALID if "scale_volume_grid" in e.code]
    source = textwrap.dedent(example.code)
    findings = analyze(source, "<string>", [TorchCompileModel]).findings
    assert [f.line for f in findings] == [example.line]
