"""Several servers (`--server` given more than once, or a [servers.NAME] `urls` group).

batch spreads its items over every server by free slots and keeps input order; a server that dies
mid-batch hands its items to the others (each id exactly once); when all die the exit is 6 with the
finished records saved, and `--resume` finishes the rest. ask and chat use the first server that
answers. Real llama-servers (tests/servers/harness.py) on free 127.0.0.1 ports, one thread each,
and scripted stand-ins (tests/test_remote.py) for what a real server will not do on demand.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import harness
from test_remote import StandIn, delta, one_error_line, openai_models, write_config

pytestmark = pytest.mark.server

# Each starts with its own first word: whichever item a server decoded before, the prefix its slot
# still holds for the next item is the chat template's opening only, so an item's prompt is split
# between cache and prefill the same way on either server (greedy replies then match exactly).
PROMPTS = [
    "Name a colour.",
    "Count to three.",
    "List two fruits.",
    "Say yes.",
    "Give the name of a planet.",
    "Describe a river in one line.",
    "Spell the word cat.",
    "Translate hello into French.",
]
# Greedy and seeded: the same item gives the same record on either server.
GREEDY = ("--temp", "0", "--seed", "1", "--progress", "off")
POLLS = 6000  # x 0.05 s: hang guards for waiting on a record, never a timing assertion
POLL_PAUSE = 0.05


def write_items(path: Path, prompts: list[str] = PROMPTS) -> list[str]:
    ids = [f"q{i}" for i in range(len(prompts))]
    path.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in zip(ids, prompts)))
    return ids


def read_records(path: Path) -> list[dict[str, Any]]:
    data = path.read_text()
    assert not data or data.endswith("\n"), "a partial line was left"
    return [json.loads(line) for line in data.splitlines()]


def content(record: dict[str, Any]) -> dict[str, Any]:
    """A record without its timings (which differ run to run)."""
    kept = {k: v for k, v in record.items() if k != "stats"}
    kept["tokens"] = (record["stats"]["prompt_tokens"], record["stats"]["generated_tokens"])
    return kept


def prompt_tokens_total(server: harness.ServerProcess) -> float:
    """Prompt tokens the server has processed (its /metrics, started with --metrics)."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("llamacpp:prompt_tokens_total"):
            return float(line.split()[-1])
    raise AssertionError(f"no llamacpp:prompt_tokens_total in {server.url}/metrics:\n{text[:2000]}")


def start_pair(model: Path, logs: Path) -> list[harness.ServerProcess]:
    servers: list[harness.ServerProcess] = []
    try:
        for _ in range(2):
            # --cache-ram 0: no host-memory prompt cache, which would restore a prompt a server has seen
            # whole and evaluate only its last token (other arithmetic, so a near-tie may tip).
            servers.append(
                harness.start_llama_server(
                    model, logs, slots=1, ctx=2048, threads=1, extra=["--metrics", "--cache-ram", "0"]
                )
            )
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def start_batch(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "llmchat", "batch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=dict(os.environ),
    )


def wait_for_records(out: Path, process: subprocess.Popen, count: int = 1) -> None:
    """Until `out` holds `count` complete records (bounded; fails if the batch ends first)."""
    for _ in range(POLLS):
        if out.exists() and out.read_bytes().count(b"\n") >= count:
            return
        if process.poll() is not None:
            _, err = process.communicate()
            pytest.fail(f"the batch ended ({process.returncode}) before {count} records:\n{err.decode()[-3000:]}")
        time.sleep(POLL_PAUSE)
    process.kill()
    pytest.fail("no record appeared")


def kill(server: harness.ServerProcess) -> None:
    """As a crash: SIGKILL, no goodbye on open connections."""
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(timeout=60)


@pytest.fixture(scope="module")
def server_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="module")
def two_servers(smollm2_path, server_logs):
    servers = start_pair(smollm2_path, server_logs)
    yield servers
    for server in servers:
        server.stop()


