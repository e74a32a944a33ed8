"""`llmchat info -m MODEL [--json]`: what a GGUF model is and how much memory it needs.

Reads only the file's header (no weights are loaded), so it is quick even for large models. The
runtime part asks the installed llama.cpp build which devices it can use.

`--json` prints one object on stdout. Its fields (sizes in bytes; null when unknown):

    path, file_size_bytes, gguf_version
    architecture, name, size_label        general.architecture / general.name / general.size_label
    parameter_count                       sum of all tensor element counts
    quantization, quantization_source     e.g. "Q4_K_M" from "general.file_type", else
                                          the "most common tensor type"
    trained_context                       <arch>.context_length
    layers, embedding_length
    heads, kv_heads                       the largest per-layer value
    heads_per_layer, kv_heads_per_layer   lists, only when they vary by layer (else null)
    head_dim_k, head_dim_v                <arch>.attention.key_length / value_length
    attention                             "MHA" | "GQA" | "MQA" | "mixed" | "none"
    sliding_window                        window in tokens, or null
    sliding_window_layers                 how many layers use it
    sliding_window_layout                 where that layout came from
    vocab_size, tensor_count, weights_bytes
    has_chat_template, chat_template_source
    kind, tools, kind_evidence            "base" | "instruct" | "reasoning", whether the template
                                          takes tools, and why (llmchat/models/kind.py)
    kv_bytes_per_token                    {"f16": .., "q8_0": .., "q4_0": ..}, full-context layers
    contexts                              list, one per context length (4k, 8k, 32k, 128k, trained):
        n_ctx, beyond_trained,
        kv_bytes        f16 KV cache as llama.cpp allocates it by default (full-size SWA layers)
        kv_bytes_swa    with swa_full=false (sliding-window layers keep only their window)
        compute_bytes   compute + output buffer estimate (see llmchat/gguf/footprint.py)
        total_bytes     weights + kv_bytes + compute_bytes;  total_bytes_swa likewise
        fits_ram        total_bytes <= MemAvailable (null if unknown)
        fits_vram       total_bytes <= free memory of the emptiest GPU (null without a GPU)
    memory                                {ram_total_bytes, ram_available_bytes,
                                           gpus: [{name, total_bytes, free_bytes}]}
    runtime                               what `ask`/`chat` would run on with default flags:
        gpu_offload       this llama-cpp-python build has a GPU backend (CUDA, Metal, Vulkan...)
        devices           [{name, description, kind, free_bytes, total_bytes}] from ggml
        cpu_features      SIMD features of the CPU backend (AVX2, AVX512, NEON...)
        offload_layers    layers --device auto offloads (repeating layers + output), 0 on CPU
        flash_attn        what ask would use: the config's setting, or what `auto` picks
        flash_attn_why    why (auto: measured by `llmchat bench --calibrate`, or the default)
    media                                 {projector, vision, audio}: the mmproj*.gguf beside the
                                          model that fits it (null: none; the model sees text only)
    notes                                 list of sentences: how the figures were computed
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

if TYPE_CHECKING:
    from rich.text import Text

    from llmchat.config import Config
    from llmchat.env import Environment


def info(
    model: Optional[str] = typer.Option(
        None, "-m", "--model", help="Model: a .gguf path, a name in the models folder, or a config alias."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Show a model's architecture, KV-cache size and memory needs (reads the GGUF header only)."""
    from llmchat.env import current_environment
    from llmchat.gguf.loadable import check_loadable
    from llmchat.gguf.model_report import model_report
    from llmchat.gguf.reader import read_metadata
    from llmchat.models.kind import kind_of

    env = current_environment()
    path = resolve_model_path(model, env.config)
    meta = read_metadata(path)
    check_loadable(meta)
    runtime = runtime_report(meta, env)
    report = model_report(meta, _with_ggml_gpus(runtime))
    kind = kind_of(meta, [model] if model else [])
    media = media_report(path, meta)
    if as_json:
        import json

        record = report.to_json() | kind.to_json() | {"runtime": runtime, "media": media}
        typer.echo(json.dumps(record, indent=2), file=env.stdout)
    else:
        _print_report(report, runtime, kind, env, media)


