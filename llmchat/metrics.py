"""Per-turn statistics with honest definitions (the README repeats them).

- TTFT: from submitting the prompt until the first reply token is written. It covers template
  rendering, tokenizing, prefill and the first sample.
- Prefill tok/s: prompt tokens actually evaluated (not those reused from the KV cache) divided by
  the prefill time (start of evaluation to the first sampled token).
- Decode tok/s: (generated - 1) divided by the time from the first to the last token; the first
  token belongs to prefill.

Nothing here renders; `render.py` formats these.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class TurnStats:
    ttft_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    context_used: int = 0
    context_limit: int = 0
    messages_dropped: int = 0
    tokens_dropped: int = 0
    finish_reason: str = "stop"
    draft_proposed: int = 0
    draft_accepted: int = 0

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens evaluated this turn: the rest came from the KV cache."""
        return self.prompt_tokens - self.cached_tokens

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        return (self.generated_tokens - 1) / self.decode_s if self.generated_tokens > 1 and self.decode_s > 0 else 0.0

    @property
    def draft_acceptance(self) -> float | None:
        return self.draft_accepted / self.draft_proposed if self.draft_proposed else None

    def to_dict(self) -> dict:
        """The JSON shape used by `--json`, batch output and history."""
        data = asdict(self)
        data.update(
            ttft_s=round(self.ttft_s, 4),
            prefill_s=round(self.prefill_s, 4),
            decode_s=round(self.decode_s, 4),
            total_s=round(self.total_s, 4),
            prefill_tokens=self.prefill_tokens,
            prefill_tok_s=round(self.prefill_tok_s, 2),
            decode_tok_s=round(self.decode_tok_s, 2),
        )
        if self.draft_proposed:
            data["draft_acceptance"] = round(self.draft_acceptance or 0.0, 4)
        else:
            del data["draft_proposed"], data["draft_accepted"]
        return data

    def trim_notice(self, prompt_limit: int) -> str:
        """What a trim dropped, said on stderr after the turn (empty when nothing was dropped)."""
        if not self.messages_dropped:
            return ""
        return (
            f"context: dropped {self.messages_dropped} oldest messages ({self.tokens_dropped:,} tokens) "
            f"to fit {prompt_limit:,}"
        )

    def summary(self) -> str:
        """The dim one-line summary after each reply."""
        parts = [
            f"TTFT {self.ttft_s * 1000:.0f} ms",
            f"{self.decode_tok_s:.1f} tok/s",
            f"{self.generated_tokens} tokens",
            f"prompt {self.prompt_tokens} ({self.cached_tokens} cached)",
            f"ctx {self.context_used}/{self.context_limit}",
        ]
        if self.draft_proposed:
            parts.append(f"draft accepted {self.draft_acceptance:.0%}")
        if self.finish_reason != "stop":
            parts.append(self.finish_reason)
        return " · ".join(parts)
