"""llama.cpp's `llama-server` as an engine, with llmchat's own template and the server's KV reuse.

The best remote path, because it keeps what the local engine does:
- the chat template is rendered here, exactly as for a local model (llmchat.prompt.render), from the
  template and BOS/EOS that `GET /props` reports, or from a local copy of the GGUF when `-m` names
  one (the server reports its own ChatML default for a model without a template);
- prompts are tokenized by the server's own tokenizer (`POST /tokenize`), piece by piece with the
  same trusted/untrusted rule as `Engine.prompt_tokens`, and cached here: a chat re-renders the same
  messages every turn, so after the first turn only the new pieces travel;
- token ids go to `POST /completion` with `cache_prompt: true` and a pinned `id_slot`, so the next
  turn prefills only its new tokens on the server, as `Llama.generate` does locally;
- the reply streams back as SSE, one event per token (`return_tokens` gives the ids); the final
  event's `timings` give the server's own prefill time, decode rate and cached tokens, kept in
  `RemoteOutcome.server` beside the client's wall-clock numbers. Their difference is the network;
- a prompt with images or audio (a server started with `--mmproj`) goes as its text and the files,
  which the server tokenizes itself (llmchat.engine.media.server).

The context limit is the slot's `n_ctx` from /props (`-c` divided among `-np` slots unless the
server runs with a unified KV cache), not the server's `-c`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from llmchat.defaults import DEFAULT_BATCH_SIZE
from llmchat.engine.driver import SequenceState, common_prefix
from llmchat.engine.interface import EngineCaps, EngineInfo, GenerateRequest, prompt_ids
from llmchat.engine.media import server as server_media
from llmchat.engine.media.marks import count_media
from llmchat.engine.prompt_pieces import PromptPiece, tokens_for_pieces
from llmchat.engine.remote.served import RemoteOutcome, RemoteToken
from llmchat.errors import ServerError

if TYPE_CHECKING:
    from llmchat.engine.grammar import Grammar
    from llmchat.engine.interface import ChatEngine
    from llmchat.engine.remote.http import ServerClient
    from llmchat.engine.remote.served import RemoteEngine
    from llmchat.engine.remote.spec import ServerSpec

# The repeat penalty's window: llama-server's default, the same as the local engine's (engine.core).
# The server runs it over the prompt and the reply, and so does the local engine now.
PENALTY_LAST_N = 64
# llama.cpp's common_grammar_trigger_type: a trigger given as text (one that is a single token
# becomes a token trigger on the server).
GRAMMAR_TRIGGER_WORD = 1
# Tokenizations kept: the pieces of a few long conversations. Past this the cache starts afresh.
_TOKENIZE_CACHE_MAX = 8192


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
    vision: bool = False  # its projector (--mmproj) takes images
    audio: bool = False  # ... or audio
    media_marker: str = "<__media__>"  # what stands for a file in a prompt's text (libmtmd's default)
    extra: dict[str, Any] = field(default_factory=dict)


def read_props(client: ServerClient) -> ServerFacts:
    props = client.get_json("/props")
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    if not isinstance(settings, dict) or not isinstance(settings.get("n_ctx"), int):
        raise ServerError(
            f"{client.spec.shown_url}: GET /props has no default_generation_settings.n_ctx; is this llama-server? "
            'set kind = "openai" in the config for other servers'
        )
    modalities = props.get("modalities") if isinstance(props.get("modalities"), dict) else {}
    return ServerFacts(
        n_ctx=int(settings["n_ctx"]),
        total_slots=max(1, int(props.get("total_slots") or 1)),
        model_path=str(props.get("model_path") or props.get("model_alias") or ""),
        chat_template=str(props.get("chat_template") or ""),
        bos_token=str(props.get("bos_token") or ""),
        eos_token=str(props.get("eos_token") or ""),
        build=str(props.get("build_info") or ""),
        vision=bool(modalities.get("vision")),
        audio=bool(modalities.get("audio")),
        media_marker=str(props.get("media_marker") or "<__media__>"),
    )


class LlamaServerEngine:
    """A llama-server as a `ChatEngine` (llmchat.engine.interface)."""

    batch_size = DEFAULT_BATCH_SIZE  # the server batches by itself
    ctx_known = True  # /props says the slot's context

    def __init__(self, client: ServerClient, spec: ServerSpec, facts: ServerFacts, metadata: dict[str, str]):
        self.client = client
        self.spec = spec
        self.facts = facts
        # llmchat renders the template; the server takes token ids and a GBNF grammar, and returns
        # the reply's ids, so every reply rule runs on them. It shifts its own cache, if at all.
        self.caps = EngineCaps(
            grammar=True,
            kv_shift=False,
            disk_cache=False,
            renders_template=False,
            token_ids=True,
            remote=True,
            media=facts.vision or facts.audio,
            slots=facts.total_slots,
        )
        self.n_ctx = facts.n_ctx
        self.metadata = metadata
        self.bos_text = facts.bos_token
        self.eos_text = facts.eos_token
        self.model_path = f"{spec.shown_url} ({facts.model_path})" if facts.model_path else spec.shown_url
        self.threads = "server"
        self.notices: list[str] = []
        # What the server answered once, kept: tokenizations, single-token checks, control tokens,
        # pieces of single tokens, and the end-of-generation tokens seen ending a reply.
        self._tokens: dict[tuple[str, bool], list[int]] = {}
        self._single: dict[str, bool] = {}
        self._control: dict[int, bool] = {}
        self._pieces: dict[int, bytes] = {}
        self.end_tokens: set[int] = set()
        # More servers of the same model, for batch to spread over (llmchat.engine.remote.group).
        self.peers: list[RemoteEngine] = []
        self._tokenizer: RemoteEngine = self  # who answers tokenizer requests
        self.bos_id, self.add_bos = self._bos()
        self.slot = self._choose_slot()
        self._slot_tokens: list[int] = []  # what the pinned slot's cache holds, as far as llmchat knows
        self.media = server_media.ServerMedia()  # images and audio: sent with a prompt's text
        self.last_outcome: RemoteOutcome | None = None

    @classmethod
    def open(cls, client: ServerClient, spec: ServerSpec) -> LlamaServerEngine:
        facts = read_props(client)
        if spec.local_gguf is not None:
            from llmchat.gguf.reader import read_metadata

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
        if engine.caps.media:
            kinds = " and ".join(k for k, on in (("images", facts.vision), ("audio", facts.audio)) if on)
            engine.notices.append(f"server: it takes {kinds} (--mmproj): a prompt with them goes as text and files")
        return engine

    @property
    def info(self) -> EngineInfo:
        rows = tuple(("server", line, "the server decides its own engine settings") for line in self.notices)
        return EngineInfo(model_path=self.model_path, rows=rows)

    def check_grammar(self, grammar: Grammar) -> None:
        """The server parses the grammar with each request and refuses a bad one there (one line)."""

    def close(self) -> None:
        for peer in self.peers:
            peer.close()
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
    def _tokenizer_request(self, path: str, payload: dict[str, Any]) -> Any:
        """A tokenizer request to this server or, once it stops answering mid-batch, to the first peer
        that does (the same tokenizer: llmchat.engine.remote.group checks it), from then on."""
        while True:
            try:
                return self._tokenizer.client.post_json(path, payload)
            except ServerError as err:
                if err.status is not None or not err.retriable:
                    raise
                servers = [self, *self.peers]
                later = servers[servers.index(self._tokenizer) + 1 :]
                if not later:
                    raise
                self._tokenizer = later[0]

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
            reply = self._tokenizer_request(
                "/tokenize", {"content": content, "add_special": False, "parse_special": special}
            )
            cached = self._tokens[key] = [int(t) for t in reply.get("tokens", [])]
        return list(cached)

    def has_single_token(self, text: str) -> bool:
        known = self._single.get(text)
        if known is None:
            reply = self._tokenizer_request(
                "/tokenize", {"content": text, "add_special": False, "parse_special": True, "with_pieces": True}
            )
            tokens = reply.get("tokens", [])
            known = len(tokens) == 1 and isinstance(tokens[0], dict) and tokens[0].get("piece") == text
            self._single[text] = known
        return known

    def prompt_tokens(self, pieces: Sequence[PromptPiece]) -> list[int]:
        """Token ids for a rendered prompt, by the same rules as the local engine
        (llmchat.engine.prompt_pieces), so the prompt matches what the server's slot holds; one
        with media as the server will tokenize its text (llmchat.engine.media.server)."""
        if server_media.holds_media(self.media, pieces):
            return server_media.media_prompt(self, pieces)
        return tokens_for_pieces(self, pieces)

    def add_media(self, data: bytes, kind: str, format: str) -> int:
        """Take an image or audio clip, sent with the text of a prompt whose marker names it; the
        positions it is counted at. UsageError when the server's projector takes the other kind."""
        server_media.takes(self, kind)
        for peer in self.peers:
            cast("LlamaServerEngine", peer).media = self.media  # they decode the prompts rendered here
        return self.media.add(data, kind, format)

    def is_control(self, token_id: int) -> bool:
        """A control token: its text is that single token when special tokens are parsed, and not
        otherwise. Asked once per token: every render asks it again for each earlier reply."""
        known = self._control.get(token_id)
        if known is None:
            piece = self.detokenize([token_id])
            known = self.tokenize(piece, special=True) == [token_id] and self.tokenize(piece, special=False) != [
                token_id
            ]
            self._control[token_id] = known
        return known

    # --- the vocabulary the reply rules read (engine.reply.Vocabulary) -----------------------------
    def is_end_of_generation(self, token_id: int) -> bool:
        """Known once a reply has ended with it (the stream's last token when `stop_type` is eos)."""
        return token_id in self.end_tokens

    def token_bytes(self, token_id: int) -> bytes:
        """A token's text, for a token the stream gave without one (a forced token)."""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self.detokenize([token_id]).encode("utf-8")
        return piece

    def detokenize(self, tokens: Sequence[int]) -> str:
        reply = self._tokenizer_request("/detokenize", {"tokens": [int(t) for t in tokens]})
        return str(reply.get("content", "")) if isinstance(reply, dict) else ""

    def min_tokens(self, text: str) -> int | None:
        return None  # the vocabulary is on the server; the exact count decides

    # --- the cache ---------------------------------------------------------------------------------
    def cached_prefix(self, prompt: Sequence[int]) -> int:
        """How much of `prompt` the pinned slot should still hold (the server's own count arrives
        with the reply's timings, as `cached_tokens`); none claimed for a prompt with media."""
        if count_media(list(prompt)):
            return 0
        return min(common_prefix(self._slot_tokens, prompt), max(len(prompt) - 1, 0))

    def shift_out_dropped(self, prompt: Sequence[int]) -> int:
        return 0  # the server keeps its own cache; `caps.kv_shift` is off so this is not called

    # --- generation --------------------------------------------------------------------------------
    def generate(self, request: GenerateRequest, *, feeds_steering: bool = False) -> ServerGeneration:
        """Stream the reply to `request` (its `slot`: None for this session's pinned one, -1 for any).
        `feeds_steering`: the stream gives the reply text to the thinking budget itself (batch)."""
        return ServerGeneration(self, request, feeds_steering=feeds_steering)


