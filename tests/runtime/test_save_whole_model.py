"""`torch.save(model)` of an optimized model writes the user's plain model (issue 21).

pytorch/examples word_language_model saves the whole model (`torch.save(model, f)`) and reloads
it with `torch.load(f)` (weights only, torch's default) under
`torch.serialization.safe_globals([...])` naming its own classes and the torch modules they
hold. Wrapped with `optimize()`, the pickle used to hold autoopt's forward layers, report and
hooks too, and the load failed ("Weights only load failed"). Now the file is byte for byte what
the unoptimized model writes: no autoopt class, function or attribute name in it; loaded, it
is the user's class with the same state_dict, computing as the unoptimized model does.
`copy.deepcopy` still gives a working optimized copy (tests/runtime/test_copies.py)."""

from __future__ import annotations

import copy
import functools
import io
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import autoopt
from autoopt.runtime.accumulation.accumulator import Accumulator
from autoopt.runtime.forward import PatchedForward, original_forward
from autoopt.runtime.memory import saved_tensor_bytes, state_memory
from autoopt.runtime.passes import compile as compile_pass
from autoopt.runtime.passes.accumulate import SyncOnLastMicroStep
from autoopt.runtime.pickling import is_autoopt
from tests.runtime.checkpoint_models import GPT
from tests.runtime.models import MLP, SmallCNN

OFF = {"amp": False, "compile": False, "channels_last": False, "verbose": False}


def _tokens() -> torch.Tensor:
    return torch.randint(0, 32, (4, 24), generator=torch.Generator().manual_seed(0))


def _deep_stack() -> nn.Module:
    return nn.Sequential(*[nn.Linear(16, 16) for _ in range(8)])


# Each case: the user's model, optimize()'s options, an input maker.
CASES: dict[str, tuple[Callable[[], nn.Module], dict[str, Any], Callable[[], torch.Tensor]]] = {
    "amp bf16": (MLP, {"amp": "bf16"}, lambda: torch.randn(8, 16)),
    "amp fp16, loss scaling": (MLP, {"amp": "fp16"}, lambda: torch.randn(8, 16)),
    "channels_last": (SmallCNN, {"channels_last": True}, lambda: torch.randn(8, 3, 16, 16)),
    "accumulate=2": (SmallCNN, {"accumulate": 2}, lambda: torch.randn(8, 3, 16, 16)),
    "checkpoint=2, deep Sequential": (_deep_stack, {"checkpoint": 2}, lambda: torch.randn(8, 16)),
    "checkpoint=auto, blocks": (
        lambda: GPT(layers=4),
        {"checkpoint": "auto", "memory_budget": 1},  # nothing fits: every block checkpointed
        _tokens,
    ),
    "compile": (MLP, {"compile": True}, lambda: torch.randn(8, 16)),
    "compile=jit": (MLP, {"compile": "jit"}, lambda: torch.randn(8, 16)),
    # Each block compiled on its own (`block.compile()`, torch's `_compiled_call_impl`).
    "compile, regional blocks": (lambda: GPT(layers=3), {"compile": True}, _tokens),
    "all of them": (
        SmallCNN,
        {"amp": "bf16", "channels_last": True, "accumulate": 2, "compile": True},
        lambda: torch.randn(8, 3, 16, 16),
    ),
}


@pytest.fixture(autouse=True)
def eager_compile_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile through dynamo with the eager backend: the same layer, no C++ toolchain;
    repeated blocks compiled each on its own (off by default on CPU)."""
    monkeypatch.setattr(compile_pass, "BACKEND", "eager")
    monkeypatch.setattr(compile_pass, "REGIONAL", True)


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    """Four steps of the user's loop (two full cycles under accumulate=2)."""
    for _ in range(4):
        optimizer.zero_grad()
        model(x).float().pow(2).mean().backward()
        optimizer.step()


def _optimized(name: str) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    """(the optimized model after a few training steps, the unoptimized model it was copied
    from, an input)."""
    make, options, make_input = CASES[name]
    torch.manual_seed(0)
    plain = make()
    model = copy.deepcopy(plain)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = autoopt.optimize(
        model, None, optimizer, **{**OFF, "compile_cache": False, **options}
    )
    x = make_input()
    _train(model, optimizer, x)
    return model, plain, x


def _saved(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _globals(data: bytes) -> set[str]:
    return set(torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(data)))


