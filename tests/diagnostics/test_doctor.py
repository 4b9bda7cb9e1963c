"""autoopt doctor: every field present, and each one agrees with what torch itself says."""

from __future__ import annotations

import json
import os

import pytest
import torch
from click.testing import CliRunner

import autoopt
from autoopt.cli import main
from autoopt.diagnostics import doctor
from autoopt.runtime import hardware
from autoopt.runtime.memory import format_bytes


def _torch_says_native_bf16() -> bool:
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, p, lambda: False)() for p in probes)


@pytest.fixture(scope="module")
def info() -> dict:
    return doctor.collect()


def test_versions_and_devices_match_torch(info):
    t = info["torch"]
    assert t["version"] == torch.__version__
    assert t["cuda"] == torch.version.cuda
    assert t["cuda_available"] == torch.cuda.is_available()
    assert t["device_count"] == torch.cuda.device_count()
    assert len(info["cuda_devices"]) == (
        torch.cuda.device_count() if torch.cuda.is_available() else 0
    )
    for d in info["cuda_devices"]:
        assert d["name"] == torch.cuda.get_device_name(d["index"])
        # torch's own answer, not the helper doctor calls (both answers faked: test_hardware_probes)
        assert d["bf16"] == (torch.cuda.get_device_capability(d["index"])[0] >= 8)


def test_cpu_facts_match_the_hardware_helpers(info):
    cpu = info["cpu"]
    assert cpu["features"] == hardware.cpu_features()
    assert cpu["native_bf16"] == _torch_says_native_bf16()
    assert cpu["torch_threads"] == torch.get_num_threads()
    assert cpu["interop_threads"] == torch.get_num_interop_threads()
    assert cpu["model"]


def test_plan_is_optimize_own_report(info):
    passes = {p["pass"]: p for p in info["plan"]["passes"]}
    assert {"device", "amp", "compile", "channels_last"} <= set(passes)
    assert all(
        p["status"] in ("applied", "skipped", "failed") and p["detail"] for p in passes.values()
    )
    # The amp decision follows the CPU as torch's probes see it (both answers faked in
    # tests/runtime/test_hardware_probes.py).
    if not torch.cuda.is_available():
        assert (passes["amp"]["status"] == "applied") == _torch_says_native_bf16()


