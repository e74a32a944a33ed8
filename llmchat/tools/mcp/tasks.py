"""Tools that run as tasks (MCP 2025-11-25, experimental tasks).

A tool whose listing says `execution.taskSupport: "required"` or `"optional"` runs as a task when
the server declares task-augmented tool calls (`capabilities.tasks.requests.tools.call`): the call
creates the task (`tools/call` with `task`), polls it (`tasks/get`) at the interval the server
suggests, shows its status on stderr (ProgressLine), and once it is done collects its result
(`tasks/result`), which the connection handles like any tool result. A task the server fails or
cancels is a ToolFailure. The call's deadline (McpLoop._bounded, llmchat.tools.mcp.loop) bounds the whole; when it
passes, or on Ctrl-C, the task is cancelled on the server (`tasks/cancel`) before the cancellation
goes on. A tool that runs only as a task, on a server that does not declare task-augmented calls,
is left out.

The SDK (2.x) has the tasks' types but does not route them: it checks every `tools/call` answer
against CallToolResult, which a CreateTaskResult fails. So the creating call goes through the
session's dispatcher, stamped as the session stamps its own requests; `tasks/get`,
`tasks/result` and `tasks/cancel` go through `session.send_request` as usual.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from llmchat.tools.mcp.progress import ProgressLine
from llmchat.tools.spec import ToolFailure

if TYPE_CHECKING:
    from mcp.client.session import ClientSession
    from mcp.shared.dispatcher import CallOptions

DEFAULT_POLL_S = 1.0  # when the server suggests no interval
MIN_POLL_S = 0.1  # a server that suggests 0 must not make the client spin
MAX_POLL_S = 5.0  # nor one that suggests an hour make it miss the end for long
CANCEL_WAIT_S = 1.5  # tasks/cancel on the way out: under the connection's CANCEL_GRACE_S
TTL_MARGIN_S = 60.0  # the server keeps the task this long past the call's limit, for tasks/cancel
RUNNING = ("working", "input_required")


def task_support(tool: Any) -> str:
    """The tool's `execution.taskSupport`: "forbidden" when absent, as the spec says."""
    return getattr(getattr(tool, "execution", None), "task_support", None) or "forbidden"


def server_runs_tool_tasks(capabilities: Any) -> bool:
    """Whether the server declares task-augmented `tools/call` (capabilities.tasks.requests.tools.call)."""
    requests = getattr(getattr(capabilities, "tasks", None), "requests", None)
    return getattr(getattr(requests, "tools", None), "call", None) is not None


def runs_as_task(tool: Any, capabilities: Any) -> bool:
    return task_support(tool) in ("required", "optional") and server_runs_tool_tasks(capabilities)


def left_out_reason(tool: Any, capabilities: Any) -> str | None:
    """Why llmchat cannot call the tool, or None when it can."""
    if task_support(tool) == "required" and not server_runs_tool_tasks(capabilities):
        return "it runs only as a task (taskSupport: required), but the server does not declare task-augmented calls"
    return None


async def call_as_task(
    session: ClientSession, tool: str, arguments: dict[str, Any], line: ProgressLine, timeout_s: float
) -> Any:
    """The tool's CallToolResult, run as a task; ToolFailure when the server fails or cancels it."""
    created = await _create(session, tool, arguments, _ttl_ms(timeout_s))
    if not hasattr(created, "task_id"):  # the server ran it at once (allowed for an optional one)
        return created
    task = created
    try:
        line.status(task.status, task.status_message)
        while task.status == "working":  # input_required: tasks/result carries the server's questions
            await _pause(task)
            task = await _get(session, task.task_id)
            line.status(task.status, task.status_message)
        return await _outcome(session, task, tool)
    except BaseException:  # Ctrl-C or the deadline (a cancellation), or a broken answer: leave nothing running
        if task.status in RUNNING:
            await _cancel_quietly(session, task.task_id)
        raise


async def _create(session: ClientSession, tool: str, arguments: dict[str, Any], ttl_ms: int | None) -> Any:
    """The created Task, or the CallToolResult of a server that did not make one."""
    from mcp_types import CallToolRequest, CallToolRequestParams, CallToolResult, CreateTaskResult, TaskMetadata

    params = CallToolRequestParams(name=tool, arguments=arguments, task=TaskMetadata(ttl=ttl_ms))
    data = CallToolRequest(params=params).model_dump(by_alias=True, mode="json", exclude_none=True)
    options: CallOptions = {}
    session._stamp(data, options)  # the headers send_request would add (the protocol version over HTTP)
    answer = await session._dispatcher.send_raw_request(data["method"], data.get("params"), options)
    if "task" not in answer:
        return CallToolResult.model_validate(answer, by_name=False)
    return CreateTaskResult.model_validate(answer, by_name=False).task


async def _get(session: ClientSession, task_id: str) -> Any:
    from mcp_types import GetTaskRequest, GetTaskRequestParams, GetTaskResult

    request = GetTaskRequest(params=GetTaskRequestParams(task_id=task_id))
    # No clock of the SDK's own (inf): the call's deadline bounds every request of the task.
    return await session.send_request(request, GetTaskResult, request_read_timeout_seconds=math.inf)


async def _outcome(session: ClientSession, task: Any, tool: str) -> Any:
    """The result of a task that left `working`: completed (or waiting for input, which
    tasks/result delivers while it waits for the end), or a ToolFailure."""
    from mcp_types import CallToolResult, GetTaskPayloadRequest, GetTaskPayloadRequestParams

    if task.status == "failed":
        raise ToolFailure(f"the task {tool} failed" + _said(task.status_message))
    if task.status == "cancelled":
        raise ToolFailure(f"the server cancelled the task {tool}" + _said(task.status_message))
    request = GetTaskPayloadRequest(params=GetTaskPayloadRequestParams(task_id=task.task_id))
    return await session.send_request(request, CallToolResult, request_read_timeout_seconds=math.inf)


async def _cancel_quietly(session: ClientSession, task_id: str) -> None:
    """tasks/cancel, shielded from the cancellation that asks for it and bounded in time; a server
    that cannot cancel (or is gone) changes nothing: the call ends either way."""
    import anyio
    from mcp_types import CancelTaskRequest, CancelTaskRequestParams, CancelTaskResult

    request = CancelTaskRequest(params=CancelTaskRequestParams(task_id=task_id))
    with anyio.move_on_after(CANCEL_WAIT_S, shield=True):
        try:
            await session.send_request(request, CancelTaskResult, request_read_timeout_seconds=CANCEL_WAIT_S)
        except Exception:
            pass


async def _pause(task: Any) -> None:
    import anyio

    suggested = task.poll_interval / 1000 if task.poll_interval is not None else DEFAULT_POLL_S
    await anyio.sleep(min(max(suggested, MIN_POLL_S), MAX_POLL_S))


def _ttl_ms(timeout_s: float) -> int | None:
    """How long the server should keep the task: the call's limit and a margin (None: its own choice)."""
    return int((timeout_s + TTL_MARGIN_S) * 1000) if math.isfinite(timeout_s) else None


def _said(message: str | None) -> str:
    return f" ({message})" if message else ""
