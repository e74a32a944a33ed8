"""Markdown rendered while a reply streams (`--render markdown`), and plain text off a terminal.

The renderer's logic (block splitting, unclosed fences, the throttle, finished blocks printed once)
is fed token strings and a fake clock, and its frames are played on pyte, a terminal emulator
with a scrollback, so the tests assert what a user's screen shows, not escape sequences. The end
to end tests run the real chat and ask on SmolLM2 with the reply pinned by a grammar (a GBNF whose
root is one exact string), under a real 24x80 pseudo-terminal, and piped.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import signal
import sys
from pathlib import Path

import pyte
import pytest
from rich.console import Console
from rich.markdown import Markdown

from llmchat.errors import UsageError
from llmchat.turn.metrics import TurnStats
from llmchat.turn.record import TurnResult
from llmchat.ui.markdown import MarkdownPrinter, wants_markdown
from llmchat.ui.markdown_stream import (
    FRAME_INTERVAL_S,
    RENDER_SHARE,
    SYNC_END,
    UP_AND_ERASE,
    MarkdownStream,
    split_blocks,
)
from tests.conftest import run_cli

ROWS, COLUMNS = 24, 80

# A reply longer than a 24-row screen, with a heading, emphasis, a Python fence, a table and a list.
PINNED = (
    "# Release notes\n\nThis reply is held by a **grammar**, word for word.\n\n"
    "```python\ndef add(a, b):\n    return a + b\n```\n\n"
    "| name | value |\n|------|-------|\n| alpha | 1 |\n| beta | 2 |\n\n"
    + "".join(f"Note {n} of 12.\n\n" for n in range(1, 13))
    + "- first item\n- second item\n\nThe end."
)


# --------------------------------------------------------------------------- helpers


def fixed_clock() -> float:
    """The renderer's cost clock in tests: drawing takes no time, so only the throttle decides."""
    return 0.0


def console(rows: int = ROWS, columns: int = COLUMNS) -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=columns, height=rows, highlight=False)


def play(raw: str, rows: int = ROWS, columns: int = COLUMNS, *, translate_newlines: bool = True) -> list[str]:
    """What a terminal shows after `raw`: its scrollback, then its screen, each line right-stripped."""
    screen = pyte.HistoryScreen(columns, rows, history=10_000)
    pyte.Stream(screen).feed(raw.replace("\n", "\r\n") if translate_newlines else raw)
    scrolled = [line for line in screen.history.top]
    lines = ["".join(line[x].data for x in range(columns)).rstrip() for line in scrolled]
    lines += [line.rstrip() for line in screen.display]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def rendered_at_once(text: str, columns: int = COLUMNS) -> list[str]:
    """rich's rendering of the whole reply in one piece, as plain lines."""
    plain = Console(file=io.StringIO(), force_terminal=False, width=columns, highlight=False)
    plain.print(Markdown(text))
    lines = [line.rstrip() for line in plain.file.getvalue().split("\n")]  # type: ignore[attr-defined]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def stream(text: str, *, chunk: int = 3, step: float = 0.02, rows: int = ROWS) -> tuple[list[str], MarkdownStream]:
    """Feed `text` in `chunk`-character fragments, `step` seconds apart; the frames, the last one from close()."""
    renderer = MarkdownStream(console(rows), cost_clock=fixed_clock)
    frames, now = [], 0.0
    for start in range(0, len(text), chunk):
        now += step
        frames.append(renderer.feed(text[start : start + chunk], now))
    frames.append(renderer.close())
    return frames, renderer


# --------------------------------------------------------------------------- block splitting


def sources(text: str) -> tuple[list[str], str]:
    blocks, offset = split_blocks(text)
    return [block.source for block in blocks], text[offset:]


def test_a_paragraph_is_finished_by_a_blank_line_or_the_next_block():
    assert sources("Hello there,\nworld") == ([], "Hello there,\nworld")
    assert sources("Hello there,\nworld.\n") == ([], "Hello there,\nworld.\n"), "more lines may follow"
    assert sources("Hello.\n\nNext") == (["Hello.\n"], "\nNext")
    assert sources("Intro:\n```python\n") == (["Intro:\n"], "```python\n"), "a fence interrupts a paragraph"
    assert sources("Page\x0cbreak\u2028here.\n\nNext") == (["Page\x0cbreak\u2028here.\n"], "\nNext"), (
        "only \\n ends a line"
    )


