"""Remote engines (--server, [servers.NAME]): llama-server, the RPC split, OpenAI-compatible servers.

Two kinds of test:
- against a small local HTTP server that stands in for a remote endpoint, scripted per test, for
  what a real server will not do on demand: refuse a key, answer 429, cut a stream, reject
  `stream_options`, send a role-only first chunk;
- against real servers started on free 127.0.0.1 ports (tests/servers/harness.py): llama-server
  and rpc-server built by tests/servers/build.sh, and llama-cpp-python's `llama_cpp.server`, all
  serving SmolLM2. When the binaries are missing those tests fail with the build command.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest
from servers import harness

MARKER_KEY = "sk-llmchat-MARKER-7f3a91"


# --- a scripted stand-in server --------------------------------------------------------------------
class StandIn:
    """A local HTTP server whose answers each test scripts: `routes[(method, path)] = fn(request)`,
    where `fn` returns (status, json_body) or a list of SSE chunks (dicts, "[DONE]", floats = pauses,
    None = drop the connection)."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Callable[[dict[str, Any]], Any]] = {}
        self.seen: list[dict[str, Any]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null") if length else None
                request = {"method": method, "path": self.path, "body": body, "headers": dict(self.headers)}
                stand_in.seen.append(request)
                route = stand_in.routes.get((method, self.path))
                answer = route(request) if route else (404, {"error": {"code": 404, "message": "File Not Found"}})
                if isinstance(answer, tuple):
                    status, payload = answer
                    data = json.dumps(payload).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in answer:
                    if chunk is None:  # drop the connection mid-stream
                        self.wfile.flush()
                        self.connection.shutdown(2)
                        self.close_connection = True
                        return
                    if isinstance(chunk, float):
                        time.sleep(chunk)
                        continue
                    text = chunk if isinstance(chunk, str) else json.dumps(chunk)
                    self.wfile.write(f"data: {text}\n\n".encode())
                    self.wfile.flush()
                self.close_connection = True

            def do_GET(self) -> None:  # noqa: N802
                self._handle("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._handle("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def chat_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.seen if r["path"] == "/v1/chat/completions"]


def openai_models(model: str = "tiny", max_len: int | None = 1024) -> Callable:
    card: dict[str, Any] = {"id": model, "object": "model"}
    if max_len is not None:
        card["max_model_len"] = max_len
    return lambda request: (200, {"object": "list", "data": [card]})


def delta(text: str | None = None, *, role: str | None = None, finish: str | None = None, **extra: Any) -> dict:
    piece: dict[str, Any] = {}
    if role:
        piece["role"] = role
    if text is not None:
        piece["content"] = text
    return {"choices": [{"index": 0, "delta": piece, "finish_reason": finish}], **extra}


@pytest.fixture
def stand_in():
    server = StandIn()
    yield server
    server.close()


def write_config(home: Path, text: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    from llmchat import paths

    path = paths.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("llmchat: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


# --- OpenAI-compatible path, scripted -------------------------------------------------------------
def test_openai_stream_counts_usage_times_first_content_and_falls_back_on_stream_options(cli, stand_in):
    stand_in.routes[("GET", "/v1/models")] = openai_models(max_len=1024)

    def chat(request: dict[str, Any]) -> Any:
        options = request["body"].get("stream_options") or {}
        if options.get("continuous_usage_stats"):
            return 400, {"error": {"code": 400, "message": "unsupported field stream_options.continuous_usage_stats"}}
        return [
            delta(role="assistant"),  # the role-only first chunk: not the first token
            0.4,
            delta("Hel"),
            delta("lo there"),
            delta(finish="stop"),
            {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17,
                                      "prompt_tokens_details": {"cached_tokens": 3}}},
            "[DONE]",
        ]  # fmt: skip

    stand_in.routes[("POST", "/v1/chat/completions")] = chat
    result = cli("ask", "--server", stand_in.url, "--json", "--temp", "0", "hi")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["reply"] == "Hello there"
    assert record["template"] == "server"
    stats = record["stats"]
    # Tokens from usage (5), not from the two content chunks; TTFT from the first content, after the pause.
    assert stats["generated_tokens"] == 5
    assert stats["prompt_tokens"] == 12 and stats["cached_tokens"] == 3
    assert stats["ttft_s"] >= 0.4
    assert stats["context_limit"] == 1024
    requests = stand_in.chat_requests()
    assert len(requests) == 2
    assert requests[0]["body"]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert requests[1]["body"]["stream_options"] == {"include_usage": True}
    assert requests[1]["body"]["messages"][-1] == {"role": "user", "content": "hi"}
    assert requests[1]["body"]["model"] == "tiny"


def test_a_stream_cut_mid_reply_is_a_server_error(cli, stand_in):
    stand_in.routes[("GET", "/v1/models")] = openai_models()
    stand_in.routes[("POST", "/v1/chat/completions")] = lambda r: [delta(role="assistant"), delta("Partial"), None]
    result = cli("ask", "--server", stand_in.url, "hi")
    assert result.returncode == 6, result.stderr
    line = one_error_line(result.stderr)
    assert "dropped the connection" in line or "ended the stream" in line
    assert "Partial" in result.stdout  # what was streamed reached the reader


# Run `llmchat ARGS` in a fresh interpreter and write, at exit, which heavy libraries it imported.
_IMPORTS_AT_EXIT = """
import atexit, json, runpy, sys
report = sys.argv.pop(1)
def _report():
    with open(report, "w") as out:
        json.dump(sorted({m.split(".")[0] for m in sys.modules} & {"llama_cpp", "numpy"}), out)
atexit.register(_report)
sys.argv[0] = "llmchat"
runpy.run_module("llmchat", run_name="__main__")
"""


def test_ask_with_a_server_never_loads_llama_cpp_or_numpy(stand_in, isolated_home, tmp_path):
    """A remote engine needs neither library: `--server` must not pay for loading them."""
    import subprocess
    import sys

    stand_in.routes[("GET", "/v1/models")] = openai_models()
    stand_in.routes[("POST", "/v1/chat/completions")] = lambda r: [delta("Hi"), delta(finish="stop"), "[DONE]"]
    report = tmp_path / "imports.json"
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS_AT_EXIT, str(report), "ask", "--server", stand_in.url, "--json", "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["reply"] == "Hi"
    assert json.loads(report.read_text()) == []


def test_a_thinking_budget_on_a_server_that_cannot_steer_says_so_once(cli, stand_in):
    stand_in.routes[("GET", "/v1/models")] = openai_models()
    stand_in.routes[("POST", "/v1/chat/completions")] = lambda r: [delta("Hi"), delta(finish="stop"), "[DONE]"]
    result = cli("ask", "--server", stand_in.url, "--thinking-budget", "8", "--no-history", "hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "Hi"
    warnings = [line for line in result.stderr.splitlines() if "--thinking-budget" in line]
    assert len(warnings) == 1 and "not token ids" in warnings[0], result.stderr


def test_a_schema_on_a_server_that_takes_no_grammar_is_a_usage_error(cli, stand_in):
    stand_in.routes[("GET", "/v1/models")] = openai_models()
    result = cli("ask", "--server", stand_in.url, "--format", "json", "--no-history", "hi")
    assert result.returncode == 2, result.stderr
    line = one_error_line(result.stderr)
    assert "takes no grammar" in line and "llama-server" in line


def test_api_key_comes_from_the_named_variable_and_is_never_shown(cli, stand_in, isolated_home):
    def models(request: dict[str, Any]) -> Any:
        if request["headers"].get("Authorization") != f"Bearer {MARKER_KEY}":
            return 401, {"error": {"message": "missing key"}}
        return 200, {"data": [{"id": "tiny", "max_model_len": 512}]}

    stand_in.routes[("GET", "/v1/models")] = models
    # A server (or proxy) that echoes the header back in its error must not leak it either.
    stand_in.routes[("POST", "/v1/chat/completions")] = lambda r: (
        401,
        {"error": {"message": f"invalid key {r['headers'].get('Authorization')}"}},
    )
    write_config(isolated_home, f'[servers.box]\nurl = "{stand_in.url}"\nkind = "openai"\napi_key_env = "BOX_KEY"\n')
    result = cli("ask", "-m", "box:tiny", "-v", "hi", env={"BOX_KEY": MARKER_KEY})
    assert result.returncode == 6, result.stderr
    assert MARKER_KEY not in result.stderr and MARKER_KEY not in result.stdout
    assert "***" in result.stderr  # the echoed key was blanked
    assert "api_key_env" in result.stderr.splitlines()[-1]
    assert any(r["headers"].get("Authorization") == f"Bearer {MARKER_KEY}" for r in stand_in.seen)

    # Without the variable: a usage error naming it, before any request.
    before = len(stand_in.seen)
    result = cli("ask", "-m", "box:tiny", "hi", env={"BOX_KEY": ""})
    assert result.returncode == 2
    assert "BOX_KEY" in one_error_line(result.stderr)
    assert len(stand_in.seen) == before


def test_a_successful_remote_turn_saves_history_without_the_key(cli, stand_in, isolated_home):
    stand_in.routes[("GET", "/v1/models")] = openai_models()
    stand_in.routes[("POST", "/v1/chat/completions")] = lambda r: [delta("Fine."), delta(finish="stop"), "[DONE]"]
    url = stand_in.url.replace("http://", f"http://user:{MARKER_KEY}@")  # credentials in a URL are not kept either
    result = cli("ask", "--server", url, "--json", "-v", "hello", env={"LLMCHAT_API_KEY": MARKER_KEY})
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["saved"] is True and record["reply"] == "Fine."
    assert MARKER_KEY not in result.stderr and MARKER_KEY not in result.stdout
    from llmchat import paths

    db = paths.history_db()
    assert MARKER_KEY.encode() not in db.read_bytes()
    rows = sqlite3.connect(db).execute("select model_path from conversations").fetchall()
    assert rows and all(stand_in.url in row[0] for row in rows)


def test_batch_retries_a_busy_server_and_writes_each_record_once(cli, stand_in, tmp_path):
    stand_in.routes[("GET", "/v1/models")] = openai_models()
    calls = {"n": 0}
    lock = threading.Lock()

    def chat(request: dict[str, Any]) -> Any:
        with lock:
            calls["n"] += 1
            busy = calls["n"] <= 2
        if busy:
            return 429, {"error": {"code": 429, "message": "too many requests"}}
        text = request["body"]["messages"][-1]["content"]
        return [delta(f"echo {text}"), delta(finish="stop"), "[DONE]"]

    stand_in.routes[("POST", "/v1/chat/completions")] = chat
    items = tmp_path / "items.txt"
    items.write_text("one\ntwo\nthree\n")
    out = tmp_path / "out.jsonl"
    result = cli("batch", str(items), "-o", str(out), "--server", stand_in.url, "--parallel", "2", "--progress", "off")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == [1, 2, 3]
    assert [r["reply"] for r in records] == ["echo one", "echo two", "echo three"]
    assert calls["n"] == 5  # two refused, then one each


@pytest.mark.slow  # the five backoff pauses add up to 15.5 s
def test_batch_gives_up_after_the_retries_with_an_error_record(cli, stand_in, tmp_path):
    stand_in.routes[("GET", "/v1/models")] = openai_models()
    stand_in.routes[("POST", "/v1/chat/completions")] = lambda r: (503, {"error": {"message": "no slot"}})
    items = tmp_path / "items.txt"
    items.write_text("one\n")
    out = tmp_path / "out.jsonl"
    result = cli("batch", str(items), "-o", str(out), "--server", stand_in.url, "--progress", "off")
    assert result.returncode == 1, result.stderr
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["reply"] is None and "503" in record["error"]
    assert len(stand_in.chat_requests()) == 6  # the first try and five retries


def test_connection_failures_are_one_line_with_exit_6(cli):
    port = harness.free_port()  # nothing listens there
    result = cli("ask", "--server", f"http://127.0.0.1:{port}", "hi")
    assert result.returncode == 6
    assert "cannot connect" in one_error_line(result.stderr)


def test_an_endpoint_that_is_not_a_server_is_explained(cli, stand_in):
    result = cli("ask", "--server", stand_in.url, "hi")  # answers 404 to everything
    assert result.returncode == 6
    assert "does not look like llama-server" in one_error_line(result.stderr)


def test_server_options_and_config_are_checked_before_connecting(cli, isolated_home):
    result = cli("ask", "--server", "http://127.0.0.1:9", "--connect-timeout", "0", "hi")
    assert result.returncode == 2 and "--connect-timeout" in one_error_line(result.stderr)
    result = cli("ask", "--server", "ftp://example", "hi")
    assert result.returncode == 2 and "http" in one_error_line(result.stderr)
    write_config(isolated_home, '[servers.box]\nurl = "http://127.0.0.1:9"\napi_key = "sk-plain"\n')
    result = cli("ask", "-m", "box:tiny", "hi")
    assert result.returncode == 2 and "api_key_env" in one_error_line(result.stderr)
    write_config(isolated_home, '[servers.box]\nurl = "http://127.0.0.1:9"\nkind = "vllm"\n')
    result = cli("ask", "-m", "box:tiny", "hi")
    assert result.returncode == 2 and "kind" in one_error_line(result.stderr)


def test_auto_probe_recognises_ollama(stand_in):
    from llmchat.engine.remote.http import ServerClient
    from llmchat.engine.remote.probe import detect_kind
    from llmchat.engine.remote.spec import ServerSpec

    stand_in.routes[("GET", "/api/version")] = lambda r: (200, {"version": "0.13.0"})
    client = ServerClient(ServerSpec(url=stand_in.url))
    try:
        assert detect_kind(client) == "ollama"
    finally:
        client.close()
    assert [r["path"] for r in stand_in.seen] == ["/props", "/v1/models", "/api/version"]


# --- real servers ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="module")
def llama_server(smollm2_path, server_logs):
    # Without the host-memory prompt cache: a prompt it restores whole has only its last token
    # evaluated, which changes the arithmetic enough to tip a greedy near-tie between two runs.
    server = harness.start_llama_server(smollm2_path, server_logs, slots=2, ctx=2048, extra=["--cache-ram", "0"])
    yield server
    server.stop()


@pytest.mark.server
def test_llama_server_ask_matches_the_local_engine(cli, llama_server, smollm2_path):
    # The default repeat penalty: its window (the last 64 tokens, prompt included) is the same on both
    # sides (tests/test_server_parity.py compares whole records, loops, budgets and schemas).
    args = ("--json", "--temp", "0", "-n", "24", "--no-history", "Name three colours.")
    local = cli("ask", "-m", str(smollm2_path), *args)
    remote = cli("ask", "--server", llama_server.url, *args)
    assert local.returncode == 0, local.stderr
    assert remote.returncode == 0, remote.stderr
    local_record, remote_record = json.loads(local.stdout), json.loads(remote.stdout)
    # The same template rendered here, the same token ids, the same llama.cpp: the same greedy reply.
    assert remote_record["reply"] == local_record["reply"]
    assert remote_record["template"] == local_record["template"]
    assert remote_record["stats"]["prompt_tokens"] == local_record["stats"]["prompt_tokens"]
    assert remote_record["stats"]["generated_tokens"] == local_record["stats"]["generated_tokens"]
    assert remote_record["stats"]["context_limit"] == 2048  # the slot's n_ctx, not -c (4096 over 2 slots)


@pytest.mark.server
def test_llama_server_chat_reuses_the_remote_kv_cache(cli, llama_server):
    turns = "My name is Ada.\nWhat is my name?\nSay it again, in capitals.\n"
    result = cli("chat", "--server", llama_server.url, "--json", "--temp", "0", "-n", "24", input=turns)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 3 and all(r["error"] is None for r in records)
    for previous, record in zip(records, records[1:]):
        # The previous prompt and its reply are still in the pinned slot (all but the reply's last
        # token, sampled but never evaluated): the server prefills only what follows (its own
        # count, from the reply's timings).
        held = previous["stats"]["prompt_tokens"] + previous["stats"]["generated_tokens"] - 1
        assert record["stats"]["cached_tokens"] >= held, (previous["stats"], record["stats"])


@pytest.mark.server
def test_llama_server_batch_parallel_streams(cli, llama_server, tmp_path):
    items = tmp_path / "items.jsonl"
    prompts = ["Count to three.", "Name a fruit.", "Say yes.", "Name a planet."]
    items.write_text("".join(json.dumps({"id": f"q{i}", "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    out = tmp_path / "out.jsonl"
    base = ("--server", llama_server.url, "--temp", "0", "-n", "16", "--progress", "off")
    log_before = len(llama_server.log_text())
    result = cli("batch", str(items), "-o", str(out), "--parallel", "2", *base)
    assert result.returncode == 0, result.stderr
    parallel = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in parallel] == ["q0", "q1", "q2", "q3"]
    assert all(r["reply"] and r["error"] is None for r in parallel), parallel
    # Each stream pins its own slot, so both slots took tasks. (The replies are not compared with a
    # serial run's: the server decodes the two slots in one batch, and a batch's composition
    # changes the floating-point sums, so greedy text may part after a few tokens.)
    launched = re.findall(r"launch_slot_: id +(\d+) \| task", llama_server.log_text()[log_before:])
    assert {"0", "1"} <= set(launched), launched
    serial_out = tmp_path / "serial.jsonl"
    result = cli("batch", str(items), "-o", str(serial_out), "--parallel", "1", *base)
    assert result.returncode == 0, result.stderr
    serial = [json.loads(line) for line in serial_out.read_text().splitlines()]
    assert [r["id"] for r in serial] == ["q0", "q1", "q2", "q3"]
    assert all(r["reply"] and r["error"] is None for r in serial), serial


@pytest.mark.server
def test_model_split_over_two_rpc_servers(cli, smollm2_path, server_logs, tmp_path):
    rpc = [harness.start_rpc_server(server_logs), harness.start_rpc_server(server_logs)]
    main = None
    try:
        endpoints = ",".join(f"127.0.0.1:{r.port}" for r in rpc)
        main = harness.start_llama_server(
            smollm2_path, server_logs, extra=["--rpc", endpoints, "-ngl", "99", "--tensor-split", "1,1", "-lv", "4"]
        )
        log = main.log_text()
        for r in rpc:
            # Both RPC devices hold part of the model: llama.cpp logs a buffer per device.
            holds = [line for line in log.splitlines() if f"127.0.0.1:{r.port}" in line and "buffer size" in line]
            assert holds, log[-4000:]
        result = cli("ask", "--server", main.url, "--json", "--temp", "0", "-n", "16", "--no-history", "Say hi.")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["reply"]
        items = tmp_path / "items.txt"
        items.write_text("Name a colour.\nName a number.\n")
        out = tmp_path / "out.jsonl"
        result = cli("batch", str(items), "-o", str(out), "--server", main.url, "-n", "8", "--progress", "off")
        assert result.returncode == 0, result.stderr
        assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [1, 2]
    finally:
        if main is not None:
            main.stop()
        for r in rpc:
            r.stop()


@pytest.mark.server
def test_llama_cpp_python_server_through_the_openai_path(cli, smollm2_path, server_logs):
    server = harness.start_llama_cpp_server(smollm2_path, server_logs)
    try:
        result = cli("ask", "--server", server.url, "--json", "--temp", "0", "-n", "16", "--no-history", "Say hi.")
        assert result.returncode == 0, result.stderr
        record = json.loads(result.stdout)
        assert record["reply"] and record["template"] == "server"
        assert record["stats"]["generated_tokens"] >= 1
    finally:
        server.stop()


@pytest.mark.server
def test_ctrl_c_closes_the_remote_stream_and_keeps_the_partial_reply(llama_server, isolated_home):
    import os
    import signal
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "llmchat", "ask", "--server", llama_server.url, "--temp", "0", "-n", "1500",
         "Write a very long story about a lighthouse keeper."],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ),
    )  # fmt: skip
    assert process.stdout is not None
    streamed = process.stdout.read(40)  # the reply is streaming: interrupt it mid-way
    assert streamed
    process.send_signal(signal.SIGINT)
    rest, err = process.communicate()
    assert process.returncode == 130, err
    assert err.decode().strip().endswith("llmchat: interrupted")
    from llmchat import paths

    row = (
        sqlite3.connect(paths.history_db())
        .execute("select content, interrupted from messages where role = 'assistant'")
        .fetchone()
    )
    assert row is not None and row[1] == 1
    assert row[0] and (streamed + rest).decode(errors="replace").startswith(row[0][:20])
