"""Recompiles of a compiled model fed batches of changing size, with and without autoopt's
reaction to them (autoopt.runtime.passes.compile.REACT_TO_SHAPES).

    .venv/bin/python -m benchmarks.compile_shapes [--backend aot_eager]

For each batch-size sequence and each of torch's defaults (dynamic=None: automatic dynamic
shapes) and a static compile (dynamic=False), a fresh MLP is trained one step per batch with
`optimize(compile=True, amp=False)`; printed: the frames dynamo compiled (first compile +
recompiles, torch's own counter), and the lines autoopt printed about them. Recompiles are
dynamo's, so the cheap "aot_eager" backend counts them as inductor would.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json

import torch
from torch import nn
from torch._dynamo.utils import counters

import autoopt
from autoopt.runtime.passes import compile as compile_pass

SEQUENCES = {
    "8,8,8,5 x3 epochs": [8, 8, 8, 5] * 3,
    "8,16,24": [8, 16, 24],
    "8,16,...,64": list(range(8, 65, 8)),
}


def run(sizes: list[int], dynamic: bool | None, react: bool, backend: str) -> dict[str, int]:
    """Train one step per batch size; the frames compiled and the lines printed."""
    torch._dynamo.reset()
    counters.clear()
    compile_pass.BACKEND = backend
    compile_pass.REACT_TO_SHAPES = react
    compile_pass.COMPILE_OPTIONS = {} if dynamic is None else {"dynamic": dynamic}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        model, optimizer = autoopt.optimize(model, optimizer=optimizer, compile=True, amp=False)
        for n in sizes:
            loss = nn.functional.cross_entropy(model(torch.randn(n, 16)), torch.randint(0, 4, (n,)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    lines = [
        ln for ln in printed.getvalue().splitlines() if ln.startswith("autoopt: torch.compile")
    ]
    return {"frames compiled": counters["frames"]["total"], "lines printed": len(lines)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="aot_eager")
    args = parser.parse_args()
    rows = []
    for name, sizes in SEQUENCES.items():
        for dynamic in (None, False):
            for react in (False, True):
                row = {"batches": name, "dynamic": dynamic, "autoopt reacts": react}
                row.update(run(sizes, dynamic, react, args.backend))
                rows.append(row)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
