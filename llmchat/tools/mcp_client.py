"""MCP servers over stdio: `[mcp.NAME]` in the config and `--mcp "COMMAND ARGS"` on the command line.

    [mcp.time]
    command = "mcp-server-time"
    args = ["--local-timezone", "UTC"]
    env = { TZ = "UTC" }       # added to the SDK's safe default environment
    approve = "always"         # default "ask"
    timeout = 30

Each server's tools are named SERVER_TOOL (`time_get_current_time`), so a server cannot shadow a
built-in tool, a configured one, or another server's. The official `mcp` SDK (`pip install
'llmchat[mcp]'`) is imported only here and only when a server is used. A server runs in its own
process; its stderr goes to a private buffer (the last lines are shown if it fails to start).

The SDK is asynchronous; McpConnection keeps one event loop in a background thread (anyio's
blocking portal) so the rest of llmchat calls it like a function.
"""

from __future__ import annotations

import re
import shlex
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmchat.errors import ConfigError, UsageError
from llmchat.tools.spec import APPROVE_POLICIES, DEFAULT_TIMEOUT_S, EMPTY_OBJECT_SCHEMA, ToolFailure, ToolSpec

INSTALL_HINT = "MCP servers need the mcp package: pip install 'llmchat[mcp]'"
_KEYS = ("command", "args", "env", "approve", "timeout")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class McpServerConfig:
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    approve: str = "ask"
    timeout_s: float | None = None
    source: str = ""


def server_from_config(name: str, settings: Any, config_path: Path | str) -> McpServerConfig:
    where = f"config file {config_path}: mcp.{name}"
    if not _NAME.match(name):
        raise ConfigError(f"{where}: server names are letters, digits, - and _ (they prefix the tool names)")
    if not isinstance(settings, dict):
        raise ConfigError(f'{where} must be a table with command = "..." (and args, env)')
    for key in settings:
        if key not in _KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}; use {', '.join(_KEYS)}")
    command = settings.get("command")
    if not isinstance(command, str) or not command:
        raise ConfigError(f'{where} needs command = "PROGRAM" (its arguments go in args = [...])')
    args = settings.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"{where}: args must be a list of strings")
    env = settings.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ConfigError(f'{where}: env must be a table of strings (env = {{ NAME = "value" }})')
    approve = settings.get("approve", "ask")
    if approve not in APPROVE_POLICIES:
        raise ConfigError(f'{where}: approve must be "ask" or "always"')
    timeout = settings.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ConfigError(f"{where}: timeout must be a number of seconds above 0")
    return McpServerConfig(
        name=name,
        command=command,
        args=tuple(args),
        env=dict(env),
        approve=approve,
        timeout_s=float(timeout) if timeout is not None else None,
        source=f"config:mcp.{name}",
    )


def parse_mcp_spec(spec: str) -> McpServerConfig:
    """`--mcp "COMMAND ARGS"`: split like a POSIX shell would (quotes respected, nothing expanded,
    nothing run through a shell). The server is named after its program: `mcp-server-time` -> `time`."""
    try:
        words = shlex.split(spec)
    except ValueError as err:
        raise UsageError(f'--mcp {spec!r}: {err}; quote it as one argument, e.g. --mcp "mcp-server-time"') from None
    if not words:
        raise UsageError('--mcp needs a command, e.g. --mcp "mcp-server-time --local-timezone UTC"')
    return McpServerConfig(
        name=server_name_for(words[0]), command=words[0], args=tuple(words[1:]), source=f"--mcp {words[0]}"
    )


def server_name_for(program: str) -> str:
    stem = Path(program).name
    stem = re.sub(r"\.(py|js|mjs|exe)$", "", stem)
    stem = re.sub(r"^(mcp[-_]server[-_]|mcp[-_]|server[-_])", "", stem) or stem
    name = re.sub(r"[^A-Za-z0-9_-]", "_", stem).strip("_-")
    return name or "mcp"


def tool_name(server: str, tool: str) -> str:
    return f"{server}_{tool}"


def require_mcp() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise UsageError(INSTALL_HINT) from None


