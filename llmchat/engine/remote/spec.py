"""Where a server is and how to talk to it, as the command line and the config name it.

Apart from the package's `connect`, so that the client, the probe and both remote engines can
name a `ServerSpec` without importing the package that opens them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llmchat.errors import UsageError

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
