"""llama.cpp's `llama-server` as an engine, with llmchat's own template and the server's KV reuse.

The best remote path, because it keeps what the local engine does:
- the chat template is rendered here, exactly as for a local model (llmchat.chat_template), from the
  template and BOS/EOS that `GET /props` reports, or from a local copy of the GGUF when `-m` names
  one (the server reports its own ChatML default for a model without a template);
- prompts are tokenized by the server's own tokenizer (`POST /tokenize`), piece by piece with the
  same trusted/untrusted rule as `Engine.prompt_tokens`, and cached here: a chat re-renders the same
  messages every turn, so after the first turn only the new pieces travel;
- token ids go to `POST /completion` with `cache_prompt: true` and a pinned `id_slot`, so the next
  turn prefills only its new tokens on the server, as `Llama.generate` does locally;
- the reply streams back as SSE, one event per token (`return_tokens` gives the ids); the final
  event's `timings` give the server's own prefill time, decode rate and cached tokens, kept in
  `RemoteOutcome.server` beside the client's wall-clock numbers. Their difference is the network.

The context limit is the slot's `n_ctx` from /props (`-c` divided among `-np` slots unless the
server runs with a unified KV cache), not the server's `-c`.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmchat.engine.prompt_pieces import PromptPiece, tokens_for_pieces
from llmchat.engine.reply import GenerationOutcome
from llmchat.errors import ServerError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from llmchat.engine.remote import ServerSpec
    from llmchat.engine.remote.http import ServerClient
    from llmchat.engine.reply import Steering
    from llmchat.sampling import SamplingParams

# llama-cpp-python's repeat-penalty window (Llama(last_n_tokens_size=64)), so a server reply is
# sampled with the same penalty as a local one.
PENALTY_LAST_N = 64
# Tokenizations kept: the pieces of a few long conversations. Past this the cache starts afresh.
_TOKENIZE_CACHE_MAX = 8192


@dataclass(frozen=True)
class RemoteSettings:
    """The engine settings the session and batch read, for a server (which owns its own)."""

    kv_shift: bool = False  # the server shifts its own cache; llmchat cannot move it
    batch_size: int = 512
    lookup: bool = False
    draft_model: Path | None = None
    # Read by `/show`; the server decides both (its own -fa and -ctk/-ctv flags).
    flash_attn: bool = False
    kv_type: str = "as the server chose"


@dataclass
class RemoteToken:
    """One streamed piece of the reply (the same shape as `llmchat.engine.core.TokenEvent`)."""

    text: str
    token_id: int


@dataclass
class RemoteOutcome(GenerationOutcome):
    """A `GenerationOutcome` plus what the server measured itself (None when it sends no timings):
    `prompt_ms`, `prompt_n` (tokens it evaluated), `cache_n` (reused), `predicted_ms`,
    `predicted_n`, `predicted_per_second`."""

    server: dict[str, float] | None = None
    slot: int | None = None


@dataclass
class ServerFacts:
    """What the server says about its model (GET /props)."""

    n_ctx: int
    total_slots: int
    model_path: str
    chat_template: str
    bos_token: str
    eos_token: str
    build: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def read_props(client: ServerClient) -> ServerFacts:
    props = client.get_json("/props")
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    if not isinstance(settings, dict) or not isinstance(settings.get("n_ctx"), int):
        raise ServerError(
            f"{client.spec.shown_url}: GET /props has no default_generation_settings.n_ctx; is this llama-server? "
            'set kind = "openai" in the config for other servers'
        )
    return ServerFacts(
        n_ctx=int(settings["n_ctx"]),
        total_slots=max(1, int(props.get("total_slots") or 1)),
        model_path=str(props.get("model_path") or props.get("model_alias") or ""),
        chat_template=str(props.get("chat_template") or ""),
        bos_token=str(props.get("bos_token") or ""),
        eos_token=str(props.get("eos_token") or ""),
        build=str(props.get("build_info") or ""),
    )


class LlamaServerEngine:
    """A llama-server as a `ChatEngine` (llmchat.engine.interface)."""

    remote = True
    renders_template = False  # llmchat renders it (the server only tokenizes and decodes)

    def __init__(self, client: ServerClient, spec: ServerSpec, facts: ServerFacts, metadata: dict[str, str]):
        self.client = client
        self.spec = spec
        self.facts = facts
        self.settings = RemoteSettings()
        self.n_ctx = facts.n_ctx
        self.metadata = metadata
        self.bos_text = facts.bos_token
        self.eos_text = facts.eos_token
        self.model_path = f"{spec.shown_url} ({facts.model_path})" if facts.model_path else spec.shown_url
        self.threads = "server"
        self.notices: list[str] = []
        self._tokens: dict[tuple[str, bool], list[int]] = {}
        self._single: dict[str, bool] = {}
        self.bos_id, self.add_bos = self._bos()
        self.slot = self._choose_slot()
        self._slot_tokens: list[int] = []  # what the pinned slot's cache holds, as far as llmchat knows
        self.last_outcome: RemoteOutcome | None = None

    @classmethod
    def open(cls, client: ServerClient, spec: ServerSpec) -> LlamaServerEngine:
        facts = read_props(client)
        if spec.local_gguf is not None:
            from llmchat.gguf_file import read_metadata

            scalars = read_metadata(spec.local_gguf).scalars
            metadata = {k: v for k, v in scalars.items() if isinstance(v, str)}
            source = f"the local copy {spec.local_gguf}"
        else:
            name = Path(facts.model_path).name if facts.model_path else ""
            metadata = {"general.name": name.removesuffix(".gguf")}
            if facts.chat_template:
                metadata["tokenizer.chat_template"] = facts.chat_template
            source = "GET /props"
        engine = cls(client, spec, facts, metadata)
        engine.notices += [
            f"server: {spec.shown_url}, llama.cpp {facts.build or '(build unknown)'}, model {facts.model_path or '?'}",
            f"server: {facts.total_slots} slots of {facts.n_ctx} tokens; this session uses slot {engine.slot}",
            f"server: template and BOS/EOS from {source}; prompts tokenized by the server, sent as token ids",
        ]
        return engine

    def close(self) -> None:
        self.client.close()

    # --- slots -------------------------------------------------------------------------------------
    def _choose_slot(self) -> int:
        """An idle slot to pin this conversation to (its KV cache then stays ours between turns).

        Several clients may share a server: each starts from a different idle slot (by process id),
        so two chats do not keep evicting each other's cache when slots are free."""
        slots = self.facts.total_slots
        idle = list(range(slots))
        try:
            listing = self.client.get_json("/slots")
            if isinstance(listing, list):
                idle = [int(s["id"]) for s in listing if isinstance(s, dict) and not s.get("is_processing")] or idle
        except ServerError:
            pass  # --no-slots: any slot will do
        return idle[os.getpid() % len(idle)]

    # --- tokens ------------------------------------------------------------------------------------
    def _bos(self) -> tuple[int, bool]:
        """BOS as the server adds it: tokenizing "" with special tokens gives [BOS] or nothing."""
        ids = self.client.post_json("/tokenize", {"content": "", "add_special": True}).get("tokens", [])
        return (int(ids[0]), True) if ids else (-1, False)

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """The server's tokens for `text`, without BOS (the prompt builder adds it exactly once)."""
        key = (text, special)
        cached = self._tokens.get(key)
        if cached is None:
            if len(self._tokens) >= _TOKENIZE_CACHE_MAX:
                self._tokens.clear()
            # errors="replace": a lone surrogate cannot go out as JSON text.
            content = text.encode("utf-8", errors="replace").decode("utf-8")
            reply = self.client.post_json(
                "/tokenize", {"content": content, "add_special": False, "parse_special": special}
            )
            cached = self._tokens[key] = [int(t) for t in reply.get("tokens", [])]
        return list(cached)

    def has_single_token(self, text: str) -> bool:
        known = self._single.get(text)
        if known is None:
            reply = self.client.post_json(
                "/tokenize", {"content": text, "add_special": False, "parse_special": True, "with_pieces": True}
            )
            tokens = reply.get("tokens", [])
            known = len(tokens) == 1 and isinstance(tokens[0], dict) and tokens[0].get("piece") == text
            self._single[text] = known
        return known

    def prompt_tokens(self, pieces: Sequence[PromptPiece]) -> list[int]:
        """Token ids for a rendered prompt, by the same rules as the local engine
        (llmchat.engine.prompt_pieces), so the prompt matches what the server's slot holds."""
        return tokens_for_pieces(self, pieces)

    def is_control(self, token_id: int) -> bool:
        """A control token: its text is that single token when special tokens are parsed, and not otherwise."""
        piece = self.detokenize([token_id])
        return self.tokenize(piece, special=True) == [token_id] and self.tokenize(piece, special=False) != [token_id]

    def detokenize(self, tokens: Sequence[int]) -> str:
        reply = self.client.post_json("/detokenize", {"tokens": [int(t) for t in tokens]})
        return str(reply.get("content", "")) if isinstance(reply, dict) else ""

    def min_tokens(self, text: str) -> int | None:
        return None  # the vocabulary is on the server; the exact count decides

    # --- the cache ---------------------------------------------------------------------------------
    def cached_prefix(self, prompt: Sequence[int]) -> int:
        """How much of `prompt` the pinned slot should still hold (the server's own count arrives
        with the reply's timings, as `cached_tokens`)."""
        common = 0
        for held, new in zip(self._slot_tokens, prompt):
            if held != new:
                break
            common += 1
        return min(common, max(len(prompt) - 1, 0))

    def shift_out_dropped(self, prompt: Sequence[int]) -> int:
        return 0  # the server keeps its own cache; `settings.kv_shift` is off so this is not called

    # --- generation --------------------------------------------------------------------------------
    def generate(
        self,
        prompt: Sequence[int],
        sampling: SamplingParams,
        *,
        max_tokens: int | None,
        stop_strings: Sequence[str] = (),
        steering: Steering | None = None,
        markup: Mapping[int, bytes] | None = None,
        slot: int | None = None,
    ) -> ServerGeneration:
        """Stream a reply. `slot`: the server slot (default: this session's pinned one; -1: any).

        `steering` (a thinking budget's forced tokens) and `markup` cannot act on a server, which
        samples by itself; a thinking budget is not enforced remotely."""
        return ServerGeneration(
            self, list(prompt), sampling, max_tokens, tuple(stop_strings) + tuple(sampling.stop), slot
        )


