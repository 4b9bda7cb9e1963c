"""What the hardware can do, asked once: shared by the passes and `autoopt doctor`."""

from __future__ import annotations

import functools
import os
import platform
from typing import Any

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


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which containers and taskset narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def available_host_memory() -> int:
    """Bytes of host memory available to new allocations (Linux MemAvailable); 0 if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_model() -> str:
    """The CPU's marketing name (from /proc/cpuinfo on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def signature(device: torch.device) -> dict[str, Any]:
    """What identifies the machine for a measured decision (tune's cache key)."""
    sig: dict[str, Any] = {"device": device.type, "threads": torch.get_num_threads()}
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        sig["gpu"] = torch.cuda.get_device_name(index)
        sig["capability"] = list(torch.cuda.get_device_capability(index))
    else:
        sig["cpu"] = cpu_model()
        sig["features"] = cpu_features()
    return sig


def module_device(module: torch.nn.Module) -> torch.device:
    """Where `module` lives: its first parameter's (else buffer's) device; CPU when it has none."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")
