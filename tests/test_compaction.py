"""Compaction (llmchat.turn.compaction): /compact, automatic compaction past the threshold, the
fallback to trimming, the summary in the history, export and a resumed conversation, `ask -c`, a
server, and a real terminal.

The engine is the real SmolLM2 (greedy). Nothing here reads the summary's words: the tests check
the structure (history rows, the summary's marker and what it stands for), the stats (prompt
tokens drop after a compaction, the summary's prompt reuses the KV cache), the notices on stderr
and the exit codes. A summary the model writes is capped (compact_summary_tokens, and an eighth of
the context), so the turns summarised below are made longer than any summary can be.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from long_chats import fill, message
from prompt_toolkit.application import create_app_session
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from servers import harness

from llmchat.cli import main
from llmchat.config import load_config
from llmchat.env import Environment
from llmchat.errors import ConfigError
from llmchat.store.export import export_json, export_markdown
from llmchat.store.history import HistoryStore
from llmchat.turn.conversation import SUMMARY_REQUEST, Conversation
from llmchat.ui.chat import run_interactive

ENTER = "\r"
CTRL_D = "\x04"
COMPACTED = re.compile(
    r"context: compacted (\d+) exchanges? into a (\d+)-token summary, ([\d,]+) tokens freed \(([\d,]+) -> ([\d,]+) of"
)
FAILED = re.compile(r"context: compaction failed: (.*)")


# --------------------------------------------------------------------------- helpers


def _env(stdin: str = "") -> Environment:
    return Environment(
        stdin=io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8"),
        stdout=io.StringIO(),
        stderr=io.StringIO(),
        stdin_isatty=False,
        stdout_isatty=False,
        stderr_isatty=False,
    )


def _run(args: list[str], env: Environment) -> int:
    with pytest.raises(SystemExit) as done:
        main(args, env)
    return int(done.value.code or 0)


def _config(home: Path, text: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(text)


def _stored(conversation_id: str = "last"):
    with HistoryStore.open() as store:  # under the test's LLMCHAT_HOME
        return store.get(conversation_id)


def _originals(conversation):
    return [(m.role, m.content) for m in conversation.messages if m.role != "summary"]


def _summaries(conversation):
    return [m for m in conversation.messages if m.role == "summary"]


def _records(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def _context_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("context:")]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """A real engine, loaded once: greedy and short replies, a 2,048-token context."""
    from llmchat.options import RunOptions
    from llmchat.startup.loading import load_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMCHAT_HOME", str(tmp_path_factory.mktemp("load-home")))
        mp.delenv("LLMCHAT_MODEL", raising=False)
        result = load_model(RunOptions(ctx=2048, temperature=0.0, seed=1, max_tokens=8), config=load_config())
    yield result
    result.engine.close()


def _session(loaded):
    from llmchat.turn.session import ChatSession

    return ChatSession.start(
        loaded.engine, sampling=loaded.sampling, model_label=loaded.model.name, history=HistoryStore.open()
    )


def drive(session, keys: str) -> None:
    """Type `keys` into the interactive chat, then Ctrl-D."""
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        pipe.send_text(keys + CTRL_D)
        run_interactive(session, show_stats=False, markdown=False, verbose=False)


# --------------------------------------------------------------------------- the conversation (no model)


def test_a_summary_moves_the_window_and_is_sent_as_an_exchange_of_its_own():
    conversation = Conversation(system="Be brief.")
    for i in range(3):
        conversation.add_exchange(f"q{i}", f"a{i}")
    conversation.compact("the gist", covers=4)
    assert conversation.window_start == 4 and len(conversation.messages) == 6  # nothing removed
    assert conversation.prompt_messages("next") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": SUMMARY_REQUEST},
        {"role": "assistant", "content": "the gist"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "next"},
    ]
    copy = conversation.up_to(4)  # what a later summary is written over
    assert len(copy.messages) == 4 and copy.summary == conversation.summary
    copy.messages.clear()
    assert len(conversation.messages) == 6


def test_undoing_past_the_point_a_summary_was_written_forgets_it():
    conversation = Conversation()
    for i in range(3):
        conversation.add_exchange(f"q{i}", f"a{i}")
    conversation.compact("the gist", covers=2)  # written after 3 exchanges
    conversation.add_exchange("q3", "a3")
    conversation.drop_last_exchange()  # written before this one began: kept
    assert conversation.summary is not None and conversation.window_start == 2
    conversation.drop_last_exchange()  # the summary may stand for part of this one: forgotten
    assert conversation.summary is None and conversation.window_start == 0
    assert [m["content"] for m in conversation.prompt_messages()] == ["q0", "a0", "q1", "a1"]


def test_the_history_keeps_a_summary_beside_every_message_and_undo_deletes_it_with_its_exchange(isolated_home):
    with HistoryStore.open() as store:
        cid = store.new_conversation(model="m", model_path="/m", template="t", system_prompt=None, sampling={})
        for i in range(3):
            store.add_turn(cid, f"q{i}", f"a{i}")
        store.add_message(cid, role="summary", content="the gist", summarised=4, finish_reason="stop", model="m")
        store.add_turn(cid, "q3", "a3")
        branch = store.fork(cid, 4)
        stored = store.get(cid)
        assert [m.role for m in stored.messages].count("summary") == 1
        assert _summaries(stored)[0].summarised == 4 and _summaries(stored)[0].seq == 6
        resumed = Conversation.from_stored(stored)
        assert len(resumed.messages) == 8 and resumed.window_start == 4
        assert resumed.summary is not None and resumed.summary.text == "the gist"
        # A branch copies the summary with what it stands for.
        assert [m.summarised for m in _summaries(store.get(branch))] == [4]
        # /undo of the exchange after the summary keeps it; the next /undo takes it along.
        store.delete_last_exchange(cid)
        assert len(_summaries(store.get(cid))) == 1
        store.delete_last_exchange(cid)
        after = store.get(cid)
        assert _summaries(after) == []
        assert _originals(after) == [("user", "q0"), ("assistant", "a0"), ("user", "q1"), ("assistant", "a1")]
        # Export: the summary is marked as one, with what it stands for; JSON carries the count.
        store.add_message(cid, role="summary", content="the gist again", summarised=2)
        exported = store.get(cid)
    markdown = export_markdown(exported)
    assert "## Summary" in markdown and "summary of messages 1–2" in markdown and "the gist again" in markdown
    document = json.loads(export_json(exported))
    assert [(m["role"], m["summarised"]) for m in document["messages"]][-1] == ("summary", 2)


def test_compact_settings_are_checked(isolated_home):
    config_file = isolated_home / "config.toml"
    for bad in (
        'compact = "sometimes"',
        "compact_threshold = 1.5",
        "compact_threshold = 0",
        "compact_summary_tokens = 0",
    ):
        _config(isolated_home, bad + "\n")
        with pytest.raises(ConfigError, match=bad.split()[0]):
            load_config(config_file)
    _config(isolated_home, 'compact = "off"\ncompact_threshold = 0.5\ncompact_summary_tokens = 64\n')
    config = load_config(config_file)
    assert (config.compact, config.compact_threshold, config.compact_summary_tokens) == ("off", 0.5, 64)


def test_a_bad_compact_flag_is_a_usage_error_before_the_model_loads(isolated_home):
    env = _env("hello\n")
    assert _run(["chat", "--compact", "sometimes", "-m", str(isolated_home / "missing.gguf")], env) == 2
    assert "--compact must be auto or off" in env.stderr.getvalue()


# --------------------------------------------------------------------------- /compact in the chat


def test_slash_compact_summarises_keeps_every_message_and_the_next_prompt_starts_from_the_summary(loaded, capsys):
    session = _session(loaded)
    keys = "".join(message(i) + ENTER for i in range(6)) + "/compact keep the note numbers" + ENTER
    drive(session, keys + "Which notes were there?" + ENTER)
    _, err = capsys.readouterr()
    notices = [COMPACTED.search(line) for line in _context_lines(err)]
    assert len(notices) == 1 and notices[0] is not None, err
    stored = _stored(session.conversation_id)
    # Every original message, in order, and one summary after the six exchanges it was written over.
    sent = [message(i) for i in range(6)] + ["Which notes were there?"]
    assert [content for role, content in _originals(stored) if role == "user"] == sent
    assert [role for role, _ in _originals(stored)] == ["user", "assistant"] * 7
    (summary,) = _summaries(stored)
    assert summary.seq == 12 and summary.summarised == session.conversation.summary.covers
    assert int(notices[0].group(1)) == summary.summarised // 2  # plain exchanges: two messages each
    assert summary.content == session.conversation.summary.text and summary.content.strip()
    # The summary's own prompt extended what the KV cache held: only the request was prefilled.
    assert summary.stats["cached_tokens"] > summary.stats["prompt_tokens"] // 2, summary.stats
    # The next turn's prompt starts from the summary: fewer tokens than before, its prefix rebuilt.
    replies = [m for m in stored.messages if m.role == "assistant"]
    before, after = replies[5].stats, replies[6].stats
    assert after["prompt_tokens"] < before["prompt_tokens"], (before, after)
    assert after["cached_tokens"] < after["prompt_tokens"] // 2
    # The conversation in memory is the history's (summaries aside).
    assert [(m["role"], m["content"]) for m in session.conversation.messages] == _originals(stored)
    session.history.close()


def test_resuming_starts_from_the_latest_summary_and_undo_past_it_forgets_it(loaded, capsys):
    session = _session(loaded)
    drive(session, "".join(message(i) + ENTER for i in range(4)) + "/compact" + ENTER + "Thanks." + ENTER)
    cid = session.conversation_id
    stored = _stored(cid)
    (summary,) = _summaries(stored)
    resumed = _session(loaded)
    resumed.load_conversation(stored)
    prompt = resumed.conversation.prompt_messages()
    assert prompt[:2] == [
        {"role": "user", "content": SUMMARY_REQUEST},
        {"role": "assistant", "content": summary.content},
    ]
    assert resumed.conversation.window_start == summary.summarised
    assert len(prompt) == 2 + len(_originals(stored)) - summary.summarised
    # /undo twice: the exchange after the summary, then one it was written after (with the summary).
    drive(resumed, "/undo" + ENTER + "/undo" + ENTER)
    after = _stored(cid)
    assert _summaries(after) == [] and resumed.conversation.summary is None
    assert [(m["role"], m["content"]) for m in resumed.conversation.messages] == _originals(after)
    assert len(_originals(after)) == 6
    capsys.readouterr()
    session.history.close()
    resumed.history.close()


def test_ctrl_c_while_the_summary_is_written_leaves_everything_as_it_was(loaded, capsys, monkeypatch):
    session = _session(loaded)
    drive(session, "".join(message(i) + ENTER for i in range(3)))
    before_history = _stored(session.conversation_id)
    before_messages = [dict(m) for m in session.conversation.messages]
    generate = session.engine.generate

    def interrupted_at_the_first_summary_token(request, **kwargs):
        generation = generate(request, **kwargs)
        if request.sampling.max_tokens == 8:  # a reply: the summary is capped higher (256 here)
            return generation

        class Stream:
            outcome, seed = generation.outcome, generation.seed

            def __iter__(self):
                for event in generation:
                    os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, mid-summary
                    yield event

        return Stream()

    with monkeypatch.context() as patch:  # the engine is the module's: only for this command
        patch.setattr(session.engine, "generate", interrupted_at_the_first_summary_token)
        drive(session, "/compact" + ENTER)
    _, err = capsys.readouterr()
    assert "compaction interrupted; nothing changed" in err
    assert session.conversation.summary is None and session.conversation.messages == before_messages
    after_history = _stored(session.conversation_id)
    assert [(m.role, m.content) for m in after_history.messages] == [
        (m.role, m.content) for m in before_history.messages
    ]
    session.history.close()


def _filled(loaded, until: int, **sampling):
    """A session whose window holds plain exchanges (written, not generated) up to about `until`
    prompt tokens. `sampling`: over the module's (a stop string that ends a summary early)."""
    from dataclasses import replace

    from llmchat.turn.session import ChatSession

    session = ChatSession.start(
        loaded.engine, sampling=replace(loaded.sampling, **sampling), model_label=loaded.model.name
    )
    fill(session, until)
    return session


