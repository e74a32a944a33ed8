"""The room for a message's files (llmchat.turn.room): one rule for `-f` and `/file`, which counts
what the turn frees before it refuses a message (trimming the older exchanges, automatic
compaction) and says in a refusal what `/compact` would free.

The engine is the real SmolLM2 with a 2,048-token context; the conversations are filled with
exchanges written, not generated (tests/long_chats.py), so that the window is nearly full. The
summaries the model writes stop at their first blank line (a stop string), which ends them well
within their cap whatever the model writes.
"""

from __future__ import annotations

from dataclasses import replace
from io import StringIO

import pytest
from long_chats import FILLER, fill
from rich.console import Console

from llmchat.config import load_config
from llmchat.turn.attachments import compose, from_bytes
from llmchat.ui import slash
from llmchat.ui.context import CommandContext

FULL = 1900  # prompt tokens of the filled window, of the 2,040 a turn may take (8 kept for the reply)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from llmchat.options import RunOptions
    from llmchat.startup.loading import load_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMCHAT_HOME", str(tmp_path_factory.mktemp("load-home")))
        mp.delenv("LLMCHAT_MODEL", raising=False)
        result = load_model(RunOptions(ctx=2048, temperature=0.0, seed=1, max_tokens=8), config=load_config())
    yield result
    result.engine.close()


def _session(loaded, *, overflow: str, compact: str):
    from llmchat.turn.session import ChatSession

    session = ChatSession.start(
        loaded.engine,
        sampling=replace(loaded.sampling, stop=("\n\n",)),
        model_label=loaded.model.name,
        overflow=overflow,
        config=replace(load_config(), compact=compact),
    )
    fill(session, FULL)
    return session


@pytest.fixture
def notes(tmp_path):
    """A file of about 500 tokens: more than a full window has free, less than trimming or
    compacting its older exchanges frees."""
    path = tmp_path / "notes.txt"
    path.write_text("\n".join(f"{i}. {FILLER}" for i in range(6)) + "\n")
    return path


def _context(session) -> tuple[CommandContext, list[str], list[str]]:
    errors: list[str] = []
    infos: list[str] = []
    ctx = CommandContext(session, Console(file=StringIO(), width=200), error=errors.append, info=infos.append)
    return ctx, errors, infos


def _the_case(session, notes) -> int:
    """The file's tokens, checked to be the case this module is about."""
    from llmchat.turn.attachments import tokens_of
    from llmchat.turn.room import measure

    count, _ = tokens_of(session, from_bytes(str(notes), notes.read_bytes()))
    room = measure(session)
    assert room.free_now < count < room.free_now + room.compact_frees, (count, room)
    return count


def test_a_long_chat_takes_a_file_that_trimming_makes_room_for(loaded, notes):
    session = _session(loaded, overflow="drop", compact="off")
    _the_case(session, notes)
    ctx, errors, infos = _context(session)
    slash.dispatch(f"/file {notes}", ctx)
    assert errors == [], errors
    assert [a.path for a in ctx.attachments] == [str(notes)]
    assert any("the older exchanges leave the context (trimmed)" in line and "/compact first would free about" in line
               for line in infos), infos  # fmt: skip
    # The turn makes the room it was counted with: the file reaches the model, older exchanges go.
    result = session.turn(compose(tuple(ctx.attachments), "What is the lighthouse painted?"))
    assert result.stats.messages_dropped > 0 and result.user.startswith(f'<file path="{notes}">')
    assert result.stats.prompt_tokens <= 2048 - 8


def test_without_trimming_the_refusal_says_what_compact_frees_and_compact_makes_the_room(loaded, notes):
    import re

    from llmchat.turn.compaction import compact_now

    session = _session(loaded, overflow="error", compact="off")
    count = _the_case(session, notes)
    ctx, errors, infos = _context(session)
    slash.dispatch(f"/file {notes}", ctx)
    assert ctx.attachments == [] and len(errors) == 1, errors
    (refusal,) = errors
    found = re.search(r"and /compact would free about ([\d,]+); run /compact first", refusal)
    assert found and f"{count:,} tokens) does not fit" in refusal, refusal
    assert "trimmed" not in refusal  # --overflow error: the turn trims nothing
    frees = int(found.group(1).replace(",", ""))
    done = compact_now(session)
    assert done is not None and done.failure is None, done and done.failure
    assert done.freed >= frees - 8, (done.freed, frees)  # "about": the summary at most at its cap
    errors.clear()
    slash.dispatch(f"/file {notes}", ctx)
    assert errors == [] and [a.path for a in ctx.attachments] == [str(notes)]


def test_automatic_compaction_is_counted_where_the_turn_does_not_trim(loaded, notes):
    session = _session(loaded, overflow="error", compact="auto")
    _the_case(session, notes)
    ctx, errors, infos = _context(session)
    slash.dispatch(f"/file {notes}", ctx)
    assert errors == [], errors
    assert any("the older exchanges are summarised first (compact = auto)" in line for line in infos), infos
    result = session.turn(compose(tuple(ctx.attachments), "What is the lighthouse painted?"))
    assert any(line.startswith("context: compacted") for line in result.notices), result.notices
    assert result.user.startswith(f'<file path="{notes}">') and session.conversation.summary is not None


def test_a_file_no_room_can_hold_is_refused_with_every_way_counted(loaded, tmp_path):
    session = _session(loaded, overflow="drop", compact="off")
    big = tmp_path / "big.txt"
    big.write_text(FILLER * 40)  # about 3,500 tokens: more than the whole context
    ctx, errors, _ = _context(session)
    slash.dispatch(f"/file {big}", ctx)
    assert ctx.attachments == [] and len(errors) == 1, errors
    (refusal,) = errors
    assert "does not fit" in refusal and "with the older exchanges trimmed" in refusal, refusal
    assert "/compact would free about" in refusal and refusal.endswith("; raise --ctx or attach less")
    assert "run /compact first" not in refusal
