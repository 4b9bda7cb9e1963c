"""AO603: hard-coded `.cuda()` calls where a device variable would keep the script portable."""

from __future__ import annotations

import functools
import re

import libcst as cst

from autoopt.lint.engine.rule import FileContext, Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.tree.nodes import before, code_of, dotted, method_name, nodes_of_type, walk

# Signs that a script is CUDA-only by design: moving it off `.cuda()` buys no portability.
_CUDA_ONLY_MARKERS = (
    "assert torch.cuda.is_available()",  # keon/seq2seq: refuses to start without a GPU
    "nccl",
    "device_ids=[",
    "cupy",
    "pycuda",
    "triton",
)
# The same where the code may make them optional: a `set_device` behind `if use_cuda:`, an
# apex import in `try: ... except ImportError:` (SupContrast, overhaul-distillation).
_APEX_IMPORT = ("import apex", "from apex")
# The same, said by a driver about the modules it runs: a `set_device` alone may sit behind the
# driver's own `if args.cuda:` (cnn-text-classification), nccl and DDP's device ids do not.
_DRIVER_CUDA_ONLY_MARKERS = ("nccl", "device_ids=[", "import apex", "from apex")
# ... and by a setup module the script imports: the nccl backend (a `device_ids=[...]` there may
# be a DataParallel utility's, sync_batchnorm's replicate.py).
_SETUP_CUDA_ONLY_MARKERS = ("nccl",)
# ... or stops without one: `if not torch.cuda.is_available(): sys.exit(1)` (ReActNet), or raise.
# (also `if torch.cuda.device_count() == 0:`, after a message or two: yolact's print, P-DARTS's
# `logging.info('No GPU device available')`)
_REFUSES_CPU = re.compile(
    r"if (?:not torch\.cuda\.is_available\(\)|torch\.cuda\.device_count\(\)\s*(?:==\s*0|<\s*1))"
    r"\s*:\s*\n?(?:\s*[\w.]+\(.*\)\s*\n){0,2}\s*(?:sys\.exit|exit|quit|raise)\b"
)
# A script that can run on the CPU says so somewhere: a "cpu" device or an availability test.
_CPU_PATH = re.compile(r"""["']cpu|is_available\(|no[-_]cuda|use_cuda""")
# ... but not a checkpoint loaded to the host (`torch.load(path, map_location="cpu")`)
_LOADED_TO_HOST = re.compile(r"""map_location\s*=\s*["']cpu["']""")
_CUDA_INDEX = re.compile(r"^cuda:(\d+)$")
# ... and, in a module the script imports, a placement only when CUDA is there (few-shot-meta-
# baseline's `models.make`: `if torch.cuda.is_available(): model.cuda()`); a "cpu" string or an
# availability test elsewhere in a utility module says nothing of the script's own path
_PLACES_WHEN_AVAILABLE = re.compile(r"if\s+torch\.cuda\.is_available\(\)\s*:\s*\n\s*\S*\.cuda\(")
# A driver that chooses the device (`device = torch.device(...)`, `args.device = ...`).
_DEVICE_CHOSEN = re.compile(r"\bdevice\s*=[^=]|torch\.device\(")


