"""Which call format a model speaks: derived from its chat template, or one of a few rows of data.

`detect_family` renders the template with probe calls (llmchat.prompt.format_analysis, llama.cpp's
autoparser idea) and builds the family from what the template writes: its parser, its trigger
and its grammar come from that one `CallLayout`, so a family nobody listed works the day its
template ships. Hand-written rows remain only where the analysis cannot see the format:
- `HANDWRITTEN_FIRST`, checked before the analysis, each with the reason in its comment;
- the other rows, used when the template renders no call at all (the model's own format is then
  known only from the markers its template mentions).
A template with neither gets the generic format (generic.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from llmchat.prompt import format_parser
from llmchat.prompt.format_analysis import analyze
from llmchat.prompt.layout import CallLayout, ChatFormat
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
    layout: CallLayout | None = None  # derived from the template (None: a hand-written row)

    @property
    def derived(self) -> bool:
        return self.layout is not None

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
        "muse_glimmer",
        "Muse Glimmer (ATEM)",
        ("<atem:function_calls>", "to=self"),
        ("<atem:function_calls>",),
        p.parse_muse_glimmer,
    ),
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
    # LFM2's templates list the tools but never render a call, so there is nothing to derive; its
    # Python-style calls are this row of data, read by the same layout reader as derived formats.
    Family(
        "lfm2",
        "LFM2 (Python-style calls)",
        ("<|tool_list_start|>",),
        ("<|tool_call_start|>[",),
        p.parse_generic,  # replaced by the layout's reader (detect_family)
        layout=CallLayout(
            section_start="<|tool_call_start|>[",
            section_end="]<|tool_call_end|>",
            call_start="",
            call_end=")",
            separator=", ",
            name_in_json=False,
            args_start="(",
            args="tagged",
            string_prefix='="',
            string_suffix='"',
            value_prefix="=",
            arg_separator=", ",
        ),
    ),
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
    "muse_glimmer": lambda name, args: (
        f' to={name}<|message|><atem:function_calls>\n<atem:invoke name="{name}">\n'
        + "".join(
            f'<atem:parameter name="{key}">{value if isinstance(value, str) else _json(value)}</atem:parameter>\n'
            for key, value in (args or {}).items()
        )
        + "</atem:invoke>\n</atem:function_calls>"
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
    if family.layout is not None:
        return format_parser.call_text(family.layout, [(name, arguments)])
    return _CALL_TEXT[family.id](name, arguments)


GENERIC = Family("generic", "generic (JSON reply)", (), (), p.parse_generic)

# Rows the analysis cannot derive, checked before it:
# - gpt-oss: harmony writes the call's name in the channel header (`to=functions.NAME`) and its
#   recipient may come before or after the channel; the probes see one of several valid orders.
# - Functionary v3.2: its generation prompt ends in `>>>`, so the recipient (`all` for text, a
#   tool's name for a call) is the first thing the model writes; no call marker exists to find.
# - Firefunction v2: the template never renders a call (it reads `functions` as JSON text).
# A derived layout with no opener (Llama 3.x: a bare JSON object) gives way to a row whose
# markers the template holds: Llama 3.x's built-in tools' `<|python_tag|>` form is only in its text.
# - Muse Glimmer: like harmony, a call is a message addressed to the tool (`to=NAME<|message|>`).
HANDWRITTEN_FIRST = ("gpt_oss", "muse_glimmer", "functionary_v3_2", "firefunction_v2")
# The families whose calls are read from the whole reply: their headers name the call, and the
# reasoning split leaves headers out of the answer.
CALLS_IN_HEADERS = ("gpt_oss", "muse_glimmer")


def derived_family(layout: CallLayout, chat_format: ChatFormat | None = None, row: Family | None = None) -> Family:
    """The family a layout makes: parsed, written and held by grammar the way the layout says.
    `row`: a hand-written row that carries a layout of its own (its id, label and markers)."""

    def parse(text: str, schemas: Mapping[str, Any] | None = None) -> p.ParsedReply:
        found = format_parser.parse(layout, text, schemas)
        calls = [p.ParsedCall(call.name, call.arguments, call.id) for call in found.calls]
        content = chat_format.unwrap(found.content) if chat_format is not None else found.content
        return p.finish_reply(content, calls, drop_think=False)

    if row is not None:
        return Family(row.id, row.label, row.markers, (layout.opener,), parse, layout=layout)

    return Family(
        "derived",
        f"derived from the template: {layout.describe()}",
        (),
        (layout.opener,) if layout.opener else (),
        parse,
        arguments_as_text=layout.arguments_as_text,
        layout=layout,
    )


# LFM2.5-Instruct's template names neither marker; its tool list is introduced in plain words.
FAMILIES += (replace(next(row for row in FAMILIES if row.id == "lfm2"), markers=("List of tools: [",)),)
# Rows that carry a layout are read, written and held by grammar through it.
FAMILIES = tuple(derived_family(row.layout, None, row) if row.layout is not None else row for row in FAMILIES)


def call_in_reasoning(family: Family, reasoning: str) -> int | None:
    """Where a call opens inside thinking text, or None. A model whose generation prompt opened
    the thinking block may write its call without closing it (Kimi K2 Thinking, DeepSeek V4,
    Qwen 3.5): llama.cpp ends the thinking at the call, and so does a turn here."""
    if not reasoning or family.id in CALLS_IN_HEADERS:  # a call there is a message of its own
        return None
    if family.layout is not None:
        found = format_parser.find_opener(family.layout, reasoning)
        return (
            found[0] if found is not None and (family.layout.section_start + family.layout.call_start).strip() else None
        )
    hits = [reasoning.find(trigger) for trigger in family.triggers if trigger.strip()]
    hits = [hit for hit in hits if hit >= 0]
    return min(hits) if hits else None


def detect_family(template_source: str) -> Family:
    """The model's call format: a hand-written row the analysis cannot see, else the format
    derived from the template, else a row whose markers the template mentions, else generic."""
    for family in FAMILIES:
        if family.id in HANDWRITTEN_FIRST and family.matches(template_source):
            return family
    found = analyze(template_source)
    layout = found.calls
    if layout is not None and layout.opener:
        return derived_family(layout, found)
    for family in FAMILIES:
        if family.matches(template_source):
            return derived_family(family.layout, found, family) if family.layout is not None else family
    return derived_family(layout, found) if layout is not None else GENERIC
