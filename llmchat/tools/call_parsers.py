"""Tool calls out of generated text, one parser per call format.

Each parser takes the text a model generated after the generation prompt and returns the text
meant for the user (the part before the first call) and the calls in it: name and arguments.
Parsers are lenient about what surrounds a call (an end-of-turn token, a missing closing tag at
the very end, where generation stopped) and strict about the call itself: a call whose JSON does
not decode is not a call. The grammar gate (later) is what makes calls always parse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_DECODER = json.JSONDecoder()

# End-of-turn and end-of-message tokens templates put after a reply; not part of what the user reads.
END_MARKERS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|end_of_role|>",
    "<|return|>",
    "<|call|>",
    "<|end|>",
    "</s>",
    "<|END_OF_TURN_TOKEN|>",
    "<｜end▁of▁sentence｜>",
)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: Any  # normally a dict; what the model wrote, when it is not an object (validation says so)
    id: str | None = None


@dataclass(frozen=True)
class ParsedReply:
    content: str
    calls: tuple[ParsedCall, ...] = field(default_factory=tuple)


def strip_end_markers(text: str) -> str:
    changed = True
    text = text.rstrip()
    while changed:
        changed = False
        for marker in END_MARKERS:
            if text.endswith(marker):
                text = text[: -len(marker)].rstrip()
                changed = True
    return text


def _json_at(text: str, pos: int) -> tuple[Any, int] | None:
    """The JSON value starting at pos (after whitespace) and the index after it, or None."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError:
        return None


def _call_from_object(
    value: Any, name_key: str = "name", args_keys: tuple[str, ...] = ("arguments", "parameters")
) -> ParsedCall | None:
    if not isinstance(value, dict) or not isinstance(value.get(name_key), str):
        return None
    arguments: Any = {}
    for key in args_keys:
        if key in value:
            arguments = value[key]
            break
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    call_id = value.get("id") if isinstance(value.get("id"), str) else None
    return ParsedCall(value[name_key], arguments, call_id)


def _reply(text: str, first_call_at: int | None, calls: list[ParsedCall]) -> ParsedReply:
    content = text if first_call_at is None or not calls else text[:first_call_at]
    return finish_reply(content, calls)


def finish_reply(content: str, calls: list[ParsedCall], *, drop_think: bool = True) -> ParsedReply:
    """The reply as the user reads it: no end-of-turn markers, no leftover `<think>` block."""
    if drop_think:
        content = re.sub(r"<think>.*?</think>", "", content, flags=re.DOTALL)
    return ParsedReply(strip_end_markers(content).strip(), tuple(calls))


# --- JSON object after a marker: Hermes 2/3, Qwen 2.5/3 --------------------------------------------
_FUNCTION_TAG = re.compile(r"<function=([^>\s]+)>")


def parse_hermes(text: str, schemas: Mapping[str, Any] | None = None) -> ParsedReply:
    """`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, repeated; also the
    `<function=NAME>{...}</function>` form some Qwen and Hermes finetunes emit."""
    calls: list[ParsedCall] = []
    first: int | None = None
    for match in re.finditer(r"<tool_call>", text):
        decoded = _json_at(text, match.end())
        call = _call_from_object(decoded[0]) if decoded else None
        if call is None:
            function = _FUNCTION_TAG.match(text, _skip_space(text, match.end()))
            if function:
                decoded = _json_at(text, function.end())
                if decoded and isinstance(decoded[0], dict):
                    call = ParsedCall(function.group(1), decoded[0])
        if call is not None:
            calls.append(call)
            first = match.start() if first is None else first
    if not calls:
        for match in _FUNCTION_TAG.finditer(text):
            decoded = _json_at(text, match.end())
            if decoded and isinstance(decoded[0], dict):
                calls.append(ParsedCall(match.group(1), decoded[0]))
                first = match.start() if first is None else first
    return _reply(text, first, calls)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


