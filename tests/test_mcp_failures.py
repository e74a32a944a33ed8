"""MCP failures, each bounded and one clear line: a malformed message, a server that never answers
(at the start, or a call), one that reports isError or sends broken data, one that asks for a person
(elicitation), a tool list that changes, Ctrl-C during a call, an HTTP server that refuses the
token. Servers: tests/data/mcp/raw_server.py (hand-written JSON-RPC) and faulty_server.py (the
SDK's MCPServer), run as real processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llmchat.errors import ConfigError, UsageError
from llmchat.tools.approval import ApprovalPolicy
from llmchat.tools.execute import run_call
from llmchat.tools.mcp.config import McpServerConfig, parse_mcp_spec, server_from_config, server_name_for_url
from llmchat.tools.mcp.connection import McpConnection
from llmchat.tools.spec import ToolFailure

DATA = Path(__file__).resolve().parent / "data" / "mcp"


def raw_server() -> McpServerConfig:
    return McpServerConfig(name="raw", command=sys.executable, args=(str(DATA / "raw_server.py"),))


def faulty_server(marks: Path) -> McpServerConfig:
    return McpServerConfig(
        name="faulty", command=sys.executable, args=(str(DATA / "faulty_server.py"),), env={"MARK_DIR": str(marks)}
    )


def test_a_malformed_message_ends_the_call_at_once_with_one_line():
    with McpConnection(raw_server()) as connection:
        # A generous limit: the call must end because of the bad line, not because time ran out.
        with pytest.raises(ToolFailure) as failed:
            connection.call("garbage", {}, 600)
    assert str(failed.value) == (
        "MCP server raw failed: it sent a message that is not MCP (a line that is not a JSON-RPC message)"
    )


def test_a_changed_tool_list_is_seen_and_listed_again():
    with McpConnection(raw_server()) as connection:
        assert [spec.name for spec in connection.tools] == ["raw_garbage", "raw_grow"]
        assert not connection.tools_changed
        assert connection.call("grow", {}, 30) == "added grown"
        assert connection.tools_changed  # notifications/tools/list_changed arrived with the answer
        assert [spec.name for spec in connection.refresh_tools()] == ["raw_garbage", "raw_grow", "raw_grown"]
        assert not connection.tools_changed
        assert connection.tools[-1].run({}, 30) == "grown"


def test_a_server_that_never_answers_the_handshake_is_one_line():
    silent = McpServerConfig(
        name="silent", command=sys.executable, args=("-c", "import sys; sys.stdin.read()"), timeout_s=1
    )
    with pytest.raises(UsageError) as failed:
        McpConnection(silent).open()
    assert str(failed.value).startswith(f"MCP server silent ({sys.executable}) did not start: no answer within 1 s")


def test_errors_from_the_tools_become_text_for_the_model(tmp_path):
    with McpConnection(faulty_server(tmp_path)) as connection:
        tools = {spec.name: spec for spec in connection.tools}
        policy = ApprovalPolicy(interactive=False, approve_all=True)
        failed = run_call(tools, "faulty_fail", {}, policy)  # isError
        assert failed.approved and failed.text_for_model.startswith("Error: Error executing tool fail")
        broken = run_call(tools, "faulty_picture", {}, policy)
        assert broken.text_for_model == "Error: the server sent image/png data that is not valid base64"
        # The server asks the client for a person's answer: refused at once, never a hang.
        person = run_call(tools, "faulty_ask_person", {}, policy, timeout_s=600)
        assert person.error and person.error.startswith("MCP server faulty failed:") and "\n" not in person.error
        with pytest.raises(ToolFailure, match="MCP server faulty did not answer within 0.5 s"):
            connection.call("hang", {}, 0.5)
        assert (tmp_path / "started").exists()
        with pytest.raises(ToolFailure, match="isError|Error executing tool fail"):  # still answering
            connection.call("fail", {}, 30)


def wait_for(path: Path, process: subprocess.Popen, limit_s: float = 120) -> None:
    """Until the file appears (the event), bounded so a broken run cannot hang the suite."""
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        if process.poll() is not None and not path.exists():
            pytest.fail(f"the process ended first: {process.returncode}")
        time.sleep(0.05)


def test_ctrl_c_during_a_call_cancels_it_on_the_server(tmp_path, isolated_home):
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text(
        f"[mcp.faulty]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(str(DATA / 'faulty_server.py'))}]\n"
        f"env = {{ MARK_DIR = {json.dumps(str(tmp_path))} }}\n",
        encoding="utf-8",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "llmchat", "mcp", "call", "faulty", "hang", "--timeout", "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(tmp_path / "started", process)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130 and out == "" and "Traceback" not in err
    assert (tmp_path / "cancelled").read_text() == "cancelled"  # notifications/cancelled reached the server


class _Refusing(BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 (the http.server API)
        type(self).seen.append(self.headers.get("Authorization", ""))
        self.send_response(401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        self.do_POST()

    def log_message(self, *args: object) -> None:
        pass


def test_a_bearer_token_comes_from_its_variable_and_a_refusal_is_one_line(monkeypatch):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/mcp"
        server = server_from_config(
            "guarded", {"url": url, "bearer_token_env": "GUARD_TOKEN", "headers": {"X-Team": "docs"}}, "cfg.toml"
        )
        assert "s3cret" not in repr(server)
        with pytest.raises(
            UsageError, match="bearer_token_env = 'GUARD_TOKEN', but that environment variable is not set"
        ):
            McpConnection(server).open()
        monkeypatch.setenv("GUARD_TOKEN", "s3cret")
        with pytest.raises(UsageError) as refused:
            McpConnection(server, startup_timeout_s=30).open()
        assert str(refused.value).startswith(f"MCP server guarded ({url}) could not be reached:")
        assert "\n" not in str(refused.value) and "(HTTP 401: check its token" in str(refused.value)
        assert "Bearer s3cret" in _Refusing.seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_an_sse_server_is_reached_too(npm_mcp_bin, tmp_path):
    from mcp_servers import free_port, http_server

    port = free_port()
    with http_server([str(npm_mcp_bin / "mcp-server-everything"), "sse"], port, tmp_path / "sse.log"):
        server = parse_mcp_spec(f"everything=http://127.0.0.1:{port}/sse")
        assert server.transport == "sse"
        with McpConnection(server) as connection:
            assert connection.call("get-sum", {"a": 2, "b": 3}, 30) == "The sum of 2 and 3 is 5."
            assert len(connection.list_prompts()) == 4


def test_url_servers_in_the_config_and_on_the_command_line():
    server = server_from_config("web", {"url": "https://mcp.example.com/mcp", "timeout": 5}, "cfg.toml")
    assert (server.transport, server.url, server.command, server.timeout_s) == ("http", server.url, "", 5.0)
    assert server_from_config("old", {"url": "http://h/sse"}, "c").transport == "sse"
    assert server_from_config("old", {"url": "http://h/events", "transport": "sse"}, "c").transport == "sse"
    assert parse_mcp_spec("http://127.0.0.1:3001/mcp").name == "remote"
    assert parse_mcp_spec("docs=https://mcp.example.com/mcp").name == "docs"
    assert server_name_for_url("https://mcp.example.com/mcp") == "example"
    assert parse_mcp_spec("mcp-server-time --local-timezone UTC").transport == "stdio"
    for settings, expected in (
        ({"url": "http://h/mcp", "command": "x"}, "give command (a server to start) or url"),
        ({"url": "ftp://h"}, "url must be an http:// or https:// address"),
        ({"url": "http://h/mcp", "args": ["x"]}, "args is for servers started by command"),
        ({"command": "x", "headers": {"a": "b"}}, "headers is for servers reached by url"),
        ({"url": "http://h/mcp", "transport": "ws"}, 'transport must be "http"'),
        ({"url": "http://h/mcp", "bearer_token_env": "not a name"}, "bearer_token_env names an environment variable"),
        ({"url": "http://h/mcp", "headers": {"a": 1}}, "headers must be a table of strings"),
    ):
        with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            server_from_config("bad", settings, "cfg.toml")


def test_the_token_never_reaches_the_config_object(monkeypatch):
    monkeypatch.setenv("SOME_TOKEN", "abc")
    server = server_from_config("s", {"url": "http://h/mcp", "bearer_token_env": "SOME_TOKEN"}, "c")
    assert server.http_headers()["Authorization"] == "Bearer abc"
    assert "abc" not in repr(server) and "abc" not in json.dumps(server.headers)
    assert os.environ["SOME_TOKEN"] == "abc"


def test_a_toolset_lists_a_changed_server_again():
    from llmchat.config import Config
    from llmchat.tools.registry import gather_tools

    spec = f"{sys.executable} {DATA / 'raw_server.py'}"
    with gather_tools(Config(path=Path("none.toml")), mcp_specs=[spec]) as toolset:
        assert not toolset.refresh_changed()
        names = list(toolset.tools)
        assert toolset.tools[names[1]].run({}, 30) == "added grown"
        assert toolset.refresh_changed()
        assert list(toolset.tools) == [*names, names[0].rsplit("_", 1)[0] + "_grown"]


def test_an_http_server_that_dies_mid_session_fails_the_next_call_at_once(npm_mcp_bin, tmp_path):
    from mcp_servers import free_port, http_server

    port = free_port()
    with http_server([str(npm_mcp_bin / "mcp-server-everything"), "streamableHttp"], port, tmp_path / "log") as node:
        with McpConnection(parse_mcp_spec(f"everything=http://127.0.0.1:{port}/mcp")) as connection:
            assert connection.call("echo", {"message": "a"}, 30) == "Echo: a"
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()
            with pytest.raises(ToolFailure) as failed:
                connection.call("echo", {"message": "b"}, 600)  # ends on the closed connection, not the limit
    assert str(failed.value).startswith("MCP server everything failed: ") and "\n" not in str(failed.value)
    assert "HTTP 400" not in str(failed.value)
