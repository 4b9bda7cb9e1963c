"""The compile cache across restarts: keyed, loaded and saved, and never an error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import autoopt
from autoopt.runtime.compiling import cache as compile_cache
from autoopt.runtime.compiling.cache import CompileCache

from .models import MLP


def test_the_directory_comes_from_the_option_then_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "env"))
    assert compile_cache.cache_dir("auto") == tmp_path / "env"
    assert compile_cache.cache_dir(str(tmp_path / "mine")) == tmp_path / "mine"
    assert compile_cache.cache_dir(False) is None
    monkeypatch.setenv(compile_cache.ENV, "0")
    assert compile_cache.cache_dir("auto") is None
    monkeypatch.delenv(compile_cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.cache_dir("auto") == tmp_path / "autoopt" / "compile"
    with pytest.raises(ValueError, match="compile_cache"):
        autoopt.optimize(MLP(), compile_cache=3, verbose=False)


def test_the_key_follows_structure_inputs_and_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    model = MLP()
    x = torch.randn(4, 16)
    base = compile_cache.key(model, (x,), {})
    assert compile_cache.key(MLP(), (torch.randn(4, 16),), {}) == base  # values do not count
    assert compile_cache.key(model, (torch.randn(5, 16),), {}) != base
    assert compile_cache.key(model, (x.double(),), {}) != base
    assert compile_cache.key(MLP(hidden=8), (x,), {}) != base
    assert compile_cache.key(model.eval(), (x,), {}) != base
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert compile_cache.key(model.train(), (x,), {}) != base


def test_a_corrupt_entry_is_a_miss_with_a_warning(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path, "k")
    assert cache.load() == "miss"
    cache.path.write_bytes(b"not torch's artifacts")
    with pytest.warns(UserWarning, match="compiling anew"):
        assert CompileCache(tmp_path, "k").load().startswith("miss (cannot load")


def test_an_entry_carries_the_kernels_the_models_compile_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On CPU torch's artifacts hold no built C++ kernels: a process with an empty inductor
    directory rebuilt them all (g++), 0.49 of the cold start. The entry carries the libraries
    built while the model compiled, and puts them back where inductor looks first."""
    import time
    import zipfile

    first, second = tmp_path / "inductor-1", tmp_path / "inductor-2"
    monkeypatch.setenv(compile_cache.INDUCTOR_ENV, str(first))
    older = first / "zz" / "czzold.so"  # another model's, built before this one compiled
    older.parent.mkdir(parents=True)
    older.write_bytes(b"old")
    past = time.time() - 60
    os.utime(older, (past, past))
    cache = CompileCache(tmp_path / "cache", "k")
    assert cache.load() == "miss"
    built = first / "ab" / "cabc.main.so"  # built by this model's compile
    built.parent.mkdir()
    built.write_bytes(b"kernel")
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"ART", None))
    assert cache.save() and cache.kernels == 1
    loaded: list[bytes] = []
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda b: loaded.append(b) or 1)
    monkeypatch.setenv(compile_cache.INDUCTOR_ENV, str(second))  # a fresh node
    warm = CompileCache(tmp_path / "cache", "k")
    assert warm.load() == "hit" and loaded == [b"ART"] and warm.kernels == 1
    assert (second / "ab" / "cabc.main.so").read_bytes() == b"kernel"
    assert not (second / "zz").exists()
    # Saved again from the warm process, the restored kernel stays in the entry.
    assert warm.save() and warm.kernels == 1
    # An entry of torch's artifacts alone (written before kernels were kept) still loads, and
    # a name that is not a kernel's path is never written.
    warm.path.write_bytes(b"ART-only")
    assert CompileCache(tmp_path / "cache", "k").load() == "hit" and loaded[-1] == b"ART-only"
    with zipfile.ZipFile(warm.path, "w") as z:
        z.writestr(CompileCache.ARTIFACTS, b"ART")
        z.writestr(CompileCache.KERNELS + "../../evil.so", b"x")
    assert CompileCache(tmp_path / "cache", "k").load() == "hit"
    assert not (tmp_path / "evil.so").exists() and not list(second.parent.glob("**/evil.so"))


