"""How a local model is opened: from the options, the config and the file's GGUF header to the
`EngineSettings` the engine loads it with (context size, flash attention, offload, KV type).

`llmchat.startup.loading` asks it twice for a one-shot: once to begin llama.cpp's load ahead, and once
where it loads. Both must get equal settings, so nothing here prints or depends on the moment.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from llmchat import paths
from llmchat.config import Config
from llmchat.defaults import DEFAULT_MAX_CTX
from llmchat.errors import UsageError
from llmchat.models.resolve import ResolvedModel
from llmchat.options import RunOptions

if TYPE_CHECKING:
    from llmchat.engine import EngineSettings
    from llmchat.gguf.metadata import GGUFMetadata

FLASH_ATTN_CHOICES = ("auto", "on", "off")


def check_flash_attn_for_kv(opts: RunOptions, config: Config) -> None:
    if opts.kv_type != "f16" and flash_attn_choice(opts, config)[0] == "off":
        raise UsageError(
            f"--kv-type {opts.kv_type} needs flash attention (a quantized V cache), but the config file "
            f"{config.path} sets flash_attn = false; pass --flash-attn on or use --kv-type f16"
        )


def checked_metadata(path: Path) -> GGUFMetadata:
    """The file's GGUF header, checked before llama.cpp sees the file: llama.cpp aborts the whole
    process on some malformed files (llmchat.gguf.loadable)."""
    from llmchat.gguf.header_cache import read_metadata_cached
    from llmchat.gguf.loadable import check_loadable

    metadata = read_metadata_cached(path)
    check_loadable(metadata, path)
    return metadata


def trained_context(metadata: GGUFMetadata) -> int:
    arch = metadata.scalars.get("general.architecture", "")
    return int(metadata.scalars.get(f"{arch}.context_length", 0) or 0)


def context_size(opts: RunOptions, model: ResolvedModel, metadata: GGUFMetadata) -> int:
    """The context a local model opens with, in tokens: --ctx, the config's for this model, else its
    trained context up to DEFAULT_MAX_CTX."""
    trained_ctx = trained_context(metadata)
    return opts.ctx or model.ctx or min(trained_ctx or DEFAULT_MAX_CTX, DEFAULT_MAX_CTX)


def engine_settings(
    opts: RunOptions, config: Config, model: ResolvedModel, metadata: GGUFMetadata, n_ctx_override: int | None = None
) -> EngineSettings:
    """How the engine opens `model`, from the options, the config and the file's header: the
    context size is decided here, once, and flash attention's `auto` resolved (engine.calibrate).
    Says nothing: `load_model` and `loading_ahead` both ask it, and must get equal settings."""
    from llmchat.engine import EngineSettings as Settings

    n_ctx = n_ctx_override or context_size(opts, model, metadata)
    fa_choice, fa_source = flash_attn_choice(opts, config)
    if fa_choice == "auto":
        from llmchat.engine.calibrate import choose

        picked = choose(
            model.path,
            kv_type=opts.kv_type,
            device=opts.device,
            gpu_layers=opts.gpu_layers,
            drafting=opts.lookup or opts.draft_model is not None,
            batched=opts.parallel > 1,
            threads=opts.threads,
            folder=paths.flash_attn_dir(),
        )
        flash_attn, fa_why = picked.flash_attn, picked.why
    else:
        flash_attn, fa_why = fa_choice == "on", fa_source
    return Settings(
        n_ctx=n_ctx,
        threads=opts.threads,
        batch_size=opts.batch_size,
        device=opts.device,
        gpu_layers=opts.gpu_layers,
        flash_attn=flash_attn,
        flash_attn_why=fa_why,
        kv_type=opts.kv_type,
        mmap=opts.mmap,
        mlock=opts.mlock,
        verbose=opts.verbose,
        lookup=opts.lookup,
        kv_shift=opts.kv_shift,
        draft_model=opts.draft_model,
        mmproj=projector_path(opts, model, metadata),
        ctx_checkpoints=opts.ctx_checkpoints,
        ctx_checkpoints_mib=opts.ctx_checkpoints_mib,
    )


def projector_path(opts: RunOptions, model: ResolvedModel, metadata: GGUFMetadata) -> Path | None:
    """The model's multimodal projector, checked before libmtmd sees it (llmchat.media.projector)."""
    from llmchat.media.projector import find_projector

    found = find_projector(opts.mmproj, model.path, metadata)
    return found.path if found is not None else None


def flash_attn_choice(opts: RunOptions, config: Config) -> tuple[str, str]:
    """auto | on | off, and where it came from: the flags, then the config, then auto."""
    if opts.no_flash_attn:
        return "off", "set by --no-flash-attn"
    if opts.flash_attn is not None:
        return opts.flash_attn, f"set by --flash-attn {opts.flash_attn}"
    if config.flash_attn is not None and config.flash_attn != "auto":
        return ("on" if config.flash_attn else "off"), f"set in the config ({config.path})"
    return "auto", ""
