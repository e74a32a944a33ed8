"""MCP in use, against the real `@modelcontextprotocol/server-everything` over stdio (npm, installed
once into a cache folder by the `npm_mcp_bin` fixture):
- every tool the server offers stays usable: a schema keyword the grammar cannot hold is left to
  validation, with one notice (llmchat.tools.schema_hold);
- a resource attached (`-f mcp:SERVER/URI`, `/file`, batch `files`) and a prompt applied
  (`-p mcp:SERVER/NAME --prompt-arg k=v`, `/prompt`) in ask, chat and batch, checked in the
  history, in the prompt the template renders from it, and in the records; never in free model text.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

RESOURCE = "mcp:everything/demo://resource/dynamic/text/1"
RESOURCE_TEXT = "Resource 1: This is a plaintext resource"  # the server adds when it was made
BLOCK = f'<file path="{RESOURCE}">\n{RESOURCE_TEXT}'


@pytest.fixture
def everything(npm_mcp_bin) -> str:
    return str(npm_mcp_bin / "mcp-server-everything")


@pytest.fixture
def configured(everything, isolated_home) -> str:
    """`[mcp.everything]` in the config: its resources and prompts are named without offering its
    tools (which would make every prompt long)."""
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text(f"[mcp.everything]\ncommand = {json.dumps(everything)}\n")
    return everything


def stored(conversation_id: str):
    from llmchat.store.history import HistoryStore

    store = HistoryStore.open()
    try:
        return store.get(conversation_id).messages
    finally:
        store.close()


def rendered(cli, smollm2_path, messages, tmp_path) -> str:
    """The prompt SmolLM2's template makes of the stored messages: what the model was given."""
    path = tmp_path / "messages.json"
    path.write_text(json.dumps([{"role": m.role, "content": m.content} for m in messages]))
    result = cli("template", "render", "-m", str(smollm2_path), "--messages", str(path))
    assert result.returncode == 0, result.stderr
    return result.stdout


# --- every tool stays usable ------------------------------------------------------------------


def test_the_whole_server_is_offered_and_a_bound_is_held_and_validated(everything):
    """No model: the real server's tool list. `get-resource-links` has `minimum`/`maximum` on a
    number: the call grammar holds them (no notice for it), every tool stays, and a count of 0,
    which only a hand-made call can carry, is refused by validation before the server is called,
    while a count of 2 runs."""
    from tool_families import family_named

    from llmchat.tools.approval import ApprovalPolicy
    from llmchat.tools.execute import run_call
    from llmchat.tools.grammar import call_grammar
    from llmchat.tools.mcp.config import parse_mcp_spec
    from llmchat.tools.mcp.connection import McpConnection
    from llmchat.tools.schema_hold import offered_tools

    with McpConnection(parse_mcp_spec(everything)) as server:
        notices: list[str] = []
        offered = offered_tools(server.tools, notices.append, grammar=True)
        assert [spec.name for spec in offered] == [spec.name for spec in server.tools]
        assert "everything_get-sum" in {spec.name for spec in offered}
        links = [line for line in notices if line.startswith("tool everything_get-resource-links ")]
        assert links == []
        assert len(notices) == len({line.split(" ")[1] for line in notices})  # one notice per tool
        call_grammar(family_named("hermes"), offered, forced=True)  # every tool in one grammar
        tools = {spec.name: spec for spec in offered}
        policy = ApprovalPolicy(interactive=False, approve_all=True)
        refused = run_call(tools, "everything_get-resource-links", {"count": 0}, policy)
        assert refused.approved is False
        assert refused.error is not None and refused.error.startswith(
            "invalid arguments for everything_get-resource-links"
        )
        assert "minimum of 1" in refused.error
        ran = run_call(tools, "everything_get-resource-links", {"count": 2}, policy)
        assert ran.approved is True and ran.error is None and ran.result


def test_a_forced_call_to_the_tool_with_a_bound(cli, everything):
    """Through the model: the server loads (no notice for that tool: its grammar holds the bound),
    the forced call happens and its count is one the schema allows, so it ran."""
    result = cli(
        "ask",
        "--mcp",
        everything,
        "--tool-choice",
        "everything_get-resource-links",
        "--approve-tools",
        "--chain-limit",
        "1",
        "-n",
        "48",  # room for the whole call (the grammar ends it) and a short answer
        "--json",
        "Give me some resource links.",
        timeout=900,  # the server's whole tool list is a long prompt to prefill on a busy CPU
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "everything_get-resource-links" in line]
    assert not [line for line in lines if "cannot hold" in line]
    record = json.loads(result.stdout)
    calls = record["tool_calls"]
    assert calls and calls[0]["name"] == "everything_get-resource-links"
    count = calls[0]["arguments"].get("count", 3)
    assert 1 <= count <= 10 and calls[0]["approved"] is True and "result" in calls[0]


