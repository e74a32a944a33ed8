"""The tools of one MCP server as llmchat sees them: listed (those it cannot call left out, with
the reason), kept up to date when the server says they changed, each a ToolSpec whose call runs
the server's tool, as a task where it supports one (llmchat.tools.mcp.tasks), with a progress line,
and its result handled (llmchat.tools.mcp.results).
"""

from __future__ import annotations

import concurrent.futures
import math
from typing import Any

from llmchat.tools.mcp.config import tool_name
from llmchat.tools.mcp.loop import PAGE_LIMIT, McpLoop
from llmchat.tools.mcp.progress import ProgressLine
from llmchat.tools.mcp.results import HandledResult, handle_result
from llmchat.tools.mcp.tasks import call_as_task, left_out_reason, runs_as_task
from llmchat.tools.spec import EMPTY_OBJECT_SCHEMA, ToolFailure, ToolSpec


class ServerTools(McpLoop):
    """The tools role of McpConnection (its state set by McpConnection.__init__)."""

    tools: list[ToolSpec]
    left_out: dict[str, str]  # the server's tools llmchat cannot call, and why
    _output_schemas: dict[str, dict[str, Any] | None]
    _task_tools: set[str]  # the tools called as tasks
    _watcher: concurrent.futures.Future[None] | None  # the tools' listen stream, read

    async def _list_tools(self) -> list[Any]:
        tools: list[Any] = []
        cursor: str | None = None
        for _ in range(PAGE_LIMIT):
            page = await self._client.list_tools(cursor=cursor, cache_mode="bypass")
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    def _set_tools(self, listed: list[Any]) -> None:
        usable = []
        capabilities = self._client.server_capabilities
        for tool in listed:
            reason = left_out_reason(tool, capabilities)
            if reason is not None:
                if tool.name not in self.left_out:
                    self.notify(f"llmchat: {self.label}: the tool {tool.name} is left out: {reason}")
                self.left_out[tool.name] = reason
            else:
                usable.append(tool)
        self._output_schemas = {tool.name: tool.output_schema for tool in usable}
        self._task_tools = {tool.name for tool in usable if runs_as_task(tool, capabilities)}
        self.tools = [self._spec(tool) for tool in usable]
        self._tools_stale = False

    def _watch_tools(self) -> None:
        """At the 2026-07-28 revision a server says its tools changed only on a
        `subscriptions/listen` stream the client opens (older ones send the notification as is:
        _on_message): open one, acknowledged before the first call, and mark the tools stale on
        each event. A server that cannot listen keeps the tools it first listed."""
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        tools = getattr(self._client.server_capabilities, "tools", None)
        if self._client.protocol_version not in MODERN_PROTOCOL_VERSIONS or not getattr(tools, "list_changed", None):
            return
        try:
            listen = self._client.listen(tools_list_changed=True)
            subscription = self._stack.enter_context(self._portal.wrap_async_context_manager(listen))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:
            return

        async def drain() -> None:
            try:
                async for _event in subscription:  # the only events asked for: tools changed
                    self._tools_stale = True
            except Exception:  # the stream was lost: the tools stay as last listed
                pass

        self._watcher = self._portal.start_task_soon(drain)

    @property
    def tools_changed(self) -> bool:
        """Whether the server said its tools changed (`notifications/tools/list_changed`) since the
        last listing."""
        return self._tools_stale

    def refresh_tools(self) -> list[ToolSpec]:
        """List the tools again (after tools_changed); a failure keeps the last listing, with a notice."""
        try:
            self._set_tools(self._run(self._bounded, self._list_tools, self.request_timeout_s))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:
            self._tools_stale = False
            self.notify(f"llmchat: {self.label}: its tools changed, but listing them failed ({self._failure(err)})")
        return self.tools

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
        """The tool's result as text for the model; ToolFailure for any failure (isError included)."""
        return self.call_handled(tool, arguments, timeout_s).text_for_model()

    def call_handled(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> HandledResult:
        """The tool's result, handled (media saved, structured content checked), isError kept as a
        flag. ToolFailure when there is no result."""
        if self._client is None:
            raise ToolFailure(f"{self.label} is not running")
        line = ProgressLine(self.stderr, tool_name(self.server.name, tool))

        async def progress(value: float, total: float | None, message: str | None) -> None:
            line.update(value, total, message)

        async def send() -> Any:
            if tool in self._task_tools:
                return await call_as_task(self._client.session, tool, arguments, line, timeout_s)
            # No clock of the SDK's own (inf): _bounded's deadline, which stops while a person answers the server.
            return await self._client.call_tool(
                tool, arguments, read_timeout_seconds=math.inf, progress_callback=progress
            )

        try:
            result = self._run(self._bounded, send, timeout_s)
        except TimeoutError:
            unfinished = f"'s task {tool} did not finish" if tool in self._task_tools else " did not answer"
            raise ToolFailure(f"{self.label}{unfinished} within {timeout_s:g} s") from None
        except (KeyboardInterrupt, SystemExit):  # the user stopped the call: the turn ends, as in decode
            raise
        except ToolFailure as err:  # a task the server failed or cancelled
            raise ToolFailure(f"{self.label}: {err}") from None
        except BaseException as err:  # the server died or broke the protocol: text for the model
            raise ToolFailure(f"{self.label} failed: {self._failure(err)}") from None
        finally:
            line.end()
        return handle_result(
            tool_name(self.server.name, tool),
            result,
            self._output_schemas.get(tool),
            self._media_dir(),
            self.notify,
        )
