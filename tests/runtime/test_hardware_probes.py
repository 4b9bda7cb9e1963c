"""bf16 hardware detection with both answers faked at torch's own probes (the CPU ISA checks,
`torch.cuda`'s capability queries), so each branch runs on any machine, not only the branch of
the machine running the tests. The helpers in `hardware` are the code under test, never the
oracle."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
import torch

import autoopt
from autoopt.diagnostics import doctor
from autoopt.runtime import hardware
from autoopt.runtime.passes import amp

from .models import MLP

CPU_PROBES = (
    "_is_avx2_supported",
    "_is_avx512_supported",
    "_is_avx512_bf16_supported",
    "_is_vnni_supported",
    "_is_amx_tile_supported",
    "_is_amx_fp16_supported",
)


def _clear() -> None:
    hardware.cpu_supports_bf16.cache_clear()
    hardware.cpu_features.cache_clear()


@pytest.fixture
def cpu_has(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Fake the CPU: `cpu_has(avx512_bf16=True)` makes only that probe answer yes."""

    def fake(**features: bool) -> None:
        for probe in CPU_PROBES:
            answer = features.get(probe.removeprefix("_is_").removesuffix("_supported"), False)
            monkeypatch.setattr(torch.cpu, probe, lambda a=answer: a, raising=False)
        _clear()

    _clear()
    yield fake
    monkeypatch.undo()
    _clear()  # the next test sees the real machine again


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Callable[[tuple[int, int]], list[object]]:
    """Fake one CUDA device of the given compute capability; returns the indices queried."""
    asked: list[object] = []

    def fake(capability: tuple[int, int]) -> list[object]:
        major, minor = capability
        props = SimpleNamespace(
            name="FakeGPU", total_memory=2**34, major=major, minor=minor, multi_processor_count=8
        )
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "FakeGPU")
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 0)
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 0)

        def capability_of(index: object = None) -> tuple[int, int]:
            asked.append(index)
            return capability

        monkeypatch.setattr(torch.cuda, "get_device_capability", capability_of)
        return asked

    return fake


@pytest.mark.parametrize(
    ("features", "native"),
    [
        ({}, False),
        ({"avx512": True, "vnni": True}, False),
        ({"avx512_bf16": True}, True),
        ({"amx_tile": True}, True),
    ],
)
def test_cpu_bf16_is_avx512_bf16_or_amx(cpu_has, features, native) -> None:
    cpu_has(**features)
    assert hardware.cpu_supports_bf16() is native


def test_cpu_bf16_when_torch_lacks_the_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    for probe in CPU_PROBES:
        monkeypatch.delattr(torch.cpu, probe, raising=False)
    _clear()
    try:
        assert hardware.cpu_supports_bf16() is False
        assert not any(hardware.cpu_features().values())
    finally:
        monkeypatch.undo()
        _clear()


@pytest.mark.parametrize(
    ("features", "dtype", "reason"),
    [
        ({"avx512_bf16": True}, torch.bfloat16, "CPU has AVX512-BF16"),
        ({"amx_tile": True, "avx512_bf16": True}, torch.bfloat16, "CPU has AMX"),
        ({"avx512": True}, None, "CPU has no native bf16"),
    ],
)
def test_amp_auto_on_either_cpu(cpu_has, features, dtype, reason) -> None:
    cpu_has(**features)
    chosen, why = amp.choose(MLP(), torch.device("cpu"), "auto")
    assert chosen == dtype and why.startswith(reason)
    result = autoopt.report(autoopt.optimize(MLP(), device="cpu", verbose=False))["amp"]
    assert result.status.value == ("applied" if dtype else "skipped")
    assert reason in result.detail


@pytest.mark.parametrize(
    ("capability", "native"), [((7, 5), False), ((8, 0), True), ((9, 0), True)]
)
def test_cuda_bf16_from_compute_capability_8(gpu, capability, native) -> None:
    asked = gpu(capability)
    assert hardware.cuda_supports_bf16(torch.device("cuda", 1)) is native
    assert hardware.cuda_supports_tf32(torch.device("cuda")) is native
    assert asked == [1, None]  # the device asked about, or the current one
    chosen, why = amp.choose(MLP(), torch.device("cuda", 0), "auto")
    if native:
        assert (chosen, why) == (torch.bfloat16, "FakeGPU has native bf16")
    else:
        assert chosen == torch.float16 and "no native bf16" in why


def test_no_cuda_means_no_cuda_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(
        torch.cuda, "get_device_capability", lambda *a: pytest.fail("asked without CUDA")
    )
    assert hardware.cuda_supports_bf16(torch.device("cuda", 0)) is False


@pytest.mark.parametrize("native", [False, True])
def test_doctor_reports_either_cpu(cpu_has, native: bool) -> None:
    cpu_has(avx512_bf16=native, avx2=True)
    cpu = doctor._cpu_info()
    assert cpu["native_bf16"] is native
    assert cpu["features"]["avx512_bf16"] is native and cpu["features"]["avx2"] is True


@pytest.mark.parametrize(("capability", "native"), [((7, 0), False), ((8, 6), True)])
def test_doctor_reports_either_gpu(gpu, capability, native: bool) -> None:
    gpu(capability)
    (device,) = doctor._cuda_devices()
    assert device["name"] == "FakeGPU" and device["capability"] == "{}.{}".format(*capability)
    assert device["bf16"] is native and device["tf32"] is native