class ServerGeneration:
    """An iterator of `RemoteToken`s; `outcome` is complete once iteration ends (or is abandoned).

    The server samples; the reply rules run here on the token ids it returns (`SequenceState`), as
    for a local reply: the loop stop ends the stream, and a thinking budget that is spent ends it
    too, then continues with the forced close through a new request whose prompt is the old one
    plus the reply so far (`cache_prompt` keeps all of it: only the close is prefilled). A grammar
    that applies after the thinking block starts the same way, once the block has closed."""

    def __init__(self, engine: LlamaServerEngine, request: GenerateRequest, *, feeds_steering: bool = False):
        self.engine = engine
        self.request = request
        self.prompt = list(prompt_ids(request.prompt))
        self.slot = engine.slot if request.slot is None else request.slot
        self.outcome = RemoteOutcome(prompt_tokens=len(self.prompt), slot=self.slot)
        self.state = SequenceState(engine, request, engine.n_ctx, self.outcome, feeds_steering=feeds_steering)
        self.seed = self.state.seed
        self._held: int | None = None  # a token streamed without text: an end token, or held back
        self._ids_complete = True  # every sampled token came with its id (see `_reply_ids`)
        self._received = 0  # token ids received in the current request
        self._unsent = 0  # tokens the current request sampled whose ids never came (see `_event`)
        self._dropped = False  # the last token was an end token replaced by a thinking block's close
        self._final_seen = False  # the current request's last event (`stop`) has arrived
        self._sent: list[int] = self.prompt  # the current request's prompt: this one, or it and the reply so far

    def payload(self, prompt: list[int], limit: int, grammar: Grammar | None) -> dict[str, Any]:
        params = self.request.sampling
        body: dict[str, Any] = {
            # Token ids, to which the server adds no BOS of its own; or a media prompt's text and files.
            "prompt": server_media.completion_prompt(self.engine, prompt),
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
            "stop": list(self.request.stops),
            "return_tokens": True,
        }
        if grammar is not None:
            body["grammar"] = grammar.text
            trigger = self.request.grammar_after if self.request.grammar_from_trigger else None
            if trigger:
                # A lazy grammar (a tool call with --tool-choice auto): llama-server's own, which
                # switches on where the trigger word appears and feeds it through the grammar, as
                # the local gate does. A trigger that is one token must be a preserved token there.
                body["grammar_lazy"] = True
                body["grammar_triggers"] = [{"type": GRAMMAR_TRIGGER_WORD, "value": trigger}]
                body["preserved_tokens"] = [trigger]
        return body

    def __iter__(self) -> Iterator[RemoteToken]:
        engine, state, outcome = self.engine, self.state, self.outcome
        pinned = self.slot == engine.slot
        outcome.cached_tokens = engine.cached_prefix(self.prompt) if pinned else 0
        if not state.start(time.perf_counter()):
            return
        request = self.request
        # The grammar after a closed thinking block starts with a new request; a lazy one is the
        # server's own from the first request on.
        after = request.grammar_after if request.grammar is not None and not request.grammar_from_trigger else None
        try:
            while True:
                grammar = request.grammar if after is None else None
                prompt = self._sent = self.prompt + self._reply_ids()
                limit = state.limit - outcome.generated_tokens
                restart = False
                self._received = self._unsent = 0
                self._final_seen = False
                events = engine.client.stream_events("/completion", self.payload(prompt, limit, grammar))
                try:
                    for event in events:
                        yield from self._event(event)
                        if state.done:
                            if self._final_seen or outcome.finish_reason not in ("stop", "length"):
                                break  # ended here (the loop stop): the closed connection stops the server
                            continue  # the server ends there too: its last event brings its timings
                        if self._dropped:
                            restart = True  # the close replaced an end token: continue after it
                            break
                        step = state.steer(time.perf_counter())
                        if step.forced:
                            if step.text:
                                yield RemoteToken(step.text, -1)
                            restart = True
                            break
                        if after is not None and after in state.text():
                            after = None  # the thinking block closed: the grammar applies from here
                            restart = True
                            break
                finally:
                    events.close()  # a reply ended here: the server stops at the closed connection
                if not restart:
                    if not state.done:
                        raise ServerError(
                            f"{engine.spec.shown_url} ended the stream before the reply was finished (after "
                            f"{outcome.generated_tokens} tokens); check the server's log, then try again",
                            retriable=True,
                        )
                    break
                if state.done:
                    break
            tail = state.tail()
            if tail:
                yield RemoteToken(tail, -1)
        finally:
            if pinned:
                # What the slot holds now: the prompt and the reply so far (the server stops at the
                # closed connection, a token or two later at most); unknown after media (see cached_prefix).
                engine._slot_tokens = [] if count_media(self.prompt) else self.prompt + outcome.generated_ids
            engine.last_outcome = outcome

    def _reply_ids(self) -> list[int]:
        """The reply so far as token ids, for a request that continues it. The server's stream
        leaves out the id of a token that ends inside a UTF-8 character (it sends nothing until the
        character is whole); then the reply's text is tokenized instead."""
        ids = self.outcome.generated_ids
        if self._ids_complete or not ids:
            return list(ids)
        return self.engine.tokenize(self.engine.detokenize(ids), special=True)

    def _event(self, event: dict[str, Any]) -> Iterator[RemoteToken]:
        """One streamed event through the reply rules. A token that came without text may be the
        end token; it is judged when the next event says whether the reply ended there."""
        engine = self.engine
        now = time.perf_counter()
        self._dropped = False
        tokens = [int(t) for t in event.get("tokens") or []]
        text = str(event.get("content") or "")
        final = bool(event.get("stop"))
        if final and event.get("stop_type") == "eos" and self._held is not None:
            engine.end_tokens.add(self._held)
        if self._held is not None:
            held, self._held = self._held, None
            yield from self._token(held, b"", now)
        self._received += len(tokens)
        predicted = event.get("tokens_predicted")
        if isinstance(predicted, int) and predicted > self._received + self._unsent:
            # Tokens that ended inside a character: their ids never came, but they were sampled
            # (before this event's token, which completes the character), and count as locally.
            unsent = predicted - self._received - self._unsent
            self._unsent += unsent
            self._ids_complete = False
            self.state.on_unsent(unsent)
        for index, token in enumerate(tokens):
            last = index == len(tokens) - 1
            if last and not text and not final and token not in engine.end_tokens:
                self._held = token  # no text: perhaps the end token (the next event tells)
                break
            yield from self._token(token, text.encode("utf-8") if last else b"", now)
        if final:
            self._final_seen = True
            self._final(event, now)

    def _token(self, token: int, piece: bytes, now: float) -> Iterator[RemoteToken]:
        if self.state.done or self._dropped:
            return
        step = self.state.on_token(token, now, piece)
        if step.dropped:
            self._dropped = True  # an end token inside a budgeted thinking block: the close instead
        if step.text:
            yield RemoteToken(step.text, -1 if step.dropped else token)

    def _final(self, event: dict[str, Any], now: float) -> None:
        """The server ended the reply itself (an end token, a stop string, its limit)."""
        state, outcome = self.state, self.outcome
        if not state.done and not self._dropped:
            state.end_of_stream()
            outcome.finish_reason = "length" if event.get("stop_type") == "limit" else "stop"
        timings = event.get("timings")
        if isinstance(timings, dict):
            outcome.server = {k: float(v) for k, v in timings.items() if isinstance(v, (int, float))}
            outcome.cached_tokens = int(timings.get("cache_n", outcome.cached_tokens))
            server_media.server_counts(self.engine, self.prompt, self._sent, timings, outcome)
        if outcome.t_last_token is None and outcome.generated_tokens:
            outcome.t_last_token = now


if TYPE_CHECKING:

    def _is_a_chat_engine(engine: LlamaServerEngine) -> ChatEngine:
        """Never called: mypy checks here that a llama-server engine satisfies the engine protocol."""
        return engine
