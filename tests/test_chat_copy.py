"""/copy [N] on a real terminal: the OSC 52 sequence byte for byte, its payload the reply (or its
code block N) as the history stored it, tmux's passthrough, and the private file where the
terminal cannot take OSC 52. The fence parsing and the terminal check are pure logic, tested
without a chat.
"""

from __future__ import annotations

import base64
import io
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from llmchat.store.history import HistoryStore
from llmchat.ui.clipboard import code_blocks, osc52, takes_osc52

ENTER = "\r"
OSC52 = re.compile(r"\x1b\]52;c;([A-Za-z0-9+/=]*)\x07")
REPLY = (
    "Two ways:\n\n```python\nprint('one')\n```\n\nor, indented:\n\n"
    "  ~~~sh\n  echo 'two' | tr a-z A-Z\n    keep four\n  ~~~\n\nThat's all — ünïcode kept."
)
BLOCKS = ["print('one')", "echo 'two' | tr a-z A-Z\n  keep four"]


def spawn_chat(home: Path, model: Path, *args: str, env: dict[str, str] | None = None):
    import pexpect

    full_env = dict(os.environ, LLMCHAT_HOME=str(home), TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1")
    for name in ("LLMCHAT_MODEL", "TMUX", "LLMCHAT_CLIPBOARD"):  # as the test says, not as the runner's shell
        full_env.pop(name, None)
    full_env.update(env or {})
    child = pexpect.spawn(
        sys.executable,
        ["-m", "llmchat", "chat", "-m", str(model), "--temperature", "0", "--max-tokens", "8", *args],
        env=full_env,
        encoding="utf-8",
        codec_errors="replace",
        dimensions=(30, 120),
        timeout=180,
    )
    return pexpect, child


def command(child, line: str, until: str) -> str:
    """Type a slash command at the prompt; returns what the terminal showed up to `until`."""
    child.expect_exact("> ")
    child.send(line + ENTER)
    child.expect_exact(until)
    return child.before


def finish(pexpect, child) -> None:
    child.expect_exact("> ")
    child.send("/exit" + ENTER)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)


def seed(home: Path) -> str:
    home.mkdir(parents=True, exist_ok=True)
    with HistoryStore.open(home / "history.db") as store:
        conversation = store.new_conversation(
            model="smollm2", model_path="/m.gguf", template="chatml", system_prompt=None, sampling={}
        )
        store.add_turn(conversation, "Show me two ways.", REPLY)
    return conversation


def test_copy_before_a_reply_then_the_reply_as_the_history_stored_it(isolated_home, smollm2_path):
    pexpect, child = spawn_chat(isolated_home, smollm2_path)
    try:
        child.expect_exact("/help for commands")
        command(child, "/copy", "nothing to copy yet")
        child.expect(r"\r\n")
        assert "\x1b]52" not in child.before
        child.expect_exact("> ")
        child.send("Say hello." + ENTER)
        child.expect(r"prompt \d+ \(\d+ cached\)")  # the reply's summary: the turn is saved
        shown = command(child, "/copy", "copied the last reply to the clipboard")
        [payload] = OSC52.findall(shown)
        finish(pexpect, child)
    finally:
        child.close()
    with HistoryStore.open(isolated_home / "history.db") as store:
        stored = store.get("last").messages[-1]
    assert stored.role == "assistant"
    assert base64.b64decode(payload).decode("utf-8") == stored.content


