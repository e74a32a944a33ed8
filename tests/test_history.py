"""The conversation store (llmchat/store/) and the `llmchat history` commands."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from llmchat.errors import HistoryError, LlmchatError, UsageError
from llmchat.store import migrations, queries
from llmchat.store.db_errors import HistoryUnavailable
from llmchat.store.export import export_json, export_markdown
from llmchat.store.history import HistoryStore, open_or_warn
from llmchat.store.migrations import MIGRATIONS

REPO_ROOT = Path(__file__).resolve().parents[1]
SUBPROCESS_TIMEOUT_S = 120  # only a guard against a hung child, never an assertion


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "history.db"


@pytest.fixture
def store(db_path: Path):
    with HistoryStore.open(db_path) as opened:
        yield opened


def new_conversation(store: HistoryStore, **overrides) -> str:
    fields = dict(
        model="smollm2-135m",
        model_path="/models/smollm2.gguf",
        template="chatml",
        system_prompt="You are terse.",
        sampling={"temperature": 0.7, "top_p": 0.9, "seed": 42},
    )
    fields.update(overrides)
    return store.new_conversation(**fields)


def raw_connection(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def subprocess_env(home: Path) -> dict[str, str]:
    env = dict(os.environ, LLMCHAT_HOME=str(home))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


# --------------------------------------------------------------------------- schema and migrations


def test_open_creates_parent_dirs_schema_and_wal(tmp_path: Path):
    path = tmp_path / "deep" / "er" / "history.db"
    HistoryStore.open(path).close()

    db = raw_connection(path)
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"conversations", "messages", "_migrations"} <= tables
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    applied = [row[0] for row in db.execute("SELECT name FROM _migrations ORDER BY rowid")]
    assert applied == [fn.__name__ for fn in MIGRATIONS]


def test_reopen_is_idempotent_and_keeps_data(db_path: Path):
    with HistoryStore.open(db_path) as store:
        cid = new_conversation(store)
        store.add_turn(cid, "hi", "hello")
    with HistoryStore.open(db_path) as store:
        assert len(store.get(cid).messages) == 2

    applied = [row[0] for row in raw_connection(db_path).execute("SELECT name FROM _migrations")]
    assert sorted(applied) == sorted(fn.__name__ for fn in MIGRATIONS)  # each recorded once


def test_database_at_older_schema_version_is_migrated(db_path: Path):
    # Build the database an older llmchat would have left: only the first migration applied.
    db = raw_connection(db_path)
    db.execute("BEGIN")
    assert migrations.migrate(db, MIGRATIONS[:1]) == [MIGRATIONS[0].__name__]
    db.execute("INSERT INTO conversations VALUES ('01old', 'kept', 'm', '/m.gguf', 'chatml', NULL, '{}', 't0', 't0')")
    db.execute("COMMIT")
    db.close()

    with HistoryStore.open(db_path) as store:
        assert store.get("kept").id == "01old"

    db = raw_connection(db_path)
    applied = {row[0] for row in db.execute("SELECT name FROM _migrations")}
    assert applied == {fn.__name__ for fn in MIGRATIONS}
    indexes = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "messages_conversation_seq" in indexes


def test_failing_migration_rolls_back_entirely(db_path: Path, monkeypatch):
    HistoryStore.open(db_path).close()

    def m999_half_done(db):
        db.execute("CREATE TABLE half_done (x)")
        raise sqlite3.OperationalError("simulated failure")

    monkeypatch.setattr(migrations, "MIGRATIONS", [*MIGRATIONS, m999_half_done])
    with pytest.raises(HistoryError):
        HistoryStore.open(db_path)

    db = raw_connection(db_path)
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'half_done'").fetchone() is None
    assert db.execute("SELECT 1 FROM _migrations WHERE name = 'm999_half_done'").fetchone() is None


# --------------------------------------------------------------------------- writing and reading


def test_conversation_round_trip(store: HistoryStore):
    cid = new_conversation(store, name="trip")
    store.add_turn(
        cid, "What is 2+2?", "4", finish_reason="stop", stats={"tokens": 1, "tps": 33.3}, sampling={"temperature": 0.1}
    )

    conv = store.get(cid)
    assert (conv.id, conv.name, conv.model, conv.model_path, conv.template) == (
        cid,
        "trip",
        "smollm2-135m",
        "/models/smollm2.gguf",
        "chatml",
    )
    assert conv.sampling == {"temperature": 0.7, "top_p": 0.9, "seed": 42}
    user, assistant = conv.messages
    assert (user.role, user.content, user.seq) == ("user", "What is 2+2?", 0)
    assert (assistant.role, assistant.content, assistant.seq) == ("assistant", "4", 1)
    assert assistant.finish_reason == "stop"
    assert assistant.stats == {"tokens": 1, "tps": 33.3}
    assert assistant.sampling == {"temperature": 0.1}
    assert user.stats == {} and not user.interrupted


def test_timestamps_are_iso8601_utc(store: HistoryStore):
    cid = new_conversation(store)
    store.add_turn(cid, "a", "b")
    conv = store.get(cid)
    for stamp in [conv.created_at, conv.updated_at, *(m.created_at for m in conv.messages)]:
        assert datetime.fromisoformat(stamp).utcoffset() == timedelta(0)


def test_ids_are_short_unique_and_sortable(store: HistoryStore):
    ids = [new_conversation(store) for _ in range(20)]
    assert len(set(ids)) == 20
    assert all(len(i) == 18 and i.isalnum() and i == i.lower() for i in ids)
    assert [i[:10] for i in ids] == sorted(i[:10] for i in ids)  # the time part never goes backwards


def test_interrupted_flag_round_trips(store: HistoryStore):
    cid = new_conversation(store)
    store.add_turn(cid, "tell me a story", "Once upon a", interrupted=True, finish_reason="interrupted")
    store.add_turn(cid, "go on", "the end", interrupted=False)

    flags = [(m.role, m.interrupted) for m in store.get(cid).messages]
    assert flags == [("user", False), ("assistant", True), ("user", False), ("assistant", False)]


def test_add_message_appends_in_sequence(store: HistoryStore):
    cid = new_conversation(store)
    first = store.add_message(cid, role="user", content="one")
    second = store.add_message(cid, role="assistant", content="two", stats={"tokens": 1})
    assert second > first
    assert [(m.seq, m.content) for m in store.get(cid).messages] == [(0, "one"), (1, "two")]


def test_add_message_rejects_unknown_role(store: HistoryStore):
    cid = new_conversation(store)
    with pytest.raises(ValueError):
        store.add_message(cid, role="function", content="x")
    assert store.get(cid).messages == []


def test_add_turn_is_one_transaction(store: HistoryStore, monkeypatch):
    cid = new_conversation(store)
    real_insert = queries.insert_message
    calls = []

    def fail_on_the_reply(db, conversation_id, seq, message, now):
        calls.append(message.role)
        if message.role == "assistant":
            raise sqlite3.OperationalError("disk I/O error")
        return real_insert(db, conversation_id, seq, message, now)

    monkeypatch.setattr(queries, "insert_message", fail_on_the_reply)
    with pytest.raises(HistoryError):
        store.add_turn(cid, "question", "answer")
    monkeypatch.undo()

    assert calls == ["user", "assistant"]
    assert store.get(cid).messages == []  # the user row went with the failed reply


def test_writing_to_a_missing_conversation_fails_clearly(store: HistoryStore):
    with pytest.raises(HistoryError, match="nope"):
        store.add_turn("nope", "a", "b")


def test_update_system_prompt_and_rename(store: HistoryStore):
    cid = new_conversation(store)
    store.update_system_prompt(cid, "Speak like a pirate.")
    store.rename(cid, "pirate")
    conv = store.get("pirate")
    assert (conv.id, conv.system_prompt) == (cid, "Speak like a pirate.")
    store.update_system_prompt(cid, None)
    assert store.get(cid).system_prompt is None


def test_names_must_be_unique_and_not_reserved(store: HistoryStore):
    first = new_conversation(store, name="work")
    second = new_conversation(store)
    with pytest.raises(UsageError, match="already used"):
        store.rename(second, "work")
    with pytest.raises(UsageError, match="already used"):
        new_conversation(store, name="work")
    with pytest.raises(UsageError, match="reserved"):
        store.rename(second, "last")
    store.rename(first, "work")  # renaming to its own name is fine


def test_delete_last_exchange(store: HistoryStore):
    cid = new_conversation(store)
    store.add_turn(cid, "q1", "a1")
    store.add_turn(cid, "q2", "a2")
    assert store.delete_last_exchange(cid) == 2
    assert [m.content for m in store.get(cid).messages] == ["q1", "a1"]

    store.add_message(cid, role="user", content="unanswered")
    assert store.delete_last_exchange(cid) == 1
    assert store.delete_last_exchange(cid) == 2
    assert store.delete_last_exchange(cid) == 0

    store.add_turn(cid, "again", "reply")  # positions are reused cleanly after an undo
    assert [m.seq for m in store.get(cid).messages] == [0, 1]


def test_list_conversations(store: HistoryStore):
    older = new_conversation(store)
    store.add_turn(older, "first question\nwith a second line", "a")
    newer = new_conversation(store, name="newer")
    store.add_turn(newer, "x" * 200, "a")
    store.add_turn(newer, "another", "b")

    summaries = store.list_conversations()
    assert [s.id for s in summaries] == [newer, older]
    assert [s.n_messages for s in summaries] == [4, 2]
    assert summaries[0].name == "newer"
    assert summaries[1].preview == "first question with a second line"
    assert len(summaries[0].preview) <= queries.PREVIEW_CHARS
    assert [s.id for s in store.list_conversations(limit=1)] == [newer]

    store.add_turn(older, "bump", "it")  # a new turn makes it the latest
    assert store.list_conversations()[0].id == older


def test_get_by_prefix_name_and_last(store: HistoryStore):
    assert store.list_conversations(limit=1) == []
    first = new_conversation(store, name="alpha")
    second = new_conversation(store)

    assert [s.id for s in store.list_conversations(limit=1)] == [second]
    assert store.get("last").id == second
    assert store.get("alpha").id == first
    assert store.get(first.upper()).id == first
    unique = next(n for n in range(1, 19) if first[:n] != second[:n])
    assert store.get(first[:unique]).id == first


def test_get_reports_ambiguous_and_unknown_references(store: HistoryStore):
    with pytest.raises(UsageError, match="no conversations"):
        store.get("last")
    first, second = new_conversation(store), new_conversation(store)
    common = os.path.commonprefix([first, second])
    assert common  # created a moment apart, so they share the leading time digits
    with pytest.raises(UsageError, match="several"):
        store.get(common)
    with pytest.raises(UsageError, match="no conversation matches"):
        store.get("zzzz-not-there")
    with pytest.raises(UsageError):
        store.get("  ")


def test_delete_removes_the_conversation_and_its_messages(store: HistoryStore, db_path: Path):
    cid = new_conversation(store, name="doomed")
    store.add_turn(cid, "a", "b")
    keep = new_conversation(store)
    store.add_turn(keep, "c", "d")

    store.delete("doomed")

    with pytest.raises(UsageError):
        store.get(cid)
    db = raw_connection(db_path)
    assert db.execute("SELECT COUNT(*) FROM messages WHERE conversation_id = ?", (cid,)).fetchone()[0] == 0
    assert len(store.get(keep).messages) == 2


def test_store_can_be_used_from_another_thread(store: HistoryStore):
    cid = new_conversation(store)
    worker = threading.Thread(target=store.add_turn, args=(cid, "from", "a thread"))
    worker.start()
    worker.join()
    assert len(store.get(cid).messages) == 2


# --------------------------------------------------------------------------- exporters


def test_export_json_is_one_complete_object(store: HistoryStore):
    cid = new_conversation(store, name="exp")
    store.add_turn(cid, "héllo", "wörld", interrupted=True, stats={"tokens": 2})
    document = json.loads(export_json(store.get(cid)))
    assert document["format"] == "llmchat-conversation"
    assert (document["id"], document["name"], document["template"]) == (cid, "exp", "chatml")
    assert document["sampling"]["seed"] == 42
    assert [m["content"] for m in document["messages"]] == ["héllo", "wörld"]
    assert document["messages"][1]["interrupted"] is True
    assert document["messages"][1]["stats"] == {"tokens": 2}


def test_export_markdown_is_a_readable_transcript(store: HistoryStore):
    cid = new_conversation(store)
    store.add_turn(cid, "Question one", "Answer one", finish_reason="stop", stats={"tokens": 2})
    store.add_turn(cid, "Question two", "Answer t", interrupted=True)
    text = export_markdown(store.get(cid))

    assert text.startswith("# ")
    for expected in [
        "smollm2-135m",
        "/models/smollm2.gguf",
        "chatml",
        "temperature=0.7",
        "You are terse.",
        "## User",
        "## Assistant",
        "Question one",
        "Answer one",
        "finish_reason=stop",
    ]:
        assert expected in text
    assert text.count("[interrupted]") == 1
    assert text.index("Answer t") < text.index("[interrupted]")


# --------------------------------------------------------------------------- bad databases


def test_random_bytes_are_reported_as_unreadable(db_path: Path):
    db_path.write_bytes(os.urandom(8192))
    with pytest.raises(HistoryError) as caught:
        HistoryStore.open(db_path)
    message = str(caught.value)
    assert str(db_path) in message
    assert "is unreadable (file is not a database)" in message
    assert "move it aside or run with --no-history" in message
    assert not isinstance(caught.value, HistoryUnavailable)


def test_truncated_database_is_reported_as_unreadable(db_path: Path):
    with HistoryStore.open(db_path) as store:
        cid = new_conversation(store)
        for turn in range(200):
            store.add_turn(cid, f"question {turn} " * 20, f"answer {turn} " * 20)
    data = db_path.read_bytes()
    db_path.write_bytes(data[: len(data) // 3])

    with pytest.raises(HistoryError) as caught:
        with HistoryStore.open(db_path) as store:
            store.get(cid)
    assert str(db_path) in str(caught.value) and "unreadable" in str(caught.value)


def test_open_or_warn_does_not_hide_a_corrupt_database(db_path: Path):
    db_path.write_bytes(b"not a database at all" * 50)
    with pytest.raises(HistoryError, match="unreadable"):
        open_or_warn(db_path, warn=lambda message: None)


def test_unwritable_location_makes_open_or_warn_warn_once(tmp_path: Path):
    (tmp_path / "afile").write_text("a regular file where a folder should be")
    path = tmp_path / "afile" / "sub" / "history.db"
    with pytest.raises(HistoryUnavailable) as caught:
        HistoryStore.open(path)
    assert str(path) in str(caught.value)

    warnings: list[str] = []
    assert open_or_warn(path, warn=warnings.append) is None
    assert len(warnings) == 1
    assert str(path) in warnings[0] and "without history" in warnings[0]


def test_default_path_comes_from_llmchat_home(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("LLMCHAT_HOME", str(tmp_path / "home"))
    with HistoryStore.open() as store:
        assert store.path == tmp_path / "home" / "history.db"
    assert (tmp_path / "home" / "history.db").exists()


# --------------------------------------------------------------------------- locking and concurrency


class LockHolder(threading.Thread):
    """Holds `BEGIN EXCLUSIVE` on the database until `release` is set, writing one message first."""

    def __init__(self, path: Path, conversation_id: str):
        super().__init__(daemon=True)
        self.path, self.conversation_id = path, conversation_id
        self.locked, self.release = threading.Event(), threading.Event()

    def run(self) -> None:
        db = raw_connection(self.path)
        db.execute("BEGIN EXCLUSIVE")
        db.execute(
            "INSERT INTO messages (conversation_id, seq, role, content, created_at)"
            " VALUES (?, 0, 'user', 'written under the lock', 'now')",
            (self.conversation_id,),
        )
        self.locked.set()
        self.release.wait(timeout=SUBPROCESS_TIMEOUT_S)
        db.execute("COMMIT")
        db.close()


def test_write_waits_for_a_lock_held_by_another_connection(store: HistoryStore, db_path: Path):
    cid = new_conversation(store)
    holder = LockHolder(db_path, cid)
    holder.start()
    holder.locked.wait()
    releaser = threading.Timer(1.0, holder.release.set)  # lets go ~1 s later, while we wait
    releaser.start()

    store.add_turn(cid, "after the lock", "reply")  # blocks until the holder commits

    holder.join()
    contents = [m.content for m in store.get(cid).messages]
    # Our turn sits after the holder's row: the write waited instead of failing or racing it.
    assert contents == ["written under the lock", "after the lock", "reply"]


def test_lock_held_past_the_timeout_raises_history_error_naming_the_path(db_path: Path):
    with HistoryStore.open(db_path, timeout=0.2) as store:
        cid = new_conversation(store)
        holder = LockHolder(db_path, cid)
        holder.start()
        holder.locked.wait()
        try:
            with pytest.raises(HistoryError) as caught:
                store.add_turn(cid, "q", "a")
        finally:
            holder.release.set()
            holder.join()
        assert str(db_path) in str(caught.value) and "locked" in str(caught.value)

        store.add_turn(cid, "q", "a")  # usable again once the lock is gone
        assert len(store.get(cid).messages) == 3


WRITER_SCRIPT = """
import sys, time
from pathlib import Path
from llmchat.store.history import HistoryStore