# --- resources and prompts: ask ---------------------------------------------------------------


def test_ask_attaches_a_resource_and_applies_a_prompt(cli, configured, smollm2_path, tmp_path):
    result = cli(
        "ask",
        "-m",
        str(smollm2_path),
        "-f",
        RESOURCE,
        "-p",
        "mcp:everything/args-prompt",
        "--prompt-arg",
        "city=Paris",
        "-n",
        "4",
        "--json",
        "Answer briefly.",
    )
    assert result.returncode == 0, result.stderr
    user = stored(json.loads(result.stdout)["conversation_id"])[0]
    assert user.role == "user"
    assert [a["path"] for a in user.attachments] == [RESOURCE]
    assert user.typed == "What's weather in Paris?\n\nAnswer briefly."
    assert user.content.startswith(BLOCK)
    prompt = rendered(cli, smollm2_path, [user], tmp_path)
    assert BLOCK in prompt and "What's weather in Paris?\n\nAnswer briefly." in prompt
    assert prompt.index(BLOCK) < prompt.index("What's weather in Paris?")


def test_ask_with_an_mcp_prompt_alone(cli, configured, smollm2_path):
    result = cli("ask", "-m", str(smollm2_path), "-p", "mcp:everything/simple-prompt", "-n", "4", "--json")
    assert result.returncode == 0, result.stderr
    user = stored(json.loads(result.stdout)["conversation_id"])[0]
    assert user.content == "This is a simple prompt without arguments."


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ("-p", "mcp:everything/args-prompt"),
            "llmchat: error: mcp:everything/args-prompt needs the argument city (Name of the city); "
            "pass --prompt-arg city=VALUE",
        ),
        (
            ("-p", "mcp:everything/args-prompt", "--prompt-arg", "town=Paris"),
            "llmchat: error: mcp:everything/args-prompt takes no argument 'town' (its arguments: city, state)",
        ),
        (("--prompt-arg", "city=Paris"), "llmchat: error: --prompt-arg goes with -p mcp:SERVER/NAME"),
        (("-p", "mcp:nowhere/x"), "llmchat: error: no MCP server named 'nowhere' (known: everything)"),
        (("-p", "mcp:everything"), "llmchat: error: mcp:everything: write mcp:SERVER/NAME"),
        (("-f", "mcp:everything/nope://x"), "llmchat: error: MCP server everything: reading nope://x failed"),
    ],
    ids=[
        "missing-required",
        "unknown-argument",
        "args-without-prompt",
        "unknown-server",
        "no-name",
        "no-such-uri",
    ],
)
def test_a_bad_mcp_reference_is_one_line_before_the_model_loads(cli, configured, args, line):
    result = cli("ask", "-m", "/nonexistent/model.gguf", *args, "hello")
    errors = [text for text in result.stderr.splitlines() if text.startswith("llmchat: error:")]
    assert len(errors) == 1 and errors[0].startswith(line), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert result.returncode == (1 if "failed" in line else 2)


def test_a_missing_argument_is_asked_for_on_a_terminal(configured, isolated_home):
    """On a terminal (a pty for stdin and stderr) the missing `city` is asked for; what is typed
    is the argument (the model path is wrong on purpose: the prompt is read before the load)."""
    import os
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmchat", "ask", "-m", "/nonexistent/model.gguf", "-p", "mcp:everything/args-prompt"],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=follower,
        env=dict(os.environ),
    )
    os.close(follower)
    seen = b""
    while b"city (Name of the city): " not in seen:  # the question, before anything is typed
        chunk = os.read(leader, 1024)
        assert chunk, seen
        seen += chunk
    os.write(leader, b"Lyon\n")
    rest = b""
    try:
        while True:
            chunk = os.read(leader, 1024)
            if not chunk:
                break
            rest += chunk
    except OSError:  # the pty is closed when the process exits
        pass
    assert proc.wait(timeout=120) == 3  # ExitCode.MODEL: past the prompt, at the load
    os.close(leader)
    assert b"/nonexistent/model.gguf" in rest


# --- chat (piped) and batch ---------------------------------------------------------------------