def test_headings_and_rules_are_finished_at_the_end_of_their_line():
    assert sources("# Title") == ([], "# Title"), "the line being written is never decided on"
    assert sources("# Title\n") == (["# Title\n"], "")
    assert sources("# Title\nText\n") == (["# Title\n"], "Text\n"), "an underline may still make it a heading"
    assert sources("Text\n---\n") == (["Text\n---\n"], "")
    assert sources("Text\n\n---\nmore") == (["Text\n", "---\n"], "more")


def test_a_fence_is_code_until_it_closes():
    open_fence = "```python\ndef f():\n\n    return 1\n"
    assert sources(open_fence) == ([], open_fence), "a blank line inside a fence does not end it"
    assert sources(open_fence + "``") == ([], open_fence + "``"), "a closing fence still being written"
    closed = open_fence + "```\n"
    assert sources(closed + "After") == ([closed], "After")
    assert sources("~~~~\ncode\n~~~\n") == ([], "~~~~\ncode\n~~~\n"), "a shorter fence does not close it"


def test_a_table_is_finished_by_a_blank_line():
    table = "| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert sources(table) == ([], table), "more rows may follow"
    assert sources(table + "\n") == ([table], "\n")


def test_a_list_stays_open_across_blank_lines_until_another_block():
    loose = "- one\n\n- two\n\n"
    assert sources(loose) == ([], loose), "a loose list's next item may follow a blank line"
    assert sources(loose + "Done.\n") == ([loose], "Done.\n")


# --------------------------------------------------------------------------- frames


def test_the_streamed_reply_ends_as_rich_renders_it_whole_and_each_block_once():
    frames, renderer = stream(PINNED)
    shown = play("".join(frames))
    assert shown == rendered_at_once(PINNED)
    assert sum("Release notes" in line for line in shown) == 1
    for n in range(1, 13):
        assert sum(f"Note {n} of 12." in line for line in shown) == 1
    assert not any("```" in line or "**" in line or "|" in line for line in shown)
    assert any("alpha" in line for line in shown) and any("─" in line for line in shown), "a drawn table"
    assert renderer.frames > 10, "drawn while it streamed, not once at the end"


@pytest.mark.parametrize("chunk", [1, 7, 40])
def test_any_split_of_the_tokens_shows_the_same(chunk):
    frames, _ = stream(PINNED, chunk=chunk, step=0.05)
    assert play("".join(frames)) == rendered_at_once(PINNED)


def test_finished_blocks_are_written_once_and_never_redrawn():
    # Each note arrives whole with its blank line: once finished, no later frame writes it again.
    renderer = MarkdownStream(console(), cost_clock=fixed_clock)
    frames = [renderer.feed(f"Note {n} of 12.\n\n", float(n)) for n in range(1, 13)]
    frames.append(renderer.close())
    for n in range(1, 13):
        assert sum(f"Note {n} of 12." in frame for frame in frames) == 1, n


def test_an_unclosed_fence_renders_as_highlighted_code():
    renderer = MarkdownStream(console(), cost_clock=fixed_clock)
    frame = renderer.feed("Here:\n\n```python\ndef add(a, b):\n    return a + b\n", 0.0)
    shown = play(frame)
    assert "def add(a, b):" in "\n".join(shown) and not any("```" in line for line in shown)
    keyword = re.search(r"\x1b\[[0-9;]*m(def)\x1b", frame)
    assert keyword, "the keyword carries a colour of its own (Python highlighting)"
    closed = renderer.feed("```\n\nAfter.", 1.0) + renderer.close()
    assert play(frame + closed)[-1] == "After."


def test_frames_are_throttled_to_about_fifteen_a_second():
    renderer = MarkdownStream(console(), cost_clock=fixed_clock)
    frames = [renderer.feed("word ", tick / 1000) for tick in range(2000)]  # a token a millisecond, 2 s
    drawn = [frame for frame in frames if frame]
    assert 28 <= len(drawn) <= 2 / FRAME_INTERVAL_S + 1
    assert frames[0], "the first fragment is drawn at once"


