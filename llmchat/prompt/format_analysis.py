"""A model's call and reasoning format, derived from its chat template by rendering probes.

llama.cpp's autoparser (common/chat-diff-analyzer.cpp) does the same: render the template with
conversations that differ in one thing (no call, one call, two calls; no argument, one, two; a
string or a number; with and without reasoning), diff the renders, and read the markers off the
difference. A template is the model's API contract, so what it writes for a call is what the model
was trained to write. Nothing here knows a family by name: a template nobody has seen before gets
its parser, its trigger and its grammar from the same few renders.

What the analysis finds (`CallLayout`):
- the section around all calls and the text around each call (`section_start`, `call_start`,
  `call_end`, `section_end`, `separator`), with the call index or id a template prints in them;
- where the name goes: in the text (`<function=NAME>`, `functions.NAME:0`, `[TOOL_CALLS]NAME`) or
  in a JSON object (`{"name": NAME, "arguments": {...}}`, `{"NAME": {...}}`, a list of them);
- the arguments: a JSON object, or tagged pairs (`<parameter=K>V</parameter>`,
  `<arg_key>K</arg_key><arg_value>V</arg_value>`, `K:<|"|>V<|"|>`, `K="V"`), with the text a
  template puts around a string value and around any other value.
The reasoning markers come from a message with `reasoning_content`; whether the generation prompt
opens a thinking block, from the prompt rendered with `enable_thinking` true.

`analyze(source)` is pure and cached per template text; a render that fails only loses the
facts that render was for. The result is small and JSON-serialisable (`to_dict`/`from_dict`), so
the header cache can keep it beside the model's other facts.

On disk an entry is keyed by everything that decides the result (llmchat.prompt.format_cache). A
result that a render's limits (steps, time, size) or a failed compile cut short is not kept: on
a busy machine the time limit can trip where it would not on the next load, and a cached "this
template writes no tool call" would hold for good.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from llmchat.prompt.diffs import (
    MARKER,
    MARKER_RUN,
    common_prefix,
    common_suffix,
    diff,
    prefix_with_index,
)
from llmchat.prompt.layout import ID_SLOT, INDEX_SLOT, KEY_SLOT, CallLayout, ChatFormat, ReasoningLayout
from llmchat.prompt.probes import (
    ARG_FIRST,
    ARG_SECOND,
    ASSISTANT_TEXT,
    CALL_IDS,
    FUN_FIRST,
    FUN_SECOND,
    THINKING_TEXT,
    USER,
    VALUE_FIRST,
    VALUE_NUMBER,
    VALUE_SECOND,
    Renderer,
    assistant_message,
)
from llmchat.prompt.sandbox import TemplateRenderError

SWITCH_NAMES = ("enable_thinking", "thinking", "reasoning_effort", "reasoning", "clear_thinking")
NOT_COMPILED = "the template does not compile"
HIT_LIMITS = "the template's renders hit the sandbox's limits"
UNSETTLED = frozenset({NOT_COMPILED, HIT_LIMITS})  # a result with one of these is not kept on disk


# --- calls ----------------------------------------------------------------------------------------
def _calls_text(r: Renderer, calls: list[tuple[str, dict[str, Any]]]) -> str | None:
    """What the template writes for an assistant turn holding these calls (and nothing else)."""
    for with_result, content in ((False, ""), (True, ""), (True, None)):
        tail: list[dict[str, Any]] = []
        if with_result:  # some templates refuse an assistant call that no result follows
            tail = [{"role": "tool", "tool_call_id": CALL_IDS[0], "name": calls[0][0], "content": "RRR_RESULT"}]
        base = r.render([USER, assistant_message([], r.as_text, ASSISTANT_TEXT), *tail])
        call = assistant_message(calls, r.as_text)
        call["content"] = content  # some templates write calls only where the content is None
        full = r.render([USER, call, *tail])
        if base is None or full is None or calls[0][0] not in full:
            continue
        return _slots(diff(base, full))
    return None


def _slots(text: str) -> str:
    """Call ids (valid inside a JSON string, so a JSON call still decodes) become ID_SLOT."""
    for call_id in CALL_IDS:
        text = text.replace(call_id, ID_SLOT)
    return text


def _json_span(text: str, must_hold: str) -> tuple[int, int, Any] | None:
    """The outermost JSON object or list in text whose span holds `must_hold`."""
    at = text.find(must_hold)
    if at < 0:
        return None
    decoder = json.JSONDecoder()
    for start in range(0, at):
        if text[start] not in "{[":
            continue
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if end > at:
            return start, end, value
    return None


def _separators(text: str) -> tuple[str, str]:
    if ", " in text or '": ' in text:
        return (", ", ": ")
    return (",", ":")


def analyze_calls(r: Renderer) -> tuple[CallLayout | None, str]:
    """The call layout, or None and what was missing."""
    one = [(FUN_FIRST, {ARG_FIRST: VALUE_FIRST})]
    single = _calls_text(r, one)
    if single is None or VALUE_FIRST not in single:
        r.as_text = True
        single = _calls_text(r, one)
        if single is None or VALUE_FIRST not in single:
            r.as_text = False
            return None, "the template writes no tool call"
    double = _calls_text(r, [(FUN_FIRST, {ARG_FIRST: VALUE_FIRST}), (FUN_SECOND, {ARG_FIRST: VALUE_FIRST})])
    if double is None or FUN_SECOND not in double:
        double = None
    span = _json_span(single, FUN_FIRST)
    if span is not None and _json_holds_call(span[2]):
        layout = _json_layout(single, span, double, r.as_text)
    else:
        layout = _text_layout(r, single, double)
    if layout is None:
        return None, "the call's arguments could not be located in the template's call"
    layout = _tidy(layout)
    probes = (FUN_FIRST, FUN_SECOND, ARG_FIRST, ARG_SECOND, VALUE_FIRST, VALUE_SECOND)
    if any(probe in text for text in layout.__dict__.values() if isinstance(text, str) for probe in probes):
        # A probe's name left in a marker: the renders differed in more than the call.
        return None, "the template's calls could not be told apart from the rest of its renders"
    return layout, ""


def _tidy(layout: CallLayout) -> CallLayout:
    """The section keeps only its own markers: the last marker of what comes
    before the first call (a template may write an empty thinking block or a role header there)
    and the first marker of what follows the last (the rest is end-of-turn text)."""
    texts = {
        name: getattr(layout, name)
        for name in ("section_start", "section_end", "call_start", "call_end", "separator", "args_start", "args_end")
    }
    start = texts["section_start"]
    markers = list(MARKER.finditer(start))
    if len(markers) > 1:
        texts["section_start"] = start[markers[-1].start() :]
        texts["preamble"] = start[: markers[-1].start()].strip()
    end = texts["section_end"]
    if not texts["section_start"].strip():
        # No section: what follows the last call is the end of the turn, not part of the call.
        texts["section_end"] = end[: len(end) - len(end.lstrip("]"))] if layout.list_wrapped else ""
    else:
        last = list(MARKER.finditer(texts["section_start"]))
        mirror = "</" + last[-1].group(0)[1:] if last and last[-1].group(0).startswith("<") else ""
        first = MARKER_RUN.search(end)
        if mirror and mirror in end:  # the section's own closing tag (`<tool_call>`…`</tool_call>`)
            texts["section_end"] = end[: end.index(mirror) + len(mirror)]
        elif first is not None:
            texts["section_end"] = end[: first.end()]
    return CallLayout(**{**layout.__dict__, **texts})


def _json_holds_call(value: Any) -> bool:
    text = json.dumps(value)
    return FUN_FIRST in text and (ARG_FIRST in text or VALUE_FIRST in text)


def _split_repeats(head: str, mid: str, tail: str) -> tuple[str, str, str, str, str]:
    """From the text before call 1, between the calls and after call 2: (section_start,
    call_start, call_end, separator, section_end)."""
    call_start = common_suffix(head, mid)
    call_end, in_tail = prefix_with_index(mid[: len(mid) - len(call_start)], tail)
    in_mid = len(call_end.replace(INDEX_SLOT, "0"))
    rest = mid[in_mid : len(mid) - len(call_start)]
    return head[: len(head) - len(call_start)], call_start, call_end, rest, tail[in_tail:]


def _json_layout(single: str, span: tuple[int, int, Any], double: str | None, as_text: bool) -> CallLayout | None:
    start, end, value = span
    list_wrapped = isinstance(value, list)
    obj = value[0] if list_wrapped and value else value
    if not isinstance(obj, dict):
        return None
    function_key = ""
    inner = obj
    for key, item in obj.items():
        if isinstance(item, dict) and item.get("name") == FUN_FIRST:
            function_key, inner = key, item
    name_is_key = FUN_FIRST in inner
    name_key = next((k for k, v in inner.items() if v == FUN_FIRST), "name")
    arguments_key = next((k for k, v in inner.items() if _is_probe_arguments(v)), "arguments")
    if name_is_key:
        arguments_key = ""  # {"NAME": {arguments}}: the name is the only key
    id_key = next((k for k, v in {**obj, **inner}.items() if v == ID_SLOT), "")
    section_start, section_end = single[:start], single[end:]
    call_start = call_end = separator = ""
    if double is not None and not list_wrapped:
        first = _json_span(double, FUN_FIRST)
        second = _json_span(double[first[1] :], FUN_SECOND) if first else None
        if first and second:
            s2, e2 = first[1] + second[0], first[1] + second[1]
            section_start, call_start, call_end, separator, section_end = _split_repeats(
                double[: first[0]], double[first[1] : s2], double[e2:]
            )
    elif list_wrapped and double is not None:
        whole = _json_span(double, FUN_SECOND)
        if whole and isinstance(whole[2], list) and len(whole[2]) == 2:
            section_start, section_end = double[: whole[0]] + "[", "]" + double[whole[1] :]
            separator = ","
        else:  # one list per call
            section_start, section_end = single[:start] + "[", "]" + single[end:]
    if list_wrapped and not section_start.endswith("["):
        section_start, section_end = section_start + "[", "]" + section_end
    keys = () if name_is_key else tuple((inner if not function_key else obj).keys())
    return CallLayout(
        section_start=section_start,
        section_end=section_end,
        call_start=call_start,
        call_end=call_end,
        separator=separator,
        name_in_json=True,
        list_wrapped=list_wrapped,
        name_is_key=name_is_key,
        function_key=function_key,
        name_key=name_key,
        arguments_key=arguments_key,
        id_key=id_key,
        key_order=keys,
        json_separators=_separators(single[start:end]),
        arguments_as_text=as_text or isinstance(inner.get(arguments_key), str),
    )


def _is_probe_arguments(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return False
    return isinstance(value, dict) and value.get(ARG_FIRST) == VALUE_FIRST


def _text_layout(r: Renderer, single: str, double: str | None) -> CallLayout | None:
    name_at = single.index(FUN_FIRST)
    head, body = single[:name_at], single[name_at + len(FUN_FIRST) :]
    section_start, call_start, call_end_tail, separator, section_end = head, "", "", "", ""
    if double is not None:
        n1, n2 = double.index(FUN_FIRST), double.index(FUN_SECOND)
        section_start, call_start, body, separator, section_end = _split_repeats(
            double[:n1], double[n1 + len(FUN_FIRST) : n2], double[n2 + len(FUN_SECOND) :]
        )
    else:
        body, call_end_tail = body, ""
    # body: args_start + ARGUMENTS + args_end + call_end, as one call writes it.
    span = _json_span(body, VALUE_FIRST)
    if span is not None and isinstance(span[2], dict) and ARG_FIRST in span[2]:
        return CallLayout(
            section_start=section_start,
            section_end=section_end,
            call_start=call_start,
            call_end=body[span[1] :] + call_end_tail,
            separator=separator,
            name_in_json=False,
            args_start=body[: span[0]],
            args="json",
            json_separators=_separators(body[span[0] : span[1]]),
            arguments_as_text=r.as_text,
        )
    tagged = _tagged_arguments(r, body)
    if tagged is None:
        return None
    args_start, args_end_and_close, pieces = tagged
    key_prefix = pieces["key_prefix"]
    if INDEX_SLOT in body and key_prefix and key_prefix in body:
        args_start = body[: body.index(key_prefix)]  # the call's index, as the two-call render shows it
    return CallLayout(
        section_start=section_start,
        section_end=section_end,
        call_start=call_start,
        call_end=args_end_and_close + call_end_tail,
        separator=separator,
        name_in_json=False,
        args_start=args_start,
        args="tagged",
        arguments_as_text=r.as_text,
        **pieces,
    )


def _tagged_arguments(r: Renderer, body: str) -> tuple[str, str, dict[str, Any]] | None:
    """Key and value markers of tagged arguments, from one call with two string arguments and
    one with a number."""
    two = _calls_text(r, [(FUN_FIRST, {ARG_FIRST: VALUE_FIRST, ARG_SECOND: VALUE_SECOND})])
    number = _calls_text(r, [(FUN_FIRST, {ARG_FIRST: VALUE_NUMBER})])
    if two is None or ARG_SECOND not in two or VALUE_SECOND not in two:
        return None
    two = two[two.index(FUN_FIRST) + len(FUN_FIRST) :]
    k1, v1 = two.index(ARG_FIRST), two.index(VALUE_FIRST)
    k2, v2 = two.index(ARG_SECOND), two.index(VALUE_SECOND)
    if not k1 < v1 < k2 < v2:
        return None
    before_first, between = two[:k1], two[v1 + len(VALUE_FIRST) : k2]
    key_prefix = common_suffix(before_first, between)
    args_start = before_first[: len(before_first) - len(key_prefix)]
    after_last = two[v2 + len(VALUE_SECOND) :].replace(ARG_SECOND, KEY_SLOT)
    between = between.replace(ARG_FIRST, KEY_SLOT)
    suffix_and_separator = between[: len(between) - len(key_prefix)]
    string_suffix = common_prefix(suffix_and_separator, after_last)
    arg_separator = suffix_and_separator[len(string_suffix) :]
    string_prefix = two[k1 + len(ARG_FIRST) : v1]
    # The single call's body ends with what follows the last argument.
    body = body.replace(ARG_FIRST, KEY_SLOT)
    b_value = body.find(VALUE_FIRST)
    close = (
        body[b_value + len(VALUE_FIRST) + len(string_suffix) :] if b_value >= 0 else after_last[len(string_suffix) :]
    )
    value_prefix, value_suffix = string_prefix, string_suffix
    if number is not None and str(VALUE_NUMBER) in number:
        number = number[number.index(FUN_FIRST) + len(FUN_FIRST) :]
        k, v = number.index(ARG_FIRST), number.index(str(VALUE_NUMBER))
        value_prefix = number[k + len(ARG_FIRST) : v]
        after = number[v + len(str(VALUE_NUMBER)) :].replace(ARG_FIRST, KEY_SLOT)
        value_suffix = (
            after[: len(after) - len(close)] if close and after.endswith(close) else common_prefix(after, string_suffix)
        )
    string_is_json = string_prefix == value_prefix + '"' and string_suffix.startswith('"')
    if string_is_json:
        string_prefix, string_suffix = value_prefix, string_suffix[1:]
    return (
        args_start,
        close,
        {
            "key_prefix": key_prefix,
            "string_prefix": string_prefix,
            "string_suffix": string_suffix,
            "value_prefix": value_prefix,
            "value_suffix": value_suffix,
            "arg_separator": arg_separator,
            "string_is_json": string_is_json,
        },
    )


# --- reasoning ------------------------------------------------------------------------------------
def analyze_reasoning(r: Renderer) -> ReasoningLayout | None:
    found, message_key = None, "reasoning_content"
    with_call = [(FUN_FIRST, {ARG_FIRST: VALUE_FIRST})]
    for calls in ([], with_call):
        for key in [k for k in ("reasoning_content", "reasoning", "thinking") if k in r.source]:
            plain = assistant_message(calls, r.as_text, ASSISTANT_TEXT)
            thought = {**plain, key: THINKING_TEXT}
            for variables in ({"enable_thinking": True}, {}):
                before = r.render([USER, plain], **variables)
                after = r.render([USER, thought], **variables)
                if before is None or after is None or THINKING_TEXT not in after:
                    continue
                region = diff(before, after)
                if THINKING_TEXT not in region:
                    continue
                found = _thinking_markers(after, region)
                if found:
                    message_key = key
                    break
            if found:
                break
        if found:
            break
    if found is None:
        return None
    start, end = found
    if not start:  # delimiter style: the block is only closed (e.g. `…[BEGIN FINAL RESPONSE]`)
        return ReasoningLayout(start="", end=end, message_key=message_key)
    on = r.render([USER], prompt=True, enable_thinking=True) or ""
    off = r.render([USER], prompt=True, enable_thinking=False) or ""
    opens = on.rstrip().endswith(start)
    closed_off = off.rstrip().endswith(end) and start in off[len(common_prefix(on, off)) - len(start) :]
    return ReasoningLayout(start, end, opens_in_prompt=opens, closed_when_off=closed_off, message_key=message_key)


def _thinking_markers(after: str, region: str) -> tuple[str, str] | None:
    """The tags around the probe's thinking: the region's own text where the diff holds it, else
    the markers right beside the thinking (a template that writes an empty block without
    reasoning shares the closing tag with the render it is compared to)."""
    at = region.index(THINKING_TEXT)
    start, end = region[:at].strip(), region[at + len(THINKING_TEXT) :].strip()
    full_at = after.index(THINKING_TEXT)
    following = MARKER_RUN.match(after[full_at + len(THINKING_TEXT) :].lstrip())
    if not end or (following and following.group(0).startswith(end) and end != following.group(0)):
        end = following.group(0) if following else ""
    preceding = re.search(rf"(?:{MARKER_RUN.pattern})\s*$", after[:full_at])
    if not start or (preceding and preceding.group(0).strip().endswith(start) and start != preceding.group(0).strip()):
        start = preceding.group(0).strip() if preceding else ""
    return (start, end) if end else None


# --- the whole analysis ---------------------------------------------------------------------------
@lru_cache(maxsize=16)
def analyze(source: str) -> ChatFormat:
    """The formats this template's model writes, from the cache folder when this template text
    was analysed before under the same code and versions (llmchat.prompt.format_cache; the
    analysis renders the template 10-30 times: 0.1-1 s for the large templates of 2026, paid once
    per template instead of once per load). A result cut short (UNSETTLED) is not kept."""
    from llmchat.prompt import format_cache

    found = format_cache.read(source)
    if found is None:
        found = analyze_uncached(source)
        if not UNSETTLED & set(found.missing):
            format_cache.write(source, found)
    return found


def analyze_uncached(source: str) -> ChatFormat:
    """The analysis itself. A template that does not compile gets an empty result (the caller's
    own render reports the error)."""
    try:
        r = Renderer(source)
    except Exception:  # noqa: BLE001 - reported where the template is rendered for real
        return ChatFormat(None, None, (), (NOT_COMPILED,))
    missing: list[str] = []
    try:
        calls, why = analyze_calls(r)
    except TemplateRenderError:
        calls, why = None, HIT_LIMITS
    if why:
        missing.append(why)
    try:
        reasoning = analyze_reasoning(r)
    except TemplateRenderError:
        reasoning = None
        missing.append(HIT_LIMITS)
    switches = tuple(name for name in SWITCH_NAMES if re.search(rf"\b{name}\b", source))
    try:
        content_start, content_end, turn_end = analyze_content(r)
    except TemplateRenderError:
        content_start = content_end = turn_end = ""
        missing.append(HIT_LIMITS)
    missing = list(dict.fromkeys(missing))  # each reason once
    return ChatFormat(calls, reasoning, switches, tuple(missing), content_start, content_end, turn_end)


def analyze_content(r: Renderer) -> tuple[str, str, str]:
    """Markers written right around a plain reply's text: both, or none (a role header alone,
    `<|im_start|>assistant\n`, is not a wrapper); and the marker that closes the message."""
    rendered = r.render([USER, assistant_message([], r.as_text, ASSISTANT_TEXT)])
    if rendered is None or ASSISTANT_TEXT not in rendered:
        return "", "", ""
    at = rendered.index(ASSISTANT_TEXT)
    rest = rendered[at + len(ASSISTANT_TEXT) :].lstrip()
    before = re.search(rf"(?:{MARKER_RUN.pattern})\s*$", rendered[:at])
    after = MARKER_RUN.match(rest)
    if after is None:
        return "", "", ""
    # A reasoning block's close before the text (`<think>\n\n</think>\n\n`) is not a wrapper.
    if before is None or before.group(0).strip().startswith("</"):
        return "", "", after.group(0)
    closing = MARKER_RUN.match(rest[after.end() :].lstrip())
    return before.group(0).strip(), after.group(0), closing.group(0) if closing else ""
