"""Loaded by every Python process that benchmarks/run_scripts.py starts (this folder is first on
PYTHONPATH there, and only there): it makes a real training script stop after a few optimizer
steps and run on tiny synthetic data on the CPU, so that the original, the rewritten and the
wrapped script can each be executed in seconds.

- After AUTOOPT_RUN_STEPS optimizer steps (a global optimizer step hook, so `GradScaler.step`,
  `autoopt.optimize`'s optimizer and plain `opt.step()` all count) it prints the marker line and
  ends the process with exit code 0.
- `torch.compile` (and so `Module.compile`) defaults to the `aot_eager` backend: it traces
  through dynamo and AOTAutograd (what breaks on double backward, graph breaks, guards) without
  inductor's C++ code generation, which takes minutes per model on a shared CPU. Set
  AUTOOPT_RUN_COMPILE_BACKEND=inductor for the real thing.
- DataLoader workers are capped at AUTOOPT_RUN_MAX_WORKERS (2).
- `torch.utils.tensorboard` gets a no-op SummaryWriter when the tensorboard package is absent.
- With AUTOOPT_RUN_CUDA_AS_CPU=1 (a runs.json entry's `cuda_as_cpu`), `Tensor.cuda()` and
  `Module.cuda()` leave the object on the CPU (arguments such as `non_blocking` are accepted and
  ignored): a script that calls `.cuda()` unconditionally runs as written, fixes included.
- The fake `torchvision` and `gym` packages beside this file stand in for datasets, transforms,
  models and environments (synthetic data, no download).
"""

import os
import sys
import types

if os.environ.get("AUTOOPT_RUN_SHIM") == "1":
    import torch

    MARKER = "AUTOOPT_RUN: reached {} optimizer steps"
    _limit = int(os.environ.get("AUTOOPT_RUN_STEPS", "3"))
    _steps = [0]

    def _count(optimizer, args, kwargs):
        _steps[0] += 1
        if _steps[0] >= _limit:
            print(MARKER.format(_steps[0]), flush=True)
            sys.stderr.flush()
            os._exit(0)

    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_count)
    print("AUTOOPT_RUN: shim active", file=sys.stderr, flush=True)

    # Worker processes stay (a dataset that cannot be pickled still fails), but at most 2 of
    # them: a script asking for 20 on a shared 2-core machine would only wait for their start.
    _max_workers = int(os.environ.get("AUTOOPT_RUN_MAX_WORKERS", "2"))
    _loader_init = torch.utils.data.DataLoader.__init__

    def _loader_init_capped(self, *args, **kwargs):
        if kwargs.get("num_workers", 0) > _max_workers:
            kwargs["num_workers"] = _max_workers
        return _loader_init(self, *args, **kwargs)

    torch.utils.data.DataLoader.__init__ = _loader_init_capped

    if os.environ.get("AUTOOPT_RUN_CUDA_AS_CPU") == "1":
        # CUDA is hidden in these runs; the script's own .cuda() calls stay where they are
        torch.Tensor.cuda = lambda self, *args, **kwargs: self
        torch.nn.Module.cuda = lambda self, *args, **kwargs: self

    _backend = os.environ.get("AUTOOPT_RUN_COMPILE_BACKEND", "aot_eager")
    _compile = torch.compile

    def _compile_with_backend(model=None, *args, **kwargs):
        kwargs.setdefault("backend", _backend)
        if _backend != "inductor":
            kwargs.pop("mode", None)  # modes are inductor options
            kwargs.pop("options", None)
        if model is None:
            return lambda m: _compile(m, *args, **kwargs)
        return _compile(model, *args, **kwargs)

    torch.compile = _compile_with_backend

    try:
        import tensorboard  # noqa: F401
    except ImportError:

        class SummaryWriter:
            """No-op stand-in: the scripts log, nothing reads it here."""

            def __init__(self, log_dir=None, *args, **kwargs):
                self.log_dir = log_dir or os.path.join("runs", "autoopt-run")
                os.makedirs(self.log_dir, exist_ok=True)

            def __getattr__(self, name):
                return lambda *args, **kwargs: None

        board = types.ModuleType("torch.utils.tensorboard")
        board.SummaryWriter = SummaryWriter
        sys.modules["torch.utils.tensorboard"] = board
        sys.modules["tensorboardX"] = board