@pytest.mark.parametrize("tmux", [False, True], ids=["terminal", "tmux"])
def test_copy_a_code_block_of_a_resumed_reply(isolated_home, smollm2_path, tmux):
    conversation = seed(isolated_home)
    env = {"TMUX": "/tmp/tmux-1000/default,4242,0"} if tmux else {}
    pexpect, child = spawn_chat(isolated_home, smollm2_path, "--resume", conversation, env=env)
    try:
        shown = command(child, "/copy 2", "copied code block 2 of 2 to the clipboard")
        expected = osc52(BLOCKS[1], tmux=tmux)
        assert expected in shown
        payload = base64.b64encode(BLOCKS[1].encode()).decode()
        if tmux:  # plain, then the exact DCS passthrough: ESC P tmux; <the sequence, ESC doubled> ESC \
            assert f"\x1b]52;c;{payload}\x07\x1bPtmux;\x1b\x1b]52;c;{payload}\x07\x1b\\" in shown
        else:
            assert OSC52.findall(shown) == [payload]
        shown = command(child, "/copy", "copied the last reply to the clipboard")
        assert osc52(REPLY, tmux=tmux) in shown
        assert "/copy N copies code block N (1..2)" in child.readline()
        shown = command(child, "/copy 3", "usage: /copy [N], N a code block 1..2")
        assert "\x1b]52" not in shown
        finish(pexpect, child)
    finally:
        child.close()


def test_where_the_terminal_cannot_take_osc52_the_text_goes_to_a_private_file(isolated_home, smollm2_path):
    conversation = seed(isolated_home)
    pexpect, child = spawn_chat(
        isolated_home, smollm2_path, "--resume", conversation, env={"LLMCHAT_CLIPBOARD": "file"}
    )
    try:
        shown = command(child, "/copy 1", "this terminal cannot take OSC 52: code block 1 of 2 (12 characters) is in ")
        path = Path(child.readline().strip().replace("\x1b[0m", ""))
        assert "\x1b]52" not in shown
        finish(pexpect, child)
    finally:
        child.close()
    assert path == isolated_home / "cache" / "clipboard.txt"
    assert path.read_text(encoding="utf-8") == BLOCKS[0]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_unsaved_chats_copy_file_is_kept_only_while_the_chat_runs(isolated_home, smollm2_path):
    """`--no-history`: the /copy file holds the reply, so it goes to the run's temporary folder
    (private) and is gone when the chat ends; nothing is written under llmchat's folders."""
    pexpect, child = spawn_chat(isolated_home, smollm2_path, "--no-history", env={"LLMCHAT_CLIPBOARD": "file"})
    try:
        child.expect_exact("/help for commands")
        child.expect_exact("> ")
        child.send("Say hello." + ENTER)
        child.expect(r"prompt \d+ \(\d+ cached\)")  # the reply's summary
        command(child, "/copy", "this terminal cannot take OSC 52: the last reply (")
        child.expect_exact(" is in ")
        path = Path(child.readline().strip().replace("\x1b[0m", ""))
        assert isolated_home not in path.parents and path.name == "clipboard.txt"
        assert (stat.S_IMODE(path.stat().st_mode), stat.S_IMODE(path.parent.stat().st_mode)) == (0o600, 0o700)
        finish(pexpect, child)
    finally:
        child.close()
    assert not path.exists() and not path.parent.exists()
    assert not (isolated_home / "cache" / "clipboard.txt").exists()


def test_the_copy_file_makes_its_own_folder(isolated_home):
    """The first file llmchat writes may be the /copy file: its folder is made, 0700."""
    from llmchat.ui.clipboard import copy_text

    assert not isolated_home.exists()
    copied = copy_text("a reply", io.StringIO(), {"LLMCHAT_CLIPBOARD": "file"})
    assert copied.file == isolated_home / "cache" / "clipboard.txt"
    assert copied.file.read_text(encoding="utf-8") == "a reply"
    assert (stat.S_IMODE(copied.file.stat().st_mode), stat.S_IMODE(copied.file.parent.stat().st_mode)) == (0o600, 0o700)


def test_history_rm_removes_the_copy_file_of_that_conversation(isolated_home, cli):
    from llmchat.ui.clipboard import copy_text

    copied_from = seed(isolated_home)
    with HistoryStore.open(isolated_home / "history.db") as store:
        other = store.new_conversation(
            model="smollm2", model_path="/m.gguf", template="chatml", system_prompt=None, sampling={}
        )
        store.add_turn(other, "Something else", "Another reply.")
    target = copy_text(BLOCKS[1], io.StringIO(), {"LLMCHAT_CLIPBOARD": "file"}).file  # code block 2, indented
    assert target is not None
    assert cli("history", "rm", other, "--yes").returncode == 0
    assert target.read_text(encoding="utf-8") == BLOCKS[1]  # not that conversation's text: kept
    removed = cli("history", "rm", copied_from, "--yes")
    assert removed.returncode == 0, removed.stderr
    assert not target.exists()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
