"""Which call format a model speaks, detected from its chat template as llama.cpp's common/chat.cpp does.

The template is searched for substrings, in a fixed order (the more specific first: Qwen3-Coder's
XML before Hermes' `<tool_call>`, Functionary and Firefunction before plain Llama 3.x). Each family
names its parser, the trigger text that opens a call (where a lazy grammar switches on), and what
its template needs: `functions` (Firefunction v2) or the arguments as JSON text instead of an object.
A template with none of the markers gets the generic format (generic.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from llmchat.tools import call_parsers as p

Parser = Callable[[str, "Mapping[str, Any] | None"], p.ParsedReply]


@dataclass(frozen=True)
class Family:
    id: str
    label: str
    markers: tuple[str, ...]  # all must be in the template source
    triggers: tuple[str, ...]  # text that opens a call; () = the whole reply is constrained (not lazy)
    parse: Parser
    arguments_as_text: bool = False  # the template concatenates arguments as a JSON string
    needs_functions: bool = False  # the template reads `functions` (JSON text) and `datetime`

    @property
    def lazy(self) -> bool:
        return bool(self.triggers)

    def matches(self, source: str) -> bool:
        return bool(self.markers) and all(marker in source for marker in self.markers)


FAMILIES: tuple[Family, ...] = (
    Family(
        "deepseek_r1",
        "DeepSeek R1",
        ("<｜tool▁calls▁begin｜>",),
        ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"),
        p.parse_deepseek_r1,
        arguments_as_text=True,
    ),
    Family(
        "command_r7b",
        "Command R7B",
        ("<|END_THINKING|><|START_ACTION|>",),
        ("<|START_ACTION|>",),
        p.parse_command_r7b,
    ),
    Family("granite", "Granite", ("<|tool_call|>",), ("<|tool_call|>",), p.parse_granite),
    Family(
        "qwen3_coder",
        "Qwen3-Coder (XML)",
        ("<tool_call>", "<function=", "<parameter="),
        ("<tool_call>",),
        p.parse_qwen3_coder,
    ),
    Family(
        "hermes",
        "Hermes 2/3 Pro, Qwen 2.5/3",
        ("<tool_call>",),
        ("<tool_call>", "<function="),
        p.parse_hermes,
    ),
    Family("gpt_oss", "gpt-oss (harmony)", ("<|channel|>",), (" to=functions.",), p.parse_gpt_oss),
    Family(
        "functionary_v3_2",
        "Functionary v3.2",
        (">>>all",),
        (">>>",),
        p.parse_functionary_v3_2,
        arguments_as_text=True,
    ),
    Family(
        "firefunction_v2",
        "Firefunction v2",
        (" functools[",),
        (" functools[",),
        p.parse_firefunction_v2,
        arguments_as_text=True,
        needs_functions=True,
    ),
    Family(
        "functionary_v3_1",
        "Functionary v3.1 (Llama 3.1)",
        ("<|start_header_id|>", "<function="),
        ("<function=",),
        p.parse_functionary_v3_1,
        arguments_as_text=True,
    ),
    Family(
        "llama3",
        "Llama 3.x",
        ("<|start_header_id|>ipython<|end_header_id|>",),
        ('{"name"', "<|python_tag|>"),
        p.parse_llama3,
    ),
    Family("mistral_nemo", "Mistral Nemo / Small", ("[TOOL_CALLS]",), ("[TOOL_CALLS]",), p.parse_mistral_nemo),
)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


_CALL_TEXT: dict[str, Callable[[str, Any], str]] = {
    "deepseek_r1": lambda name, args: (
        f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{_json(args)}\n```"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    ),
    "command_r7b": lambda name, args: (
        f'<|START_ACTION|>[{{"tool_call_id": "0", "tool_name": {_json(name)}, "parameters": {_json(args)}}}]<|END_ACTION|>'
    ),
    "granite": lambda name, args: f"<|tool_call|>[{_json({'name': name, 'arguments': args})}]",
    "qwen3_coder": lambda name, args: (
        f"<tool_call>\n<function={name}>\n"
        + "".join(
            f"<parameter={key}>\n{value if isinstance(value, str) else _json(value)}\n</parameter>\n"
            for key, value in (args or {}).items()
        )
        + "</function>\n</tool_call>"
    ),
    "hermes": lambda name, args: f"<tool_call>\n{_json({'name': name, 'arguments': args})}\n</tool_call>",
    "gpt_oss": lambda name, args: (
        f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{_json(args)}<|call|>"
    ),
    "functionary_v3_2": lambda name, args: f"{name}\n{_json(args)}",
    "firefunction_v2": lambda name, args: f" functools[{_json({'name': name, 'arguments': args})}]",
    "functionary_v3_1": lambda name, args: f"<function={name}>{_json(args)}</function>",
    "llama3": lambda name, args: _json({"name": name, "parameters": args}),
    "mistral_nemo": lambda name, args: f"[TOOL_CALLS][{_json({'name': name, 'arguments': args, 'id': 'call00000'})}]",
    "generic": lambda name, args: _json({"tool_call": {"name": name, "arguments": args}}),
}


def call_text(family: Family, name: str, arguments: Any) -> str:
    """One call written the way this family's model writes it (after the generation prompt)."""
    return _CALL_TEXT[family.id](name, arguments)


GENERIC = Family("generic", "generic (JSON reply)", (), (), p.parse_generic)


def detect_family(template_source: str) -> Family:
    """The first family whose markers are all in the template; the generic format otherwise."""
    for family in FAMILIES:
        if family.matches(template_source):
            return family
    return GENERIC


def family_by_id(family_id: str) -> Family:
    for family in (*FAMILIES, GENERIC):
        if family.id == family_id:
            return family
    raise KeyError(family_id)