# --- real llama-servers ------------------------------------------------------------------------------
def test_batch_spreads_over_two_servers_in_order_as_one_server_would(cli, two_servers, tmp_path):
    first, second = two_servers
    items = tmp_path / "items.jsonl"
    ids = write_items(items)
    for server in two_servers:  # each slot holds the template's opening, as after any earlier item
        warm = cli("ask", "--server", server.url, "-n", "1", "--no-history", "Hi.")
        assert warm.returncode == 0, warm.stderr
    before = [prompt_tokens_total(s) for s in two_servers]
    out = tmp_path / "two.jsonl"
    result = cli("batch", str(items), "-o", str(out), "--server", first.url, "--server", second.url, "-n", "16",
                 "-v", *GREEDY)  # fmt: skip
    assert result.returncode == 0, result.stderr
    spread = read_records(out)
    assert [r["id"] for r in spread] == ids
    assert all(r["error"] is None and r["reply"] for r in spread)
    # Both servers decoded items: each one's own count of prompt tokens grew.
    after = [prompt_tokens_total(s) for s in two_servers]
    assert after[0] > before[0] and after[1] > before[1], (before, after)
    assert "streams to" in result.stderr and "0 moved to another server" in result.stderr

    alone = tmp_path / "one.jsonl"
    result = cli("batch", str(items), "-o", str(alone), "--server", first.url, "-n", "16", *GREEDY)
    assert result.returncode == 0, result.stderr
    assert [content(r) for r in spread] == [content(r) for r in read_records(alone)]


def test_ask_uses_the_first_server_that_answers(cli, two_servers):
    dead = f"http://127.0.0.1:{harness.free_port()}"  # nothing listens there
    live = two_servers[1]
    result = cli("ask", "--server", dead, "--server", live.url, "--json", "--temp", "0", "-n", "8", "--no-history",
                 "Say hi.")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["reply"]
    notices = [line for line in result.stderr.splitlines() if "no answer from" in line]
    assert len(notices) == 1 and dead in notices[0] and f"using {live.url}" in notices[0], result.stderr


def test_a_server_killed_mid_batch_hands_its_items_to_the_other(smollm2_path, server_logs, tmp_path):
    servers = start_pair(smollm2_path, server_logs)
    try:
        items = tmp_path / "items.jsonl"
        ids = write_items(items)
        out = tmp_path / "out.jsonl"
        process = start_batch(str(items), "-o", str(out), "--server", servers[0].url, "--server", servers[1].url,
                              "-n", "40", "-v", *GREEDY)  # fmt: skip
        wait_for_records(out, process)
        # The first server: it also tokenized the prompts and detokenizes the replies, which the other
        # one takes over.
        kill(servers[0])
        _, err = process.communicate(timeout=600)
        stderr = err.decode()
        assert process.returncode == 0, stderr
        records = read_records(out)
        assert [r["id"] for r in records] == ids  # every id once, in input order
        assert all(r["error"] is None and r["reply"] for r in records), stderr
        assert f"server: {servers[0].url} stopped answering" in stderr
        summary = next(line for line in stderr.splitlines() if "moved to another server" in line)
        assert f"{servers[0].url} " in summary and "gone:" in summary
        assert "Traceback" not in stderr
    finally:
        for server in servers:
            server.stop()


def test_all_servers_killed_exit_6_and_resume_finishes_exactly(cli, smollm2_path, server_logs, two_servers, tmp_path):
    servers = start_pair(smollm2_path, server_logs)
    try:
        items = tmp_path / "items.jsonl"
        ids = write_items(items)
        out = tmp_path / "out.jsonl"
        process = start_batch(str(items), "-o", str(out), "--server", servers[0].url, "--server", servers[1].url,
                              "-n", "40", *GREEDY)  # fmt: skip
        wait_for_records(out, process)
        kill(servers[0])
        kill(servers[1])
        _, err = process.communicate(timeout=600)
        stderr = err.decode()
        assert process.returncode == 6, stderr
        # One error line, last; before it at most the notice of the first server to go.
        lines = [line for line in stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("llmchat: error: ")]
        assert errors == lines[-1:] and len(lines) <= 2 and "Traceback" not in stderr, stderr
        # Usually the streams find both gone; an item finishing at the moment of the kills may meet
        # the dead servers first (its record then is not written either).
        assert "all 2 servers stopped answering" in errors[0] or "cannot connect" in errors[0], stderr
        assert f"--resume -o {out}" in errors[0]
        saved = read_records(out)  # complete lines only
        assert 1 <= len(saved) < len(ids)
        assert [r["id"] for r in saved] == ids[: len(saved)]
        assert all(r["error"] is None for r in saved)
    finally:
        for server in servers:
            server.stop()
    live = two_servers[0]
    result = cli("batch", str(items), "-o", str(out), "--resume", "--server", live.url, "-n", "40", *GREEDY)
    assert result.returncode == 0, result.stderr
    records = read_records(out)
    assert [r["id"] for r in records] == ids  # each id exactly once, still in input order
    assert all(r["error"] is None and r["reply"] for r in records)


