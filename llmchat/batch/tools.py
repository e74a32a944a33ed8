"""Tools in a batch: the command line's tools and each item's own, resolved and checked before the
model loads, and offered to the session item by item.

An item without `tools` gets the command line's (-T, --functions, --mcp; possibly none). An item
with `tools` gets exactly those: each name as `-T` takes it (a configured `[tools.NAME]`, or
`mcp:SERVER` for every tool of a configured server or of one started with --mcp), or the name of a
tool the command line offers (a --functions function, an MCP tool `SERVER_TOOL`); `[]` is none.
Its `tool_choice` replaces --tool-choice. Every name and choice is checked here, before the load:
a bad one is a usage error naming the item, and nothing runs.

Nobody is at a terminal to approve a call in a batch, so tools are offered only when every tool an
item may call runs without asking: `--approve-tools`, or the tool's `approve = "always"`. Otherwise
the run stops here (exit 2) with one line saying how to allow it: no call is ever refused mid-run,
and no side effect happens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmchat.errors import UsageError
from llmchat.output import notice
from llmchat.tools.choice import MODES, parse_tool_choice
from llmchat.tools.mcp.config import ad_hoc_server, configured_servers
from llmchat.tools.registry import MCP_PREFIX, ToolSet, gather_tools

if TYPE_CHECKING:
    from llmchat.batch.items import BatchItem
    from llmchat.config import Config
    from llmchat.tools.offer import ToolOffer
    from llmchat.tools.options import ToolRequest
    from llmchat.tools.spec import ToolSpec
    from llmchat.turn.session import ChatSession
    from llmchat.turn.structured import StructuredOutput


def item_label(item: BatchItem) -> str:
    """How messages name an item: its id as JSON (7 and "7" differ)."""
    return f"item {json.dumps(item.id, ensure_ascii=False)}"


@dataclass(frozen=True)
class ItemTools:
    """What one item offers the model: these tools, with this choice."""

    names: tuple[str, ...]
    choice: str


@dataclass
class BatchTools:
    """The tools of a whole batch: every tool any item may call (MCP servers running), and which
    items call tools with which. close() stops the servers."""

    request: ToolRequest
    toolsets: list[ToolSet] = field(default_factory=list)
    by_item: dict[int, ItemTools] = field(default_factory=dict)  # item index -> its tools (tool items only)
    _offers: dict[ItemTools, ToolOffer] = field(default_factory=dict)

    @property
    def specs(self) -> dict[str, ToolSpec]:
        return {name: spec for toolset in self.toolsets for name, spec in toolset.tools.items()}

    def for_item(self, item: BatchItem) -> ItemTools | None:
        """The item's tools, or None for an item answered without tools."""
        return self.by_item.get(item.index)

    def make_offers(self, session: ChatSession) -> None:
        """Build (and check) every distinct offer once the model is loaded, before any item runs:
        a template or server that cannot take tools is a usage error with nothing written."""
        from llmchat.tools.offer import ToolIO, make_offer

        specs = self.specs
        said: set[str] = set()

        def once(line: str) -> None:  # the generic format's notice: once per batch, not per offer
            if line not in said:
                said.add(line)
                notice(line)

        for wanted in dict.fromkeys(self.by_item.values()):
            self._offers[wanted] = make_offer(
                session,
                [specs[name] for name in wanted.names],
                ToolIO(show_call=notice, notice=once),
                tool_choice=wanted.choice,
                chain_limit=self.request.chain_limit,
                approve_all=self.request.approve_all,
                interactive=False,  # nobody is at a terminal: never ask
            )

    def offer_for(self, item: BatchItem) -> ToolOffer:
        """The item's offer, its calls and notices on stderr naming the item."""
        from llmchat.tools.offer import ToolIO

        offer = self._offers[self.by_item[item.index]]
        label = item_label(item)
        offer.io = ToolIO(
            show_call=lambda text: notice(f"{label}: tool call: {text}"),
            notice=lambda line: notice(f"{label}: {line}"),
        )
        return offer

    def close(self) -> None:
        for toolset in self.toolsets:
            toolset.close()


