"""Reasoning ("thinking") models: which format a model thinks in, and its thinking parsed apart.

Formats (`detect_format`, from the chat template's text and the model's vocabulary):
- `<think>…</think>` (Qwen3, QwQ, DeepSeek-R1 distills, SmolLM3, Phi-4-reasoning): chosen when the
  template mentions `<think>` or the vocabulary holds both tags as single tokens;
- gpt-oss's harmony channels: `<|channel|>analysis<|message|>…<|end|>` is thinking, the `final`
  channel (after `<|start|>assistant<|channel|>final<|message|>`) is the answer;
- other tag pairs, when the vocabulary marks both as single tokens (`[THINK]…[/THINK]` Magistral,
  `<seed:think>`, `◁think▷`, `<|begin_of_thought|>`): the same parser with other tags.

Several templates end the generation prompt with an open `<think>` (R1, QwQ, Qwen3-Thinking), so
the reply holds only the closing tag: the parser takes its start state from the rendered prompt
(`starts_in_thinking`). A reply's own `<think>` opens thinking only at its very start (after
whitespace), so an answer that talks about the tag is left alone.

`ThinkingSplitter` works on the stream of token texts: a tag split over several tokens is held
back until it is complete or cannot be a tag any more, and a block that never closes is
thinking to the end (an empty answer). `ThinkingTracker` adds what a turn needs around it: the
thinking token count, the time of the first answer token, and the budget (`--thinking-budget N`:
after N generated tokens still inside thinking, the format's closing text is forced into the
reply and the model answers; llama.cpp's `--reasoning-budget` does the same). With a budget, an
end-of-generation token inside the block is replaced by the close too: a budget asks for an
answer, and SmolLM2 carrying the R1 template stopped after 10-22 thinking tokens with none.

`thinking_variables` turns `--think/--no-think` and an effort level into the template variables
their authors defined (`enable_thinking`, `reasoning_effort`).

Nothing here imports the engine or prints; the session wires it in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from llmchat.errors import UsageError
from llmchat.prompt.format_analysis import analyze

if TYPE_CHECKING:
    from collections.abc import Container, Sequence

THINKING = "thinking"
ANSWER = "answer"
EFFORT_LEVELS = ("low", "medium", "high")

_HARMONY_START = "<|start|>"
_HARMONY_CHANNEL = "<|channel|>"
_HARMONY_MESSAGE = "<|message|>"
_HARMONY_END = "<|end|>"
_HARMONY_MARKERS = (_HARMONY_START, _HARMONY_CHANNEL, _HARMONY_MESSAGE, _HARMONY_END, "<|return|>", "<|call|>")
_HARMONY_THINKING_CHANNELS = ("analysis",)

# Tag pairs seen in released reasoning models, tried in this order after <think>.
_OTHER_TAG_PAIRS = (
    ("[THINK]", "[/THINK]"),  # Magistral
    ("<seed:think>", "</seed:think>"),  # Seed-OSS
    ("◁think▷", "◁/think▷"),  # Kimi
    ("<|begin_of_thought|>", "<|end_of_thought|>"),
    ("<thinking>", "</thinking>"),
    ("<reasoning>", "</reasoning>"),
)


@dataclass(frozen=True)
class ReasoningFormat:
    """How one model marks its thinking, and how its template is told to think or not."""

    kind: str  # "tags" | "harmony"
    open_tag: str  # tags: the opening tag; harmony: the analysis channel header
    close_tag: str  # tags: the closing tag; harmony: <|end|>
    forced_close: str  # what the budget forces into the reply to end thinking
    switch: str | None = None  # template variable that turns thinking on/off (enable_thinking)
    effort: str | None = None  # template variable for the effort level (reasoning_effort)

    @property
    def name(self) -> str:
        return "harmony" if self.kind == "harmony" else f"{self.open_tag}…{self.close_tag}"

    @property
    def can_disable(self) -> bool:
        return self.switch is not None

    @property
    def markers(self) -> tuple[str, ...]:
        """Every piece of markup the parser must see in the token text (control tokens included)."""
        return _HARMONY_MARKERS if self.kind == "harmony" else (self.open_tag, self.close_tag)


def _tags(open_tag: str, close_tag: str, template: str) -> ReasoningFormat:
    return ReasoningFormat(
        "tags",
        open_tag,
        close_tag,
        forced_close=f"\n{close_tag}\n\n",
        switch="enable_thinking" if "enable_thinking" in template else None,
        effort="reasoning_effort" if "reasoning_effort" in template else None,
    )


def detect_format(template: str, vocabulary: Container[str] | None = None) -> ReasoningFormat | None:
    """The reasoning format of a model from its chat template text and (when known) its
    vocabulary; None for a model that does not reason. `vocabulary`: answers whether a text is
    one token of the model (the tags of reasoning models are)."""
    vocab: Container[str] = vocabulary if vocabulary is not None else ()
    if _HARMONY_CHANNEL in template and _HARMONY_MESSAGE in template:
        final = f"{_HARMONY_END}{_HARMONY_START}assistant{_HARMONY_CHANNEL}final{_HARMONY_MESSAGE}"
        return ReasoningFormat(
            "harmony",
            f"{_HARMONY_CHANNEL}analysis{_HARMONY_MESSAGE}",
            _HARMONY_END,
            forced_close=final,
            effort="reasoning_effort" if "reasoning_effort" in template else None,
        )
    derived = analyze(template).reasoning
    if derived is not None and derived.start and derived.end:
        return _tags(derived.start, derived.end, template)
    if "<think>" in template or "</think>" in template or ("<think>" in vocab and "</think>" in vocab):
        return _tags("<think>", "</think>", template)
    for open_tag, close_tag in _OTHER_TAG_PAIRS:
        if (open_tag in template and close_tag in template) or (open_tag in vocab and close_tag in vocab):
            return _tags(open_tag, close_tag, template)
    return None


def starts_in_thinking(fmt: ReasoningFormat, prompt_text: str) -> bool:
    """Whether the rendered generation prompt leaves a thinking block open (R1, QwQ,
    Qwen3-Thinking end it with `<think>\\n`; a harmony prompt may end in the analysis header)."""
    return prompt_text.rstrip().endswith(fmt.open_tag)


@dataclass
class Segment:
    kind: str  # THINKING | ANSWER
    text: str


class ThinkingSplitter:
    """Splits a reply's text, fed a token at a time, into thinking and answer segments."""

    def __init__(self, fmt: ReasoningFormat, *, start_in_thinking: bool = False):
        self.fmt = fmt
        self.start_in_thinking = start_in_thinking
        self._pending = ""
        self._at_start = not start_in_thinking  # only whitespace so far: a <think> here opens thinking
        self._strip_answer = False  # drop the whitespace a template puts after the close tag
        self.closed = False  # a thinking block was seen to close (or the answer channel began)
        self._seen_marker = False
        self._header = ""  # harmony: the current header's text (role, recipient)
        self._held_header = ""  # harmony: text before any marker, header or plain answer
        self._reclassify = False  # a close tag came after answer text: that text was thinking
        if fmt.kind == "harmony":
            self.mode = THINKING if start_in_thinking else "header"
            self._channel = "analysis" if start_in_thinking else ""
        else:
            self.mode = THINKING if start_in_thinking else ANSWER
        self.thinking_parts: list[str] = []
        self.answer_parts: list[str] = []

    @property
    def in_thinking(self) -> bool:
        return self.mode == THINKING

    @property
    def reasoning(self) -> str:
        return "".join(self.thinking_parts).strip()

    @property
    def answer(self) -> str:
        return "".join(self.answer_parts)

    def feed(self, text: str) -> list[Segment]:
        self._pending += text
        return self._drain(final=False)

    def flush(self) -> list[Segment]:
        """The end of the reply: whatever was held back is text of the current phase."""
        out = self._drain(final=True)
        if self._held_header and not self._seen_marker:  # no harmony markup at all: all answer
            self.mode = ANSWER
            self._emit(self._held_header, out)
            self._held_header = ""
        return out

    # --- parsing ---------------------------------------------------------------------------------
    def _drain(self, *, final: bool) -> list[Segment]:
        out: list[Segment] = []
        while self._pending:
            if self._at_start and self.fmt.kind == "tags" and self.mode == ANSWER:
                if not self._opening(final):
                    break
                continue
            markers = self._live_markers()
            found = _earliest(self._pending, markers)
            if found is None:
                keep = 0 if final else _partial_suffix(self._pending, markers)
                cut = len(self._pending) - keep
                text, self._pending = self._pending[:cut], self._pending[cut:]
                self._emit(text, out)
                break
            index, marker = found
            self._emit(self._pending[:index], out)
            self._pending = self._pending[index + len(marker) :]
            self._on_marker(marker, out)
        return out

    def _opening(self, final: bool) -> bool:
        """At the start of a tags reply: does it open with the tag? False: wait for more text."""
        stripped = self._pending.lstrip()
        tag, close = self.fmt.open_tag, self.fmt.close_tag
        if stripped.startswith(tag):
            self._pending = stripped[len(tag) :]
            self.mode = THINKING
            self._at_start = False
        elif stripped.startswith(close):
            # A reply that opens with the closing tag: the block was open and empty (the template
            # opened it where the prompt does not show it); the tag is not part of the answer.
            self._pending = stripped[len(close) :]
            self.closed = True
            self._strip_answer = True
            self._at_start = False
        elif not final and (not stripped or tag.startswith(stripped) or close.startswith(stripped)):
            return False  # whitespace or the start of a tag so far
        else:
            self._at_start = False
        return True

    def _live_markers(self) -> tuple[str, ...]:
        fmt = self.fmt
        if fmt.kind == "harmony":
            return _HARMONY_MARKERS
        if self.mode == THINKING:
            return (fmt.close_tag,)
        # After a closed block both tags stay live: the model may think again, or close again.
        return (fmt.open_tag, fmt.close_tag) if self.closed else ()

    def _on_marker(self, marker: str, out: list[Segment]) -> None:
        fmt = self.fmt
        self._seen_marker = True
        if self._held_header:  # the reply began inside a header (the prompt ended with `<|start|>assistant`)
            self._header += self._held_header
            self._held_header = ""
        if fmt.kind != "harmony":
            if marker == fmt.open_tag:  # a second block, after a closed one
                self.mode = THINKING
                self.thinking_parts.append("\n")
                return
            if self.mode == ANSWER and self.answer_parts:
                # Another close tag after the answer began: as the templates read a reply
                # (`content.split('</think>')[-1]`), all before the last close tag is reasoning,
                # once text follows it (a stray close tag that ends the reply changes nothing).
                self._reclassify = True
            self.mode = ANSWER
            self.closed = True
            self._strip_answer = True
            return
        # Harmony: <|start|>ROLE<|channel|>NAME<|message|>BODY<|end|>; headers are never shown.
        if marker in (_HARMONY_START, _HARMONY_CHANNEL):
            if marker == _HARMONY_START:
                self._header = ""
            self.mode = "header" if marker == _HARMONY_START else "channel"
            self._channel = ""
        elif marker == _HARMONY_MESSAGE:
            name = self._channel.split()[0] if self._channel.split() else ""
            if " to=" in f" {self._header} {self._channel}":
                # A message to a tool (`to=functions.NAME`, `to=python`): a call, neither thinking
                # nor answer; the format's parser reads it from the raw reply.
                self.mode = "call"
            else:
                self.mode = THINKING if name in _HARMONY_THINKING_CHANNELS else ANSWER
            if self.mode == ANSWER:
                self.closed = True
                self._strip_answer = True
            self._header = ""
        else:  # <|end|>, <|return|>, <|call|>: the message is over
            if self.mode == THINKING:
                self.closed = True
            self.mode = "header"

    def _emit(self, text: str, out: list[Segment]) -> None:
        if not text:
            return
        mode = self.mode
        if mode == "channel":
            self._channel += text
            return
        if mode == "call":
            return
        if mode == "header":
            if self._seen_marker:
                self._header += text
            else:  # header or answer: the next marker, or the end, says which
                self._held_header += text
            return
        if mode == ANSWER and self._strip_answer:
            text = text.lstrip()
            if not text:
                return
            self._strip_answer = False
        if mode == ANSWER and self._reclassify and text.strip():
            self._reclassify = False
            self.thinking_parts.extend(["\n", *self.answer_parts])
            self.answer_parts.clear()
        parts = self.thinking_parts if mode == THINKING else self.answer_parts
        parts.append(text)
        if out and out[-1].kind == mode:
            out[-1].text += text
        else:
            out.append(Segment(mode, text))


