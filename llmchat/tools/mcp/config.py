"""Which MCP server to talk to, and how: `[mcp.NAME]` in the config and `--mcp SPEC` on the command line.

    [mcp.time]                      # stdio: llmchat starts the server as a child process
    command = "mcp-server-time"
    args = ["--local-timezone", "UTC"]
    env = { TZ = "UTC" }            # added to the SDK's safe default environment
    approve = "always"              # default "ask"
    timeout = 30                    # seconds for one call (and for the start)

    [mcp.everything]                # Streamable HTTP: a server that is already running
    url = "http://127.0.0.1:3001/mcp"
    headers = { X-Team = "docs" }
    bearer_token_env = "EVERYTHING_TOKEN"   # `Authorization: Bearer $EVERYTHING_TOKEN`, read when used
    transport = "sse"               # only for older servers (HTTP+SSE); a URL ending in /sse is SSE too

A url server without a token of its own that asks for one (401) is logged in to with OAuth:
`llmchat mcp login NAME` (llmchat.tools.mcp.oauth).

`--mcp "COMMAND ARGS"` starts a server over stdio (named after its program: `mcp-server-time` ->
`time`); `--mcp URL` connects over Streamable HTTP (named after the host, or `NAME=URL`). A server
given so whose name a config table has is that table's server when it is the same one (the same
program and arguments, or the same URL), with its settings (`approve`, `timeout`, `env`, `tools`);
another server of that name is a usage error (ad_hoc_server): one name, one server.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from llmchat.errors import ConfigError, UsageError
from llmchat.tools.spec import APPROVE_POLICIES

Transport = Literal["stdio", "http", "sse"]
TRANSPORTS: tuple[str, ...] = ("stdio", "http", "sse")
_KEYS = ("command", "args", "env", "url", "headers", "bearer_token_env", "transport", "approve", "timeout")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_URL = re.compile(r"^https?://", re.IGNORECASE)


@dataclass(frozen=True)
class McpServerConfig:
    """One server: a command to start (stdio) or a URL to reach (http, sse). No secret is held here:
    a bearer token is read from its environment variable when the connection opens."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    bearer_token_env: str = ""
    transport: Transport = "stdio"
    approve: str = "ask"
    timeout_s: float | None = None
    source: str = ""

    @property
    def target(self) -> str:
        """How messages name where the server is: its program, or its URL."""
        return self.url or self.command

    def http_headers(self) -> dict[str, str]:
        """The headers of every HTTP request, with the bearer token read from its variable now."""
        headers = dict(self.headers)
        if self.bearer_token_env:
            token = os.environ.get(self.bearer_token_env, "")
            if not token:
                raise UsageError(
                    f"MCP server {self.name}: bearer_token_env = {self.bearer_token_env!r}, but that environment "
                    "variable is not set; export it, or remove bearer_token_env"
                )
            headers["Authorization"] = f"Bearer {token}"
        return headers

    @property
    def logs_in(self) -> bool:
        """Whether it may use an OAuth login (llmchat.tools.mcp.oauth): reached by url, and no token
        of its own (bearer_token_env, an Authorization header)."""
        own_token = self.bearer_token_env or any(key.lower() == "authorization" for key in self.headers)
        return self.transport != "stdio" and not own_token

    def status_hint(self, status: int) -> str:
        """What to do about an HTTP refusal, said after its status: log in (OAuth), or check the token."""
        if status == 401 and self.logs_in:
            return f": log in with `llmchat mcp login {self.name}`"
        return ": check its token (bearer_token_env) and headers" if status in (401, 403) else ""


def server_from_config(name: str, settings: Any, config_path: Path | str) -> McpServerConfig:
    where = f"config file {config_path}: mcp.{name}"
    if not _NAME.match(name):
        raise ConfigError(f"{where}: server names are letters, digits, - and _ (they prefix the tool names)")
    if not isinstance(settings, dict):
        raise ConfigError(f'{where} must be a table with command = "..." (and args, env) or url = "http://..."')
    for key in settings:
        if key not in _KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}; use {', '.join(_KEYS)}")
    command, url = settings.get("command"), settings.get("url")
    if command is not None and url is not None:
        raise ConfigError(f"{where}: give command (a server to start) or url (one to reach), not both")
    approve = settings.get("approve", "ask")
    if approve not in APPROVE_POLICIES:
        raise ConfigError(f'{where}: approve must be "ask" or "always"')
    timeout = settings.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ConfigError(f"{where}: timeout must be a number of seconds above 0")
    common: dict[str, Any] = {
        "name": name,
        "approve": approve,
        "timeout_s": float(timeout) if timeout is not None else None,
        "source": f"config:mcp.{name}",
    }
    if url is not None:
        return McpServerConfig(**common, **_remote_settings(where, url, settings))
    for key in ("headers", "bearer_token_env"):
        if key in settings:
            raise ConfigError(f'{where}: {key} is for servers reached by url = "http://..."')
    if settings.get("transport", "stdio") != "stdio":
        raise ConfigError(f'{where}: transport = {settings["transport"]!r} needs url = "http://..."')
    if not isinstance(command, str) or not command:
        raise ConfigError(
            f'{where} needs command = "PROGRAM" (its arguments go in args = [...]) or url = "http://.../mcp"'
        )
    args = settings.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"{where}: args must be a list of strings")
    return McpServerConfig(**common, command=command, args=tuple(args), env=_strings(where, "env", settings))


