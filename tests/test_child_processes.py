"""No process llmchat starts outlives what it was started for: a command tool's whole process group
ends with the call (its exit, its timeout, a Ctrl-C, a SIGTERM); the session, its sources and its
MCP servers are each closed even when one closed before them fails; the test harness's servers end
with the test session, however it ends.

Each command here starts a background grandchild that holds the command's pipes
(`sleep 1000 & ... exec sleep 999`), the case where llmchat used to wait for an end of file that
never came. Pids are read from files the commands write; "gone" is tests/processes.py's.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmchat.tools.command_tools import command_tool
from tests.processes import pid_in, running, wait_for_file, wait_gone

NOT_NOW_S = 30  # a bound on waiting for a process to go: it must be gone as llmchat has ended


def holding_pipes(pids: Path, then: str) -> list[str]:
    """A command whose background grandchild holds its stdout and stderr; it writes both pids."""
    return [
        "sh",
        "-c",
        f"sleep 1000 & echo $! > {pids / 'grandchild'}; echo $$ > {pids / 'command'}; {then}",
    ]


@pytest.fixture
def pids(tmp_path) -> Path:
    folder = tmp_path / "pids"
    folder.mkdir()
    yield folder
    for name in ("command", "grandchild", "server"):  # never leave one behind, whatever the test found
        if (folder / name).exists() and running(pid_in(folder / name)):
            os.kill(pid_in(folder / name), signal.SIGKILL)


def started(pids: Path, *names: str) -> list[int]:
    return [pid_in(pids / name) for name in names]


# --- command tools --------------------------------------------------------------------------------


def test_a_command_that_leaves_a_child_holding_its_pipes_returns_its_output_and_the_child_ends(pids):
    spec = command_tool("leaves", {"command": holding_pipes(pids, "echo done")}, "cfg.toml")
    # The limit is far longer than the call: it must return as the command exits, not at the limit
    # (a wait for the pipes' end of file that the grandchild holds back).
    assert spec.run({}, 10) == "done\n"
    assert wait_gone(started(pids, "command", "grandchild"), NOT_NOW_S) == []


def test_a_command_past_its_timeout_ends_with_its_whole_group(pids):
    from llmchat.tools.spec import ToolTimeout

    spec = command_tool("slow", {"command": holding_pipes(pids, "exec sleep 999")}, "cfg.toml")
    with pytest.raises(ToolTimeout, match="did not finish within 1 s and was stopped"):
        spec.run({}, 1)
    assert wait_gone(started(pids, "command", "grandchild"), NOT_NOW_S) == []


def write_sleeper(home: Path, pids: Path) -> None:
    """[tools.sleeper]: approved by the config, a command that runs until it is stopped."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f"[tools.sleeper]\ncommand = {json.dumps(holding_pipes(pids, 'exec sleep 999'))}\n"
        'description = "Sleep"\napprove = "always"\ntimeout = 600\n',
        encoding="utf-8",
    )


ASK = ("--temperature", "0", "--no-history", "--max-tokens", "48", "--chain-limit", "1")


