"""One call run safely: schema first, approval, timeout, output cap; every failure is text for the model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from llmchat.tools.approval import ApprovalPolicy, ask_approval, format_call, parse_answer
from llmchat.tools.command_tools import command_tool
from llmchat.tools.execute import cap_output, run_call
from llmchat.tools.functions import function_spec
from llmchat.tools.mcp.config import McpServerConfig
from llmchat.tools.mcp.connection import McpConnection
from llmchat.tools.spec import CallRecord

DATA = Path(__file__).parent / "data" / "tools"


def make_tools(side_effects: list):
    def write_note(text: str, times: int = 1) -> str:
        """Keep a note."""
        side_effects.append((text, times))
        return f"noted {text!r} x{times}"

    def explode() -> str:
        raise RuntimeError("disk on fire")

    def chatty(size: int) -> str:
        return "é" * size

    return {spec.name: spec for spec in (function_spec(f, "functions:test") for f in (write_note, explode, chatty))}


def approve_all():
    return ApprovalPolicy(interactive=False, approve_all=True)


def test_a_valid_call_runs_once_and_its_record_has_every_field():
    calls: list = []
    record = run_call(make_tools(calls), "write_note", {"text": "milk", "times": 2}, approve_all())
    assert calls == [("milk", 2)]
    assert (record.name, record.arguments, record.approved, record.result, record.error) == (
        "write_note",
        {"text": "milk", "times": 2},
        True,
        "noted 'milk' x2",
        None,
    )
    assert record.duration_s >= 0
    assert set(record.as_json()) == {"name", "arguments", "result", "approved", "duration_s"}
    assert record.text_for_model == "noted 'milk' x2"


def test_arguments_as_json_text_are_accepted():
    calls: list = []
    record = run_call(make_tools(calls), "write_note", '{"text": "eggs"}', approve_all())
    assert calls == [("eggs", 1)] and record.error is None


@pytest.mark.parametrize(
    "arguments, expected",
    [
        ({"text": 5}, "invalid arguments for write_note at text: 5 is not of type 'string'"),
        ({}, "invalid arguments for write_note: 'text' is a required property"),
        ({"text": "x", "times": "two"}, "at times: 'two' is not of type 'integer'"),
        (["milk"], "must be a JSON object, not list"),
        ('{"text": ', "the arguments are not valid JSON"),
    ],
)
def test_arguments_that_violate_the_schema_never_reach_the_function(arguments, expected):
    calls: list = []
    record = run_call(make_tools(calls), "write_note", arguments, approve_all())
    assert calls == []
    assert not record.approved and record.result is None
    assert expected in record.error
    assert record.text_for_model.startswith("Error: ")
    assert "error" in record.as_json() and "result" not in record.as_json()


def test_an_unknown_tool_is_an_error_for_the_model():
    record = run_call(make_tools([]), "rm_everything", {}, approve_all())
    assert record.error == 'tool "rm_everything" does not exist (tools: chatty, explode, write_note)'


def test_an_exception_is_an_error_for_the_model():
    record = run_call(make_tools([]), "explode", {}, approve_all())
    assert record.approved and record.error == "RuntimeError: disk on fire"
    assert record.text_for_model == "Error: RuntimeError: disk on fire"


def test_output_over_the_cap_is_truncated_with_a_marker():
    record = run_call(make_tools([]), "chatty", {"size": 5000}, approve_all(), max_output_bytes=1001)
    kept, marker = record.result.split("\n[output truncated")
    assert kept == "é" * 500  # cut on a character boundary, at most the cap
    assert marker == ": 9000 of 10000 bytes left out; the cap is 1001 bytes]"
    assert cap_output("short", 10) == "short"


def test_the_default_output_cap_is_16_kib():
    record = run_call(make_tools([]), "chatty", {"size": 20000}, approve_all())
    assert len(record.result.split("\n[output truncated")[0].encode()) == 16 * 1024


def test_a_timeout_is_an_error_for_the_model():
    spec = command_tool("slow", {"command": [sys.executable, "-c", "import time; time.sleep(600)"]}, "cfg.toml")
    record = run_call({"slow": spec}, "slow", {}, approve_all(), timeout_s=0.3)
    assert record.approved and "did not finish within 0.3 s" in record.error


def test_the_tool_timeout_from_the_config_wins():
    spec = command_tool(
        "slow", {"command": [sys.executable, "-c", "import time; time.sleep(600)"], "timeout": 0.2}, "cfg.toml"
    )
    record = run_call({"slow": spec}, "slow", {}, approve_all(), timeout_s=600)
    assert "within 0.2 s" in record.error


# --- approval ------------------------------------------------------------------------------------
def test_without_a_terminal_nothing_runs_and_one_notice_says_how_to_allow_it():
    calls: list = []
    notices: list = []
    policy = ApprovalPolicy(interactive=False)
    tools = make_tools(calls)
    first = run_call(tools, "write_note", {"text": "a"}, policy, notify=notices.append)
    second = run_call(tools, "write_note", {"text": "b"}, policy, notify=notices.append)
    assert calls == []  # the side effect never happened
    assert not first.approved and not second.approved
    assert first.text_for_model.startswith("Cancelled: ") and "write_note" in first.text_for_model
    # A function has no config table: the notice names the one way to allow it, the flag.
    assert notices == ["tool call write_note refused: there is no terminal to ask; allow it with --approve-tools"]


def test_the_refusal_notice_names_the_config_table_only_for_a_tool_that_has_one():
    spec = command_tool("stamp", {"command": [sys.executable, "-c", "print(1)"]}, "cfg.toml")
    notices: list = []
    record = run_call({"stamp": spec}, "stamp", {}, ApprovalPolicy(interactive=False), notify=notices.append)
    assert not record.approved
    assert notices == [
        "tool call stamp refused: there is no terminal to ask; allow it with --approve-tools or "
        'approve = "always" in its config table [tools.stamp]'
    ]


def test_without_a_terminal_a_config_always_tool_runs(tmp_path):
    marker = tmp_path / "ran"
    spec = command_tool(
        "mark",
        {"command": [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"], "approve": "always"},
        "cfg.toml",
    )
    record = run_call({"mark": spec}, "mark", {}, ApprovalPolicy(interactive=False))
    assert record.approved and marker.exists()


def test_on_a_terminal_yes_no_and_always():
    calls: list = []
    tools = make_tools(calls)
    policy = ApprovalPolicy(interactive=True)
    asked: list = []

    def answering(answer):
        def ask(name, arguments):
            asked.append((name, arguments))
            return answer

        return ask

    assert run_call(tools, "write_note", {"text": "1"}, policy, ask=answering("no")).approved is False
    assert run_call(tools, "write_note", {"text": "2"}, policy, ask=answering("yes")).approved is True
    assert run_call(tools, "write_note", {"text": "3"}, policy, ask=answering("always")).approved is True
    # "always" is remembered for this tool: the fourth call is not asked.
    assert run_call(tools, "write_note", {"text": "4"}, policy, ask=answering("no")).approved is True
    assert [a[1]["text"] for a in asked] == ["1", "2", "3"]
    assert calls == [("2", 1), ("3", 1), ("4", 1)]


def test_answers_typed_at_the_prompt():
    assert [parse_answer(t) for t in ("y", "YES", "n", "", "a", "Always", "maybe")] == [
        "yes",
        "yes",
        "no",
        "no",
        "always",
        "always",
        None,
    ]
    replies = iter(["what", "a"])
    prompts: list = []
    assert ask_approval("t", {"x": 1}, lambda p: prompts.append(p) or next(replies)) == "always"
    assert len(prompts) == 2 and prompts[0].startswith('run t({"x": 1})?')
    assert ask_approval("t", {}, lambda p: None) == "no", "no answer (Ctrl-C, the end of input) is no"


def test_a_refused_mcp_call_never_reaches_the_server(tmp_path):
    target = tmp_path / "touched"
    server = McpServerConfig(name="dying", command=sys.executable, args=(str(DATA / "dying_mcp_server.py"),))
    with McpConnection(server) as connection:
        tools = {spec.name: spec for spec in connection.tools}
        refused = run_call(tools, "dying_touch", {"path": str(target)}, ApprovalPolicy(interactive=False))
        assert not refused.approved and not target.exists()
        allowed = run_call(tools, "dying_touch", {"path": str(target)}, approve_all())
        assert allowed.result == "done" and target.exists()


def test_an_mcp_server_that_dies_mid_call_is_an_error_and_later_calls_go_on():
    server = McpServerConfig(name="dying", command=sys.executable, args=(str(DATA / "dying_mcp_server.py"),))
    with McpConnection(server) as connection:
        tools = {spec.name: spec for spec in connection.tools}
        died = run_call(tools, "dying_die", {}, approve_all())
        assert died.approved and "MCP server dying failed" in died.error
        after = run_call(tools, "dying_echo", {"text": "hello"}, approve_all())
        assert after.error is not None and "MCP server dying" in after.error


def test_a_record_serialises_to_json():
    record = CallRecord("t", {"a": 1}, True, 0.25, result="ok")
    assert json.loads(json.dumps(record.as_json())) == {
        "name": "t",
        "arguments": {"a": 1},
        "result": "ok",
        "approved": True,
        "duration_s": 0.25,
    }


def test_a_call_is_shown_with_its_exact_arguments():
    assert format_call("write_note", {"times": 2, "text": "milk; rm -rf /"}) == (
        'write_note({"text": "milk; rm -rf /", "times": 2})'
    )
