"""The client's roots and elicitation, against the real `@modelcontextprotocol/server-everything`
over stdio (npm, installed once by the `npm_mcp_bin` fixture) and a small MCPServer of the test's own:
- roots: `get-roots-list` lists each `--root` and the server's own `roots`, as file:// URIs, and
  never the working directory of its own accord (none given: none declared);
- elicitation without a terminal: declined at once, with one notice, and the call returns the
  server's text for a decline;
- elicitation on a terminal (a pty, under pexpect): the form's fields asked and answered, the
  answers in the server's result; `ask` through the model too;
- a request llmchat cannot ask (a nested form, a URL that is not http): the call fails in one line.
Every wait is bounded: pexpect's timeout, the calls' timeouts.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pexpect
import pytest

from llmchat.tools.mcp.config import parse_mcp_spec
from llmchat.tools.mcp.connection import McpConnection
from llmchat.tools.mcp.roots import use_roots

pytestmark = pytest.mark.slow  # each check starts a Node server

CALL_TIMEOUT_S = 30
EXPECT_TIMEOUT_S = 60
# What declaring roots and elicitation (form and URL) makes server-everything offer; sampling and
# the client's tasks stay undeclared, so their demos do not appear. simulate-research-query runs as a
# task on the server (tests/test_mcp_tasks.py).
EVERYTHING_TOOLS = {
    "echo",
    "get-annotated-message",
    "get-env",
    "get-resource-links",
    "get-resource-reference",
    "get-roots-list",
    "get-structured-content",
    "get-sum",
    "get-tiny-image",
    "gzip-file-as-resource",
    "simulate-research-query",
    "toggle-simulated-logging",
    "toggle-subscriber-updates",
    "trigger-elicitation-request",
    "trigger-long-running-operation",
    "trigger-url-elicitation",
}


@pytest.fixture
def everything(npm_mcp_bin) -> str:
    return str(npm_mcp_bin / "mcp-server-everything")


@pytest.fixture
def no_extra_roots():
    """The --root folders are the run's: each test starts and ends without any."""
    use_roots(())
    yield
    use_roots(())


def connected(spec: str, stderr: io.StringIO) -> McpConnection:
    return McpConnection(parse_mcp_spec(spec), stderr=stderr)


# --- roots ------------------------------------------------------------------------------------


def test_the_client_declares_roots_and_elicitation_and_the_server_offers_their_tools(everything, no_extra_roots):
    with connected(everything, io.StringIO()) as server:
        assert {spec.name.removeprefix("everything_") for spec in server.tools} == EVERYTHING_TOOLS
        assert server.left_out == {}


def test_get_roots_list_names_each_root_given_and_never_the_working_directory_by_itself(
    everything, no_extra_roots, tmp_path, monkeypatch
):
    work, extra = tmp_path / "work", tmp_path / "extra folder"
    work.mkdir()
    extra.mkdir()
    monkeypatch.chdir(work)
    with connected(everything, io.StringIO()) as server:  # no root given: none declared
        assert "no roots are currently configured" in server.call("get-roots-list", {}, CALL_TIMEOUT_S)
    use_roots([str(extra), str(work), str(extra)])  # the working directory only as a root given; each once
    with connected(everything, io.StringIO()) as server:
        text = server.call("get-roots-list", {}, CALL_TIMEOUT_S)
    assert "Current MCP Roots (2 total)" in text
    assert f"1. extra folder\n   URI: {extra.resolve().as_uri()}" in text  # percent-encoded: extra%20folder
    assert f"2. work\n   URI: {work.resolve().as_uri()}" in text


def test_a_servers_own_roots_come_after_the_command_lines_and_mcp_list_says_them(
    cli, everything, tmp_path, isolated_home
):
    given, own = tmp_path / "given", tmp_path / "own"
    given.mkdir()
    own.mkdir()
    home = isolated_home
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f"[mcp.everything]\ncommand = {json.dumps(everything)}\nroots = [{json.dumps(str(own))}]\n", encoding="utf-8"
    )
    run = cli("mcp", "call", "everything", "get-roots-list", "--root", str(given))
    assert run.returncode == 0, run.stderr
    assert f"1. given\n   URI: {given.resolve().as_uri()}" in run.stdout
    assert f"2. own\n   URI: {own.resolve().as_uri()}" in run.stdout
    listed = cli("mcp", "list", "--mcp", "mcp-server-time")  # a server with no roots
    lines = listed.stdout.splitlines()
    assert listed.returncode == 0 and len(lines) == 2, listed.stderr
    assert lines[0].startswith("everything  (stdio ") and lines[0].endswith(f"; roots: {own.resolve()}")
    assert lines[1].startswith("time  (stdio mcp-server-time)  ok: 2 tools")
    assert lines[1].endswith("; roots: none (it works where its own command line says)")
    as_json = json.loads(cli("mcp", "list", "--json", "--root", str(given)).stdout)
    assert as_json[0]["roots"] == [str(given.resolve()), str(own.resolve())]
    (home / "config.toml").write_text(
        f'[mcp.everything]\ncommand = {json.dumps(everything)}\nroots = ["{tmp_path / "gone"}"]\n', encoding="utf-8"
    )
    gone = cli("mcp", "call", "everything", "get-roots-list")
    assert gone.returncode == 2 and gone.stdout == ""
    assert gone.stderr == f"llmchat: error: MCP server everything: roots = {tmp_path / 'gone'}: no such folder\n"


