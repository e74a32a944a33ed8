"""The interactive chat: the prompt loop, every slash command, Ctrl-C, and a real terminal.

Most tests drive `run_interactive` in-process: prompt-toolkit reads keys from a pipe
(`create_pipe_input`) and draws into a DummyOutput, while the reply and the summary go to the
captured stdout and stderr. The engine is the real SmolLM2 (greedy, short replies); only the pure
UI logic (Ctrl-C state machine, completer, key handling) also has fake-session tests.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from prompt_toolkit.application import create_app_session
from prompt_toolkit.document import Document
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from llmchat.errors import HistoryError
from llmchat.output import StreamPrinter
from llmchat.turn.conversation import Conversation
from llmchat.turn.metrics import TurnStats
from llmchat.turn.record import TurnResult
from llmchat.ui import chat, slash
from llmchat.ui.chat import run_interactive
from llmchat.ui.completer import SlashCompleter
from llmchat.ui.context import Action
from llmchat.ui.terminal import CtrlCGuard

SUMMARY = re.compile(r"TTFT \d+ ms · [\d.]+ tok/s · \d+ tokens · prompt \d+ \(\d+ cached\) · ctx \d+/\d+")
ENTER = "\r"
CTRL_C = "\x03"
CTRL_D = "\x04"


# --------------------------------------------------------------------------- fixtures


def _load(tmp_path_factory, **options):
    """A real engine + sampling, loaded once per module with its own LLMCHAT_HOME (no config)."""
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import load_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMCHAT_HOME", str(tmp_path_factory.mktemp("load-home")))
        mp.delenv("LLMCHAT_MODEL", raising=False)
        return load_model(RunOptions(**options), config=load_config(), announce=False)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    # Greedy and short: replies are repeatable and the tests stay quick.
    result = _load(tmp_path_factory, ctx=2048, temperature=0.0, seed=1, max_tokens=24)
    yield result
    result.engine.close()


@pytest.fixture(scope="module")
def small_loaded(tmp_path_factory):
    """A 256-token context, so that trimming and overflow happen after a few short turns."""
    result = _load(tmp_path_factory, ctx=256, temperature=0.0, seed=1, max_tokens=16)
    yield result
    result.engine.close()


def _session(loaded, *, history=True):
    from llmchat.store.history import HistoryStore
    from llmchat.turn.session import ChatSession

    return ChatSession.start(
        loaded.engine,
        sampling=loaded.sampling,
        model_label=loaded.model.name,
        history=HistoryStore.open() if history else None,  # under the test's LLMCHAT_HOME
    )


@pytest.fixture
def session(loaded):
    chat_session = _session(loaded)
    yield chat_session
    if chat_session.history is not None:
        chat_session.history.close()


def drive(session, keys: str, *, show_stats: bool = True, markdown: bool = False) -> None:
    """Type `keys` into the chat, then Ctrl-D (a no-op when `/exit` came first)."""
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        pipe.send_text(keys + CTRL_D)
        run_interactive(session, show_stats=show_stats, markdown=markdown, verbose=False)


def stored_messages(session):
    return [(m.role, m.content, m.interrupted) for m in session.history.get(session.conversation_id).messages]


def conversation_messages(session):
    return [(m["role"], m["content"], bool(m.get("interrupted"))) for m in session.conversation.messages]


# --------------------------------------------------------------------------- streaming


def test_reply_streams_and_summary_follows(session, capsys, monkeypatch):
    fragments = []

    class Recording(StreamPrinter):
        def text(self, fragment):
            fragments.append(fragment)
            super().text(fragment)

    monkeypatch.setattr(chat, "StreamPrinter", Recording)
    drive(session, "What is the capital of France?" + ENTER + "/exit" + ENTER)
    out, err = capsys.readouterr()
    reply = session.last_result.reply
    assert reply.strip() and len(fragments) > 3, "the reply arrives piece by piece"
    assert out == reply + ("" if reply.endswith("\n") else "\n"), "stdout holds exactly the reply"
    assert SUMMARY.search(err), err
    assert "/help for commands" in err and "SmolLM2" in err
    assert (
        conversation_messages(session)
        == stored_messages(session)
        == [
            ("user", "What is the capital of France?", False),
            ("assistant", reply, False),
        ]
    )


def test_the_readout_can_be_drawn_at_any_moment_of_a_turn():
    """The ticker thread draws the readout whenever it wakes, between any two lines the decode
    loop runs. Drawn at every line of the printer's own code (a trace function stands in for the
    thread's timing), it never fails: the state is replaced whole, never seen half-updated (the
    phase "thinking" without the time it began was a KeyError that killed the ticker)."""
    import io

    from llmchat import output

    printer = StreamPrinter(io.StringIO(), io.StringIO(), show_live=False, show_summary=False)
    drawn: list[str] = []

    def tracer(frame, event, arg):
        if frame.f_code.co_filename != output.__file__:
            return None
        if event == "line":
            drawn.append(output.format_live(printer._state))  # what the ticker would read now
        return tracer

    sys.settrace(tracer)
    try:
        printer.prefill_started(12, 4, 2048)
        printer.thinking("Let me see.")
        printer.token(1, 1.0, 1.0)
        printer.text("Paris.")
        printer.token(2, 1.0, 1.5)
        printer.finished(TurnResult(user="q", reply="Paris.", finish_reason="stop", stats=TurnStats(), seed=1))
    finally:
        sys.settrace(None)
    assert any(line.startswith("prefill 8 tokens (4 cached)") for line in drawn)
    assert any(line.startswith("thinking… ") for line in drawn)
    assert drawn[-1].endswith("2 tokens · ctx 14/2048")


def test_no_stats_hides_the_summary(session, capsys):
    drive(session, "Say hello." + ENTER, show_stats=False)
    out, err = capsys.readouterr()
    assert out.strip() == session.last_result.reply.strip() != ""
    assert "tok/s" not in err and "TTFT" not in err


def test_markdown_streams_the_rendered_reply(session, capsys, monkeypatch):
    from tests.test_markdown_stream import play, rendered_at_once

    monkeypatch.setenv("COLUMNS", "80")  # the size of the terminal the renderer believes it draws on
    monkeypatch.setenv("LINES", "24")
    drive(session, "Write a Python function that adds two numbers, in a code block." + ENTER, markdown=True)
    out, err = capsys.readouterr()
    reply = session.last_result.reply
    assert reply.strip()
    # Drawn while it streamed, the screen ends as rich renders the whole reply (each line once).
    assert play(out) == rendered_at_once(reply)
    assert SUMMARY.search(err)


def test_input_history_is_saved_to_the_file(session, isolated_home):
    drive(session, "Say hello." + ENTER + "/show" + ENTER)
    from llmchat import paths

    saved = paths.input_history_file().read_text()
    assert "+Say hello." in saved and "+/show" in saved


def test_no_history_keeps_typed_lines_off_disk(loaded, isolated_home, capsys):
    from llmchat import paths

    drive(_session(loaded, history=False), "Say hello." + ENTER)
    assert not paths.input_history_file().exists()


def test_unwritable_input_history_warns_once_and_goes_on(session, isolated_home, monkeypatch, capsys):
    from llmchat import paths

    blocker = isolated_home / "not-a-folder"
    blocker.write_text("a file where a folder should be")
    monkeypatch.setattr(paths, "input_history_file", lambda: blocker / "input_history")
    drive(session, "Say hello." + ENTER + "Say bye." + ENTER)
    out, err = capsys.readouterr()
    assert err.count("cannot write the input history") == 1
    assert len(session.conversation.messages) == 4


# --------------------------------------------------------------------------- slash commands


def test_set_changes_sampling_and_bad_values_keep_the_session(session, capsys):
    drive(
        session,
        "/set temperature 0.3"
        + ENTER
        + "/set top-k 7"
        + ENTER
        + "/set max_tokens 12"
        + ENTER
        + "/set temperature hot"
        + ENTER
        + "/set top_p 5"
        + ENTER
        + "/set bogus 1"
        + ENTER
        + "/set seed"
        + ENTER
        + "Say hello."
        + ENTER,
    )
    out, err = capsys.readouterr()
    sampling = session.sampling
    assert (sampling.temperature, sampling.top_k, sampling.max_tokens) == (0.3, 7, 12)
    assert sampling.source_of("temperature") == sampling.source_of("top_k") == "/set"
    assert "error: temperature must be a number, got 'hot'" in err
    assert "error: top-p must be in (0, 1], got 5" in err
    assert "error: unknown setting 'bogus'" in err
    assert "usage: /set KEY VALUE" in err
    assert session.last_result.stats.generated_tokens <= 12, "the new max_tokens applies to the next reply"


def test_set_preset(session, capsys):
    drive(session, "/set preset creative" + ENTER + "/set preset wild" + ENTER)
    _, err = capsys.readouterr()
    assert session.sampling.preset == "creative" and session.sampling.temperature == 1.0
    assert session.sampling.source_of("temperature") == "preset creative"
    assert "unknown preset 'wild'" in err


def test_system_shows_and_sets_the_prompt_in_conversation_and_history(session, capsys):
    drive(session, "/system" + ENTER + "Say hello." + ENTER + "/system You are a pirate." + ENTER + "/system" + ENTER)
    out, err = capsys.readouterr()
    assert "no system prompt" in err
    assert session.conversation.system == "You are a pirate."
    assert out.rstrip().endswith("You are a pirate.")
    assert session.history.get(session.conversation_id).system_prompt == "You are a pirate."
    drive(session, "/system --clear" + ENTER)
    assert session.conversation.system is None
    assert session.history.get(session.conversation_id).system_prompt is None


def test_undo_removes_the_last_exchange_from_conversation_and_history(session, capsys):
    drive(session, "Say hello." + ENTER + "Say goodbye." + ENTER + "/undo" + ENTER)
    assert [m[1] for m in conversation_messages(session) if m[0] == "user"] == ["Say hello."]
    assert conversation_messages(session) == stored_messages(session)
    drive(session, "/undo" + ENTER + "/undo" + ENTER)
    _, err = capsys.readouterr()
    assert session.conversation.messages == [] and stored_messages(session) == []
    assert "nothing to undo" in err


def test_retry_regenerates_the_last_reply(session, capsys):
    drive(session, "Name a colour." + ENTER)
    first = session.last_result.reply
    capsys.readouterr()
    drive(session, "/retry" + ENTER)
    out, err = capsys.readouterr()
    assert session.last_result is not None and session.last_result.user == "Name a colour."
    # Not asserted equal to `first`: even greedy, the retry starts from a KV cache that holds the
    # whole prompt, and llama.cpp's numbers for a 1-token batch differ slightly from a full prefill.
    assert session.last_result.reply.strip()
    assert out.strip() == session.last_result.reply.strip(), "the new reply was streamed"
    assert first.strip()
    assert SUMMARY.search(err)
    assert len(session.conversation.messages) == 2
    assert conversation_messages(session) == stored_messages(session)


def test_retry_with_nothing_to_retry(session, capsys):
    drive(session, "/retry" + ENTER)
    assert "nothing to retry" in capsys.readouterr().err
    assert session.conversation.messages == []


def _offer_tools(session, folder: Path) -> None:
    """The chat's tools as `chat --functions FILE --tool-choice record_city --approve-tools
    --chain-limit 1` offers them: every message makes one call, then an answer."""
    from llmchat.config import load_config
    from llmchat.tools import options as tool_options
    from tests.test_tools_loop import functions_file

    request = tool_options.tool_request(None, [str(functions_file(folder))], None, "record_city", 1, True)
    toolset = tool_options.gather(request, load_config())
    assert toolset is not None
    tool_options.offer(session, toolset, request, dim=True)
    # Room for the call's JSON and a short answer.
    session.set_sampling(dataclasses.replace(session.sampling, max_tokens=48))


def test_undo_retry_and_edit_after_a_tool_turn(session, capsys, tmp_path):
    """After a turn in which a tool ran, the last exchange is the user's message, the call, its
    result and the answer: /undo removes all four, /retry sends the message again (the tool runs
    again), /edit gives it back to change."""
    from tests.test_tools_loop import calls_made

    _offer_tools(session, tmp_path)
    question = "What is the weather in Paris?"
    drive(session, question + ENTER)
    roles = [m[0] for m in conversation_messages(session)]
    assert roles == ["user", "assistant", "tool", "assistant"], roles
    assert len(calls_made(tmp_path)) == 1
    assert conversation_messages(session) == stored_messages(session)
    capsys.readouterr()

    drive(session, "/retry" + ENTER)
    _, err = capsys.readouterr()
    assert "nothing to retry" not in err
    assert [m[0] for m in conversation_messages(session)] == roles, "the exchange replaced, not added"
    assert session.conversation.messages[0]["content"] == question
    assert len(calls_made(tmp_path)) == 2, "the tool ran again"
    assert conversation_messages(session) == stored_messages(session)

    drive(session, "/undo" + ENTER)
    _, err = capsys.readouterr()
    assert "nothing to undo" not in err and f"removed the last exchange ({question!r}" in err
    assert session.conversation.messages == [] and stored_messages(session) == []

    drive(session, question + ENTER)
    first_id = session.conversation_id
    drive(session, "/edit" + ENTER + ENTER)  # the message comes back at the prompt; Enter sends it as it is
    _, err = capsys.readouterr()
    assert "nothing to edit" not in err and "editing turn 1" in err
    assert [m[0] for m in conversation_messages(session)] == roles
    assert session.conversation_id != first_id, "the edit is a branch; the old exchange stays"
    assert [m.role for m in session.history.get(first_id).messages] == roles
    assert conversation_messages(session) == stored_messages(session)
    assert len(calls_made(tmp_path)) == 4


def test_undo_and_retry_after_a_turn_with_files(session, capsys, tmp_path):
    """A message sent with files: /retry sends it with the same files (the history keeps them with
    it), and the files attached since wait for the next message; /undo names the typed words."""
    notes = tmp_path / "notes.txt"
    notes.write_text("The meeting moved to Thursday.\n", encoding="utf-8")
    later = tmp_path / "later.txt"
    later.write_text("Bring the slides.\n", encoding="utf-8")
    drive(session, f"/file {notes}" + ENTER + "When is the meeting?" + ENTER)
    [user, _] = session.conversation.messages
    assert [a.path for a in user["attachments"]] == [str(notes)] and "Thursday" in user["content"]
    capsys.readouterr()

    ui = chat.ChatUI(session, show_stats=False, markdown=False, verbose=False)
    ui.context.attachments.extend(slash_attachments(later))  # attached after the message, for the next one
    outcome = slash.dispatch("/retry", ui.context)
    assert outcome.action is Action.TURN and outcome.text == "When is the meeting?"
    assert ui.run_turn(outcome.text or "", outcome.attachments) == ""
    [user, reply] = session.conversation.messages
    assert [a.path for a in user["attachments"]] == [str(notes)], "sent again with its own files only"
    assert "Thursday" in user["content"] and "slides" not in user["content"]
    assert [a.path for a in ui.context.attachments] == [str(later)], "the later file waits for the next message"
    assert conversation_messages(session) == stored_messages(session)
    stored = session.history.turn_attachments(session.conversation_id, 0)
    assert [a.path for a in stored] == [str(notes)]

    slash.dispatch("/undo", ui.context)
    _, err = capsys.readouterr()
    assert "removed the last exchange ('When is the meeting?'" in err
    assert session.conversation.messages == [] and stored_messages(session) == []


def slash_attachments(*paths: Path) -> list:
    from llmchat.turn.attachments import collect

    return list(collect([str(path) for path in paths]))


def test_undo_and_retry_after_an_interrupted_turn(session, capsys, monkeypatch):
    monkeypatch.setattr(chat, "StreamPrinter", _interrupting_printer(after_fragments=3))
    session.set_sampling(dataclasses.replace(session.sampling, max_tokens=200))
    question = "Count from 1 to 100, one number per line."
    drive(session, question + ENTER)
    assert conversation_messages(session)[1][2] is True, "interrupted"
    monkeypatch.setattr(chat, "StreamPrinter", StreamPrinter)
    session.set_sampling(dataclasses.replace(session.sampling, max_tokens=24))
    capsys.readouterr()
    drive(session, "/retry" + ENTER)
    messages = conversation_messages(session)
    assert [(m[0], m[2]) for m in messages] == [("user", False), ("assistant", False)]
    assert messages[0][1] == question and messages[1][1].strip()
    assert messages == stored_messages(session)
    monkeypatch.setattr(chat, "StreamPrinter", _interrupting_printer(after_fragments=3))
    session.set_sampling(dataclasses.replace(session.sampling, max_tokens=200))
    drive(session, question + ENTER)
    assert conversation_messages(session)[3][2] is True
    drive(session, "/undo" + ENTER)
    assert conversation_messages(session) == messages == stored_messages(session)


def test_edit_after_a_turn_with_files(session, capsys, tmp_path):
    """/edit after a message sent with files: the typed words come back at the prompt and the files
    go with them again; sending starts a branch, and the old exchange stays in the history."""
    notes = tmp_path / "notes.txt"
    notes.write_text("The meeting moved to Thursday.\n", encoding="utf-8")
    drive(session, f"/file {notes}" + ENTER + "When is the meeting?" + ENTER)
    first_id = session.conversation_id
    old = stored_messages(session)
    capsys.readouterr()

    drive(session, "/edit" + ENTER + " Say the day." + ENTER)
    _, err = capsys.readouterr()
    assert "editing turn 1" in err and f"the old exchange stays in {first_id}" in err
    [user, reply] = session.conversation.messages
    assert [a.path for a in user["attachments"]] == [str(notes)], "the files went with the edited message"
    assert "Thursday" in user["content"] and user["content"].endswith("When is the meeting? Say the day.")
    assert reply["role"] == "assistant" and reply["content"].strip()
    assert session.conversation_id != first_id
    assert conversation_messages(session) == stored_messages(session)
    assert [a.path for a in session.history.turn_attachments(session.conversation_id, 0)] == [str(notes)]
    assert stored_messages_of(session, first_id) == old, "the old exchange stays as it was"


def test_edit_after_an_interrupted_turn(session, capsys, monkeypatch):
    """/edit after a reply cut by Ctrl-C: the message comes back to change, the new reply replaces
    the partial one in a branch, and the stored conversation keeps the interrupted exchange."""
    monkeypatch.setattr(chat, "StreamPrinter", _interrupting_printer(after_fragments=3))
    session.set_sampling(dataclasses.replace(session.sampling, max_tokens=200))
    question = "Count from 1 to 100, one number per line."
    drive(session, question + ENTER)
    assert conversation_messages(session)[1][2] is True, "interrupted"
    first_id = session.conversation_id
    old = stored_messages(session)
    monkeypatch.setattr(chat, "StreamPrinter", StreamPrinter)
    session.set_sampling(dataclasses.replace(session.sampling, max_tokens=24))
    capsys.readouterr()

    drive(session, "/edit" + ENTER + " Stop at 3." + ENTER)
    _, err = capsys.readouterr()
    assert "nothing to edit" not in err and "editing turn 1" in err
    messages = conversation_messages(session)
    assert [(m[0], m[2]) for m in messages] == [("user", False), ("assistant", False)]
    assert messages[0][1] == question + " Stop at 3." and messages[1][1].strip()
    assert session.conversation_id != first_id
    assert messages == stored_messages(session)
    assert stored_messages_of(session, first_id) == old and old[1][2] is True


def stored_messages_of(session, conversation_id):
    return [(m.role, m.content, m.interrupted) for m in session.history.get(conversation_id).messages]


def test_clear_starts_a_new_conversation(session, capsys):
    drive(session, "Say hello." + ENTER)
    first_id = session.conversation_id
    drive(session, "/clear" + ENTER)
    assert session.conversation.messages == [] and session.conversation_id is None
    assert session.last_result is None
    drive(session, "Say bye." + ENTER)
    assert session.conversation_id != first_id
    assert len(session.history.list_conversations()) == 2


def test_save_and_load_round_trip(session, capsys):
    drive(session, "/save early" + ENTER)
    assert "nothing saved yet" in capsys.readouterr().err
    drive(session, "Say hello." + ENTER + "/save greeting" + ENTER + "/clear" + ENTER + "Say bye." + ENTER)
    saved = session.history.get("greeting")
    assert [m.content for m in saved.messages][0] == "Say hello."
    other_id = session.conversation_id
    assert other_id != saved.id
    drive(session, "/save greeting" + ENTER)  # taken by the other conversation
    assert "already used" in capsys.readouterr().err

    drive(session, "/load greeting" + ENTER)
    _, err = capsys.readouterr()
    assert session.conversation_id == saved.id
    assert [m["content"] for m in session.conversation.messages] == [m.content for m in saved.messages]
    assert "loaded 'greeting'" in err
    drive(session, "Say it again." + ENTER)
    assert len(session.history.get("greeting").messages) == 4, "the loaded conversation goes on"
    drive(session, "/load nosuch" + ENTER + f"/load {other_id[:12]}" + ENTER)
    _, err = capsys.readouterr()
    assert "no conversation matches 'nosuch'" in err
    assert session.conversation_id == other_id


def test_history_lists_recent_conversations(session, capsys):
    drive(session, "/history" + ENTER)
    assert "no saved conversations yet" in capsys.readouterr().err
    drive(session, "Say hello." + ENTER + "/save first" + ENTER + "/history" + ENTER)
    out, _ = capsys.readouterr()
    assert session.conversation_id in out and "first" in out and "Say hello." in out


def test_history_commands_without_a_store(loaded, capsys):
    drive(_session(loaded, history=False), "/save x" + ENTER + "/load x" + ENTER + "/history" + ENTER)
    assert capsys.readouterr().err.count("history is off") == 3


def test_show_lists_settings_and_where_they_came_from(session, capsys):
    drive(session, "/set top_p 0.5" + ENTER + "Say hello." + ENTER + "/show" + ENTER)
    out, _ = capsys.readouterr()
    for expected in (
        "model",
        "SmolLM2",
        "template",
        session.template.name,
        "context",
        "/ 2,048 tokens used",
        "sampling",
        "flash attention off, KV f16",  # auto on the CPU (llmchat.engine.calibrate)
        "auto: off on the CPU",
        "no drafting",
    ):
        assert expected in out, expected
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert rows["temperature"].rstrip().endswith("flag")  # from the fixture's RunOptions
    assert rows["top_p"].rstrip().endswith("/set")
    assert rows["min_p"].rstrip().endswith("default")
    used = int(re.search(r"([\d,]+) / 2,048 tokens used", out).group(1).replace(",", ""))
    assert used == session.context_used() > 0


def test_stats_prints_the_numbers_of_the_last_reply(session, capsys):
    drive(session, "/stats" + ENTER)
    assert "no reply yet" in capsys.readouterr().err
    drive(session, "Say hello." + ENTER + "/stats" + ENTER)
    out, _ = capsys.readouterr()
    stats = session.last_result.stats.to_dict()
    numbers = dict(re.findall(r"^(\w+)\s+(\S+)$", out, re.M))
    assert int(numbers["generated_tokens"]) == stats["generated_tokens"] > 0
    assert int(numbers["prompt_tokens"]) == stats["prompt_tokens"]
    assert float(numbers["decode_tok_s"]) == pytest.approx(stats["decode_tok_s"], rel=1e-3)
    assert float(numbers["ttft_s"]) > 0


def test_help_and_unknown_commands(session, capsys):
    drive(session, "/help" + ENTER + "/foo bar" + ENTER + "/HELP" + ENTER)
    out, err = capsys.readouterr()
    for name in (
        "/exit",
        "/clear",
        "/system",
        "/set",
        "/show",
        "/stats",
        "/retry",
        "/undo",
        "/save",
        "/load",
        "/history",
    ):
        assert name in out
    assert "unknown command /foo; /help lists them" in err
    assert session.conversation.messages == []


def test_quit_and_exit_end_the_loop(session, capsys):
    drive(session, "/quit" + ENTER + "Say hello." + ENTER)
    assert session.conversation.messages == [], "nothing after /quit is read"


def test_double_slash_sends_a_message_starting_with_a_slash(session, capsys):
    drive(session, "//etc/hosts is a file. Say ok." + ENTER)
    assert session.conversation.messages[0]["content"] == "/etc/hosts is a file. Say ok."


# --------------------------------------------------------------------------- Ctrl-C and failures


def _interrupting_printer(after_fragments: int, times: int = 1):
    """A StreamPrinter that sends the process a real SIGINT (as Ctrl-C does) mid-reply."""

    class Interrupting(StreamPrinter):
        seen = 0

        def text(self, fragment):
            super().text(fragment)
            Interrupting.seen += 1
            if Interrupting.seen == after_fragments:
                for _ in range(times):
                    os.kill(os.getpid(), signal.SIGINT)

    return Interrupting


@pytest.mark.parametrize("presses", [1, 3])
def test_ctrl_c_mid_reply_keeps_session_and_history_consistent(session, capsys, monkeypatch, presses):
    monkeypatch.setattr(chat, "StreamPrinter", _interrupting_printer(after_fragments=3, times=presses))
    session.set_sampling(dataclasses.replace(session.sampling, max_tokens=200))
    drive(session, "Count from 1 to 100, one number per line." + ENTER + "Say hello." + ENTER)
    out, err = capsys.readouterr()
    assert "[interrupted]" in err
    messages = conversation_messages(session)
    assert messages[1][0] == "assistant" and messages[1][2] is True, "the partial reply is kept, marked"
    assert messages[1][1].strip(), "the partial reply has the text streamed so far"
    assert messages[1][1] in out
    assert len(messages) == 4 and messages[3][2] is False, "the chat went on after Ctrl-C"
    assert stored_messages(session) == messages
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the SIGINT handler is restored"


def test_message_too_long_is_reported_and_put_back(small_loaded, capsys):
    from llmchat import paths

    session = _session(small_loaded)
    long_text = " ".join(["word"] * 300)
    drive(session, "Say hello." + ENTER + long_text + ENTER + " END" + ENTER + CTRL_C + "Say bye." + ENTER)
    _, err = capsys.readouterr()
    refusals = [line for line in err.splitlines() if line.startswith("error: ") and "context of 256" in line]
    assert len(refusals) == 2, "the message came back to the prompt and was sent again"
    # The text was put back: " END" was typed after it, and that longer line reached the history.
    assert "+" + long_text + " END" in paths.input_history_file().read_text()
    assert [m["content"] for m in session.conversation.messages if m["role"] == "user"] == ["Say hello.", "Say bye."]
    assert conversation_messages(session) == stored_messages(session)
    session.history.close()


def test_trimming_prints_a_notice(small_loaded, capsys):
    session = _session(small_loaded, history=False)
    filler = " ".join(["apple banana cherry"] * 8)
    keys = "".join(f"{filler} Reply with one word {i}." + ENTER for i in range(6))
    drive(session, keys)
    _, err = capsys.readouterr()
    assert re.search(r"context: dropped \d+ oldest messages \([\d,]+ tokens\) to fit \d+", err), err
    assert session.conversation.window_start > 0
    assert len(session.conversation.messages) == 12, "trimmed from the context, not from the conversation"


def test_history_failure_warns_once_and_the_chat_goes_on(session, capsys, monkeypatch):
    drive(session, "Say hello." + ENTER)
    store = session.history

    def locked(*args, **kwargs):
        raise HistoryError("history database x is locked by another process (waited 10s)")

    monkeypatch.setattr(store, "add_turn", locked)
    drive(session, "Say bye." + ENTER + "Say it again." + ENTER + "/undo" + ENTER)
    out, err = capsys.readouterr()
    assert err.count("is locked by another process") == 1
    assert session.history is None
    assert SUMMARY.search(err), "the reply whose save failed still got its summary"
    assert len(session.conversation.messages) == 4  # three turns, one undone


# --------------------------------------------------------------------------- pure UI logic (fake session)


class FakeSession:
    """Echoes each message back; enough for the key handling and the loop."""

    def __init__(self, reply=None):
        self.sent = []
        self.reply = reply
        self.history = None
        self.template = SimpleNamespace(name="chatml", source="builtin", source_detail="built-in chatml")
        self.engine = SimpleNamespace(n_ctx=2048)
        self.model_label = "fake"
        self.last_result = None
        self.conversation = Conversation()

    def turn(self, text, observer, *, on_commit=None):
        self.sent.append(text)
        reply = self.reply if self.reply is not None else f"echo: {text}"
        observer.prefill_started(5, 0, 2048)
        for index, piece in enumerate(re.findall(r"\S+\s*", reply)):
            observer.text(piece)
            observer.token(index + 1, 0.0, 0.0)
        self.last_result = TurnResult(
            user=text, reply=reply, finish_reason="stop", stats=TurnStats(generated_tokens=2), seed=1
        )
        if on_commit is not None:
            on_commit(self.last_result)
        observer.finished(self.last_result)
        return self.last_result


def test_ctrl_c_guard_state_machine():
    guard = CtrlCGuard()
    assert guard.press("some text") == "clear"
    assert guard.press("") == "hint"
    assert guard.press("") == "exit"
    guard.reset()
    assert guard.press("") == "hint"
    assert guard.press("x") == "clear"
    assert guard.press("") == "hint"


def test_ctrl_c_at_the_prompt(capsys):
    fake = FakeSession()
    # typed text + Ctrl-C clears it; then the hint; typing disarms; one Ctrl-C more is a hint again.
    drive(
        fake,
        "draft"
        + CTRL_C
        + CTRL_C
        + "real"
        + ENTER
        + CTRL_C
        + "a"
        + CTRL_C
        + CTRL_C
        + "b"
        + ENTER
        + CTRL_C
        + CTRL_C
        + "never sent"
        + ENTER,
    )
    _, err = capsys.readouterr()
    assert fake.sent == ["real", "b"]
    assert err.count(chat.EXIT_HINT) == 4  # after "draft" is cleared, before "real", before "b", before exiting


def test_ctrl_d_exits(capsys):
    fake = FakeSession()
    drive(fake, "one" + ENTER + CTRL_D + "two" + ENTER)
    assert fake.sent == ["one"]


def test_alt_enter_inserts_a_newline_and_paste_stays_one_message(capsys):
    fake = FakeSession()
    paste = "\x1b[200~first line\nsecond line\r\nthird line\x1b[201~"
    drive(fake, "a\x1b\rb" + ENTER + paste + ENTER + "/exit" + ENTER)
    assert fake.sent == ["a\nb", "first line\nsecond line\nthird line"]


def test_an_error_in_one_turn_keeps_the_chat_and_the_text(capsys):
    from llmchat.errors import TemplateError

    class Refusing(FakeSession):
        def turn(self, text, observer, *, on_commit=None):
            if text.startswith("bad"):
                raise TemplateError("the template refused this conversation")
            return super().turn(text, observer, on_commit=on_commit)

    fake = Refusing()
    # The refused text comes back to the prompt, so " fixed" extends it (still refused: it starts with
    # "bad"); had it not come back, " fixed" alone would have been sent. Ctrl-C clears; the chat goes on.
    drive(fake, "bad message" + ENTER + " fixed" + ENTER + CTRL_C + "good" + ENTER)
    _, err = capsys.readouterr()
    assert err.count("error: the template refused this conversation") == 2
    assert fake.sent == ["good"]


def test_markdown_rendering_with_a_known_reply(capsys, monkeypatch):
    from tests.test_markdown_stream import play, rendered_at_once

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", "24")
    reply = "# Title\n\nSome **bold** text.\n\n```python\nprint(1)\n```\n"
    drive(FakeSession(reply=reply), "anything" + ENTER, markdown=True)
    out, _ = capsys.readouterr()
    shown = play(out)
    assert shown == rendered_at_once(reply)
    assert [line.strip() for line in shown if line.strip()] == ["Title", "Some bold text.", "print(1)"]


def test_completer_only_on_slash_lines():
    completer = SlashCompleter(FakeSession())

    def words(text):
        return [c.text for c in completer.get_completions(Document(text), None)]

    assert words("hello /s") == [] and words("") == [] and words("//x") == []
    assert set(words("/s")) == {"/system", "/set", "/show", "/stats", "/save", "/search"}
    assert words("/hel") == ["/help"]
    assert words("/set t") == ["temperature", "top_p", "top_k"]
    assert words("/set pre") == ["preset"]
    assert words("/set preset c") == ["creative", "code"]
    assert words("/set temperature 0") == []
    completion = next(completer.get_completions(Document("/set top_k"), None))
    assert completion.start_position == -len("top_k")


def test_completer_offers_saved_conversations_for_load():
    summary = SimpleNamespace(id="01abc", name="my chat", preview="hello")
    fake = FakeSession()
    fake.history = SimpleNamespace(list_conversations=lambda limit: [summary])
    completer = SlashCompleter(fake)
    found = list(completer.get_completions(Document("/load my"), None))
    assert [(c.text, c.start_position) for c in found] == [("my chat", -2)]
    assert [c.text for c in completer.get_completions(Document("/load 01"), None)] == ["01abc"]

    def broken(limit):
        raise HistoryError("locked")

    fake.history = SimpleNamespace(list_conversations=broken)
    completer.new_prompt()  # the history is read again at the next prompt, and fails there
    assert list(completer.get_completions(Document("/load "), None)) == []


def test_trim_notice_wording():
    stats = TurnStats(messages_dropped=4, tokens_dropped=1234)
    assert stats.trim_notice(3000) == "context: dropped 4 oldest messages (1,234 tokens) to fit 3,000"


def test_split_command():
    assert slash.split_command("  /Set  temperature 0.2 ") == ("/set", "temperature 0.2")
    assert slash.split_command("/system\nline two") == ("/system", "line two")
    assert slash.is_command("/x") and not slash.is_command("//x") and not slash.is_command("x /y")


# --------------------------------------------------------------------------- a real terminal


def _spawn_chat(home: Path, *extra: str, history: bool = False):
    import pexpect  # a declared test dependency (pyproject.toml): missing, the test fails

    env = dict(
        os.environ, LLMCHAT_HOME=str(home), TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1", COLUMNS="100", LINES="30"
    )
    env.pop("LLMCHAT_MODEL", None)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "llmchat", "chat", *([] if history else ["--no-history"]), "--temperature", "0", *extra],
        env=env,
        encoding="utf-8",
        codec_errors="replace",
        dimensions=(30, 100),
        timeout=180,
    )
    return pexpect, child


def _screen_text(raw: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[78=>]|\r", "", raw)


def test_end_to_end_in_a_pseudo_terminal(isolated_home):
    pexpect, child = _spawn_chat(isolated_home, "--max-tokens", "32")
    try:
        child.expect_exact("/help for commands")
        child.expect_exact("> ")
        child.send("What is the capital of France?" + ENTER)
        child.expect(r"prompt \d+ \(\d+ cached\) · ctx \d+/\d+")  # the summary after the reply
        seen = _screen_text(child.before)
        assert "tok/s" in seen
        child.expect_exact("> ")
        child.send("/exit" + ENTER)
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)


def test_ctrl_c_in_a_pseudo_terminal_stops_the_reply(isolated_home):
    pexpect, child = _spawn_chat(isolated_home, "--max-tokens", "400")
    try:
        child.expect_exact("> ")
        child.send("Count from 1 to 200, one number per line." + ENTER)
        child.expect(r"\n\s*\d+")  # the reply has begun
        child.sendintr()
        index = child.expect([r"\[interrupted\]", r"prompt \d+ \(\d+ cached\)"])
        # A reply that ended before Ctrl-C arrived means Ctrl-C did not stop it: that is the failure.
        assert index == 0, "the reply was not interrupted by Ctrl-C"
        child.expect(r"interrupted")  # the summary names the finish reason
        child.expect_exact("> ")
        child.send("/exit" + ENTER)
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_undo_and_retry_after_a_tool_turn_in_a_pseudo_terminal(isolated_home, tmp_path):
    """A real chat on a terminal with a tool that runs on every message: after the tool turn,
    /undo removes it (call, result and answer with the message) and /retry runs it again."""
    from llmchat.store.history import HistoryStore
    from tests.test_tools_loop import calls_made, functions_file

    tools = functions_file(tmp_path)
    summary = r"prompt \d+ \(\d+ cached\) · ctx \d+/\d+"
    pexpect, child = _spawn_chat(
        isolated_home,
        *("--functions", str(tools), "--tool-choice", "record_city", "--approve-tools", "--chain-limit", "1"),
        *("--max-tokens", "48", "--seed", "1"),
        history=True,
    )
    try:
        child.expect_exact("> ")
        child.send("What is the weather in Paris?" + ENTER)
        child.expect_exact("tool call: record_city(")
        child.expect(summary)  # the answer after the call is done
        child.expect_exact("> ")
        child.send("/undo" + ENTER)
        child.expect_exact("removed the last exchange ('What is the weather in Paris?'")
        child.expect_exact("> ")
        child.send("What is the weather in Rome?" + ENTER)
        child.expect(summary)
        child.expect_exact("> ")
        child.send("/retry" + ENTER)
        index = child.expect_exact(["nothing to retry", "tool call: record_city("])
        assert index == 1, "/retry found nothing after the tool turn"
        child.expect(summary)
        child.expect_exact("> ")
        child.send("/exit" + ENTER)
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert len(calls_made(tmp_path)) == 3
    with HistoryStore.open(isolated_home / "history.db") as store:
        messages = store.get("last").messages
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"], "one tool turn, Rome's"
    assert messages[0].content == "What is the weather in Rome?"


def test_bracketed_paste_in_a_pseudo_terminal_is_one_message(isolated_home):
    """A terminal wraps a paste in ESC[200~ ... ESC[201~; its newlines must not send the message."""
    pexpect, child = _spawn_chat(isolated_home, "--max-tokens", "8", history=True)
    try:
        child.expect_exact("> ")
        child.send("\x1b[200~First line of the paste.\nSecond line of the paste.\x1b[201~")
        child.send(ENTER)
        child.expect(r"prompt \d+ \(\d+ cached\)")
        child.expect_exact("> ")
        child.send("/exit" + ENTER)
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    from llmchat.store.history import HistoryStore

    with HistoryStore.open(isolated_home / "history.db") as store:
        messages = store.get("last").messages
    assert [(m.role, m.content) for m in messages][0] == ("user", "First line of the paste.\nSecond line of the paste.")
    assert len(messages) == 2, "one message, one reply"


def test_bare_llmchat_on_a_terminal_opens_the_chat(isolated_home):
    """`llmchat` with no command on a terminal is `llmchat chat` with its defaults."""
    import os
    import sys

    import pexpect

    child = pexpect.spawn(
        sys.executable,
        ["-m", "llmchat"],
        env=dict(os.environ, LLMCHAT_HOME=str(isolated_home)),
        timeout=180,
        encoding="utf-8",
    )
    child.expect("/help for commands")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_quiet_terminal_leaves_a_stream_that_is_a_file_alone(tmp_path):
    # A real file descriptor that is no terminal: tcgetattr raises termios.error, not OSError.
    from llmchat.ui.terminal import quiet_terminal

    with open(tmp_path / "out.txt", "w+", encoding="utf-8") as stream:
        with quiet_terminal(stream):
            stream.write("the reply")
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "the reply"
