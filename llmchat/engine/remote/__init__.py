"""Remote engines: a model served by another process, on this machine or another, behind HTTP.

A model that outgrows one computer is served by an existing engine (llama.cpp's `llama-server`,
possibly spread over hosts with `--rpc`; vLLM; Ollama), and llmchat talks to it with the same turn
road as a local model (llmchat.session). Two engines implement `llmchat.engine.interface.ChatEngine`:

- `llama_server.LlamaServerEngine`, the best path: llmchat renders the chat template itself and
  sends token ids to `/completion` with `cache_prompt` and a pinned slot, so the server's KV cache
  is reused turn after turn exactly as the local engine's is;
- `openai_compat.OpenAICompatEngine`, for any `/v1/chat/completions` server: the server renders
  its own template, and llmchat sends messages.

`connect` probes the server when its kind is `auto` (llmchat.engine.remote.probe). Several
servers of one model (`--server` repeated, a configured `urls` group) are joined by
`group.connect_servers`: batch spreads over them (`streams.ConcurrentStreams`), ask and chat take
the first that answers.

httpx is imported only here, when a server is used: it costs about 125 ms at start (measured on
this project's 2-core CI machine), which `llmchat --help` and local runs should not pay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llmchat.errors import UsageError

if TYPE_CHECKING:
    from llmchat.engine.remote.llama_server import LlamaServerEngine
    from llmchat.engine.remote.openai_compat import OpenAICompatEngine

KINDS = ("auto", "llama.cpp", "openai", "ollama")
DEFAULT_CONNECT_TIMEOUT = 10.0
# Between two chunks of a stream, not for the whole reply: a big model's prefill on a busy server
# can take minutes before the first token.
DEFAULT_READ_TIMEOUT = 600.0


@dataclass(frozen=True)
class ServerSpec:
    """Where a server is and how to talk to it. The API key never appears in its repr."""

    url: str  # the base URL, without a trailing /v1
    kind: str = "auto"  # auto | llama.cpp | openai | ollama
    model: str | None = None  # the model name on the server (OpenAI-compatible servers serve several)
    api_key: str | None = field(default=None, repr=False)
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    local_gguf: Path | None = None  # a local copy of the served GGUF: template and BOS/EOS from it
    name: str | None = None  # the config's [servers.NAME], for messages

    @property
    def shown_url(self) -> str:
        from llmchat.engine.remote.failures import shown_url

        return shown_url(self.url)


def normalize_url(url: str) -> str:
    """The base URL a user may give in several forms: `host:8080`, `http://host:8080/`, `.../v1`."""
    text = url.strip()
    if not text:
        raise UsageError("--server needs a URL, such as http://127.0.0.1:8080")
    if "://" not in text:
        text = "http://" + text
    scheme = text.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        raise UsageError(f"--server {url}: only http:// and https:// URLs are supported")
    text = text.rstrip("/")
    if text.endswith("/v1"):
        text = text[: -len("/v1")]
    return text


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
