"""A plain reply wrapped in the template's content markers (issue 39): Command R7B's
`<|START_RESPONSE|>…<|END_RESPONSE|>`, GigaChat3's `<|role_sep|>…<|message_sep|>`. The template
writes them around every earlier assistant message itself, so the reply shown, recorded and sent
back is without them (llmchat.turn.markers).

The real engine (the bundled SmolLM2) is held by a GBNF grammar to write the markers around its
reply, as a model of that template would. A template without markers streams as before: see
tests/test_chat_ui.py::test_reply_streams_and_summary_follows (stdout is exactly the reply, in
many fragments) and tests/test_ask.py::test_reply_goes_to_stdout_and_nothing_else.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llmchat.turn.markers import MarkerFilter, reply_content
from tests.test_chat_ui import ENTER, drive

R7B = Path(__file__).parent / "data" / "templates" / "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja"
GIGACHAT = Path(__file__).parent / "data" / "chat_cases" / "templates" / "GigaChat3-10B-A1.8B.jinja"
CHATML = Path(__file__).parent / "data" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
# (template, its markers): R7B's has a thinking block (its reply streams through the thinking
# split), GigaChat3's none (its reply streams as it comes).
WRAPPED = {
    "r7b": (R7B, "<|START_RESPONSE|>", "<|END_RESPONSE|>"),
    "gigachat3": (GIGACHAT, "<|role_sep|>", "<|message_sep|>"),
}
REPLY = "Hello there."
GREEDY = ("--temperature", "0", "--seed", "1", "--max-tokens", "64")


def wrapped_grammar(tmp_path: Path, opening: str, closing: str) -> Path:
    """A grammar that makes the model write `REPLY` inside the markers, as the template's model would."""
    path = tmp_path / "wrapped.gbnf"
    path.write_text(f'root ::= "{opening}{REPLY}{closing}"\n')
    return path


def r7b_options(smollm2_path: Path, tmp_path: Path) -> tuple[str, ...]:
    grammar = wrapped_grammar(tmp_path, *WRAPPED["r7b"][1:])
    return ("-m", str(smollm2_path), "--template", str(R7B), "--grammar", str(grammar), *GREEDY)


# --- ask and batch -------------------------------------------------------------------------------------
def test_ask_prints_the_reply_without_the_markers(cli, smollm2_path, tmp_path):
    result = cli("ask", "--no-history", *r7b_options(smollm2_path, tmp_path), "Hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == REPLY + "\n"


def test_ask_json_records_the_reply_without_the_markers(cli, smollm2_path, tmp_path):
    result = cli("ask", "--no-history", "--json", *r7b_options(smollm2_path, tmp_path), "Hi")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["reply"] == REPLY


@pytest.mark.parametrize("parallel", ["1", "2"])
def test_batch_records_the_replies_without_the_markers(cli, smollm2_path, tmp_path, parallel):
    items = tmp_path / "items.txt"
    items.write_text("Hi\nSay hello.\nGreet me.\n")
    result = cli("batch", str(items), "--progress", "off", "--parallel", parallel, *r7b_options(smollm2_path, tmp_path))
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["reply"] for line in result.stdout.splitlines()] == [REPLY] * 3


# --- a streamed chat turn ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(WRAPPED))
def test_a_streamed_chat_turn_shows_and_keeps_no_marker(smollm2_path, tmp_path, monkeypatch, capsys, name):
    """The chat streams the reply piece by piece without a marker, and the conversation, the history
    and the next prompt hold it as the template expects: the template adds the markers, once."""
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.output import StreamPrinter
    from llmchat.startup.loading import start_session
    from llmchat.turn.structured import structured_output
    from llmchat.ui import chat

    template, opening, closing = WRAPPED[name]
    options = RunOptions(model=str(smollm2_path), template=str(template), temperature=0.0, seed=1, max_tokens=64)
    session = start_session(options, config=load_config(), overflow="drop", with_history=True)
    fragments: list[str] = []

    class Recording(StreamPrinter):
        def text(self, fragment):
            fragments.append(fragment)
            super().text(fragment)

    monkeypatch.setattr(chat, "StreamPrinter", Recording)
    try:
        session.hold_to(structured_output(grammar_file=wrapped_grammar(tmp_path, opening, closing)))
        drive(session, "Hi" + ENTER + "/exit" + ENTER, show_stats=False)
        out, err = capsys.readouterr()
        assert out == REPLY + "\n", err
        assert len(fragments) > 1 and not any("<|" in fragment for fragment in fragments), fragments
        assert "<|" in session.last_result.raw_reply  # the model did write them
        assert session.last_result.reply == REPLY
        assert session.conversation.messages[-1]["content"] == REPLY
        stored = session.history.get(session.conversation_id).messages
        assert [m.content for m in stored if m.role == "assistant"] == [REPLY]
        following = session.prepare("Again").rendered_text
        # (GigaChat3's template puts a newline after its opening marker.)
        wrapped = re.escape(opening) + r"\s*" + re.escape(REPLY) + re.escape(closing)
        assert len(re.findall(wrapped, following)) == 1, following
        assert opening + opening not in following and closing + closing not in following
    finally:
        if session.history is not None:
            session.history.close()
        session.close()


# --- the stream filter and the reading agree -----------------------------------------------------------
@pytest.mark.parametrize(
    "raw",
    [
        "<|START_RESPONSE|>Hello there.<|END_RESPONSE|>",
        "  <|START_RESPONSE|>Hello <b> there.<|END_RESPONSE|>",
        "<|START_RESPONSE|>Cut off mid <|END_RESP",
        "Hello there.<|END_RESPONSE|>",
        "<|START_ACTION|>not the reply's marker",
        "<|START_RESPONSE",
        "\n\nA reply without markers, <| and all <",
    ],
)
def test_the_stream_shows_what_the_reading_keeps_one_character_at_a_time(raw):
    source = R7B.read_text()
    markers = MarkerFilter.of_template(source)
    shown = "".join(markers.feed(char) for char in raw) + markers.flush()
    assert shown == reply_content(source, raw)
    assert "START_RESPONSE|>" not in shown and "<|END_RESPONSE|>" not in shown


def test_a_template_without_markers_passes_every_fragment_through_at_once():
    source = CHATML.read_text()
    markers = MarkerFilter.of_template(source)
    assert markers.passes_through
    fragments = ["  <|START", "_RESPONSE|>Hi", " <", "|END_RESPONSE|>"]
    assert [markers.feed(fragment) for fragment in fragments] == fragments
    assert markers.flush() == ""