def test_a_summary_stands_for_exactly_the_exchanges_its_prompt_held(loaded, monkeypatch):
    """A window too full for the summary's prompt beside its cap: the summary is written over fewer
    exchanges (the others stay verbatim), never over a prompt trimmed from the front that would
    mark exchanges as summarised that it never saw. The summary stops at its first blank line, so
    that it ends well within its cap whatever the model writes."""
    from llmchat.turn import compaction

    session = _filled(loaded, 1950, stop=("\n\n",))
    conversation = session.conversation
    starts = conversation.exchange_starts()
    kept_from = compaction._kept_from(session, starts)
    cap = compaction.summary_cap(compaction.CompactionSettings.of(session.config), session.engine.n_ctx)
    everything = conversation.up_to(kept_from).prompt_messages(compaction.SUMMARY_PROMPT)
    assert len(session.tokenize_messages(everything)) > session.engine.n_ctx - cap, "the case: it does not fit"
    prompts: list[str] = []
    decode = session.decode

    def seen(prepared, observer, **kwargs):
        prompts.append(prepared.rendered_text)
        return decode(prepared, observer, **kwargs)

    monkeypatch.setattr(session, "decode", seen)
    done = compaction.compact_now(session)
    assert done is not None and done.failure is None, done and done.failure
    (prompt,) = prompts
    covers = conversation.summary.covers
    summarised = [m["content"] for m in conversation.messages[:covers]]
    assert all(content in prompt for content in summarised), "every exchange it stands for, it saw"
    assert 0 < covers < kept_from, "fewer are summarised, the rest stay verbatim"
    assert not any(m["content"] in prompt for m in conversation.messages[covers:] if m["role"] == "user")
    assert done.exchanges == covers // 2


