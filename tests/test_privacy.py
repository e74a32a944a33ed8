"""Private by default (issue 18): conversations readable by their user alone, deleting deletes
every copy, secrets masked, and `--no-history` leaves no trace.

Modes are checked with os.stat after real runs of the CLI (ask, chat on a pseudo-terminal, batch,
history export) started under the umask a user would have: 022 (the usual) and 077. Deletion is
checked by searching the bytes of every file under llmchat's folder for a marker string.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from llmchat.engine import kv_store
from llmchat.store.history import HistoryStore
from llmchat.store.typed_lines import forget_typed_lines

SUBPROCESS_TIMEOUT_S = 300  # only a guard against a hung child, never an assertion
ENTER = "\r"
UMASKS = [0o022, 0o077]
GREEDY = ("--temperature", "0", "--seed", "1")


# --------------------------------------------------------------------------- helpers


def run_llmchat(
    home: Path, *args: str, umask: int = 0o022, input: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m llmchat ARGS` as a user with this umask would run it."""
    full_env = dict(os.environ, LLMCHAT_HOME=str(home)) | (env or {})
    full_env.pop("LLMCHAT_MODEL", None)
    return subprocess.run(
        [sys.executable, "-m", "llmchat", *args],
        input=input,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=SUBPROCESS_TIMEOUT_S,
        preexec_fn=lambda: os.umask(umask),
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def everything_under(root: Path) -> list[Path]:
    return sorted(root.rglob("*")) if root.exists() else []


def files_holding(root: Path, marker: bytes) -> list[Path]:
    """Every file under `root` whose bytes contain `marker` (also as UTF-16, as some stores keep text)."""
    forms = (marker, marker.decode().encode("utf-16-le"))
    return [path for path in everything_under(root) if path.is_file() and any(f in path.read_bytes() for f in forms)]


def assert_private_tree(root: Path, *, skip: tuple[Path, ...] = ()) -> None:
    """Every folder under `root` is 0700 and every file 0600."""
    for path in everything_under(root):
        if path in skip:
            continue
        expected = 0o700 if path.is_dir() else 0o600
        assert mode(path) == expected, f"{path} is {oct(mode(path))}, not {oct(expected)}"


def seed_conversation(store: HistoryStore, user: str, reply: str) -> str:
    conversation_id = store.new_conversation(
        model="smollm2", model_path="/models/smollm2.gguf", template="chatml", system_prompt=None, sampling={}
    )
    store.add_turn(conversation_id, user, reply)
    return conversation_id


def save_kv_file(home: Path, conversation_id: str | None, payload: bytes) -> Path:
    """A KV-cache file for a conversation, written by the disk cache's own writer (the payload
    stands for llama.cpp's sequence state)."""
    return kv_store.write_entry(home / "cache" / "kv", {"model": "test"}, list(range(80)), payload, conversation_id)


def kv_conversations(home: Path) -> list[str | None]:
    entries, damaged = kv_store.list_entries(home / "cache" / "kv")
    assert damaged == []
    return sorted(entry.conversation_id or "" for entry in entries)


def typed_line_entry(text: str) -> str:
    """One entry as prompt-toolkit's FileHistory appends it."""
    return "\n# 2026-01-01 00:00:00.000000\n" + "".join(f"+{line}\n" for line in text.split("\n"))


def spawn_chat(home: Path, *args: str, umask: int):
    import pexpect

    env = dict(
        os.environ, LLMCHAT_HOME=str(home), TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1", COLUMNS="120", LINES="30"
    )
    env.pop("LLMCHAT_MODEL", None)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "llmchat", "chat", *GREEDY, "--max-tokens", "8", *args],
        env=env,
        encoding="utf-8",
        codec_errors="replace",
        dimensions=(30, 120),
        timeout=180,
        preexec_fn=lambda: os.umask(umask),
    )
    return pexpect, child


def chat_on_a_terminal(home: Path, lines: list[str], *args: str, umask: int = 0o022) -> str:
    """Type each line at the chat prompt (a message waits for its reply's summary), then /exit;
    returns what the terminal showed."""
    pexpect, child = spawn_chat(home, *args, umask=umask)
    seen = []
    try:
        child.expect_exact("/help for commands")
        for line in lines:
            child.expect_exact("> ")
            child.send(line + ENTER)
            if not line.startswith("/"):
                child.expect(r"prompt \d+ \([^)]*cached\)")  # "(4 image/audio, 65 cached)" too
            seen.append(child.before)
        child.expect_exact("> ")
        seen.append(child.before)
        child.send("/exit" + ENTER)
        child.expect(pexpect.EOF)
        seen.append(child.before)
    finally:
        child.close()
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus, "".join(seen))
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[78=>]|\r", "", "".join(seen))


