"""From command-line options to a ready ChatSession: config, model file, checks, engine, template.

This is where the order of precedence lives (flags > config > model defaults > ours) and where the
one-time notices are printed (bundled default model, context above the trained length).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from llmchat import paths
from llmchat.config import Config
from llmchat.engine.sampling import SamplingParams, build_sampling, model_defaults, preset_values
from llmchat.errors import UsageError
from llmchat.models.resolve import ResolvedModel, resolve_model
from llmchat.options import RunOptions
from llmchat.output import is_tty, notice, spinner
from llmchat.startup.engine_settings import (
    FLASH_ATTN_CHOICES,
    check_flash_attn_for_kv,
    checked_metadata,
    engine_settings,
    trained_context,
)
from llmchat.startup.saved_prompts import sampling_layers

if TYPE_CHECKING:
    from llmchat.engine import Engine, EngineSettings
    from llmchat.engine.interface import ChatEngine
    from llmchat.engine.kv_store import KVStore
    from llmchat.engine.remote.llama_server import LlamaServerEngine
    from llmchat.engine.remote.openai_compat import OpenAICompatEngine
    from llmchat.engine.remote.spec import ServerSpec
    from llmchat.prompt.render import ResolvedTemplate
    from llmchat.turn.model_switch import ModelLoader
    from llmchat.turn.session import ChatSession

MIN_CTX = 64


@dataclass
class Loaded:
    config: Config
    model: ResolvedModel
    engine: ChatEngine
    sampling: SamplingParams
    trained_ctx: int
    base_model: bool = False  # no instruct finetune, no chat template: replies continue the text
    # The model's own recommended sampling (its `general.sampling.*` keys), for `/model NAME`.
    recommended_sampling: dict[str, Any] = field(default_factory=dict)


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
    if opts.flash_attn is not None and opts.flash_attn not in FLASH_ATTN_CHOICES:
        raise UsageError(f"--flash-attn must be auto, on or off, got {opts.flash_attn!r}")
    if opts.kv_type != "f16" and (opts.no_flash_attn or opts.flash_attn == "off"):
        raise UsageError(
            f"--kv-type {opts.kv_type} needs flash attention (a quantized V cache); drop --no-flash-attn "
            "(--flash-attn off) or use --kv-type f16"
        )
    if opts.preset is not None:
        preset_values(opts.preset)
    if opts.lookup and opts.draft_model is not None:
        raise UsageError("--lookup and --draft-model are two kinds of drafting; choose one")
    if (opts.lookup or opts.draft_model is not None) and opts.batch_size < 2:
        raise UsageError("speculative decoding verifies drafts in one batch; give --batch-size 2 or more")
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
    from llmchat.prompt.builtins import builtin_templates

    if Path(choice).expanduser().is_file() or choice in {t.name for t in builtin_templates()}:
        return
    names = ", ".join(sorted(t.name for t in builtin_templates()))
    raise UsageError(f"unknown template {choice!r}: not a file and not a built-in ({names})")


def load_model(opts: RunOptions, *, config: Config, n_ctx_override: int | None = None, announce: bool = True) -> Loaded:
    validate_options(opts)
    check_template_choice(opts.template)
    check_flash_attn_for_kv(opts, config)
    servers = server_specs(opts, config)
    if servers:
        if n_ctx_override is not None:  # `bench`: it sizes and times a local llama.cpp context
            raise UsageError("--server does not apply to bench, which measures a local model; use -m MODEL")
        return load_remote(opts, config, servers)
    model = resolve_model(opts.model, config)
    if model.how == "default" and announce:
        notice(f"model: {model.name} (the bundled default; choose another with -m)")

    metadata = checked_metadata(model.path)
    if opts.draft_model is not None:
        # The draft model reaches llama.cpp too, which aborts the process on some malformed files.
        checked_metadata(opts.draft_model)
    trained_ctx = trained_context(metadata)
    settings = engine_settings(opts, config, model, metadata, n_ctx_override)
    if settings.n_ctx and trained_ctx and settings.n_ctx > trained_ctx:
        notice(
            f"warning: --ctx {settings.n_ctx} is above the {trained_ctx} tokens this model was trained on; expect worse answers past that"
        )
    engine = _load_with_spinner(model, settings)
    if opts.verbose:
        for line in engine.notices:
            notice(line)
        notice(f"context: {engine.n_ctx} tokens (trained {trained_ctx}), threads {engine.threads}")

    sampling = run_sampling(opts, config, metadata.scalars)
    from llmchat.models.kind import kind_of

    base_model = kind_of(metadata, [model.name]).is_base
    recommended = model_defaults(metadata.scalars)
    return Loaded(config, model, engine, sampling, trained_ctx, base_model, recommended_sampling=recommended)


def _load_with_spinner(model: ResolvedModel, settings: EngineSettings) -> Engine:
    """`Engine.load`, with the turn's own start-up done beside llama.cpp's load where it can be:
    the load runs on a thread of its own (llmchat.engine.load_ahead; for a one-shot `ask` it was
    begun earlier still) while this thread imports what the first reply uses."""
    from llmchat.engine import Engine, load_ahead

    try:
        if not (settings.verbose or settings.lookup or settings.draft_model):
            # (--verbose: llama.cpp's log in order with the run's own lines; drafting: two models,
            # opened in their order by `Engine.load`.)
            load_ahead.begin(model.path, settings)  # nothing new where this very load is in flight
            _prepare_the_turn()
        if not is_tty(sys.stderr):
            return Engine.load(model.path, settings)
        with spinner(f"loading {model.path.name}…"):
            return Engine.load(model.path, settings)
    finally:
        load_ahead.cancel()  # nothing to do once `Engine.load` took it; else it stops and is freed


def _prepare_the_turn() -> None:
    """Import Jinja and its sandboxed environment (which the chat template compiles in) and the
    modules the first reply uses, while llama.cpp loads the model in C with the GIL released:
    about 40 ms of a one-shot `ask` on a small model (bench/results/oneshot_vs_completion.md).

    On this thread, not the loading one, by design: the thread that loads imports nothing once it
    has started (tests/test_load_ahead.py), so no wait for it can meet an import lock, and the
    process never exits while another thread is inside the import system (where CPython 3.11
    crashed, SIGSEGV in the import lock, in about one run in three on a busy machine). A failure
    here is met again, and reported, where the module is used."""
    try:
        import llmchat.turn.session  # noqa: F401  (the turn, the template, the conversation)
        from llmchat.prompt import sandbox

        sandbox.compile_template("{{ messages }}", "warm-up")
        import llmchat.engine.sampler  # noqa: F401  (the sampler chain)
        import llmchat.models.kind  # noqa: F401
    except Exception:  # noqa: BLE001 - met again where it matters
        pass


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


def start_session(
    opts: RunOptions, *, config: Config, overflow: str, with_history: bool, disk_cache: bool | None = None
) -> ChatSession:
    """Load the model, open the history store (unless off), resolve the template: a ready ChatSession.

    `disk_cache`: use the KV cache on disk; None: wherever the history is on (batch, which saves no
    history, passes True: its items restore a shared system prompt)."""
    loaded = load_model(opts, config=config)
    # Imported after the load: `_prepare_the_turn` imported them while it ran.
    from llmchat.reasoning.formats import ReasoningSettings
    from llmchat.turn.session import ChatSession

    if loaded.base_model:
        notice(
            f"warning: {loaded.model.name} is a base model (no chat template, no instruct finetune): "
            "its reply will continue your text, not answer it; use an instruct model to chat"
        )
    store = None
    if with_history and loaded.config.history:
        from llmchat.store.history import open_or_warn

        store = open_or_warn(warn=lambda message: notice(f"warning: {message}"))
    # The KV cache on disk holds the conversation: off wherever the history is off (--no-history).
    wanted = store is not None if disk_cache is None else disk_cache and loaded.config.history
    try:
        kv_store = None
        if opts.prompt_cache and loaded.config.prompt_cache and wanted:
            kv_store = open_kv_store(loaded.engine, loaded.config)
        server_template = None  # a server that renders its own template: it stands in for ours
        if loaded.engine.caps.renders_template:
            server_template = server_rendered_template(loaded.engine.info.template_detail or "the server")
        session = ChatSession.start(
            loaded.engine,
            sampling=loaded.sampling,
            model_label=loaded.model.name,
            template_choice=opts.template,
            config_template=loaded.model.template,
            server_template=server_template,
            system=opts.system if opts.system is not None else loaded.config.system,
            overflow=overflow,
            history=store,
            kv_store=kv_store,
            reasoning=ReasoningSettings.from_options(opts, loaded.config),
            say=lambda line: notice(f"warning: {line}"),
            config=loaded.config,
            origins=dict(opts.origins),
            verbose=opts.verbose,
            model_loader=None if loaded.model.how == "server" else model_loader(opts, loaded.config),
        )
    except BaseException:
        loaded.engine.close()
        if store is not None:
            store.close()
        raise
    from llmchat.turn.sampled import answer_sampling

    answer_sampling(session)  # a server's sampling request: this model answers (where the run declared it)
    report_template(session, opts.verbose)
    return session


def model_loader(opts: RunOptions, config: Config) -> ModelLoader:
    """How `/model NAME` loads a local model: with this run's options (context, threads, flash
    attention...) as at start-up, and the config's template for it; not --template,
    --draft-model or --mmproj, which were chosen for the first model."""
    from llmchat.turn.model_switch import SwitchedModel

    def load(name: str, disk_cache: bool) -> SwitchedModel:
        switched = replace(opts, model=name, template=None, draft_model=None, server=(), mmproj=None)
        if server_specs(switched, config):
            raise UsageError(f"{name} names a configured server; /model switches between local models")
        loaded = load_model(switched, config=config, announce=False)
        base = [f"warning: {loaded.model.name} is a base model: its replies continue your text"]
        notices = base if loaded.base_model else []
        kv_store = open_kv_store(loaded.engine, config) if disk_cache and opts.prompt_cache else None
        return SwitchedModel(
            loaded.engine, loaded.model.name, loaded.model.template, kv_store, notices, loaded.recommended_sampling
        )

    return load


def open_kv_store(engine: ChatEngine, config: Config) -> KVStore | None:
    """The KV cache on disk, for an engine that has one (a server keeps its own cache)."""
    if not engine.caps.disk_cache:
        return None
    from llmchat.engine.kv_store import KVStore

    # caps.disk_cache: the local engine, the only one whose KV state llmchat can read and write.
    return KVStore(
        cast("Engine", engine),
        folder=paths.kv_cache_dir(),
        max_bytes=config.prompt_cache_max_bytes,
        warn=notice,
    )


# --- remote engines (--server, or a configured [servers.NAME]) -----------------------------------------
def server_specs(opts: RunOptions, config: Config) -> list[ServerSpec]:
    """The servers to use, in order, or none for a local model: each `--server URL` (or a configured
    server's name, whose `urls` may name a group), `-m NAME:MODEL` or `-m NAME` for a configured
    [servers.NAME]. With --server, -m names the server's model, or a local copy of its GGUF (the
    template and BOS/EOS are then read from it)."""
    from llmchat.engine.remote.spec import DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT, ServerSpec, normalize_url

    entries: list[tuple[str | None, dict[str, Any]]] = []
    model = None
    if opts.server:
        # A tuple from the flags; a single URL string from code written before --server repeated.
        servers = (opts.server,) if isinstance(opts.server, str) else opts.server
        for given in servers:
            entries.append((given, config.servers[given]) if given in config.servers else (None, {"url": given}))
        model = opts.model
    elif opts.model:
        prefix, colon, rest = opts.model.partition(":")
        if prefix in config.servers and not Path(opts.model).expanduser().exists():
            entries.append((prefix, config.servers[prefix]))
            model = rest if colon and rest else None
    if not entries:
        return []
    if opts.lookup or opts.draft_model is not None:
        raise UsageError("--lookup and --draft-model run only with a local model; the server decodes by itself")
    for flag, value in (("--connect-timeout", opts.connect_timeout), ("--read-timeout", opts.read_timeout)):
        if value is not None and value <= 0:
            raise UsageError(f"{flag} must be a number of seconds above 0, got {value:g}")
    local_gguf = None
    if model is not None and model.endswith(".gguf") and Path(model).expanduser().is_file():
        local_gguf, model = Path(model).expanduser(), None
    specs: list[ServerSpec] = []
    for name, entry in entries:
        api_key = _api_key(name, entry)
        for url in entry.get("urls") or [entry.get("url") or ""]:
            spec = ServerSpec(
                url=normalize_url(url),
                kind=entry.get("kind", "auto"),
                model=model or entry.get("model"),
                api_key=api_key,
                connect_timeout=float(opts.connect_timeout or entry.get("connect_timeout") or DEFAULT_CONNECT_TIMEOUT),
                read_timeout=float(opts.read_timeout or entry.get("read_timeout") or DEFAULT_READ_TIMEOUT),
                local_gguf=local_gguf,
                name=name,
            )
            if any(known.url == spec.url for known in specs):
                raise UsageError(f"--server {spec.shown_url} is given twice; name each server once")
            specs.append(spec)
    return specs


def _api_key(name: str | None, entry: dict[str, Any]) -> str | None:
    """A configured server's key from the variable its api_key_env names, else LLMCHAT_API_KEY."""
    import os

    key_env = entry.get("api_key_env")
    if not key_env:
        return os.environ.get("LLMCHAT_API_KEY") or None
    api_key = os.environ.get(key_env)
    if not api_key:
        raise UsageError(
            f"servers.{name}.api_key_env names {key_env}, which is not set; export {key_env}=... (the key), "
            "or remove api_key_env"
        )
    return api_key


