"""One running MCP server: its tools, resources and prompts, called like functions.

The SDK is asynchronous; McpConnection keeps one event loop in a background thread (anyio's
blocking portal) so the rest of llmchat calls it like a function. Every request is bounded in time
(the server's `timeout`, or the caller's for a tool call), and every failure is one line: an
McpServerDown (a UsageError) when the server cannot start, a ToolFailure (text for the model) when a tool call
fails, an McpFailure for a resource or prompt request.

The client declares roots (llmchat.tools.mcp.roots: the --root folders and the server's own, if
any) and elicitation (llmchat.tools.mcp.elicitation: asked on the terminal, declined at once without one).
A question is asked on the thread that waits for the call (llmchat.tools.mcp.desk), and the call's
time limit stops while it is open; so is sampling, where the run has a model (llmchat.tools.mcp.sampling).
Ctrl-C during a call cancels that request (the SDK sends `notifications/cancelled`) before the
KeyboardInterrupt goes on to end the turn. Tools with `taskSupport` run as tasks (llmchat.tools.mcp.tasks).
"""

from __future__ import annotations

import concurrent.futures
import math
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any, TypeVar

from llmchat.errors import UsageError
from llmchat.output import notice
from llmchat.tools.mcp import failures, sdk_logs
from llmchat.tools.mcp.catalog import (
    PromptInfo,
    PromptMessageText,
    ResourceContent,
    ResourceInfo,
    ResourceTemplateInfo,
    prompt_info,
    resource_info,
    template_info,
)
from llmchat.tools.mcp.config import McpServerConfig, tool_name
from llmchat.tools.mcp.desk import PersonDesk
from llmchat.tools.mcp.failures import McpFailure, McpServerDown, ProtocolBroken, answered, describe, malformed, root
from llmchat.tools.mcp.progress import ProgressLine
from llmchat.tools.mcp.results import HandledResult, block_text, decoded, handle_result, media_folder
from llmchat.tools.mcp.sampling import person_callbacks
from llmchat.tools.mcp.tasks import call_as_task, left_out_reason, runs_as_task
from llmchat.tools.process_group import signal_group
from llmchat.tools.spec import DEFAULT_TIMEOUT_S, EMPTY_OBJECT_SCHEMA, ToolFailure, ToolSpec

INSTALL_HINT = "MCP servers need the mcp package: pip install 'llmchat[mcp]'"
PAGE_LIMIT = 100  # pages of one listing: a server whose cursor never ends cannot hang a listing
CANCEL_GRACE_S = 2.0  # how long Ctrl-C waits for the cancellation to reach the server
CONNECT_RETRY_PAUSES_S = (0.5, 1.0, 2.0)  # a refused HTTP connection at the start: tried again after each

_T = TypeVar("_T")


def require_mcp() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise UsageError(INSTALL_HINT) from None