def _earliest(text: str, markers: Sequence[str]) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for marker in markers:
        index = text.find(marker)
        if index >= 0 and (best is None or index < best[0]):
            best = (index, marker)
    return best


def _partial_suffix(text: str, markers: Sequence[str]) -> int:
    """Length of the longest end of `text` that is the beginning of a marker (to hold back)."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-size:]):
                longest = size
                break
    return longest


def split_reply(fmt: ReasoningFormat, text: str, *, start_in_thinking: bool = False) -> tuple[str, str]:
    """(reasoning, answer) of a whole reply (batch --parallel, which gets each reply at once)."""
    splitter = ThinkingSplitter(fmt, start_in_thinking=start_in_thinking)
    splitter.feed(text)
    splitter.flush()
    return splitter.reasoning, splitter.answer


@dataclass
class ThinkingTracker:
    """One turn's thinking: the splitter, the counts and times the stats report, and the budget.

    It is the `Steering` the engine asks between two sampled tokens (`forced_tokens`): once the
    reply has `budget` generated tokens and is still thinking, it returns the format's closing
    text as token ids, once."""

    splitter: ThinkingSplitter
    budget: int | None = None
    close_ids: Sequence[int] = ()
    thinking_tokens: int = 0
    t_first: float | None = None  # the first text of any kind
    t_first_answer: float | None = None
    budget_hit: bool = False
    _closed_at: int | None = field(default=None, repr=False)
    _forced: bool = field(default=False, repr=False)
    _fed: bool = field(default=False, repr=False)

    @property
    def fed(self) -> bool:
        """Whether any reply text has been seen (a tracker a decoding loop never fed is unused)."""
        return self._fed

    def restart(self) -> None:
        """Forget every text fed so far: the reply starts again (a retried server request)."""
        fresh = ThinkingSplitter(self.splitter.fmt, start_in_thinking=self.splitter.start_in_thinking)
        self.__dict__.update(ThinkingTracker(fresh, budget=self.budget, close_ids=self.close_ids).__dict__)

    def feed(self, text: str, generated: int, now: float) -> list[Segment]:
        self._fed = True
        segments = self.splitter.feed(text)
        self._account(segments, generated, now)
        return segments

    def flush(self, generated: int, now: float) -> list[Segment]:
        segments = self.splitter.flush()
        self._account(segments, generated, now)
        if self._closed_at is None:
            # Never closed: every token was thinking if it ever started; otherwise none was.
            self.thinking_tokens = generated if self.splitter.thinking_parts else 0
        return segments

    def _account(self, segments: list[Segment], generated: int, now: float) -> None:
        if segments and self.t_first is None:
            self.t_first = now
        if any(s.kind == ANSWER for s in segments) and self.t_first_answer is None:
            self.t_first_answer = now
        if self._closed_at is None and self.splitter.closed:
            self._closed_at = generated
            self.thinking_tokens = generated

    def forced_tokens(self, generated: int, *, ending: bool = False) -> Sequence[int]:
        """The close ids, once, when a budgeted thinking block reaches its budget, or when the
        model tries to end the reply inside it (a budget asks for an answer; an end token there
        would leave none)."""
        if self.budget is None or self._forced or not self.splitter.in_thinking or not self.close_ids:
            return ()
        if generated >= self.budget:
            self.budget_hit = True
        elif not ending:
            return ()
        self._forced = True
        return self.close_ids


def parse_template_var(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` from --template-var: VALUE is read as JSON when it is JSON (true, 3, "x",
    [..]), else taken as a string. Raises UsageError with the reason."""
    import json

    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise UsageError(f"--template-var {text!r} is not KEY=VALUE; KEY must be a template variable name")
    if key in ("messages", "add_generation_prompt", "bos_token", "eos_token"):
        raise UsageError(f"--template-var {key} is set by llmchat itself; pick another variable")
    try:
        return key, json.loads(value)
    except ValueError:  # not JSON: a plain string
        return key, value