def media_report(path: Path, meta: Any) -> dict:
    """Whether the model sees or hears: the projector beside it that fits it (llmchat.media.projector)."""
    from llmchat.media.projector import find_projector

    found = find_projector(None, path, meta)
    return {
        "projector": str(found.path) if found else None,
        "vision": bool(found and found.vision),
        "audio": bool(found and found.audio),
    }


def runtime_report(meta: Any, env: Environment) -> dict:
    """The installed llama.cpp build's devices, how many of this model's layers it would offload,
    and the flash-attention setting `ask` would use (the config's, or what `auto` picks)."""
    from llmchat.engine import devices

    config_flash_attn = env.config.flash_attn
    if config_flash_attn in (None, "auto"):
        from llmchat.engine.calibrate import choose

        picked = choose(
            Path(meta.path),
            kv_type="f16",
            device="auto",
            gpu_layers=None,
            drafting=False,
            threads=None,
            folder=env.flash_attn_dir,
        )
        flash_attn, why = picked.flash_attn, picked.why
    else:
        flash_attn, why = bool(config_flash_attn), "the config file's flash_attn"
    found = devices.devices()
    gpu = devices.can_offload() and any(d.is_gpu for d in found)
    n_layers = int(meta.arch_get("block_count") or 0)
    return {
        "gpu_offload": gpu,
        "devices": [dict(d.__dict__) for d in found],
        "cpu_features": devices.cpu_features(),
        "offload_layers": n_layers + 1 if gpu else 0,  # llama.cpp counts the output layer too
        "flash_attn": flash_attn,
        "flash_attn_why": why,
    }


def _with_ggml_gpus(runtime: dict) -> Any:
    """Free VRAM from nvidia-smi, or else from ggml's own devices (Metal, Vulkan, ROCm)."""
    from llmchat.gguf.machine import GpuMemory, system_memory

    memory = system_memory()
    if memory.gpus or not runtime["gpu_offload"]:
        return memory
    gpus = tuple(
        GpuMemory(name=d["description"] or d["name"], total_bytes=d["total_bytes"], free_bytes=d["free_bytes"])
        for d in runtime["devices"]
        if d["kind"] in ("GPU", "iGPU") and d["total_bytes"]
    )
    return dataclasses.replace(memory, gpus=gpus)


def resolve_model_path(requested: str | None, config: Config) -> Path:
    """`-m` to a file path, by the one resolver chat uses (aliases, models folder, default model)."""
    from llmchat.models.resolve import resolve_model

    return resolve_model(requested, config).path


# ---------------------------------------------------------------------------------------------
# Human output


def _runtime_line(runtime: dict) -> str:
    features = ", ".join(
        f for f in runtime["cpu_features"] if f in ("AVX2", "AVX512", "AMX_INT8", "NEON", "SVE", "SME")
    )
    cpu = "CPU" + (f" ({features})" if features else "")
    if not runtime["gpu_offload"]:
        return (
            f"runtime: llama.cpp on the {cpu}; this llama-cpp-python build has no GPU backend, so no layer is offloaded"
        )
    gpus = ", ".join(f"{d['name']} ({d['description']})" for d in runtime["devices"] if d["kind"] in ("GPU", "iGPU"))
    return f"runtime: {gpus}; --device auto offloads all {runtime['offload_layers']} layers (the output layer included)"


def _print_report(report: Any, runtime: dict, kind: Any, env: Environment, media: dict | None = None) -> None:
    from llmchat.ui.safe_console import safe_console

    # The name, the architecture and the notes come from the file's metadata: no markup, and
    # made terminal-safe on a terminal (llmchat.ui.safe_console).
    console = safe_console(env.stdout, on_terminal=env.stdout_isatty)
    console.print(_overview_table(report, kind, media))
    console.print(_kv_per_token_table(report))
    console.print(_contexts_table(report))
    console.print(_machine_line(report))
    console.print(_runtime_line(runtime))
    for note in report.notes:
        console.print(f"• {note}", style="dim")