def _connect(spec: ServerSpec) -> LlamaServerEngine | OpenAICompatEngine:
    from llmchat.engine.remote import connect

    if is_tty(sys.stderr):
        with spinner(f"connecting to {spec.shown_url}…"):
            return connect(spec)
    return connect(spec)


def load_remote(opts: RunOptions, config: Config, specs: list[ServerSpec]) -> Loaded:
    """Connect to the servers (probing each one's kind when `auto`): a Loaded whose engine is remote.
    Several servers: the first that answers, or with `opts.every_server` (batch) every one that
    answers, the others as the engine's `peers` (llmchat.engine.remote.group)."""
    from llmchat.engine.remote.group import connect_servers

    engine = connect_servers(specs, every=opts.every_server, connect=_connect, say=notice)
    spec = engine.spec
    if engine.caps.renders_template and opts.template is not None:
        engine.close()
        raise UsageError(
            f"--template: {spec.shown_url} renders its own chat template (OpenAI-compatible API); "
            "a llama.cpp server takes llmchat's"
        )
    if opts.ctx is not None:
        # A window within the server's: the server's own is the hard limit where it is known.
        limit = engine.n_ctx if engine.ctx_known else opts.ctx
        if opts.ctx > limit:
            notice(f"warning: --ctx {opts.ctx} is above the server's {limit} tokens per request; using {limit}")
        engine.n_ctx = min(opts.ctx, limit)
        for peer in engine.peers:
            peer.n_ctx = engine.n_ctx
    if opts.verbose:
        for server in (engine, *engine.peers):
            for line in server.notices:
                notice(line)
        notice(f"context: {engine.n_ctx} tokens per request (the server's slot)")
    label = server_label(spec) or str(engine.metadata.get("general.name") or spec.shown_url)
    model = ResolvedModel(
        path=spec.local_gguf or Path(spec.shown_url),
        name=label,
        how="server",
        template=config.template,
        ctx=None,
    )
    sampling = run_sampling(opts, config, dict(engine.metadata))
    return Loaded(config, model, engine, sampling, trained_ctx=0, recommended_sampling=model_defaults(engine.metadata))


