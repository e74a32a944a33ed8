"""Ctrl-C and slow look-ups while the chat runs a slash command, and Tab completion that never
stops typing.

- A Ctrl-C before a command changes anything cancels it, and the chat stays at its prompt (it
  used to end the whole chat with exit 130); once the command has begun to change the chat (a
  conversation loaded, a history write), the Ctrl-C waits until the change is whole.
- Completion runs on its own thread, never starts an MCP server, and reads the history once per
  prompt, not on every key.

The in-process tests drive the real chat on SmolLM2 with prompt-toolkit reading keys from a pipe
(tests/test_chat_ui.py's `drive`); the signal is a real SIGINT sent to this process at the chosen
moment. The last test runs the real CLI in a pseudo-terminal against a real MCP server whose
resource never answers.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from llmchat import interrupts
from llmchat.turn.conversation import Conversation
from llmchat.ui.chat import ChatUI
from llmchat.ui.completer import SlashCompleter
from tests.test_chat_ui import CTRL_C, ENTER, FakeSession, _session, _spawn_chat, drive, loaded  # noqa: F401


def _sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)


@pytest.fixture
def session(loaded):  # noqa: F811
    chat_session = _session(loaded)
    yield chat_session
    if chat_session.history is not None:
        chat_session.history.close()


def _saved_conversation(session) -> str:
    """Say something so that the history holds a conversation; its id. Then start a new one."""
    drive(session, "Say hello." + ENTER)
    saved = session.conversation_id
    assert saved is not None
    session.new_conversation()
    return saved


def test_ctrl_c_before_a_command_changes_anything_cancels_it_and_the_chat_goes_on(session, capsys, monkeypatch):
    saved = _saved_conversation(session)
    history = session.history
    reading = history.get

    def slow_read(reference):
        _sigint()  # the user gives up while the history is read
        return reading(reference)

    monkeypatch.setattr(history, "get", slow_read)
    drive(session, f"/load {saved}" + ENTER + "Say bye." + ENTER)
    _, err = capsys.readouterr()
    assert "[/load interrupted; nothing changed]" in err
    users = [m["content"] for m in session.conversation.messages if m["role"] == "user"]
    assert users == ["Say bye."], "nothing was loaded, and the chat went on to the next message"
    assert session.conversation_id != saved
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the handler is restored"


def test_ctrl_c_once_a_command_changes_the_chat_waits_until_the_change_is_whole(session, capsys, monkeypatch):
    saved = _saved_conversation(session)
    building = Conversation.from_stored

    def slow_build(stored):
        _sigint()  # lands inside load_conversation: the conversation is being replaced
        return building(stored)

    monkeypatch.setattr(Conversation, "from_stored", staticmethod(slow_build))
    drive(session, f"/load {saved}" + ENTER)
    _, err = capsys.readouterr()
    assert "[/load was already changing the chat when Ctrl-C came; it finished]" in err
    assert session.conversation_id == saved, "the id and the conversation changed together"
    assert [m["content"] for m in session.conversation.messages if m["role"] == "user"] == ["Say hello."]
    assert not interrupts.interrupt_pending(), "the held Ctrl-C was taken, not left for the next reply"


def test_a_held_ctrl_c_sends_nothing_and_leaves_the_message_at_the_prompt(session, capsys, monkeypatch):
    """/retry removes the last exchange and would send its message again; a Ctrl-C that came
    while it removed it stops the sending, and the message waits at the prompt instead."""
    drive(session, "Say hello." + ENTER)
    dropping = session.conversation.drop_last_exchange

    def slow_drop():
        _sigint()
        return dropping()

    monkeypatch.setattr(session.conversation, "drop_last_exchange", slow_drop)
    seen_at_prompt = []
    original_prompt = ChatUI.build_prompt

    def recording_prompt(ui):
        prompt = original_prompt(ui)
        asking = prompt.prompt

        def ask(message, default=""):
            seen_at_prompt.append(default)
            return asking(message, default=default)

        prompt.prompt = ask  # type: ignore[method-assign]
        return prompt

    monkeypatch.setattr(ChatUI, "build_prompt", recording_prompt)
    drive(session, "/retry" + ENTER + CTRL_C)  # Ctrl-C clears the line it waits on, Ctrl-D exits
    _, err = capsys.readouterr()
    assert "[/retry was already changing the chat when Ctrl-C came; it finished]" in err
    assert session.conversation.messages == [], "the exchange is gone, and no new reply was made"
    assert "Say hello." in seen_at_prompt, "the message is back at the prompt, to send or edit"


# --------------------------------------------------------------------------- completion


class CountingHistory:
    def __init__(self):
        self.reads = 0
        self.threads: list[threading.Thread] = []

    def list_conversations(self, limit):
        self.reads += 1
        self.threads.append(threading.current_thread())
        return [SimpleNamespace(id="01abc", name="my chat", preview="hello")]


def test_the_chat_completes_on_a_thread_of_its_own():
    """The prompt's completer, as the prompt calls it while the user types: the look-up (here the
    history's) runs on another thread, so a slow one never holds the keys back."""
    import asyncio

    from prompt_toolkit.completion import CompleteEvent
    from prompt_toolkit.document import Document

    fake = FakeSession()
    fake.history = CountingHistory()
    ui = ChatUI(fake, show_stats=False, markdown=False, verbose=False)  # type: ignore[arg-type]
    prompt = ui.build_prompt()
    active = prompt.default_buffer.completer.get_completer()  # type: ignore[attr-defined]

    async def complete() -> list[str]:
        return [c.text async for c in active.get_completions_async(Document("/load my"), CompleteEvent())]

    assert asyncio.run(complete()) == ["my chat"]
    assert fake.history.threads and threading.main_thread() not in fake.history.threads