# --- scripted stand-ins (no model) ----------------------------------------------------------------------
def echo_server(server: StandIn, *, model: str = "tiny") -> None:
    server.routes[("GET", "/v1/models")] = openai_models(model)
    server.routes[("GET", "/health")] = lambda r: (200, {"status": "ok"})

    def chat(request: dict[str, Any]) -> Any:
        text = request["body"]["messages"][-1]["content"]
        return [delta(f"echo {text}"), delta(finish="stop"), "[DONE]"]

    server.routes[("POST", "/v1/chat/completions")] = chat


def test_a_stand_in_that_dies_on_its_first_stream_loses_no_item(cli, tmp_path):
    live, dying = StandIn(), StandIn()
    try:
        echo_server(live)
        echo_server(dying)
        died = threading.Event()

        def die(request: dict[str, Any]) -> Any:
            # Drop this stream, then stop listening: the next request and the health check find nobody.
            threading.Thread(target=dying.close, daemon=True).start()
            died.set()
            return [delta("half a rep"), None]

        dying.routes[("POST", "/v1/chat/completions")] = die
        items = tmp_path / "items.txt"
        items.write_text("".join(f"line {i}\n" for i in range(1, 7)))
        out = tmp_path / "out.jsonl"
        result = cli("batch", str(items), "-o", str(out), "--server", dying.url, "--server", live.url, "-v",
                     "--progress", "off")  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert died.is_set()
        records = read_records(out)
        assert [r["id"] for r in records] == [1, 2, 3, 4, 5, 6]
        assert [r["reply"] for r in records] == [f"echo line {i}" for i in range(1, 7)]
        assert f"server: {dying.url} stopped answering" in result.stderr
    finally:
        live.close()


def test_no_server_answering_is_one_line_with_exit_6(cli, tmp_path):
    urls = [f"http://127.0.0.1:{harness.free_port()}" for _ in range(2)]
    items = tmp_path / "items.txt"
    items.write_text("hello\n")
    result = cli("batch", str(items), "-o", str(tmp_path / "out.jsonl"), "--server", urls[0], "--server", urls[1])
    assert result.returncode == 6
    line = one_error_line(result.stderr)
    assert "none of the 2 servers answered" in line and urls[0] in line and urls[1] in line
    result = cli("ask", "--server", urls[0], "--server", urls[1], "hi")
    assert result.returncode == 6 and "none of the 2 servers answered" in one_error_line(result.stderr)


def test_servers_of_different_models_or_given_twice_are_usage_errors(cli, tmp_path):
    stand_in, other = StandIn(), StandIn()
    try:
        echo_server(stand_in, model="tiny")
        echo_server(other, model="large")
        items = tmp_path / "items.txt"
        items.write_text("hello\n")
        result = cli("batch", str(items), "--server", stand_in.url, "--server", other.url)
        assert result.returncode == 2 and "serves 'large'" in one_error_line(result.stderr)
        result = cli("batch", str(items), "--server", stand_in.url, "--server", stand_in.url + "/v1")
        assert result.returncode == 2 and "given twice" in one_error_line(result.stderr)
    finally:
        stand_in.close()
        other.close()