@pytest.mark.parametrize(
    "sig, code, line",
    [(signal.SIGINT, 130, "llmchat: interrupted"), (signal.SIGTERM, 143, "llmchat: terminated (SIGTERM)")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_signal_while_a_command_tool_runs_ends_ask_and_the_commands_group(
    smollm2_path, isolated_home, pids, sig, code, line
):
    write_sleeper(isolated_home, pids)
    process = subprocess.Popen(
        [sys.executable, "-m", "llmchat", "ask", "-m", str(smollm2_path), *ASK]
        + ["-T", "sleeper", "--tool-choice", "sleeper", "Sleep."],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_file(pids / "command", process)  # the model called the tool: the command runs
        process.send_signal(sig)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == code, err
    assert out == "" and err.splitlines()[-1] == line and "Traceback" not in err
    assert wait_gone(started(pids, "command", "grandchild"), NOT_NOW_S) == []


@pytest.mark.slow
def test_ctrl_c_while_a_command_tool_runs_ends_the_turn_and_the_chat_goes_on(smollm2_path, isolated_home, pids):
    import pexpect

    write_sleeper(isolated_home, pids)
    env = dict(os.environ, TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1", COLUMNS="100", LINES="30")
    child = pexpect.spawn(
        sys.executable,
        ["-m", "llmchat", "chat", "-m", str(smollm2_path), *ASK, "-T", "sleeper", "--tool-choice", "sleeper"],
        env=env,
        encoding="utf-8",
        codec_errors="replace",
        dimensions=(30, 100),
        timeout=180,
    )
    try:
        child.expect_exact("> ")
        child.send("Sleep.\r")
        child.expect_exact("tool call: sleeper(")
        wait_for_file(pids / "command")
        child.sendintr()
        child.expect_exact("> ")  # the turn ended, the prompt is back
        assert wait_gone(started(pids, "command", "grandchild"), NOT_NOW_S) == []
        child.send("/exit\r")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


# --- closing what a run opened ----------------------------------------------------------------------


def test_a_session_that_fails_to_close_still_stops_the_mcp_servers_and_frees_the_engine(
    smollm2_path, isolated_home, pids, monkeypatch
):
    from llmchat.cli import main
    from llmchat.engine.core import Engine
    from llmchat.env import Environment
    from llmchat.turn.sink import TurnSink

    server = Path(__file__).resolve().parent / "data" / "mcp" / "misbehaving_server.py"
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text(
        f"[mcp.bad]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(str(server))}]\n"
        f"env = {{ PID_DIR = {json.dumps(str(pids))} }}\n",
        encoding="utf-8",
    )

    def fails(self: TurnSink) -> None:
        raise RuntimeError("the history could not be closed")

    freed: list[Engine] = []
    free = Engine.close

    def counted(self: Engine) -> None:
        freed.append(self)
        free(self)

    monkeypatch.setattr(TurnSink, "close", fails)
    monkeypatch.setattr(Engine, "close", counted)
    env = Environment(
        stdin=io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8"),
        stdout=io.StringIO(),
        stderr=io.StringIO(),
        stdin_isatty=False,
        stdout_isatty=False,
        stderr_isatty=False,
    )
    with pytest.raises(RuntimeError, match="the history could not be closed"):
        main(["ask", "-m", str(smollm2_path), "-n", "2", "--temp", "0", "-T", "mcp:bad", "Say hi."], env)
    assert freed, "the engine was not freed"
    assert wait_gone(started(pids, "server"), NOT_NOW_S) == [], "the MCP server outlived the run"


# --- the test harness's servers ---------------------------------------------------------------------

SESSION = """
import sys
from pathlib import Path
from tests.servers.harness import start_tethered
pids = Path(sys.argv[1])
start_tethered(["sh", "-c", f"sleep 1000 & echo $! > {pids / 'grandchild'}; echo $$ > {pids / 'server'}; exec sleep 999"])
(pids / "session").write_text("started")
sys.stdin.read()
"""


def test_a_harness_server_ends_with_a_test_session_that_is_killed(pids):
    """A session killed by SIGKILL runs no teardown and no atexit: the tether ends the group."""
    repo = Path(__file__).resolve().parent.parent
    session = subprocess.Popen(
        [sys.executable, "-c", SESSION, str(pids)], stdin=subprocess.PIPE, cwd=repo, start_new_session=True
    )
    try:
        wait_for_file(pids / "session", session)
        wait_for_file(pids / "server", session)
        wait_for_file(pids / "grandchild", session)
        assert all(running(pid) for pid in started(pids, "server", "grandchild"))
        session.kill()
        session.wait()
    finally:
        if session.poll() is None:
            session.kill()
        if session.stdin is not None:
            session.stdin.close()
    assert wait_gone(started(pids, "server", "grandchild"), NOT_NOW_S) == []


def test_stopping_a_harness_server_ends_its_whole_group(pids, tmp_path):
    from tests.servers.harness import _start

    server = _start("sleeper", holding_pipes(pids, "exec sleep 999"), 0, tmp_path)
    wait_for_file(pids / "grandchild", server.process)
    wait_for_file(pids / "command", server.process)
    server.stop()
    assert wait_gone(started(pids, "command", "grandchild"), NOT_NOW_S) == []