def test_scripted_chat_takes_the_resource_and_the_prompt_with_its_first_message(
    cli, configured, smollm2_path, tmp_path
):
    result = cli(
        "chat",
        "-m",
        str(smollm2_path),
        "-f",
        RESOURCE,
        "-p",
        "mcp:everything/args-prompt",
        "--prompt-arg",
        "city=Oslo",
        "--prompt-arg",
        "state=Viken",
        "-n",
        "3",
        "--json",
        input="first\nsecond\n",
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in records] == [1, 2] and records[0]["conversation_id"] == records[1]["conversation_id"]
    users = [m for m in stored(records[0]["conversation_id"]) if m.role == "user"]
    assert [a["path"] for a in users[0].attachments] == [RESOURCE] and users[1].attachments == []
    assert users[0].typed == "What's weather in Oslo, Viken?\n\nfirst"
    assert users[1].content == "second"
    prompt = rendered(cli, smollm2_path, users[:1], tmp_path)
    assert BLOCK in prompt and "What's weather in Oslo, Viken?\n\nfirst" in prompt


def test_a_batch_item_attaches_a_resource_and_a_prompt_opens_every_item(cli, configured, smollm2_path, tmp_path):
    """Three items with the same words: one with the resource, one without, one naming a resource
    the server does not have (an error record; the others run). A batch keeps no history: the
    resource shows in the prompt's size, which is the block's tokens larger."""
    items = tmp_path / "items.jsonl"
    items.write_text(
        "\n".join(
            json.dumps(item)
            for item in (
                {"id": "with", "prompt": "Say yes.", "files": [RESOURCE]},
                {"id": "without", "prompt": "Say yes."},
                {"id": "missing", "prompt": "Say yes.", "files": ["mcp:everything/nope://x"]},
            )
        )
        + "\n"
    )
    result = cli("batch", "-m", str(smollm2_path), str(items), "-n", "2", "--temperature", "0")
    assert result.returncode == 1, result.stderr  # one item failed
    records = {r["id"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert records["missing"]["finish_reason"] == "error" and "nope://x" in records["missing"]["error"]
    assert records["with"]["error"] is None and records["without"]["error"] is None
    grown = records["with"]["stats"]["prompt_tokens"] - records["without"]["stats"]["prompt_tokens"]
    assert grown >= 15  # `<file path="mcp:everything/...">`, the resource's sentence and `</file>`

    # -p mcp:SERVER/NAME opens every item's message: the same item's prompt grows by its text.
    single = tmp_path / "single.jsonl"
    single.write_text(json.dumps({"id": "without", "prompt": "Say yes."}) + "\n")
    common = ("batch", "-m", str(smollm2_path), str(single), "-n", "2", "--temperature", "0")
    prompted = cli(*common, "-p", "mcp:everything/args-prompt", "--prompt-arg", "city=Paris")
    assert prompted.returncode == 0, prompted.stderr
    record = json.loads(prompted.stdout)
    assert record["stats"]["prompt_tokens"] - records["without"]["stats"]["prompt_tokens"] >= 5
    missing = cli(*common, "-p", "mcp:everything/args-prompt")  # nobody to ask: exit 2, nothing run
    assert missing.returncode == 2 and missing.stdout == ""
    assert "needs the argument city" in missing.stderr and "Traceback" not in missing.stderr


# --- the chat's commands and completion (the UI's own logic, the real server) -------------------


@pytest.fixture
def sources(configured):
    from llmchat.config import load_config
    from llmchat.paths import config_file
    from llmchat.tools.mcp.sources import McpSources

    with McpSources(load_config(config_file())) as opened:
        yield opened


def command_context(sources):
    from io import StringIO

    from rich.console import Console

    from llmchat.ui.context import CommandContext

    out, errors = StringIO(), []
    ctx = CommandContext(session=None, out=Console(file=out), error=errors.append, mcp=sources)  # type: ignore[arg-type]
    return ctx, out, errors


def test_resources_and_prompts_are_listed_with_templates_and_arguments(sources):
    from llmchat.ui.slash import dispatch

    ctx, out, errors = command_context(sources)
    dispatch("/resources", ctx)
    listed = out.getvalue().splitlines()
    assert "mcp:everything/demo://resource/static/document/features.md  text/markdown" in listed
    assert "mcp:everything/demo://resource/dynamic/text/{resourceId}  template, arguments: resourceId" in listed
    assert len([line for line in listed if line.startswith("mcp:everything/demo://resource/static/")]) == 7
    out.truncate(0)
    out.seek(0)
    dispatch("/prompts everything", ctx)
    listed = out.getvalue().splitlines()
    assert any(line.startswith("mcp:everything/args-prompt (city, state?)") for line in listed)
    assert len(listed) == 4 and errors == []


def test_slash_prompt_sends_the_prompts_messages_and_says_what_is_missing(sources):
    from llmchat.ui.context import Action
    from llmchat.ui.slash import dispatch

    ctx, _, errors = command_context(sources)
    outcome = dispatch("/prompt mcp:everything/args-prompt city='New York'", ctx)
    assert outcome.action is Action.TURN and outcome.text == "What's weather in New York?"
    outcome = dispatch("/prompt mcp:everything/args-prompt", ctx)  # no terminal under pytest: not asked
    assert outcome.action is Action.CONTINUE
    assert errors == [
        "error: mcp:everything/args-prompt needs the argument city (Name of the city); pass --prompt-arg city=VALUE"
    ]


def test_tab_completes_mcp_resources_and_prompts(sources):
    from llmchat.ui.completer import SlashCompleter

    completer = SlashCompleter(None, sources)
    assert completer.candidates("/file mcp:")[1] == [("mcp:everything/", "MCP server")]
    assert completer.candidates("/file mcp:everything/demo")[1] == [], "a key never starts a server"
    assert sources.running("everything") is None
    sources.connection("everything")  # started by a command (/file, /resources), as in a chat
    typed, found = completer.candidates("/file mcp:everything/demo://resource/static/document/f")
    assert typed == "mcp:everything/demo://resource/static/document/f"
    assert found == [("mcp:everything/demo://resource/static/document/features.md", "text/markdown")]
    _, found = completer.candidates("/prompt mcp:everything/arg")
    assert [name for name, _ in found] == ["mcp:everything/args-prompt"]
    assert ("mcp:everything/", "MCP server") in completer.candidates("/file mc")[1]  # beside local names
    assert completer.candidates("/prompt m") == ("m", [("mcp:everything/", "MCP server")])
    _, found = completer.candidates("/file ./")  # paths complete as before
    assert all(not name.startswith("mcp:") for name, _ in found)


def test_a_resource_is_checked_as_a_files_bytes(sources):
    """A blob resource is its bytes (here base64 of a sentence: text, so it attaches); without a
    server to read from, a reference is a usage error, never a path on disk."""
    from llmchat.errors import UsageError
    from llmchat.turn.attachments import collect

    blob = "mcp:everything/demo://resource/dynamic/blob/1"
    (attachment,) = collect([blob], resources=sources.resource_bytes)
    assert attachment.path == blob and attachment.text.startswith("Resource 1: This is a base64 blob")
    assert attachment.size == len(attachment.text.encode())
    with pytest.raises(UsageError, match="MCP resources are not read here"):
        collect([RESOURCE])


# --- the interactive chat, end to end (prompt-toolkit reads keys from a pipe) -------------------


@pytest.fixture(scope="module")
def loaded(smollm2_path, tmp_path_factory):
    """SmolLM2, greedy and short, loaded once for the interactive tests (with its own home)."""
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import load_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMCHAT_HOME", str(tmp_path_factory.mktemp("load-home")))
        result = load_model(
            RunOptions(model=str(smollm2_path), ctx=2048, temperature=0.0, max_tokens=4),
            config=load_config(),
            announce=False,
        )
    yield result
    result.engine.close()


def drive(loaded, keys: str, **options) -> list:
    """Type `keys` into a chat on `loaded`'s engine; the user messages the history kept."""
    from prompt_toolkit.application import create_app_session
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from llmchat.store.history import HistoryStore
    from llmchat.turn.session import ChatSession
    from llmchat.ui.chat import run_interactive

    session = ChatSession.start(
        loaded.engine, sampling=loaded.sampling, model_label=loaded.model.name, history=HistoryStore.open()
    )
    assert session.history is not None
    try:
        with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
            pipe.send_text(keys + "/exit\r")
            run_interactive(session, show_stats=False, markdown=False, verbose=False, **options)
        return [m for m in session.history.get(session.conversation_id).messages if m.role == "user"]
    finally:
        session.history.close()


def test_the_interactive_chat_attaches_a_resource_and_sends_a_prompt(configured, sources, loaded, capsys):
    """`/file mcp:...` then a message, then `/prompt mcp:... k=v`: two user messages in the
    history, the first with the resource recorded as its attachment, the second the prompt's text."""
    users = drive(loaded, f"/file {RESOURCE}\rWhat is it?\r/prompt mcp:everything/args-prompt city=Rome\r", mcp=sources)
    assert [a["path"] for a in users[0].attachments] == [RESOURCE]
    assert users[0].content.startswith(BLOCK) and users[0].typed == "What is it?"
    assert users[1].content == "What's weather in Rome?" and users[1].attachments == []
    assert f"{RESOURCE}: " in capsys.readouterr().err  # the token count line /file prints


def test_chat_p_mcp_puts_the_prompt_at_the_input_line(configured, loaded):
    """`chat -p mcp:...` on a terminal: the prompt's text waits at the input line; Enter sends it."""
    users = drive(loaded, " and tomorrow?\r", opening="What's weather in Rome?")
    assert [m.content for m in users] == ["What's weather in Rome? and tomorrow?"]
