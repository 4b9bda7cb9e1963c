"""What the trials decided for a model on this machine, kept across runs: a trial is paid once.

One small file per model structure and set of choices (`<key>.trials.json` in the compile
cache directory, beside the compile outcomes; the key is the compile cache's: the model's
modules and parameter shapes, torch, the hardware), holding each measured choice's winner and
its line. A later run takes those winners from its first training step, without timing, and
says so; a choice not in the record (or one whose options changed) is measured as usual. A
record that cannot be read is no record; one that cannot be written is no error."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import torch


class TrialRecord:
    """The trials' winners for one model, in `directory/<name>.trials.json`."""

    def __init__(self, directory: Path, name: str) -> None:
        self.path = directory / f"{name}.trials.json"

    def read(self) -> dict[str, tuple[str, str]]:
        """{choice: (winner, the line it was measured with)}; {} when there is none."""
        try:
            found = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(found, dict) or found.get("torch") != torch.__version__:
            return {}
        choices = found.get("choices")
        if not isinstance(choices, dict):
            return {}
        return {
            name: (str(entry["winner"]), str(entry.get("measured", "")))
            for name, entry in choices.items()
            if isinstance(entry, dict) and "winner" in entry
        }

    def write(self, decided: dict[str, tuple[str, str]]) -> None:
        """Keep {choice: (winner, line)} (atomically), beside what is recorded already."""
        if not decided:
            return
        choices = {n: {"winner": w, "measured": m} for n, (w, m) in self.read().items()}
        choices.update({n: {"winner": w, "measured": m} for n, (w, m) in decided.items()})
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                json.dump({"torch": torch.__version__, "choices": choices}, out)
            os.replace(tmp, self.path)