def thinking_variables(
    fmt: ReasoningFormat | None, think: bool | None, effort: str | None, say: Callable[[str], None]
) -> dict[str, Any]:
    """Template variables for --think/--no-think and an effort level. What the template cannot
    do is said once through `say`, never silently ignored. Without --think/--no-think a template
    that can switch thinking gets it on, as llama.cpp passes it (`enable_thinking` true): a
    template that closes the block when the switch is unset (R1-Distill's) would not think at all.
    The effort level is left to the template's own default unless given."""
    if think is None and effort is None:
        return {fmt.switch: True} if fmt is not None and fmt.switch else {}
    if fmt is None:
        say("this model's template has no thinking mode; --think/--no-think and --reasoning-effort do nothing here")
        return {}
    variables: dict[str, Any] = {fmt.switch: True} if fmt.switch and think is None else {}
    if effort is not None:
        if fmt.effort:
            variables[fmt.effort] = effort
        else:
            say(f"this model's template has no effort level ({fmt.name}); --reasoning-effort {effort} is ignored")
    if think is not None:
        if fmt.switch:
            variables[fmt.switch] = think
        elif think is False:
            low = f" (--reasoning-effort low is its least: {fmt.effort})" if fmt.effort else ""
            say(
                f"this model's template cannot switch thinking off{low}; its thinking is still kept apart "
                "from the answer; --thinking-budget 0 cuts it short"
            )
    return variables


