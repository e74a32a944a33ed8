"""The pure parts of MCP result handling: structured content against an outputSchema, a wrapped
plain value, a resource template's arguments, and the progress line on a terminal and in a log."""

from __future__ import annotations

import io
import json

import pytest

from llmchat.tools.mcp.catalog import template_arguments
from llmchat.tools.mcp.progress import ProgressLine
from llmchat.tools.mcp.results import handle_result, structured_text
from llmchat.tools.spec import ToolFailure

WEATHER = {
    "type": "object",
    "properties": {"temperature": {"type": "number"}, "conditions": {"type": "string"}},
    "required": ["temperature", "conditions"],
}


class Result:
    """The fields of the SDK's CallToolResult that llmchat reads."""

    def __init__(self, content: list, structured: object = None, is_error: bool = False):
        self.content, self.structured_content, self.is_error = content, structured, is_error


class Text:
    type = "text"
    annotations = None

    def __init__(self, text: str):
        self.text = text


def test_structured_content_is_checked_against_the_output_schema():
    assert json.loads(structured_text("w", {"temperature": 21, "conditions": "sun"}, WEATHER))["temperature"] == 21
    with pytest.raises(ToolFailure, match="does not match its output schema at temperature: 'warm' is not of type"):
        structured_text("w", {"temperature": "warm", "conditions": "sun"}, WEATHER)
    with pytest.raises(ToolFailure, match="declares an output schema that is not valid"):
        structured_text("w", {}, {"type": "nothing"})


def test_structured_content_goes_first_unless_a_text_block_repeats_it(tmp_path):
    data = {"temperature": 21, "conditions": "sun"}
    alone = handle_result("w", Result([Text("see the data")], data), WEATHER, tmp_path, print)
    assert alone.text.splitlines() == [json.dumps(data), "see the data"]
    repeated = handle_result("w", Result([Text(json.dumps(data))], data), WEATHER, tmp_path, print)
    assert repeated.text == json.dumps(data)
    wrapped = handle_result("echo", Result([Text("done")], {"result": "done"}), None, tmp_path, print)
    assert wrapped.text == "done"  # FastMCP's plain value, as the model always got it
    failed = handle_result("w", Result([Text("the disk is full")], None, is_error=True), None, tmp_path, print)
    with pytest.raises(ToolFailure, match="^the disk is full$"):
        failed.text_for_model()
    assert failed.record()["is_error"] is True


def test_resource_template_arguments():
    assert template_arguments("demo://resource/dynamic/text/{resourceId}") == ("resourceId",)
    assert template_arguments("file:///{+path}{?rev,view}") == ("path", "rev", "view")
    assert template_arguments("db://{table}/{id:3}/{table}") == ("table", "id")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_rewrites_one_line_on_a_terminal_and_writes_lines_in_a_log():
    terminal = Terminal()
    line = ProgressLine(terminal, "everything_long")
    line.update(1, 3, None)
    line.update(1, 3, None)  # the same state: nothing more
    line.update(2, 3, "halfway")
    line.end()
    assert terminal.getvalue() == (
        "\r\x1b[Kllmchat: everything_long: progress 1/3\r\x1b[Kllmchat: everything_long: progress 2/3 (halfway)\r\x1b[K"
    )
    log = io.StringIO()
    piped = ProgressLine(log, "everything_long")
    piped.update(1, None, None)
    piped.update(2, None, None)
    piped.end()
    assert log.getvalue() == "llmchat: everything_long: progress 1\nllmchat: everything_long: progress 2\n"
