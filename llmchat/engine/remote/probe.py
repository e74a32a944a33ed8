"""Which kind of server is at a URL (`kind = "auto"`), asked the way each one answers.

- llama.cpp's llama-server answers `GET /props` with `default_generation_settings`;
- an OpenAI-compatible server (vLLM, LM Studio, llama_cpp.server, Ollama's /v1) answers
  `GET /v1/models` with a `data` list;
- Ollama answers `GET /api/version`; it is then spoken to through its OpenAI-compatible /v1.

The order matters: llama-server also answers /v1/models, and should get the better path. A 401
or 403 on every probe means the key is missing or wrong, and says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmchat.errors import ServerError

if TYPE_CHECKING:
    import httpx

    from llmchat.engine.remote.http import ServerClient


def _json(response: httpx.Response | None) -> object:
    if response is None or response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def detect_kind(client: ServerClient) -> str:
    """llama.cpp | openai | ollama, or a ServerError saying that nothing there looks like a server."""
    props = client.probe("/props")
    body = _json(props)
    if isinstance(body, dict) and "default_generation_settings" in body:
        return "llama.cpp"
    models = client.probe("/v1/models")
    body = _json(models)
    if isinstance(body, dict) and isinstance(body.get("data"), list):
        return "openai"
    version = client.probe("/api/version")
    body = _json(version)
    if isinstance(body, dict) and "version" in body:
        return "ollama"
    statuses = [r.status_code for r in (props, models, version) if r is not None]
    where = client.spec.shown_url
    if statuses and all(status in (401, 403) for status in statuses):
        raise ServerError(
            f"{where} refused every request ({statuses[0]}); set the API key in the environment variable the "
            "config's api_key_env names, or in LLMCHAT_API_KEY",
            status=statuses[0],
        )
    if 503 in statuses:
        raise ServerError(
            f"{where} is not ready (503); it may still be loading its model: try again in a moment",
            retriable=True,
            status=503,
        )
    raise ServerError(
        f"{where} does not look like llama-server, an OpenAI-compatible server or Ollama (no /props, /v1/models "
        "or /api/version); check the URL, or set kind in the config's [servers.NAME]"
    )