CHILD = """
import json, torch, autoopt
from torch import nn
from torch._dynamo.utils import counters
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = autoopt.optimize(model, optimizer=opt, compile=True, amp=False, verbose=False,
                              compile_cache=%r)
for _ in range(2):
    loss = model(torch.randn(4, 8)).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
print(json.dumps({"detail": autoopt.report(model)["compile"].detail,
                  "fx hits": counters["inductor"]["fxgraph_cache_hit"]}))
"""


@pytest.mark.slow
def test_a_second_process_loads_what_the_first_saved(tmp_path: Path) -> None:
    """Two fresh processes, each with its own empty inductor cache (another node, a cleaned
    /tmp): the second compiles from the first one's artifacts."""
    runs = []
    for run in ("cold", "warm"):
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / f"inductor-{run}"))
        env.pop("AUTOOPT_COMPILE_CACHE", None)
        code = CHILD % str(tmp_path / "cache")
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert "compile cache miss, saved to" in cold["detail"] and cold["fx hits"] == 0
    assert "compile cache hit" in warm["detail"] and warm["fx hits"] > 0
    assert list((tmp_path / "cache").glob("*.bin"))


def test_torchs_local_caches_are_kept_only_where_nobody_chose(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(compile_cache.INDUCTOR_ENV, str(tmp_path / "users"))
    assert compile_cache.keep_local_caches(tmp_path) is None
    assert os.environ[compile_cache.INDUCTOR_ENV] == str(tmp_path / "users")
    monkeypatch.delenv(compile_cache.INDUCTOR_ENV)
    assert compile_cache.keep_local_caches(tmp_path) == tmp_path / "inductor"
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv(compile_cache.INDUCTOR_ENV, default_cache_dir())  # torch set it itself
    assert compile_cache.keep_local_caches(tmp_path) == tmp_path / "inductor"
    assert os.environ[compile_cache.INDUCTOR_ENV] == str(tmp_path / "inductor")


def test_a_vector_isa_load_that_succeeded_is_not_probed_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Inductor's per-process ISA check (a child Python loading a built library) is remembered
    per library file, torch and machine; a failure or a missing file is probed again."""
    from torch._inductor.cpu_vec_isa import VecISA

    spawned: list[str] = []
    answers = {"good.so": True, "bad.so": False}

    def probe(self: object, output_path: str) -> bool:
        spawned.append(Path(output_path).name)
        return answers[Path(output_path).name]

    monkeypatch.setattr(VecISA, "_probe_load", probe)
    good, bad = tmp_path / "good.so", tmp_path / "bad.so"
    good.write_bytes(b"")
    bad.write_bytes(b"")
    compile_cache.remember_isa_probes(tmp_path)
    isa = object()
    assert VecISA._probe_load(isa, str(good)) and not VecISA._probe_load(isa, str(bad))
    assert spawned == ["good.so", "bad.so"]
    # The next process: torch's own probe again, remembered from the same directory.
    monkeypatch.setattr(VecISA, "_probe_load", probe)
    compile_cache.remember_isa_probes(tmp_path)
    assert VecISA._probe_load(isa, str(good)) and not VecISA._probe_load(isa, str(bad))
    assert spawned == ["good.so", "bad.so", "bad.so"]  # the success was not spawned again
    good.unlink()  # the library is gone (a cleaned cache): probed again
    answers["good.so"] = False
    assert not VecISA._probe_load(isa, str(good))
    monkeypatch.setattr(torch, "__version__", "9.9.9")  # another torch: its own record
    good.write_bytes(b"")
    answers["good.so"] = True
    monkeypatch.setattr(VecISA, "_probe_load", probe)
    compile_cache.remember_isa_probes(tmp_path)
    spawned.clear()
    assert VecISA._probe_load(isa, str(good)) and spawned == ["good.so"]