def test_slow_frames_are_drawn_less_often():
    ticks = iter(range(10**6))

    def slow_clock() -> float:  # each frame reads it twice: every frame takes 10 ms
        return next(ticks) * 0.010

    renderer = MarkdownStream(console(), cost_clock=slow_clock)
    drawn = [frame for tick in range(2000) if (frame := renderer.feed("word ", tick / 1000))]
    assert 2 <= len(drawn) <= 2 / (0.010 / RENDER_SHARE) + 1, "drawing stays within its share of the time"


def test_a_live_block_taller_than_the_screen_keeps_its_top_for_good():
    code = "```\n" + "".join(f"line {n}\n" for n in range(60)) + "```\n"
    rows = 12
    frames, _ = stream(code, chunk=5, rows=rows)
    for frame in frames:  # the erase never reaches above the screen (the bottom row is the readout's)
        assert frame.count(UP_AND_ERASE) <= rows - 3
    shown = play("".join(frames), rows=rows)
    assert shown == rendered_at_once(code)
    assert [line.strip() for line in shown if line.strip().startswith("line ")] == [f"line {n}" for n in range(60)]


def test_a_ctrl_c_while_a_frame_is_computed_leaves_the_screen_right(monkeypatch):
    renderer = MarkdownStream(console(), cost_clock=fixed_clock)
    frames = [renderer.feed("Note 1 of 12.\n\nNote 2", 0.0)]
    drawing = renderer._render

    def interrupted(source):
        raise KeyboardInterrupt

    monkeypatch.setattr(renderer, "_render", interrupted)
    with pytest.raises(KeyboardInterrupt):
        renderer.feed(" of 12.\n\nNote 3", 1.0)
    monkeypatch.setattr(renderer, "_render", drawing)
    frames.append(renderer.close())  # the interrupted reply's final frame
    assert play("".join(frames)) == rendered_at_once("Note 1 of 12.\n\nNote 2 of 12.\n\nNote 3")


class SlowTerminal(io.StringIO):
    """A terminal over a slow link: the next long write is cut in two by a real SIGINT."""

    interrupt_next = False

    def write(self, text: str) -> int:
        if not (self.interrupt_next and len(text) > 1):
            return super().write(text)
        self.interrupt_next = False
        half = len(text) // 2
        super().write(text[:half])
        os.kill(os.getpid(), signal.SIGINT)  # Python runs the handler here, mid-frame
        return half + super().write(text[half:])


def test_a_ctrl_c_while_a_frame_is_written_waits_until_the_frame_is_whole():
    """The frame is written whole and the Ctrl-C goes to the decode loop's next checkpoint; the
    interrupted reply's final frame then erases exactly the rows that were drawn."""
    from llmchat import interrupts

    out = SlowTerminal()
    printer = MarkdownPrinter(out, io.StringIO(), show_live=False, show_summary=False, console=console())
    printer.markdown = MarkdownStream(printer.console, interval=0, cost_clock=fixed_clock)  # every fragment draws
    printer.prefill_started(10, 0, 2048)
    try:
        with interrupts.FirstCtrlCOnly():
            printer.text("Note 1 of 12.\n\nNote 2")
            out.interrupt_next = True
            with pytest.raises(KeyboardInterrupt):
                printer.text(" of 12.\n\nNote 3")
                assert not out.interrupt_next, "the write was cut by the signal"
                interrupts.raise_pending()  # the decode loop's checkpoint after the token
            printer.abort()  # the final frame of the interrupted reply
    finally:
        interrupts.consume()
    assert play(out.getvalue()) == rendered_at_once("Note 1 of 12.\n\nNote 2 of 12.\n\nNote 3")


def test_an_empty_reply_writes_nothing():
    renderer = MarkdownStream(console(), cost_clock=fixed_clock)
    assert renderer.feed("", 0.0) == "" and renderer.close() == ""


# --------------------------------------------------------------------------- the printer


def finished(reply: str) -> TurnResult:
    return TurnResult(user="q", reply=reply, finish_reason="stop", stats=TurnStats(generated_tokens=3), seed=1)