def test_a_root_that_is_not_a_folder_is_one_usage_error(cli, everything, tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    for root, why in ((str(afile), "not a folder"), (str(tmp_path / "nope"), "no such folder")):
        run = cli("mcp", "call", "everything", "get-roots-list", "--mcp", everything, "--root", root)
        assert run.returncode == 2 and run.stdout == "", run.stderr
        assert run.stderr.splitlines() == [f"llmchat: error: --root {root}: {why}"]


def test_mcp_call_lists_a_root_given_on_the_command_line_and_not_the_working_directory(cli, everything, tmp_path):
    run = cli("mcp", "call", "everything", "get-roots-list", "--mcp", everything, "--root", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert f"URI: {tmp_path.resolve().as_uri()}" in run.stdout and f"URI: {Path.cwd().as_uri()}" not in run.stdout


# --- elicitation without a terminal -------------------------------------------------------------


def test_without_a_terminal_a_form_is_declined_at_once_with_one_notice(everything, no_extra_roots):
    stderr = io.StringIO()
    with connected(everything, stderr) as server:
        text = server.call("trigger-elicitation-request", {}, CALL_TIMEOUT_S)
    assert text.startswith("❌ User declined to provide the requested information.")
    assert '"action": "decline"' in text
    asked = [line for line in stderr.getvalue().splitlines() if "asks for input" in line]
    assert asked == [
        "llmchat: MCP server everything asks for input (Please provide inputs for the following fields:): "
        "declined, no terminal to ask on"
    ]


def test_without_a_terminal_a_url_is_declined_at_once_with_one_notice(cli, everything):
    arguments = json.dumps({"url": "https://example.com/login", "message": "Log in, please."})
    run = cli("mcp", "call", "everything", "trigger-url-elicitation", "--mcp", everything, "--args", arguments)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("❌ User declined to open the URL")
    asked = [line for line in run.stderr.splitlines() if "asks for input" in line]
    assert asked == [
        "llmchat: MCP server everything asks for input (Log in, please. https://example.com/login): "
        "declined, no terminal to ask on"
    ]


# --- elicitation on a terminal ------------------------------------------------------------------


def spawned(args: list[str], isolated_home: Path) -> pexpect.spawn:
    """`python -m llmchat ARGS` on a pty (stdin, stdout and stderr), wide enough that no line wraps."""
    return pexpect.spawn(
        sys.executable,
        ["-m", "llmchat", *args],
        env=dict(os.environ),
        encoding="utf-8",
        timeout=EXPECT_TIMEOUT_S,
        dimensions=(50, 400),
    )


def answer_everythings_form(child: pexpect.spawn) -> None:
    """server-everything's form: an invalid answer is asked again, empty answers take defaults."""
    child.expect_exact("asks: Please provide inputs for the following fields:")
    child.expect_exact("[a]ccept, [d]ecline, [c]ancel (empty: cancel): ")
    child.sendline("a")
    for field, typed in (
        ("name", ""),  # required: asked again
        ("name", "Ada Lovelace"),
        ("check", "maybe"),  # not yes or no: asked again
        ("check", "yes"),
        ("firstLine", ""),
        ("email", "ada@example.com"),
        ("homepage", ""),
        ("birthdate", "1815-12-10"),
        ("integer", "500"),  # above its maximum: asked again
        ("integer", "7"),
        ("number", ""),
        ("untitledSingleSelectEnum", "Joey"),
        ("untitledMultipleSelectEnum", "1, Drums"),
        ("titledSingleSelectEnum", "Wonder Woman"),
        ("titledMultipleSelectEnum", "2"),
        ("legacyTitledEnum", "Dogs"),
    ):
        child.expect(rf"\n  {field} \([^\n]*\): ")
        child.sendline(typed)


def finished(child: pexpect.spawn) -> str:
    child.expect(pexpect.EOF)
    child.close()
    return child.before


def test_on_a_terminal_the_form_is_asked_and_the_answers_reach_the_server(everything, isolated_home):
    child = spawned(["mcp", "call", "everything", "trigger-elicitation-request", "--mcp", everything], isolated_home)
    answer_everythings_form(child)
    rest = finished(child)
    assert child.exitstatus == 0, rest
    assert "User provided the requested information!" in rest and "- Name: Ada Lovelace" in rest
    content = json.loads(rest[rest.index("{") :].replace("\r\n", "\n"))["content"]
    assert content == {
        "name": "Ada Lovelace",
        "check": True,
        "firstLine": "It was a dark and stormy night.",
        "email": "ada@example.com",
        "birthdate": "1815-12-10",
        "integer": 7,
        "number": 3.14,
        "untitledSingleSelectEnum": "Joey",
        "untitledMultipleSelectEnum": ["Guitar", "Drums"],
        "titledSingleSelectEnum": "hero-3",
        "titledMultipleSelectEnum": ["fish-2"],
        "legacyTitledEnum": "pet-2",
    }


@pytest.mark.parametrize(("typed", "expected"), [("d", "User declined"), ("", "User cancelled"), ("^C", "cancelled")])
def test_on_a_terminal_the_form_can_be_declined_or_cancelled(everything, isolated_home, typed, expected):
    child = spawned(["mcp", "call", "everything", "trigger-elicitation-request", "--mcp", everything], isolated_home)
    child.expect_exact("[a]ccept, [d]ecline, [c]ancel (empty: cancel): ")
    if typed == "^C":
        child.sendintr()  # Ctrl-C at the question cancels the form, not the call
    else:
        child.sendline(typed)
    rest = finished(child)
    assert child.exitstatus == 0 and expected in rest, rest
    assert '"action": "' + ("decline" if typed == "d" else "cancel") + '"' in rest


def test_on_a_terminal_a_url_is_shown_and_may_be_declined(everything, isolated_home):
    arguments = json.dumps({"url": "https://example.com/login", "message": "Log in, please."})
    command = ["mcp", "call", "everything", "trigger-url-elicitation", "--mcp", everything, "--args", arguments]
    child = spawned(command, isolated_home)
    child.expect_exact("asks: Log in, please.")
    child.expect_exact("https://example.com/login")
    child.expect_exact("Open it in your browser? [y/N]")
    child.sendline("n")  # "y" would start a browser on the test machine
    rest = finished(child)
    assert child.exitstatus == 0 and "User declined to open the URL" in rest, rest


def test_ask_forced_to_call_the_elicitation_tool_takes_the_answers(everything, isolated_home, smollm2_path, tmp_path):
    """Through the model, as a user runs it: the forced call asks on the terminal; the reply's
    record (stdout, to a file) has the server's result with the answers."""
    record_path = tmp_path / "record.json"
    command = " ".join(
        [
            sys.executable,
            "-m llmchat ask -m",
            str(smollm2_path),
            "--mcp",
            everything,
            "--tool-choice everything_trigger-elicitation-request --approve-tools --chain-limit 1 -n 48 --json",
            "'Ask me for my details.'",
            f"> {record_path}",
        ]
    )
    child = pexpect.spawn(
        "/bin/sh", ["-c", command], env=dict(os.environ), encoding="utf-8", timeout=600, dimensions=(50, 400)
    )
    answer_everythings_form(child)
    child.timeout = 300
    rest = finished(child)
    assert child.exitstatus == 0, rest
    [call] = json.loads(record_path.read_text())["tool_calls"]
    assert call["name"] == "everything_trigger-elicitation-request" and call["approved"] is True
    assert "- Name: Ada Lovelace" in call["result"] and '"titledSingleSelectEnum": "hero-3"' in call["result"]


# --- requests llmchat cannot ask ----------------------------------------------------------------

ASKING_SERVER = '''
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitRequestURLParams, InputRequiredResult

server = MCPServer("asking")
NESTED = {"type": "object", "properties": {"address": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def asked(ctx, params):
    """The 2026-07-28 way for a server to ask: the call's result asks, and the call comes again."""
    if ctx.input_responses:
        return f"answered: {ctx.input_responses}"
    return InputRequiredResult(input_requests={"it": ElicitRequest(params=params)})


@server.tool()
async def nested_form(ctx: Context) -> InputRequiredResult | str:
    """A form whose field is an object: not a flat form."""
    return asked(ctx, ElicitRequestFormParams(message="Where do you live?", requested_schema=NESTED))


@server.tool()
async def file_url(ctx: Context) -> InputRequiredResult | str:
    """A URL that is not http or https."""
    return asked(ctx, ElicitRequestURLParams(message="Open this.", url="file:///etc/passwd", elicitation_id="e1"))


server.run()
'''


@pytest.mark.parametrize(
    ("tool", "why"),
    [
        ("nested_form", "the field address is not a string, number, integer, boolean or array of choices"),
        ("file_url", "it asks to open 'file:///etc/passwd', which is not an http or https URL"),
    ],
)
def test_a_request_llmchat_cannot_ask_fails_the_call_in_one_line(cli, tmp_path, tool, why):
    script = tmp_path / "asking_server.py"
    script.write_text(ASKING_SERVER, encoding="utf-8")
    spec = f"{sys.executable} {script}"
    run = cli("mcp", "call", "python", tool, "--mcp", spec, "--timeout", str(CALL_TIMEOUT_S), timeout=120)
    assert run.returncode == 1 and run.stdout == "", run.stderr
    [line] = run.stderr.splitlines()
    assert line.startswith(f"llmchat: error: python_{tool}: MCP server python failed: llmchat cannot ask this: ")
    assert line.endswith(why)


# --- elicitation = "defaults" | "decline": forms answered without a person -----------------------

DEFAULTS_SERVER = """
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitRequestURLParams, InputRequiredResult

server = MCPServer("forms")
WITH_DEFAULTS = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "default": "John Doe"},
        "age": {"type": "integer", "default": 30},
        "score": {"type": "number", "default": 95.5},
        "status": {"type": "string", "enum": ["active", "inactive"], "default": "active"},
        "verified": {"type": "boolean", "default": True},
        "nickname": {"type": "string"},
    },
}
WITHOUT_DEFAULT = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def asked(ctx, params):
    if ctx.input_responses:
        [answer] = ctx.input_responses.values()
        return f"{answer.action} {sorted((answer.content or {}).items())}"
    return InputRequiredResult(input_requests={"it": ElicitRequest(params=params)})


@server.tool()
async def with_defaults(ctx: Context) -> InputRequiredResult | str:
    return asked(ctx, ElicitRequestFormParams(message="Your profile?", requested_schema=WITH_DEFAULTS))


@server.tool()
async def without_default(ctx: Context) -> InputRequiredResult | str:
    return asked(ctx, ElicitRequestFormParams(message="Your city?", requested_schema=WITHOUT_DEFAULT))


@server.tool()
async def a_url(ctx: Context) -> InputRequiredResult | str:
    return asked(ctx, ElicitRequestURLParams(message="Open this.", url="https://example.com/", elicitation_id="e1"))


server.run()
"""


def _forms_server(home, tmp_path, answer: str) -> None:
    script = tmp_path / "forms_server.py"
    script.write_text(DEFAULTS_SERVER, encoding="utf-8")
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f"[mcp.forms]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(str(script))}]\n"
        f'elicitation = "{answer}"\n',
        encoding="utf-8",
    )


def test_elicitation_defaults_accepts_a_form_with_its_schemas_defaults_without_asking(cli, isolated_home, tmp_path):
    _forms_server(isolated_home, tmp_path, "defaults")
    run = cli("mcp", "call", "forms", "with_defaults", "--timeout", str(CALL_TIMEOUT_S), timeout=120)
    assert run.returncode == 0, run.stderr
    expected = [("age", 30), ("name", "John Doe"), ("score", 95.5), ("status", "active"), ("verified", True)]
    assert run.stdout.strip() == f"accept {expected}"
    assert run.stderr == ""


def test_elicitation_defaults_declines_a_required_field_without_one_and_any_url(cli, isolated_home, tmp_path):
    _forms_server(isolated_home, tmp_path, "defaults")
    form = cli("mcp", "call", "forms", "without_default", "--timeout", str(CALL_TIMEOUT_S), timeout=120)
    assert form.returncode == 0 and form.stdout.strip() == "decline []", form.stderr
    [line] = form.stderr.splitlines()
    assert line.endswith('declined, no default for city (elicitation = "defaults")')
    url = cli("mcp", "call", "forms", "a_url", "--timeout", str(CALL_TIMEOUT_S), timeout=120)
    assert url.returncode == 0 and url.stdout.strip() == "decline []", url.stderr
    assert url.stderr.strip().endswith('declined, elicitation = "defaults" for this server')


def test_elicitation_decline_never_asks(cli, isolated_home, tmp_path):
    _forms_server(isolated_home, tmp_path, "decline")
    run = cli("mcp", "call", "forms", "with_defaults", "--timeout", str(CALL_TIMEOUT_S), timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "decline []", run.stderr
    assert run.stderr.strip().endswith('declined, elicitation = "decline" for this server')


def test_a_wrong_elicitation_setting_is_one_line(cli, isolated_home, tmp_path):
    _forms_server(isolated_home, tmp_path, "sometimes")
    run = cli("mcp", "tools", "forms")
    assert run.returncode == 2 and run.stdout == ""
    [line] = run.stderr.splitlines()
    assert 'elicitation must be "ask", "defaults" or "decline"' in line
