"""Any OpenAI-compatible server as an engine: vLLM, Ollama's /v1, LM Studio, llama_cpp.server.

Such a server renders the chat template itself, so llmchat sends messages, not token ids:
- the session still "renders" a prompt, with a stand-in template that writes the messages as JSON
  (`SERVER_TEMPLATE`); `prompt_tokens` reads them back into `ChatMessages` (llmchat.engine.interface),
  the messages and their token count, which is what budgeting and trimming read (`len`): they run
  unchanged against the server's limit. The count is exact where the server can
  count a chat (vLLM's `POST /tokenize` with messages), counted per message where it can count
  text (llama_cpp.server's `/extras/tokenize/count`), and otherwise estimated on the high side;
- replies stream from `POST /v1/chat/completions` with `stream_options.include_usage` (and vLLM's
  `continuous_usage_stats`); a server that rejects those options is asked again without them, and
  llmchat remembers. Tokens are counted from `usage`, never from chunks (one chunk may hold
  several tokens), except on a server that reports no usage at all;
- TTFT is taken at the first non-empty `content` or `reasoning_content` delta (or a tool call's
  first fragment), never at the role-only first chunk; reasoning text is passed on between
  `<think>` tags, the way reasoning models write it locally;
- tools (llmchat.tools.native) go in the request's own `tools` and `tool_choice`, and the server
  renders them with its template; the stand-in template writes them next to the messages, so they
  are counted with the prompt. The reply's `delta.tool_calls` fragments (index, id, name, argument
  pieces) are assembled into `GenerationOutcome.server_calls`, apart from the text;
- images and audio the engine was given (`add_media`) go as `image_url` and `input_audio` content
  parts where a message's marker names them (llmchat.engine.media.parts).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from llmchat.defaults import DEFAULT_BATCH_SIZE
from llmchat.engine.driver import draw_seed, reply_limit
from llmchat.engine.interface import ChatMessages, EngineCaps, EngineInfo, GenerateRequest
from llmchat.engine.media.parts import RemoteMedia, estimated_media, text_of
from llmchat.engine.prompt_pieces import PromptPiece
from llmchat.engine.remote.served import RemoteOutcome, RemoteToken
from llmchat.engine.reply import ServerCall
from llmchat.errors import ServerError, UsageError

if TYPE_CHECKING:
    from llmchat.engine.grammar import Grammar
    from llmchat.engine.interface import ChatEngine
    from llmchat.engine.remote.http import ServerClient
    from llmchat.engine.remote.served import RemoteEngine
    from llmchat.engine.remote.spec import ServerSpec

# The stand-in chat template: the messages as JSON, for the server to render (see the docstring).
SERVER_TEMPLATE = (
    '{{ {"messages": messages, "add_generation_prompt": add_generation_prompt, '
    '"tools": tools if tools is defined else none} | tojson }}'
)
# The message keys a chat request carries: a tool turn's calls and results (the OpenAI shape).
_WIRE_KEYS = ("tool_calls", "tool_call_id")
# When the server does not say its context: Ollama's default window, and a common serving size.
ASSUMED_CTX = 4096
# Said once per session (--verbose, and as a warning when --thinking-budget asks for what it cannot do).
STEERING_NOTICE = (
    "server: an OpenAI-compatible server returns text, not token ids: the loop stop and --thinking-budget "
    "cannot act on its replies (llama-server can)"
)
# Per-message overhead of chat markup (role markers, separators) when counting message by message.
_MESSAGE_OVERHEAD = 8
# Ways to ask for usage in a stream, best first; the first the server accepts is kept.
_STREAM_OPTIONS: tuple[dict[str, Any] | None, ...] = (
    {"include_usage": True, "continuous_usage_stats": True},
    {"include_usage": True},
    None,
)


class OpenAICompatEngine:
    """An OpenAI-compatible server as a `ChatEngine` (llmchat.engine.interface).

    It renders its own template and returns text, not token ids: no grammar, and none of the reply
    rules that read ids (the loop stop, a thinking budget) can act on it (`STEERING_NOTICE`)."""

    caps = EngineCaps(
        grammar=False, kv_shift=False, disk_cache=False, renders_template=True, token_ids=False, remote=True, media=True
    )
    batch_size = DEFAULT_BATCH_SIZE  # the server batches by itself

    def __init__(self, client: ServerClient, spec: ServerSpec, *, kind: str, model: str, n_ctx: int, ctx_known: bool):
        self.client = client
        self.spec = spec
        self.kind = kind
        self.model = model
        self.n_ctx = n_ctx
        self.ctx_known = ctx_known
        self.metadata: dict[str, str] = {"general.name": model}
        self.bos_text = ""
        self.eos_text = ""
        self.model_path = f"{spec.shown_url} ({model})"
        self.threads = "server"
        self.notices: list[str] = []
        self.counter = "chat"  # chat (exact, vLLM) | text (per message) | estimate; narrowed on failure
        self.stream_level = 0  # index into _STREAM_OPTIONS
        self.template_detail = f"rendered by the server ({spec.shown_url}/v1/chat/completions)"
        self.last_outcome: RemoteOutcome | None = None
        # llama-server reads `tool_choice` as a string only (see `tools_and_choice`); it lists its
        # model as owned by "llamacpp".
        self.tool_choice_strings_only = False
        # More servers of the same model, for batch to spread over (llmchat.engine.remote.group).
        self.peers: list[RemoteEngine] = []
        self.media = RemoteMedia()  # images and audio go as content parts (media_parts)

    @classmethod
    def open(cls, client: ServerClient, spec: ServerSpec, *, kind: str) -> OpenAICompatEngine:
        listing = client.get_json("/v1/models")
        cards = [c for c in (listing.get("data") or []) if isinstance(c, dict)] if isinstance(listing, dict) else []
        names = [str(c.get("id")) for c in cards if c.get("id")]
        if spec.model is not None and names and spec.model not in names:
            raise ServerError(
                f"{spec.shown_url} has no model {spec.model!r}; it serves {', '.join(names[:10])}; "
                "pass one with -m SERVER:MODEL",
                status=404,
            )
        model = spec.model or (names[0] if names else "")
        if not model:
            raise ServerError(
                f"{spec.shown_url}/v1/models lists no model; name one with -m SERVER:MODEL (or --server URL -m MODEL)"
            )
        card = next((c for c in cards if c.get("id") == model), {})
        n_ctx = card.get("max_model_len") if isinstance(card.get("max_model_len"), int) else None  # vLLM
        if n_ctx is None and kind == "ollama":
            n_ctx = _ollama_ctx(client, model)
        engine = cls(client, spec, kind=kind, model=model, n_ctx=n_ctx or ASSUMED_CTX, ctx_known=n_ctx is not None)
        engine.tool_choice_strings_only = card.get("owned_by") == "llamacpp"
        engine.notices.append(f"server: {spec.shown_url} ({kind}, OpenAI-compatible), model {model}")
        engine.notices.append(f"server: the server renders the chat template ({engine.template_detail})")
        engine.notices.append(STEERING_NOTICE)
        if n_ctx is None:
            engine.notices.append(
                f"server: the context size is not reported; assuming {ASSUMED_CTX} tokens (set it with --ctx)"
            )
        return engine

    @property
    def info(self) -> EngineInfo:
        rows = tuple(("server", line, "the server decides its own engine settings") for line in self.notices)
        return EngineInfo(model_path=self.model_path, rows=rows, template_detail=self.template_detail)

    def check_grammar(self, grammar: Grammar) -> None:
        raise UsageError(
            f"{grammar.source.split(' ')[0]}: {self.spec.shown_url} is an OpenAI-compatible server, which takes no "
            "grammar; use a local model or llama-server"
        )

    def close(self) -> None:
        for peer in self.peers:
            peer.close()
        self.client.close()

    # --- prompts -----------------------------------------------------------------------------------
    def add_media(self, data: bytes, kind: str, format: str) -> int:
        """Take an image or audio clip, sent as a content part where a message's marker names it;
        whether the server's model takes it, the server says when it is sent."""
        return self.media.add(data, kind, format)

    def has_single_token(self, text: str) -> bool:
        return False  # the vocabulary is on the server, and so is the template that would need it

    def min_tokens(self, text: str) -> int | None:
        return None

    def detokenize(self, tokens: Sequence[int]) -> str:
        return ""  # no token ids come back from a chat endpoint; nothing asks for them

    def is_control(self, token_id: int) -> bool:
        return False  # the vocabulary is on the server

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """Placeholder ids, as many as `text` counts (exactly where the server can count text):
        the server owns the vocabulary, and llmchat only ever needs the count from here."""
        if not text:
            return []
        if self.counter in ("chat", "text"):
            try:
                return [0] * self._count_text(text)
            except ServerError:
                self.counter = "estimate"
        return [0] * (len(text.encode("utf-8", errors="replace")) // 3 + 1)

    def cached_prefix(self, prompt: Sequence[int]) -> int:
        return 0  # known only after the reply, from usage.prompt_tokens_details.cached_tokens

    def shift_out_dropped(self, prompt: Sequence[int]) -> int:
        return 0

    def prompt_tokens(self, pieces: Sequence[PromptPiece]) -> ChatMessages:
        """The messages (and tools) the stand-in template wrote, with their token count."""
        data = json.loads("".join(piece[0] for piece in pieces))
        messages = [self.media.wire(_wire_message(m)) for m in data["messages"]]
        add_generation_prompt = bool(data.get("add_generation_prompt", True))
        tools = data.get("tools") or None
        return ChatMessages(messages, add_generation_prompt, self.count(messages, add_generation_prompt, tools), tools)

    def count(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool, tools: list[dict[str, Any]] | None = None
    ) -> int:
        if not messages:
            return 0
        if self.counter == "chat":
            body: dict[str, Any] = {
                "model": self.model,
                "messages": messages,
                "add_generation_prompt": add_generation_prompt,
            }
            if tools:
                body["tools"] = tools
            try:
                reply = self.client.post_json("/tokenize", body)
                if isinstance(reply, dict) and isinstance(reply.get("count"), int):
                    return int(reply["count"])
            except ServerError:
                pass
            self.counter = "text"
        texts = [_message_text(m) for m in messages]
        tools_text = json.dumps(tools, ensure_ascii=False) if tools else ""
        if self.counter == "text":
            try:
                counted = sum(self._count_text(text) + _MESSAGE_OVERHEAD for text in texts)
                return counted + self._count_text(tools_text) + estimated_media(messages)
            except ServerError:
                self.counter = "estimate"
        # On the high side: trimming a little early beats a server refusing the prompt.
        counted = sum(_estimate(text) + _MESSAGE_OVERHEAD for text in texts) + _estimate(tools_text)
        return counted + estimated_media(messages)

    def _count_text(self, text: str) -> int:
        if not text:
            return 0
        reply = self.client.post_json("/extras/tokenize/count", {"input": text, "model": self.model})
        if not isinstance(reply, dict) or not isinstance(reply.get("count"), int):
            raise ServerError("no count")
        return int(reply["count"])

    # --- generation --------------------------------------------------------------------------------
    def generate(self, request: GenerateRequest, *, feeds_steering: bool = False) -> ChatGeneration:
        """Stream the reply to a messages prompt. `feeds_steering` is accepted for the shape's sake:
        nothing here can steer a reply the server samples and renders."""
        if not isinstance(request.prompt, ChatMessages):
            raise ServerError(
                f"{self.spec.shown_url} renders its own chat template: it takes messages, not a token prompt"
            )
        return ChatGeneration(self, request, request.prompt)


def _wire_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the request carries it: role and content, and a tool turn's `tool_calls` /
    `tool_call_id`. Calls without text carry an empty content: OpenAI's API allows null or none,
    but llama_cpp.server refuses null (a string when present) and its templates read
    `message['content']` on every message."""
    wire: dict[str, Any] = {"role": str(message["role"]), "content": str(message.get("content") or "")}
    for key in _WIRE_KEYS:
        if message.get(key):
            wire[key] = message[key]
    return wire


def _message_text(message: dict[str, Any]) -> str:
    """What a message holds to be counted: its content, and its calls' names and arguments."""
    calls = message.get("tool_calls")
    return text_of(message.get("content")) + (json.dumps(calls, ensure_ascii=False) if calls else "")


def _estimate(text: str) -> int:
    return len(text.encode("utf-8", errors="replace")) // 3 + 1 if text else 0


def tools_and_choice(
    tools: list[dict[str, Any]], choice: str | dict[str, Any] | None, *, strings_only: bool = False
) -> tuple[list[dict[str, Any]], str | dict[str, Any]]:
    """The `tools` and `tool_choice` to send. A call forced to one tool is OpenAI's object form
    ({"type": "function", "function": {"name": ...}}), which vLLM and llama_cpp.server enforce
    (llama_cpp.server enforces nothing else: "required" is plain text there). llama-server reads
    `tool_choice` as a string only and takes the object as "auto" (tools/server/server-common.cpp,
    `json_value` with a string default), so there (`strings_only`) it goes as that tool alone with
    "required"."""
    if isinstance(choice, dict) and strings_only:
        name = (choice.get("function") or {}).get("name")
        only = [tool for tool in tools if (tool.get("function") or {}).get("name") == name]
        return (only or tools), "required"
    return tools, choice or "auto"


def _ollama_ctx(client: ServerClient, model: str) -> int | None:
    """Ollama's window for `model`: `num_ctx` from its parameters when set, else its default."""
    try:
        shown = client.post_json("/api/show", {"model": model})
    except ServerError:
        return None
    for line in str(shown.get("parameters") or "").splitlines():
        name, _, value = line.strip().partition(" ")
        if name == "num_ctx" and value.strip().isdigit():
            return int(value.strip())
    return None


class ChatGeneration:
    """An iterator of `RemoteToken`s from /v1/chat/completions; `outcome` is complete once it ends."""

    def __init__(self, engine: OpenAICompatEngine, request: GenerateRequest, prompt: ChatMessages):
        self.engine = engine
        self.prompt = prompt
        self.sampling = request.sampling
        self.max_tokens = request.max_tokens
        self.stops = request.stops
        self.tool_choice = request.tool_choice
        self.outcome = RemoteOutcome(prompt_tokens=len(prompt))
        self.seed = draw_seed(request.sampling)
        self.usage_seen = False

    def payload(self, limit: int, stream_options: dict[str, Any] | None) -> dict[str, Any]:
        params = self.sampling
        body: dict[str, Any] = {
            "model": self.engine.model,
            "messages": self.prompt.messages,
            "stream": True,
            "max_tokens": limit,  # always sent: vLLM's /v1/completions defaults to 16
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": self.seed,
            # Not in OpenAI's API, understood by llama.cpp, vLLM and llama_cpp.server (others ignore them).
            "top_k": params.top_k,
            "min_p": params.min_p,
            "repeat_penalty": params.repeat_penalty,
            "repetition_penalty": params.repeat_penalty,
        }
        if self.stops:
            body["stop"] = list(self.stops)
        if self.prompt.tools:
            body["tools"], body["tool_choice"] = tools_and_choice(
                self.prompt.tools, self.tool_choice, strings_only=self.engine.tool_choice_strings_only
            )
        if stream_options is not None:
            body["stream_options"] = stream_options
        return body

    def _events(self, limit: int) -> Iterator[dict[str, Any]]:
        """The stream's chunks, asking for usage the best way this server accepts."""
        engine = self.engine
        while True:
            options = _STREAM_OPTIONS[engine.stream_level]
            try:
                yield from engine.client.stream_events("/v1/chat/completions", self.payload(limit, options))
                return
            except ServerError as err:
                refused = err.status in (400, 422) and "stream" in str(err).lower()
                if not refused or engine.stream_level + 1 >= len(_STREAM_OPTIONS) or self.outcome.t_first_token:
                    raise
                engine.stream_level += 1
                engine.notices.append(f"server: refused stream_options {options}; asking without them")

    def __iter__(self) -> Iterator[RemoteToken]:
        engine, outcome = self.engine, self.outcome
        limit = reply_limit(engine.n_ctx, len(self.prompt), self.max_tokens)
        outcome.t_start = time.perf_counter()
        outcome.finish_reason = "interrupted"
        if limit <= 0:
            outcome.finish_reason = "length"
            return
        chunks = 0
        thinking = False
        finished = False
        calls: dict[int, dict[str, str]] = {}  # the tool calls so far, by index
        try:
            for chunk in self._events(limit):
                now = time.perf_counter()
                self._read_usage(chunk)
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
                    content = delta.get("content") or ""
                    text = ""
                    if reasoning:
                        text += reasoning if thinking else "<think>\n" + reasoning
                        thinking = True
                    if content:
                        text += ("\n</think>\n\n" if thinking else "") + content
                        thinking = False
                    called = _add_call_fragments(calls, delta.get("tool_calls"))
                    if text or called:
                        chunks += 1
                        if outcome.t_first_token is None:
                            outcome.t_first_token = outcome.t_first_shown = now
                        outcome.t_last_token = now
                        if not self.usage_seen:
                            outcome.generated_tokens = chunks
                        yield RemoteToken(text, -1)
                    reason = choice.get("finish_reason")
                    if reason:
                        finished = True
                        outcome.finish_reason = "length" if reason == "length" else "stop"
            if thinking:
                yield RemoteToken("\n</think>\n\n", -1)
            if not finished:
                raise ServerError(
                    f"{engine.spec.shown_url} ended the stream before the reply was finished (after {chunks} "
                    "chunks); check the server's log, then try again",
                    retriable=True,
                )
        finally:
            engine.last_outcome = outcome
            outcome.server_calls = _calls_of(calls)  # an interrupted reply's too (none of them runs)

    def _read_usage(self, chunk: dict[str, Any]) -> None:
        """`usage` and llama.cpp's `timings`, from whichever chunk carries them."""
        outcome = self.outcome
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage_seen = True
            if isinstance(usage.get("prompt_tokens"), int) and usage["prompt_tokens"] > 0:
                outcome.prompt_tokens = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                outcome.generated_tokens = usage["completion_tokens"]
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                outcome.cached_tokens = details["cached_tokens"]
        timings = chunk.get("timings")
        if isinstance(timings, dict):
            outcome.server = {k: float(v) for k, v in timings.items() if isinstance(v, (int, float))}
            if "cache_n" in timings:
                outcome.cached_tokens = int(timings["cache_n"])


def _add_call_fragments(calls: dict[int, dict[str, str]], fragments: Any) -> bool:
    """Add a delta's `tool_calls` fragments to the calls being assembled: the id and the name come
    once (llama_cpp.server repeats the name in every fragment: a repeat is not appended), the
    arguments in pieces (text; an object from a server that sends it whole). True when the delta
    carried any."""
    if not isinstance(fragments, list) or not fragments:
        return False
    for position, fragment in enumerate(fragments):
        if not isinstance(fragment, dict):
            continue
        index = fragment.get("index")
        call = calls.setdefault(index if isinstance(index, int) else position, {"id": "", "name": "", "arguments": ""})
        if isinstance(fragment.get("id"), str):
            call["id"] = fragment["id"]
        function = fragment.get("function") or {}
        name = function.get("name")
        if isinstance(name, str) and name != call["name"]:
            call["name"] += name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call["arguments"] += arguments
        elif arguments is not None:
            call["arguments"] += json.dumps(arguments, ensure_ascii=False)
    return True


def _calls_of(calls: dict[int, dict[str, str]]) -> list[ServerCall]:
    return [ServerCall(c["name"], c["arguments"], c["id"]) for _, c in sorted(calls.items())]


if TYPE_CHECKING:

    def _is_a_chat_engine(engine: OpenAICompatEngine) -> ChatEngine:
        """Never called: mypy checks here that an OpenAI-compatible engine satisfies the engine protocol."""
        return engine
