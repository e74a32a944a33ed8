"""What kind of model a GGUF is: base, instruct (chat), or reasoning; and whether its template takes tools.

Why it matters: a base model does not answer questions, it continues text. The Gemma 3 270M test
model (no chat template, no instruct finetune in its metadata) "answers" "What is the capital of
Australia?" with an essay about house prices. llmchat still chats with it, but says so once.

Evidence, strongest first:
1. Instruct words in `general.finetune`, `general.name`, `general.basename`, `general.tags` or the
   file name: instruct, chat, it, sft, dpo, rlhf, orpo (SmolLM2's file is "...-Instruct...").
2. An explicit "base" in those fields.
3. A chat template in the file (`tokenizer.chat_template`): converters copy it from the instruct
   repo's tokenizer_config.json; base repos seldom have one.
4. Otherwise: base.

Reasoning: the template handles thinking, by the chat's own detector (`llmchat.reasoning.formats.detect_format`:
`<think>`, harmony channels, other tag pairs) or by the variables and fields thinking templates use
(`enable_thinking`, `reasoning_content`, `message.thinking`); or a name says R1/QwQ/thinking.
Tools: the template reads a `tools` variable or renders `tool_calls`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmchat.gguf.metadata import GGUFMetadata

BASE = "base"
INSTRUCT = "instruct"
REASONING = "reasoning"

_WORD_EDGE = r"(?:^|[\s\-_./:])"
_WORD_END = r"(?=$|[\s\-_./:])"
INSTRUCT_RE = re.compile(_WORD_EDGE + r"(instruct|chat|it|sft|dpo|rlhf|orpo|assistant)" + _WORD_END, re.IGNORECASE)
BASE_RE = re.compile(_WORD_EDGE + r"(base|pretrain(?:ed)?|pt)" + _WORD_END, re.IGNORECASE)
REASONING_NAME_RE = re.compile(_WORD_EDGE + r"(r1|qwq|thinking|think|reasoning|reasoner)" + _WORD_END, re.IGNORECASE)
THINKING_TEMPLATE_MARKERS = ("<think>", "</think>", "enable_thinking", "reasoning_content", "<|channel|>", ".thinking")
TOOLS_TEMPLATE_RE = re.compile(r"\btools\b|tool_calls|\btool_call\b")


@dataclass(frozen=True)
class TemplateFeatures:
    has_template: bool
    thinking: bool
    tools: bool


def template_features(template: str | None) -> TemplateFeatures:
    if not isinstance(template, str) or not template.strip():
        return TemplateFeatures(False, False, False)
    from llmchat.reasoning.formats import detect_format

    # The chat's own detector (the vocabulary is not read here: 262k strings cost too much for a list).
    thinking = detect_format(template) is not None or any(marker in template for marker in THINKING_TEMPLATE_MARKERS)
    return TemplateFeatures(has_template=True, thinking=thinking, tools=bool(TOOLS_TEMPLATE_RE.search(template)))


@dataclass(frozen=True)
class ModelKind:
    kind: str  # BASE | INSTRUCT | REASONING
    tools: bool
    why: str  # the evidence, for `models show` and the JSON

    @property
    def label(self) -> str:
        return self.kind + (" + tools" if self.tools else "")

    @property
    def is_base(self) -> bool:
        return self.kind == BASE

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "tools": self.tools, "kind_evidence": self.why}


def _texts(values: Iterable[Any]) -> list[str]:
    found: list[str] = []
    for value in values:
        if isinstance(value, str) and value:
            found.append(value)
        elif isinstance(value, list):
            found.extend(v for v in value if isinstance(v, str) and v)
    return found


def classify(
    *,
    finetune: Any = None,
    name: Any = None,
    basename: Any = None,
    tags: Any = None,
    other_names: Iterable[str] = (),
    features: TemplateFeatures,
) -> ModelKind:
    """The kind from metadata fields (any may be missing or of the wrong type) and template features."""
    fields = _texts([finetune, name, basename, tags]) + [n for n in other_names if n]
    instruct_hit = next((m.group(1) for f in fields if (m := INSTRUCT_RE.search(f))), None)
    base_hit = next((m.group(1) for f in fields if (m := BASE_RE.search(f))), None)
    reasoning_hit = next((m.group(1) for f in fields if (m := REASONING_NAME_RE.search(f))), None)

    if instruct_hit:
        chat, why = True, f"'{instruct_hit}' in its name or metadata"
    elif base_hit:
        chat, why = False, f"'{base_hit}' in its name or metadata"
    elif features.has_template:
        chat, why = True, "it has a chat template and no base/instruct word in its name"
    else:
        chat, why = False, "no chat template and no instruct finetune in its metadata or name"

    if chat and features.thinking:
        return ModelKind(REASONING, features.tools, why + "; its template handles thinking")
    if chat and reasoning_hit:
        return ModelKind(REASONING, features.tools, why + f"; '{reasoning_hit}' in its name")
    return ModelKind(INSTRUCT if chat else BASE, features.tools and chat, why)


def kind_of(meta: GGUFMetadata, other_names: Iterable[str] = ()) -> ModelKind:
    """The kind of a model from its header (and the names a store gives it, e.g. the file name)."""
    return classify(
        finetune=meta.get("general.finetune"),
        name=meta.get("general.name"),
        basename=meta.get("general.basename"),
        tags=meta.get("general.tags"),
        other_names=[meta.path.name, *other_names],
        features=template_features(meta.get("tokenizer.chat_template")),
    )
