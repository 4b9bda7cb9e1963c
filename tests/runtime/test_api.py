"""optimize() end to end: the user's unchanged loop trains; clean exits; the return contract."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import autoopt

from .models import MLP, SmallCNN, batches, cnn_data, mlp_data, train
from .plain_loop import amp_dtype, assert_same_training, step_configs, train_by_hand


@pytest.mark.parametrize(
    ("make", "data", "lr"),
    [(SmallCNN, cnn_data, 0.01), (MLP, mlp_data, 0.01)],
    ids=["cnn", "mlp"],
)
@pytest.mark.parametrize("amp", ["auto", "fp16"])
def test_the_unchanged_loop_trains(
    make: type[nn.Module], data: object, lr: float, amp: str
) -> None:
    torch.manual_seed(0)
    model = make()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    x, y = data(128)  # type: ignore[operator]
    model, loader, optimizer = autoopt.optimize(
        model, batches(x, y, 32), optimizer, amp=amp, verbose=False
    )
    losses = train(model, optimizer, loader, epochs=5)  # zero_grad/backward/clip/step as written
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-4:]) < 0.75 * sum(losses[:4])
    # The same loop in plain torch (autocast + GradScaler for what amp chose; with "auto", each
    # step in the layout and precision the trials ran it under) trains the same.
    chosen = autoopt.report(model)["amp"]
    dtype = amp_dtype(chosen.detail, chosen.status.value == "applied")
    assert dtype == (torch.float16 if amp == "fp16" else dtype)
    configs = step_configs(model, len(losses))
    if any(c.get("amp") == "bf16" for c in configs):
        dtype = torch.bfloat16  # the tolerance of the steps that ran in bf16
    expected = train_by_hand(
        reference,
        torch.optim.AdamW(reference.parameters(), lr=lr),
        batches(x, y, 32),
        5,
        dtype=dtype if amp == "fp16" else None,
        configs=configs,
    )
    assert_same_training(losses, expected, dtype)


def test_state_dict_keys_and_unwrap() -> None:
    torch.manual_seed(0)
    model = SmallCNN()
    keys = list(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    # amp pinned: with "auto" the first steps take turns in bf16 and fp32 (trials), and two
    # steps end before the trials do.
    fast, optimizer = autoopt.optimize(model, optimizer=optimizer, amp="bf16", verbose=False)
    x, y = cnn_data(32)
    train(fast, optimizer, batches(x, y, 16))

    assert list(fast.state_dict()) == keys
    plain = SmallCNN()
    plain.load_state_dict(fast.state_dict())  # strict: same keys, same shapes
    plain.eval(), fast.eval()
    for key, value in fast.state_dict().items():  # the trained values themselves
        assert torch.equal(plain.state_dict()[key], value), key
    # The plain model under torch's own autocast (what amp chose) gives fast's outputs; the 1e-5
    # covers channels_last convolutions summing in another order (seen: exact).
    chosen = autoopt.report(fast)["amp"]
    dtype = amp_dtype(chosen.detail, chosen.status.value == "applied")
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=bool(dtype)):
        expected = plain(x).float()
    with torch.no_grad():
        torch.testing.assert_close(fast(x), expected, rtol=1e-5, atol=1e-5)

    original = autoopt.unwrap(fast)
    assert original is model and type(original) is SmallCNN
    trained = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert {id(p) for p in original.parameters()} == trained


def test_return_contract() -> None:
    model = MLP()
    assert autoopt.optimize(model, verbose=False) is model
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    got = autoopt.optimize(model, optimizer=optimizer, verbose=False)
    assert got == (model, optimizer)
    model = MLP()
    got_model, loader = autoopt.optimize(model, [(torch.randn(2, 16), 0)], verbose=False)
    assert got_model is model and len(list(loader)) == 1


def test_the_optimized_model_keeps_its_type_and_attributes() -> None:
    model = copy.deepcopy(SmallCNN())
    model.custom = "kept"
    fast = autoopt.optimize(model, verbose=False)
    assert isinstance(fast, SmallCNN) and fast.custom == "kept"
    assert fast.head is model.head