# --------------------------------------------------------------------------- automatic compaction


@pytest.mark.slow
@pytest.mark.model  # `_run` loads SmolLM2 in this process; tests/conftest.py cannot see that through it
def test_a_40_turn_chat_in_2048_tokens_goes_to_the_end_by_compacting(isolated_home):
    """The issue's acceptance: a 40-turn scripted chat with --ctx 2048 and automatic compaction
    (the default). Each exchange takes about 120 tokens, so 80 % of the context is passed several
    times. Every turn answers; every message the user sent and every reply is in the history."""
    lines = [message(i) for i in range(40)]
    env = _env("".join(line + "\n" for line in lines))
    code = _run(["chat", "--ctx", "2048", "-n", "8", "--temperature", "0", "--json"], env)
    err = env.stderr.getvalue()
    assert code == 0, err
    assert "llmchat: error" not in err
    records = _records(env.stdout.getvalue())
    assert [r["id"] for r in records] == list(range(1, 41))
    assert all(r["error"] is None and r["finish_reason"] != "error" for r in records)
    context = _context_lines(err)
    compacted = [line for line in context if COMPACTED.search(line)]
    # Each pass of the threshold is one notice: a compaction, or a failed one and its trim; nothing else.
    assert all(COMPACTED.search(line) or FAILED.search(line) for line in context), context
    assert len(context) >= 2 and compacted, context
    # The prompt shrinks exactly where a notice says the context was made room in.
    prompts = [r["stats"]["prompt_tokens"] for r in records]
    assert sum(1 for a, b in zip(prompts, prompts[1:]) if b < a) == len(context), prompts
    assert max(p + 8 for p in prompts) <= 2048
    stored = _stored(records[-1]["conversation_id"])
    assert [content for role, content in _originals(stored) if role == "user"] == lines
    assert [content for role, content in _originals(stored) if role == "assistant"] == [r["reply"] for r in records]
    assert len(_summaries(stored)) == len(compacted)