class HardcodedCudaCall(Rule):
    """
    ## What it does
    Flags `x.cuda()` calls (on modules and tensors) in scripts that are meant to run on more
    than one kind of device.

    ## Why
    A hard-coded `.cuda()` crashes the script on a machine without a GPU (a laptop, a CPU CI
    runner) and pins it to the current CUDA device. Choosing the device once
    (`device = torch.device("cuda" if torch.cuda.is_available() else "cpu")`) and moving things
    with `.to(device)` keeps one script for every machine (as a widely read PyTorch tutorial teaches). `autoopt.optimize` picks
    the device automatically.

    ## When not to
    - Scripts that are CUDA-only by design: they assert `torch.cuda.is_available()`, pin ranks
      with `torch.cuda.set_device` (outside a CUDA check), use the `nccl` backend, wrap DDP
      with `device_ids=[gpu]`, need CUDA-only packages (apex imported outside a `try:`, cupy,
      triton), stop without one (`if not torch.cuda.is_available(): sys.exit(1)`, ReActNet, also after
      logging why, P-DARTS;
      `if torch.cuda.device_count() == 0: exit(-1)`, yolact),
      or spread over GPUs with `nn.DataParallel` with no CPU path anywhere (no "cpu"
      device, no availability test, in the script or the modules it imports, and no
      `.cuda()` behind a flag such as `if args.cuda:`; a checkpoint loaded with
      `map_location="cpu"` is no CPU path). Not flagged; nor is a module without a CPU path of its own that such a script
      imports (its trainer or engine), nor a script whose imported setup module starts the
      `nccl` backend (LoRA's gpu.py), nor a script with no CPU path whose model classes wrap
      themselves in `nn.DataParallel` (CMC's `InsResNet50`).
    - A `.cuda()` already guarded by a CUDA check (`if torch.cuda.is_available():`,
      `if args.cuda:`, a GPU flag's truth: `if use_gpu:`, a GPU index tested against the
      CPU's -1: `if config.gpu_id >= 0:`; not a count, `if num_gpu > 1:`,
      whose other branch runs on CUDA too) in a script that has a device (a `device` variable, parameter or flag):
      that code is portable as written. Not flagged. Where the script never names a device (the
      legacy `cuda = torch.cuda.is_available()` / `if cuda: model.cuda()` style), it runs on
      CUDA or CPU only (not MPS/XPU) and repeats the choice at every branch: reported once per
      file, without a fix. A module that a script imports (its trainer, its engine) follows
      the device that script chooses: where the script names one, the module's guarded
      `.cuda()` is not reported either.
    - `torch.Tensor.cuda(x)` spelled through torch, and anything that is not a method call.

    ## Fix (safe)
    Where a device variable is in scope — a name assigned a CUDA device (`torch.device("cuda")`,
    `"cuda" if ... else "cpu"`) in the same function before the call, or at module level —
    `x.cuda()` becomes `x.to(device)` (keyword arguments such as `non_blocking=True` are kept).
    On a CUDA machine that is the same device `.cuda()` used; elsewhere the script now runs
    instead of crashing. `x.cuda(i)` with an explicit GPU index, and calls with no device
    variable in scope, are reported without a fix: define the device once and use it.
    """

    code = "AO603"
    name = "hardcoded-cuda-call"
    message = "hard-coded .cuda(); define a device once and use .to(device)"
    fix_safety = FixSafety.SAFE
    fix_reason = "the device variable names the same CUDA device that .cuda() uses"
    triggers = (".cuda(",)

    VALID = [
        Valid(  # stops without a GPU: CUDA-only by design (ReActNet)
            """
            import sys
            import torch
            def main():
                if not torch.cuda.is_available():
                    sys.exit(1)
                model = Net().cuda()
                for images, target in loader:
                    loss = criterion(model(images.cuda()), target.cuda())
            """
        ),
        Valid(  # the script refuses to start without CUDA (keon/seq2seq)
            """
            import torch
            def main():
                assert torch.cuda.is_available()
                model = Seq2Seq().cuda()
            """
        ),
        Valid(  # apex imported unconditionally: the script needs CUDA
            """
            import torch
            from apex import amp
            model = Net().cuda()
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            """
        ),
        Valid(  # DDP pinned to a GPU index: CUDA-only by design (dino)
            """
            import torch
            student = Net().cuda()
            student = nn.parallel.DistributedDataParallel(student, device_ids=[args.gpu])
            """
        ),
        Valid(
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            """
        ),
        Valid(  # a GPU index whose -1 means the CPU, tested (simple-nmt's `--gpu_id -1`)
            """
            import torch
            device = "cpu" if config.gpu_id < 0 else f"cuda:{config.gpu_id}"
            model = Seq2Seq()
            if config.gpu_id >= 0:
                model.cuda(config.gpu_id)
            if opt.gpu is not None:
                images = images.cuda(opt.gpu, non_blocking=True)
            """
        ),
        Valid(  # guarded by a GPU flag, in a script that has a device (End-to-end-ASR)
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            if paras.gpu and paras.reserve_gpu > 0:
                buff = torch.randn(int(paras.reserve_gpu * 1e9 // 4)).cuda()
                del buff
            model = Net().to(device)
            """
        ),
        Valid(  # guarded, in a script that has a device for the rest
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net()
            if torch.cuda.is_available():
                model = model.cuda()
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            dist.init_process_group("nccl")
            torch.cuda.set_device(local_rank)
            model = Net().cuda()
            """
        ),
        Valid(
            """
            import torch
            t = torch.Tensor.cuda(x)
            """
        ),
        Valid(  # stops without a GPU, after a comment and a message (yolact)
            """
            import torch
            # GPUs only
            if torch.cuda.device_count() == 0:
                print("No GPUs detected. Exiting...")
                exit(-1)
            model = Net().cuda()
            """
        ),
        Valid(  # multi-GPU by design: DataParallel, unconditional .cuda(), no CPU path
            """
            import torch
            model = torch.nn.DataParallel(Net()).cuda()
            for x, y in loader:
                loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
            """
        ),
    ]
    INVALID = [
        Invalid(  # a count of GPUs is no CPU check: the other branch runs on CUDA too
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            if num_gpu > 1:
                model = torch.nn.DataParallel(model).cuda()
            """,
            line=5,
            fixed="""
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            if num_gpu > 1:
                model = torch.nn.DataParallel(model).to(device)
            """,
        ),
        Invalid(  # refuses the CPU only when --cuda asked for CUDA: a CPU path (pytorch-vdsr)
            """
            import torch
            cuda = opt.cuda
            if cuda:
                if not torch.cuda.is_available():
                    raise Exception("No GPU found, please run without --cuda")
            model = Net()
            if cuda:
                model = model.cuda()
            """,
            line=8,
            message_contains="never names a device",
        ),
        Invalid(  # set_device behind the CUDA check, apex optional: a CPU path (SupContrast)
            """
            import torch
            try:
                import apex
            except ImportError:
                pass
            use_cuda = torch.cuda.is_available()
            if use_cuda:
                torch.cuda.set_device(0)
                model.cuda()
            """,
            line=9,
        ),
        Invalid(
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().cuda()
            for x, y in loader:
                x, y = x.cuda(non_blocking=True), y.cuda()
            """,
            line=3,
            fixed="""
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            for x, y in loader:
                x, y = x.to(device, non_blocking=True), y.to(device)
            """,
        ),
        Invalid(  # a tensor torch makes, moved by hand (MART's adversarial noise)
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            noise = 0.001 * torch.randn(x.shape).cuda()
            """,
            line=3,
            fixed="""
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            noise = 0.001 * torch.randn(x.shape).to(device)
            """,
        ),
        Invalid(
            """
            import torch
            def train(model, loader):
                dev = "cuda" if torch.cuda.is_available() else "cpu"
                model.cuda()
                for x in loader:
                    model(x.cuda(0)).sum().backward()
            """,
            line=6,
            fixed="""
            import torch
            def train(model, loader):
                dev = "cuda" if torch.cuda.is_available() else "cpu"
                model.to(dev)
                for x in loader:
                    model(x.cuda(0)).sum().backward()
            """,
        ),
        Invalid(
            """
            import torch
            model = Net().cuda()
            """,
            line=2,
            message_contains="device",
        ),
        Invalid(  # DataParallel behind an off-by-default --cuda flag (Wave-U-Net)
            """
            import torch
            model = Net()
            if args.cuda:
                model = torch.nn.DataParallel(model)
                model.cuda()
            """,
            line=5,
            message_contains="never names a device",
        ),
        # The legacy style (PyTorch-GAN): a CUDA flag and `.cuda()` in each branch, no device
        # anywhere; reported once, at the first call.
        Invalid(
            """
            import torch
            cuda = True if torch.cuda.is_available() else False
            if cuda:
                generator.cuda()
                discriminator.cuda()
            """,
            line=4,
            message_contains="never names a device",
        ),
        # ... also when a string says "device" (pytorch/examples' warning) and a
        # DataParallel takes `device_ids=` (neither names the script's device)
        Invalid(
            """
            import torch
            if torch.cuda.is_available() and not opt.cuda:
                print("WARNING: You have a CUDA device, so you should probably run with --cuda")
            model = torch.nn.DataParallel(Net(), device_ids=range(opt.ngpu))
            if opt.cuda:
                model.cuda()
            """,
            line=6,
            message_contains="never names a device",
        ),
    ]

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        source = self.context.source
        self._cuda_only = (
            any(marker in source for marker in _CUDA_ONLY_MARKERS)
            or (_REFUSES_CPU.search(source) is not None and self._refuses_cpu())
            or self._needs_cuda(source)
            or (
                "DataParallel(" in source
                and not self._program_has_cpu_path(source)
                and not self._any_guarded_cuda()
            )
        )
        self._device_less_reported = False

    def _any_guarded_cuda(self) -> bool:
        """A `.cuda()` behind a CUDA check (`if args.cuda:`, Wave-U-Net's `store_true` flag):
        the script has a CPU path, off unless asked for."""
        return any(
            method_name(c) == "cuda" and self._guarded(c)
            for c in nodes_of_type(self.context.module, cst.Call)
        )

    def _program_has_cpu_path(self, source: str) -> bool:
        """This file, or a project module it imports, can run on the CPU: few-shot-meta-
        baseline's train_meta.py wraps DataParallel with no CPU path of its own, while its
        models/models.py moves the model only `if torch.cuda.is_available()`."""
        return _has_cpu_path(source) or self.context.program.reaches_text_that_says(
            lambda text: _PLACES_WHEN_AVAILABLE.search(text) is not None
        )

    def _refuses_cpu(self) -> bool:
        """`if not torch.cuda.is_available(): sys.exit(1)` on every run (ReActNet), not under
        another `if` (pytorch-vdsr's `if cuda:` refuses only when CUDA was asked for)."""
        return any(
            _REFUSES_CPU.match(code_of(node.with_changes(leading_lines=()))) is not None
            and not self.context.facts.under_an_if(node)
            for node in nodes_of_type(self.context.module, cst.If)
        )

    def _needs_cuda(self, source: str) -> bool:
        """A `set_device(...)` outside any CUDA check, or apex imported outside a `try:`."""
        module = self.context.module
        if "set_device(" in source and any(
            (dotted(c.func) or "").endswith("set_device") and not self._guarded(c)
            for c in nodes_of_type(module, cst.Call)
        ):
            return True
        if not any(marker in source for marker in _APEX_IMPORT):
            return False
        for node in nodes_of_type(module, (cst.Import, cst.ImportFrom)):
            names = (
                [dotted(a.name) for a in node.names]
                if isinstance(node, cst.Import)
                else [dotted(node.module) if node.module else None]
            )
            if any(n and n.split(".")[0] == "apex" for n in names) and not any(
                isinstance(a, cst.Try) for a in self.context.facts.ancestors(node)
            ):
                return True
        return False

    @functools.cached_property
    def _sets_up_cuda_only(self) -> bool:
        """A project module this script imports sets up CUDA-only training (LoRA's gpu.py:
        the nccl backend, `set_device(local_rank)`)."""
        return self.context.program.reaches_text_that_says(
            lambda text: any(marker in text for marker in _SETUP_CUDA_ONLY_MARKERS)
        )

    @functools.cached_property
    def _driven_by_cuda_only_script(self) -> bool:
        """A module without a CPU path of its own that a CUDA-only script imports (HRNet's
        lib/core/function.py, run by tools/train.py with `set_device` and nccl)."""
        if _has_cpu_path(self.context.source):
            return False
        return self.context.program.importer_text_says(
            lambda text: (
                any(marker in text for marker in _DRIVER_CUDA_ONLY_MARKERS)
                or ("DataParallel(" in text and not _has_cpu_path(text))
            )
        )

    @functools.cached_property
    def _spread_by_its_models(self) -> bool:
        """A script with no CPU path, none of whose `.cuda()` calls is behind a CUDA check,
        whose model classes spread over the GPUs themselves (CMC's InsResNet50 wraps its
        encoder in `nn.DataParallel` in `__init__`; a `--cuda` flag's `if args.cuda:` is a CPU
        path: Knowledge-Distillation-Zoo)."""
        if self._program_has_cpu_path(self.context.source) or self._any_guarded_cuda():
            return False
        return self.context.program.reaches_text_that_says(lambda text: "DataParallel(" in text)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if self._cuda_only or not isinstance(func, cst.Attribute) or func.attr.value != "cuda":
            return
        if self._driven_by_cuda_only_script or self._sets_up_cuda_only:
            return
        if self._spread_by_its_models:
            return
        if not isinstance(func.value, cst.Call) and any(
            q.startswith("torch.") or q == "torch" for q in self.qualified_names(func.value)
        ):
            # `torch.Tensor.cuda(x)`, a module attribute: not a method call on a value (a
            # tensor torch makes, `torch.randn(shape).cuda()` in MART's loss, is one)
            return
        if self._guarded(node, by_gpu_flag=True):
            self._report_device_less(node)
            return
        positional = [a for a in node.args if a.keyword is None]
        device_kw = [a for a in node.args if a.keyword is not None and a.keyword.value == "device"]
        if positional or device_kw or any(a.star for a in node.args):
            self.report(
                node,
                "hard-coded .cuda(<index>); pass a device chosen once "
                '(e.g. torch.device(f"cuda:{i}" if torch.cuda.is_available() else "cpu"))',
            )
            return
        device = self._device_in_scope(node)
        if device is None:
            self.report(
                node,
                'hard-coded .cuda(); define `device = torch.device("cuda" if '
                'torch.cuda.is_available() else "cpu")` once and use .to(device)',
            )
            return
        new_args = [cst.Arg(cst.Name(device)), *node.args]
        if len(new_args) > 1:
            new_args[0] = new_args[0].with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            )
        new = node.with_changes(func=func.with_changes(attr=cst.Name("to")), args=new_args)
        self.report(
            node,
            f"hard-coded .cuda(); use .to({device})",
            fix=Fix(replacements={node: new}, description=f".cuda() -> .to({device})"),
        )

    def _report_device_less(self, node: cst.Call) -> None:
        """Guarded `.cuda()` in a script that never names a device (the legacy
        `if cuda: model.cuda()` style): reported once per file, without a fix."""
        if self._device_less_reported or self._names_a_device():
            return
        self._device_less_reported = True
        self.report(
            node,
            "`.cuda()` behind a CUDA check in a script that never names a device: it runs on "
            "CUDA or CPU only and repeats the choice at every `if cuda:`; choose the device "
            "once (torch.accelerator.current_accelerator() or torch.device) and use .to(device)",
        )

    def _names_a_device(self) -> bool:
        """The code names a device (`device = ...`, `args.device`, `torch.device(...)`): not
        `device_ids=`, nor the word in a string ("You have a CUDA device, ..."); or, for a
        module of the program that a script imports (its trainer, its engine), that script
        does: the module's `if cuda:` follows the device the driver chose."""
        if "device" in self.context.source and any(
            n.value == "device" for n in nodes_of_type(self.context.module, cst.Name)
        ):
            return True
        program = self.context.program
        return not program.is_entry_script and program.importer_text_says(
            lambda text: _DEVICE_CHOSEN.search(text) is not None
        )

    def _guarded(self, node: cst.Call, *, by_gpu_flag: bool = False) -> bool:
        """Under an `if`/ternary whose test mentions CUDA (`torch.cuda.is_available()`,
        `args.cuda`, `use_cuda`); with `by_gpu_flag`, also one that tests a GPU flag's truth
        (`if use_gpu:`, `if paras.gpu and paras.reserve_gpu > 0:`; not `if num_gpu > 1:`,
        whose other branch runs on CUDA too)."""
        for anc in self.context.facts.ancestors(node):
            if isinstance(anc, cst.If | cst.IfExp) and (
                "cuda" in code_of(anc.test).lower() or (by_gpu_flag and _tests_gpu_flag(anc.test))
            ):
                return True
            if isinstance(anc, cst.FunctionDef):
                return False
        return False

    def _device_in_scope(self, node: cst.Call) -> str | None:
        """A variable holding a CUDA device, visible at `node`: assigned before it in its own
        function, or at module level (before it, when `node` is at module level too)."""
        facts = self.context.facts
        scope = facts.enclosing_scope(node)
        candidates: list[str] = []
        params: set[str] = set()
        if isinstance(scope, cst.FunctionDef):
            params = {p.name.value for p in scope.params.params}
            params |= {p.name.value for p in scope.params.kwonly_params}
            candidates += self._device_names(scope, node, same_scope=True)
        candidates += [
            c
            for c in self._device_names(
                self.context.module, node, same_scope=scope is self.context.module
            )
            if c not in params  # a parameter of that name shadows the module's device
        ]
        if not candidates:
            return None
        return "device" if "device" in candidates else candidates[0]

    def _device_names(self, scope: cst.CSTNode, node: cst.Call, *, same_scope: bool) -> list[str]:
        names: list[str] = []
        for n in walk(scope, into_scopes=False):
            if not isinstance(n, cst.Assign) or len(n.targets) != 1:
                continue
            target = n.targets[0].target
            if not isinstance(target, cst.Name) or not self._is_cuda_device(n.value):
                continue
            if same_scope and not before(self, n, node):
                continue
            names.append(target.value)
        return names

    def _is_cuda_device(self, value: cst.BaseExpression) -> bool:
        """A device expression whose CUDA choice is the default device ("cuda" or "cuda:0")."""
        strings = [s.evaluated_value for s in walk(value) if isinstance(s, cst.SimpleString)]
        cuda = [s for s in strings if isinstance(s, str) and s.startswith("cuda")]
        if not cuda:
            return False
        for s in cuda:
            match = _CUDA_INDEX.match(s)
            if s != "cuda" and (match is None or match.group(1) != "0"):
                return False
        if isinstance(value, cst.Call):
            if len(value.args) != 1:  # torch.device("cuda", 1) names a specific GPU
                return False
            return self.is_call_to(value, "torch.device") or dotted(value.func) == "torch.device"
        return isinstance(value, cst.SimpleString | cst.IfExp)