def test_environment_is_reported(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    env = doctor.collect()["env"]
    assert env["OMP_NUM_THREADS"] == "3"
    assert env["WORLD_SIZE"] is None
    assert "CUDA_VISIBLE_DEVICES" in env


def test_every_environment_variable_autoopt_reads_is_reported():
    """doctor lists each `AUTOOPT_*` variable autoopt reads (found where it is defined, as
    `NAME = "AUTOOPT_..."`), not the one or two someone remembered."""
    import re
    from pathlib import Path

    package = Path(autoopt.__file__).parent
    defined = {
        name
        for path in package.rglob("*.py")
        for name in re.findall(r'^\w+ = "(AUTOOPT_[A-Z_]+)"', path.read_text(), re.M)
    }
    assert {"AUTOOPT_DISABLE", "AUTOOPT_OPTIONS", "AUTOOPT_COMPILE_CACHE"} <= defined
    assert defined <= set(doctor.ENV_VARS), defined - set(doctor.ENV_VARS)


def test_cli_text_and_json():
    runner = CliRunner()
    text = runner.invoke(main, ["doctor"])
    assert text.exit_code == 0, text.output
    assert torch.__version__ in text.output
    assert "what optimize() would do here" in text.output
    assert "OMP_NUM_THREADS" in text.output
    as_json = runner.invoke(main, ["doctor", "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    assert {"torch", "cpu", "cuda_devices", "nvidia_smi", "env", "plan"} <= set(data)
    assert data["torch"]["version"] == torch.__version__


def test_model_summary(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(
        "from torch import nn\n"
        "def build():\n"
        "    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(main, ["doctor", "--json", "--model", "my_models:build"])
    assert result.exit_code == 0, result.output
    model = json.loads(result.output)["model"]
    assert model["params"] == 4 * 3 + 3 + 3 * 2 + 2
    assert [c["params"] for c in model["children"]] == [15, 0, 8]
    assert json.loads(result.output)["plan"]["subject"] == "your model"


def test_a_lazy_model_is_summarized_and_planned(tmp_path, monkeypatch):
    (tmp_path / "lazy_models.py").write_text(
        "from torch import nn\n"
        "def build():\n"
        "    return nn.Sequential(nn.LazyConv2d(4, 3), nn.Flatten(), nn.Linear(4, 2))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(main, ["doctor", "--json", "--model", "lazy_models:build"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["model"]["params"] == 4 * 2 + 2 and info["model"]["lazy"] == 2
    plan = {p["pass"]: p for p in info["plan"]["passes"]}
    assert "error" not in info["plan"]
    assert "lazy parameters" in plan["channels_last"]["detail"]


def test_bad_model_spec_is_a_clear_error():
    result = CliRunner().invoke(main, ["doctor", "--model", "no_colon_here"])
    assert result.exit_code != 0
    assert "module:attr" in result.output


def test_doctor_lists_graph_breaks_with_file_and_line(tmp_path, monkeypatch):
    (tmp_path / "breaking.py").write_text(
        "import torch\n"
        "from torch import nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.lin = nn.Linear(4, 2)\n"
        "    def forward(self, x):\n"
        "        if self.lin(x).sum().item() > 0:\n"  # line 8: .item() breaks the graph
        "            return self.lin(x) * 2\n"
        "        return self.lin(x)\n"
        "def example():\n"
        "    return torch.randn(3, 4)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["doctor", "--model", "breaking:Net", "--input", "breaking:example"]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    events = json.loads(result.output)["compile"]["events"]
    breaks = [e for e in events if e["kind"] == "graph break"]
    assert [(os.path.basename(e["file"]), e["line"]) for e in breaks] == [("breaking.py", 8)]
    text = CliRunner().invoke(main, args).output
    assert "graph break at breaking.py:8: " in text and "item()" in text


def test_doctor_says_how_to_see_graph_breaks_without_an_input(tmp_path, monkeypatch):
    (tmp_path / "plain.py").write_text(
        "from torch import nn\ndef build():\n    return nn.Linear(4, 2)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(main, ["doctor", "--model", "plain:build"])
    assert result.exit_code == 0, result.output
    assert "pass --input MODULE:ATTR" in result.output


_GPT_MODULE = (
    "import torch\n"
    "from torch import nn\n"
    "class Block(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.norm = nn.LayerNorm(16)\n"
    "        self.mlp = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))\n"
    "    def forward(self, x):\n"
    "        return x + self.mlp(self.norm(x))\n"
    "class Net(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        torch.manual_seed(0)\n"
    "        self.blocks = nn.ModuleList(Block() for _ in range(4))\n"
    "        self.head = nn.Linear(16, 1)\n"
    "    def forward(self, x):\n"
    "        for block in self.blocks:\n"
    "            x = block(x)\n"
    "        return self.head(x)\n"
    "def example():\n"
    "    return torch.randn(8, 32, 16, generator=torch.Generator().manual_seed(0))\n"
)


def test_doctor_shows_the_memory_plan_under_a_budget(tmp_path, monkeypatch):
    from autoopt.runtime.checkpointing import checkpoint_plan

    # What the modes cost a step is timed on each run; fixed here, both plans are the same.
    monkeypatch.setattr(checkpoint_plan, "mode_seconds", lambda *args: (0.001, 0.003))
    (tmp_path / "blocks.py").write_text(_GPT_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from blocks import Net, example

    model, x = Net(), example()
    size = sum(p.numel() * 4 for p in model.parameters())
    # A budget that leaves activations room for about half of what eager saves.
    explained = autoopt.explain_memory(model, x, memory_budget=None)
    eager = explained.memory.before.activations
    budget = 4 * size + eager // 2
    args = ["doctor", "--model", "blocks:Net", "--input", "blocks:example"]
    result = CliRunner().invoke(main, [*args, "--memory-budget", str(budget), "--json"])
    assert result.exit_code == 0, result.output
    memory = json.loads(result.output)["memory"]
    assert memory["budget"] == budget and memory["optimizer"] == "AdamW (assumed)"
    assert (
        memory["before"]["parameters"] == size and memory["before"]["optimizer_state"] == 2 * size
    )
    assert memory["before"]["activations"] == eager
    assert memory["after"]["total"] <= budget < memory["before"]["total"]
    blocks = memory["blocks"]
    assert [b["name"] for b in blocks] == [f"blocks.{i}" for i in range(4)]
    # A full checkpoint keeps the block's input; the first one's is the data, counted outside.
    assert [b["full"] for b in blocks] == [0] + [x.numel() * 4] * 3
    assert any(b["mode"] != "plain" for b in blocks) and any(b["mode"] == "plain" for b in blocks)
    # The same plan as explain_memory, and as the text prints it.
    assert memory == {
        **autoopt.explain_memory(model, x, memory_budget=budget).to_dict(),
        "text": memory["text"],
    }
    # optimize()'s own plan in the same run is made for the same budget.
    passes = {p["pass"]: p for p in json.loads(result.output)["plan"]["passes"]}
    assert f"to fit {format_bytes(budget)}" in passes["checkpoint"]["detail"]
    text = CliRunner().invoke(main, [*args, "--memory-budget", str(budget)]).output
    assert "memory plan of one training step" in text
    assert f"memory per rank (budget {format_bytes(budget)})" in text
    assert all(f"  {line}" in text for line in memory["text"])


def test_doctor_memory_plan_needs_an_input_and_a_valid_budget(tmp_path, monkeypatch):
    (tmp_path / "blocks.py").write_text(_GPT_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(main, ["doctor", "--model", "blocks:Net"])
    assert result.exit_code == 0, result.output
    assert "to see the memory plan" in result.output
    bad = CliRunner().invoke(
        main, ["doctor", "--model", "blocks:Net", "--memory-budget", "2 parsecs"]
    )
    assert bad.exit_code != 0 and "'2GiB'" in bad.output