class McpConnection:
    """One running server. open() starts it (or connects to it) and lists its tools; call() runs
    one; the resource and prompt methods read the rest; close() ends it.

        with McpConnection(server_named(config, "everything")) as server:
            server.list_prompts()
    """

    def __init__(
        self,
        server: McpServerConfig,
        startup_timeout_s: float | None = None,
        *,
        stderr: IO[str] | None = None,
        media_dir: Path | None = None,
        lists_tools: bool = True,
        saved_conversation: bool = True,
    ):
        self.server = server
        # False: opened for its resources and prompts only (llmchat.tools.mcp.sources), its tools not listed.
        self.lists_tools = lists_tools
        self.startup_timeout_s = startup_timeout_s or server.timeout_s or DEFAULT_TIMEOUT_S
        self.request_timeout_s = server.timeout_s or DEFAULT_TIMEOUT_S
        self.stderr = stderr or sys.stderr
        self.media_dir = media_dir
        # False: the conversation is not saved (--no-history), so neither are its images (results.media_folder).
        self.saved_conversation = saved_conversation
        self._stack = ExitStack()
        self._portal: Any = None
        self._client: Any = None
        self._errlog: Any = None
        self._output_schemas: dict[str, dict[str, Any] | None] = {}
        self._active_scope: Any = None
        self._protocol_error = ""
        self._tools_stale = False
        self._watcher: concurrent.futures.Future[None] | None = None  # the tools' listen stream, read
        self.tools: list[ToolSpec] = []
        self.left_out: dict[str, str] = {}  # the server's tools llmchat cannot call, and why
        self._task_tools: set[str] = set()  # the tools called as tasks
        self._http_status: int | None = None  # the last HTTP error status the server answered with
        self._desk = PersonDesk()  # elicitation's questions, asked on the thread that waits for a call
        self._server_pid: int | None = None  # a stdio server's, its process group's id

    def __enter__(self) -> McpConnection:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def label(self) -> str:
        return f"MCP server {self.server.name}"

    def notify(self, line: str) -> None:
        notice(line, self.stderr)

    def open(self) -> list[ToolSpec]:
        require_mcp()
        from anyio.from_thread import start_blocking_portal
        from mcp import Client
        from mcp_types import Implementation

        from llmchat import __version__
        from llmchat.tools.mcp.roots import list_roots_callback
        from llmchat.tools.mcp.transports import client_transport

        self._errlog = self._stack.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace"))
        self._portal = self._stack.enter_context(start_blocking_portal())
        self._stack.enter_context(sdk_logs.told_as(self.label, self.stderr, self._portal))
        try:
            roots = list_roots_callback(self.server)  # a config root that is not a folder: exit 2
            for pause in (*CONNECT_RETRY_PAUSES_S, None):
                # read_timeout_seconds bounds the handshake (a server that never answers) and each request.
                client = Client(
                    client_transport(self.server, self._errlog, self._heard_http_error, self._heard_pid),
                    read_timeout_seconds=self.startup_timeout_s,
                    message_handler=self._on_message,
                    client_info=Implementation(name="llmchat", version=__version__),
                    list_roots_callback=roots,
                    **person_callbacks(self.label, self.server, self._desk, self.stderr),
                )
                try:
                    self._client = self._stack.enter_context(self._portal.wrap_async_context_manager(client))
                    break
                except Exception as err:  # a URL server still starting refuses: a few more tries, as --server's
                    if pause is None or not self.server.url or type(root(err)).__name__ != "ConnectError":
                        raise
                    time.sleep(pause)
            listed = self._run(self._bounded, self._list_tools, self.startup_timeout_s) if self.lists_tools else []
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C or SIGTERM while it starts: not its failure
            self.close()
            raise
        except UsageError:
            self.close()
            raise
        except BaseException as err:  # a server that cannot start: one line, with its last stderr line
            detail = self._failure(err)
            if "timed out" in detail or detail == "no answer in time":
                detail = f"no answer within {self.startup_timeout_s:g} s"
            self.close()
            failed = "could not be reached" if self.server.url else "did not start"
            raise McpServerDown(f"{self.label} ({self.server.target}) {failed}: {detail}", self.server.name) from None
        self._set_tools(listed)
        if self.lists_tools:
            self._watch_tools()
        return self.tools

    # --- tools -------------------------------------------------------------------------------

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

    # --- resources and prompts ---------------------------------------------------------------

    def _capable(self, feature: str) -> bool:
        capabilities = self._client.server_capabilities if self._client is not None else None
        return capabilities is not None and getattr(capabilities, feature, None) is not None

    def _listing(self, what: str, fetch: Callable[[str | None], Awaitable[Any]], field: str) -> list[Any]:
        async def walk() -> list[Any]:
            items: list[Any] = []
            cursor: str | None = None
            for _ in range(PAGE_LIMIT):
                page = await fetch(cursor)
                items.extend(getattr(page, field))
                cursor = page.next_cursor
                if not cursor:
                    break
            return items

        return self._request(what, walk)

    def list_resources(self) -> tuple[ResourceInfo, ...]:
        if not self._capable("resources"):
            return ()
        listed = self._listing(
            "listing its resources",
            lambda cursor: self._client.list_resources(cursor=cursor, cache_mode="bypass"),
            "resources",
        )
        return tuple(resource_info(resource) for resource in listed)

    def list_resource_templates(self) -> tuple[ResourceTemplateInfo, ...]:
        if not self._capable("resources"):
            return ()
        listed = self._listing(
            "listing its resource templates",
            lambda cursor: self._client.list_resource_templates(cursor=cursor, cache_mode="bypass"),
            "resource_templates",
        )
        return tuple(template_info(template) for template in listed)

    def read_resource(self, uri: str) -> tuple[ResourceContent, ...]:
        """The resource's contents: text, or a blob's bytes (kept in memory, never saved to a file)."""
        self._require("resources", f"it has no resources to read ({uri})")

        async def read() -> Any:
            return await self._client.read_resource(uri, cache_mode="bypass")

        result = self._request(f"reading {uri}", read)
        contents: list[ResourceContent] = []
        for part in result.contents:
            text = getattr(part, "text", None)
            if isinstance(text, str):
                contents.append(ResourceContent(str(part.uri), part.mime_type, text))
                continue
            mime = part.mime_type or "application/octet-stream"
            try:
                data = decoded(str(part.blob), mime)
            except ToolFailure as err:
                raise McpFailure(f"{self.label}: reading {uri}: {err}") from None
            placeholder = f"[resource {part.uri}: {mime}, {len(data)} bytes]"
            contents.append(ResourceContent(str(part.uri), part.mime_type, placeholder, data))
        return tuple(contents)

    def list_prompts(self) -> tuple[PromptInfo, ...]:
        if not self._capable("prompts"):
            return ()
        listed = self._listing(
            "listing its prompts",
            lambda cursor: self._client.list_prompts(cursor=cursor, cache_mode="bypass"),
            "prompts",
        )
        return tuple(prompt_info(prompt) for prompt in listed)

    def get_prompt(self, name: str, arguments: dict[str, str]) -> tuple[PromptMessageText, ...]:
        """The prompt's messages, each as its role and its content as text."""
        self._require("prompts", f"it has no prompts ({name})")

        async def get() -> Any:
            return await self._client.get_prompt(name, dict(arguments))

        result = self._request(f"getting the prompt {name}", get)
        messages: list[PromptMessageText] = []
        for message in result.messages:
            try:
                text = block_text(message.content, self._media_dir(), f"{self.server.name}-{name}").text
            except ToolFailure as err:
                raise McpFailure(f"{self.label}: the prompt {name}: {err}") from None
            messages.append(PromptMessageText(str(message.role), text))
        return tuple(messages)

    def _require(self, feature: str, why: str) -> None:
        if self._client is None:
            raise McpFailure(f"{self.label} is not running")
        if not self._capable(feature):
            raise McpFailure(f"{self.label}: {why}")

    def _request(self, what: str, send: Callable[[], Awaitable[_T]]) -> _T:
        if self._client is None:
            raise McpFailure(f"{self.label} is not running")
        try:
            return self._run(self._bounded, send, self.request_timeout_s)
        except TimeoutError:
            raise McpFailure(f"{self.label}: {what}: no answer within {self.request_timeout_s:g} s") from None
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:
            raise McpFailure(f"{self.label}: {what} failed: {self._failure(err)}") from None

    # --- the event loop ----------------------------------------------------------------------

    def _run(self, function: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """Run a coroutine on the connection's loop and wait for it. Ctrl-C cancels it there (so the
        SDK tells the server), waits a moment for that, and goes on as KeyboardInterrupt."""
        future: concurrent.futures.Future[_T] = self._portal.start_task_soon(function, *args)
        try:
            return self._desk.wait(future)
        except KeyboardInterrupt:
            future.cancel()
            concurrent.futures.wait([future], timeout=CANCEL_GRACE_S)
            raise

    async def _bounded(self, send: Callable[[], Awaitable[_T]], timeout_s: float) -> _T:
        """One request under a time limit; cut short, as ProtocolBroken, when the server sends
        something that is not MCP meanwhile (nothing would ever answer it)."""
        import anyio

        self._http_status = None  # a status heard before this request (the version probe's) is not its reason
        with anyio.CancelScope() as scope:
            self._active_scope = scope
            try:
                with self._desk.deadline(timeout_s):
                    return await send()
            finally:
                self._active_scope = None
        raise ProtocolBroken(self._protocol_error or "the request was cut short")

    async def _on_message(self, message: Any) -> None:
        """Server notifications and transport errors, on the connection's loop."""
        if isinstance(message, Exception):
            self._protocol_error = f"it sent a message that is not MCP ({malformed(message)})"
            if self._active_scope is not None:
                self._active_scope.cancel()
            return
        if getattr(message, "method", "") == "notifications/tools/list_changed":
            self._tools_stale = True

    def _media_dir(self) -> Path:
        if self.media_dir is None:
            self.media_dir = media_folder(self.saved_conversation)
        return self.media_dir

    def _heard_http_error(self, status: int) -> None:
        self._http_status = status

    def _heard_pid(self, pid: int) -> None:
        self._server_pid = pid

    def _failure(self, err: BaseException) -> str:
        message = describe(err)
        if self._http_status is not None:
            hint = self.server.status_hint(self._http_status)
            message = f"{message} (HTTP {self._http_status}{hint})"
            self._http_status = None
        if answered(err):  # the server answered with an error: its stderr adds nothing
            return message
        last = failures.last_line(self._errlog)
        return f"{message}; its stderr ends: {last}" if last else message

    def close(self) -> None:
        self._client = None
        if self._watcher is not None:
            self._watcher.cancel()  # before the stream's own exit, which it would otherwise wait on
            self._watcher = None
        try:
            self._stack.close()  # a stdio server is ended whole there (llmchat.tools.mcp.stdio)
        except BaseException:  # a server that already died may fail its own shutdown; it is gone either way
            if self._server_pid is not None:  # or its end was cut short (a second Ctrl-C): no grace left
                signal_group(self._server_pid, signal.SIGKILL)
