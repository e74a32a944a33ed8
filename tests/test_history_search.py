"""Search over the history: the FTS5 index (migration m007_message_search), `llmchat history
search` as text and JSON, bad queries, privacy after `history rm`, and /search + /load in the chat
on a real terminal.

The conversations searched are written through the store, so every assertion is on known text;
the chat test only loads the model to run the chat, and never looks at what it writes.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
from pathlib import Path

import pytest

from llmchat.store import migrations
from llmchat.store.history import HistoryStore
from llmchat.store.migrations import MIGRATIONS

ENTER = "\r"
# Mixed case on purpose: FTS5's unicode61 tokenizer keeps its words lower case, so the lower-case
# form of a marker in the database's bytes is the index's copy, not the message's.
MARKER = "QuokkaMarker7731"
INDEX_FORM = MARKER.lower().encode()


def new_conversation(store: HistoryStore, name: str | None = None) -> str:
    return store.new_conversation(
        model="smollm2",
        model_path="/models/smollm2.gguf",
        template="chatml",
        system_prompt=None,
        sampling={},
        name=name,
    )


@pytest.fixture
def home(isolated_home: Path) -> Path:
    isolated_home.mkdir(parents=True, exist_ok=True)
    return isolated_home


@pytest.fixture
def seeded(home: Path) -> dict[str, str]:
    """Two conversations: 'zoo' with the word zebrafish in turn 1 (both sides) and turn 2 (the
    reply), and one without a name that mentions it once."""
    with HistoryStore.open(home / "history.db") as store:
        zoo = new_conversation(store, "zoo")
        store.add_turn(zoo, "Tell me about the zebrafish, don't lie.", "The zebrafish is small.\nIt regenerates.")
        store.add_turn(zoo, "And cats?", "Cats are not zebrafish.")
        other = new_conversation(store)
        store.add_turn(other, "What is tea?", "A drink, not a zebrafish.")
        store.add_turn(other, "Thanks", "You are welcome.")
    return {"zoo": zoo, "other": other}


# --------------------------------------------------------------------------- the command


def test_search_prints_the_conversation_the_turn_and_the_match_marked(cli, seeded):
    run = cli("history", "search", "zebrafish")
    assert run.returncode == 0, run.stderr
    header, *lines = run.stdout.splitlines()
    assert header.split() == ["ID", "Name", "Turn", "Role", "Match"]
    assert len(lines) == 4  # every message holding the word, none other
    assert all("**zebrafish**" in line.lower() for line in lines)  # the match marked on a pipe
    assert any(
        re.match(rf"{seeded['zoo']}\s+zoo\s+2\s+assistant\s+Cats are not \*\*zebrafish\*\*\.", line) for line in lines
    )
    assert any(
        re.match(rf"{seeded['zoo']}\s+zoo\s+1\s+user\s+Tell me about the \*\*zebrafish\*\*", line) for line in lines
    )
    assert any(
        re.match(rf"{seeded['other']}\s+1\s+assistant\s+A drink, not a \*\*zebrafish\*\*", line) for line in lines
    )


def test_search_json_prints_records_and_takes_a_limit(cli, seeded):
    run = cli("history", "search", "zebrafish", "--json")
    assert run.returncode == 0, run.stderr
    records = json.loads(run.stdout)
    assert len(records) == 4
    assert set(records[0]) == {
        "conversation_id", "conversation_name", "turn", "role", "message_id", "seq", "created_at", "snippet"
    }  # fmt: skip
    where = sorted((r["conversation_id"], r["conversation_name"], r["turn"], r["role"], r["seq"]) for r in records)
    zoo, other = seeded["zoo"], seeded["other"]
    assert where == sorted(
        [(zoo, "zoo", 1, "user", 0), (zoo, "zoo", 1, "assistant", 1), (zoo, "zoo", 2, "assistant", 3),
         (other, None, 1, "assistant", 1)]
    )  # fmt: skip
    reply = next(r for r in records if r["seq"] == 1 and r["conversation_id"] == zoo)
    assert reply["snippet"] == "The **zebrafish** is small. It regenerates."  # one line, the match marked

    limited = cli("history", "search", "zebrafish", "--json", "-n", "2")
    assert [r["message_id"] for r in json.loads(limited.stdout)] == [r["message_id"] for r in records[:2]]


def test_plain_words_match_as_written_and_fts5_syntax_works(cli, seeded):
    def hits(*query: str) -> list[tuple[str, int]]:
        run = cli("history", "search", "--json", *query)
        assert run.returncode == 0, run.stderr
        return sorted((r["conversation_id"], r["seq"]) for r in json.loads(run.stdout))

    zoo, other = seeded["zoo"], seeded["other"]
    assert hits("don't", "lie") == [(zoo, 0)]  # an apostrophe needs no quoting
    assert hits("zebra*") == hits("zebrafish")  # a prefix
    assert hits('"not a zebrafish"') == [(other, 1)]  # a phrase
    assert hits("cats", "OR", "tea") == [(zoo, 2), (zoo, 3), (other, 0)]
    assert hits("zebrafish", "NOT", "cats") == [(zoo, 0), (zoo, 1), (other, 1)]


@pytest.mark.parametrize("query", ['"zebrafish', "nosuchcolumn:zebrafish", "(zebrafish"])
def test_a_query_fts5_cannot_parse_is_one_line_and_exit_2(cli, seeded, query):
    run = cli("history", "search", query)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.startswith("llmchat: ") and run.stderr.count("\n") == 1, run.stderr
    assert "Traceback" not in run.stderr


def test_no_match_and_no_history(cli, home, seeded):
    run = cli("history", "search", "platypus")
    assert (run.returncode, run.stdout) == (0, "")
    assert "No saved message matches 'platypus'" in run.stderr
    assert json.loads(cli("history", "search", "platypus", "--json").stdout) == []
    (home / "history.db").unlink()
    for suffix in ("-wal", "-shm"):
        (home / f"history.db{suffix}").unlink(missing_ok=True)
    empty = cli("history", "search", "zebrafish", "--json")
    assert (empty.returncode, json.loads(empty.stdout)) == (0, [])
    assert not (home / "history.db").exists()  # searching creates nothing
    assert cli("history", "search", "--limit", "0", "x").returncode == 2


# --------------------------------------------------------------------------- the index


def test_the_migration_indexes_the_messages_of_an_older_database(tmp_path):
    """A database from before m007 (its messages written without any index) is searchable once
    the store opens it: the migration builds the index over what is there."""
    path = tmp_path / "history.db"
    before = [fn for fn in MIGRATIONS if fn.__name__ < "m007"]
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN")
    migrations.migrate(db, before)
    db.execute("INSERT INTO conversations (id, name, model, model_path, template, system_prompt, sampling_json,"
               " created_at, updated_at) VALUES ('01old', 'old', 'm', '/m.gguf', 'chatml', NULL, '{}', 't0', 't0')")  # fmt: skip
    db.executemany(
        "INSERT INTO messages (conversation_id, seq, role, content, created_at) VALUES ('01old', ?, ?, ?, 't0')",
        [(0, "user", "An old question about narwhals"), (1, "assistant", "Narwhals have a tusk.")],
    )
    db.execute("COMMIT")
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'messages_fts'").fetchone() is None
    db.close()

    with HistoryStore.open(path) as store:
        hits = store.search("narwhals")
        assert sorted((hit.conversation_id, hit.seq, hit.turn) for hit in hits) == [("01old", 0, 1), ("01old", 1, 1)]
        store._db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
    applied = {row[0] for row in sqlite3.connect(path).execute("SELECT name FROM _migrations")}
    assert "m007_message_search" in applied


def test_the_index_follows_every_write_and_delete(tmp_path):
    with HistoryStore.open(tmp_path / "history.db") as store:
        first = new_conversation(store)
        store.add_turn(first, "walrus one", "reply one")
        store.add_turn(first, "walrus two", "reply two")
        branch = store.fork(first, 1)  # a copy of turn 1: found twice
        assert sorted(hit.conversation_id for hit in store.search("walrus")) == sorted([first, first, branch])
        store.delete_last_exchange(first)  # /undo
        assert sorted((hit.conversation_id, hit.seq) for hit in store.search("walrus")) == sorted(
            [(first, 0), (branch, 0)]
        )
        store.delete(branch)
        assert [(hit.conversation_id, hit.seq) for hit in store.search("walrus")] == [(first, 0)]
        store.delete_all()
        assert store.search("walrus") == []
        store._db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")


# --------------------------------------------------------------------------- a SQLite without FTS5

INDEX_TRIGGERS = {"messages_fts_insert", "messages_fts_delete", "messages_fts_update"}


def triggers(path: Path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    finally:
        db.close()


def test_without_fts5_the_history_works_and_search_says_why(tmp_path, monkeypatch):
    """A SQLite built without FTS5 (tests/sqlite_without_fts5.py) made migration m007 fail, and
    with it every open of the history. Now everything but search works, and search says why."""
    from sqlite_without_fts5 import install

    from llmchat.errors import HistoryError
    from llmchat.store import search

    install(monkeypatch)
    path = tmp_path / "history.db"
    with HistoryStore.open(path) as store:
        first = new_conversation(store, "no-index")
        store.add_turn(first, "Tell me about the axolotl.", "The axolotl keeps its gills.")
        store.add_turn(first, "And the newt?", "The newt does not.")
        branch = store.fork(first, 1)
        assert store.delete_last_exchange(first) == 2  # /undo
        assert [m.content for m in store.get("no-index").messages] == [
            "Tell me about the axolotl.",
            "The axolotl keeps its gills.",
        ]
        store.delete(branch)
        with pytest.raises(
            search.SearchUnavailable,
            match=r"^cannot search: this Python's SQLite \(.*\) lacks FTS5, which search needs",
        ):
            store.search("axolotl")
        assert issubclass(search.SearchUnavailable, HistoryError)  # the chat says it in one line and goes on
    with HistoryStore.open(path) as store:  # opened again: still no index, still working
        assert [c.id for c in store.list_conversations()] == [first]
    assert triggers(path) == set()


def test_a_history_written_without_fts5_gets_its_index_where_fts5_is(tmp_path, monkeypatch):
    from sqlite_without_fts5 import install

    path = tmp_path / "history.db"
    with monkeypatch.context() as without:
        install(without)
        with HistoryStore.open(path) as store:
            written = new_conversation(store)
            store.add_turn(written, "A capybara question", "Capybaras are rodents.")
    with HistoryStore.open(path) as store:  # this SQLite has FTS5: the index is built over what is there
        hits = store.search("capybara*")
        assert sorted((hit.conversation_id, hit.seq) for hit in hits) == [(written, 0), (written, 1)]
        store.add_turn(written, "More capybara", "Still rodents.")  # and kept in step from now on
        assert len(store.search("capybara*")) == 3
        store._db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
    assert triggers(path) == INDEX_TRIGGERS


def test_an_indexed_history_opened_without_fts5_drops_its_triggers_and_is_reindexed_later(tmp_path, monkeypatch):
    """The other way round: a history made where FTS5 was, opened where it is not. Its triggers
    would write into the index with every saved message, which such a SQLite refuses, so they
    go; where FTS5 is there again, the index is rebuilt from the messages as they are by then."""
    from sqlite_without_fts5 import install

    path = tmp_path / "history.db"
    with HistoryStore.open(path) as store:
        kept = new_conversation(store)
        store.add_turn(kept, "The pangolin first", "Scales.")
        doomed = new_conversation(store)
        store.add_turn(doomed, "A pangolin to forget", "Gone.")
    with monkeypatch.context() as without:
        install(without)
        with HistoryStore.open(path) as store:
            assert triggers(path) == set()
            store.add_turn(kept, "The pangolin again", "More scales.")
            store.delete(doomed)
    with HistoryStore.open(path) as store:
        hits = sorted((hit.conversation_id, hit.seq) for hit in store.search("pangolin"))
        assert hits == [(kept, 0), (kept, 2)]  # what was saved meanwhile is found, the deleted is not
        store._db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
    assert triggers(path) == INDEX_TRIGGERS


def test_history_search_without_fts5_is_one_line_and_exit_1(cli, seeded, home, tmp_path):
    """`history search` on a Python whose SQLite lacks FTS5 (a real `python -m llmchat` run, its
    sqlite3 replaced at start-up by a sitecustomize): one line saying why, exit 1; the rest of
    `history` works."""
    from shims import sitecustomize_env
    from sqlite_without_fts5 import SITECUSTOMIZE

    env = sitecustomize_env(tmp_path / "shim", SITECUSTOMIZE)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(Path(__file__).parent)])
    run = cli("history", "search", "zebrafish", env=env)
    assert (run.returncode, run.stdout) == (1, "")
    assert run.stderr.startswith("llmchat: error: cannot search: this Python's SQLite (")
    assert run.stderr.count("\n") == 1 and "lacks FTS5" in run.stderr and "Traceback" not in run.stderr
    listed = cli("history", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert sorted(c["id"] for c in json.loads(listed.stdout)) == sorted(seeded.values())


# --------------------------------------------------------------------------- privacy


def database_bytes(home: Path) -> bytes:
    """The database file and its write-ahead log, as they are on disk."""
    files = [home / "history.db", home / "history.db-wal"]
    return b"".join(path.read_bytes() for path in files if path.exists())


def test_rm_leaves_no_word_of_the_conversation_in_the_index(cli, home):
    with HistoryStore.open(home / "history.db") as store:
        kept = new_conversation(store)
        store.add_turn(kept, "KeepMe4417 what is tea?", "A drink.")
        doomed = new_conversation(store)
        store.add_turn(doomed, f"My secret is {MARKER}, keep it.", f"I will not repeat {MARKER}.")
        store.add_turn(doomed, "Anything else?", "No.")
        assert [hit.conversation_id for hit in store.search(MARKER)] == [doomed, doomed]
    # The lower-case form is the index's own copy: it is there before the rm, and only the index has it.
    assert INDEX_FORM in database_bytes(home)

    removed = cli("history", "rm", doomed, "--yes")
    assert removed.returncode == 0, removed.stderr
    on_disk = database_bytes(home)
    assert MARKER.encode() not in on_disk and INDEX_FORM not in on_disk
    assert b"keepme4417" in on_disk  # the other conversation is still indexed
    found = json.loads(cli("history", "search", "keepme4417", "--json").stdout)
    assert [record["conversation_id"] for record in found] == [kept]
    assert json.loads(cli("history", "search", MARKER, "--json").stdout) == []


def test_undo_takes_the_words_out_of_the_index(home):
    with HistoryStore.open(home / "history.db") as store:
        conversation = new_conversation(store)
        store.add_turn(conversation, "hello", "hi")
        store.add_turn(conversation, f"oops {MARKER}", "noted")
        assert store.delete_last_exchange(conversation) == 2
        store._truncate_wal()
    assert INDEX_FORM not in database_bytes(home) and MARKER.encode() not in database_bytes(home)


# --------------------------------------------------------------------------- in the chat


def test_search_and_load_in_the_chat_on_a_terminal(home, seeded, smollm2_path):
    import pexpect

    env = dict(os.environ, TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1", COLUMNS="140", LINES="30")
    env.pop("LLMCHAT_MODEL", None)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "llmchat", "chat", "-m", str(smollm2_path), "--temperature", "0", "--max-tokens", "8"],
        env=env,
        encoding="utf-8",
        codec_errors="replace",
        dimensions=(30, 140),
        timeout=180,
    )
    try:
        child.expect_exact("/help for commands")
        child.expect_exact("> ")
        child.send("/search regenerates" + ENTER)
        child.expect_exact("/load ID opens a conversation")
        screen = plain(child.before)
        assert re.search(rf"{seeded['zoo']}\s+zoo\s+1\s+assistant\s+The zebrafish is small\. It regenerates\.", screen)
        assert seeded["other"] not in screen
        assert "\x1b[1;35mregenerates\x1b[0m" in child.before  # highlighted, not marked with **
        child.expect_exact("> ")
        child.send('/search "zebra' + ENTER)
        # [^\r\n]*, not .*: a greedy match would also swallow the prompt drawn after the error
        child.expect(r"error: cannot search for [^\r\n]*\r\n")
        child.expect_exact("> ")
        child.send("/search platypus" + ENTER)
        child.expect_exact("no saved message matches 'platypus'")
        child.expect_exact("> ")
        child.send(f"/load {seeded['zoo'][:12]}" + ENTER)
        child.expect_exact(f"loaded 'zoo' ({seeded['zoo']}): 4 messages")
        child.expect_exact("last message: 'And cats?'")
        child.expect_exact("> ")
        child.send("/exit" + ENTER)
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)


def plain(raw: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[78=>]|\r", "", raw)
