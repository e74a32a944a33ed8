"""Tool sources: --functions files, [tools.NAME] commands, [mcp.NAME] / --mcp servers (real processes)."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from llmchat.config import load_config
from llmchat.errors import ConfigError, UsageError
from llmchat.tools.command_tools import build_argv, command_tool
from llmchat.tools.functions import call_function, load_functions, parse_docstring, type_schema
from llmchat.tools.mcp import config as mcp_config
from llmchat.tools.mcp.config import McpServerConfig, parse_mcp_spec, server_from_config
from llmchat.tools.mcp.connection import McpConnection
from llmchat.tools.spec import ToolFailure, ToolTimeout

DATA = Path(__file__).parent / "data" / "tools"
DYING_SERVER = McpServerConfig(name="dying", command=sys.executable, args=(str(DATA / "dying_mcp_server.py"),))

FUNCTIONS_FILE = '''
from typing import Literal, Optional
from json import dumps  # imported, not defined here: not a tool

CALLS = []

def add(a: int, b: float = 2.5) -> float:
    """Add two numbers.

    Returns their sum.

    Args:
        a: the first number
        b (float): the second
            number, continued
    """
    CALLS.append((a, b))
    return a + b

def greet(name: str, style: Literal["plain", "loud"] = "plain", tags: Optional[list[str]] = None) -> str:
    """Say hello.

    :param name: who to greet
    :param style: how loudly
    :returns: the greeting
    """
    return name.upper() if style == "loud" else name

def fail(reason: str) -> str:
    raise ValueError(reason)

def _helper():
    pass
'''


@pytest.fixture
def functions_file(tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text(FUNCTIONS_FILE, encoding="utf-8")
    return path


# --- --functions ---------------------------------------------------------------------------------
def test_public_functions_become_tools_with_schemas_from_hints_and_docstrings(functions_file):
    specs = {spec.name: spec for spec in load_functions(functions_file)}
    assert sorted(specs) == ["add", "fail", "greet"]  # not _helper, not the imported dumps
    add = specs["add"]
    assert add.description == "Add two numbers.\n\nReturns their sum."
    assert add.source == "functions:my_tools.py"
    assert add.parameters == {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "the first number"},
            "b": {"type": "number", "description": "the second number, continued", "default": 2.5},
        },
        "required": ["a"],
    }
    greet = specs["greet"].parameters
    assert greet["properties"]["name"] == {"type": "string", "description": "who to greet"}
    assert greet["properties"]["style"] == {"enum": ["plain", "loud"], "description": "how loudly", "default": "plain"}
    assert greet["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    assert greet["required"] == ["name"]
    assert specs["greet"].description == "Say hello."


def test_a_function_tool_runs_the_users_code(functions_file):
    specs = {spec.name: spec for spec in load_functions(functions_file)}
    assert specs["add"].run({"a": 1, "b": 2}, 5) == "3"
    assert specs["greet"].run({"name": "ada", "style": "loud"}, 5) == "ADA"
    with pytest.raises(ToolFailure, match="ValueError: nope"):
        specs["fail"].run({"reason": "nope"}, 5)


def test_a_function_that_does_not_return_in_time_is_a_timeout():
    release = threading.Event()

    def stuck() -> str:
        release.wait()
        return "late"

    try:
        with pytest.raises(ToolTimeout, match="did not return within 0.2 s"):
            call_function(stuck, {}, 0.2)
    finally:
        release.set()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("def f(:\n", "syntax error on line 1"),
        ("raise RuntimeError('boom')\n", "importing it raised RuntimeError: boom"),
        ("X = 1\n", "defines no public function"),
        ("def f(a, /):\n    pass\n", "positional-only parameter a"),
    ],
)
def test_a_bad_functions_file_is_one_usage_error(tmp_path, text, expected):
    path = tmp_path / "bad.py"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UsageError, match=expected):
        load_functions(path)


def test_a_missing_functions_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        load_functions(tmp_path / "missing.py")


def test_type_schema_and_docstring_details():
    assert type_schema(dict[str, int]) == {"type": "object"}
    assert type_schema(tuple[int, str]) == {
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "minItems": 2,
    }
    assert type_schema(int | str) == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert type_schema(bool) == {"type": "boolean"}
    description, params = parse_docstring("Look up.\n\nParameters:\n    city (str): the city\n    days: how many\n")
    assert description == "Look up."
    assert params == {"city": "the city", "days": "how many"}


# --- [tools.NAME] commands ----------------------------------------------------------------------
ECHO_ARGV_AND_STDIN = (
    "import json, os, sys; print(json.dumps({'argv': sys.argv[1:], 'stdin': sys.stdin.read(), "
    "'secret': os.environ.get('LLMCHAT_TEST_SECRET'), 'extra': os.environ.get('EXTRA')}))"
)
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}


def test_a_command_tool_gets_each_argument_as_one_argv_element_and_json_on_stdin(monkeypatch):
    monkeypatch.setenv("LLMCHAT_TEST_SECRET", "do-not-leak")
    spec = command_tool(
        "echo",
        {
            "command": [sys.executable, "-c", ECHO_ARGV_AND_STDIN, "--city={city}", "{city}", "{days}"],
            "description": "Echo",
            "parameters": CITY_SCHEMA,
            "env": {"EXTRA": "yes"},
        },
        "cfg.toml",
    )
    hostile = "Paris; rm -rf / $(reboot) `id`"
    out = json.loads(spec.run({"city": hostile}, 10))
    # One element each, exactly as given: no shell ever saw it. {days} was not given: left out.
    assert out["argv"] == [f"--city={hostile}", hostile]
    assert json.loads(out["stdin"]) == {"city": hostile}
    assert out["secret"] is None  # the clean environment keeps llmchat's own variables out
    assert out["extra"] == "yes"
    assert json.loads(spec.run({"city": "Oslo", "days": 3}, 10))["argv"] == ["--city=Oslo", "Oslo", "3"]


def test_build_argv_keeps_json_values_in_one_element():
    argv = build_argv(["prog", "{items}", "x{n}y"], {"items": ["a b", 1], "n": 2})
    assert argv == ["prog", '["a b", 1]', "x2y"]


def test_a_failing_command_gives_its_status_and_stderr():
    spec = command_tool(
        "fails",
        {"command": [sys.executable, "-c", "import sys; print('bad input', file=sys.stderr); sys.exit(3)"]},
        "cfg.toml",
    )
    with pytest.raises(ToolFailure, match="exited with status 3; stderr: bad input"):
        spec.run({}, 10)


def test_a_command_past_its_timeout_is_stopped():
    spec = command_tool("slow", {"command": [sys.executable, "-c", "import time; time.sleep(600)"]}, "cfg.toml")
    with pytest.raises(ToolTimeout, match="did not finish within 0.3 s and was stopped"):
        spec.run({}, 0.3)


def test_a_missing_program_is_a_tool_failure():
    spec = command_tool("ghost", {"command": ["/nonexistent/program-xyz"]}, "cfg.toml")
    with pytest.raises(ToolFailure, match="cannot start /nonexistent/program-xyz"):
        spec.run({}, 5)


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({"command": "ls -l"}, "command must be a list of strings"),
        ({"command": []}, "command must be a list of strings"),
        ({"command": ["ls"], "shell": True}, "unknown key 'shell'"),
        ({"command": ["ls", "{path}"]}, r"command uses \{path\}, which is not a property"),
        ({"command": ["{prog}"], "parameters": {"properties": {"prog": {"type": "string"}}}}, "cannot come from"),
        ({"command": ["ls"], "approve": "yes"}, 'approve must be "ask" or "always"'),
        ({"command": ["ls"], "parameters": {"type": "array"}}, 'JSON schema of type "object"'),
        ({"command": ["ls"], "parameters": "{not json"}, "parameters is not valid JSON"),
        ({"command": ["ls"], "parameters": {"type": "object", "properties": 3}}, "not a valid JSON schema"),
        ({"command": ["ls"], "timeout": 0}, "timeout must be a number of seconds above 0"),
        ({"command": ["ls"], "env": {"A": 1}}, "env must be a table of strings"),
    ],
)
def test_a_wrong_tools_table_is_one_config_error(settings, expected):
    with pytest.raises(ConfigError, match=expected):
        command_tool("t", settings, "cfg.toml")


def test_the_config_file_accepts_tools_and_mcp_tables(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        '[tools.listing]\ncommand = ["ls", "{dir}"]\ndescription = "List a folder"\napprove = "always"\n'
        'parameters = \'{"type": "object", "properties": {"dir": {"type": "string"}}}\'\n\n'
        '[mcp.time]\ncommand = "mcp-server-time"\nargs = ["--local-timezone", "UTC"]\n',
        encoding="utf-8",
    )
    config = load_config(path)
    spec = command_tool("listing", config.tools["listing"], path)
    assert spec.approve == "always"
    assert spec.parameters["properties"] == {"dir": {"type": "string"}}
    server = server_from_config("time", config.mcp["time"], path)
    assert (server.command, server.args, server.source) == (
        "mcp-server-time",
        ("--local-timezone", "UTC"),
        "config:mcp.time",
    )


# --- MCP ------------------------------------------------------------------------------------------
def test_mcp_spec_parsing_and_server_names():
    server = parse_mcp_spec("mcp-server-time --local-timezone 'Europe/Paris'")
    assert (server.name, server.command, server.args) == (
        "time",
        "mcp-server-time",
        ("--local-timezone", "Europe/Paris"),
    )
    assert parse_mcp_spec("/opt/bin/mcp_server_git.py --repo .").name == "git"
    assert parse_mcp_spec("npx").name == "npx"
    with pytest.raises(UsageError, match="--mcp needs a command"):
        parse_mcp_spec("   ")
    with pytest.raises(UsageError, match="No closing quotation"):
        parse_mcp_spec("prog 'open")


@pytest.mark.parametrize(
    "name, settings, expected",
    [
        ("time", {"args": []}, 'needs command = "PROGRAM"'),
        ("time", {"command": "x", "args": "a b"}, "args must be a list of strings"),
        ("time", {"command": "x", "cwd": "/"}, "unknown key 'cwd'"),
        ("bad name", {"command": "x"}, "server names are letters"),
    ],
)
def test_a_wrong_mcp_table_is_one_config_error(name, settings, expected):
    with pytest.raises(ConfigError, match=expected):
        server_from_config(name, settings, "cfg.toml")


def test_without_the_mcp_package_one_line_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "mcp", None)  # what `import mcp` does when it is not installed
    with pytest.raises(UsageError) as caught:
        McpConnection(parse_mcp_spec("mcp-server-time")).open()
    assert str(caught.value) == "MCP servers need the mcp package: pip install 'llmchat[mcp]'"
    assert "\n" not in str(caught.value)


def test_a_real_mcp_server_lists_its_tools_as_server_tool_and_answers_a_call():
    with McpConnection(parse_mcp_spec("mcp-server-time --local-timezone UTC")) as connection:
        specs = {spec.name: spec for spec in connection.tools}
        assert set(specs) == {"time_get_current_time", "time_convert_time"}
        schema = specs["time_get_current_time"].parameters
        assert schema["required"] == ["timezone"] and schema["properties"]["timezone"]["type"] == "string"
        answer = json.loads(specs["time_get_current_time"].run({"timezone": "UTC"}, 30))
        assert answer["timezone"] == "UTC" and answer["datetime"].endswith("+00:00")
        converted = json.loads(
            specs["time_convert_time"].run(
                {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}, 30
            )
        )
        assert converted["target"]["datetime"].split("T")[1].startswith("21:00")
        with pytest.raises(ToolFailure, match="Invalid timezone"):  # the server's own error, as text
            specs["time_get_current_time"].run({"timezone": "Nowhere/Atlantis"}, 30)


def test_an_mcp_server_killed_mid_call_is_a_tool_failure_not_a_crash():
    with McpConnection(DYING_SERVER) as connection:
        assert [spec.name for spec in connection.tools] == ["dying_echo", "dying_die", "dying_touch", "dying_sleep"]
        assert connection.call("echo", {"text": "still here"}, 30) == "still here"
        with pytest.raises(ToolFailure, match="MCP server dying failed"):
            connection.call("die", {}, 30)
        with pytest.raises(ToolFailure, match="MCP server dying"):  # later calls: the same text, no hang
            connection.call("echo", {"text": "again"}, 30)


def test_an_mcp_server_that_cannot_start_is_one_line():
    with pytest.raises(
        UsageError, match=r"MCP server nowhere \(/nonexistent/nowhere\) did not start: program not found"
    ):
        McpConnection(parse_mcp_spec("/nonexistent/nowhere")).open()
    broken = McpServerConfig(name="broken", command=sys.executable, args=("-c", "import sys; sys.exit('cannot run')"))
    with pytest.raises(UsageError, match="did not start: .*its stderr ends: cannot run"):
        McpConnection(broken).open()


def test_tool_names_are_prefixed_by_the_server():
    assert mcp_config.tool_name("git", "status") == "git_status"


def test_a_command_that_never_reads_stdin_still_gets_large_arguments_and_runs():
    spec = command_tool(
        "ignores_stdin",
        {
            "command": [sys.executable, "-c", "print('ran')"],
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
        "cfg.toml",
    )
    assert spec.run({"text": "x" * 1_000_000}, 30).strip() == "ran"  # far beyond a pipe's buffer


def test_sequence_hints_are_arrays():
    from collections.abc import Sequence

    assert type_schema(Sequence[int]) == {"type": "array", "items": {"type": "integer"}}


def test_an_mcp_call_past_its_timeout_is_a_tool_failure_and_the_server_still_answers():
    with McpConnection(DYING_SERVER) as connection:
        with pytest.raises(ToolFailure, match="MCP server dying did not answer within 0.5 s"):
            connection.call("sleep", {"seconds": 600}, 0.5)
        assert connection.call("echo", {"text": "next"}, 30) == "next"
