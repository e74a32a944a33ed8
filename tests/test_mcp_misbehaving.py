"""MCP servers over stdio that get things wrong, through `llmchat mcp call` and `ask` as a user runs
them: each ends in bounded time with at most one line about the server, its documented exit code,
no traceback, and no process left behind.

The server is tests/data/mcp/misbehaving_server.py (hand-written JSON-RPC, no SDK, so that it can
misbehave), started the way a shell wrapper starts one: `sh -c 'sleep 1000 & exec python server.py'`,
so that a grandchild holds its stdout and stderr for as long as it lives. Both pids are written to
files, and both must be gone when llmchat has ended. With `--stubborn` the server ignores SIGTERM
and the end of its stdin, and only SIGKILL ends it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import pid_in, running, wait_for_file, wait_gone

SERVER = Path(__file__).resolve().parent / "data" / "mcp" / "misbehaving_server.py"
NOT_NOW_S = 30  # a bound on waiting for the processes to go: they must be gone when llmchat has exited


@pytest.fixture
def pids(tmp_path) -> Path:
    folder = tmp_path / "pids"
    folder.mkdir()
    yield folder
    for name in ("server", "grandchild"):  # never leave one behind, whatever the test found
        if (folder / name).exists() and running(pid_in(folder / name)):
            os.kill(pid_in(folder / name), signal.SIGKILL)


def configure(home: Path, pids: Path, *, timeout: float = 600, stubborn: bool = False) -> None:
    """[mcp.bad]: the server behind a shell that leaves `sleep 1000` holding its pipes."""
    script = f"sleep 1000 & echo $! > {pids / 'grandchild'}; exec {sys.executable} {SERVER}" + (
        " --stubborn" if stubborn else ""
    )
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'[mcp.bad]\ncommand = "sh"\nargs = ["-c", {json.dumps(script)}]\n'
        f"env = {{ PID_DIR = {json.dumps(str(pids))} }}\ntimeout = {timeout}\n",
        encoding="utf-8",
    )


def assert_nothing_left(pids: Path) -> None:
    started = [pid_in(pids / name) for name in ("server", "grandchild")]
    assert wait_gone(started, NOT_NOW_S) == [], "a process of the server outlived llmchat"


def call(cli, tool: str):
    return cli("mcp", "call", "bad", tool, timeout=120)


def test_a_malformed_notification_is_one_line_and_the_call_still_answers(cli, isolated_home, pids):
    configure(isolated_home, pids)
    run = call(cli, "bad_note")  # a notifications/progress without its progressToken, then the answer
    assert run.returncode == 0 and run.stdout == "noted\n", run.stderr
    assert run.stderr == "llmchat: MCP server bad: Failed to validate notification: notifications/progress\n"
    assert_nothing_left(pids)


def test_a_notification_and_the_answer_in_one_write_are_both_read(cli, isolated_home, pids):
    configure(isolated_home, pids)
    run = call(cli, "together")
    assert (run.returncode, run.stdout, run.stderr) == (0, "together\n", "")
    assert_nothing_left(pids)


@pytest.mark.parametrize(
    "tool, timeout, line",
    [
        # The call's limit is far away: it must end because the server died, not because time ran out.
        ("crash", 600, "llmchat: error: bad_crash: MCP server bad failed: Connection closed"),
        ("hang", 1, "llmchat: error: bad_hang: MCP server bad did not answer within 1 s"),
        (
            "garbage",
            600,
            "llmchat: error: bad_garbage: MCP server bad failed: it sent a message that is not MCP "
            "(a line that is not a JSON-RPC message)",
        ),
    ],
)
def test_a_call_that_fails_is_one_line_and_exit_1(cli, isolated_home, pids, tool, timeout, line):
    configure(isolated_home, pids, timeout=timeout)
    run = call(cli, tool)
    assert run.returncode == 1 and run.stdout == "", run.stderr
    assert run.stderr.splitlines() == [line]
    assert_nothing_left(pids)


@pytest.mark.parametrize("stubborn", [False, True], ids=["server", "stubborn-server"])
@pytest.mark.parametrize(
    "sig, code, line",
    [(signal.SIGINT, 130, "llmchat: interrupted"), (signal.SIGTERM, 143, "llmchat: terminated (SIGTERM)")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_signal_during_a_call_ends_llmchat_and_the_servers_whole_group(
    isolated_home, pids, stubborn, sig, code, line
):
    configure(isolated_home, pids, stubborn=stubborn)
    process = subprocess.Popen(
        [sys.executable, "-m", "llmchat", "mcp", "call", "bad", "hang"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_file(pids / "called", process)  # the call reached the server
        process.send_signal(sig)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert (process.returncode, out, err) == (code, "", line + "\n")
    assert_nothing_left(pids)


@pytest.mark.slow
@pytest.mark.parametrize(
    "tool, said",
    [
        ("crash", "tool call bad_crash failed: MCP server bad failed: Connection closed"),
        ("bad_note", "llmchat: MCP server bad: Failed to validate notification: notifications/progress"),
    ],
)
def test_ask_with_a_misbehaving_server_answers_and_leaves_nothing(cli, smollm2_path, isolated_home, pids, tool, said):
    configure(isolated_home, pids)
    run = cli(
        "ask",
        *("-m", str(smollm2_path), "--temperature", "0", "--no-history", "--max-tokens", "48", "--chain-limit", "1"),
        *("-T", "mcp:bad", "--tool-choice", f"bad_{tool}", "--approve-tools", "--json"),
        "Use the tool.",
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert [line for line in run.stderr.splitlines() if "MCP server bad" in line] == [said]
    [made] = json.loads(run.stdout)["tool_calls"]
    assert made["name"] == f"bad_{tool}"
    assert_nothing_left(pids)


def test_what_the_sdk_says_about_a_server_is_one_line_once_on_that_servers_stream(pids):
    """Two connections, each told twice: one line each, on its own stream, naming its own server."""
    import io

    from llmchat.tools.mcp.config import McpServerConfig
    from llmchat.tools.mcp.connection import McpConnection

    streams = {name: io.StringIO() for name in ("first", "second")}
    servers = [
        McpServerConfig(name=name, command=sys.executable, args=(str(SERVER),), env={"PID_DIR": str(pids)})
        for name in streams
    ]
    with McpConnection(servers[0], stderr=streams["first"]) as first:
        with McpConnection(servers[1], stderr=streams["second"]) as second:
            for connection in (first, second, first, second):
                assert connection.call("bad_note", {}, 30) == "noted"
    for name, stream in streams.items():
        assert (
            stream.getvalue()
            == f"llmchat: MCP server {name}: Failed to validate notification: notifications/progress\n"
        )