def _remote_settings(where: str, url: Any, settings: Mapping[str, Any]) -> dict[str, Any]:
    for key in ("args", "env"):
        if key in settings:
            raise ConfigError(f"{where}: {key} is for servers started by command; a url server takes headers")
    if not isinstance(url, str) or not _URL.match(url):
        raise ConfigError(f'{where}: url must be an http:// or https:// address, e.g. "http://127.0.0.1:3001/mcp"')
    token_env = settings.get("bearer_token_env", "")
    if not isinstance(token_env, str) or (token_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token_env)):
        raise ConfigError(f'{where}: bearer_token_env names an environment variable, e.g. "MY_TOKEN"')
    transport = settings.get("transport") or _transport_for(url)
    if transport not in ("http", "sse"):
        raise ConfigError(f'{where}: transport must be "http" (Streamable HTTP) or "sse" for a url server')
    return {
        "url": url,
        "headers": _strings(where, "headers", settings),
        "bearer_token_env": token_env,
        "transport": transport,
    }


def _strings(where: str, key: str, settings: Mapping[str, Any]) -> dict[str, str]:
    table = settings.get(key, {})
    if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
        raise ConfigError(f'{where}: {key} must be a table of strings ({key} = {{ NAME = "value" }})')
    return dict(table)


def _transport_for(url: str) -> Transport:
    """Streamable HTTP, unless the URL is an older server's SSE endpoint."""
    return "sse" if urlsplit(url).path.rstrip("/").endswith("/sse") else "http"


def parse_mcp_spec(spec: str) -> McpServerConfig:
    """`--mcp "COMMAND ARGS"`: split like a POSIX shell would (quotes respected, nothing expanded,
    nothing run through a shell). The server is named after its program: `mcp-server-time` -> `time`.
    `--mcp URL` or `--mcp NAME=URL`: a server reached over HTTP."""
    text = spec.strip()
    named = re.match(r"^([A-Za-z0-9][A-Za-z0-9_-]*)=(https?://\S+)$", text, re.IGNORECASE)
    if named or _URL.match(text):
        url = named.group(2) if named else text
        name = named.group(1) if named else server_name_for_url(url)
        return McpServerConfig(name=name, url=url, transport=_transport_for(url), source=f"--mcp {url}")
    try:
        import shlex  # only for a command line

        words = shlex.split(spec)
    except ValueError as err:
        raise UsageError(f'--mcp {spec!r}: {err}; quote it as one argument, e.g. --mcp "mcp-server-time"') from None
    if not words:
        raise UsageError('--mcp needs a command or a URL, e.g. --mcp "mcp-server-time --local-timezone UTC"')
    return McpServerConfig(
        name=server_name_for(words[0]), command=words[0], args=tuple(words[1:]), source=f"--mcp {words[0]}"
    )


def ad_hoc_server(spec: str, configured: Mapping[str, McpServerConfig]) -> McpServerConfig:
    """`--mcp SPEC` beside the config's servers: the configured one of its name where it is the
    same server, a UsageError where another one has its name, else the server SPEC gives."""
    server = parse_mcp_spec(spec)
    same_name = configured.get(server.name)
    if same_name is None:
        return server
    if _same_server(server, same_name):
        return same_name
    what = f"reaches {same_name.url}" if same_name.url else f"runs {' '.join((same_name.command, *same_name.args))}"
    fix = f"--mcp OTHER={server.url}" if server.url else f"rename the table [mcp.{server.name}]"
    raise UsageError(
        f"--mcp {spec}: the name {server.name} is taken by [mcp.{server.name}] in the config, which {what}; "
        f"use that one with -T mcp:{server.name}, or {fix}"
    )


def _same_server(given: McpServerConfig, configured: McpServerConfig) -> bool:
    """The same URL, or the same program (found on PATH as it would be started) and arguments."""
    if given.url or configured.url:
        return given.url.rstrip("/") == configured.url.rstrip("/")
    return given.args == configured.args and _program(given.command) == _program(configured.command)


def _program(command: str) -> str:
    """The program's path, as PATH finds it; links not followed (two virtual environments'
    `python` links lead to one file, and are two servers)."""
    return os.path.abspath(shutil.which(command) or command)


def server_name_for(program: str) -> str:
    stem = Path(program).name
    stem = re.sub(r"\.(py|js|mjs|exe)$", "", stem)
    stem = re.sub(r"^(mcp[-_]server[-_]|mcp[-_]|server[-_])", "", stem) or stem
    name = re.sub(r"[^A-Za-z0-9_-]", "_", stem).strip("_-")
    return name or "mcp"


def server_name_for_url(url: str) -> str:
    """A URL's server name: the first label of its host (`mcp.example.com` -> `example`), or
    `remote` for an address or localhost (name it with NAME=URL)."""
    host = (urlsplit(url).hostname or "").lower()
    labels = [label for label in host.split(".") if label and label != "mcp"]
    if not labels or host == "localhost" or re.fullmatch(r"[0-9.]+|\[?[0-9a-f:]+\]?", host):
        return "remote"
    name = re.sub(r"[^A-Za-z0-9_-]", "_", labels[0]).strip("_-")
    return name or "remote"


def tool_name(server: str, tool: str) -> str:
    return f"{server}_{tool}"


def configured_servers(config: Any) -> dict[str, McpServerConfig]:
    """Every `[mcp.NAME]` of the config, checked."""
    tables = getattr(config, "mcp", None) or {}
    return {name: server_from_config(name, settings, config.path) for name, settings in tables.items()}


def server_named(config: Any, name: str) -> McpServerConfig:
    """The `[mcp.NAME]` server of the config (an --mcp SPEC is parse_mcp_spec's)."""
    servers = configured_servers(config)
    if name not in servers:
        known = ", ".join(sorted(servers)) or "none in the config"
        raise UsageError(
            f"no MCP server named {name!r} (configured: {known}); add an [mcp.{name}] table to the config, "
            'or give the server with --mcp "COMMAND ARGS" or --mcp URL'
        )
    return servers[name]
