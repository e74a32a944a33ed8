"""Open a GGUF file with llama.cpp as `EngineSettings` ask: threads, offload, KV type, and failures
as one line.

`Engine.load` (engine.core) opens the model, and the draft model for `--draft-model`, through
`open_model`; what is decided before a load (how many threads, how many layers on the GPU) and
what is said after it (where the model runs) lives here with it, apart from the engine that then
uses the model.
"""

from __future__ import annotations

import ctypes
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from llmchat import interrupts
from llmchat.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CTX_CHECKPOINTS,
    DEFAULT_CTX_CHECKPOINTS_MIB,
    DEFAULT_MAX_CTX,
)
from llmchat.engine import logs
from llmchat.engine.bindings import llama_cpp
from llmchat.engine.devices import cpu_has_amx
from llmchat.engine.native import LoadedModel
from llmchat.errors import ModelError, UsageError

KV_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0}


def physical_cores() -> int:
    """Physical cores, not logical CPUs: decode is memory-bound and hyperthreads only add contention.

    llama-cpp-python's own default (half the logical CPUs) measured about 40% slower decode on a
    2-core machine.
    """
    try:
        cores = set()
        physical = core = None
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("physical id"):
                    physical = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                elif not line.strip() and core is not None:
                    cores.add((physical, core))
                    physical = core = None
        if core is not None:
            cores.add((physical, core))
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if cores:
            return max(1, min(len(cores), usable))
    except OSError:
        pass
    return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class EngineSettings:
    n_ctx: int | None = None  # None: min(trained context, DEFAULT_MAX_CTX)
    threads: int | None = None  # None: physical cores
    batch_size: int = DEFAULT_BATCH_SIZE
    device: str = "auto"  # auto | cpu | gpu
    gpu_layers: int | None = None  # None: all when the build can offload (auto/gpu), 0 on cpu
    flash_attn: bool = True  # llama.cpp's own -fa auto picks it on CPU; see Engine.load
    flash_attn_why: str = ""  # how `--flash-attn auto` decided (llmchat.engine.calibrate); "" when set by hand
    kv_type: str = "f16"  # f16 | q8_0 | q4_0, for both K and V
    mmap: bool = True
    mlock: bool = False
    verbose: bool = False
    lookup: bool = False  # prompt-lookup n-gram drafting
    kv_shift: bool = True  # after a trim, shift the kept cache instead of prefilling it again
    draft_model: Path | None = None
    draft_tokens: int = 16  # the most drafted tokens per pass; the length adapts below it
    mmproj: Path | None = None  # the multimodal projector, checked (llmchat.media.projector); opened on first media
    ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS  # recurrent-state checkpoints (engine.checkpoints); 0: none
    ctx_checkpoints_mib: int = DEFAULT_CTX_CHECKPOINTS_MIB  # and the most memory they take


def backend_notice(gpu_layers: int, threads: int) -> str:
    """Where the model runs, as llama.cpp reported it during this load."""
    from llmchat.engine.devices import devices

    cpu = f"CPU, {threads} threads"
    gpus = [d for d in devices() if d.is_gpu]
    if not gpus:
        return f"backend: {cpu} (this llama-cpp-python build has no GPU backend)"
    names = ", ".join(f"{d.name} ({d.description})" for d in gpus)
    if gpu_layers == 0:
        return f"backend: {cpu}; GPU {names} not used (--device cpu or --gpu-layers 0)"
    done = logs.offloaded
    layers = f"{done['layers']}/{done['of']} layers offloaded" if done else "offload requested"
    return f"backend: {names}: {layers}; the rest on {cpu}"


def layers_to_offload(settings: EngineSettings) -> int:
    """llama.cpp's n_gpu_layers for these settings: -1 (every layer) where the build can offload."""
    can_offload = bool(llama_cpp.llama_supports_gpu_offload())
    if settings.device == "gpu" and not can_offload:
        raise UsageError(
            "--device gpu: this llama-cpp-python build has no GPU support; reinstall it with "
            "CMAKE_ARGS='-DGGML_CUDA=on' (NVIDIA) or '-DGGML_METAL=on' (Apple), or use --device cpu"
        )
    if settings.device == "cpu":
        return 0
    if settings.gpu_layers is not None:
        return settings.gpu_layers if can_offload else 0
    return -1 if can_offload else 0


def open_arguments(settings: EngineSettings, *, output_window: int = 1) -> dict[str, Any]:
    """What `open_model` is given for the main model under `settings` (beside its path): how many
    threads, how many layers on the GPU, the KV type. One place, so that a load begun ahead
    (engine.load_ahead) and `Engine.load` agree on what they open."""
    return {
        "threads": settings.threads or physical_cores(),  # at most; engine.threads may run fewer
        "gpu_layers": layers_to_offload(settings),
        "settings": settings,
        "flash_attn": settings.flash_attn,
        "kv_type": KV_TYPES[settings.kv_type],
        "output_window": output_window,
    }


def open_model(
    model_path: Path,
    *,
    threads: int,
    gpu_layers: int,
    settings: EngineSettings,
    flash_attn: bool,
    kv_type: int | None = None,
    output_window: int = 1,
) -> LoadedModel:
    logs.recent_errors.clear()
    logs.offloaded.clear()
    try:
        model = LoadedModel(
            model_path,
            n_ctx=settings.n_ctx or 0,
            max_ctx=DEFAULT_MAX_CTX,
            n_batch=settings.batch_size,
            threads=threads,
            gpu_layers=gpu_layers,
            mmap=settings.mmap,
            mlock=settings.mlock,
            flash_attn=flash_attn,
            kv_type=kv_type,
            extra_buffer_types=not cpu_has_amx(),
            progress_callback=_KEEP_LOADING,
            output_window=output_window,
            checkpoints=settings.ctx_checkpoints,
            checkpoint_bytes=settings.ctx_checkpoints_mib << 20,
        )
    except (ValueError, RuntimeError, OSError) as err:
        interrupts.raise_pending()  # a load aborted by Ctrl-C is an interruption, not a bad file
        reason = logs.first_error() or str(err)
    else:
        try:
            interrupts.raise_pending()  # the signal came in the load's last callbacks
        except BaseException:
            model.close()
            raise
        return model
    reason = " ".join(reason.split())  # one line, whatever the library said
    lowered = reason.lower()
    if "context" in lowered or "alloc" in lowered or "memory" in lowered:
        advice = "try a smaller --ctx"
    else:
        advice = "the file may be damaged or need a newer llama-cpp-python; check it, or download it again"
    raise ModelError(f"llama.cpp could not load {model_path}: {reason}; {advice}")


@interrupts.native_callback
def _keep_loading(progress: float, user_data: ctypes.c_void_p) -> bool:
    """llama.cpp's load progress callback: returning false aborts the load. A Ctrl-C or SIGTERM
    during the load lands in one of llama.cpp's callbacks and is only recorded there
    (llmchat.interrupts); this is how it stops the load at once instead of after it."""
    return not interrupts.pending() and not _stopping.is_set()


# Set while a load on another thread (engine.load_ahead) is being cancelled: that load stops at its
# next progress callback, as for a signal.
_stopping = threading.Event()


@contextmanager
def loads_stopped() -> Iterator[None]:
    """Within this block, any load in flight stops at its next progress callback."""
    _stopping.set()
    try:
        yield
    finally:
        _stopping.clear()


_KEEP_LOADING = llama_cpp.llama_progress_callback(_keep_loading)  # module-level: ctypes keeps it alive
