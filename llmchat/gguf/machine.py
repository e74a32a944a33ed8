"""How much memory this machine has free: RAM from the OS, and each NVIDIA GPU's from nvidia-smi.

A probe of the machine, not of a model, so it sits below everything that compares a model's
footprint with it (`info`, `models list`, the model picker). No llama.cpp: it must answer
before, and without, a model load.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

NVIDIA_SMI_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class GpuMemory:
    name: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class SystemMemory:
    ram_total_bytes: int | None
    ram_available_bytes: int | None
    gpus: tuple[GpuMemory, ...] = ()

    @property
    def vram_free_bytes(self) -> int | None:
        """The most free memory on any one GPU (llmchat runs a model on one device)."""
        return max((gpu.free_bytes for gpu in self.gpus), default=None)


def system_memory() -> SystemMemory:
    total, available = _ram_from_proc() or _ram_from_sysconf()
    return SystemMemory(ram_total_bytes=total, ram_available_bytes=available, gpus=tuple(_nvidia_gpus()))


def _ram_from_proc() -> tuple[int, int] | None:
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return _kib(fields["MemTotal"]), _kib(fields["MemAvailable"])
    except (OSError, KeyError, ValueError):
        return None


def _kib(text: str) -> int:
    return int(text.strip().split()[0]) * 1024


def _ram_from_sysconf() -> tuple[int | None, int | None]:
    """Fallback without /proc (macOS, BSD): total pages; free pages where the OS reports them."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
    except (ValueError, OSError, AttributeError):
        return None, None
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * page
    except (ValueError, OSError, AttributeError):
        available = None
    return total, available


def _nvidia_gpus() -> list[GpuMemory]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        result = subprocess.run(
            [exe, "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if result.returncode != 0:
        return []
    return [gpu for line in result.stdout.splitlines() if (gpu := _parse_gpu_line(line)) is not None]


def _parse_gpu_line(line: str) -> GpuMemory | None:
    parts = [p.strip() for p in line.rsplit(",", 2)]
    if len(parts) != 3:
        return None
    try:
        mib = 1024 * 1024
        return GpuMemory(name=parts[0], total_bytes=int(float(parts[1]) * mib), free_bytes=int(float(parts[2]) * mib))
    except ValueError:
        return None
