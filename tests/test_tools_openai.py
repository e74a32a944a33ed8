"""Tools with an OpenAI-compatible server: the tools go in the request's own `tools` and
`tool_choice`, the server renders them with its template, and the calls come back in the stream's
`delta.tool_calls`; they are checked, approved and run as a local model's are.

Two kinds of test:
- a scripted stand-in server (tests/test_remote.py) for the exact wire shape: what the requests
  carry (the tools, each round's tool_choice, the calls and results as OpenAI messages) and call
  fragments split mid-argument;
- the real llama-server (tests/servers/harness.py) serving SmolLM2, spoken to as `kind = "openai"`
  so the OpenAI path is used. Its /v1/chat/completions handles `tools` with its Jinja templates:
  under Llama 3.1's upstream template it has a tool format (llama.cpp's autoparser finds it);
  under SmolLM2's own template it has none and ignores the tools, answering in text.

llama-server's `required` allows text before the call (its grammar is "any text, then a call"), so
the forced runs ask for the call in the prompt and turn the repeat penalty off: greedy SmolLM2
then reaches the call (78 tokens) instead of rambling to the token limit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from servers import harness
from test_remote import StandIn, delta, openai_models, write_config
from test_tools_loop import calls_made, functions_file

TEMPLATES = Path(__file__).resolve().parent / "data" / "templates"
LLAMA_31 = TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja"
RECORD_CITY = {
    "type": "function",
    "function": {
        "name": "record_city",
        "description": "Record a city and give its weather.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city."}},
            "required": ["city"],
        },
    },
}
GREEDY = ("--temperature", "0", "--seed", "1", "--repeat-penalty", "1", "--no-history", "--json")
CALL_PROMPT = "Call record_city with the city Paris."


@pytest.fixture
def stand_in():
    server = StandIn()
    yield server
    server.close()


def call_delta(fragment: dict[str, Any]) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"tool_calls": [fragment]}, "finish_reason": None}]}


def call_fragments(arguments: list[str], *, name: str = "record_city") -> list[dict[str, Any]]:
    """A call streamed the way llama-server and vLLM stream one: the id and name first, then the
    arguments in pieces, then finish_reason tool_calls and a usage chunk."""
    first = {"index": 0, "id": "srv-1", "type": "function", "function": {"name": name, "arguments": arguments[0]}}
    chunks: list[dict[str, Any]] = [delta(role="assistant"), call_delta(first)]
    chunks += [call_delta({"index": 0, "function": {"arguments": piece}}) for piece in arguments[1:]]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    chunks.append({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 9}})
    return chunks


def scripted(
    stand_in: StandIn, first_round: list[dict[str, Any]], answer: str = "It is sunny.", owned_by: str | None = None
) -> None:
    """The first chat request gets `first_round`, every later one the plain `answer`. `owned_by`:
    what /v1/models says of the model (llama-server says "llamacpp")."""
    card: dict[str, Any] = {"id": "tiny", "object": "model", "max_model_len": 2048}
    if owned_by is not None:
        card["owned_by"] = owned_by
    stand_in.routes[("GET", "/v1/models")] = lambda request: (200, {"object": "list", "data": [card]})

    def chat(request: dict[str, Any]) -> Any:
        if len(stand_in.chat_requests()) == 1:
            return [*first_round, "[DONE]"]
        return [delta(answer), delta(finish="stop"), "[DONE]"]

    stand_in.routes[("POST", "/v1/chat/completions")] = chat


def other_tool_file(folder: Path) -> Path:
    path = folder / "other_tools.py"
    path.write_text(
        'def spell_word(word: str) -> str:\n    """Spell a word.\n\n    Args:\n        word: The word.\n    """\n'
        '    return "-".join(word)\n'
    )
    return path


def test_call_fragments_assemble_the_way_each_server_streams_them():
    from llmchat.engine.remote.openai_compat import _add_call_fragments, _calls_of

    calls: dict[int, dict[str, str]] = {}
    # llama-server and vLLM: id and name once, the arguments in pieces.
    _add_call_fragments(calls, [{"index": 0, "id": "a", "function": {"name": "record_city", "arguments": '{"ci'}}])
    _add_call_fragments(calls, [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}])
    # llama_cpp.server: the name again in every fragment.
    _add_call_fragments(calls, [{"index": 1, "id": "b", "function": {"name": "spell_word", "arguments": '{"word"'}}])
    _add_call_fragments(calls, [{"index": 1, "function": {"name": "spell_word", "arguments": ': "cat"}'}}])
    # A server that sends the arguments whole, as an object.
    _add_call_fragments(calls, [{"index": 2, "function": {"name": "record_city", "arguments": {"city": "Rome"}}}])
    assert not _add_call_fragments(calls, None) and not _add_call_fragments(calls, [])
    assembled = _calls_of(calls)
    assert [(c.id, c.name, json.loads(c.arguments)) for c in assembled] == [
        ("a", "record_city", {"city": "Oslo"}),
        ("b", "spell_word", {"word": "cat"}),
        ("", "record_city", {"city": "Rome"}),
    ]


# --- the wire shape, against a scripted stand-in ---------------------------------------------------
# A call forced to one tool: OpenAI's object form (vLLM and llama_cpp.server enforce it); llama-server
# reads tool_choice as a string only, so there it is "required" with that tool alone.
FORCED_FORMS = {
    "openai": ({"type": "function", "function": {"name": "record_city"}}, ["record_city", "spell_word"]),
    "llamacpp": ("required", ["record_city"]),
}


@pytest.mark.parametrize("owned_by", ["openai", "llamacpp"])
def test_tools_go_native_and_a_streamed_call_runs_and_goes_back_as_openai_messages(cli, stand_in, tmp_path, owned_by):
    scripted(stand_in, call_fragments(['{"ci', 'ty": "Pa', 'ris"}']), owned_by=owned_by)
    tools = functions_file(tmp_path)
    run = cli(
        "ask",
        "--server",
        stand_in.url,
        "--functions",
        str(tools),
        "--functions",
        str(other_tool_file(tmp_path)),
        "--tool-choice",
        "record_city",
        "--approve-tools",
        *GREEDY,
        "What is the weather in Paris?",
    )
    assert run.returncode == 0, run.stderr
    assert calls_made(tmp_path) == ["Paris"]  # assembled from three pieces, run exactly once
    first, second = (r["body"] for r in stand_in.chat_requests())
    # The tools in the request's own parameter, and the forced call in the form this server enforces.
    choice, offered = FORCED_FORMS[owned_by]
    assert first["tool_choice"] == choice
    assert [tool["function"]["name"] for tool in first["tools"]] == offered
    assert first["tools"][0] == RECORD_CITY
    assert first["messages"] == [{"role": "user", "content": "What is the weather in Paris?"}]
    # The next round: every tool, "auto", and the call and its result as OpenAI messages.
    assert len(second["tools"]) == 2 and second["tool_choice"] == "auto"
    user, called, result = second["messages"]
    assert user == first["messages"][0]
    [call] = called["tool_calls"]
    assert called["role"] == "assistant" and called["content"] == ""
    assert call["type"] == "function" and call["function"]["name"] == "record_city"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}  # JSON text, as OpenAI sends it
    assert result == {"role": "tool", "tool_call_id": call["id"], "content": "It is sunny in Paris, 21 degrees."}
    record = json.loads(run.stdout)
    assert record["reply"] == "It is sunny." and record["template"] == "server"
    [made] = record["tool_calls"]
    assert made == {
        "name": "record_city",
        "arguments": {"city": "Paris"},
        "result": "It is sunny in Paris, 21 degrees.",
        "approved": True,
        "duration_s": made["duration_s"],
    }
    assert [r["generated_tokens"] for r in record["stats"]["rounds"]] == [9, 1]
    assert 'tool call: record_city({"city": "Paris"})' in run.stderr
    assert "It is sunny" not in run.stderr  # the answer goes to stdout only


def test_the_chain_limit_round_asks_for_no_call_and_runs_none(cli, stand_in, tmp_path):
    # A server that calls again in the round after the limit: that call never runs.
    stand_in.routes[("GET", "/v1/models")] = openai_models(max_len=2048)
    stand_in.routes[("POST", "/v1/chat/completions")] = lambda r: [
        *call_fragments(['{"city": "Paris"}']),
        "[DONE]",
    ]
    tools = functions_file(tmp_path)
    run = cli(
        "ask",
        "--server",
        stand_in.url,
        "--functions",
        str(tools),
        "--tool-choice",
        "required",
        "--chain-limit",
        "1",
        "--approve-tools",
        *GREEDY,
        "Weather?",
    )
    assert run.returncode == 0, run.stderr
    assert calls_made(tmp_path) == ["Paris"]
    choices = [r["body"]["tool_choice"] for r in stand_in.chat_requests()]
    assert choices == ["required", "none"]  # the tools stay listed: the prompt stays the same
    assert run.stderr.count("--chain-limit 1") == 1
    assert len(json.loads(run.stdout)["tool_calls"]) == 1


def test_arguments_against_the_schema_never_reach_the_function_and_the_model_hears_why(cli, stand_in, tmp_path):
    scripted(stand_in, call_fragments(['{"town": "Paris"}']), answer="Sorry.")
    tools = functions_file(tmp_path)
    run = cli(
        "ask",
        "--server",
        stand_in.url,
        "--functions",
        str(tools),
        "--tool-choice",
        "required",
        "--approve-tools",
        *GREEDY,
        "Weather?",
    )
    assert run.returncode == 0, run.stderr
    assert calls_made(tmp_path) == []
    [call] = json.loads(run.stdout)["tool_calls"]
    assert call["approved"] is False and "'city' is a required property" in call["error"]
    tool_message = stand_in.chat_requests()[1]["body"]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["content"].startswith("Error: invalid arguments")


def test_a_forced_round_cut_by_the_token_limit_says_so_once(cli, stand_in, tmp_path):
    # A server that lets text come before a required call (llama-server does): the limit came first.
    scripted(stand_in, [delta("Paris is lovely"), delta(finish="length")])
    tools = functions_file(tmp_path)
    run = cli(
        "ask", "--server", stand_in.url, "--functions", str(tools), "--tool-choice", "required", *GREEDY, "Weather?"
    )
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    assert record["reply"] == "Paris is lovely" and record["tool_calls"] == [] and record["finish_reason"] == "length"
    assert run.stderr.count("token limit before the required tool call") == 1
    assert "may not support tools" not in run.stderr and calls_made(tmp_path) == []


# --- the real llama-server, spoken to as an OpenAI-compatible server ------------------------------
@pytest.fixture(scope="module")
def server_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="module")
def tool_template_server(smollm2_path, server_logs):
    """llama-server with a chat template that has a tool format (Llama 3.1's, upstream)."""
    server = harness.start_llama_server(
        smollm2_path, server_logs, slots=1, ctx=2048, threads=2, extra=["--chat-template-file", str(LLAMA_31)]
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def own_template_server(smollm2_path, server_logs):
    """llama-server with SmolLM2's own template, which has no tool format: the tools are ignored."""
    server = harness.start_llama_server(smollm2_path, server_logs, slots=1, ctx=2048, threads=2)
    yield server
    server.stop()


def as_openai(home: Path, server: harness.ServerProcess) -> str:
    """A configured server of kind "openai": llama-server through the OpenAI-compatible path."""
    write_config(home, f'[servers.box]\nurl = "{server.url}"\nkind = "openai"\n')
    return "box"


@pytest.mark.server
def test_llama_server_forced_call_runs_once_and_a_final_answer_follows(
    cli, isolated_home, tool_template_server, tmp_path
):
    name = as_openai(isolated_home, tool_template_server)
    tools = functions_file(tmp_path)
    run = cli(
        "ask",
        "--server",
        name,
        "--functions",
        str(tools),
        "--tool-choice",
        "record_city",
        "--approve-tools",
        "--chain-limit",
        "1",
        "--max-tokens",
        "120",
        *GREEDY,
        CALL_PROMPT,
    )
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    made = calls_made(tmp_path)
    assert len(made) == 1 and made[0], record  # the server's call, run exactly once
    [call] = record["tool_calls"]
    assert call["name"] == "record_city" and call["arguments"] == {"city": made[0]}
    assert call["approved"] is True and call["result"] == f"It is sunny in {made[0]}, 21 degrees."
    assert f"tool call: record_city({json.dumps({'city': made[0]})})" in run.stderr
    assert "may not support tools" not in run.stderr
    # A final answer followed, in a second round whose prompt holds the call and its result.
    first, second = record["stats"]["rounds"]
    assert first["finish_reason"] == "stop" and first["generated_tokens"] > 0
    assert second["prompt_tokens"] > first["prompt_tokens"] and second["generated_tokens"] > 0
    assert record["finish_reason"] in ("stop", "length") and record["reply"].strip()
    assert record["template"] == "server"


@pytest.mark.server
def test_llama_server_auto_without_a_call_still_answers(cli, isolated_home, tool_template_server, tmp_path):
    name = as_openai(isolated_home, tool_template_server)
    tools = functions_file(tmp_path)
    run = cli(
        "ask",
        "--server",
        name,
        "--functions",
        str(tools),
        "--approve-tools",
        "--max-tokens",
        "32",
        *GREEDY,
        "What is the weather in Paris?",
    )
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    assert calls_made(tmp_path) == [] and record["tool_calls"] == []
    assert record["reply"].strip() and len(record["stats"]["rounds"]) == 1
    assert "may not support tools" not in run.stderr  # nothing was forced: no call is no news


@pytest.mark.server
def test_llama_server_refusal_without_a_terminal_never_runs_the_function(
    cli, isolated_home, tool_template_server, tmp_path
):
    name = as_openai(isolated_home, tool_template_server)
    tools = functions_file(tmp_path)
    run = cli(
        "ask",
        "--server",
        name,
        "--functions",
        str(tools),
        "--tool-choice",
        "record_city",
        "--chain-limit",
        "1",
        "--max-tokens",
        "120",
        *GREEDY,
        CALL_PROMPT,
    )
    assert run.returncode == 0, run.stderr
    assert calls_made(tmp_path) == []  # the side effect never happened
    [call] = json.loads(run.stdout)["tool_calls"]
    assert call["approved"] is False and call["error"].startswith("Cancelled:")
    notices = [line for line in run.stderr.splitlines() if "--approve-tools" in line]
    assert len(notices) == 1 and "refused" in notices[0]


@pytest.mark.server
def test_a_server_that_ignores_tools_answers_in_text_with_one_notice(cli, isolated_home, own_template_server, tmp_path):
    name = as_openai(isolated_home, own_template_server)
    tools = functions_file(tmp_path)
    run = cli(
        "ask",
        "--server",
        name,
        "--functions",
        str(tools),
        "--tool-choice",
        "required",
        "--approve-tools",
        "--max-tokens",
        "120",
        *GREEDY,
        CALL_PROMPT,
    )
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    assert record["reply"].strip() and record["tool_calls"] == [] and calls_made(tmp_path) == []
    assert run.stderr.count("may not support tools") == 1
    assert "Traceback" not in run.stderr


@pytest.mark.server
def test_llama_cpp_python_server_forces_a_named_call_with_the_openai_object(
    cli, isolated_home, smollm2_path, server_logs, tmp_path
):
    """llama_cpp.server enforces only the object form of tool_choice (a grammar over that tool's
    arguments), repeats the tool's name in every streamed fragment, and refuses a null content."""
    server = harness.start_llama_cpp_server(smollm2_path, server_logs)
    try:
        name = as_openai(isolated_home, server)
        tools = functions_file(tmp_path)
        run = cli(
            "ask",
            "--server",
            name,
            "--functions",
            str(tools),
            "--tool-choice",
            "record_city",
            "--approve-tools",
            "--chain-limit",
            "1",
            "--max-tokens",
            "60",
            *GREEDY,
            "What is the weather in Paris?",
        )
    finally:
        server.stop()
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    made = calls_made(tmp_path)
    assert len(made) == 1 and made[0], record
    [call] = record["tool_calls"]
    assert call["name"] == "record_city" and call["result"] == f"It is sunny in {made[0]}, 21 degrees."
    assert len(record["stats"]["rounds"]) == 2 and record["reply"].strip()