@pytest.mark.model  # `_run` loads SmolLM2 in this process; tests/conftest.py cannot see that through it
def test_a_failed_summary_falls_back_to_trimming_with_one_notice(isolated_home):
    # A summary cap so small that every summary is cut off: a real setting, not a test hook.
    _config(isolated_home, "compact_threshold = 0.3\ncompact_summary_tokens = 2\n")
    lines = [message(i) for i in range(8)]
    env = _env("".join(line + "\n" for line in lines))
    code = _run(["chat", "--ctx", "2048", "-n", "8", "--temperature", "0", "--json"], env)
    err = env.stderr.getvalue()
    assert code == 0, err
    context = _context_lines(err)
    assert context, err
    for line in context:  # one line each time: why it failed, and what was trimmed instead
        assert re.fullmatch(
            r"context: compaction failed: the summary was cut off at 2 tokens \(raise compact_summary_tokens in the "
            r"config\); dropped \d+ oldest messages \([\d,]+ tokens\) instead",
            line,
        ), line
    records = _records(env.stdout.getvalue())
    assert len(records) == 8 and all(r["error"] is None for r in records)
    assert all(r["stats"]["messages_dropped"] == 0 for r in records)  # trimmed before the turn, said once
    stored = _stored(records[-1]["conversation_id"])
    assert _summaries(stored) == [] and [c for r, c in _originals(stored) if r == "user"] == lines


@pytest.mark.model  # `_run` loads SmolLM2 in this process; tests/conftest.py cannot see that through it
def test_compact_off_trims_as_before(isolated_home):
    _config(isolated_home, "compact_threshold = 0.3\n")
    env = _env("".join(message(i) + "\n" for i in range(8)))
    assert _run(["chat", "--ctx", "512", "-n", "8", "--temperature", "0", "--json", "--compact", "off"], env) == 0
    context = _context_lines(env.stderr.getvalue())
    assert context and all(line.startswith("context: dropped") for line in context), context
    assert _summaries(_stored()) == []