def test_load_reads_the_history_once_per_prompt_not_on_every_key():
    fake = FakeSession()
    fake.history = CountingHistory()
    completer = SlashCompleter(fake)  # type: ignore[arg-type]
    for typed in ("/load ", "/load m", "/load my", "/load my ", "/load my c"):
        completer.candidates(typed)
    assert fake.history.reads == 1
    assert completer.candidates("/load my")[1] == [("my chat", "hello")]
    completer.new_prompt()  # a reply was saved since: read again at the next prompt
    completer.candidates("/load 01")
    assert fake.history.reads == 2


def _marking_server(tmp_path, body: str) -> str:
    """An MCP server over stdio, `mcp-server-slow` (so it is named `slow`), written for the test."""
    script = tmp_path / "mcp-server-slow"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\nfrom pathlib import Path\n\nimport anyio\nfrom mcp.server.mcpserver import MCPServer\n\n"
        "MARK = Path(sys.argv[1])\nserver = MCPServer('slow')\n" + body + "\nserver.run()\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_completion_never_starts_a_server(tmp_path):
    """Typing `/file mcp:slow/` lists nothing from a server that is not running, and starts none;
    once it runs (a /file or /resources started it), its resources complete."""
    from llmchat.tools.mcp.sources import McpSources

    started = tmp_path / "started"
    spec = _marking_server(
        tmp_path,
        "MARK.write_text('started')\n\n@server.resource('note://one')\ndef one() -> str:\n    return 'one'\n",
    )
    with McpSources(SimpleNamespace(mcp={}), [f"{spec} {started}"]) as sources:
        completer = SlashCompleter(None, sources)
        assert completer.candidates("/file mcp:")[1] == [("mcp:slow/", "MCP server")]
        for typed in ("/file mcp:slow/", "/file mcp:slow/n", "/prompt mcp:slow/"):
            assert completer.candidates(typed)[1] == []
        assert sources.running("slow") is None and not started.exists(), "no key started the server"
        sources.connection("slow")  # what /file mcp:slow/... does
        assert started.exists()
        assert completer.candidates("/file mcp:slow/n")[1] == [("mcp:slow/note://one", "text/plain")]


def test_ctrl_c_while_a_resource_is_read_leaves_the_chat_at_its_prompt(isolated_home, tmp_path):
    """The whole CLI on a terminal: `/file mcp:slow/slow://never` waits on a resource that never
    comes; one Ctrl-C cancels the read, the chat says so and goes on, and /exit ends it with 0."""
    reading = tmp_path / "reading"
    spec = _marking_server(
        tmp_path,
        "@server.resource('slow://never')\nasync def never() -> str:\n"
        "    MARK.write_text('reading')\n    await anyio.sleep_forever()\n    return ''\n",
    )
    pexpect, child = _spawn_chat(isolated_home, "--mcp", f"{spec} {reading}")
    try:
        child.expect_exact("> ")
        child.send("/file mcp:slow/slow://never" + ENTER)
        deadline = time.monotonic() + 120  # the server's start, bounded: the read has begun when the mark is there
        while not reading.exists():
            assert time.monotonic() < deadline, "the resource read never began"
            child.expect([pexpect.TIMEOUT, pexpect.EOF], timeout=0.2)
            assert child.isalive(), child.before
        child.sendintr()
        child.expect_exact("[/file interrupted; nothing changed]")
        child.expect_exact("> ")
        child.send("/files" + ENTER)
        child.expect_exact("no files attached")
        child.expect_exact("> ")
        child.send("/exit" + ENTER)
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)
