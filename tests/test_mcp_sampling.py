"""A server's `sampling/createMessage`, answered by the run's own model (SmolLM2), against the real
`@modelcontextprotocol/server-everything` (`trigger-sampling-request`, through `ask` as a user runs
it) and a small MCPServer of the tests' own (tests/sampling_server.py):
- the completion is the session's turn path's reply (compared with a scoped turn of the same engine,
  and with a fresh `ask` of the same prompt, system prompt, temperature and seed);
- the conversation's next round is the same as in a run where nothing decoded between its rounds
  (the KV cache kept, its prefix reused);
- a request llmchat will not answer (too many tokens, image content, the assistant's message last)
  fails the call in one line; without a terminal and without `approve = "always"` it is declined
  at once with one notice; on a terminal the person approves or declines it.
Every wait is bounded: the calls' timeouts, pexpect's timeout.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import pexpect
import pytest

from llmchat.tools.mcp import run_mode, sampling
from llmchat.tools.mcp.config import parse_mcp_spec
from llmchat.tools.mcp.connection import McpConnection
from llmchat.tools.spec import ToolFailure

pytestmark = pytest.mark.slow  # each check starts an MCP server and loads a model

CALL_TIMEOUT_S = 60
SERVER = Path(__file__).with_name("sampling_server.py")
SPEC = f"{sys.executable} {SERVER}"
SYSTEM = "You are a helpful test server."  # both servers' system prompt
FORCED = ("--temperature", "0", "--seed", "1", "--no-history", "--max-tokens", "100", "--chain-limit", "1")


@pytest.fixture
def declared():
    """This process's run declares sampling (as `ask` and `chat` do); undone after the test."""
    run_mode.model_answers()
    yield
    run_mode.model_answers(False)
    sampling.answer_with(None)


def loaded(smollm2_path, max_tokens: int = 16):
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session

    options = RunOptions(model=str(smollm2_path), ctx=2048, temperature=0.0, seed=1, max_tokens=max_tokens)
    return start_session(options, config=load_config(), overflow="drop", with_history=False)


def connected(approve: str, stderr: io.StringIO) -> McpConnection:
    return McpConnection(replace(parse_mcp_spec(SPEC), approve=approve), stderr=stderr)


# --- the session's model answers --------------------------------------------------------------


def test_the_completion_is_the_session_turn_paths_reply(declared, smollm2_path):
    from llmchat.turn.conversation import Conversation
    from llmchat.turn.plan import TurnScope

    session = loaded(smollm2_path)
    stderr = io.StringIO()
    try:
        with connected("always", stderr) as server:
            answer = json.loads(server.call("complete", {"prompt": "Name a colour."}, CALL_TIMEOUT_S))
        # The same request as a scoped turn of the same engine: its system prompt, temperature and cap.
        scope = TurnScope(conversation=Conversation(system=SYSTEM), sampling=replace(session.sampling, max_tokens=8))
        fresh = session.turn("Name a colour.", record=False, scope=scope)
        assert answer["content"] == {"type": "text", "text": fresh.reply}
        assert answer["role"] == "assistant" and answer["model"] == session.model_label
        assert answer["stopReason"] == {"length": "maxTokens", "stop": "endTurn"}[fresh.finish_reason]
        assert session.conversation.messages == []  # the server's exchange is no part of the chat
        [said] = stderr.getvalue().splitlines()  # the stats of its turn, in one line
        assert re.fullmatch(
            rf"llmchat: MCP server python: the model answered it: {fresh.stats.generated_tokens} tokens in "
            rf"\d+\.\d s \({fresh.finish_reason}\)",
            said,
        ), said
    finally:
        session.close()


@pytest.mark.parametrize(
    ("tool", "why"),
    [
        ("too_long", "it asks for up to 5,000 tokens, above the cap of 16 (--max-tokens)"),
        ("image_message", "message 1 holds image content; llmchat's model reads text only"),
        ("assistant_last", "the last message must be the user's"),
    ],
)
def test_a_request_llmchat_will_not_answer_fails_the_call_in_one_line(declared, smollm2_path, tool, why):
    session = loaded(smollm2_path)
    stderr = io.StringIO()
    try:
        with connected("always", stderr) as server:
            arguments = {"prompt": "Write a long story."} if tool == "too_long" else {}
            with pytest.raises(ToolFailure) as failed:
                server.call(tool, arguments, CALL_TIMEOUT_S)
    finally:
        session.close()
    assert str(failed.value) == f"MCP server python failed: llmchat cannot answer this: {why}"
    assert stderr.getvalue() == ""  # the call's one line says it


