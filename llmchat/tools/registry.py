"""Every tool source together, in one namespace.

`-T NAME` names a `[tools.NAME]` command, `-T mcp:NAME` offers every tool of `[mcp.NAME]`,
`--functions FILE.py` adds a file's public functions and `--mcp "COMMAND ARGS"` starts a server
ad hoc. With no selection at all (`llmchat tools list` bare), every configured tool and server is
gathered. Two tools with one name are refused, naming both sources: nothing is silently shadowed.

The ToolSet owns the MCP connections it started: llmchat.mcp_sources reads resources and prompts
through the same ones (one start per server). With `keep_going` (ask, chat, batch) a server that
cannot start or be reached is kept in `down` with its one-line reason instead of stopping the run:
the turn goes on with the other tools. `refresh_changed()` lists again the tools of a server that
sent notifications/tools/list_changed, and says what changed (llmchat.tools.offer re-offers them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from llmchat.errors import UsageError
from llmchat.tools.command_tools import command_tool
from llmchat.tools.functions import load_functions
from llmchat.tools.mcp.config import McpServerConfig, configured_servers, parse_mcp_spec
from llmchat.tools.mcp.connection import McpConnection
from llmchat.tools.mcp.failures import McpServerDown
from llmchat.tools.spec import ToolSpec

MCP_PREFIX = "mcp:"


@dataclass(frozen=True)
class ToolChange:
    """A server's tools listed again after it said they changed: the names added and removed."""

    server: str
    added: tuple[str, ...]
    removed: tuple[str, ...]

    def notice(self) -> str:
        changes = [f"+{name}" for name in self.added] + [f"-{name}" for name in self.removed]
        return f"MCP server {self.server} changed its tools: {' '.join(changes) or 'the same names, new definitions'}"


@dataclass
class ToolSet:
    """The tools offered for one run, and the MCP servers kept running for them (close() ends them)."""

    tools: dict[str, ToolSpec] = field(default_factory=dict)
    _stack: ExitStack = field(default_factory=ExitStack, repr=False)
    _servers: list[McpConnection] = field(default_factory=list, repr=False)
    # The servers that could not start or be reached, by name: the run goes on without their tools.
    down: dict[str, McpServerDown] = field(default_factory=dict)
    # False: the run's conversation is not saved, nor are the images its servers return (results.media_folder).
    saved_conversation: bool = True

    def add(self, spec: ToolSpec) -> None:
        existing = self.tools.get(spec.name)
        if existing is not None:
            raise UsageError(
                f"two tools are named {spec.name} ({existing.source} and {spec.source}); rename one of them"
            )
        self.tools[spec.name] = spec

    def __enter__(self) -> ToolSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()

    def specs(self) -> list[ToolSpec]:
        return list(self.tools.values())

    def start_server(self, server: McpServerConfig, *, keep_going: bool = False) -> None:
        """Start (or reach) an MCP server, kept running until close(), and add its tools.
        `keep_going`: a server that cannot start is kept in `down`, not raised."""
        try:
            connection = self._stack.enter_context(McpConnection(server, saved_conversation=self.saved_conversation))
        except McpServerDown as err:
            if not keep_going:
                raise
            self.down[server.name] = err
            return
        self._servers.append(connection)
        for spec in connection.tools:
            self.add(spec)

    def connection(self, name: str) -> McpConnection | None:
        """The running server NAME of this set (None: not one of its servers). McpServerDown for
        one that could not start."""
        if name in self.down:
            raise self.down[name]
        return next((server for server in self._servers if server.server.name == name), None)

    def refresh_changed(self) -> list[ToolChange]:
        """List again the tools of each server that said they changed (notifications/tools/list_changed):
        its tools are replaced by the new listing. Returns what changed, per server listed again."""
        changes = []
        for server in [server for server in self._servers if server.tools_changed]:
            source = server.server.source or f"mcp:{server.server.name}"
            before = [name for name, spec in self.tools.items() if spec.source == source]
            self.tools = {name: spec for name, spec in self.tools.items() if spec.source != source}
            for spec in server.refresh_tools():
                self.add(spec)
            after = [name for name, spec in self.tools.items() if spec.source == source]
            added = tuple(name for name in after if name not in before)
            removed = tuple(name for name in before if name not in after)
            changes.append(ToolChange(server.server.name, added, removed))
        return changes


def gather_tools(
    config: Any,
    tool_names: Sequence[str] = (),
    functions_files: Sequence[str] = (),
    mcp_specs: Sequence[str] = (),
    *,
    everything_configured: bool = False,
    keep_going: bool = False,
    saved_conversation: bool = True,
) -> ToolSet:
    """The ToolSet for these selections. MCP servers are started here (and stopped by close()).
    `keep_going`: a server that cannot start is kept in the set's `down`, the others' tools offered.
    `saved_conversation`: False where the history is off, so the servers' images are not kept either."""
    tool_tables: dict[str, Any] = getattr(config, "tools", None) or {}
    servers = configured_servers(config)
    wanted_tools: list[str] = []
    wanted_servers: list[McpServerConfig] = []
    if everything_configured:
        wanted_tools = list(tool_tables)
        wanted_servers = list(servers.values())
    for name in tool_names:
        if name.startswith(MCP_PREFIX):
            server_name = name[len(MCP_PREFIX) :]
            if server_name not in servers:
                known = ", ".join(sorted(servers)) or "none in the config"
                raise UsageError(f"-T {name}: no [mcp.{server_name}] in the config ({known}); add it or use --mcp")
            if servers[server_name] not in wanted_servers:
                wanted_servers.append(servers[server_name])
        elif name in tool_tables:
            if name not in wanted_tools:
                wanted_tools.append(name)
        else:
            known = ", ".join(sorted(tool_tables)) or "none in the config"
            raise UsageError(
                f"-T {name}: no tool of that name in the config (configured: {known}); "
                "add a [tools.NAME] table, or use -T mcp:SERVER for an [mcp.SERVER]"
            )
    wanted_servers.extend(parse_mcp_spec(spec) for spec in mcp_specs)
    _check_unique_servers(wanted_servers)

    toolset = ToolSet(saved_conversation=saved_conversation)
    try:
        for name in wanted_tools:
            toolset.add(command_tool(name, tool_tables[name], config.path))
        for file in functions_files:
            for spec in load_functions(file):
                toolset.add(spec)
        for server in wanted_servers:
            toolset.start_server(server, keep_going=keep_going)
    except BaseException:
        toolset.close()
        raise
    return toolset


def _check_unique_servers(servers: Iterable[McpServerConfig]) -> None:
    seen: dict[str, McpServerConfig] = {}
    for server in servers:
        if server.name in seen:
            raise UsageError(
                f"two MCP servers are named {server.name} ({seen[server.name].source or 'config'} and "
                f"{server.source}); their tools would share the prefix {server.name}_"
            )
        seen[server.name] = server
