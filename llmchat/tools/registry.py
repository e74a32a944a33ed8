"""Every tool source together, in one namespace.

`-T NAME` names a `[tools.NAME]` command, `-T mcp:NAME` offers every tool of `[mcp.NAME]`,
`--functions FILE.py` adds a file's public functions and `--mcp "COMMAND ARGS"` starts a server
ad hoc. With no selection at all (`llmchat tools list` bare), every configured tool and server is
gathered. Two tools with one name are refused, naming both sources: nothing is silently shadowed.

Picking (issue 41: one server can offer tens of thousands of tokens of schemas): any other -T
name (`--tools` is the same flag; names may be comma-separated, and globs such as `everything_get-*`
are taken) keeps only the tools it matches of those the other names, --functions and --mcp offer;
a name that matches nothing is a usage error listing what is offered. The config's per-server
`tools = [...]` key of an [mcp.NAME] table (read apart by llmchat.config as `mcp_tools`) does the
same for that server's tools, by their names with or without the `NAME_` prefix. Both stay in force
when a server lists its tools again.

The ToolSet owns the MCP connections it started: llmchat.tools.mcp.sources reads resources and prompts
through the same ones (one start per server). With `keep_going` (ask, chat, batch) a server that
cannot start or be reached is kept in `down` with its one-line reason instead of stopping the run:
the turn goes on with the other tools. `refresh_changed()` lists again the tools of a server that
sent notifications/tools/list_changed, and says what changed (llmchat.tools.offer re-offers them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from llmchat.errors import UsageError
from llmchat.tools.command_tools import command_tool
from llmchat.tools.functions import load_functions
from llmchat.tools.mcp.config import McpServerConfig, ad_hoc_server, configured_servers
from llmchat.tools.mcp.connection import McpConnection
from llmchat.tools.mcp.failures import McpServerDown
from llmchat.tools.spec import ToolSpec

if TYPE_CHECKING:
    from llmchat.config import Config

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
    # --tools: the names and globs a server's tool must match to be offered (empty: every tool).
    picks: tuple[str, ...] = ()
    # The config's per-server `tools = [...]`, by server name (llmchat.config's mcp_tools).
    server_picks: dict[str, tuple[str, ...]] = field(default_factory=dict)

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
        for spec in self._server_offer(server.name, connection.tools, check=True):
            self.add(spec)

    def _server_offer(self, server: str, specs: Sequence[ToolSpec], *, check: bool = False) -> list[ToolSpec]:
        """The server's tools its config's `tools = [...]` and --tools keep. `check`: a config name
        that matches none of them is a usage error listing what the server offers."""
        wanted = self.server_picks.get(server)
        if wanted is not None:
            if check:
                _check_matched(wanted, [spec.name for spec in specs], f"[mcp.{server}] tools", prefix=f"{server}_")
            specs = [spec for spec in specs if picked(spec.name, wanted, prefix=f"{server}_")]
        return [spec for spec in specs if not self.picks or picked(spec.name, self.picks)]

    def keep_only(self, picks: Sequence[str], named: Iterable[str] = ()) -> None:
        """--tools: keep the tools these names or globs match, and the config tools `named` by -T.
        A pick that matches nothing is a usage error listing the tools offered, unless it names a
        tool of a server that did not start (say_down tells of that server)."""
        down_prefixes = tuple(f"{name}_" for name in self.down)
        checked = [pick for pick in picks if not pick.startswith(down_prefixes)]
        _check_matched(checked, list(self.tools), "--tools")
        self.picks = tuple(picks)
        kept = set(named)
        self.tools = {name: spec for name, spec in self.tools.items() if name in kept or picked(name, self.picks)}

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
            for spec in self._server_offer(server.server.name, server.refresh_tools()):
                self.add(spec)
            after = [name for name, spec in self.tools.items() if spec.source == source]
            added = tuple(name for name in after if name not in before)
            removed = tuple(name for name in before if name not in after)
            changes.append(ToolChange(server.server.name, added, removed))
        return changes


def gather_tools(
    config: Config,
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
    picks: list[str] = []
    if everything_configured:
        wanted_tools = list(tool_tables)
        wanted_servers = list(servers.values())
    for name in split_names(tool_names):
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
            picks.append(name)  # one of the offered tools, checked once they are listed
    for given in mcp_specs:  # a configured server given again with --mcp is started once
        server = ad_hoc_server(given, servers)
        if server not in wanted_servers:
            wanted_servers.append(server)
    _check_unique_servers(wanted_servers)
    if picks and not (wanted_tools or wanted_servers or functions_files):
        known = ", ".join(sorted(tool_tables)) or "none in the config"
        raise UsageError(
            f"-T {picks[0]}: no tool of that name in the config (configured: {known}); "
            "add a [tools.NAME] table, or use -T mcp:SERVER for an [mcp.SERVER]"
        )

    toolset = ToolSet(saved_conversation=saved_conversation, server_picks=configured_picks(config))
    try:
        for name in wanted_tools:
            toolset.add(command_tool(name, tool_tables[name], config.path))
        for file in functions_files:
            for spec in load_functions(file):
                toolset.add(spec)
        for server in wanted_servers:
            toolset.start_server(server, keep_going=keep_going)
        if picks:
            toolset.keep_only(picks, named=wanted_tools)
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


def split_names(names: Iterable[str]) -> list[str]:
    """-T / --tools values, each possibly `a,b,c`: the names in order, blanks left out."""
    return [part.strip() for name in names for part in name.split(",") if part.strip()]


def is_pick(name: str, config: Config) -> bool:
    """A -T / --tools name that picks among the offered tools, rather than naming a source."""
    return not name.startswith(MCP_PREFIX) and name not in (getattr(config, "tools", None) or {})


def picked(name: str, patterns: Iterable[str], *, prefix: str = "") -> bool:
    """Whether a tool's name matches one of the names or globs (with `prefix` put before each too)."""
    return any(fnmatchcase(name, pattern) or (prefix and fnmatchcase(name, prefix + pattern)) for pattern in patterns)


def configured_picks(config: Config) -> dict[str, tuple[str, ...]]:
    """The config's per-server `tools = [...]` (llmchat.config reads it apart from the table)."""
    return {name: tuple(names) for name, names in (getattr(config, "mcp_tools", None) or {}).items()}


def _check_matched(patterns: Iterable[str], names: Sequence[str], what: str, *, prefix: str = "") -> None:
    for pattern in patterns:
        if not any(picked(name, [pattern], prefix=prefix) for name in names):
            offered = ", ".join(names) or "none"
            raise UsageError(f"{what} {pattern}: no tool of that name is offered (offered: {offered})")
