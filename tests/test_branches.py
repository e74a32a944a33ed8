"""Edits and branches: /edit, /branch N, `history fork ID --at N`, the tree in history list/show,
`ask -c --cid` on a branch, and the shared prefix reused from the KV cache (in memory and on disk)."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys

import pytest
from prompt_toolkit.application import create_app_session
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from llmchat.errors import UsageError
from llmchat.store.history import HistoryStore
from llmchat.store.migrations import MIGRATIONS
from llmchat.turn.attachments import compose, from_bytes
from llmchat.turn.branches import draw_tree

ENTER = "\r"
CTRL_D = "\x04"


def _conversation(store: HistoryStore, turns: int, *, files=()) -> str:
    cid = store.new_conversation(model="m", model_path="/m", template="t", system_prompt="Be brief.", sampling={})
    for turn in range(1, turns + 1):
        attached = files if turn == 1 else ()
        store.add_turn(cid, compose(attached, f"question {turn}"), f"answer {turn}", attachments=attached)
    return cid


# --------------------------------------------------------------------------- the store


def test_fork_copies_the_shared_turns_with_their_files(tmp_path):
    note = from_bytes("n.txt", b"note\n")
    with HistoryStore.open(tmp_path / "h.db") as store:
        parent = _conversation(store, 4, files=(note,))
        branch = store.fork(parent, 2, name="other way")
        conv = store.get("other way")
        assert conv.id == branch and (conv.parent_id, conv.branch_at) == (parent, 2)
        assert conv.system_prompt == "Be brief."
        assert [m.typed or m.content for m in conv.messages] == ["question 1", "answer 1", "question 2", "answer 2"]
        assert conv.messages[0].content == compose((note,), "question 1") and conv.messages[0].attachments
        assert store.get(parent).children == [(branch, 2)]
        store.add_turn(branch, "question 3b", "answer 3b")
        assert len(store.get(parent).messages) == 8, "the parent keeps its own turns"
        with pytest.raises(UsageError, match="has 4 turns; the branch point must be 0..4"):
            store.fork(parent, 5)
        nested = store.fork(branch, 3)
        family = store.family(nested)
        assert [m.id for m in family] == [parent, branch, nested]
        lines = draw_tree(family, current=branch)
        assert lines[0].startswith(parent) and "4 turns" in lines[0]
        assert re.match(rf"└─ {branch} \(other way\) · 3 turns · branch at turn 2 · .*<- this one$", lines[1])
        assert lines[2].startswith(f"   └─ {nested} · 3 turns · branch at turn 3")
        listed = {s.id: s for s in store.list_conversations()}
        assert (listed[branch].parent_id, listed[branch].branch_at, listed[parent].children) == (parent, 2, 1)
        store.delete(parent)  # its branches stay whole, no longer linked
        assert store.get(branch).parent_id is None and len(store.get(branch).messages) == 6
        db = sqlite3.connect(tmp_path / "h.db")
        assert db.execute("SELECT COUNT(*) FROM attachments").fetchone() == (2,)  # the two branches' copies
        db.close()
    assert "m005_branches" in [fn.__name__ for fn in MIGRATIONS]


def test_a_tool_turn_counts_as_one_turn_in_the_tree(tmp_path):
    """A turn with tools stores its calls and results as messages between the question and the
    answer: the tree counts turns by their user messages, and a fork point counts the same way."""
    from llmchat.tools.prompt import assistant_tool_calls, tool_result

    with HistoryStore.open(tmp_path / "h.db") as store:
        cid = store.new_conversation(model="m", model_path="/m", template="t", system_prompt=None, sampling={})
        calls = assistant_tool_calls([("record_city", {"city": "Paris"})])
        store.add_turn(cid, "Weather in Paris?", "Sunny.", tool_messages=[calls, tool_result(0, "record_city", "21 C")])
        store.add_turn(cid, "And tomorrow?", "Rain.")
        branch = store.fork(cid, 1)
        family = store.family(cid)
        assert [member.n_messages for member in family] == [6, 4]
        lines = draw_tree(family)
        assert "· 2 turns ·" in lines[0]
        assert re.match(rf"└─ {branch} · 1 turn · branch at turn 1 · ", lines[1])


def test_history_fork_command(cli, isolated_home):
    with HistoryStore.open() as store:
        parent = _conversation(store, 3)
    result = cli("history", "fork", parent[:8], "--at", "1")
    assert result.returncode == 0, result.stderr
    branch = result.stdout.strip()
    shown = cli("history", "show", branch).stdout
    assert f"**Branch of:** `{parent}` at turn 1" in shown and "## Branches" in shown
    assert f"{parent} · 3 turns" in shown and f"└─ {branch} · 1 turn · branch at turn 1" in shown
    listed = cli("history", "list").stdout
    assert f"{parent} @1" in listed
    bad = cli("history", "fork", parent, "--at", "7")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "0..3" in bad.stderr


# --------------------------------------------------------------------------- the chat, in-process


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import load_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMCHAT_HOME", str(tmp_path_factory.mktemp("load-home")))
        result = load_model(
            RunOptions(ctx=2048, temperature=0.0, seed=1, max_tokens=12), config=load_config(), announce=False
        )
    yield result
    result.engine.close()


def _session(loaded):
    from llmchat.turn.session import ChatSession

    return ChatSession.start(
        loaded.engine, sampling=loaded.sampling, model_label=loaded.model.name, history=HistoryStore.open()
    )


def _drive(session, keys):
    from llmchat.ui.chat import run_interactive

    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        pipe.send_text(ENTER.join(keys) + ENTER + CTRL_D)
        run_interactive(session, show_stats=False, markdown=False, verbose=False)


def test_branch_in_chat_reuses_the_shared_turns_from_memory(loaded, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # /show's table on one line per row
    session = _session(loaded)
    try:
        _drive(session, ["Name a fruit.", "Name a colour.", "Name an animal."])
        parent = session.conversation_id
        shared = session.tokenize_messages(session.conversation.prompt_messages()[:4], add_generation_prompt=False)
        _drive(session, ["/branch 9", "/branch 2", "/show", "Name a planet."])
        out, err = capsys.readouterr()
        assert f"branch of {parent}" in out and "shares turns 1..2; saved with its first reply" in out
        assert "this conversation has 3 turns; /branch N takes 0..3" in err
        assert f"new branch of {parent} sharing turns 1..2" in err
        branch = session.conversation_id
        assert branch != parent
        stats = session.last_result.stats
        assert stats.cached_tokens >= len(shared), (stats.cached_tokens, len(shared))
        stored = session.history.get(branch)
        assert (stored.parent_id, stored.branch_at) == (parent, 2)
        assert [m.content for m in stored.messages if m.role == "user"] == [
            "Name a fruit.",
            "Name a colour.",
            "Name a planet.",
        ]
        assert len(session.history.get(parent).messages) == 6
    finally:
        session.history.close()


def test_edit_puts_the_last_message_back_and_keeps_the_old_exchange(loaded, capsys):
    session = _session(loaded)
    try:
        _drive(session, ["Name a fruit.", "Name a colour."])
        parent = session.conversation_id
        # /edit puts "Name a colour." back at the prompt; typing adds to it, Enter sends.
        _drive(session, ["/edit" + ENTER + " Just one word."])
        err = capsys.readouterr().err
        assert f"the old exchange stays in {parent}" in err
        branch = session.history.get(session.conversation_id)
        assert (branch.parent_id, branch.branch_at) == (parent, 1)
        assert [m.content for m in branch.messages if m.role == "user"] == [
            "Name a fruit.",
            "Name a colour. Just one word.",
        ]
        old = session.history.get(parent)
        assert [m.content for m in old.messages if m.role == "user"] == ["Name a fruit.", "Name a colour."]
        # /undo removes the branch's own turn; /edit then puts turn 1 back, and leaving (Ctrl-C clears
        # the line, Ctrl-D exits) saves nothing more: no branch is created before its first reply.
        _drive(session, ["/undo", "/edit" + ENTER + "\x03"])
        assert len(session.history.get(branch.id).messages) == 2
        assert len(session.history.list_conversations()) == 2
    finally:
        session.history.close()


# --------------------------------------------------------------------------- a real terminal


def _spawn(home, *args):
    import pexpect

    env = dict(os.environ, LLMCHAT_HOME=str(home), TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1")
    env.pop("LLMCHAT_MODEL", None)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "llmchat", *args],
        env=env,
        encoding="utf-8",
        codec_errors="replace",
        dimensions=(30, 120),
        timeout=180,
    )
    return pexpect, child


def test_file_edit_and_branch_in_a_pseudo_terminal(isolated_home, tmp_path, cli):
    notes = tmp_path / "notes.txt"
    notes.write_text("The meeting is on Tuesday at noon in room 4.\n")
    pexpect, child = _spawn(isolated_home, "chat", "--temperature", "0", "--max-tokens", "12")
    try:
        child.expect_exact("> ")
        child.send(f"/file {notes}" + ENTER)
        child.expect(r"notes\.txt: (\d+) tokens \((\d+)% of the context\)")
        assert int(child.match.group(1)) > 10
        child.expect_exact("> ")
        child.send("When is the meeting?" + ENTER)
        child.expect(r"prompt \d+ \(\d+ cached\)")
        for question in ("Where is it?", "Who comes?"):
            child.expect_exact("> ")
            child.send(question + ENTER)
            child.expect(r"prompt \d+ \(\d+ cached\)")
        child.expect_exact("> ")
        child.send("/edit" + ENTER)
        child.expect_exact("editing turn 3")
        child.expect_exact("Who comes?")  # back at the prompt
        child.send(" Answer briefly." + ENTER)
        child.expect(r"prompt \d+ \(\d+ cached\)")
        child.expect_exact("> ")
        child.send("/branch 2" + ENTER)
        child.expect_exact("sharing turns 1..2")
        child.expect_exact("> ")
        child.send("What should I bring?" + ENTER)
        child.expect(r"prompt \d+ \((\d+) cached\)")
        child.expect_exact("> ")
        child.send("/exit" + ENTER)
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0

    conversations = json.loads(cli("history", "list", "--json").stdout)
    assert len(conversations) == 3
    root = next(c for c in conversations if c["parent_id"] is None)
    edited = next(c for c in conversations if c["parent_id"] == root["id"])  # /edit of turn 3
    branched = next(c for c in conversations if c["parent_id"] == edited["id"])  # /branch 2 of that
    assert (edited["branch_at"], edited["n_messages"], root["children"], root["n_messages"]) == (2, 6, 1, 6)
    assert (branched["branch_at"], branched["n_messages"]) == (2, 6)
    shown = cli("history", "show", edited["id"]).stdout
    tree = shown.split("## Branches", 1)[1]
    assert root["id"] in tree and f"└─ {edited['id']}" in tree and f"└─ {branched['id']}" in tree
    assert "📎 attached" in shown and "notes.txt" in shown  # the file came along into the branch

    cont = cli("ask", "-c", "--cid", branched["id"], "--json", "-n", "8", "--temperature", "0", "And when?")
    assert cont.returncode == 0, cont.stderr
    record = json.loads(cont.stdout)
    assert record["conversation_id"] == branched["id"]
    stored = json.loads(cli("history", "show", branched["id"], "--json").stdout)
    assert [m["content"] for m in stored["messages"] if m["role"] == "user"][-2:] == [
        "What should I bring?",
        "And when?",
    ]


# --------------------------------------------------------------------------- the disk cache


@pytest.mark.parametrize("at", [4])
def test_a_branch_in_a_new_process_restores_the_shared_turns_from_disk(cli, isolated_home, smollm2_path, at):
    questions = [f"Give me one word about the number {n}." for n in range(1, 11)]
    made = cli(
        "chat", "-m", str(smollm2_path), "--temperature", "0", "-n", "16", "--json",
        input="\n".join(questions) + "\n",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    parent = json.loads(made.stdout.splitlines()[-1])["conversation_id"]
    branch = cli("history", "fork", parent, "--at", str(at)).stdout.strip()

    # The tokens of turns 1..N, as this model renders them.
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session

    session = start_session(
        RunOptions(model=str(smollm2_path)), config=load_config(), overflow="drop", with_history=True
    )
    try:
        session.load_conversation(session.history.get(branch))
        shared = session.context_used()
    finally:
        session.close()

    result = cli("ask", "-m", str(smollm2_path), "-c", "--cid", branch, "--json", "-n", "8", "A new question?")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)["stats"]
    assert stats["disk_cached_tokens"] >= shared > 100, (stats, shared)
    assert stats["prompt_tokens"] - stats["cached_tokens"] < 40  # only the new message is prefilled


def test_edit_of_a_loaded_message_gives_back_its_typed_words_and_files(tmp_path):
    """After /load or --resume the message holds the files' text; /edit takes them from the history."""
    from types import SimpleNamespace

    from llmchat.turn.branches import last_user_turn
    from llmchat.turn.conversation import Conversation

    note = from_bytes("n.txt", b"note\n")
    with HistoryStore.open(tmp_path / "h.db") as store:
        cid = _conversation(store, 1)
        store.add_turn(cid, compose((note,), "question 2"), "answer 2", attachments=(note,))
        stored = store.get(cid)
        conversation = Conversation(messages=[{"role": m.role, "content": m.content} for m in stored.messages])
        session = SimpleNamespace(conversation=conversation, conversation_id=cid, fork_from=None, history=store)
        assert last_user_turn(session) == ("question 2", (note,))
        session.conversation_id, session.fork_from = None, (cid, 2)  # a branch not saved yet
        assert last_user_turn(session) == ("question 2", (note,))