path, conversation_id, worker, go = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
with HistoryStore.open(path) as store:
    while not go.exists():  # start together, so the writes really overlap
        time.sleep(0.005)
    for turn in range(int(sys.argv[5])):
        store.add_turn(conversation_id, f"w{worker} q{turn}", f"w{worker} a{turn}", stats={"worker": worker})
"""


def test_four_processes_writing_at_once_lose_no_turn(tmp_path: Path, db_path: Path):
    workers, turns = 4, 25
    with HistoryStore.open(db_path) as store:
        cid = new_conversation(store)
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER_SCRIPT, str(db_path), cid, str(worker), str(go), str(turns)],
            env=subprocess_env(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for worker in range(workers)
    ]
    go.touch()
    for child in children:
        _, stderr = child.communicate(timeout=SUBPROCESS_TIMEOUT_S)
        assert child.returncode == 0, stderr

    with HistoryStore.open(db_path) as store:
        messages = store.get(cid).messages
    assert [m.seq for m in messages] == list(range(2 * workers * turns))
    pairs = list(zip(messages[0::2], messages[1::2]))
    # Each turn is stored whole and in order: a user row directly followed by its own reply.
    assert all(u.role == "user" and a.role == "assistant" for u, a in pairs)
    assert all(u.content.replace(" q", " a") == a.content for u, a in pairs)
    assert {u.content for u, _ in pairs} == {f"w{w} q{t}" for w in range(workers) for t in range(turns)}


# --------------------------------------------------------------------------- atomic export files


def test_write_atomically_leaves_the_old_file_when_replacing_fails(tmp_path: Path, monkeypatch):
    from llmchat.commands import history as cmd_history

    target = tmp_path / "out.md"
    target.write_text("old content")
    monkeypatch.setattr(os, "replace", lambda *args: (_ for _ in ()).throw(OSError(28, "No space left")))
    with pytest.raises(LlmchatError, match="cannot write"):
        cmd_history.write_atomically(target, "new content")
    assert target.read_text() == "old content"
    assert [p.name for p in tmp_path.iterdir()] == ["out.md"]  # no temp file left behind


def test_write_atomically_replaces_and_keeps_mode(tmp_path: Path):
    from llmchat.commands import history as cmd_history

    target = tmp_path / "out.json"
    target.write_text("old")
    target.chmod(0o640)
    cmd_history.write_atomically(target, "new")
    assert target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o640


# --------------------------------------------------------------------------- the CLI


def run_cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmchat", "history", *args],
        env=subprocess_env(home),
        cwd=home,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )


@pytest.fixture
def seeded_home(tmp_path: Path) -> tuple[Path, str, str]:
    with HistoryStore.open(tmp_path / "history.db") as store:
        first = new_conversation(store, name="first-chat")
        store.add_turn(first, "What is the capital of France?", "Paris.", stats={"tokens": 2})
        second = new_conversation(store)
        store.add_turn(second, "Count to three", "one, two", interrupted=True)
    return tmp_path, first, second


def assert_one_line_error(result: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmchat: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_cli_list_on_empty_history_creates_nothing(tmp_path: Path):
    result = run_cli(tmp_path, "list")
    assert result.returncode == 0, result.stderr
    assert "No conversations yet" in result.stdout
    assert not (tmp_path / "history.db").exists()
    assert json.loads(run_cli(tmp_path, "list", "--json").stdout) == []


def test_cli_list(seeded_home):
    home, first, second = seeded_home
    table = run_cli(home, "list")
    assert table.returncode == 0, table.stderr
    assert first in table.stdout and second in table.stdout and "first-chat" in table.stdout

    listed = json.loads(run_cli(home, "list", "--json").stdout)
    assert [item["id"] for item in listed] == [second, first]
    assert listed[1]["preview"] == "What is the capital of France?"
    assert [item["id"] for item in json.loads(run_cli(home, "list", "--limit", "1", "--json").stdout)] == [second]


def test_cli_show(seeded_home):
    home, first, _ = seeded_home
    shown = run_cli(home, "show", "first-chat")
    assert shown.returncode == 0, shown.stderr
    assert "What is the capital of France?" in shown.stdout and "Paris." in shown.stdout

    document = json.loads(run_cli(home, "show", first[:14], "--json").stdout)
    assert document["id"] == first
    assert run_cli(home, "show", "last").stdout.count("[interrupted]") == 1


def test_cli_export_to_stdout_and_file(seeded_home):
    home, first, _ = seeded_home
    markdown = run_cli(home, "export", first, "--format", "markdown")
    assert markdown.returncode == 0, markdown.stderr
    assert "Paris." in markdown.stdout

    target = home / "exports" / "chat.json"
    target.parent.mkdir()
    written = run_cli(home, "export", "first-chat", "--format", "json", "-o", str(target))
    assert written.returncode == 0, written.stderr
    assert json.loads(target.read_text())["id"] == first
    assert [p.name for p in target.parent.iterdir()] == ["chat.json"]


def test_cli_export_rejects_unknown_format(seeded_home):
    home, first, _ = seeded_home
    assert_one_line_error(run_cli(home, "export", first, "--format", "xml"), 2, "--format")


def test_cli_rm_requires_yes_without_a_terminal(seeded_home):
    home, first, _ = seeded_home
    assert_one_line_error(run_cli(home, "rm", first), 2, "--yes")
    assert first in run_cli(home, "list").stdout

    removed = run_cli(home, "rm", "first-chat", "--yes")
    assert removed.returncode == 0, removed.stderr
    assert first not in run_cli(home, "list").stdout


def test_cli_unknown_conversation_is_a_usage_error(seeded_home):
    home, _, _ = seeded_home
    assert_one_line_error(run_cli(home, "show", "no-such-thing"), 2, "no-such-thing")


def test_cli_corrupt_database_is_one_line_naming_the_path(tmp_path: Path):
    (tmp_path / "history.db").write_bytes(os.urandom(4096))
    assert_one_line_error(run_cli(tmp_path, "list"), 1, str(tmp_path / "history.db"), "--no-history")