@pytest.mark.model  # `_run` loads SmolLM2 in this process; tests/conftest.py cannot see that through it
def test_ask_continue_compacts_the_continued_conversation_and_resumes_from_the_summary(isolated_home):
    _config(isolated_home, "compact_threshold = 0.4\n")
    base = ["--ctx", "2048", "-n", "8", "--temperature", "0", "--json"]
    prompts, notices = [], []
    for i in range(9):
        env = _env()
        assert _run(["ask", *base, *(["-c"] if i else []), message(i)], env) == 0, env.stderr.getvalue()
        prompts.append(json.loads(env.stdout.getvalue())["stats"]["prompt_tokens"])
        notices.append(_context_lines(env.stderr.getvalue()))
    compacted_at = [i for i, lines in enumerate(notices) if lines]
    assert compacted_at, (prompts, notices)
    first = compacted_at[0]
    found = COMPACTED.search(notices[first][0])
    assert found is not None, notices[first]
    before, after = (int(found.group(n).replace(",", "")) for n in (4, 5))
    # The continued conversation was compacted before its turn: the turn's prompt is the one after.
    assert prompts[first] == after < before
    stored = _stored()
    assert len(_summaries(stored)) == len(compacted_at)
    assert [c for r, c in _originals(stored) if r == "user"] == [message(i) for i in range(9)]
    if first + 1 < len(prompts) and first + 1 not in compacted_at:
        # The next process rebuilds the context from the summary: it grows from there, not from the start.
        assert prompts[first + 1] < before


# --------------------------------------------------------------------------- a server


@pytest.fixture(scope="module")
def llama_server(smollm2_path, tmp_path_factory):
    server = harness.start_llama_server(smollm2_path, tmp_path_factory.mktemp("server-logs"), ctx=2048)
    yield server
    server.stop()


@pytest.mark.server
def test_automatic_compaction_through_a_server(isolated_home, llama_server):
    """The summary is one more generation through the same engine interface: here llama-server."""
    _config(isolated_home, "compact_threshold = 0.3\n")
    lines = [message(i) for i in range(7)]
    env = _env("".join(line + "\n" for line in lines))
    code = _run(["chat", "--server", llama_server.url, "-n", "8", "--temperature", "0", "--json"], env)
    err = env.stderr.getvalue()
    assert code == 0, err
    context = _context_lines(err)
    assert any(COMPACTED.search(line) for line in context), err
    records = _records(env.stdout.getvalue())
    assert len(records) == 7 and all(r["error"] is None for r in records)
    stored = _stored(records[-1]["conversation_id"])
    assert [c for r, c in _originals(stored) if r == "user"] == lines and len(_summaries(stored)) >= 1


# --------------------------------------------------------------------------- a real terminal


def test_compact_and_automatic_compaction_in_a_pseudo_terminal(isolated_home):
    import pexpect

    _config(isolated_home, "compact_threshold = 0.4\n")
    env = dict(
        os.environ,
        LLMCHAT_HOME=str(isolated_home),
        TERM="xterm-256color",
        PROMPT_TOOLKIT_NO_CPR="1",
        COLUMNS="100",
        LINES="30",
    )
    env.pop("LLMCHAT_MODEL", None)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "llmchat", "chat", "--ctx", "2048", "-n", "8", "--temperature", "0"],
        env=env,
        encoding="utf-8",
        codec_errors="replace",
        dimensions=(30, 100),
        timeout=300,
    )
    try:
        child.expect_exact("/help for commands")
        for i in range(4):
            child.expect_exact("> ")
            child.send(message(i) + ENTER)
            child.expect(r"prompt \d+ \(\d+ cached\)")
        child.expect_exact("> ")
        child.send("/compact keep the note numbers" + ENTER)
        child.expect(COMPACTED)
        # On until the threshold (40 % of 2,048) is passed again. A turn's notices follow its stats
        # line, so each is looked for in what came before the next prompt.
        for i in range(4, 14):
            child.expect_exact("> ")
            if "context: compacted" in child.before:
                break
            child.send(message(i) + ENTER)
            child.expect(r"prompt \d+ \(\d+ cached\)")
        else:
            pytest.fail("no automatic compaction in 10 more turns")
        child.send("/exit" + ENTER)
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert len(_summaries(_stored())) == 2