def server_label(spec: ServerSpec) -> str:
    """What a server chat calls its model, from how it was named: `NAME:MODEL` (a configured
    server and its model), `NAME` or `MODEL`; "" where neither was given (the server says)."""
    return f"{spec.name}:{spec.model}" if spec.name and spec.model else (spec.name or spec.model or "")


def server_rendered_template(detail: str) -> ResolvedTemplate:
    """The stand-in template of a server that renders its own (llmchat.engine.remote.openai_compat):
    `/show` and `--verbose` say who renders it."""
    from llmchat.engine.remote.openai_compat import SERVER_TEMPLATE
    from llmchat.prompt.render import ResolvedTemplate

    return ResolvedTemplate(
        name="server",
        source="server",
        source_detail=detail,
        text=SERVER_TEMPLATE,
        stop_strings=(),
        steps=["the server renders the chat template; llmchat sends it the messages"],
    )


def run_sampling(opts: RunOptions, config: Config, model_metadata: dict[str, Any]) -> SamplingParams:
    """The run's sampling: the model's recommended values under the config's, a preset's, a saved
    prompt's and the flags' (llmchat.engine.sampling.build_sampling), with the run's stop rules."""
    return build_sampling(
        model_metadata=model_metadata,
        config_values=config.sampling,
        config_preset=config.preset,
        flag_preset=opts.preset,
        flags=sampling_flags(opts),
        stop=opts.stop,
        stop_loops=opts.loop_stop,
        prompt_layers=sampling_layers(opts.saved_prompt, config),
    )
