"""A compile cache that survives restarts: torch's portable compile artifacts, saved after a
model's first compiled steps and loaded before its next run's first compile.

Torch already keeps local caches (inductor's FX graph cache and the AOTAutograd cache, under
`TORCHINDUCTOR_CACHE_DIR`, by default in /tmp): on the same machine they survive a restart until
the temp directory is cleaned or the cache directory differs (containers, CI, a new node). The
artifacts of `torch.compiler.save_cache_artifacts()` are the same entries as one portable blob;
`load_cache_artifacts()` puts them back into those caches, so the next compile hits them instead
of generating and building code again (dynamo's tracing still runs).

On CPU the artifacts carry the generated code but not the C++ kernels built from it (on CUDA
the Triton kernels are in them), so a fresh inductor directory still runs g++ for every kernel,
most of a CPU compile (a warm CNN start took 0.49 of the cold one's CPU time that way). So the
entry holds both: torch's artifacts and the kernel libraries (`<xx>/<hash>.so` under torch's
local cache directory) that the model's first compile built or that the entry restored, and
`load()` puts the libraries back where inductor looks for them before it builds one (their
names are hashes of their source and compiler flags, so one that is present is the one it would
build). And, unless the user set `TORCHINDUCTOR_CACHE_DIR`, torch's local caches are kept in the
autoopt cache directory too (`keep_local_caches`), where /tmp cleaning does not reach them.

Here one blob per model: the file is named by a key of the model's structure (module classes,
parameter and buffer names, shapes, dtypes), the first batch's signature (tensor shapes and
dtypes, other arguments' types), the torch version and the hardware (CPU model and ISA flags, or
the CUDA device name and capability). A file that cannot be loaded (stale, truncated, another
torch) is a miss with a warning: the model compiles as without a cache, and the file is written
anew. Nothing here raises into the user's training.

Inductor's per-process check that each vector ISA's test library loads (a child Python per
ISA) is remembered there too (`remember_isa_probes`): most of what a warm start spent beyond
torch's own imports and dynamo's tracing.

Beside the blobs, one small record per model structure (`Outcome`, `<key>.outcome.json`): whether
its compiled training steps measured faster than eager ones on this machine, which is what
`compile="auto"` decides from on CPU (autoopt.runtime.passes.compile). And one record of what
compiles cost on this machine (`CompileCosts`, `compile_costs.json`): each model's first compiled
step, cold or warm, with its size, from which the cost of a compile not yet paid is estimated
before it is paid (a trial that cannot pay back within the run is not tried).

Where: `optimize(compile_cache=...)`: "auto" (the default) is $AUTOOPT_COMPILE_CACHE, else
$XDG_CACHE_HOME/autoopt/compile, else ~/.cache/autoopt/compile; a directory; False: off.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import platform
import re
import statistics
import tempfile
import time
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autoopt.runtime.loading.batch import tensors_in

ENV = "AUTOOPT_COMPILE_CACHE"


def cache_dir(option: str | os.PathLike[str] | bool) -> Path | None:
    """The directory the `compile_cache` option names; None when off."""
    if option is False:
        return None
    if isinstance(option, str) and option == "auto" or option is True:
        env = os.environ.get(ENV)
        if env:
            return None if env.lower() in ("0", "false", "off") else Path(env)
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
        return Path(base) / "autoopt" / "compile"
    return Path(option)


INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"


def keep_local_caches(directory: Path) -> Path | None:
    """Point torch's local caches (FX graph, AOTAutograd, built C++ kernels) at
    `directory/inductor` instead of torch's /tmp default, unless another directory was chosen;
    the directory used, or None. Torch itself sets the variable to its default the first time it
    looks (importing parts of torch may do it), so the default counts as not chosen."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get(INDUCTOR_ENV)
    if current and os.path.abspath(current) != default_cache_dir():
        return None
    path = directory / "inductor"
    os.environ[INDUCTOR_ENV] = str(path)
    return path


ISA_PROBES = "isa_probes.json"


