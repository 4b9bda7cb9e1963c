"""The new rules' fixes keep what they claim to keep, checked by running the code before and
after the fix with torch: attention (AO609) and conv-before-BatchNorm (AO607) give the same
outputs, DDP accumulation with `no_sync()` (AO504) trains to the same weights with fewer
all-reduces, and AO608 applies only its value-preserving fixes by default."""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from autoopt.lint.engine.registry import load_registry
from autoopt.lint.rewrite.apply import fix_source

RULES = load_registry().rules


def _run(source: str, **names: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = dict(names)
    exec(compile(source, "<example>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("example", [e for e in RULES["AO609"].INVALID if e.fixed])
def test_sdpa_fix_computes_the_same_attention(example: Any) -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
    before, after = _run(example.code, q=q, k=k, v=v), _run(example.fixed, q=q, k=k, v=v)
    assert "scaled_dot_product_attention" in example.fixed
    if "attend" in before:
        torch.testing.assert_close(after["attend"](q, k, v), before["attend"](q, k, v))
    else:
        torch.testing.assert_close(after["out"], before["out"])


def test_conv_without_bias_before_batchnorm_gives_the_same_training_outputs() -> None:
    example = RULES["AO607"].INVALID[0]
    torch.manual_seed(0)
    with_bias = _run(example.code)["features"]
    without = _run(example.fixed)["features"]
    assert without[0].bias is None and with_bias[0].bias is not None
    without[0].weight.data.copy_(with_bias[0].weight.data)
    with torch.no_grad():
        with_bias[0].bias.uniform_(-1, 1)  # a bias far from zero: BatchNorm still cancels it
    x = torch.randn(4, 3, 8, 8)
    torch.testing.assert_close(without(x), with_bias(x), atol=1e-5, rtol=1e-4)


def test_host_tensor_fix_is_safe_only_where_values_are_the_same() -> None:
    rule = [RULES["AO608"]]
    deterministic = "import torch\nm = torch.zeros(3).to(device)\n"
    random = "import torch\nm = torch.randn(3).to(device)\n"
    assert fix_source(deterministic, rule).source == (
        "import torch\nm = torch.zeros(3, device=device)\n"
    )
    left = fix_source(random, rule)
    assert left.source == random and left.unsafe_available
    assert "device=device" in fix_source(random, rule, unsafe=True).source


# ----- AO504: DDP accumulation under gloo, two processes --------------------------------------
_LOOP = """
import torch
from torch.nn.parallel import DistributedDataParallel
model = DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(batches):
    out = model(x)
    loss = ((out - y) ** 2).mean() / accum
    loss.backward()
    if (step + 1) % accum == 0:
        opt.step()
        opt.zero_grad()
"""


def _train(rank: int, port: int, sources: list[str], results: Any) -> None:
    """Run each loop on this rank; rank 0 reports (all-reduces counted, final weights)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        for source in sources:
            torch.manual_seed(0)
            net = nn.Linear(4, 2)
            g = torch.Generator().manual_seed(rank)
            batches = [
                (torch.randn(3, 4, generator=g), torch.randn(3, 2, generator=g)) for _ in range(8)
            ]
            reduces = []

            def count(state, bucket, reduces=reduces):  # unannotated: DDP checks for GradBucket
                reduces.append(1)
                work = dist.all_reduce(bucket.buffer() / 2, async_op=True)
                return work.get_future().then(lambda f: f.value()[0])

            hooked = source.replace(
                "model = DistributedDataParallel(net)\n",
                "model = DistributedDataParallel(net)\nmodel.register_comm_hook(None, count)\n",
            )
            namespace = {"net": net, "batches": batches, "accum": 4, "count": count}
            exec(compile(hooked, "<loop>", "exec"), namespace)
            if rank == 0:
                results.put((len(reduces), [p.tolist() for p in net.parameters()]))
    finally:
        dist.destroy_process_group()
    # A gloo rank has aborted in interpreter shutdown after its work was done (a gloo thread
    # destroyed by a static destructor): end the spawned process as it stands.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.slow
def test_no_sync_fix_all_reduces_once_per_step_and_trains_the_same() -> None:
    fixed = fix_source(_LOOP, [RULES["AO504"]], unsafe=True).source
    assert "model.no_sync() if (step + 1) % accum != 0" in fixed
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.get_context("spawn").SimpleQueue()
    # What the fix must not do: no_sync() around the backward alone (DDP decides in the forward).
    backward_only = _LOOP.replace(
        "    loss.backward()\n",
        "    with (model.no_sync() if (step + 1) % accum != 0 else contextlib.nullcontext()):\n"
        "        loss.backward()\n",
    ).replace("import torch\n", "import contextlib\nimport torch\n")
    sources = [_LOOP, fixed, backward_only]
    mp.start_processes(_train, args=(port, sources, results), nprocs=2, start_method="spawn")
    (n_plain, plain), (n_fixed, weights), (n_backward_only, _) = (results.get() for _ in sources)
    assert (n_plain, n_fixed, n_backward_only) == (8, 2, 8)  # 8 micro-steps, 2 optimizer steps
    for a, b in zip(weights, plain, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b))
