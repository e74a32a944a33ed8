"""The defaults every mode reads, written once: ask, chat, batch and the manual (docs/) agree on them.

- The reply cap: a reply without `--max-tokens` (or an item's `max_tokens`) stops at
  `DEFAULT_REPLY_CAP` tokens, or where the context ends. Without a cap, a small model stuck in a
  loop (or a long story) ran until the window was full: minutes on a CPU. 2,048 tokens is about
  1,500 words, room for a long answer and a reasoning model's thinking.
- An invalid structured reply (cut off by the cap, or not what `--schema` asked) is kept and
  reported, never thrown away: `ask` exits `INVALID_REPLY_EXIT`; scripted `chat` prints the turn's
  record (its `error` says why) and exits with it at the end; interactive `chat` says so in one
  line and goes on; `batch` fails the item (its record carries the error).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmchat.errors import ExitCode

if TYPE_CHECKING:
    from llmchat.engine.sampling import SamplingParams

DEFAULT_REPLY_CAP = 2048
INVALID_REPLY_EXIT = ExitCode.OUTPUT
LOOP_NOTICE = "the reply kept repeating itself, so it was stopped (finish_reason loop); --no-loop-stop lets it run"


def reply_cap(sampling: SamplingParams) -> int:
    """The most tokens a reply may take: --max-tokens, else DEFAULT_REPLY_CAP."""
    return sampling.max_tokens if sampling.max_tokens is not None else DEFAULT_REPLY_CAP


def invalid_reply_line(error: str, turn: int | None = None) -> str:
    """The one line an invalid structured reply gets on stderr, in every mode."""
    where = f"turn {turn}: " if turn is not None else ""
    return f"llmchat: error: {where}{error}"
