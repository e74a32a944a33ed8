"""The description of a chat format that the analysis derives (llmchat.prompt.format_analysis)
and that the reader, the writer and the call grammar follow: where calls and their parts go,
the reasoning tags, the markers around a reply. Data only, JSON-serialisable for the cache."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

ID_SLOT = "\ue000id\ue000"  # where a template prints the call's id
INDEX_SLOT = "\ue001index\ue001"  # where a template prints the call's position (Kimi's functions.NAME:0)
KEY_SLOT = "\ue002key\ue002"  # an argument's name repeated in its closing tag (MiniMax M3's `<K>V</K>`)


@dataclass(frozen=True)
class CallLayout:
    """How one template writes tool calls. Texts may hold ID_SLOT and INDEX_SLOT."""

    section_start: str  # before the first call (`<|tool_calls_section_begin|>`, `[TOOL_CALLS]`)
    section_end: str  # after the last call
    call_start: str  # before each call, up to the name (or up to the JSON object)
    call_end: str  # after each call
    separator: str  # between two calls, after call_end and before the next call_start
    name_in_json: bool  # the name is inside a JSON object ({"name": ...}); else in the text
    # --- name in the text: NAME + args_start + arguments + args_end ---
    args_start: str = ""  # between the name and the arguments (`>\n`, `<|tool_call_argument_begin|>`)
    args_end: str = ""  # after the arguments, before call_end
    args: str = "json"  # "json" | "tagged"
    # --- tagged arguments: key_prefix K key_suffix VALUE value_suffix, joined by arg_separator ---
    key_prefix: str = ""
    string_prefix: str = ""  # between the key and a string value
    string_suffix: str = ""
    value_prefix: str = ""  # between the key and any other value (JSON)
    value_suffix: str = ""
    arg_separator: str = ""
    string_is_json: bool = False  # string values are JSON strings (escaped, quoted)
    # --- name in a JSON object ---
    list_wrapped: bool = False  # the calls are items of one JSON list
    name_is_key: bool = False  # {"NAME": {arguments}}
    function_key: str = ""  # the name and arguments sit under this key ({"function": {...}})
    name_key: str = "name"
    arguments_key: str = "arguments"
    id_key: str = ""
    key_order: tuple[str, ...] = ()  # the object's keys as the template writes them
    # --- JSON text as the template writes it ---
    json_separators: tuple[str, str] = (", ", ": ")
    arguments_as_text: bool = False  # the template wants the arguments as JSON text
    preamble: str = ""  # what the template writes before the section (an empty thinking block): not content

    @property
    def opener(self) -> str:
        """The fixed text that opens the first call, up to any id or index the template prints
        there: where a lazy grammar switches on."""
        start = self.section_start + ("" if self.list_wrapped else self.call_start)
        return re.split(f"{ID_SLOT}|{INDEX_SLOT}", start)[0].strip()

    def describe(self) -> str:
        if self.name_in_json:
            shape = "JSON object with the name as key" if self.name_is_key else f'JSON object ("{self.name_key}")'
            return f"{shape}{' in a list' if self.list_wrapped else ''}"
        if self.args == "json":
            return "name in the text, JSON arguments"
        return "name in the text, tagged arguments"


@dataclass(frozen=True)
class ReasoningLayout:
    start: str  # the opening tag as the model writes it (stripped of the template's whitespace)
    end: str
    opens_in_prompt: bool = False  # the generation prompt leaves the block open (thinking on)
    closed_when_off: bool = False  # with thinking off the prompt holds an empty, closed block
    # The message field the template reads earlier thinking from (reasoning_content, thinking, ...).
    message_key: str = "reasoning_content"


@dataclass(frozen=True)
class ChatFormat:
    calls: CallLayout | None
    reasoning: ReasoningLayout | None
    switches: tuple[str, ...] = ()
    missing: tuple[str, ...] = field(default=())  # what the analysis looked for and did not find
    content_start: str = ""  # a marker the template writes right before the reply's text
    content_end: str = ""  # ... and right after it (`<|START_RESPONSE|>…<|END_RESPONSE|>`)
    turn_end: str = ""  # what closes an assistant message (`<|im_end|>`, `<|role_end|>`)

    def unwrap(self, content: str) -> str:
        """The reply's text without the markers the template wraps it in."""
        stripped = content.strip()
        if self.content_start and stripped.startswith(self.content_start):
            stripped = stripped[len(self.content_start) :]
        elif self.content_start and self.reasoning and self.reasoning.end + self.content_start in stripped:
            # Thinking left in the content (not split apart): the wrapper opens after it.
            stripped = stripped.replace(self.reasoning.end + self.content_start, self.reasoning.end, 1)
        if self.content_end and self.content_end in stripped:  # it and what closes the turn after it
            stripped = stripped[: stripped.rindex(self.content_end)]
        if self.turn_end and stripped.rstrip().endswith(self.turn_end):
            stripped = stripped.rstrip()[: -len(self.turn_end)]
        return stripped if stripped != content.strip() else content

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatFormat:
        calls = data.get("calls")
        reasoning = data.get("reasoning")
        return cls(
            CallLayout(
                **{**calls, "json_separators": tuple(calls["json_separators"]), "key_order": tuple(calls["key_order"])}
            )
            if calls
            else None,
            ReasoningLayout(**reasoning) if reasoning else None,
            tuple(data.get("switches", ())),
            tuple(data.get("missing", ())),
            data.get("content_start", ""),
            data.get("content_end", ""),
            data.get("turn_end", ""),
        )
