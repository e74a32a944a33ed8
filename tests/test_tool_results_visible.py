"""A tool call's result in the chat: its first lines, dimmed, with its full length, right after the
call; `/show tools` prints the last turn's calls whole. The call is forced (`--tool-choice NAME`,
the grammar gate makes it parse) and its result is fixed text, so nothing here depends on what
the model writes; the arguments shown are checked against what the function received.
"""

from __future__ import annotations

import json
import os
import re
import sys

from llmchat.edges.safe_text import terminal_safe
from llmchat.tools.options import result_preview

ENTER = "\r"
SUMMARY = r"prompt \d+ \(\d+ cached\)"
RESULT_LINES = [
    "station report",
    "escape \x1b[31mred",  # a tool's output may hold escapes: shown as text, never run by the terminal
    "wind 3 m/s",
    "line four",
    "line five",
    "line six",
]
RESULT = "\n".join(RESULT_LINES)

FUNCTIONS = f'''
import json
from pathlib import Path


def record_city(city: str) -> str:
    """Record a city and give its weather.

    Args:
        city: The city.
    """
    with open(Path(__file__).with_name("calls.txt"), "a", encoding="utf-8") as out:
        out.write(json.dumps(city) + "\\n")
    return {RESULT!r}
'''


def plain(raw: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[78=>]|\r", "", raw)


def test_a_result_is_shown_after_its_call_and_in_full_with_show_tools(isolated_home, smollm2_path, tmp_path):
    import pexpect

    tools = tmp_path / "weather_tools.py"
    tools.write_text(FUNCTIONS, encoding="utf-8")
    env = dict(os.environ, LLMCHAT_HOME=str(isolated_home), TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1")
    env.pop("LLMCHAT_MODEL", None)
    args = ["-m", "llmchat", "chat", "-m", str(smollm2_path), "--temperature", "0", "--seed", "1", "--no-history"]
    args += ["--max-tokens", "48", "--chain-limit", "1", "--functions", str(tools), "--tool-choice", "record_city"]
    child = pexpect.spawn(
        sys.executable,
        [*args, "--approve-tools"],
        env=env,
        encoding="utf-8",
        codec_errors="replace",
        dimensions=(30, 160),
        timeout=300,
    )
    try:
        child.expect_exact("> ")
        child.send("/show tools" + ENTER)
        child.expect_exact("no reply yet in this conversation")
        child.expect_exact("> ")
        child.send("What is the weather in Paris?" + ENTER)
        child.expect_exact("tool call: record_city(")
        child.expect(SUMMARY)
        turn = child.before
        child.expect_exact("> ")
        child.send("/show tools" + ENTER)
        child.expect_exact("line six")
        shown = child.before + "line six"
        child.expect_exact("> ")
        child.send("/exit" + ENTER)
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)
    [city] = [json.loads(line) for line in (tmp_path / "calls.txt").read_text(encoding="utf-8").splitlines()]

    # After the call, dimmed: the length, the first three lines (the escape made harmless), what is left.
    size = f"tool result: {len(RESULT)} chars, 6 lines"
    assert f"\x1b[2m{size}\x1b[0m" in turn
    preview = plain(turn)
    after = preview[preview.index(size) :]
    assert after.splitlines()[1:5] == [
        "  │ station report",
        "  │ escape ␛[31mred",
        "  │ wind 3 m/s",
        "  │ … 3 more lines (/show tools prints them)",
    ]
    assert "\x1b[31mred" not in turn
    assert "line four" not in preview

    # /show tools: the call, its arguments as the function got them, the whole result.
    screen = plain(shown)
    assert re.search(rf"\[1\] record_city · ran in [\d.]+ s · result {len(RESULT)} chars, 6 lines", screen)
    arguments = screen[screen.index("arguments: ") + len("arguments: ") :]
    assert json.loads(arguments[: arguments.index("}") + 1]) == {"city": city}
    assert [terminal_safe(line) for line in RESULT_LINES] == [
        line for line in screen.splitlines() if line in {terminal_safe(x) for x in RESULT_LINES}
    ]
    assert "\x1b[31mred" not in shown


def test_result_preview_counts_what_it_leaves_out():
    assert result_preview("one line", 80) == ["tool result: 8 chars, 1 line", "  │ one line"]
    assert result_preview("", 80) == ["tool result: 0 chars, 1 line", "  │ "]
    long = "x" * 200 + "\n" + "y\n" * 4
    lines = result_preview(long, 40)
    assert lines[0] == f"tool result: {len(long)} chars, 5 lines"
    assert lines[1] == "  │ " + "x" * 35 + "…"  # cut to the terminal's width
    assert lines[-1] == "  │ … 2 more lines (/show tools prints them)"
    assert result_preview("a\tb\x1b[0m\x07", 80)[1] == "  │ a   b␛[0m␇"  # tabs as spaces, escapes shown


def test_ask_shows_the_call_but_keeps_its_stderr_as_before(cli, smollm2_path, tmp_path):
    """The preview is the interactive chat's: `ask` (a script's tool) says the call, not the result."""
    tools = tmp_path / "weather_tools.py"
    tools.write_text(FUNCTIONS, encoding="utf-8")
    run = cli(
        "ask", "-m", str(smollm2_path), "--temperature", "0", "--seed", "1", "--no-history", "--max-tokens", "48",
        "--chain-limit", "1", "--functions", str(tools), "--tool-choice", "record_city", "--approve-tools",
        "What is the weather in Paris?",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "tool call: record_city(" in run.stderr
    assert "tool result:" not in run.stderr