class ServerGeneration:
    """An iterator of `RemoteToken`s; `outcome` is complete once iteration ends (or is abandoned)."""

    def __init__(
        self,
        engine: LlamaServerEngine,
        prompt: list[int],
        sampling: SamplingParams,
        max_tokens: int | None,
        stops: tuple[str, ...],
        slot: int | None,
    ):
        self.engine = engine
        self.prompt = prompt
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.stops = stops
        self.slot = engine.slot if slot is None else slot
        self.outcome = RemoteOutcome(prompt_tokens=len(prompt), slot=self.slot)
        self.seed = sampling.seed if sampling.seed is not None else random.randrange(1, 2**31)

    def payload(self, limit: int) -> dict[str, Any]:
        params = self.sampling
        return {
            "prompt": self.prompt,  # token ids: the server adds no BOS of its own to these
            "stream": True,
            "cache_prompt": True,
            "id_slot": self.slot,
            "n_predict": limit,
            "temperature": params.temperature,
            "top_k": params.top_k,
            "top_p": params.top_p,
            "min_p": params.min_p,
            "repeat_penalty": params.repeat_penalty,
            "repeat_last_n": PENALTY_LAST_N,
            "seed": self.seed,
            "stop": list(self.stops),
            "return_tokens": True,
        }

    def __iter__(self) -> Iterator[RemoteToken]:
        engine, outcome = self.engine, self.outcome
        room = engine.n_ctx - len(self.prompt)
        limit = room if self.max_tokens is None else min(self.max_tokens, room)
        pinned = self.slot == engine.slot
        outcome.cached_tokens = engine.cached_prefix(self.prompt) if pinned else 0
        outcome.t_start = time.perf_counter()
        outcome.finish_reason = "interrupted"  # until the server says how it ended
        if limit <= 0:
            outcome.finish_reason = "length"
            return
        finished = False
        try:
            for event in engine.client.stream_events("/completion", self.payload(limit)):
                now = time.perf_counter()
                tokens = [int(t) for t in event.get("tokens") or []]
                text = event.get("content") or ""
                if tokens and outcome.t_first_token is None:
                    outcome.t_first_token = now
                outcome.generated_ids += tokens
                if text:
                    if outcome.t_first_shown is None:
                        outcome.t_first_shown = now
                    outcome.t_last_token = now
                if event.get("stop"):
                    finished = True
                    self._final(event, now)
                else:
                    outcome.generated_tokens = int(event.get("tokens_predicted") or len(outcome.generated_ids))
                if text:
                    yield RemoteToken(text, tokens[-1] if tokens else -1)
            if not finished:
                raise ServerError(
                    f"{engine.spec.shown_url} ended the stream before the reply was finished (after "
                    f"{outcome.generated_tokens} tokens); check the server's log, then try again",
                    retriable=True,
                )
        finally:
            if pinned:
                # What the slot holds now: the prompt and the reply so far (the server stops at the
                # closed connection, a token or two later at most).
                engine._slot_tokens = self.prompt + outcome.generated_ids
            engine.last_outcome = outcome

    def _final(self, event: dict[str, Any], now: float) -> None:
        outcome = self.outcome
        stop_type = event.get("stop_type")
        outcome.finish_reason = "length" if stop_type == "limit" else "stop"
        timings = event.get("timings")
        if isinstance(timings, dict):
            outcome.server = {k: float(v) for k, v in timings.items() if isinstance(v, (int, float))}
            outcome.cached_tokens = int(timings.get("cache_n", outcome.cached_tokens))
            outcome.generated_tokens = int(timings.get("predicted_n", outcome.generated_tokens))
        else:
            outcome.generated_tokens = int(event.get("tokens_predicted") or len(outcome.generated_ids))
        if stop_type == "eos" and outcome.generated_ids:
            # The server streams and counts the end-of-generation token; the local engine does
            # neither (engine.reply), and the reply's ids must spell the reply for exact reuse.
            outcome.generated_ids.pop()
            outcome.generated_tokens = max(0, outcome.generated_tokens - 1)
        if outcome.t_last_token is None and outcome.generated_tokens:
            outcome.t_last_token = now
