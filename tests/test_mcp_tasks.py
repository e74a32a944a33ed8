"""Tools that run as tasks (MCP 2025-11-25 experimental tasks), against the real
`@modelcontextprotocol/server-everything` over stdio (npm, installed once by the `npm_mcp_bin`
fixture): its `simulate-research-query` (taskSupport: required) takes about 4 s in four stages.
- it is offered, runs as a task (tools/call with `task`, tasks/get, tasks/result), and its report is
  the result, through McpConnection and through `llmchat mcp call`, with its status on stderr;
- an ambiguous query asks for input (elicitation, delivered through tasks/result): without a
  terminal it is declined at once, and the task goes on to its report;
- a task that does not finish within the call's limit fails in one line at that limit, and is
  cancelled on the server (tasks/list says so); Ctrl-C cancels it too, before the
  KeyboardInterrupt goes on.

A server whose task never finishes is played by a limit shorter than the task: the SDK's own
server (MCPServer, 2.x) cannot serve task tools (no `execution.taskSupport`, no `tasks` capability,
no tasks/* methods), so no fixture server of the test's own stands in for it.
Every wait is bounded: the calls' time limits, the subprocesses' timeout.
"""

from __future__ import annotations

import _thread
import io
import json

import pytest

from llmchat.tools.mcp.config import parse_mcp_spec
from llmchat.tools.mcp.connection import McpConnection
from llmchat.tools.spec import ToolFailure

pytestmark = pytest.mark.slow  # each check starts a Node server

TOOL = "simulate-research-query"
CALL_TIMEOUT_S = 30
SHORT_TIMEOUT_S = 1.5  # the task takes about 4 s: it cannot finish within this
CLI_TIMEOUT_S = 90


@pytest.fixture
def everything(npm_mcp_bin) -> str:
    return str(npm_mcp_bin / "mcp-server-everything")


def connected(spec: str, stderr: io.StringIO) -> McpConnection:
    return McpConnection(parse_mcp_spec(spec), stderr=stderr)


def task_statuses(server: McpConnection) -> list[str]:
    """The statuses of the server's tasks (tasks/list), asked through the connection's session."""
    from mcp_types import ListTasksRequest, ListTasksResult

    async def list_tasks() -> ListTasksResult:
        return await server._client.session.send_request(ListTasksRequest(), ListTasksResult)

    return [task.status for task in server._run(server._bounded, list_tasks, CALL_TIMEOUT_S).tasks]


def test_a_task_tool_is_offered_and_its_result_is_the_tasks(everything):
    stderr = io.StringIO()
    with connected(everything, stderr) as server:
        assert f"everything_{TOOL}" in {spec.name for spec in server.tools} and server.left_out == {}
        text = server.call(TOOL, {"topic": "bees"}, CALL_TIMEOUT_S)
        assert task_statuses(server) == ["completed"]
    assert text.startswith("# Research Report: bees") and "Stage 4: Generating report ✓" in text
    shown = stderr.getvalue().splitlines()  # not a terminal: each new status is a line of its own
    assert f"llmchat: everything_{TOOL}: task working (Gathering sources...)" in shown
    assert f"llmchat: everything_{TOOL}: task working (Generating report...)" in shown


def test_a_question_from_the_task_is_declined_without_a_terminal_and_the_task_goes_on(everything):
    stderr = io.StringIO()
    with connected(everything, stderr) as server:
        text = server.call(TOOL, {"topic": "python", "ambiguous": True}, CALL_TIMEOUT_S)
    assert text.startswith("# Research Report: python (User declined - using default interpretation)")
    assert "task input_required (Found multiple interpretations" in stderr.getvalue()
    assert "declined, no terminal to ask on" in stderr.getvalue()


def test_a_task_that_does_not_finish_in_time_fails_in_one_line_and_is_cancelled(everything):
    with connected(everything, io.StringIO()) as server:
        with pytest.raises(ToolFailure) as failure:
            server.call(TOOL, {"topic": "bees"}, SHORT_TIMEOUT_S)
        assert str(failure.value) == f"MCP server everything's task {TOOL} did not finish within 1.5 s"
        assert task_statuses(server) == ["cancelled"]
        # The connection goes on: the next call runs.
        assert server.call(TOOL, {"topic": "ants"}, CALL_TIMEOUT_S).startswith("# Research Report: ants")


class CtrlCOnceWorking(io.StringIO):
    """stderr that presses Ctrl-C (what it does to the waiting thread) once the task says it works."""

    pressed = False

    def write(self, text: str) -> int:
        if "task working" in text and not self.pressed:
            self.pressed = True
            _thread.interrupt_main()
        return super().write(text)


def test_ctrl_c_cancels_the_task_before_the_interrupt_goes_on(everything):
    from llmchat import interrupts

    stderr = CtrlCOnceWorking()
    with connected(everything, stderr) as server:
        try:
            with pytest.raises(KeyboardInterrupt):
                server.call(TOOL, {"topic": "bees"}, CALL_TIMEOUT_S)
        finally:
            interrupts.consume()  # caught here on purpose: no later checkpoint raises it again
        assert stderr.pressed
        assert task_statuses(server) == ["cancelled"]


def test_mcp_call_runs_the_task_and_prints_its_result(cli, everything):
    arguments = json.dumps({"topic": "bees"})
    run = cli("mcp", "call", "everything", TOOL, "--mcp", everything, "--args", arguments, timeout=CLI_TIMEOUT_S)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("# Research Report: bees") and "Traceback" not in run.stderr
    assert f"llmchat: everything_{TOOL}: task working (Gathering sources...)" in run.stderr


def test_mcp_call_past_its_timeout_fails_in_one_line(cli, everything):
    arguments = json.dumps({"topic": "bees"})
    run = cli(
        "mcp", "call", "everything", TOOL, "--mcp", everything, "--args", arguments, "--timeout", "1.5",
        timeout=CLI_TIMEOUT_S,
    )  # fmt: skip
    assert run.returncode != 0 and run.stdout == "" and "Traceback" not in run.stderr
    failures = [line for line in run.stderr.splitlines() if "did not finish" in line]
    unfinished = f"MCP server everything's task {TOOL} did not finish within 1.5 s"
    assert failures == [f"llmchat: error: everything_{TOOL}: {unfinished}"], run.stderr