def _overview_table(report: Any, kind: Any = None, media: dict | None = None) -> Any:
    from rich.table import Table

    table = Table(title=report.name or Path(report.path).name, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    rows = [
        ("file", f"{report.path} ({_size(report.file_size_bytes)}, GGUF v{report.gguf_version})"),
        ("architecture", report.architecture or "?"),
        ("size label", report.size_label or "-"),
        ("parameters", _count(report.parameter_count)),
        ("quantization", f"{report.quantization} ({report.quantization_source})"),
        ("weights", _size(report.weights_bytes)),
        ("trained context", f"{report.trained_context:,}" if report.trained_context else "?"),
        ("layers", str(report.layers)),
        ("embedding", str(report.embedding_length or "?")),
        ("attention", f"{report.attention}: {report.heads} heads, {report.kv_heads} KV heads"),
        ("head dims", f"K {report.head_dim_k}, V {report.head_dim_v}"),
        ("sliding window", _sliding_window(report)),
        ("vocabulary", f"{report.vocab_size:,} tokens"),
        ("chat template", report.chat_template_source),
    ]
    if kind is not None:  # base / instruct / reasoning (llmchat/models/kind.py)
        rows.append(("kind", f"{kind.label} ({kind.why})"))
    if media is not None:
        senses = " and ".join(s for s, on in (("images", media["vision"]), ("audio", media["audio"])) if on)
        seen = (
            f"{senses} ({Path(media['projector']).name})"
            if media["projector"]
            else "text only (no mmproj*.gguf beside it)"
        )
        rows.append(("media", seen))
    for label, value in rows:
        table.add_row(label, value)
    return table


def _sliding_window(report: Any) -> str:
    if not report.sliding_window:
        return "none"
    return f"{report.sliding_window} tokens on {report.sliding_window_layers} of {report.layers} layers"


def _kv_per_token_table(report: Any) -> Any:
    from rich.table import Table

    table = Table(title="KV cache per token", title_justify="left")
    for cache_type in report.kv_bytes_per_token:
        table.add_column(cache_type, justify="right")
    table.add_row(*(f"{b:,} B" for b in report.kv_bytes_per_token.values()))
    return table


def _contexts_table(report: Any) -> Any:
    from rich.table import Table

    has_swa = bool(report.sliding_window)
    has_gpu = bool(report.memory.gpus)
    table = Table(title="Memory by context length (f16 KV cache)", title_justify="left")
    table.add_column("context", justify="right")
    table.add_column("KV cache", justify="right")
    if has_swa:
        table.add_column("KV (swa_full=false)", justify="right")
    table.add_column("compute", justify="right")
    table.add_column("total", justify="right")
    table.add_column("fits RAM")
    if has_gpu:
        table.add_column("fits VRAM")
    for ctx in report.contexts:
        label = f"{ctx.n_ctx:,}" + (" *" if ctx.beyond_trained else "")
        row: list[str | Text] = [label, _size(ctx.kv_bytes)]
        if has_swa:
            row.append(_size(ctx.kv_bytes_swa))
        row += [_size(ctx.compute_bytes), _size(ctx.total_bytes), _yes_no(ctx.fits_ram)]
        if has_gpu:
            row.append(_yes_no(ctx.fits_vram))
        table.add_row(*row)
    if any(c.beyond_trained for c in report.contexts):
        table.caption = "* beyond the trained context"
    return table


def _machine_line(report: Any) -> str:
    memory = report.memory
    parts = [f"RAM available: {_size(memory.ram_available_bytes)} of {_size(memory.ram_total_bytes)}"]
    for gpu in memory.gpus:
        parts.append(f"GPU {gpu.name}: {_size(gpu.free_bytes)} free of {_size(gpu.total_bytes)}")
    if not memory.gpus:
        parts.append("no GPU found")
    return "; ".join(parts)


def _yes_no(value: bool | None) -> Text:
    from rich.text import Text

    if value is None:
        return Text("?")
    return Text("yes", style="green") if value else Text("no", style="red")


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _count(n: int) -> str:
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit} ({n:,})"
    return f"{n:,}"
