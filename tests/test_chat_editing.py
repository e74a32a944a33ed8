"""Editing the message at the chat's prompt: Ctrl-X Ctrl-E opens it in $VISUAL / $EDITOR, and
`editing_mode = "vi"` gives vi keys with the mode shown below the prompt.

The chat runs on a real terminal (a pseudo-terminal, pexpect) on the bundled SmolLM2; the editor is
a small script written by each test. What was sent is read back from the history store.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from llmchat.config import load_config
from llmchat.errors import ConfigError
from llmchat.ui.editing import NO_EDITOR, edit_text
from tests.test_chat_ui import _spawn_chat

ENTER = "\r"
ESC = "\x1b"
CTRL_X_CTRL_E = "\x18\x05"
SUMMARY = r"prompt \d+ \(\d+ cached\) · ctx \d+/\d+"


def write_editor(folder: Path) -> str:
    """An editor that rewrites the file it is given as `edited: ` + what it held, and notes each
    call (the file's text as it got it) in calls.log; the command line that runs it."""
    script = folder / "editor.py"
    log = folder / "calls.log"
    script.write_text(
        "import sys\n"
        "path = sys.argv[1]\n"
        "text = open(path, encoding='utf-8').read()\n"
        f"open({str(log)!r}, 'a', encoding='utf-8').write(repr(text) + '\\n')\n"
        "open(path, 'w', encoding='utf-8').write('edited: ' + text + '\\n')\n"
    )
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def sent_messages(home: Path) -> list[str]:
    from llmchat.store.history import HistoryStore

    with HistoryStore.open(home / "history.db") as store:
        return [m.content for m in store.get("last").messages if m.role == "user"]


def spawn(home: Path, editor: str, monkeypatch):
    monkeypatch.setenv("VISUAL", editor)  # the chat gets the test's environment
    return _spawn_chat(home, "--max-tokens", "4", history=True)


def finish(pexpect, child) -> None:
    child.expect(SUMMARY)  # the reply to what was sent
    child.expect_exact("> ")
    child.send("/exit" + ENTER)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


# --- Ctrl-X Ctrl-E ------------------------------------------------------------------------------------
def test_ctrl_x_ctrl_e_puts_what_the_editor_saved_at_the_prompt_and_enter_sends_it(
    isolated_home, tmp_path, monkeypatch
):
    pexpect, child = spawn(isolated_home, write_editor(tmp_path), monkeypatch)
    try:
        child.expect_exact("> ")
        child.send("Name a fruit.")
        child.send(CTRL_X_CTRL_E)
        child.expect_exact("edited: Name a fruit.")  # back at the prompt, not sent
        child.send(" Just one.")  # the message is still being typed: nothing went at the editor's close
        child.send(ENTER)
        finish(pexpect, child)
    finally:
        child.close()
    assert (tmp_path / "calls.log").read_text() == "'Name a fruit.'\n"
    assert sent_messages(isolated_home) == ["edited: Name a fruit. Just one."]


# --- vi mode ------------------------------------------------------------------------------------------
def test_vi_mode_edits_in_normal_mode_shows_it_and_v_opens_the_editor(isolated_home, tmp_path, monkeypatch):
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text('editing_mode = "vi"\n')
    pexpect, child = spawn(isolated_home, write_editor(tmp_path), monkeypatch)
    try:
        child.expect_exact("> ")
        child.send("Nxame a colour.")
        child.send(ESC)
        child.expect_exact("-- NORMAL")  # the last column comes in a write of its own
        child.send("0lx")  # to the start, one right, delete the stray x
        child.send("A Only one.")  # append at the end, in insert mode again
        child.send(ENTER)
        child.expect(SUMMARY)
        child.expect_exact("> ")
        child.send("Hello")
        child.send(ESC)
        child.expect_exact("-- NORMAL")  # the last column comes in a write of its own
        child.send("v")  # normal mode's v: the editor
        child.expect_exact("edited: Hello")
        child.send("A there")  # still at the prompt, in normal mode: append
        child.send(ESC)
        child.expect_exact("-- NORMAL")
        child.send(ENTER)  # Enter in normal mode sends
        finish(pexpect, child)
    finally:
        child.close()
    assert sent_messages(isolated_home) == ["Name a colour. Only one.", "edited: Hello there"]


# --- without a terminal: the editor and the config key ---------------------------------------------
def test_the_editor_failing_leaves_the_message_and_says_why(tmp_path, monkeypatch):
    errors: list[str] = []
    monkeypatch.setenv("VISUAL", f"{shlex.quote(sys.executable)} -c 'raise SystemExit(3)'")
    assert edit_text("draft", errors.append) is None
    monkeypatch.setenv(
        "VISUAL", f"{shlex.quote(sys.executable)} -c \"import sys; open(sys.argv[1], 'wb').write(b'\\xff')\""
    )
    assert edit_text("draft", errors.append) is None
    monkeypatch.setenv("VISUAL", "/no/such/editor --wait")
    assert edit_text("draft", errors.append) is None
    monkeypatch.setenv("VISUAL", "'unclosed")
    assert edit_text("draft", errors.append) is None
    monkeypatch.delenv("VISUAL")
    monkeypatch.delenv("EDITOR", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no fallback editor on it
    assert edit_text("draft", errors.append) is None
    assert errors == [
        "error: the editor (VISUAL) exited with status 3; the message is unchanged",
        "error: the editor saved text that is not UTF-8; the message is unchanged",
        "error: the editor '/no/such/editor' (VISUAL) could not be started: No such file or directory",
        'error: VISUAL="\'unclosed" is not a command line (No closing quotation); the message is unchanged',
        f"error: {NO_EDITOR}",
    ]
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("llmchat-message-*")), "the file is removed"


def test_the_editor_gets_a_private_file_and_editor_is_the_second_choice(tmp_path, monkeypatch):
    script = tmp_path / "editor.py"
    script.write_text(
        "import os, sys\nopen(sys.argv[1], 'a').write(oct(os.stat(sys.argv[1]).st_mode & 0o777) + '\\n')\n"
    )
    monkeypatch.delenv("VISUAL", raising=False)
    monkeypatch.setenv("EDITOR", f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}")
    assert edit_text("line one\n", print) == "line one\n0o600"


@pytest.mark.parametrize("value", ["emacs", "vi"])
def test_the_config_takes_an_editing_mode(tmp_path, value):
    path = tmp_path / "config.toml"
    assert load_config(path).editing_mode == "emacs"
    path.write_text(f'editing_mode = "{value}"\n')
    assert load_config(path).editing_mode == value


def test_a_bad_editing_mode_is_one_line_and_exit_2(isolated_home, cli):
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text('editing_mode = "vim"\n')
    with pytest.raises(ConfigError, match='editing_mode must be "emacs" or "vi"'):
        load_config(isolated_home / "config.toml")
    result = cli("config", "show")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and 'editing_mode must be "emacs" or "vi"' in lines[0], result.stderr