@pytest.mark.parametrize("option", ["set-clipboard on", "allow-passthrough on"])
def test_copy_in_a_real_tmux(isolated_home, smollm2_path, tmp_path, option):
    """The chat in a tmux pane, a tmux client on a terminal, as a user runs it: with tmux's
    `set-clipboard on` the text lands in tmux's paste buffer; with `allow-passthrough on` (and
    set-clipboard off) the sequence reaches the terminal outside tmux, unwrapped."""
    import shlex

    import pexpect

    conversation = seed(isolated_home)
    config = tmp_path / "tmux.conf"
    config.write_text(f"set -g {option}\n" + ("set -g set-clipboard off\n" if "passthrough" in option else ""))
    socket = f"llmchat-test-{os.getpid()}-{option.split()[0]}"
    inner = shlex.join(
        ["env", f"LLMCHAT_HOME={isolated_home}", "PROMPT_TOOLKIT_NO_CPR=1", sys.executable, "-m", "llmchat", "chat"]
        + ["-m", str(smollm2_path), "--max-tokens", "8", "--resume", conversation]
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE", "LLMCHAT_MODEL")}
    env["TERM"] = "xterm-256color"
    child = pexpect.spawn(
        "tmux",
        ["-L", socket, "-f", str(config), "new-session", "-x", "120", "-y", "30", inner],
        env=env,
        encoding="utf-8",
        codec_errors="replace",
        dimensions=(30, 120),
        timeout=180,
    )
    try:
        child.expect_exact("/help for commands")
        child.expect_exact("> ")
        child.send("/copy 1" + ENTER)
        if "passthrough" in option:
            child.expect(OSC52)  # what tmux passed to the terminal it runs in
            assert base64.b64decode(child.match.group(1)).decode() == BLOCKS[0]
        child.expect_exact("copied code block 1 of 2")  # drawn after the sequence was handled
        if "set-clipboard" in option:
            buffer = subprocess.run(
                ["tmux", "-L", socket, "show-buffer"], capture_output=True, text=True, env=env, timeout=60
            )
            assert buffer.stdout == BLOCKS[0], buffer.stderr
        child.send("/exit" + ENTER)
        child.expect(pexpect.EOF)
    finally:
        child.close()
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, env=env, timeout=60)


# --------------------------------------------------------------------------- pure logic


def test_code_blocks_follow_commonmark_fences():
    assert code_blocks(REPLY) == BLOCKS
    assert code_blocks("no code here") == []
    assert code_blocks("```\nunclosed\n``` not a close\n") == ["unclosed\n``` not a close\n"]
    assert code_blocks("````md\n```\ninner\n```\n````") == ["```\ninner\n```"]  # a longer fence holds a shorter one
    assert code_blocks("``` a`b\nnot a fence\n```\nx\n```") == ["x"]  # a backtick info string is no fence


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stream", "environ", "takes"),
    [
        (FakeTty(), {"TERM": "xterm-256color"}, True),
        (FakeTty(), {"TERM": "tmux-256color", "TMUX": "x"}, True),
        (FakeTty(), {"TERM": "dumb"}, False),
        (FakeTty(), {"TERM": "linux"}, False),
        (FakeTty(), {}, False),
        (io.StringIO(), {"TERM": "xterm-256color"}, False),  # a pipe or a file
        (FakeTty(), {"TERM": "xterm-256color", "LLMCHAT_CLIPBOARD": "file"}, False),
    ],
)
def test_which_terminals_get_osc52(stream, environ, takes):
    assert takes_osc52(stream, environ) is takes


def test_the_osc52_sequence():
    assert osc52("hi ü") == "\x1b]52;c;aGkgw7w=\x07"
    assert osc52("hi ü", tmux=True) == "\x1b]52;c;aGkgw7w=\x07\x1bPtmux;\x1b\x1b]52;c;aGkgw7w=\x07\x1b\\"
