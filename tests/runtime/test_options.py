"""optimize() input validation: clear errors naming the option and what is allowed."""

from __future__ import annotations

import pytest
import torch

import autoopt
from autoopt.runtime.options import Options

from .models import MLP


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [
        ("amp", "fp8", "'auto', 'bf16', 'fp16', 'script', False"),
        ("amp", True, "'auto', 'bf16', 'fp16', 'script', False"),
        ("compile", "max", "'auto', True, False, 'jit'"),
        ("compile", 1, "'auto', True, False, 'jit'"),  # 1 == True, but it is not True
        ("compile", "max_autotune", "'jit', 'max-autotune', 'reduce-overhead'"),  # torch's spelling
        ("channels_last", "yes", "'auto', True, False"),
        ("checkpoint", 0, "an int >= 1"),
        ("checkpoint", True, "an int >= 1"),
        ("distributed", 0, "'auto', True, False, 'ddp', 'fsdp'"),
        ("accumulate", 0, "'auto', an int >= 1"),
        ("accumulate", "max", "'auto', an int >= 1"),
        ("accumulate", True, "'auto', an int >= 1"),
        ("distributed", "nccl", "'auto', True, False, 'ddp', 'fsdp'"),
        ("distributed", "FSDP", "'auto', True, False, 'ddp', 'fsdp'"),
        ("deterministic", "yes", "True, False"),
    ],
)
def test_bad_option_values_name_the_option_and_allowed_values(
    option: str, value: object, allowed: str
) -> None:
    with pytest.raises(ValueError) as err:
        autoopt.optimize(MLP(), **{option: value}, verbose=False)
    message = str(err.value)
    assert f"optimize({option}={value!r})" in message
    assert allowed in message


def test_bad_device_string_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"optimize\(device='gpu0'\)"):
        autoopt.optimize(MLP(), device="gpu0", verbose=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="CUDA is not available"):
        autoopt.optimize(MLP(), device="cuda", verbose=False)


def test_valid_options_are_accepted() -> None:
    opts = Options(amp="fp16", compile="jit", channels_last=False, checkpoint=3, accumulate=4)
    assert opts.checkpoint == 3
    assert "amp" in Options.names()
    assert Options(distributed="fsdp").distributed == "fsdp"
    assert Options(distributed="ddp").distributed == "ddp"


def test_non_module_model_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="needs a torch.nn.Module, got function"):
        autoopt.optimize(lambda x: x, verbose=False)  # type: ignore[arg-type]


def test_optimizer_over_other_parameters_is_rejected() -> None:
    model, other = MLP(), MLP()
    optimizer = torch.optim.SGD(other.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="not parameters of the model"):
        autoopt.optimize(model, optimizer=optimizer, verbose=False)


def test_non_optimizer_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="needs a torch.optim.Optimizer"):
        autoopt.optimize(MLP(), optimizer=object(), verbose=False)  # type: ignore[arg-type]


def test_optimizing_twice_is_rejected() -> None:
    model = autoopt.optimize(MLP(), verbose=False)
    with pytest.raises(ValueError, match="already applied"):
        autoopt.optimize(model, verbose=False)
