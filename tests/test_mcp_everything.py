"""`@modelcontextprotocol/server-everything` (npm, pinned in tests/mcp_servers.py), over stdio and
Streamable HTTP, through `llmchat mcp` with no model: every tool that needs no person, its result
checked per content kind; resources, resource templates and prompts listed.

The server offers its roots and elicitation demos only to a client that declares those
capabilities: llmchat declares both, so `get-roots-list`, `trigger-elicitation-request` and
`trigger-url-elicitation` are listed (tests/test_mcp_roots_elicitation.py calls them); it does not
declare sampling or tasks (the client's own), so their demos are not. `simulate-research-query`
(taskSupport: required) runs as a task (tests/test_mcp_tasks.py).
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow  # each check starts llmchat and a Node server

TRANSPORTS = ["stdio", "http"]


@pytest.fixture(params=TRANSPORTS)
def everything(request, npm_mcp_bin) -> str:
    """The --mcp spec of server-everything over one transport (its name is `everything` either way)."""
    if request.param == "stdio":
        return str(npm_mcp_bin / "mcp-server-everything")
    return "everything=" + request.getfixturevalue("everything_http_url")


def call(cli, spec: str, tool: str, arguments: dict | None = None, *extra: str):
    run = cli("mcp", "call", "everything", tool, "--mcp", spec, "--args", json.dumps(arguments or {}), "--json", *extra)
    assert "Traceback" not in run.stderr, run.stderr
    return run


def record_of(run) -> dict:
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_text_results(cli, everything):
    assert record_of(call(cli, everything, "echo", {"message": "hi there"}))["text"] == "Echo: hi there"
    assert record_of(call(cli, everything, "get-sum", {"a": 2, "b": 3}))["text"] == "The sum of 2 and 3 is 5."
    # The prefixed name the model sees works too.
    assert record_of(call(cli, everything, "everything_get-sum", {"a": 1, "b": 1}))["text"].endswith("is 2.")


def test_an_image_is_saved_under_the_cache_and_named(cli, everything, isolated_home):
    run = call(cli, everything, "get-tiny-image")
    record = record_of(run)
    [image] = [block for block in record["blocks"] if block["type"] == "image"]
    assert image["mime_type"] == "image/png" and image["path"].startswith(str(isolated_home / "cache" / "mcp"))
    with open(image["path"], "rb") as saved:
        assert saved.read(8) == b"\x89PNG\r\n\x1a\n" and image["bytes"] > 100
    assert f"[image image/png, {image['bytes']} bytes, saved to {image['path']}]" in record["text"]
    assert f"returned image image/png: saved to {image['path']}" in run.stderr


def test_structured_content_is_checked_and_passed_as_json(cli, everything):
    record = record_of(call(cli, everything, "get-structured-content", {"location": "New York"}))
    structured = record["structured_content"]
    assert set(structured) >= {"temperature", "conditions", "humidity"}
    assert json.loads(record["text"]) == structured


def test_embedded_resources_and_resource_links_name_their_uris(cli, everything, isolated_home):
    text = record_of(call(cli, everything, "get-resource-reference", {"resourceType": "Text", "resourceId": 1}))
    assert "[resource demo://resource/dynamic/text/1 (text/plain)]\nResource 1:" in text["text"]
    blob = record_of(call(cli, everything, "get-resource-reference", {"resourceType": "Blob", "resourceId": 2}))
    [saved] = [block for block in blob["blocks"] if block["type"] == "resource"]
    assert f"[resource demo://resource/dynamic/blob/2: text/plain, {saved['bytes']} bytes, saved to" in blob["text"]
    links = record_of(call(cli, everything, "get-resource-links", {"count": 3}))
    assert [block["type"] for block in links["blocks"]].count("resource_link") == 3
    assert links["text"].count("[resource link demo://resource/") == 3


def test_gzip_as_an_embedded_blob_and_as_a_link(cli, everything):
    data = "data:text/plain;base64,aGVsbG8gd29ybGQ="
    embedded = record_of(call(cli, everything, "gzip-file-as-resource", {"data": data, "outputType": "resource"}))
    [block] = embedded["blocks"]
    assert block["mime_type"] == "application/gzip"
    with open(block["path"], "rb") as saved:
        assert saved.read(2) == b"\x1f\x8b"  # gzip's magic
    linked = record_of(call(cli, everything, "gzip-file-as-resource", {"data": data}))
    assert linked["text"].startswith("[resource link demo://resource/session/README.md.gz")


def test_annotations_are_kept_in_the_record(cli, everything):
    record = record_of(call(cli, everything, "get-annotated-message", {"messageType": "error", "includeImage": True}))
    text, image = record["blocks"]
    assert text["annotations"]["priority"] == 1.0 and "assistant" in text["annotations"]["audience"]
    assert image["annotations"]["audience"] == ["user"] and image["type"] == "image"


def test_progress_is_shown_on_stderr_while_the_call_runs(cli, everything):
    run = call(cli, everything, "trigger-long-running-operation", {"duration": 1, "steps": 3})
    assert record_of(run)["text"].startswith("Long running operation completed")
    assert "llmchat: everything_trigger-long-running-operation: progress 3/3" in run.stderr


@pytest.mark.parametrize("tool", ["get-env", "toggle-simulated-logging", "toggle-subscriber-updates"])
def test_the_other_tools_answer(cli, everything, tool):
    assert record_of(call(cli, everything, tool))["text"]


def test_a_task_only_tool_runs_as_a_task(cli, everything):
    run = call(cli, everything, "simulate-research-query", {"topic": "bees"})
    assert record_of(run)["text"].startswith("# Research Report: bees")
    assert "llmchat: everything_simulate-research-query: task working (Gathering sources...)" in run.stderr


def test_plain_output_and_usage_errors(cli, npm_mcp_bin):
    spec = str(npm_mcp_bin / "mcp-server-everything")
    run = cli("mcp", "call", "everything", "get-sum", "--mcp", spec, "--args", '{"a": 2, "b": 3}')
    assert (run.returncode, run.stdout) == (0, "The sum of 2 and 3 is 5.\n")
    for args, expected in (
        (("get-sum", "--args", "{nope"), "--args is not valid JSON"),
        (("get-sum", "--args", "[1]"), "--args must be a JSON object"),
        (("get-sum", "--args", '{"a": "x"}'), "invalid arguments for everything_get-sum"),
        (("no-such-tool",), "MCP server everything has no tool 'no-such-tool' (its tools: echo,"),
    ):
        run = cli("mcp", "call", "everything", *args, "--mcp", spec)
        assert run.returncode == 2 and expected in run.stderr and run.stderr.count("\n") <= 2, run.stderr
        assert "Traceback" not in run.stderr


def test_resources_templates_and_prompts_are_listed(cli, everything):
    run = cli("mcp", "resources", "everything", "--mcp", everything, "--json")
    assert run.returncode == 0, run.stderr
    records = json.loads(run.stdout)
    static = [r["uri"] for r in records if r["kind"] == "resource"]
    assert "demo://resource/static/document/architecture.md" in static and len(static) >= 7
    templates = {r["uri_template"]: r["arguments"] for r in records if r["kind"] == "template"}
    assert templates["demo://resource/dynamic/text/{resourceId}"] == ["resourceId"]
    run = cli("mcp", "prompts", "everything", "--mcp", everything, "--json")
    prompts = {p["name"]: p["arguments"] for p in json.loads(run.stdout)}
    assert set(prompts) >= {"simple-prompt", "args-prompt", "completable-prompt", "resource-prompt"}
    assert prompts["args-prompt"][0] == {"name": "city", "description": "Name of the city", "required": True}
    text = cli("mcp", "prompts", "everything", "--mcp", everything)
    assert "mcp:everything/args-prompt" in text.stdout and "  city (required) - Name of the city" in text.stdout


def test_mcp_list_and_tools_name_every_server_and_one_that_is_down(cli, npm_mcp_bin, isolated_home):
    from mcp_servers import free_port

    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text(
        f'[mcp.time]\ncommand = "mcp-server-time"\n\n[mcp.down]\nurl = "http://127.0.0.1:{free_port()}/mcp"\n',
        encoding="utf-8",
    )
    run = cli("mcp", "list", "--json", "--mcp", str(npm_mcp_bin / "mcp-server-everything"))
    assert run.returncode == 1  # one server is down
    states = {record["name"]: record for record in json.loads(run.stdout)}
    assert states["time"]["status"] == "ok" and states["time"]["tools"] == 2
    # 13 tools for any client (simulate-research-query runs as a task), and 3 for one that declares
    # roots and elicitation (form and URL)
    assert states["everything"]["tools"] == 16 and states["everything"]["prompts"] == 4
    assert states["down"]["status"] == "failed" and "could not be reached: no connection" in states["down"]["error"]
    tools = cli("mcp", "tools", "--json")
    assert tools.returncode == 1 and "MCP server down" in tools.stderr and tools.stderr.count("\n") == 1
    assert {t["name"] for t in json.loads(tools.stdout)} == {"time_get_current_time", "time_convert_time"}