def test_without_a_terminal_or_approval_it_is_declined_at_once_with_one_notice(declared, smollm2_path):
    session = loaded(smollm2_path)
    stderr = io.StringIO()
    try:
        with connected("ask", stderr) as server:
            with pytest.raises(ToolFailure) as failed:
                server.call("complete", {"prompt": "Name a colour."}, CALL_TIMEOUT_S)
    finally:
        session.close()
    assert str(failed.value) == "MCP server python failed: the user declined the sampling request"
    assert stderr.getvalue().splitlines() == [
        "llmchat: MCP server python asks the model for a completion (Name a colour.): declined, no terminal to "
        'ask on (an [mcp.python] table in the config for it, with approve = "always", allows it)'
    ]


# --- when it runs ----------------------------------------------------------------------------


def test_a_request_runs_on_the_thread_that_waits_and_one_nobody_waits_for_is_given_up():
    """The completion runs on the thread that waits for the server's request (the one that owns the
    engine, between two decodes); a request that comes while nothing waits is declined, not held."""
    import threading

    from anyio.from_thread import start_blocking_portal

    from llmchat.tools.mcp.desk import NobodyWaits, PersonDesk

    desk = PersonDesk()
    with start_blocking_portal() as portal:

        async def asked_in_a_request() -> threading.Thread:
            with desk.deadline(CALL_TIMEOUT_S):  # a request of llmchat's under way, its server asking
                return await desk.ask(threading.current_thread)

        request = portal.start_task_soon(asked_in_a_request)
        assert desk.wait(request) is threading.main_thread()  # asked by the thread that waits

        async def unasked() -> str:
            return await desk.ask(lambda: "never asked")

        with pytest.raises(NobodyWaits):  # nothing waits: declined at once, never run, never held
            portal.call(unasked)


# --- the conversation's KV cache --------------------------------------------------------------


class Recorded:
    """A sampling model that gives a recorded completion without decoding anything."""

    def __init__(self, sampled: sampling.Sampled, cap: int):
        self.sampled, self.cap = sampled, cap

    def __call__(self, request: sampling.SampleRequest) -> sampling.Sampled:
        return self.sampled


def forced_sampling_turn(smollm2_path, answer_with_recorded: sampling.Sampled | None = None):
    """One `ask`-like turn in a fresh session whose forced call makes the server ask for a
    completion: answered by the model, or by `answer_with_recorded` (nothing decoded meanwhile)."""
    from llmchat.config import load_config
    from llmchat.tools import options as tool_options

    request = tool_options.tool_request(("mcp:sampler",), (), (), "sampler_complete", 1, True)
    config = load_config()
    toolset = tool_options.gather(request, config)
    assert toolset is not None
    session = loaded(smollm2_path, 100)  # room for the generic format's call
    try:
        if answer_with_recorded is not None:
            sampling.answer_with(Recorded(answer_with_recorded, 100))
        tool_options.offer(session, toolset, request)
        return session.model_label, session.turn("Ask the server to name a colour.", record=False)
    finally:
        session.close()
        toolset.close()


def test_the_next_round_after_a_sampled_completion_is_as_if_nothing_ran(declared, smollm2_path, isolated_home):
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text(
        f'[mcp.sampler]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(str(SERVER))}]\napprove = "always"\n'
    )
    label, sampled_run = forced_sampling_turn(smollm2_path)
    [call] = sampled_run.tool_calls
    answer = json.loads(call.result)
    assert answer["model"] == label  # the model answered, on the engine, between the two rounds
    reason = {"maxTokens": "length", "endTurn": "stop"}[answer["stopReason"]]
    recorded = sampling.Sampled(answer["content"]["text"], label, reason)
    _, quiet_run = forced_sampling_turn(smollm2_path, recorded)
    assert [c.result for c in quiet_run.tool_calls] == [call.result]  # the same tool result...
    assert quiet_run.reply == sampled_run.reply  # ...so the same answer after it
    first, second = sampled_run.stats.rounds
    assert second["cached_tokens"] >= first["prompt_tokens"]  # the conversation's prefix was reused whole
    tokens = ("prompt_tokens", "cached_tokens", "generated_tokens")
    assert [[r[k] for k in tokens] for r in quiet_run.stats.rounds] == [[r[k] for k in tokens] for r in (first, second)]


def test_a_sampled_completion_holds_one_copy_of_the_conversations_state_at_most(smollm2_path):
    """The conversation's KV state is kept in memory while the sampled completion runs in its cells
    (llmchat.turn.sampled): once, not twice (a ctypes buffer and the bytes made from it, then a
    bytearray made from those), which for an 8B model at 32K tokens was 4 GiB more. Measured as
    the Python memory the request allocates at its peak (tracemalloc: llama.cpp's own memory is
    not counted), against the state's size; and the conversation's tokens are all back after it."""
    import tracemalloc

    from llmchat.tools.mcp.sampling import SampleRequest
    from llmchat.turn.sampled import SessionSampler

    session = loaded(smollm2_path, max_tokens=4)
    try:
        session.turn("Repeat after me: " + "red green blue " * 300, record=True)
        engine = session.engine
        before = engine.evaluated_tokens()
        state_bytes = len(engine.sequence_state())
        assert state_bytes > 20 * 2**20  # large enough to stand out of the turn's own allocations
        request = SampleRequest(messages=(("user", "Name a colour."),), system=SYSTEM, max_tokens=4, temperature=0.0)
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            answered = SessionSampler(session)(request)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert answered.text.strip()
        assert peak < 1.5 * state_bytes, f"{peak / 2**20:.1f} MiB at the peak for a {state_bytes / 2**20:.1f} MiB state"
        assert engine.evaluated_tokens() == before
    finally:
        session.close()