# --------------------------------------------------------------------------- modes


@pytest.mark.model
@pytest.mark.parametrize("umask", UMASKS, ids=["umask022", "umask077"])
def test_ask_creates_the_history_readable_by_the_user_alone(tmp_path, umask):
    home = tmp_path / "home"
    result = run_llmchat(home, "ask", *GREEDY, "--max-tokens", "4", "Say hi", umask=umask)
    assert result.returncode == 0, result.stderr
    assert mode(home) == 0o700  # llmchat created it
    assert mode(home / "history.db") == 0o600
    assert_private_tree(home)


@pytest.mark.model
def test_a_home_folder_the_user_made_keeps_its_mode(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    result = run_llmchat(home, "ask", *GREEDY, "--max-tokens", "4", "Say hi", umask=0o022)
    assert result.returncode == 0, result.stderr
    assert mode(home) == 0o755
    assert mode(home / "history.db") == 0o600


def test_wal_and_shm_are_private_while_the_store_is_open(tmp_path):
    """SQLite creates `-wal` and `-shm` itself, at the first write: they must not follow the umask."""
    previous = os.umask(0o022)
    try:
        with HistoryStore.open(tmp_path / "data" / "history.db") as store:
            seed_conversation(store, "hello", "hi")
            files = sorted((tmp_path / "data").iterdir())
            assert [path.name for path in files] == ["history.db", "history.db-shm", "history.db-wal"]
            assert [mode(path) for path in files] == [0o600] * 3
    finally:
        os.umask(previous)
    assert mode(tmp_path / "data") == 0o700


def test_deleted_text_is_overwritten_in_any_sqlite_build(tmp_path):
    with HistoryStore.open(tmp_path / "history.db") as store:
        (secure_delete,) = store._db.execute("PRAGMA secure_delete").fetchone()
    assert secure_delete == 1


@pytest.mark.tty
@pytest.mark.model
@pytest.mark.parametrize("umask", UMASKS, ids=["umask022", "umask077"])
def test_chat_on_a_terminal_then_rm_leaves_no_copy(tmp_path, umask):
    """A chat keeps the typed lines (input_history) and the turns (history.db) private; /help says
    /clear keeps the old conversation; `history rm` then removes the text from every file."""
    home = tmp_path / "home"
    with HistoryStore.open(home / "history.db") as store:  # an earlier conversation that must stay
        kept = seed_conversation(store, "KEEP-ME-4417 what is tea?", "A drink.")
    marker = f"SECRET-MARKER-{umask:o}-8821"

    # Long enough (over kv_store.MIN_SAVE_TOKENS) for the turn's KV cache to be saved to disk.
    message = f"My password is {marker}, remember it. " + "I keep it in a notebook by the window of my room. " * 3
    screen = chat_on_a_terminal(home, ["/help", message], "--stats", umask=umask)

    assert "the old one is kept, not deleted" in screen
    assert mode(home / "input_history") == 0o600
    assert mode(home / "history.db") == 0o600
    assert_private_tree(home)
    assert files_holding(home, marker.encode()), "the chat should have saved the marker somewhere"
    with HistoryStore.open(home / "history.db") as store:
        chatted = store.get("last").id
    save_kv_file(home, kept, b"KEEP-ME-4417 state")
    assert kv_conversations(home) == sorted([chatted, kept]), "the chat saves its KV cache to disk"

    removed = run_llmchat(home, "history", "rm", chatted, "--yes")
    assert removed.returncode == 0, removed.stderr
    assert files_holding(home, marker.encode()) == []
    assert kv_conversations(home) == [kept]
    assert home / "history.db" in files_holding(home, b"KEEP-ME-4417")
    listed = run_llmchat(home, "history", "list", "--json")
    assert kept in listed.stdout and chatted not in listed.stdout


@pytest.mark.model
@pytest.mark.parametrize("umask", UMASKS, ids=["umask022", "umask077"])
def test_batch_output_keeps_the_umask_and_its_folder_its_mode(tmp_path, umask):
    """Batch records are meant to be shared: the output follows the umask like any tool's output."""
    home = tmp_path / "home"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    items = tmp_path / "items.txt"
    items.write_text("Say hi\n")
    result = run_llmchat(
        home, "batch", str(items), "-o", str(shared / "out.jsonl"), *GREEDY, "--max-tokens", "4", umask=umask
    )
    assert result.returncode == 0, result.stderr
    assert mode(shared / "out.jsonl") == 0o666 & ~umask
    assert mode(shared) == 0o755
    assert not (home / "history.db").exists()  # a batch is not saved


@pytest.mark.parametrize("umask", UMASKS, ids=["umask022", "umask077"])
def test_an_export_is_private_and_its_folder_keeps_its_mode(tmp_path, umask):
    home = tmp_path / "home"
    with HistoryStore.open(home / "history.db") as store:
        conversation_id = seed_conversation(store, "What is the capital of France?", "Paris.")
    exports = tmp_path / "exports"
    exports.mkdir()
    exports.chmod(0o755)

    for fmt, name in (("markdown", "chat.md"), ("json", "chat.json")):
        result = run_llmchat(
            home, "history", "export", conversation_id, "-f", fmt, "-o", str(exports / name), umask=umask
        )
        assert result.returncode == 0, result.stderr
        assert mode(exports / name) == 0o600
    assert mode(exports) == 0o755

    # A file the user already has keeps the mode they gave it.
    (exports / "chat.md").chmod(0o640)
    again = run_llmchat(home, "history", "export", conversation_id, "-o", str(exports / "chat.md"), umask=umask)
    assert again.returncode == 0, again.stderr
    assert mode(exports / "chat.md") == 0o640


def test_files_from_an_earlier_version_are_tightened_once_with_one_notice(tmp_path):
    home = tmp_path / "home"
    with HistoryStore.open(home / "history.db") as store:
        seed_conversation(store, "hello", "hi")
    (home / "input_history").write_text(typed_line_entry("hello"))
    for path in (home / "history.db", home / "input_history"):
        path.chmod(0o644)  # as the version before this one left them under umask 022

    first = run_llmchat(home, "history", "list")
    assert first.returncode == 0, first.stderr
    notices = first.stderr.strip().splitlines()
    assert len(notices) == 1, first.stderr
    assert str(home / "history.db") in notices[0] and str(home / "input_history") in notices[0]
    assert mode(home / "history.db") == 0o600 and mode(home / "input_history") == 0o600

    second = run_llmchat(home, "history", "list")
    assert second.returncode == 0 and second.stderr == ""


# --------------------------------------------------------------------------- deleting every copy


def test_rm_clears_the_text_from_the_wal_while_another_process_has_it_open(tmp_path):
    """While another llmchat holds the database, its WAL stays on disk, with the old page images."""
    home = tmp_path / "home"
    with HistoryStore.open(home / "history.db") as other_process:
        doomed = seed_conversation(other_process, "MARKER-WAL-5531 my bank pin", "MARKER-WAL-5531 noted")
        kept = seed_conversation(other_process, "KEEP-ME-2290", "fine")
        save_kv_file(home, doomed, b"MARKER-WAL-5531 state")
        save_kv_file(home, kept, b"KEEP-ME-2290 state")
        assert files_holding(home, b"MARKER-WAL-5531")

        removed = run_llmchat(home, "history", "rm", doomed, "--yes")

        assert removed.returncode == 0, removed.stderr
        assert files_holding(home, b"MARKER-WAL-5531") == []
        assert files_holding(home, b"KEEP-ME-2290")
        assert doomed not in [c.id for c in other_process.list_conversations()]
    assert kv_conversations(home) == [kept]


def test_rm_all_empties_the_store_the_wal_the_input_history_and_the_cache(tmp_path):
    home = tmp_path / "home"
    with HistoryStore.open(home / "history.db") as other_process:
        ids = [seed_conversation(other_process, f"MARKER-ALL-{n} private", "MARKER-ALL reply") for n in range(3)]
        for conversation_id in [*ids, None]:  # None: a batch item's
            save_kv_file(home, conversation_id, b"MARKER-ALL state " + str(conversation_id).encode())
        (home / "cache" / "calibration.json").write_text("{}")  # not a copy of a conversation: stays
        (home / "input_history").write_text("".join(typed_line_entry(f"MARKER-ALL-{n} private") for n in range(3)))
        size_before = (home / "history.db").stat().st_size + (home / "history.db-wal").stat().st_size

        removed = run_llmchat(home, "history", "rm", "--all", "--yes")

        assert removed.returncode == 0, removed.stderr
        assert "3 conversations" in removed.stdout
        assert files_holding(home, b"MARKER-ALL") == []
        assert other_process.list_conversations() == []
    assert (home / "cache" / "calibration.json").exists()
    assert kv_conversations(home) == []
    assert not (home / "input_history").exists()
    assert (home / "history.db").stat().st_size <= size_before  # vacuumed, not grown
    listed = run_llmchat(home, "history", "list", "--json")
    assert listed.returncode == 0 and listed.stdout.strip() == "[]"


def test_rm_all_asks_first_and_takes_no_id(tmp_path):
    home = tmp_path / "home"
    with HistoryStore.open(home / "history.db") as store:
        conversation_id = seed_conversation(store, "hello", "hi")

    for args in (("--all",), (conversation_id, "--all", "--yes"), ()):
        refused = run_llmchat(home, "history", "rm", *args)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1 and lines[0].startswith("llmchat: error: "), refused.stderr
    assert conversation_id in run_llmchat(home, "history", "list").stdout


@pytest.mark.tty
def test_rm_all_on_a_terminal_asks_and_no_keeps_everything(tmp_path):
    import pexpect

    home = tmp_path / "home"
    with HistoryStore.open(home / "history.db") as store:
        conversation_id = seed_conversation(store, "hello", "hi")

    def answer(reply: str) -> str:
        env = dict(os.environ, LLMCHAT_HOME=str(home))
        child = pexpect.spawn(
            sys.executable, ["-m", "llmchat", "history", "rm", "--all"], env=env, encoding="utf-8", timeout=60
        )
        try:
            child.expect_exact("Delete all 1 conversations")
            child.sendline(reply)
            child.expect(pexpect.EOF)
        finally:
            child.close()
        assert child.exitstatus == 0
        return child.before

    assert "Not deleted." in answer("n")
    assert conversation_id in run_llmchat(home, "history", "list").stdout
    assert "Deleted all 1 conversations." in answer("y")
    assert run_llmchat(home, "history", "list", "--json").stdout.strip() == "[]"


def test_forget_typed_lines_drops_only_the_conversation_entries(tmp_path):
    path = tmp_path / "input_history"
    path.write_text(
        typed_line_entry("keep this")
        + typed_line_entry("two\nline secret")
        + typed_line_entry("//etc/passwd secret")
        + typed_line_entry("/help")
    )
    dropped = forget_typed_lines(path, {"two\nline secret", "/etc/passwd secret"})
    assert dropped == 2
    text = path.read_text()
    assert "secret" not in text and "+keep this\n" in text and "+/help\n" in text
    assert mode(path) == 0o600


@pytest.mark.tty
@pytest.mark.model
def test_rm_takes_the_conversations_commands_out_of_the_input_history(tmp_path):
    """What a chat's slash commands say (`/system ...`, `/search ...`) is as private as its
    messages, and none of its messages holds it: its lines go with the conversation, those typed
    before the conversation existed (its first reply makes it) as well as after; another
    conversation's stay."""
    home = tmp_path / "home"
    chat_on_a_terminal(
        home, ["/system Answer as MARKER-SYS-4410 would.", "Hello MARKER-MSG-4410", "/search MARKER-FIND-4410"]
    )
    (doomed,) = [c["id"] for c in json.loads(run_llmchat(home, "history", "list", "--json").stdout)]
    chat_on_a_terminal(home, ["/system Answer as KEEP-SYS-7702 would.", "Hello KEEP-MSG-7702"])
    assert files_holding(home, b"MARKER-SYS-4410") == [home / "history.db", home / "input_history"]

    removed = run_llmchat(home, "history", "rm", doomed, "--yes")

    assert removed.returncode == 0, removed.stderr
    assert files_holding(home, b"4410") == []  # the system prompt, the message, the search
    typed = (home / "input_history").read_text()
    assert "+/system Answer as KEEP-SYS-7702 would.\n" in typed and "+Hello KEEP-MSG-7702\n" in typed
    assert mode(home / "input_history") == 0o600


def test_forget_typed_lines_by_the_conversation_they_were_typed_in(tmp_path):
    from llmchat.store.typed_lines import TaggedLines

    path = tmp_path / "input_history"
    owner: list[str | None] = [None]
    lines = TaggedLines(path, lambda: owner[0])
    lines.append(lines.entry("/system secret persona"))  # before the conversation exists
    owner[0] = "01AAAA"
    lines.settle()
    lines.append(lines.entry("/file ~/secret.txt"))
    owner[0] = None  # /clear: the next conversation's lines begin
    lines.append(lines.entry("/system other"))
    owner[0] = "01BBBB"
    lines.settle()
    lines.append(lines.entry("/help"))

    assert forget_typed_lines(path, set(), "01AAAA") == 2
    text = path.read_text()
    assert "secret" not in text and "01AAAA" not in text and "+/system other\n" in text and "+/help\n" in text
    assert forget_typed_lines(path, set(), "01BBBB") == 2 and "+" not in path.read_text()
    assert mode(path) == 0o600


@pytest.mark.tty
@pytest.mark.model
def test_an_image_path_inside_a_message_is_named_not_sent(tmp_path, puppet_projector):
    """A new user asking about a file's name must not send the file: only a message that is the
    path alone (a file dropped on the terminal) attaches it."""
    from tests.media_fixtures import quadrants

    home = tmp_path / "home"
    card = tmp_path / "scans" / "id-card.png"
    card.parent.mkdir()
    card.write_bytes(quadrants("red", "green", "blue", "red"))
    question = f"What does the file name '{card}' tell you about naming conventions?"

    shown = chat_on_a_terminal(home, [question, str(card), "What colours?"], "--mmproj", str(puppet_projector))

    assert f"not attached: {card} (/image {card} attaches it to your next message)\n" in shown
    stored = json.loads(run_llmchat(home, "history", "show", "last", "--json").stdout)["messages"]
    asked, dropped = stored[0], stored[2]
    assert asked["content"] == question and not asked.get("attachments")
    assert [a["path"] for a in dropped["attachments"]] == [str(card)] and dropped["typed"] == "What colours?"


# --------------------------------------------------------------------------- incognito


@pytest.mark.tty
@pytest.mark.model
@pytest.mark.parametrize("how", ["--no-history", "config"])
def test_no_history_leaves_no_trace_of_the_chat(tmp_path, how):
    home = tmp_path / "home"
    args: tuple[str, ...] = ("--no-history",)
    if how == "config":
        home.mkdir()
        (home / "config.toml").write_text("history = false\n")
        args = ()
    marker = "INCOGNITO-MARKER-7719"

    # Long enough that, with the history on, the KV cache would be saved to disk.
    message = f"My diagnosis is {marker}. " + "Please explain what it means for my daily life in plain words. " * 3
    chat_on_a_terminal(home, [message, "/clear", f"Again {marker}."], *args)

    assert files_holding(home, marker.encode()) == []
    assert not (home / "input_history").exists()
    assert not (home / "history.db").exists()
    assert kv_conversations(home) == []  # no KV cache on disk either


# --------------------------------------------------------------------------- secrets


def test_config_show_masks_values_whose_name_says_key_token_or_secret():
    from llmchat.commands.config import MASK, mask_secrets, names_a_secret

    for name in ("api_key", "API_KEY", "hf-token", "clientSecret", "token", "password", "apikey"):
        assert names_a_secret(name), name
    for name in ("max_tokens", "keyboard", "monkey", "model", "top_k"):
        assert not names_a_secret(name), name
    shown = mask_secrets(
        {"sampling": {"max_tokens": 64}, "servers": {"lab": {"url": "http://127.0.0.1:1", "api_key": "sk-MARKER"}}}
    )
    assert shown == {"sampling": {"max_tokens": 64}, "servers": {"lab": {"url": "http://127.0.0.1:1", "api_key": MASK}}}


def test_config_show_never_prints_a_key_pasted_into_the_config(tmp_path):
    """The config holds the *name* of the key's variable; a key pasted in its place, or into a
    server's URL, is still not shown."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(
        '[servers.box]\nurl = "http://me:sk-MARKER-9931@127.0.0.1:9/v1"\napi_key_env = "sk-MARKER-9931"\n'
    )
    result = run_llmchat(home, "config", "show")
    assert result.returncode == 0, result.stderr
    assert "MARKER-9931" not in result.stdout + result.stderr
    assert "http://me:********@127.0.0.1:9/v1" in result.stdout


def test_config_show_prints_the_rest(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[sampling]\nmax_tokens = 77\n")
    result = run_llmchat(home, "config", "show")
    assert result.returncode == 0, result.stderr
    assert '"max_tokens": 77' in result.stdout
