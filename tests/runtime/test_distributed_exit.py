"""Issue 24: a torchrun script under optimize() ends as users end theirs (no
destroy_process_group(), no os._exit) and exits cleanly. The process group autoopt initialised
is destroyed by its exit hook, before interpreter teardown, where a gloo worker thread that
still needed the GIL aborted the rank ("terminate called without an active exception"); a
group the user initialised is never touched.

Every multi-process test 20 times in a row, one line per round (issue 24's proof):
    for i in $(seq 20); do s=$(date +%s); .venv/bin/python -m pytest -p no:xdist -q -x \
      tests/runtime/test_distributed.py tests/runtime/test_fsdp.py tests/runtime/test_dist_hf.py \
      tests/runtime/test_distributed_exit.py "tests/runtime/test_accumulate_auto.py::\
    test_ddp_two_processes_equal_one_process_on_the_global_batch" "tests/diagnostics/\
    test_selftest.py::test_selftest_under_torchrun_checks_ddp_against_ddp_by_hand" | tail -1; \
      echo "round $i: $(( $(date +%s) - s )) s"; done
"""

from __future__ import annotations

import sys
import weakref
from pathlib import Path

import pytest
import torch.distributed as dist

from autoopt.runtime.passes import distributed

from .torchrun import run_two_processes

WORKER = Path(__file__).with_name("exit_worker.py")


@pytest.mark.slow
def test_a_script_that_never_destroys_the_group_exits_cleanly(tmp_path: Path) -> None:
    # run_two_processes asserts both ranks exit 0: an abort in teardown fails it.
    results = run_two_processes(WORKER, tmp_path, timeout=180)
    for result in results:
        # The group was alive while training (so the check below means something) ...
        assert "pt_gloo_runloop" in result["trained"]["ddp"], result
        assert "pt_gloo_runloop" in result["trained"]["fsdp"], result
        # ... and autoopt's exit hook joined its threads while Python still ran, although the
        # DDP and FSDP2 models (which hold the group) are still alive as the script's globals.
        assert result["gloo_threads_at_exit"] == [], result


@pytest.fixture
def user_group(tmp_path: Path):
    """A one-process gloo group the user initialised (not optimize())."""
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield dist.group.WORLD
    if dist.is_initialized():
        dist.destroy_process_group()


def test_the_exit_hook_never_destroys_a_group_the_user_initialised(
    user_group: dist.ProcessGroup, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(distributed, "_OWN_GROUP", None)
    assert distributed.destroy_own_group() is False
    assert dist.is_initialized() and dist.group.WORLD is user_group
    # optimize() initialised a group, the user destroyed it and initialised their own.
    ours = user_group
    monkeypatch.setattr(distributed, "_OWN_GROUP", weakref.ref(ours))
    dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'b'}", rank=0, world_size=1)
    assert distributed.destroy_own_group() is False
    assert dist.is_initialized() and dist.group.WORLD is not ours


def test_the_exit_hook_destroys_its_own_group_unless_the_rank_failed(
    user_group: dist.ProcessGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(distributed, "_OWN_GROUP", weakref.ref(user_group))
    # An uncaught exception (sys.last_value): peers may be in a collective; left as it is.
    monkeypatch.setattr(sys, "last_value", RuntimeError("rank failed"), raising=False)
    assert distributed.destroy_own_group() is False
    assert dist.is_initialized()
    monkeypatch.delattr(sys, "last_value")
    del user_group
    assert distributed.destroy_own_group() is True
    assert not dist.is_initialized()