def test_the_printer_renders_the_answer_and_keeps_the_thinking_dim_on_stderr():
    out, err = io.StringIO(), io.StringIO()
    printer = MarkdownPrinter(
        out, err, show_live=False, show_summary=True, out_isatty=True, err_isatty=True, console=console()
    )
    printer.prefill_started(10, 0, 2048)
    for piece in ("Let me ", "think."):
        printer.thinking(piece)
    for index, piece in enumerate(("Some ", "**bold** ", "text.\n\n", "| a | b |\n|---|---|\n", "| 1 | 2 |")):
        printer.text(piece)
        printer.token(index + 1, 0.0, 0.0)
    printer.finished(finished("Some **bold** text.\n\n| a | b |\n|---|---|\n| 1 | 2 |"))
    assert err.getvalue().startswith("\x1b[2mLet me \x1b[0m\x1b[2mthink.\x1b[0m\n\n"), "dim, and apart from the answer"
    shown = play(out.getvalue())
    assert shown[0] == "Some bold text." and any("─" in line for line in shown)
    assert "TTFT" in err.getvalue(), "the summary follows"


def test_a_tool_round_leaves_its_text_printed_before_the_calls():
    out = io.StringIO()
    printer = MarkdownPrinter(out, io.StringIO(), show_live=False, show_summary=False, console=console())
    printer.prefill_started(10, 0, 2048)
    printer.text("Checking the **weather**")
    printer.round_ended()
    round_one = out.getvalue()
    assert play(round_one) == ["Checking the weather"] and round_one.endswith("\n" + SYNC_END)
    printer.prefill_started(20, 10, 2048)
    printer.text("Sunny.")
    printer.finished(finished("Sunny."))
    assert play(out.getvalue()) == ["Checking the weather", "Sunny."]


# --------------------------------------------------------------------------- choosing the mode


def test_markdown_on_a_terminal_by_default_and_plain_off_it_always():
    assert wants_markdown(None, None, stdout_isatty=True)
    assert not wants_markdown("plain", None, stdout_isatty=True)
    assert not wants_markdown(None, "plain", stdout_isatty=True)
    assert wants_markdown("markdown", "plain", stdout_isatty=True), "the flag wins over the config"
    for choice in (None, "markdown", "plain"):
        assert not wants_markdown(choice, "markdown", stdout_isatty=False)
    with pytest.raises(UsageError, match="--render must be markdown or plain, not 'rich'"):
        wants_markdown("rich", None, stdout_isatty=True)


def test_config_render_is_checked(tmp_path):
    from llmchat.config import load_config
    from llmchat.errors import ConfigError

    path = tmp_path / "config.toml"
    path.write_text('render = "plain"\n')
    assert load_config(path).render == "plain"
    path.write_text('render = "fancy"\n')
    with pytest.raises(ConfigError, match='render must be "markdown" or "plain"'):
        load_config(path)
    path.write_text("markdown = true\n")
    with pytest.raises(ConfigError, match="unknown key 'markdown'"):
        load_config(path)


@pytest.mark.parametrize("command", [("ask", "hi"), ("chat",)])
def test_a_bad_render_value_is_one_line_and_exit_2(isolated_home, command):
    result = run_cli(*command, "--render", "fancy")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["llmchat: error: --render must be markdown or plain, not 'fancy'"]
    assert "Traceback" not in result.stderr


def test_the_markdown_flag_is_gone(isolated_home):
    result = run_cli("chat", "--markdown")
    assert result.returncode == 2 and "--markdown" in result.stderr and "Traceback" not in result.stderr


# --------------------------------------------------------------------------- end to end, real model