def plan_tools(
    request: ToolRequest, items: Sequence[BatchItem], structured: StructuredOutput | None, config: Config
) -> BatchTools | None:
    """Resolve and check the tools of these items (the ones about to run), starting the MCP servers
    they need. None when no item offers tools. UsageError (exit 2) naming the item for a bad name
    or choice, a tool item held to a schema, or tools that would need someone to approve them."""
    runnable = [item for item in items if not item.error]
    if not request.wanted and not any(item.tools for item in runnable) and request.tool_choice not in ("auto", "none"):
        raise UsageError(
            f"--tool-choice {request.tool_choice}: no tools are offered; add -T, --functions or --mcp, "
            'or "tools" to the items'
        )
    if not request.wanted and not any(item.tools or item.tool_choice for item in runnable):
        return None
    plan = BatchTools(request)
    try:
        plan.toolsets.append(gather_tools(config, request.tools, request.functions, request.mcp, keep_going=True))
        base = plan.toolsets[0]
        for down in base.down.values():  # the items go on without its tools
            notice(f"llmchat: {down}; going on without its tools")
        servers = _server_sources(config, request)
        extra = _extra_names(runnable, base, servers, config)
        for name in extra:  # an item names a server that did not start: its reason, not a config lookup
            not_started = base.down.get(name[len(MCP_PREFIX) :]) if name.startswith(MCP_PREFIX) else None
            if not_started is not None:
                raise UsageError(f"an item names {name}, but {not_started}")
        if extra:
            plan.toolsets.append(gather_tools(config, extra))
            clashes = ToolSet()
            for spec in (*base.specs(), *plan.toolsets[1].specs()):
                clashes.add(spec)  # two tools with one name: refused, naming both sources
        base_names, every = list(base.tools), plan.specs
        for item in runnable:
            wanted = _item_tools(item, request, base_names, every, servers)
            if wanted is not None:
                if structured is not None or item.structured is not None:
                    raise UsageError(
                        f"{item_label(item)} (line {item.line}): tools and a schema (--schema, --format, --grammar "
                        'or its own "schema") cannot be combined; drop one, or give it "tools": []'
                    )
                plan.by_item[item.index] = wanted
        _check_approval(plan)
    except BaseException:
        plan.close()
        raise
    if not plan.by_item:  # every item answers without tools (tool_choice none, "tools": [])
        plan.close()
        return None
    return plan


def _server_sources(config: Config, request: ToolRequest) -> dict[str, str]:
    """Each MCP server name an item may write as `mcp:NAME`, and the source its tools carry."""
    configured = configured_servers(config)
    sources = {name: server.source for name, server in configured.items()}
    for spec in request.mcp:
        server = ad_hoc_server(spec, configured)
        sources[server.name] = server.source
    return sources


def _extra_names(items: Sequence[BatchItem], base: ToolSet, servers: dict[str, str], config: Config) -> list[str]:
    """The names items give that the command line did not offer: `-T` names to gather as well.
    A name that is neither is a usage error naming the first item that gives it."""
    tables = getattr(config, "tools", None) or {}
    offered_sources = {spec.source for spec in base.tools.values()}
    extra: list[str] = []
    for item in items:
        for name in item.tools or ():
            if name in base.tools or name in extra:
                continue
            if name.startswith(MCP_PREFIX):
                server = name[len(MCP_PREFIX) :]
                if server not in servers:
                    known = ", ".join(sorted(servers)) or "none"
                    raise UsageError(
                        f"{item_label(item)} (line {item.line}): tools: no MCP server {server!r} "
                        f"(configured or given with --mcp: {known}); add an [mcp.{server}] table"
                    )
                if servers[server] not in offered_sources:
                    extra.append(name)
            elif name in tables:
                extra.append(name)
            else:
                offered = ", ".join(base.tools) or "none"
                configured = ", ".join(sorted(tables)) or "none"
                raise UsageError(
                    f"{item_label(item)} (line {item.line}): tools: no tool {name!r} (offered on the command "
                    f"line: {offered}; configured: {configured}); use a [tools.NAME], mcp:SERVER or an offered tool"
                )
    return extra


def _item_tools(
    item: BatchItem,
    request: ToolRequest,
    base_names: list[str],
    every: dict[str, ToolSpec],
    servers: dict[str, str],
) -> ItemTools | None:
    """The item's tools and choice, checked; None when it is answered without tools."""
    where = f"{item_label(item)} (line {item.line})"
    if item.tools is None:
        names = base_names
    else:
        resolved: list[str] = []
        for name in item.tools:
            if name.startswith(MCP_PREFIX) and name not in every:
                source = servers[name[len(MCP_PREFIX) :]]
                resolved.extend(spec.name for spec in every.values() if spec.source == source)
            else:
                resolved.append(name)
        names = list(dict.fromkeys(resolved))
    choice = item.tool_choice or request.tool_choice
    if not names:  # answered without tools; --tool-choice is for the items that have some
        if item.tool_choice not in (None, "auto", "none"):
            raise UsageError(
                f"{where}: tool_choice {item.tool_choice!r}, but no tools are offered to it; "
                'give it "tools" or drop the choice'
            )
        return None
    try:
        parse_tool_choice(choice, names)
    except UsageError:
        given = f"tool_choice {choice!r}" if item.tool_choice else f"--tool-choice {choice}"
        raise UsageError(
            f"{where}: {given} is not one of {', '.join([*MODES, *names])}"
            + ("" if item.tool_choice else '; give the item its own "tool_choice"')
        ) from None
    if choice == "none":
        return None
    return ItemTools(tuple(names), choice)


def _check_approval(plan: BatchTools) -> None:
    """Every tool an item may call must run without asking: nobody is at a terminal to approve."""
    if plan.request.approve_all:
        return
    specs = plan.specs
    asking = [
        name
        for name in dict.fromkeys(name for wanted in plan.by_item.values() for name in wanted.names)
        if specs[name].approve != "always"
    ]
    if asking:
        shown = ", ".join(asking[:5]) + (f" and {len(asking) - 5} more" if len(asking) > 5 else "")
        raise UsageError(
            f"nobody is at a terminal to approve the calls of a batch ({shown}); add --approve-tools to run them, "
            'set approve = "always" in their config tables, or give the items "tools": []'
        )