def _tests_gpu_flag(test: cst.BaseExpression) -> bool:
    """`test` takes the truth of a GPU flag: `use_gpu`, `args.gpu`, `not args.no_gpu`, as one
    operand of `and`/`or` too, or tests a GPU index against the CPU's -1 (simple-nmt's
    `if config.gpu_id >= 0:`); not a count (`num_gpu > 1`)."""
    if isinstance(test, cst.BooleanOperation):
        return _tests_gpu_flag(test.left) or _tests_gpu_flag(test.right)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test = test.expression
    if isinstance(test, cst.Comparison) and _tests_gpu_index(test):
        return True
    name = dotted(test)
    return name is not None and "gpu" in name.rsplit(".", 1)[-1].lower()


def _tests_gpu_index(test: cst.Comparison) -> bool:
    """`gpu_id >= 0`, `args.gpu > -1`, `gpu != -1`: an index whose -1 means the CPU (or
    None: `opt.gpu is not None`)."""
    if len(test.comparisons) != 1:
        return False
    name = dotted(test.left)
    if name is None or "gpu" not in name.rsplit(".", 1)[-1].lower():
        return False
    target = test.comparisons[0]
    bound = code_of(target.comparator).replace(" ", "")
    if isinstance(target.operator, cst.IsNot):
        return bound == "None"  # SimKD's `if opt.gpu is not None:`
    return (isinstance(target.operator, cst.GreaterThanEqual) and bound == "0") or (
        isinstance(target.operator, cst.GreaterThan | cst.NotEqual) and bound == "-1"
    )


def _has_cpu_path(text: str) -> bool:
    """The text can run on the CPU (a "cpu" device, an availability test, a no-cuda flag); a
    checkpoint loaded to the host is no CPU path."""
    return _CPU_PATH.search(_LOADED_TO_HOST.sub("", text)) is not None
