"""What a run does before its model loads: begin the load on a thread of its own, and know the
context it will open (the bound of what is read from outside before the load)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

from llmchat.config import Config
from llmchat.errors import LlmchatError
from llmchat.models.resolve import resolve_model
from llmchat.options import RunOptions
from llmchat.startup.engine_settings import check_flash_attn_for_kv, checked_metadata, context_size, engine_settings
from llmchat.startup.loading import server_specs, validate_options


@contextmanager
def loading_ahead(opts: RunOptions, config: Config) -> Iterator[int | None]:
    """Begin llama.cpp's load of the model and its context now, on a thread of its own
    (llmchat.engine.load_ahead), so that the rest of the start-up (the option checks, the modules
    the turn imports, MCP servers, reading stdin) runs beside the load instead of before it; the
    `start_session` inside this block takes the loaded model when its settings are the ones
    asked for here. A start-up stopped before that (a bad option, Ctrl-C) cancels the load and
    frees what it made. Yields `context_ahead`'s answer, found on the way.

    Nothing here reports a problem: a bad option or model is left for `load_model` to meet in
    its usual order and say in its usual words; the load is then simply not begun ahead. Nor is
    it begun for --verbose (llama.cpp's log would interleave with the start-up's own lines) or
    for drafting (two models, opened in their order by `Engine.load`)."""
    try:
        yield _begin_loading_ahead(opts, config)
    finally:
        # Also after a Ctrl-C in the middle of beginning it; nothing to do once `Engine.load` took
        # it, and nothing to import where none was begun (a remote server's run).
        load_ahead = sys.modules.get("llmchat.engine.load_ahead")
        if load_ahead is not None:
            load_ahead.cancel()


def _begin_loading_ahead(opts: RunOptions, config: Config) -> int | None:
    if opts.verbose or opts.lookup or opts.draft_model is not None:
        return context_ahead(opts, config)
    try:
        validate_options(opts)
        check_flash_attn_for_kv(opts, config)
        if server_specs(opts, config):
            return opts.ctx
        model = resolve_model(opts.model, config)
        metadata = checked_metadata(model.path)
        settings = engine_settings(opts, config, model, metadata)
        from llmchat.engine import load_ahead

        load_ahead.begin(model.path, settings)  # --device gpu on a CPU-only build: a UsageError
        return settings.n_ctx
    except LlmchatError:
        return opts.ctx


def context_ahead(opts: RunOptions, config: Config) -> int | None:
    """The context the run will open, in tokens, where it is known before the load: --ctx, or a
    local model's (its header read); None for a server's, known once it is asked, and where the
    model cannot be found (the load says why). What bounds the text read before the load
    (llmchat.edges.bounded_input)."""
    if opts.ctx is not None:
        return opts.ctx
    try:
        if server_specs(opts, config):
            return None
        model = resolve_model(opts.model, config)
        return context_size(opts, model, checked_metadata(model.path))
    except LlmchatError:
        return None