DISPLAY_MODES = ("auto", "hide", "stdout")


@dataclass(frozen=True)
class ReasoningSettings:
    """What the user asked for (flags over config): the switch, the effort level, the budget, where
    thinking is shown (auto: dimmed on a terminal's stderr; hide; stdout, marked) and other
    template variables (--template-var)."""

    think: bool | None = None
    effort: str | None = None
    budget: int | None = None
    display: str = "auto"
    variables: tuple[tuple[str, Any], ...] = ()
    preserve: bool = False  # --reasoning-preserve (llmchat.prompt.reasoning_history)

    @classmethod
    def from_options(cls, opts: Any, config: Any = None) -> ReasoningSettings:
        """From RunOptions and the Config (flags win). Raises UsageError with what is wrong."""

        def pick(flag: Any, key: str) -> Any:
            return flag if flag is not None else getattr(config, key, None)

        effort = pick(opts.reasoning_effort, "reasoning_effort")
        if effort is not None and effort not in EFFORT_LEVELS:
            raise UsageError(f"--reasoning-effort must be one of {', '.join(EFFORT_LEVELS)}, got {effort!r}")
        budget = pick(opts.thinking_budget, "thinking_budget")
        if budget is not None and budget < 0:
            raise UsageError(f"--thinking-budget must be 0 or more tokens, got {budget}")
        if opts.hide_thinking and opts.show_thinking:
            raise UsageError("--hide-thinking and --show-thinking contradict each other; pass one")
        display = "hide" if opts.hide_thinking else "stdout" if opts.show_thinking else None
        if display is None:
            display = "hide" if getattr(config, "hide_thinking", False) else "auto"
        variables = tuple(parse_template_var(item) for item in opts.template_var)
        preserve = bool(pick(opts.reasoning_preserve, "reasoning_preserve"))
        return cls(pick(opts.think, "think"), effort, budget, display, variables, preserve)