def remember_isa_probes(directory: Path) -> None:
    """At each process's first CPU compile inductor checks, per vector ISA the CPU claims, that a
    test library built for it loads, in a child Python that loads libtorch: ~0.3 s of CPU each,
    a fifth of a warm start's CPU time on the project's machine. Whether one built file loads
    with one torch on one machine does not change, so a load that succeeded is remembered in
    `directory` (per torch version and hardware) and not spawned again while the file exists.
    A failed load is not remembered; a torch without this probe is left as it is."""
    try:
        from torch._inductor.cpu_vec_isa import VecISA
    except ImportError:
        return
    probe = getattr(VecISA, "_probe_load", None)
    if probe is None or getattr(probe, "remembered_in", None) == directory:
        return
    probe = getattr(probe, "probe", probe)  # another directory's memo: wrap torch's own
    record = directory / ISA_PROBES
    stamp = f"{torch.__version__} {hardware()}"

    def loaded() -> dict[str, list[str]]:
        try:
            found = json.loads(record.read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def remembered(self: Any, output_path: str) -> bool:
        known = loaded()
        if output_path in known.get(stamp, []) and os.path.isfile(output_path):
            return True
        ok = bool(probe(self, output_path))
        if ok:
            known[stamp] = sorted({*known.get(stamp, []), output_path})
            with contextlib.suppress(OSError):
                directory.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
                with os.fdopen(fd, "w") as out:
                    json.dump(known, out)
                os.replace(tmp, record)
        return ok

    remembered.remembered_in = directory  # type: ignore[attr-defined]
    remembered.probe = probe  # type: ignore[attr-defined]
    VecISA._probe_load = remembered


def hardware() -> str:
    """What the compiled code depends on: the CUDA device, else the CPU model and its flags."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        return f"cuda {name} {torch.cuda.get_device_capability()}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            lines = info.read().splitlines()
        model = next((ln for ln in lines if ln.startswith("model name")), "")
        flags = next((ln for ln in lines if ln.startswith("flags")), "")
        cpu = f"{model} {hashlib.sha256(flags.encode()).hexdigest()[:12]}"
    except OSError:
        pass
    return f"cpu {cpu} {torch.backends.cpu.get_cpu_capability()}"


def key(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], extra: str = "") -> str:
    """A name for the compiled code of `model` called with these arguments on this machine."""
    parts = [torch.__version__, hardware(), extra, str(model.training)]
    parts += [
        f"{name}:{type(m).__module__}.{type(m).__qualname__}" for name, m in model.named_modules()
    ]
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        parts.append(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}:{tensor.requires_grad}")
    for tensor in tensors_in((args, kwargs)):
        parts.append(f"in:{tuple(tensor.shape)}:{tensor.dtype}:{tensor.device.type}")
    parts += [f"kw:{k}" for k in sorted(kwargs)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


class CompileCache:
    """One model's entry: `load()` before its first compile, `save()` after its first compiled
    steps. `status` is "hit", "miss" or "miss (why)"; `kernels` how many built kernel libraries
    the entry restored (`load`) or holds (`save`).

    The file is a zip of torch's artifacts (`ARTIFACTS`) and the kernel libraries (`KERNELS/`
    + their path under torch's local cache directory); a file of torch's artifacts alone (written
    before the libraries were kept) is read too."""

    ARTIFACTS = "artifacts.bin"
    KERNELS = "kernels/"

    def __init__(self, directory: Path, name: str) -> None:
        self.path = directory / f"{name}.bin"
        self.status = "not used"
        self.saved = False
        self.kernels = 0
        self._restored: set[str] = set()  # kernel paths (relative) this entry put back
        self._since = time.time()  # kernels built after this belong to the model's compile

    def load(self) -> str:
        """Put the saved artifacts into torch's caches and the kernel libraries into its local
        cache directory; returns (and keeps) the status."""
        self._since = time.time()
        try:
            blob = self.path.read_bytes()
        except FileNotFoundError:
            self.status = "miss"
            return self.status
        except OSError as err:
            return self._miss(f"cannot read {self.path}: {err}")
        try:
            artifacts, kernels = _unpack(blob)
        except (zipfile.BadZipFile, KeyError, OSError) as err:
            return self._miss(f"cannot read {self.path} ({type(err).__name__}: {err})")
        try:
            with _torch_quiet():
                loaded = torch.compiler.load_cache_artifacts(artifacts)
        except Exception as err:  # noqa: BLE001 - a stale or corrupt file: compile as without
            return self._miss(f"cannot load {self.path} ({type(err).__name__}: {err})")
        if loaded is None:  # torch logs and returns None for what it cannot un-pickle
            return self._miss(f"cannot load {self.path} (not torch's cache artifacts)")
        self._restored = _restore_kernels(kernels)
        self.kernels = len(self._restored)
        self.status = "hit"
        return self.status

    def save(self) -> bool:
        """Write torch's artifacts of what compiled in this process so far and the model's
        kernel libraries (atomically)."""
        if self.saved:
            return False
        self.saved = True
        try:
            found = torch.compiler.save_cache_artifacts()
            if found is None:
                return False
            kernels = self._kernels()
            blob = _pack(found[0], kernels)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as out:
                out.write(blob)
            os.replace(tmp, self.path)
        except Exception as err:  # noqa: BLE001 - a cache that cannot be written is no error
            warnings.warn(f"autoopt: compile cache not saved to {self.path}: {err}", stacklevel=3)
            return False
        self.kernels = len(kernels)
        return True

    def _kernels(self) -> dict[str, Path]:
        """The kernel libraries of this model: those restored, and those built since `load()`
        (by relative path under torch's local cache directory)."""
        root = local_cache_dir()
        found = {rel: root / rel for rel in self._restored if (root / rel).is_file()}
        for lib in root.glob("*/*.so"):
            rel = lib.relative_to(root).as_posix()
            if _KERNEL_PATH.fullmatch(rel) and lib.stat().st_mtime >= self._since - 1:
                found[rel] = lib
        return found

    def _miss(self, why: str) -> str:
        warnings.warn(f"autoopt: compile cache: {why}; compiling anew", stacklevel=4)
        self.status = f"miss ({why})"
        return self.status


# Where inductor keeps a built kernel library: `<two characters>/<hash>[.main].so`.
_KERNEL_PATH = re.compile(r"[A-Za-z0-9_]{1,8}/[A-Za-z0-9_]+(\.main)?\.so")


def local_cache_dir() -> Path:
    """Torch's local cache directory (`TORCHINDUCTOR_CACHE_DIR`, else its /tmp default)."""
    from torch._inductor.runtime.runtime_utils import cache_dir as inductor_cache_dir

    return Path(inductor_cache_dir())


def _pack(artifacts: bytes, kernels: dict[str, Path]) -> bytes:
    """One entry: torch's artifacts and the kernel libraries, as a zip."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.writestr(CompileCache.ARTIFACTS, artifacts)
        for rel, path in sorted(kernels.items()):
            z.write(path, CompileCache.KERNELS + rel)
    return buffer.getvalue()


def _unpack(blob: bytes) -> tuple[bytes, dict[str, bytes]]:
    """(torch's artifacts, {relative path: kernel library}) of an entry; an entry of torch's
    artifacts alone (not a zip) has no kernels."""
    if not blob.startswith(b"PK"):
        return blob, {}
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        kernels = {
            name[len(CompileCache.KERNELS) :]: z.read(name)
            for name in z.namelist()
            if name.startswith(CompileCache.KERNELS)
        }
        return z.read(CompileCache.ARTIFACTS), kernels


def _restore_kernels(kernels: dict[str, bytes]) -> set[str]:
    """Write the kernel libraries missing from torch's local cache directory (atomically: a
    library inductor finds is whole); the relative paths present afterwards. A name that is not
    a kernel's path (`_KERNEL_PATH`) is skipped: the entry never writes elsewhere."""
    root = local_cache_dir()
    present: set[str] = set()
    for rel, data in kernels.items():
        if not _KERNEL_PATH.fullmatch(rel):
            continue
        target = root / rel
        if not target.is_file():
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                os.replace(tmp, target)
            except OSError:
                continue  # inductor builds this one itself
        present.add(rel)
    return present


# The rule an outcome was decided by: 2 = side-by-side rounds with a noise band
# (trials.timing). A record of another rule (the first took one timed step a side) is weighed
# again, not followed: it could keep a compile the noise band would not.
OUTCOME_RULE = 2


class Outcome:
    """Whether one model's compiled training steps were faster than its eager ones here: the
    record `compile="auto"` decides from on CPU, so a model whose compiled steps lost is not
    compiled (and its cold compile not paid) again. A record that cannot be read, or that an
    older decision rule made, is no record."""

    def __init__(self, directory: Path, name: str) -> None:
        self.path = directory / f"{name}.outcome.json"

    def read(self) -> dict[str, str] | None:
        """The record ({"winner": "compiled" | "eager", "measured": what was timed}), or None."""
        try:
            found = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(found, dict) or found.get("winner") not in ("compiled", "eager"):
            return None
        if found.get("rule") != OUTCOME_RULE:
            return None
        return {"winner": found["winner"], "measured": str(found.get("measured", "?"))}

    def write(self, winner: str, measured: str) -> None:
        """Record the outcome (atomically); a record that cannot be written is no error."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                record = {"winner": winner, "measured": measured, "torch": torch.__version__}
                json.dump({**record, "rule": OUTCOME_RULE}, out)
            os.replace(tmp, self.path)
        except OSError as err:
            warnings.warn(f"autoopt: compile outcome not saved to {self.path}: {err}", stacklevel=3)


def model_size(model: nn.Module) -> int:
    """What a compile's cost grows with: the model's leaf modules (its graph's size, roughly)."""
    return sum(1 for m in model.modules() if next(m.children(), None) is None)


# A cold CPU compile with no record on this machine: BASE + PER_MODULE per leaf module. From
# this project's 2-core machine (docs/benchmarks/compile.md): a 10-module CNN 17-44 s, a
# 21-module transformer 30-90 s of wall time, by load.
DEFAULT_BASE_S = 8.0
DEFAULT_PER_MODULE_S = 2.0
# A warm compile (this model's entry found) against its cold one, with no warm record yet.
WARM_SHARE = 0.25


class CompileCosts:
    """What compiles cost on this machine (`compile_costs.json` in the cache directory): per
    model (the `Outcome` name), its size and the wall seconds of its first compiled step, cold
    and warm, and its entry's file. Estimates a compile before it is paid (`estimate`)."""

    FILE = "compile_costs.json"

    def __init__(self, directory: Path) -> None:
        self.path = directory / self.FILE

    def read(self) -> dict[str, dict[str, Any]]:
        try:
            found = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def write(self, name: str, size: int, seconds: float, warm: bool, entry: Path) -> None:
        """Record a first compiled step (atomically; a record that cannot be written is none)."""
        records = self.read()
        record = records.get(name) if isinstance(records.get(name), dict) else {}
        record.update({"size": size, "warm_s" if warm else "cold_s": round(seconds, 3)})
        record["entry"] = str(entry)
        records[name] = record
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                json.dump(records, out)
            os.replace(tmp, self.path)

    def estimate(self, name: str, size: int) -> tuple[float, str]:
        """(seconds, what and how it was estimated) of compiling model `name` of `size` leaf
        modules now: its own record (warm when its entry exists), else the seconds per module
        of the cold compiles recorded here, else the defaults."""
        records = self.read()
        own = records.get(name) if isinstance(records.get(name), dict) else None
        if own is not None and own.get("entry") and Path(own["entry"]).is_file():
            if own.get("warm_s") is not None:
                return float(own["warm_s"]), "a warm compile (this model's last one here)"
            if own.get("cold_s") is not None:
                seconds = float(own["cold_s"]) * WARM_SHARE
                return seconds, f"a warm compile ({WARM_SHARE:.0%} of this model's cold one)"
        if own is not None and own.get("cold_s") is not None:
            return float(own["cold_s"]), "a cold compile (this model's last one here)"
        per_module = [
            float(r["cold_s"]) / int(r["size"])
            for r in records.values()
            if isinstance(r, dict) and r.get("cold_s") is not None and r.get("size")
        ]
        if per_module:
            rate = statistics.median(per_module)
            return rate * size, (
                f"a cold compile ({len(per_module)} recorded here: {rate:.2g} s per module x "
                f"{size} modules)"
            )
        seconds = DEFAULT_BASE_S + DEFAULT_PER_MODULE_S * size
        return seconds, f"a cold compile ({size} modules, no compile recorded here)"


@contextlib.contextmanager
def _torch_quiet() -> Iterator[None]:
    """Torch logs a traceback at WARNING for artifacts it cannot read; ours is the one line."""
    logger = logging.getLogger("torch.compiler._cache")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def clock() -> float:
    """The clock the first step's cost is read with."""
    return time.perf_counter()