# --- as a user runs it ------------------------------------------------------------------------


def test_ask_forced_to_call_trigger_sampling_request_answers_with_the_local_model(cli, smollm2_path, npm_mcp_bin):
    """server-everything's own tool, in `ask`: the server sends createMessage, the local model
    answers, and the tool's result holds the completion, the reply a fresh `ask` gives."""
    home = Path(os.environ["LLMCHAT_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    everything = npm_mcp_bin / "mcp-server-everything"
    (home / "config.toml").write_text(
        f'[mcp.everything]\ncommand = "{everything}"\napprove = "always"\ntools = ["trigger-sampling-request"]\n'
    )
    tool = "everything_trigger-sampling-request"
    run = cli("ask", "-m", str(smollm2_path), *FORCED, "-T", "mcp:everything", "--tool-choice", tool, "--json", "Bees?")
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    [call] = json.loads(run.stdout)["tool_calls"]
    assert call["name"] == tool and call["approved"] is True
    max_tokens = call["arguments"].get("maxTokens", 100)  # the model writes it: the cap decides
    if max_tokens > 100 or max_tokens < 1:
        assert "llmchat cannot answer this: " in call["error"], call
        return
    result = call["result"]
    assert result.startswith("LLM sampling result: \n"), result
    answer = json.loads(result.removeprefix("LLM sampling result: \n"))
    assert answer["role"] == "assistant" and answer["model"] == "SmolLM2-135M-Instruct.Q4_1"
    prompt = f"Resource trigger-sampling-request context: {call['arguments']['prompt']}"
    fresh = cli(
        "ask",
        "-m",
        str(smollm2_path),
        "--system",
        SYSTEM,
        "--temperature",
        "0.7",  # the server's
        "--seed",
        "1",
        "--max-tokens",
        str(max_tokens),
        "--no-history",
        "--json",
        prompt,
    )
    assert fresh.returncode == 0, fresh.stderr
    assert answer["content"] == {"type": "text", "text": json.loads(fresh.stdout)["reply"]}


def _ask_on_a_terminal(model, record_path) -> pexpect.spawn:
    """`ask` forced to call the sampling tool, on a terminal, its JSON record into `record_path`.
    `exec`: the terminal's Ctrl-C goes to its foreground group, llmchat alone and not a shell too."""
    command = " ".join(
        [
            "exec",
            sys.executable,
            "-m llmchat ask -m",
            str(model),
            *FORCED,
            "--mcp",
            f"'{SPEC}'",
            "--tool-choice python_complete --approve-tools --json",
            "'Ask the server to name a colour.'",
            f"> {record_path}",
        ]
    )
    return pexpect.spawn(
        "/bin/sh", ["-c", command], env=dict(os.environ), encoding="utf-8", timeout=300, dimensions=(50, 400)
    )


@pytest.mark.parametrize("typed", ["y", "n"])
def test_on_a_terminal_the_person_approves_or_declines_the_request(smollm2_path, tmp_path, typed):
    record_path = tmp_path / "record.json"
    child = _ask_on_a_terminal(smollm2_path, record_path)
    child.expect_exact("llmchat: MCP server python asks the model for a completion (at most 8 tokens, temperature 0):")
    child.expect_exact(f"  system: {SYSTEM}")
    child.expect_exact("  user: ")
    child.expect_exact(sampling.QUESTION)
    child.sendline(typed)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    [call] = json.loads(record_path.read_text())["tool_calls"]
    if typed == "y":
        assert json.loads(call["result"])["model"] == "SmolLM2-135M-Instruct.Q4_1"
    else:
        assert call["error"] == "MCP server python failed: the user declined the sampling request"


def test_ctrl_c_at_the_approval_question_declines_and_the_turn_goes_on(smollm2_path, tmp_path):
    """As at every question llmchat asks (tool approval, elicitation), Ctrl-C there is a "no": the
    request is declined, the call fails with that, and the turn ends as usual."""
    record_path = tmp_path / "record.json"
    child = _ask_on_a_terminal(smollm2_path, record_path)
    child.expect_exact(sampling.QUESTION)
    child.sendintr()
    child.expect_exact("declined")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and "Traceback" not in child.before, child.before
    [call] = json.loads(record_path.read_text())["tool_calls"]
    assert call["error"] == "MCP server python failed: the user declined the sampling request"
