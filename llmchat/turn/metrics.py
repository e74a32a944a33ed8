"""Per-turn statistics with honest definitions (docs/json-record.md repeats them).

- TTFT: from submitting the prompt until the first reply token is written. It covers template
  rendering, tokenizing, prefill and the first sample. For a reasoning model that is the first
  token of any kind, thinking included.
- TTFA (`ttfa_s`): from submitting the prompt until the first *answer* token, after any thinking;
  the wait a reader of the answer has. The same as TTFT for a reply without thinking; null when
  no answer token came (the thinking never ended). `thinking_tokens` + `answer_tokens` =
  `generated_tokens`; `thinking_budget_hit` says --thinking-budget ended the thinking.
- `cached_tokens`: prompt tokens not evaluated this turn (the KV cache had them); of those,
  `disk_cached_tokens` came from the KV cache on disk, loaded in `restore_s` (part of TTFT).
- `loop_steered`: loops that a grammar (`--schema`) steered out of, by closing the repeating list
  or string, instead of ending the reply with finish_reason "loop".
- `flash_attn`, `flash_attn_why`: the attention kernel the engine runs and why (`--flash-attn auto`
  says what it measured); null for a remote engine.
- `threads`, `threads_why`: llama.cpp's threads at the end of the turn and why that many (the
  usable cores, other processes busy, or a count measured faster while decoding); null for a
  remote engine.
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
    media_tokens: int = 0  # of the prompt's tokens, those that are image or audio embeddings
    generated_tokens: int = 0
    context_used: int = 0
    context_limit: int = 0
    messages_dropped: int = 0
    tokens_dropped: int = 0
    finish_reason: str = "stop"
    draft_proposed: int = 0
    draft_accepted: int = 0
    # Loops the grammar steered out of (closing the repeating list or string) instead of ending the reply.
    loop_steered: int = 0
    ttfa_s: float | None = 0.0
    thinking_tokens: int = 0
    answer_tokens: int = 0
    thinking_budget_hit: bool = False
    disk_cached_tokens: int = 0
    restore_s: float = 0.0
    flash_attn: bool | None = None
    flash_attn_why: str | None = None
    threads: int | None = None  # llama.cpp's threads at the end of the turn; None: a remote engine
    threads_why: str | None = None  # why that many: the cores, a busy machine, a faster count measured
    # A remote engine's own measurements (llama-server's `timings`: prompt_ms, prompt_n, cache_n,
    # predicted_ms, predicted_n, predicted_per_second); None for the local engine.
    server: dict | None = None
    # A tool turn's rounds (generate, call, generate...), one dict each: prompt_tokens, cached_tokens,
    # generated_tokens, ttft_s, prefill_s, decode_s, finish_reason. None: a turn without tools.
    rounds: list[dict] | None = None
    # Why this turn's KV prefix was built anew instead of reused ("rebuilt after model switch");
    # None: the KV cache was reused as far as the prompt allowed (`cached_tokens`).
    prefix: str | None = None

    @property
    def network_ms(self) -> float | None:
        """Client TTFT minus the server's own prompt time: the network and HTTP share of TTFT."""
        if not self.server or "prompt_ms" not in self.server or not self.ttft_s:
            return None
        return self.ttft_s * 1000 - float(self.server["prompt_ms"])

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
            ttfa_s=None if self.ttfa_s is None else round(self.ttfa_s, 4),
            restore_s=round(self.restore_s, 4),
            prefill_tokens=self.prefill_tokens,
            prefill_tok_s=round(self.prefill_tok_s, 2),
            decode_tok_s=round(self.decode_tok_s, 2),
            network_ms=None if self.network_ms is None else round(self.network_ms, 1),
        )
        if not self.media_tokens:
            del data["media_tokens"]  # a text-only turn's record stays as it was
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
            f"prompt {self.prompt_tokens} ("
            + (f"{self.media_tokens} image/audio, " if self.media_tokens else "")
            + f"{self.cached_tokens} cached"
            + (
                f", {self.disk_cached_tokens} from disk in {self.restore_s * 1000:.0f} ms)"
                if self.disk_cached_tokens
                else ")"
            ),
            f"ctx {self.context_used}/{self.context_limit}",
        ]
        if self.draft_proposed:
            parts.append(f"draft accepted {self.draft_acceptance:.0%}")
        if self.server and "prompt_ms" in self.server:
            rate = self.server.get("predicted_per_second")
            parts.append(
                f"server: prefill {float(self.server['prompt_ms']):.0f} ms"
                + (f", {float(rate):.1f} tok/s" if rate else "")
                + (f", network {self.network_ms:.0f} ms" if self.network_ms is not None else "")
            )
        if self.thinking_tokens:
            answer = "no answer" if self.ttfa_s is None else f"answer at {self.ttfa_s * 1000:.0f} ms"
            budget = ", budget reached" if self.thinking_budget_hit else ""
            parts.insert(1, f"thought {self.thinking_tokens} tokens{budget}, {answer}")
        if self.prefix:
            parts.append(f"prefix {self.prefix}")
        if self.loop_steered:
            parts.append(f"loop steered out of ({self.loop_steered})")
        if self.finish_reason != "stop":
            parts.append(self.finish_reason)
        return " · ".join(parts)