def _load_as_the_script_does(data: bytes, plain: nn.Module) -> Any:
    """word_language_model's load: weights only, its own classes (and the torch modules it
    builds) allowed, nothing of autoopt's."""
    allowed = sorted({type(m) for m in plain.modules()}, key=str)
    with torch.serialization.safe_globals(allowed):
        return torch.load(io.BytesIO(data), weights_only=True)


def _is_autoopt(value: Any) -> bool:
    owner = value if isinstance(value, type) else type(value)
    return owner.__module__.split(".")[0] == "autoopt"


def _assert_plain_like(loaded: nn.Module, model: nn.Module, plain: nn.Module) -> None:
    """`loaded` is the user's class, its modules hold what the unoptimized model's hold (no
    patched forward, zero_grad, hooks or records), and its state is the optimized model's."""
    assert type(loaded) is type(plain)
    for mine, theirs in zip(loaded.modules(), plain.modules(), strict=True):
        assert type(mine) is type(theirs)
        # TorchScript (compile="jit") marks each module it scripts with a plain dict,
        # `__overloads__`, as it does when a user scripts a model: torch's, and harmless.
        assert sorted(set(vars(mine)) - {"__overloads__"}) == sorted(vars(theirs))
        assert not any(_is_autoopt(v) for v in vars(mine).values())
        assert not any(mine._forward_pre_hooks) and not any(mine._forward_hooks)
    want = model.state_dict()
    got = loaded.state_dict()
    assert list(got) == list(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key


def _eval_outputs(loaded: nn.Module, model: nn.Module, plain: nn.Module, x: torch.Tensor) -> None:
    """The loaded model computes as the unoptimized model with the trained weights (fp32, no
    autocast), in eval."""
    reference = copy.deepcopy(plain)
    reference.load_state_dict(model.state_dict())
    loaded.eval()
    reference.eval()
    with torch.no_grad():
        out = loaded(x)
        # Tolerance: a channels-last model is saved with channels-last weights (the layout
        # optimize() gave them), whose convolutions round differently from NCHW ones (fp32).
        torch.testing.assert_close(out, reference(x), rtol=1e-5, atol=1e-6)
        assert out.dtype == torch.float32


@pytest.mark.parametrize("name", CASES)
def test_torch_save_of_the_whole_model_loads_weights_only_as_the_users_model(name: str) -> None:
    model, plain, x = _optimized(name)
    if "regional" in name:
        assert all(block._compiled_call_impl is not None for block in model.blocks)
    data = _saved(model)
    assert not any("autoopt" in g for g in _globals(data))
    assert _globals(data) == _globals(_saved(plain))  # the classes the user allows, no others
    assert b"autoopt" not in data  # not even an attribute name
    loaded = _load_as_the_script_does(data, plain)
    _assert_plain_like(loaded, model, plain)
    _eval_outputs(loaded, model, plain, x)
    # Saving changed nothing on the live model: it still trains optimized.
    assert isinstance(vars(model)["forward"], PatchedForward)
    assert autoopt.report(model) is not None
    model.train()
    model(x).float().sum().backward()


def test_tied_weights_stay_tied() -> None:
    model, plain, _x = _optimized("checkpoint=auto, blocks")
    loaded = _load_as_the_script_does(_saved(model), plain)
    assert loaded.head.weight is loaded.embed.weight


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_at_every_protocol_is_the_users_model(protocol: int) -> None:
    model, plain, x = _optimized("all of them")
    data = pickle.dumps(model, protocol=protocol)
    assert b"autoopt" not in data
    # Byte for byte the pickle of the unoptimized model holding the same tensors.
    assert data == pickle.dumps(_with_state_of(plain, model), protocol=protocol)
    loaded = pickle.loads(data)
    _assert_plain_like(loaded, model, plain)
    _eval_outputs(loaded, model, plain, x)


def _with_state_of(plain: nn.Module, model: nn.Module) -> nn.Module:
    """The unoptimized model holding the trained model's tensors (same objects: same pickle)."""
    twin = copy.deepcopy(plain)
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    for name, tensor in tensors.items():
        owner, _, attr = name.rpartition(".")
        module = twin.get_submodule(owner)
        slot = module._parameters if attr in module._parameters else module._buffers
        slot[attr] = tensor
    twin.train(model.training)
    return twin


def test_a_deep_copy_is_still_optimized_and_its_pickle_is_plain() -> None:
    model, plain, x = _optimized("amp bf16")
    twin = copy.deepcopy(model)
    assert isinstance(vars(twin)["forward"], PatchedForward)
    assert vars(twin)["forward"].module is twin
    assert twin(x).dtype == torch.float32
    torch.testing.assert_close(twin(x), model(x))  # autocast, as the model: not the plain one
    loaded = _load_as_the_script_does(_saved(twin), plain)
    _assert_plain_like(loaded, twin, plain)


def _doubled(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return 2 * type(module).forward(module, x)


def _user_hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    return None


def test_the_users_own_forward_and_hooks_are_kept() -> None:
    """A forward the user set on the instance before optimize() is the loaded model's forward;
    the user's hooks stay with their flags, autoopt's hooks go."""
    torch.manual_seed(0)
    plain = MLP()
    model = copy.deepcopy(plain)
    model.forward = functools.partial(_doubled, model)  # type: ignore[method-assign]
    model.register_forward_pre_hook(_user_hook, with_kwargs=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = autoopt.optimize(
        model, None, optimizer, **{**OFF, "accumulate": 2, "compile_cache": False}
    )
    acc = Accumulator(2)
    model.register_forward_pre_hook(SyncOnLastMicroStep(acc), with_kwargs=False)
    model.register_forward_hook(SyncOnLastMicroStep(acc), with_kwargs=True, always_call=True)
    x = torch.randn(4, 16)
    loaded = pickle.loads(pickle.dumps(model))
    assert b"autoopt" not in pickle.dumps(model)
    assert list(loaded._forward_pre_hooks.values()) == [_user_hook]
    assert list(loaded._forward_pre_hooks_with_kwargs) == list(loaded._forward_pre_hooks)
    assert not loaded._forward_hooks and not loaded._forward_hooks_with_kwargs
    assert not loaded._forward_hooks_always_called
    assert isinstance(vars(loaded)["forward"], functools.partial)
    assert vars(loaded)["forward"].args == (loaded,)
    plain.load_state_dict(model.state_dict())
    torch.testing.assert_close(loaded(x), 2 * plain(x))


def test_accumulate_auto_micro_batches_leave_no_trace() -> None:
    """accumulate="auto" splits each batch under a memory budget, decided at the first forward."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    model = copy.deepcopy(plain)
    gen = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(96, 8, generator=gen), torch.randn(96, 1, generator=gen))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = data.tensors[0][:32].clone()
    budget = state_memory(model, optimizer).state + saved_tensor_bytes(lambda: model(batch[:8]))
    model, loader, optimizer = autoopt.optimize(
        model,
        DataLoader(data, batch_size=32),
        optimizer,
        accumulate="auto",
        memory_budget=budget,
        compile_cache=False,
        **OFF,
    )
    rows = []
    for xb, yb in loader:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(xb), yb).backward()
        optimizer.step()
        rows.append(len(xb))
    assert max(rows) < 32  # micro-batches ran
    data_bytes = _saved(model)
    assert b"autoopt" not in data_bytes
    loaded = _load_as_the_script_does(data_bytes, plain)
    _assert_plain_like(loaded, model, plain)
    _eval_outputs(loaded, model, plain, batch)


def test_what_counts_as_autoopts() -> None:
    """Objects, functions, partials and bound methods of autoopt's; not the user's or torch's."""
    model = MLP()
    hook = SyncOnLastMicroStep(Accumulator(2))
    assert is_autoopt(hook) and is_autoopt(SyncOnLastMicroStep) and is_autoopt(original_forward)
    assert is_autoopt(functools.partial(original_forward, model))
    assert is_autoopt(hook.__call__)  # a bound method of autoopt's object
    assert not is_autoopt(model) and not is_autoopt(model.forward) and not is_autoopt(_user_hook)
    assert not is_autoopt(functools.partial(_doubled, model)) and not is_autoopt(nn.Linear)


class _WithScripted(nn.Module):
    """A user's model holding a TorchScript submodule of its own making."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.scripted = torch.jit.script(nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scripted(self.a(x))


def test_a_class_with_its_own_deepcopy_keeps_it() -> None:
    """A ScriptModule deep-copies through its class's `__deepcopy__` (pickle refuses it): the
    optimized model holding one deep-copies as before optimize(), working and optimized."""
    torch.manual_seed(0)
    model = autoopt.optimize(_WithScripted(), **{**OFF, "amp": "bf16", "compile_cache": False})
    x = torch.randn(2, 4)
    twin = copy.deepcopy(model)
    assert isinstance(vars(twin)["forward"], PatchedForward)
    torch.testing.assert_close(twin(x), model(x))
    assert twin.scripted is not model.scripted
