"""The grammar of a tool call in a family's own syntax, with each tool's arguments held to its schema.

call_grammar(family, tools) gives a GBNF grammar whose root is one complete call (several for the
families that write a list), starting at the family's opening text (its trigger), so that:
- with `--tool-choice required` (or a tool's name) the gate holds the reply to it from the first token;
- with `auto` a lazy gate switches it on where the trigger appears and feeds the trigger text
  through it first, as llama.cpp's lazy grammars do.
Each tool's arguments come from llmchat's own JSON Schema converter (engine.grammar), given the part
of the tool's schema the grammar can hold (llmchat.tools.schema_hold: the rest is checked by
validation), its rules renamed per tool so that tools cannot collide. Qwen3-Coder's
XML holds the function and parameter names; its values are free text (they are not JSON).
End-of-turn tokens after a call (`<|call|>`, `<|im_end|>`) are left to the stop rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llmchat.engine.grammar import Grammar, schema_to_gbnf
from llmchat.prompt.format_parser import with_key
from llmchat.prompt.layout import ID_SLOT, INDEX_SLOT, CallLayout
from llmchat.tools import generic
from llmchat.tools.families import GENERIC, Family
from llmchat.tools.schema_hold import grammar_spec
from llmchat.tools.spec import ToolSpec

_RULE = re.compile(r"^([A-Za-z][A-Za-z0-9-]*) ::= ", re.MULTILINE)
# A GBNF body: quoted literals and character classes are kept whole; bare words are rule references.
_BODY_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[A-Za-z][A-Za-z0-9-]*')
WS = 'ws ::= | " " | "\\n" [ \\t]{0,20}'


@dataclass(frozen=True)
class ToolGrammar:
    grammar: Grammar
    triggers: tuple[str, ...]  # where a lazy gate switches on; () = from the first token


def literal(text: str) -> str:
    """A GBNF string literal for text (JSON escaping is GBNF's escaping for these characters)."""
    return json.dumps(text, ensure_ascii=False)


def prefixed_schema_rules(schema: dict, prefix: str, separators: tuple[str, str] | None = None) -> str:
    """The schema's grammar with every rule renamed `PREFIX-NAME` (its root becomes `PREFIX-root`).
    `separators` (item, key), as json.dumps takes them: the JSON is held to exactly that spacing,
    the way a template's `tojson` writes it back, so a call the model wrote re-renders as the same
    tokens and the next round reuses the whole first one from the KV cache."""
    gbnf = schema_to_gbnf(schema)
    if separators is not None:
        item, key = separators
        gbnf = gbnf.replace('space ":" space', literal(key)).replace('"," space', literal(item))
        gbnf = re.sub(r"^space ::= .*$", 'space ::= ""', gbnf, flags=re.MULTILINE)
    names = set(_RULE.findall(gbnf))

    def rename_body(body: str) -> str:
        return _BODY_TOKEN.sub(lambda m: f"{prefix}-{m.group(0)}" if m.group(0) in names else m.group(0), body)

    lines = []
    for line in gbnf.splitlines():
        match = _RULE.match(line)
        if match:
            lines.append(f"{prefix}-{match.group(1)} ::= {rename_body(line[match.end() :])}")
        elif line.strip():
            lines.append(rename_body(line))
    return "\n".join(lines)


def _json_call(name: str, args_rule: str, name_key: str = "name", args_key: str = "arguments") -> str:
    return (
        f'"{{" ws {literal(json.dumps(name_key))} ws ":" ws {literal(json.dumps(name))} ws "," ws '
        f'{literal(json.dumps(args_key))} ws ":" ws {args_rule} ws "}}"'
    )


def _list_of(item: str) -> str:
    return f'"[" ws {item} (ws "," ws {item})* ws "]"'


def _per_family(family: Family, tools: Sequence[ToolSpec], lazy: bool = False) -> tuple[str, list[str]]:
    """(root body, extra rules) for this family; `tN-root` is tool N's arguments. `lazy`: the
    grammar starts at the family's trigger (where the call grammar itself starts elsewhere)."""
    rules: list[str] = []
    calls = []
    bodies = _LAZY_CALL_BODY if lazy and family.id in _LAZY_CALL_BODY else _CALL_BODY
    for index, spec in enumerate(tools):
        args = f"t{index}-root"
        call_rule = f"t{index}-call"
        body = bodies[family.id](spec, args, index, rules)
        rules.append(f"{call_rule} ::= {body}")
        calls.append(call_rule)
    rules.append(f"call ::= {' | '.join(calls)}")
    root = _LAZY_ROOT[family.id] if lazy and family.id in _LAZY_ROOT else _ROOT[family.id]
    return root, rules


def _qwen3_coder_call(spec: ToolSpec, args: str, index: int, rules: list[str]) -> str:
    names = list(spec.parameters.get("properties", {}))
    param = f"t{index}-param"
    choice = " | ".join(literal(name) for name in names) or '"_"'
    rules.append(f'{param} ::= "<parameter=" ({choice}) ">\\n" xml-value "\\n</parameter>\\n"')
    return f'"<function=" {literal(spec.name)} ">\\n" {param}* "</function>"'


def _atem_invoke(spec: ToolSpec, args: str, index: int, rules: list[str]) -> str:
    """Muse Glimmer's `<atem:invoke name="NAME">` with its parameters, each value as-is text."""
    names = list(spec.parameters.get("properties", {}))
    param = f"t{index}-param"
    choice = " | ".join(literal(name) for name in names) or '"_"'
    rules.append(
        f"{param} ::= {literal('<atem:parameter name=' + chr(34))} ({choice}) "
        f"{literal(chr(34) + '>')} xml-value {literal('</atem:parameter>' + chr(10))}"
    )
    return f'{literal("<atem:invoke name=" + chr(34))} {literal(spec.name)} {literal(chr(34) + ">" + chr(10))} {param}* "</atem:invoke>"'


def _atem_message(spec: ToolSpec, args: str, index: int, rules: list[str]) -> str:
    """A whole Muse Glimmer call: the message to the tool, then its function_calls block."""
    invoke = _atem_invoke(spec, args, index, rules)
    return f'" to=" {literal(spec.name)} "<|message|><atem:function_calls>\n" {invoke} "\n</atem:function_calls>"'


_CALL_BODY: dict[str, Callable[[ToolSpec, str, int, list[str]], str]] = {
    "hermes": lambda s, a, i, r: _json_call(s.name, a),
    "granite": lambda s, a, i, r: _json_call(s.name, a),
    "firefunction_v2": lambda s, a, i, r: _json_call(s.name, a),
    "llama3": lambda s, a, i, r: _json_call(s.name, a, args_key="parameters"),
    "mistral_nemo": lambda s, a, i, r: (
        f'"{{" ws "\\"name\\"" ws ":" ws {literal(json.dumps(s.name))} ws "," ws "\\"arguments\\"" ws ":" ws {a} '
        f'ws "," ws "\\"id\\"" ws ":" ws "\\"" [a-zA-Z0-9]{{9}} "\\"" ws "}}"'
    ),
    "command_r7b": lambda s, a, i, r: (
        f'"{{" ws "\\"tool_call_id\\"" ws ":" ws "\\"" [0-9]{{1,6}} "\\"" ws "," ws "\\"tool_name\\"" ws ":" ws '
        f'{literal(json.dumps(s.name))} ws "," ws "\\"parameters\\"" ws ":" ws {a} ws "}}"'
    ),
    "functionary_v3_1": lambda s, a, i, r: f'"<function=" {literal(s.name)} ">" {a} "</function>"',
    "functionary_v3_2": lambda s, a, i, r: f'{literal(s.name)} "\\n" {a}',
    "deepseek_r1": lambda s, a, i, r: (
        f'"<｜tool▁call▁begin｜>function<｜tool▁sep｜>" {literal(s.name)} "\\n```json\\n" {a} "\\n```<｜tool▁call▁end｜>"'
    ),
    "gpt_oss": lambda s, a, i, r: (
        f'"<|channel|>commentary to=functions." {literal(s.name)} " <|constrain|>json<|message|>" {a}'
    ),
    "qwen3_coder": _qwen3_coder_call,
    "muse_glimmer": _atem_message,
}

_ROOT: dict[str, str] = {
    "hermes": '"<tool_call>" ws call ws "</tool_call>"',
    "qwen3_coder": '"<tool_call>\\n" call "\\n</tool_call>"',
    "granite": '"<|tool_call|>" ' + _list_of("call"),
    "firefunction_v2": '" functools" ' + _list_of("call"),
    "mistral_nemo": '"[TOOL_CALLS]" ' + _list_of("call"),
    "command_r7b": '"<|START_ACTION|>" ' + _list_of("call") + ' "<|END_ACTION|>"',
    "llama3": "call",
    "functionary_v3_1": "call",
    "functionary_v3_2": "call",
    "deepseek_r1": '"<｜tool▁calls▁begin｜>" call ("\\n" call)* "<｜tool▁calls▁end｜>"',
    "gpt_oss": "call",
    "muse_glimmer": "call",
}


# A lazy gate feeds the text from the trigger on through the grammar, so the grammar must start
# with the trigger. Most families' calls do; these two start elsewhere (Functionary v3.2's `>>>`
# ends its generation prompt; gpt-oss's trigger is inside the channel header).
_LAZY_ROOT: dict[str, str] = {
    "functionary_v3_2": '">>>" call',
    "gpt_oss": '" to=functions." call',
    "muse_glimmer": '"<atem:function_calls>\\n" call "\\n</atem:function_calls>"',
}
_LAZY_CALL_BODY: dict[str, Callable[[ToolSpec, str, int, list[str]], str]] = {
    "gpt_oss": lambda s, a, i, r: f'{literal(s.name)} " <|constrain|>json<|message|>" {a}',
    "muse_glimmer": _atem_invoke,
}


def call_grammar(family: Family, tools: Sequence[ToolSpec], *, forced: bool = False, lazy: bool = False) -> ToolGrammar:
    """The grammar of one reply that calls one of `tools` in `family`'s syntax, each tool's
    arguments held to what the grammar can hold of its schema. The generic format's reply is a
    call or a response; `forced`: a call only. `lazy`: the grammar a lazy gate switches on at
    the family's first trigger (it starts with that trigger)."""
    if not tools:
        raise ValueError("a call grammar needs at least one tool")
    tools = [grammar_spec(spec) for spec in tools]  # what the grammar cannot hold is left to validation
    if family is GENERIC:
        schema = generic.call_schema(tools) if forced else generic.reply_schema(tools)
        return ToolGrammar(Grammar(schema_to_gbnf(schema), "the generic tool reply"), ())
    if family.layout is not None:
        text = layout_grammar(family.layout, tools, lazy=lazy)
        return ToolGrammar(Grammar(text, f"the {family.label} tool call"), family.triggers)
    root, rules = _per_family(family, tools, lazy)
    parts = [f"root ::= {root}", *rules, WS]
    if family.id in ("qwen3_coder", "muse_glimmer"):
        parts.append("xml-value ::= [^<]*")
    for index, spec in enumerate(tools):
        parts.append(_tool_rules(spec, f"t{index}"))
    return ToolGrammar(Grammar("\n".join(parts) + "\n", f"the {family.label} tool call"), family.triggers)


def _tool_rules(spec: ToolSpec, prefix: str, separators: tuple[str, str] | None = None) -> str:
    from llmchat.errors import UsageError

    try:
        return prefixed_schema_rules(spec.parameters, prefix, separators)
    except UsageError as err:
        raise UsageError(f"tool {spec.name} ({spec.source}): its parameters schema: {err}") from None


def answer_grammar() -> Grammar:
    """The generic format's reply once no more calls may be made: a response only."""
    return Grammar(schema_to_gbnf(generic.response_schema()), "the generic tool reply (an answer)")


_LITERAL = re.compile(r'"((?:\\.|[^"\\])*)"')


def grammar_literals(grammar_text: str) -> set[str]:
    """The quoted texts of a GBNF grammar: a call format's fixed markers are among them."""
    found = set()
    for match in _LITERAL.finditer(grammar_text):
        try:
            found.add(json.loads(f'"{match.group(1)}"'))
        except ValueError:  # a GBNF escape JSON does not have (\x..): not a marker
            continue
    return found


# --- the grammar of a derived layout ---------------------------------------------------------------
def _fixed(text: str) -> str:
    """A layout's fixed text as GBNF: the call index a template prints is a number, an id nine
    letters and digits (Mistral's templates refuse any other shape)."""
    parts = []
    for part in re.split(f"({ID_SLOT}|{INDEX_SLOT})", text):
        if part == INDEX_SLOT:
            parts.append("[0-9]{1,3}")
        elif part == ID_SLOT:
            parts.append("[a-zA-Z0-9]{9}")
        elif part:
            parts.append(literal(part))
    return " ".join(parts) or '""'


def _free_text(suffix: str) -> str:
    """Raw text up to a string's closing text: anything but that text's first character."""
    stop = suffix.strip()[:1] or "<"
    escaped = "\\" + stop if stop in "\\]^-" else stop
    return f"[^{escaped}]*"


def layout_grammar(layout: CallLayout, tools: Sequence[ToolSpec], *, lazy: bool = False) -> str:
    """One call to one of `tools`, written exactly as the template writes a call: its spacing,
    its key order, each tool's arguments held to its schema. `lazy`: it starts at the layout's
    opener, the trigger where a lazy gate switches it on; else the whitespace the template puts
    before the opener may come first."""
    rules: list[str] = []
    calls = []
    item, key_sep = layout.json_separators
    for index, spec in enumerate(tools):
        prefix = f"t{index}"
        if layout.name_in_json:
            fields = [f"{literal(json.dumps(spec.name) + key_sep)} {prefix}-root"] if layout.name_is_key else []
            for key in () if layout.name_is_key else layout.key_order or (layout.name_key, layout.arguments_key):
                if key == layout.name_key:
                    fields.append(literal(json.dumps(key) + key_sep + json.dumps(spec.name)))
                elif key == layout.arguments_key:
                    fields.append(f"{literal(json.dumps(key) + key_sep)} {prefix}-root")
                elif key == layout.id_key:
                    fields.append(f'{literal(json.dumps(key) + key_sep)} "\\"" [a-zA-Z0-9]{{9}} "\\""')
            body = f" {literal(item)} ".join(fields)
            call = f'"{{" {body} "}}"'
            if layout.function_key:
                call = f'"{{" {literal(json.dumps(layout.function_key) + key_sep)} {call} "}}"'
            rules.append(_tool_rules(spec, prefix, layout.json_separators))
        else:
            head = f"{literal(spec.name)} {_fixed(layout.args_start)}"
            if layout.args == "json":
                rules.append(_tool_rules(spec, prefix, layout.json_separators))
                call = f"{head} {prefix}-root"
            else:
                call = f"{head} {_tagged_rules(layout, spec, prefix, rules)}"
        rules.append(f"{prefix}-call ::= {call}")
        calls.append(f"{prefix}-call")
    rules.append(f"call ::= {' | '.join(calls)}")
    start = layout.section_start + ("" if layout.list_wrapped else layout.call_start)
    opener = _fixed(start.lstrip())
    leading = start[: len(start) - len(start.lstrip())]
    if leading and not lazy:
        opener = f"{literal(leading)}? {opener}"
    if layout.list_wrapped:  # one call a round, in a list of one (parallel calls are read, not forced)
        root = f"{opener} call {_fixed(layout.section_end.rstrip())}"
    else:  # what follows the call's last marker is the end of the turn, left to the stop rules
        root = f"{opener} call {_fixed((layout.call_end + layout.section_end).rstrip())}"
    return "\n".join([f"root ::= {root}", *rules, WS]) + "\n"


def _tagged_rules(layout: CallLayout, spec: ToolSpec, prefix: str, rules: list[str]) -> str:
    """The arguments as tagged pairs: each a property of the tool's schema, strings as raw text
    (or JSON strings where the template writes them so), other values held to their schema."""
    properties = spec.parameters.get("properties", {}) or {}
    params = []
    for number, (name, schema) in enumerate(properties.items()):
        one = with_key(layout, name)
        is_string = isinstance(schema, dict) and schema.get("type") == "string"
        if is_string and not one.string_is_json:
            value = f"{literal(one.key_prefix + name + one.string_prefix)} {_free_text(one.string_suffix)} {literal(one.string_suffix)}"
        else:
            sub = f"{prefix}-p{number}"
            try:
                rules.append(
                    prefixed_schema_rules(schema if isinstance(schema, dict) else {}, sub, one.json_separators)
                )
            except Exception as err:  # noqa: BLE001 - named with the tool below
                from llmchat.errors import UsageError

                raise UsageError(f"tool {spec.name} ({spec.source}): its parameter {name}: {err}") from None
            value = f"{literal(one.key_prefix + name + one.value_prefix)} {sub}-root {literal(one.value_suffix)}"
        rules.append(f"{prefix}-param{number} ::= {value}")
        params.append(f"{prefix}-param{number}")
    if not params:
        return '""'
    # In the schema's order, as the template writes them back: the required ones always, each
    # optional one where it stands or not at all.
    required = set(spec.parameters.get("required") or ())
    names = list(properties)
    sep = literal(layout.arg_separator)
    must = [param for param, name in zip(params, names) if name in required]
    may = [param for param, name in zip(params, names) if name not in required]
    if must:
        return f" {sep} ".join(must) + "".join(f" ({sep} {param})?" for param in may)
    return f"({may[0]}" + "".join(f" ({sep} {param})?" for param in may[1:]) + ")?"