class McpConnection:
    """One running server. open() starts it and lists its tools; call() runs one; close() ends it."""

    def __init__(self, server: McpServerConfig, startup_timeout_s: float = DEFAULT_TIMEOUT_S):
        self.server = server
        self.startup_timeout_s = startup_timeout_s
        self._stack = ExitStack()
        self._portal: Any = None
        self._client: Any = None
        self._errlog: Any = None
        self.tools: list[ToolSpec] = []

    def __enter__(self) -> McpConnection:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> list[ToolSpec]:
        require_mcp()
        from anyio.from_thread import start_blocking_portal
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(command=self.server.command, args=list(self.server.args), env=self.server.env)
        self._errlog = self._stack.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace"))
        self._portal = self._stack.enter_context(start_blocking_portal())
        # read_timeout_seconds bounds the initialize handshake (a server that never answers).
        client = Client(stdio_client(params, errlog=self._errlog), read_timeout_seconds=self.startup_timeout_s)
        try:
            self._client = self._stack.enter_context(self._portal.wrap_async_context_manager(client))
            listed = self._portal.call(self._list_tools_with_timeout)
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C or SIGTERM while it starts: not its failure
            self.close()
            raise
        except BaseException as err:  # a server that cannot start: one line, with its last stderr line
            detail = self._failure(err)
            self.close()
            raise UsageError(f"MCP server {self.server.name} ({self.server.command}) did not start: {detail}") from None
        self.tools = [self._spec(tool) for tool in listed]
        return self.tools

    async def _list_tools_with_timeout(self) -> list[Any]:
        import anyio

        with anyio.fail_after(self.startup_timeout_s):
            return list((await self._client.list_tools()).tools)

    def _spec(self, tool: Any) -> ToolSpec:
        remote: str = tool.name

        def run(arguments: dict[str, Any], timeout_s: float) -> str:
            return self.call(remote, arguments, timeout_s)

        schema = dict(getattr(tool, "input_schema", None) or EMPTY_OBJECT_SCHEMA)
        schema.setdefault("type", "object")
        return ToolSpec(
            name=tool_name(self.server.name, tool.name),
            description=tool.description or "",
            parameters=schema,
            source=self.server.source or f"mcp:{self.server.name}",
            run=run,
            approve="always" if self.server.approve == "always" else "ask",
            timeout_s=self.server.timeout_s,
        )

    def call(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> str:
        if self._client is None:
            raise ToolFailure(f"MCP server {self.server.name} is not running")
        try:
            result = self._portal.call(self._call, tool, arguments, timeout_s)
        except TimeoutError:
            raise ToolFailure(f"MCP server {self.server.name} did not answer within {timeout_s:g} s") from None
        except (KeyboardInterrupt, SystemExit):  # the user stopped the call: the turn ends, as in decode
            raise
        except BaseException as err:  # the server died or broke the protocol: text for the model
            raise ToolFailure(f"MCP server {self.server.name} failed: {self._failure(err)}") from None
        text = "\n".join(_content_text(block) for block in result.content)
        if result.is_error:
            raise ToolFailure(text or f"the tool {tool} reported an error")
        return text

    async def _call(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        import anyio

        with anyio.fail_after(timeout_s):
            return await self._client.call_tool(tool, arguments, read_timeout_seconds=timeout_s)

    def _failure(self, err: BaseException) -> str:
        message = _describe(err)
        last = self._stderr_tail()
        return f"{message}; its stderr ends: {last}" if last else message

    def _stderr_tail(self) -> str:
        if self._errlog is None or self._errlog.closed:
            return ""
        try:
            self._errlog.flush()
            self._errlog.seek(0)
            lines = [line.strip() for line in self._errlog.read().splitlines() if line.strip()]
        except (OSError, ValueError):
            return ""
        return lines[-1][:300] if lines else ""

    def close(self) -> None:
        self._client = None
        try:
            self._stack.close()
        except BaseException:  # a server that already died may fail its own shutdown; it is gone either way
            pass


def _describe(err: BaseException) -> str:
    """A one-line reason from what the SDK raised (it wraps failures in exception groups)."""
    while getattr(err, "exceptions", None):  # an ExceptionGroup (built in from Python 3.11 only)
        err = err.exceptions[0]  # type: ignore[attr-defined]
    if isinstance(err, FileNotFoundError):
        return f"program not found ({err.filename or err})"
    if isinstance(err, TimeoutError):
        return "no answer in time"
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _content_text(block: Any) -> str:
    """Text of one result block; images and other media are named, not inlined."""
    text = getattr(block, "text", None)
    if isinstance(text, str):
        return text
    kind = getattr(block, "type", "content")
    return f"[{kind} content not shown]"
