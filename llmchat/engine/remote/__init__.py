"""Remote engines: a model served by another process, on this machine or another, behind HTTP.

A model that outgrows one computer is served by an existing engine (llama.cpp's `llama-server`,
possibly spread over hosts with `--rpc`; vLLM; Ollama), and llmchat talks to it with the same turn
road as a local model (llmchat.turn.session). Two engines implement `llmchat.engine.interface.ChatEngine`:

- `llama_server.LlamaServerEngine`, the best path: llmchat renders the chat template itself and
  sends token ids to `/completion` with `cache_prompt` and a pinned slot, so the server's KV cache
  is reused turn after turn exactly as the local engine's is;
- `openai_compat.OpenAICompatEngine`, for any `/v1/chat/completions` server: the server renders
  its own template, and llmchat sends messages.

`connect` opens the engine for a `spec.ServerSpec`, probing the server when its kind is `auto`
(llmchat.engine.remote.probe). Several servers of one model (`--server` repeated, a configured
`urls` group) are joined by `group.connect_servers`: batch spreads over them
(`streams.ConcurrentStreams`), ask and chat take the first that answers.

httpx is imported only here, when a server is used: it costs about 125 ms at start (measured on
this project's 2-core CI machine), which `llmchat --help` and local runs should not pay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmchat.engine.remote.spec import KINDS
from llmchat.errors import UsageError

if TYPE_CHECKING:
    from llmchat.engine.remote.llama_server import LlamaServerEngine
    from llmchat.engine.remote.openai_compat import OpenAICompatEngine
    from llmchat.engine.remote.spec import ServerSpec


def connect(spec: ServerSpec) -> LlamaServerEngine | OpenAICompatEngine:
    """Open the engine for `spec`, probing the server's kind when it is `auto`. Raises ServerError."""
    from llmchat.engine.remote.http import ServerClient
    from llmchat.engine.remote.probe import detect_kind

    if spec.kind not in KINDS:
        raise UsageError(f"server kind must be one of {', '.join(KINDS)}, got {spec.kind!r}")
    client = ServerClient(spec)
    try:
        kind = spec.kind if spec.kind != "auto" else detect_kind(client)
        if kind == "llama.cpp":
            from llmchat.engine.remote.llama_server import LlamaServerEngine

            return LlamaServerEngine.open(client, spec)
        from llmchat.engine.remote.openai_compat import OpenAICompatEngine

        return OpenAICompatEngine.open(client, spec, kind=kind)
    except BaseException:
        client.close()
        raise
