"""Every way a server request can fail, as one line that says what to do (a ServerError, exit 6).

The same wording for both remote engines and every command. Messages never carry the API key: it
lives only in the request headers, which no message quotes, and `scrub` removes it from any text a
server sends back (a proxy may echo a header). URLs are shown without credentials or a query.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from llmchat.errors import ContextOverflowError, ServerError

if TYPE_CHECKING:
    import httpx

# Phrases servers use when a prompt is longer than the context (llama-server, vLLM, llama_cpp.server).
_CONTEXT_PHRASES = (
    "exceeds the available context",
    "context window",
    "context length",
    "maximum context",
    "context size",
    "too long",
)


def shown_url(url: str) -> str:
    """The URL as messages and the history show it: no user:password, no query string."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def scrub(text: str, secret: str | None) -> str:
    """One line of server text, at most 300 characters, with the API key blanked out."""
    line = " ".join(text.split())
    if secret:
        line = line.replace(secret, "***")
    return line[:300]


def server_message(response: httpx.Response) -> str:
    """The error text a server put in its body: OpenAI's {"error": {"message"}}, FastAPI's {"detail"},
    or the raw text."""
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError):
        return response.text
    return message_from_body(body) or response.text


def message_from_body(body: object) -> str:
    if isinstance(body, dict):
        error = body.get("error", body.get("detail"))
        if isinstance(error, dict):
            return str(error.get("message") or error)
        if isinstance(error, str):
            return error
        if isinstance(error, list):  # FastAPI validation errors
            return "; ".join(str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in error)
    return ""


def from_status(
    response: httpx.Response, *, url: str, what: str, secret: str | None, model: str | None = None
) -> ServerError | ContextOverflowError:
    """An HTTP error status as one actionable line. `what`: the request, e.g. "POST /completion"."""
    status = response.status_code
    said = scrub(server_message(response), secret)
    detail = f" ({said})" if said else ""
    where = f"{shown_url(url)}: {what}"
    if status in (401, 403):
        return ServerError(
            f"{where} was refused ({status}{': ' + said if said else ''}); set the API key in the environment "
            "variable the config's api_key_env names, or in LLMCHAT_API_KEY",
            status=status,
        )
    if status == 404:
        if model and "model" in said.lower():
            return ServerError(
                f"{where}: the server has no model {model!r}{detail}; list its models with "
                f"`curl {shown_url(url)}/v1/models` and pass one with -m SERVER:MODEL",
                status=status,
            )
        return ServerError(
            f"{where} does not exist on this server (404){detail}; check the URL, or set the server's kind "
            "(llama.cpp, openai, ollama) in the config",
            status=status,
        )
    if status == 429:
        return ServerError(
            f"{where}: the server is busy (429 too many requests){detail}; try again later or lower --parallel",
            retriable=True,
            status=status,
        )
    if status == 503:
        return ServerError(
            f"{where}: the server is unavailable (503){detail}; it may still be loading its model or have no "
            "free slot: try again in a moment",
            retriable=True,
            status=status,
        )
    if status in (400, 413, 422) and any(phrase in said.lower() for phrase in _CONTEXT_PHRASES):
        return ContextOverflowError(
            f"{where}: the prompt does not fit the server's context{detail}; shorten the conversation "
            "(--overflow drop) or lower --max-tokens"
        )
    if status >= 500:
        return ServerError(
            f"{where} failed on the server ({status}){detail}; check the server's log",
            retriable=status in (502, 504),
            status=status,
        )
    return ServerError(
        f"{where} was rejected ({status}){detail}; check the server's log and llmchat's options", status=status
    )


def from_transport(err: Exception, *, url: str, what: str, connect_timeout: float, read_timeout: float) -> ServerError:
    """A failure below HTTP (no connection, TLS, a timeout, a connection dropped) as one line."""
    import httpx

    where = shown_url(url)
    reason = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, httpx.ConnectTimeout):
        return ServerError(
            f"no connection to {where} within {connect_timeout:g} s; check the address and the network, "
            "or raise --connect-timeout",
            retriable=True,
        )
    if isinstance(err, (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout)):
        return ServerError(
            f"{where}: {what} got no data for {read_timeout:g} s; the server may be overloaded: raise "
            "--read-timeout or try again",
            retriable=True,
        )
    if isinstance(err, httpx.ConnectError):
        lowered = reason.lower()
        if "ssl" in lowered or "certificate" in lowered or "tls" in lowered:
            return ServerError(
                f"TLS failed with {where} ({reason}); check the server's certificate (SSL_CERT_FILE for a private "
                "CA), or use http:// if it serves plain HTTP"
            )
        if "name or service" in lowered or "nodename" in lowered or "name resolution" in lowered:
            return ServerError(f"cannot resolve the host of {where} ({reason}); check the URL in --server")
        return ServerError(
            f"cannot connect to {where} ({reason}); is the server running and listening there? check --server",
            retriable=True,
        )
    if isinstance(err, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return ServerError(
            f"{where} dropped the connection during {what} ({reason}); check the server's log, then try again",
            retriable=True,
        )
    return ServerError(f"{where}: {what} failed ({reason}); check --server and the server's log")


def stream_error(body: dict, *, url: str, what: str, secret: str | None) -> ServerError | ContextOverflowError:
    """An error the server reported inside a stream (`data: {"error": ...}`)."""
    said = scrub(message_from_body(body) or json.dumps(body), secret)
    if any(phrase in said.lower() for phrase in _CONTEXT_PHRASES):
        return ContextOverflowError(
            f"{shown_url(url)}: {what}: the prompt does not fit the server's context ({said}); shorten the "
            "conversation or lower --max-tokens"
        )
    return ServerError(f"{shown_url(url)}: {what} failed mid-stream ({said}); check the server's log", retriable=True)
