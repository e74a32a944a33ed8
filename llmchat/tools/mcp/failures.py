"""How an MCP failure is told: the exceptions, and one line of reason from what the SDK raised
(inside its exception groups), used by llmchat.tools.mcp.connection."""

from __future__ import annotations

from typing import IO

from llmchat.errors import LlmchatError, UsageError


class McpFailure(LlmchatError):
    """A request to a running server failed (resources, prompts): one line, exit 1."""


class McpServerDown(UsageError):
    """The server could not be started or reached: one line naming it, why, and its stderr's last
    line. `llmchat mcp` exits 2 on it; a chat goes on without its tools (llmchat.tools.registry)."""

    def __init__(self, message: str, server_name: str):
        super().__init__(message)
        self.server_name = server_name


class ProtocolBroken(Exception):
    """The server sent something that is not MCP while a request was waiting for it."""


class LoginRefused(Exception):
    """The server refused the OAuth login stored for it (llmchat.tools.mcp.oauth): someone must log in again."""


def malformed(err: Exception) -> str:
    if type(err).__name__ in ("ValidationError", "JSONDecodeError"):
        return "a line that is not a JSON-RPC message"
    return describe(err)


def answered(err: BaseException) -> bool:
    """Whether this is an error the server sent (not one the SDK made for a closed connection or a
    request that timed out)."""
    from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

    first = root(err)
    return type(first).__name__ == "MCPError" and getattr(first, "code", None) not in (
        CONNECTION_CLOSED,
        REQUEST_TIMEOUT,
    )


def root(err: BaseException) -> BaseException:
    """The first failure inside the exception groups the SDK's task groups wrap it in."""
    while getattr(err, "exceptions", None):  # an ExceptionGroup (built in from Python 3.11 only)
        err = err.exceptions[0]  # type: ignore[attr-defined]
    return err


def describe(err: BaseException) -> str:
    """A one-line reason from what the SDK raised."""
    err = root(err)
    if isinstance(err, (ProtocolBroken, LoginRefused)):
        return str(err)
    if isinstance(err, FileNotFoundError):
        return f"program not found ({err.filename or err})"
    if isinstance(err, TimeoutError):
        return "no answer in time"
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if type(err).__name__ == "MCPError":
        return first or "the server answered with an error"
    if type(err).__name__ == "ConnectError":
        return f"no connection ({first or 'refused'})"
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def last_line(errlog: IO[str] | None) -> str:
    """The last line a server wrote on its stderr (the file it goes to), at most 300 characters."""
    if errlog is None or errlog.closed:
        return ""
    try:
        errlog.flush()
        errlog.seek(0)
        lines = [line.strip() for line in errlog.read().splitlines() if line.strip()]
    except (OSError, ValueError):
        return ""
    return lines[-1][:300] if lines else ""
