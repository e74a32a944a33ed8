"""Files attached to a message: -f on ask and chat, /file in chat, "files" in batch items, and the
history that keeps them (path, size, SHA-256, text)."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest
from prompt_toolkit.application import create_app_session
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from llmchat.errors import UsageError
from llmchat.store.attachment_records import Attachment, typed_part, wrap
from llmchat.store.export import export_markdown
from llmchat.store.history import HistoryStore
from llmchat.store.migrations import MIGRATIONS, migrate
from llmchat.turn.attachments import collect, compose, from_bytes
from llmchat.ui.completer import SlashCompleter

ENTER = "\r"
CTRL_D = "\x04"


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "b.py").write_text("print('b')\n")
    (tmp_path / "src" / "a.py").write_text("print('a')\n")
    (tmp_path / "src" / "pkg" / "c.py").write_text("print('c')")
    (tmp_path / "src" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (tmp_path / "src" / ".hidden").write_text("secret")
    (tmp_path / "notes.txt").write_text("apples are red\n")
    return tmp_path


# --------------------------------------------------------------------------- reading and wrapping


def test_the_wrapping_format():
    assert wrap("a.txt", "one\n") == '<file path="a.txt">\none\n</file>'
    assert wrap("a.txt", "no newline") == '<file path="a.txt">\nno newline\n</file>'
    files = (from_bytes("a.txt", b"one\n"), from_bytes("b.py", b"x = 1"))
    message = compose(files, "compare")
    assert message == '<file path="a.txt">\none\n</file>\n\n<file path="b.py">\nx = 1\n</file>\n\ncompare'
    assert typed_part(message, files) == "compare" and compose((), "hi") == "hi"


def test_folders_and_globs_expand_to_text_files_in_a_stable_order(tree):
    by_folder = collect(["src"], base=tree)
    assert [a.path for a in by_folder] == ["src/a.py", "src/b.py", "src/pkg/c.py"]  # no binary, no hidden
    by_glob = collect(["src/*.py", "notes.txt", "src/a.py"], base=tree)
    assert [a.path for a in by_glob] == ["src/a.py", "src/b.py", "notes.txt"]  # a file named twice: once
    note = by_glob[-1]
    assert note.size == 15 and note.sha256 == hashlib.sha256(b"apples are red\n").hexdigest()
    assert [a.path for a in collect(["-"], read_stdin=lambda: b"piped\n")] == ["<stdin>"]


@pytest.mark.parametrize(
    "name, data, words",
    [
        ("logo.png", b"\x89PNG\r\n\x1a\n\x00\x00", "logo.png is a binary file"),
        ("latin1.txt", b"caf\xe9 au lait", "latin1.txt is not UTF-8 text (first bad byte at offset 3)"),
    ],
)
def test_binary_and_non_utf8_files_are_refused_by_name(tmp_path, name, data, words):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
        collect([name], base=tmp_path)


def test_missing_files_and_empty_globs_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="nope.txt: no such file"):
        collect(["nope.txt"], base=tmp_path)
    with pytest.raises(UsageError, match=r"no file matches \*.md"):
        collect(["*.md"], base=tmp_path)


def test_file_paths_complete_after_slash_file(tree, monkeypatch):
    monkeypatch.chdir(tree)
    completer = SlashCompleter(None)
    assert completer.candidates("/file no") == ("no", [("notes.txt", "file")])
    assert completer.candidates("/file src/") == (
        "",
        [("a.py", "file"), ("b.py", "file"), ("logo.png", "file"), ("pkg/", "folder")],
    )
    assert completer.candidates("/fi")[1][0][0] == "/file"


# --------------------------------------------------------------------------- the history


def _store(tmp_path) -> HistoryStore:
    return HistoryStore.open(tmp_path / "h.db")


def test_history_keeps_path_size_sha256_and_text_and_rebuilds_the_message(tmp_path):
    files = (from_bytes("a.txt", b"one\n"), from_bytes("b.py", b"x = 1"))
    with _store(tmp_path) as store:
        cid = store.new_conversation(model="m", model_path="/m", template="t", system_prompt=None, sampling={})
        store.add_turn(cid, compose(files, "compare"), "They differ.", attachments=files)
        store.add_turn(cid, "and now?", "Still.")
        conv = store.get(cid)
        user = conv.messages[0]
        assert user.content == compose(files, "compare"), "--resume sees what the model saw"
        assert user.typed == "compare"
        assert user.attachments == [a.describe() for a in files]
        assert conv.messages[2].attachments == [] and conv.messages[2].typed is None
        shown = export_markdown(conv)
        assert "attached **a.txt** (4 bytes, sha256 `" + files[0].sha256[:16] in shown
        assert "<file path=" not in shown  # marked, not dumped
        db = sqlite3.connect(tmp_path / "h.db")
        assert db.execute("SELECT content FROM messages WHERE seq = 0").fetchone() == ("compare",)
        assert db.execute("SELECT path, size, text FROM attachments ORDER BY position").fetchall() == [
            ("a.txt", 4, "one\n"),
            ("b.py", 5, "x = 1"),
        ]
        store.add_turn(cid, compose(files[:1], "last"), "ok", attachments=files[:1])
        store.delete_last_exchange(cid)  # /undo takes the exchange's files with it
        assert db.execute("SELECT COUNT(*) FROM attachments").fetchone() == (2,)
        store.delete(cid)  # history rm
        assert db.execute("SELECT COUNT(*) FROM attachments").fetchone() == (0,)
        db.close()


def test_the_attachments_migration_upgrades_an_older_database(tmp_path):
    names = [fn.__name__ for fn in MIGRATIONS]
    assert "m004_attachments" in names
    db = sqlite3.connect(tmp_path / "h.db", isolation_level=None)
    db.execute("BEGIN")
    migrate(db, MIGRATIONS[: names.index("m004_attachments")])
    db.execute("COMMIT")
    db.close()
    with _store(tmp_path) as store:
        cid = store.new_conversation(model="m", model_path="/m", template="t", system_prompt=None, sampling={})
        note = from_bytes("n.txt", b"hi")
        store.add_turn(cid, compose((note,), "q"), "a", attachments=(note,))
        assert store.get(cid).messages[0].attachments[0]["path"] == "n.txt"


# --------------------------------------------------------------------------- batch items


def test_batch_item_files_are_relative_to_the_input_file(tree):
    from llmchat.batch.items import attach_files, parse_input

    lines = [
        {"id": "ok", "prompt": "compare", "files": ["src/a.py", "notes.txt"]},
        {"id": "bin", "prompt": "look", "files": ["src/logo.png"]},
        {"id": "bad", "prompt": "x", "files": "notes.txt"},
    ]
    items = parse_input("\n".join(json.dumps(line) for line in lines).encode())
    attach_files(items, tree)
    assert items[0].error is None and items[0].user.startswith("<file path=\"src/a.py\">\nprint('a')\n</file>\n\n")
    assert items[0].user.endswith('<file path="notes.txt">\napples are red\n</file>\n\ncompare')
    assert "src/logo.png is a binary file" in items[1].error
    assert "'files' must be a list of paths" in items[2].error


# --------------------------------------------------------------------------- the real model


def test_ask_sends_both_files_wrapped_with_their_paths(cli, tree, smollm2_path):
    a, b = tree / "a.txt", tree / "b.py"
    a.write_text("The cat sat on the mat.\n")
    b.write_text("def area(r):\n    return 3.14 * r * r\n")
    result = cli("ask", "-m", str(smollm2_path), "-n", "8", "--temperature", "0", "--json",
                 "-f", str(a), "-f", str(b), "compare")  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    stored = json.loads(cli("history", "show", record["conversation_id"], "--json").stdout)
    user = stored["messages"][0]
    assert user["content"] == (
        f'<file path="{a}">\nThe cat sat on the mat.\n</file>\n\n'
        f'<file path="{b}">\ndef area(r):\n    return 3.14 * r * r\n</file>\n\ncompare'
    )
    assert [x["path"] for x in user["attachments"]] == [str(a), str(b)] and user["typed"] == "compare"
    assert record["stats"]["prompt_tokens"] > 40  # the files reached the prompt, not just "compare"
    shown = cli("history", "show", record["conversation_id"]).stdout
    assert f"attached **{a}**" in shown and f"attached **{b}**" in shown


def test_a_file_bigger_than_the_context_exits_2_and_saves_nothing(cli, tmp_path, smollm2_path, isolated_home):
    big = tmp_path / "big.txt"
    big.write_text("lorem ipsum dolor sit amet " * 80_000)  # about 2 MB
    assert big.stat().st_size > 2_000_000
    result = cli("ask", "-m", str(smollm2_path), "--ctx", "2048", "-f", str(big), "summarise")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "does not fit" in result.stderr and "big.txt" in result.stderr
    assert json.loads(cli("history", "list", "--json").stdout) == []  # nothing saved
    assert not list(isolated_home.rglob("*.kv"))


def test_a_binary_file_is_refused_before_the_model_loads(cli, tree):
    result = cli("ask", "-f", str(tree / "src" / "logo.png"), "what is this?")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"llmchat: error: {tree / 'src' / 'logo.png'} is a binary file; attach text files, "
        "or PNG, JPEG, BMP or GIF images, or WAV, MP3 or FLAC audio\n"
    )


def test_no_history_saves_no_attachment(cli, tree, smollm2_path, isolated_home):
    result = cli("ask", "-m", str(smollm2_path), "-n", "4", "--no-history", "-f", str(tree / "notes.txt"), "colour?")
    assert result.returncode == 0, result.stderr
    assert not (isolated_home / "history.db").exists()


def _chat_session(smollm2_path, **options):
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session

    opts = RunOptions(model=str(smollm2_path), ctx=2048, temperature=0.0, seed=1, max_tokens=8, **options)
    return start_session(opts, config=load_config(), overflow="drop", with_history=True)


def test_slash_file_shows_tokens_and_the_file_stays_in_the_kv_cache(smollm2_path, tree, monkeypatch, capsys):
    from llmchat.ui.chat import run_interactive

    monkeypatch.chdir(tree)
    session = _chat_session(smollm2_path)
    try:
        keys = [
            "/file nope.txt",
            "/file src/logo.png",
            "/file notes.txt",
            "/file src",
            "/drop src/b.py",
            "/files",
            "What colour are apples?",
            "/files",
            "And the code?",
        ]
        with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
            pipe.send_text(ENTER.join(keys) + ENTER + CTRL_D)
            run_interactive(session, show_stats=False, markdown=False, verbose=False)
        out, err = capsys.readouterr()
        assert "nope.txt: no such file" in err and "src/logo.png is a binary file" in err
        import re

        count = re.search(r"notes\.txt: (\d+) tokens \((\d+)% of the context\)", err)
        assert count and int(count.group(1)) > 5, err
        assert "src/a.py:" in err and "dropped src/b.py" in err
        listed = [line.split(":")[0] for line in out.splitlines() if " tokens (" in line]
        assert listed == ["notes.txt", "src/a.py", "src/pkg/c.py"], out
        assert "no files attached" in err  # the second /files: they went with the message
        first, second = session.conversation.messages[0], session.conversation.messages[2]
        assert first["content"].startswith('<file path="notes.txt">') and first["content"].endswith(
            "What colour are apples?"
        )
        assert second["content"] == "And the code?"
        # The next turn reuses the whole first exchange, the files included, from the KV cache.
        stats = session.last_result.stats
        assert stats.cached_tokens >= int(count.group(1)) and stats.prompt_tokens - stats.cached_tokens < 40
        stored = session.history.get(session.conversation_id).messages[0]
        assert [a["path"] for a in stored.attachments] == ["notes.txt", "src/a.py", "src/pkg/c.py"]
        assert stored.typed == "What colour are apples?"
    finally:
        session.close()


def test_batch_files_relative_to_the_input(cli, tree, tmp_path, smollm2_path):
    items = tree / "items.jsonl"
    items.write_text(
        json.dumps({"id": 1, "prompt": "What colour?", "files": ["notes.txt"], "max_tokens": 4})
        + "\n"
        + json.dumps({"id": 2, "prompt": "x", "files": ["missing.txt"]})
        + "\n"
    )
    result = cli("batch", "-m", str(smollm2_path), "--temperature", "0", str(items))
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.returncode == 1  # one item failed
    assert records[0]["error"] is None and records[0]["stats"]["prompt_tokens"] > 15
    assert "missing.txt: no such file" in records[1]["error"]


def test_attachment_dataclass_is_what_describe_says():
    note = Attachment("n", 1, "00", "x")
    assert note.describe() == {"path": "n", "size": 1, "sha256": "00"}


def test_stdin_as_a_file_and_chat_f_on_the_first_message(cli, tree, smollm2_path):
    piped = cli("ask", "-m", str(smollm2_path), "-n", "4", "--json", "-f", "-", "summarise", input="Piped text.\n")
    assert piped.returncode == 0, piped.stderr
    cid = json.loads(piped.stdout)["conversation_id"]
    user = json.loads(cli("history", "show", cid, "--json").stdout)["messages"][0]
    assert user["content"] == '<file path="<stdin>">\nPiped text.\n</file>\n\nsummarise'

    notes = str(tree / "notes.txt")
    chat = cli("chat", "-m", str(smollm2_path), "-n", "4", "--json", "-f", notes, input="What colour?\nAnd why?\n")
    assert chat.returncode == 0, chat.stderr
    records = [json.loads(line) for line in chat.stdout.splitlines()]
    stored = json.loads(cli("history", "show", records[-1]["conversation_id"], "--json").stdout)["messages"]
    assert [m["attachments"] for m in stored if m["role"] == "user"] == [
        [{"path": notes, "size": 15, "sha256": hashlib.sha256(b"apples are red\n").hexdigest()}],
        [],
    ]
    assert records[1]["stats"]["cached_tokens"] >= records[0]["stats"]["prompt_tokens"] - 1  # the file stays cached
