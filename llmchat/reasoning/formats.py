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

The reply's thinking is split from its answer as it streams by llmchat.reasoning.thinking.

`thinking_variables` turns `--think/--no-think` and an effort level into the template variables
their authors defined (`enable_thinking`, `reasoning_effort`).

Nothing here imports the engine or prints; the session wires it in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from llmchat.errors import UsageError
from llmchat.prompt.format_analysis import analyze

if TYPE_CHECKING:
    from collections.abc import Container

THINKING = "thinking"
ANSWER = "answer"
EFFORT_LEVELS = ("low", "medium", "high")

HARMONY_START = "<|start|>"
HARMONY_CHANNEL = "<|channel|>"
HARMONY_MESSAGE = "<|message|>"
HARMONY_END = "<|end|>"
HARMONY_MARKERS = (HARMONY_START, HARMONY_CHANNEL, HARMONY_MESSAGE, HARMONY_END, "<|return|>", "<|call|>")
HARMONY_THINKING_CHANNELS = ("analysis",)
# Muse Glimmer addresses each message instead (`<|start|>assistant to=RECIPIENT<|message|>…`):
# to `self` is thinking, to `user` the answer, to a tool a call; `<|eom|>` ends a message and
# `<|eot|>` the turn.
RECIPIENT_END_MESSAGE = "<|eom|>"
RECIPIENT_MARKERS = (HARMONY_START, HARMONY_MESSAGE, RECIPIENT_END_MESSAGE, "<|eot|>")
# The formats whose reply is a series of messages with headers, read by the same parser.
MESSAGE_KINDS = ("harmony", "recipient")

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

    kind: str  # "tags" | "harmony" | "recipient"
    open_tag: str  # tags: the opening tag; harmony: the analysis channel header
    close_tag: str  # tags: the closing tag; harmony: <|end|>
    forced_close: str  # what the budget forces into the reply to end thinking
    switch: str | None = None  # template variable that turns thinking on/off (enable_thinking)
    effort: str | None = None  # template variable for the effort level (reasoning_effort)

    @property
    def name(self) -> str:
        if self.kind in MESSAGE_KINDS:
            return "harmony" if self.kind == "harmony" else "messages to=self"
        return f"{self.open_tag}…{self.close_tag}"

    @property
    def markers(self) -> tuple[str, ...]:
        """Every piece of markup the parser must see in the token text (control tokens included)."""
        if self.kind in MESSAGE_KINDS:
            return HARMONY_MARKERS if self.kind == "harmony" else RECIPIENT_MARKERS
        return (self.open_tag, self.close_tag)


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
    if HARMONY_CHANNEL in template and HARMONY_MESSAGE in template:
        final = f"{HARMONY_END}{HARMONY_START}assistant{HARMONY_CHANNEL}final{HARMONY_MESSAGE}"
        return ReasoningFormat(
            "harmony",
            f"{HARMONY_CHANNEL}analysis{HARMONY_MESSAGE}",
            HARMONY_END,
            forced_close=final,
            effort="reasoning_effort" if "reasoning_effort" in template else None,
        )
    if HARMONY_MESSAGE in template and "to=self" in template and RECIPIENT_END_MESSAGE in template:
        to_user = f"{RECIPIENT_END_MESSAGE}{HARMONY_START}assistant to=user{HARMONY_MESSAGE}"
        return ReasoningFormat(
            "recipient",
            f" to=self{HARMONY_MESSAGE}",
            RECIPIENT_END_MESSAGE,
            forced_close=to_user,
            effort="reasoning_strength" if "reasoning_strength" in template else None,
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
    return thinking_preface(fmt, prompt_text) is not None


# The most text a generation prompt may write inside the block it opens (Apriel's "Here are my
# reasoning steps:"): longer, and the opener was not a thinking block's.
PREFACE_LIMIT = 120


def thinking_preface(fmt: ReasoningFormat, prompt_text: str) -> str | None:
    """The text a generation prompt writes inside the thinking block it leaves open ("" for a
    prompt that ends with the opener), or None where it leaves none open. llama.cpp counts that
    text as the reply's reasoning; so does a turn here."""
    if prompt_text.rstrip().endswith(fmt.open_tag):
        return ""
    if fmt.kind != "tags" or fmt.open_tag not in prompt_text:
        return None
    after = prompt_text[prompt_text.rindex(fmt.open_tag) + len(fmt.open_tag) :]
    if fmt.close_tag in after or not after.strip() or len(after.strip()) > PREFACE_LIMIT:
        return None
    return after.strip()


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