# --- Qwen3-Coder: XML parameters -------------------------------------------------------------------
_XML_CALL = re.compile(r"<tool_call>\s*<function=([^>\s]+)>(.*?)(?:</function>|$)", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def parse_qwen3_coder(text: str, schemas: Mapping[str, Any] | None = None) -> ParsedReply:
    """`<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`.
    A value is JSON when it decodes as JSON and the tool's schema does not say it is a string."""
    calls: list[ParsedCall] = []
    first: int | None = None
    for match in _XML_CALL.finditer(text):
        name = match.group(1)
        properties = ((schemas or {}).get(name) or {}).get("properties", {})
        arguments: dict[str, Any] = {}
        for param in _XML_PARAM.finditer(match.group(2)):
            key, raw = param.group(1), param.group(2)
            arguments[key] = _xml_value(raw, properties.get(key, {}))
        calls.append(ParsedCall(name, arguments))
        first = match.start() if first is None else first
    return _reply(text, first, calls)


def _xml_value(raw: str, schema: Any) -> Any:
    if isinstance(schema, dict) and schema.get("type") == "string":
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


# --- Llama 3.x: a bare JSON object -----------------------------------------------------------------
def parse_llama3(text: str, schemas: Mapping[str, Any] | None = None) -> ParsedReply:
    """`{"name": "NAME", "parameters": {...}}` (Llama 3.1-3.3 with custom tools), optionally after
    `<|python_tag|>`; several calls may be separated by `;`."""
    body = text.strip()
    offset = len(text) - len(text.lstrip())
    if body.startswith("<|python_tag|>"):
        offset += len("<|python_tag|>")
    calls: list[ParsedCall] = []
    pos = offset
    while True:
        decoded = _json_at(text, pos)
        call = _call_from_object(decoded[0]) if decoded else None
        if call is None or decoded is None:
            break
        calls.append(call)
        pos = _skip_space(text, decoded[1])
        if text.startswith(";", pos):
            pos += 1
    return _reply(text, 0 if calls else None, calls)


# --- Functionary v3.1: <function=NAME>{...}</function> ---------------------------------------------
def parse_functionary_v3_1(text: str, schemas: Mapping[str, Any] | None = None) -> ParsedReply:
    calls: list[ParsedCall] = []
    first: int | None = None
    for match in _FUNCTION_TAG.finditer(text):
        decoded = _json_at(text, match.end())
        if decoded and isinstance(decoded[0], dict):
            calls.append(ParsedCall(match.group(1), decoded[0]))
            first = match.start() if first is None else first
    return _reply(text, first, calls)


# --- Functionary v3.2: >>>NAME\n{...} --------------------------------------------------------------
_RECIPIENT = re.compile(r"(?:^|>>>)([A-Za-z0-9_.-]+)\n")


def parse_functionary_v3_2(text: str, schemas: Mapping[str, Any] | None = None) -> ParsedReply:
    """The generation prompt ends in `>>>`, so the reply starts with a recipient: `all\\n` then text,
    or `NAME\\n{...}`; later recipients follow `>>>`."""
    calls: list[ParsedCall] = []
    content: list[str] = []
    pos = 0
    while pos < len(text):
        match = _RECIPIENT.match(text, pos) if pos == 0 else re.compile(r">>>([A-Za-z0-9_.-]+)\n").search(text, pos)
        if match is None:
            break
        recipient = match.group(1)
        if recipient == "all":
            end = text.find(">>>", match.end())
            content.append(text[match.end() : end if end >= 0 else len(text)])
            pos = end if end >= 0 else len(text)
            continue
        decoded = _json_at(text, match.end())
        if not decoded or not isinstance(decoded[0], dict):
            break
        calls.append(ParsedCall(recipient, decoded[0]))
        pos = decoded[1]
    if not calls and not content:
        return ParsedReply(strip_end_markers(text).strip())
    return ParsedReply(strip_end_markers("".join(content)).strip(), tuple(calls))


# --- JSON lists after a marker: Mistral Nemo, Firefunction v2, Granite -------------------------------
def _parse_list_after(marker: str, text: str) -> ParsedReply:
    at = text.find(marker)
    if at < 0:
        return ParsedReply(strip_end_markers(text).strip())
    decoded = _json_at(text, at + len(marker))
    items = decoded[0] if decoded else None
    if isinstance(items, dict):
        items = [items]
    calls = [call for call in (_call_from_object(item) for item in items or []) if call is not None]
    return _reply(text, at, calls)


def parse_mistral_nemo(text: str, schemas: Mapping[str, Any] | None = None) -> ParsedReply:
    """`[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "abcdefghi"}]`."""
    return _parse_list_after("[TOOL_CALLS]", text)


def parse_firefunction_v2(text: str, schemas: Mapping[str, Any] | None = None) -> ParsedReply:
    """` functools[{"name": ..., "arguments": {...}}]`."""
    at = text.find("functools[")
    if at < 0:
        return ParsedReply(strip_end_markers(text).strip())
    return _parse_list_after("functools", text)


def parse_granite(text: str, schemas: Mapping[str, Any] | None = None) -> ParsedReply:
    """`<|tool_call|>[{"name": ..., "arguments": {...}}]`."""
    return _parse_list_after("<|tool_call|>", text)


# --- Command R7B --------------------------------------------------------------------------------------
def parse_command_r7b(text: str, schemas: Mapping[str, Any] | None = None) -> ParsedReply:
    """`<|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}]<|END_ACTION|>`;
    plain replies come as `<|START_RESPONSE|>...<|END_RESPONSE|>`."""
    at = text.find("<|START_ACTION|>")
    if at < 0:
        response = re.search(r"<\|START_RESPONSE\|>(.*?)(?:<\|END_RESPONSE\|>|$)", text, re.DOTALL)
        return ParsedReply(strip_end_markers(response.group(1) if response else text).strip())
    decoded = _json_at(text, at + len("<|START_ACTION|>"))
    items = decoded[0] if decoded and isinstance(decoded[0], list) else []
    calls = []
    for item in items:
        call = _call_from_object(item, name_key="tool_name", args_keys=("parameters",))
        if call is not None:
            call_id = item.get("tool_call_id")
            calls.append(ParsedCall(call.name, call.arguments, str(call_id) if call_id is not None else None))
    thinking = re.search(r"<\|START_THINKING\|>(.*?)<\|END_THINKING\|>", text[:at], re.DOTALL)
    content = thinking.group(1) if thinking else text[:at]
    return ParsedReply(strip_end_markers(content).strip(), tuple(calls))


# --- DeepSeek R1 ----------------------------------------------------------------------------------------
_DEEPSEEK_CALL = re.compile(
    r"<｜tool▁call▁begin｜>\s*function\s*<｜tool▁sep｜>\s*([^\n<]+?)\s*\n```(?:json)?\s*\n?(.*?)\n?```\s*(?:<｜tool▁call▁end｜>|$)",
    re.DOTALL,
)


def parse_deepseek_r1(text: str, schemas: Mapping[str, Any] | None = None) -> ParsedReply:
    """`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>...`.
    The reasoning before `</think>` is not part of the reply's content."""
    at = text.find("<｜tool▁calls▁begin｜>")
    if at < 0:
        return ParsedReply(_after_think(strip_end_markers(text)).strip())
    calls = []
    for match in _DEEPSEEK_CALL.finditer(text, at):
        try:
            arguments = json.loads(match.group(2))
        except json.JSONDecodeError:
            continue
        calls.append(ParsedCall(match.group(1).strip(), arguments))
    return ParsedReply(_after_think(text[:at]).strip(), tuple(calls))


def _after_think(text: str) -> str:
    return text.split("</think>", 1)[1] if "</think>" in text else text


# --- gpt-oss (harmony) ------------------------------------------------------------------------------------
_HARMONY_CALL = re.compile(
    r"to=functions\.([A-Za-z0-9_.-]+)[^<]*?(?:<\|channel\|>[^<]*)?(?:<\|constrain\|>[^<]*)?<\|message\|>", re.DOTALL
)


def parse_gpt_oss(text: str, schemas: Mapping[str, Any] | None = None) -> ParsedReply:
    """`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>` (the
    recipient may also come before the channel). The final channel's text is the content."""
    calls: list[ParsedCall] = []
    for match in _HARMONY_CALL.finditer(text):
        decoded = _json_at(text, match.end())
        if decoded:
            calls.append(ParsedCall(match.group(1), decoded[0]))
    final = re.search(r"<\|channel\|>final<\|message\|>(.*?)(?:<\|end\|>|<\|return\|>|$)", text, re.DOTALL)
    if final:
        content = final.group(1)
    elif calls:
        content = ""
    else:
        content = re.sub(r"<\|channel\|>analysis<\|message\|>.*?(?:<\|end\|>|$)", "", text, flags=re.DOTALL)
    return ParsedReply(strip_end_markers(content).strip(), tuple(calls))


# --- Muse Glimmer (ATEM): each message addressed `to=RECIPIENT` -------------------------------------------
_MUSE_MESSAGE = re.compile(
    r"(?:^|<\|start\|>assistant)\s*to=(\S+?)<\|message\|>(.*?)(?=<\|eom\|>|<\|eot\|>|<\|start\|>|$)", re.DOTALL
)
_ATEM_INVOKE = re.compile(r'<atem:invoke name="([^"]+)">(.*?)(?:</atem:invoke>|$)', re.DOTALL)
_ATEM_PARAM = re.compile(r'<atem:parameter name="([^"]+)">(.*?)</atem:parameter>', re.DOTALL)
MUSE_OWN_RECIPIENTS = ("self", "user")


def parse_muse_glimmer(text: str, schemas: Mapping[str, Any] | None = None) -> ParsedReply:
    """`to=user<|message|>TEXT<|eot|>` is the answer, `to=self` thinking, and a message to a tool
    (`to=NAME<|message|><atem:function_calls>…`) its call: an `<atem:function_calls>` block in a
    message to the user or to self is text, as llama.cpp reads it. A reply with no header is all
    answer."""
    messages = [(match.group(1), match.group(2)) for match in _MUSE_MESSAGE.finditer(text)]
    if not messages:
        return ParsedReply(strip_end_markers(text).strip())
    calls: list[ParsedCall] = []
    for recipient, body in messages:
        if recipient in MUSE_OWN_RECIPIENTS:
            continue
        for invoke in _ATEM_INVOKE.finditer(body):
            name = invoke.group(1)
            properties = ((schemas or {}).get(name) or {}).get("properties", {})
            arguments = {
                param.group(1): _xml_value(param.group(2), properties.get(param.group(1), {}))
                for param in _ATEM_PARAM.finditer(invoke.group(2))
            }
            calls.append(ParsedCall(name, arguments))
    content = "".join(body for recipient, body in messages if recipient == "user")
    return ParsedReply(content.strip(), tuple(calls))


# --- generic: {"tool_call": ...} or {"response": ...} -------------------------------------------------------
def parse_generic(text: str, schemas: Mapping[str, Any] | None = None) -> ParsedReply:
    """The generic format's reply is one JSON object: `{"tool_call": {"name": ..., "arguments": {...}}}`,
    `{"tool_calls": [...]}` or `{"response": "..."}`. Anything else is plain text."""
    stripped = strip_end_markers(text).strip()
    decoded = _json_at(stripped, 0)
    if not decoded or not isinstance(decoded[0], dict):
        return ParsedReply(stripped)
    value = decoded[0]
    if "tool_call" in value:
        call = _call_from_object(value["tool_call"])
        return ParsedReply("", (call,) if call else ())
    if "tool_calls" in value and isinstance(value["tool_calls"], list):
        calls = [c for c in (_call_from_object(item) for item in value["tool_calls"]) if c is not None]
        return ParsedReply("", tuple(calls))
    if isinstance(value.get("response"), str):
        return ParsedReply(value["response"])
    return ParsedReply(stripped)