def test_a_configured_group_spreads_a_batch(cli, isolated_home, tmp_path):
    servers = [StandIn(), StandIn()]
    try:
        for server in servers:
            echo_server(server)
        write_config(isolated_home, f'[servers.farm]\nurls = ["{servers[0].url}", "{servers[1].url}"]\n')
        items = tmp_path / "items.txt"
        items.write_text("".join(f"line {i}\n" for i in range(1, 9)))
        out = tmp_path / "out.jsonl"
        result = cli("batch", str(items), "-o", str(out), "--server", "farm", "--progress", "off")
        assert result.returncode == 0, result.stderr
        assert [r["id"] for r in read_records(out)] == list(range(1, 9))
        assert all(server.chat_requests() for server in servers)  # both took items
        write_config(isolated_home, "[servers.farm]\nurls = []\n")
        result = cli("batch", str(items), "--server", "farm")
        assert result.returncode == 2 and "urls" in one_error_line(result.stderr)
    finally:
        for server in servers:
            server.close()


def test_one_server_gone_mid_batch_stops_with_exit_6_and_the_records_so_far(cli, tmp_path):
    server = StandIn()
    closed = False
    try:
        echo_server(server)
        served = {"n": 0}

        def chat(request: dict[str, Any]) -> Any:
            served["n"] += 1
            if served["n"] <= 2:
                return [delta(f"echo {request['body']['messages'][-1]['content']}"), delta(finish="stop"), "[DONE]"]
            threading.Thread(target=server.close, daemon=True).start()  # gone for good
            return [delta("half a rep"), None]

        server.routes[("POST", "/v1/chat/completions")] = chat
        items = tmp_path / "items.txt"
        items.write_text("".join(f"line {i}\n" for i in range(1, 6)))
        out = tmp_path / "out.jsonl"
        result = cli("batch", str(items), "-o", str(out), "--server", server.url, "--progress", "off")
        closed = True
        assert result.returncode == 6, result.stderr
        line = one_error_line(result.stderr)  # no retries against a server that is gone, no error records
        assert "the server stopped answering with 3 items left" in line and f"--resume -o {out}" in line
        assert [r["reply"] for r in read_records(out)] == ["echo line 1", "echo line 2"]
    finally:
        if not closed:
            server.close()


def test_chat_uses_the_first_server_that_answers(cli):
    server = StandIn()
    try:
        echo_server(server)
        dead = f"http://127.0.0.1:{harness.free_port()}"
        result = cli("chat", "--server", dead, "--server", server.url, "--json", "--no-history", input="hello\n")
        assert result.returncode == 0, result.stderr
        assert [json.loads(line)["reply"] for line in result.stdout.splitlines()] == ["echo hello"]
        notices = [line for line in result.stderr.splitlines() if "no answer from" in line]
        assert len(notices) == 1 and dead in notices[0] and f"using {server.url}" in notices[0], result.stderr
        assert len(server.chat_requests()) == 1
    finally:
        server.close()


def test_parallel_sets_the_streams_per_server(cli, tmp_path):
    servers = [StandIn(), StandIn()]
    peak = [0, 0]
    lock = threading.Lock()
    try:
        for number, server in enumerate(servers):
            echo_server(server)
            busy = [0]

            def chat(request: dict[str, Any], number: int = number, busy: list[int] = busy) -> Any:
                with lock:
                    busy[0] += 1
                    peak[number] = max(peak[number], busy[0])
                time.sleep(0.2)  # long enough for the other streams to arrive meanwhile
                with lock:
                    busy[0] -= 1
                return [delta(f"echo {request['body']['messages'][-1]['content']}"), delta(finish="stop"), "[DONE]"]

            server.routes[("POST", "/v1/chat/completions")] = chat
        items = tmp_path / "items.txt"
        items.write_text("".join(f"line {i}\n" for i in range(1, 9)))
        out = tmp_path / "out.jsonl"
        result = cli("batch", str(items), "-o", str(out), "--server", servers[0].url, "--server", servers[1].url,
                     "--parallel", "2", "--progress", "off")  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert [r["reply"] for r in read_records(out)] == [f"echo line {i}" for i in range(1, 9)]
        assert 1 <= peak[0] <= 2 and 1 <= peak[1] <= 2, peak
        assert sum(len(server.chat_requests()) for server in servers) == 8  # each item asked once
    finally:
        for server in servers:
            server.close()
