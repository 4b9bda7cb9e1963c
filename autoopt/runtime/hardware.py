"""What the hardware can do, asked once: shared by the passes and `autoopt doctor`."""

from __future__ import annotations

import functools

import torch


@functools.cache
def cpu_supports_bf16() -> bool:
    """The CPU has native bf16 math (AVX512-BF16 or AMX), where bf16 autocast pays off."""
    cpu = torch.cpu
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(cpu, name, lambda: False)() for name in checks)


@functools.cache
def cpu_features() -> dict[str, bool]:
    """The ISA features that matter to torch's CPU kernels."""
    names = {
        "avx2": "_is_avx2_supported",
        "avx512": "_is_avx512_supported",
        "avx512_bf16": "_is_avx512_bf16_supported",
        "vnni": "_is_vnni_supported",
        "amx_tile": "_is_amx_tile_supported",
        "amx_fp16": "_is_amx_fp16_supported",
    }
    return {k: bool(getattr(torch.cpu, v, lambda: False)()) for k, v in names.items()}


def cuda_supports_bf16(device: torch.device | None = None) -> bool:
    """The CUDA device computes in bf16 natively (Ampere, compute capability 8.0, or newer)."""
    if not torch.cuda.is_available():
        return False
    index = device.index if device is not None and device.index is not None else None
    major, _ = torch.cuda.get_device_capability(index)
    return major >= 8


def cuda_supports_tf32(device: torch.device | None = None) -> bool:
    """TF32 tensor cores exist from Ampere (8.0) on."""
    return cuda_supports_bf16(device)
