"""From command-line options to a ready ChatSession: config, model file, checks, engine, template.

This is where the order of precedence lives (flags > config > model defaults > ours) and where the
one-time notices are printed (bundled default model, context above the trained length).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmchat.config import Config, load_config
from llmchat.errors import UsageError
from llmchat.models.resolve import ResolvedModel, resolve_model
from llmchat.options import RunOptions
from llmchat.output import is_tty, notice
from llmchat.sampling import SamplingParams, build_sampling, preset_values

if TYPE_CHECKING:
    from llmchat.engine import Engine, EngineSettings
    from llmchat.session import ChatSession

MIN_CTX = 64
DEFAULT_MAX_CTX = 8192  # the default window: the trained context, at most this


@dataclass
class Loaded:
    config: Config
    model: ResolvedModel
    engine: Engine
    sampling: SamplingParams
    trained_ctx: int


def validate_options(opts: RunOptions) -> None:
    """Fail fast, before the model loads, on values that can never work (exit 2)."""
    if opts.ctx is not None and opts.ctx < MIN_CTX:
        raise UsageError(f"--ctx must be at least {MIN_CTX} tokens, got {opts.ctx}")
    if opts.threads is not None and opts.threads < 1:
        raise UsageError(f"--threads must be at least 1, got {opts.threads}")
    if opts.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {opts.batch_size}")
    if opts.device not in ("auto", "cpu", "gpu"):
        raise UsageError(f"--device must be auto, cpu or gpu, got {opts.device!r}")
    if opts.kv_type not in ("f16", "q8_0", "q4_0"):
        raise UsageError(f"--kv-type must be f16, q8_0 or q4_0, got {opts.kv_type!r}")
    if opts.kv_type != "f16" and opts.flash_attn is False:
        raise UsageError(
            f"--kv-type {opts.kv_type} needs flash attention (a quantized V cache); drop --no-flash-attn or use --kv-type f16"
        )
    if opts.preset is not None:
        preset_values(opts.preset)
    if opts.lookup and opts.draft_model is not None:
        raise UsageError("--lookup and --draft-model are two kinds of drafting; choose one")
    if opts.draft_model is not None and not opts.draft_model.is_file():
        raise UsageError(f"--draft-model {opts.draft_model} is not a file; pass a .gguf path")
    sampling_flags(opts)  # validates the sampling values


def sampling_flags(opts: RunOptions) -> dict[str, Any]:
    flags = {
        "temperature": opts.temperature,
        "top_p": opts.top_p,
        "top_k": opts.top_k,
        "min_p": opts.min_p,
        "repeat_penalty": opts.repeat_penalty,
        "max_tokens": opts.max_tokens,
        "seed": opts.seed,
    }
    flags = {k: v for k, v in flags.items() if v is not None}
    build_sampling(flags=flags)  # raises UsageError on a bad value
    return flags


def check_template_choice(choice: str | None) -> None:
    """An unknown --template is a usage error (exit 2) before any model is loaded."""
    if choice is None:
        return
    from llmchat.chat_template import builtin_templates

    if Path(choice).expanduser().is_file() or choice in {t.name for t in builtin_templates()}:
        return
    names = ", ".join(sorted(t.name for t in builtin_templates()))
    raise UsageError(f"unknown template {choice!r}: not a file and not a built-in ({names})")


def load_model(opts: RunOptions, *, n_ctx_override: int | None = None, announce: bool = True) -> Loaded:
    validate_options(opts)
    check_template_choice(opts.template)
    config = load_config()
    flash_attn = next(v for v in (opts.flash_attn, config.flash_attn, True) if v is not None)
    if opts.kv_type != "f16" and not flash_attn:
        raise UsageError(
            f"--kv-type {opts.kv_type} needs flash attention (a quantized V cache), but the config file "
            f"{config.path} sets flash_attn = false; pass --flash-attn or use --kv-type f16"
        )
    model = resolve_model(opts.model, config)
    if model.how == "default" and announce:
        notice(f"model: {model.name} (the bundled default; choose another with -m)")

    from llmchat.gguf_file import check_loadable, read_metadata

    metadata = read_metadata(model.path)
    check_loadable(metadata, model.path)
    if opts.draft_model is not None:
        # The draft model reaches llama.cpp too, which aborts the process on some malformed files.
        check_loadable(read_metadata(opts.draft_model), opts.draft_model)
    arch = metadata.scalars.get("general.architecture", "")
    trained_ctx = int(metadata.scalars.get(f"{arch}.context_length", 0) or 0)

    # The header is read once per load, here: the engine gets the context size already decided.
    n_ctx = n_ctx_override or opts.ctx or model.ctx or min(trained_ctx or DEFAULT_MAX_CTX, DEFAULT_MAX_CTX)
    if n_ctx and trained_ctx and n_ctx > trained_ctx:
        notice(
            f"warning: --ctx {n_ctx} is above the {trained_ctx} tokens this model was trained on; expect worse answers past that"
        )

    from llmchat.engine import EngineSettings as Settings

    settings = Settings(
        n_ctx=n_ctx,
        threads=opts.threads,
        batch_size=opts.batch_size,
        device=opts.device,
        gpu_layers=opts.gpu_layers,
        flash_attn=flash_attn,
        kv_type=opts.kv_type,
        mmap=opts.mmap,
        mlock=opts.mlock,
        verbose=opts.verbose,
        lookup=opts.lookup,
        kv_shift=opts.kv_shift,
        draft_model=opts.draft_model,
    )
    engine = _load_with_spinner(model, settings)
    if opts.verbose:
        for line in engine.notices:
            notice(line)
        notice(f"context: {engine.n_ctx} tokens (trained {trained_ctx}), threads {engine.threads}")

    sampling = build_sampling(
        model_metadata=metadata.scalars,
        config_values=config.sampling,
        config_preset=config.preset,
        flag_preset=opts.preset,
        flags=sampling_flags(opts),
        stop=opts.stop,
    )
    return Loaded(config=config, model=model, engine=engine, sampling=sampling, trained_ctx=trained_ctx)


def _load_with_spinner(model: ResolvedModel, settings: EngineSettings) -> Engine:
    from llmchat.engine import Engine

    if not is_tty(sys.stderr):
        return Engine.load(model.path, settings)
    from rich.console import Console

    with Console(stderr=True).status(f"loading {model.path.name}…", spinner="dots"):
        return Engine.load(model.path, settings)


def report_template(session: ChatSession, verbose: bool) -> None:
    """The ChatML fallback always warns; the rest of the story is for --verbose."""
    template = session.template
    if template.warning:
        notice(f"warning: {template.warning}")
    if verbose:
        notice(f"template: {template.name} (from {template.source_detail})")
        for step in template.steps:
            notice(f"  {step}")
        for note in template.notes:
            notice(f"template: {note}")


def start_session(opts: RunOptions, *, overflow: str, with_history: bool) -> ChatSession:
    """Load the model, open the history store (unless off), resolve the template: a ready ChatSession."""
    from llmchat.session import ChatSession

    loaded = load_model(opts)
    store = None
    if with_history and loaded.config.history:
        from llmchat.history import open_or_warn

        store = open_or_warn(warn=lambda message: notice(f"warning: {message}"))
    try:
        session = ChatSession.start(
            loaded.engine,
            sampling=loaded.sampling,
            model_label=loaded.model.name,
            template_choice=opts.template,
            config_template=loaded.model.template,
            system=opts.system if opts.system is not None else loaded.config.system,
            overflow=overflow,
            history=store,
        )
    except BaseException:
        loaded.engine.close()
        if store is not None:
            store.close()
        raise
    session.config = loaded.config
    session.verbose = opts.verbose
    report_template(session, opts.verbose)
    return session
