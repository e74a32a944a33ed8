"""What this llama-cpp-python build can run on: ggml's backend devices, and the CPU features.

llama-cpp-python binds llama.h but not ggml's device registry, so the few functions needed are
declared here on the same shared library (libllama links ggml, so its handle resolves them).
Answers come from the build itself, so they hold for CUDA, Metal, Vulkan or CPU-only wheels alike.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass

from llmchat.engine.bindings import LIBRARY_VERSION, llama_cpp

# enum ggml_backend_dev_type
_DEVICE_KINDS = {0: "CPU", 1: "GPU", 2: "iGPU", 3: "accelerator", 4: "meta"}


@dataclass(frozen=True)
class Device:
    name: str  # ggml's name: CPU, CUDA0, Metal, Vulkan0...
    description: str  # e.g. the CPU model or "NVIDIA H200"
    kind: str  # CPU | GPU | iGPU | accelerator
    free_bytes: int
    total_bytes: int

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("GPU", "iGPU")


def _bind():
    lib = llama_cpp._lib
    try:
        functions = {
            name: getattr(lib, name)
            for name in (
                "ggml_backend_dev_count",
                "ggml_backend_dev_get",
                "ggml_backend_dev_name",
                "ggml_backend_dev_description",
                "ggml_backend_dev_type",
                "ggml_backend_dev_memory",
            )
        }
    except AttributeError:
        return None
    functions["ggml_backend_dev_count"].restype = ctypes.c_size_t
    functions["ggml_backend_dev_get"].argtypes = [ctypes.c_size_t]
    functions["ggml_backend_dev_get"].restype = ctypes.c_void_p
    for name in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        functions[name].argtypes = [ctypes.c_void_p]
        functions[name].restype = ctypes.c_char_p
    functions["ggml_backend_dev_type"].argtypes = [ctypes.c_void_p]
    functions["ggml_backend_dev_type"].restype = ctypes.c_int
    functions["ggml_backend_dev_memory"].argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    functions["ggml_backend_dev_memory"].restype = None
    return functions


def devices() -> list[Device]:
    """Every device the build registered (loading backends first, as llama.cpp does on model load)."""
    llama_cpp.llama_backend_init()
    f = _bind()
    if f is None:
        return []
    found = []
    for index in range(f["ggml_backend_dev_count"]()):
        dev = f["ggml_backend_dev_get"](index)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        f["ggml_backend_dev_memory"](dev, ctypes.byref(free), ctypes.byref(total))
        found.append(
            Device(
                name=(f["ggml_backend_dev_name"](dev) or b"?").decode(errors="replace"),
                description=(f["ggml_backend_dev_description"](dev) or b"").decode(errors="replace").strip(),
                kind=_DEVICE_KINDS.get(f["ggml_backend_dev_type"](dev), "other"),
                free_bytes=int(free.value),
                total_bytes=int(total.value),
            )
        )
    return found


def can_offload() -> bool:
    return bool(llama_cpp.llama_supports_gpu_offload())


def cpu_features() -> list[str]:
    """The SIMD features the CPU backend was built with and found (AVX2, AVX512, NEON...)."""
    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    cpu = re.search(r"CPU : (.*?)(?:\|\s*[A-Za-z]+ : |$)", info)
    if not cpu:
        return []
    return [name.strip() for name, value in re.findall(r"([A-Z0-9_]+) = (\d+)", cpu.group(1)) if value != "0"]


def _ggml_string(name: str) -> str | None:
    """A version string ggml exports (`ggml_version`, `ggml_commit`), where this build has it."""
    try:
        function = getattr(llama_cpp._lib, name)
    except AttributeError:
        return None
    function.argtypes = []
    function.restype = ctypes.c_char_p
    value = function()
    return value.decode(errors="replace") if value else None


def runtime_versions() -> list[str]:
    """`llmchat --version`: the binding, the llama.cpp (ggml) it was built from, and the backend."""
    ggml = _ggml_string("ggml_version")
    commit = _ggml_string("ggml_commit")
    built = " ".join(part for part in (ggml, f"(commit {commit})" if commit and commit != "unknown" else None) if part)
    gpus = [d for d in devices() if d.is_gpu]
    backend = (
        ", ".join(f"{d.name} ({d.description})" for d in gpus) if gpus else "CPU only (no GPU backend in this build)"
    )
    features = ", ".join(f for f in cpu_features() if f in ("AVX2", "AVX512", "AMX_INT8", "NEON", "SVE", "SME"))
    return [
        f"llama-cpp-python {LIBRARY_VERSION}",
        f"llama.cpp (ggml) {built or 'version not exported by this build'}",
        f"backend: {backend}" + (f"; CPU features {features}" if features else ""),
    ]


def cpu_has_amx() -> bool:
    """Whether the CPU advertises Intel AMX (Sapphire Rapids and later).

    A `-march=native` build then includes ggml's AMX matmul kernels, offered as an "extra buffer
    type". On this project's CI VMs (Xeon with amx_tile/amx_int8 in cpuinfo) they die with SIGILL
    on `tileloadd` at the first multi-token prefill, even with the tile-data permission granted;
    the same model runs fine without the extra buffer types. So where AMX is advertised, llmchat
    loads without them (`use_extra_bufts = false`, llama.cpp's `--no-extra-bufts`).
    """
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return "amx_tile" in line.split()
    except OSError:
        pass
    return False