def grammar_for(text: str, folder: Path) -> Path:
    """A GBNF whose root is `text` exactly: the model can write nothing else."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    path = folder / "pinned.gbnf"
    path.write_text(f'root ::= "{escaped}"\n')
    return path


def stored_reply(home: Path) -> str:
    from llmchat.store.history import HistoryStore

    with HistoryStore.open(home / "history.db") as store:
        messages = store.get("last").messages
    assert [m.role for m in messages] == ["user", "assistant"]
    return messages[1].content


PINNED_ARGS = ("--temperature", "0", "--max-tokens", "600")
SUMMARY = r"prompt \d+ \(\d+ cached\) · ctx \d+/\d+"


@pytest.mark.model
@pytest.mark.tty
def test_chat_renders_markdown_on_a_small_terminal(isolated_home, tmp_path):
    import pexpect

    grammar = grammar_for(PINNED, tmp_path)
    env = dict(os.environ, TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1", COLUMNS=str(COLUMNS), LINES=str(ROWS))
    child = pexpect.spawn(
        sys.executable,
        ["-m", "llmchat", "chat", "--grammar", str(grammar), *PINNED_ARGS],
        env=env,
        encoding="utf-8",
        codec_errors="replace",
        dimensions=(ROWS, COLUMNS),
        timeout=300,
    )
    seen = io.StringIO()
    child.logfile_read = seen
    try:
        child.expect_exact("> ")
        child.send("Write the release notes.\r")
        child.expect(SUMMARY)  # the summary line, after the reply
        child.expect_exact("> ")
        child.send("/exit\r")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, seen.getvalue()[-2000:]
    assert stored_reply(isolated_home) == PINNED, "the grammar pinned the reply"
    shown = play(seen.getvalue(), translate_newlines=False)
    text = "\n".join(shown)
    assert len(shown) > ROWS, "the reply is longer than the screen: its top is in the scrollback"
    assert sum("Release notes" in line for line in shown) == 1, "the first block, printed once"
    assert "def add(a, b):" in text and "return a + b" in text
    assert "```" not in text and "**" not in text
    table = [line for line in shown if "alpha" in line or "─" in line]
    assert len(table) >= 2 and not any("|" in line for line in table), "the table is drawn with box lines"
    for n in range(1, 13):
        assert sum(f"Note {n} of 12." in line for line in shown) == 1, n
    assert re.search(r"TTFT \d+ ms · [\d.]+ tok/s", text), "the readout's summary"


@pytest.mark.model
@pytest.mark.tty
def test_ask_on_a_terminal_renders_the_same_way(isolated_home, tmp_path):
    import pexpect

    grammar = grammar_for(PINNED, tmp_path)
    env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(COLUMNS), LINES=str(ROWS))
    child = pexpect.spawn(
        sys.executable,
        ["-m", "llmchat", "ask", "--grammar", str(grammar), *PINNED_ARGS, "Write the release notes."],
        env=env,
        encoding="utf-8",
        codec_errors="replace",
        dimensions=(ROWS, COLUMNS),
        timeout=300,
    )
    seen = io.StringIO()
    child.logfile_read = seen
    try:
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, seen.getvalue()[-2000:]
    shown = play(seen.getvalue(), translate_newlines=False)
    at_once = rendered_at_once(PINNED)
    start = shown.index(at_once[0])  # after the model's line on stderr
    assert shown[start : start + len(at_once)] == at_once, "the screen ends as rich renders the whole reply"
    assert re.search(r"TTFT \d+ ms · [\d.]+ tok/s", "\n".join(shown[start + len(at_once) :])), "then the summary"


@pytest.mark.model
def test_off_a_terminal_every_mode_writes_exactly_what_the_model_wrote(isolated_home, tmp_path):
    grammar = grammar_for(PINNED, tmp_path)
    outputs = {}
    for mode in ("markdown", "plain"):
        result = run_cli("ask", "--grammar", str(grammar), *PINNED_ARGS, "--render", mode, "Write the notes.")
        assert result.returncode == 0, result.stderr
        outputs[mode] = result.stdout
        assert stored_reply_last(isolated_home) == PINNED
    assert outputs["markdown"] == outputs["plain"] == PINNED + "\n"


def stored_reply_last(home: Path) -> str:
    from llmchat.store.history import HistoryStore

    with HistoryStore.open(home / "history.db") as store:
        return store.get("last").messages[-1].content


@pytest.mark.model
@pytest.mark.tty
def test_a_chat_on_a_terminal_with_stdout_to_a_file_writes_plain_text(isolated_home, tmp_path):
    import pexpect

    grammar = grammar_for(PINNED, tmp_path)
    out = tmp_path / "reply.txt"
    command = shlex.join(
        [sys.executable, "-m", "llmchat", "chat", "--render", "markdown", "--grammar", str(grammar), *PINNED_ARGS]
    )
    child = pexpect.spawn(
        "/bin/sh",
        ["-c", f"exec {command} > {shlex.quote(str(out))}"],
        env=dict(os.environ, TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1"),
        encoding="utf-8",
        codec_errors="replace",
        dimensions=(ROWS, COLUMNS),
        timeout=300,
    )
    try:
        child.expect_exact("> ")  # the prompt is on the terminal (stderr)
        child.send("Write the release notes.\r")
        child.expect(SUMMARY)
        child.expect_exact("> ")
        child.send("/exit\r")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert out.read_bytes() == (PINNED + "\n").encode(), "byte for byte what the model wrote"
    assert stored_reply(isolated_home) == PINNED
