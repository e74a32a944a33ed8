"""`llmchat tools list`, end to end as a user runs it (real processes, a real MCP server)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

FUNCTIONS = '''
def lookup(city: str, days: int = 1) -> str:
    """Weather for a city.

    Args:
        city: the city name
        days: how many days ahead
    """
    return city
'''


def write_config(home: Path, text: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(text, encoding="utf-8")


def test_tools_list_shows_functions_config_tools_and_a_real_mcp_server(cli, tmp_path, isolated_home):
    functions = tmp_path / "weather.py"
    functions.write_text(FUNCTIONS, encoding="utf-8")
    write_config(
        isolated_home,
        '[tools.listing]\ncommand = ["ls", "{dir}"]\ndescription = "List a folder"\napprove = "always"\n'
        '[tools.listing.parameters]\ntype = "object"\nrequired = ["dir"]\n'
        '[tools.listing.parameters.properties.dir]\ntype = "string"\n',
    )
    result = cli("tools", "list", "--json", "-T", "listing", "--functions", str(functions), "--mcp", "mcp-server-time")
    assert result.returncode == 0, result.stderr
    entries = {entry["name"]: entry for entry in json.loads(result.stdout)}
    assert list(entries) == ["listing", "lookup", "time_get_current_time", "time_convert_time"]
    assert entries["listing"]["source"] == "config:tools.listing" and entries["listing"]["approve"] == "always"
    assert entries["lookup"]["parameters"]["properties"]["city"] == {"type": "string", "description": "the city name"}
    assert entries["time_get_current_time"]["source"] == "--mcp mcp-server-time"
    assert entries["time_get_current_time"]["parameters"]["required"] == ["timezone"]

    text = cli("tools", "list", "--functions", str(functions))
    assert text.returncode == 0
    assert text.stdout.splitlines()[:5] == [
        "lookup  (functions:weather.py)",
        "  Weather for a city.",
        "  arguments:",
        "    city: string (required) - the city name",
        "    days: integer (default 1) - how many days ahead",
    ]


def test_bare_tools_list_shows_everything_in_the_config(cli, isolated_home):
    write_config(
        isolated_home,
        f'[tools.hello]\ncommand = ["echo", "hi"]\n\n[mcp.dying]\ncommand = {json.dumps(sys.executable)}\n'
        f"args = [{json.dumps(str(Path(__file__).parent / 'data' / 'tools' / 'dying_mcp_server.py'))}]\n",
    )
    result = cli("tools", "list", "--json")
    assert result.returncode == 0, result.stderr
    assert [(e["name"], e["source"]) for e in json.loads(result.stdout)] == [
        ("hello", "config:tools.hello"),
        ("dying_echo", "config:mcp.dying"),
        ("dying_die", "config:mcp.dying"),
        ("dying_touch", "config:mcp.dying"),
        ("dying_sleep", "config:mcp.dying"),
    ]


def test_no_tools_is_said_on_stderr(cli):
    result = cli("tools", "list")
    assert result.returncode == 0 and result.stdout == ""
    assert "no tools" in result.stderr
    assert json.loads(cli("tools", "list", "--json").stdout) == []


def test_tools_list_errors_are_one_line_and_exit_2(cli, tmp_path, isolated_home):
    bad = tmp_path / "bad.py"
    bad.write_text("def broken(:\n", encoding="utf-8")
    for args, expected in [
        (("-T", "nope"), "-T nope: no tool of that name in the config"),
        (("-T", "mcp:nope"), "-T mcp:nope: no [mcp.nope] in the config"),
        (("--functions", str(bad)), "syntax error on line 1"),
        (("--mcp", "/nonexistent/server"), "did not start: program not found"),
    ]:
        result = cli("tools", "list", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stdout == ""
        assert len(result.stderr.strip().splitlines()) == 1 and expected in result.stderr, result.stderr
    write_config(isolated_home, '[tools.bad]\ncommand = "rm -rf /"\n')
    result = cli("tools", "list")
    assert result.returncode == 2 and "command must be a list of strings" in result.stderr
    assert "Traceback" not in result.stderr


def test_two_tools_with_one_name_are_refused(cli, tmp_path, isolated_home):
    functions = tmp_path / "f.py"
    functions.write_text("def hello():\n    return 'hi'\n", encoding="utf-8")
    write_config(isolated_home, '[tools.hello]\ncommand = ["echo", "hi"]\n')
    result = cli("tools", "list", "-T", "hello", "--functions", str(functions))
    assert result.returncode == 2
    assert "two tools are named hello (config:tools.hello and functions:f.py)" in result.stderr
