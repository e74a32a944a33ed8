"""The probe conversations the analysis renders a template with, and the sandboxed renderer.

The probe values are llama.cpp's own (common/chat-diff-analyzer.cpp): texts no template writes by
itself, so a diff never meets them by chance.
"""

from __future__ import annotations

import json
from typing import Any

from llmchat.prompt.sandbox import TemplateRenderError, compile_template, render_compiled

FUN_FIRST = "FFF_FIRST_FUN_F"
FUN_SECOND = "SSS_SECOND_FUN_S"
ARG_FIRST = "AA_ARG_FST_AA"
ARG_SECOND = "BB_ARG_SND_BB"
VALUE_FIRST = "XXXX_VAL_X"
VALUE_SECOND = "YYYY_VAL_Y"
VALUE_NUMBER = 7316529
USER_TEXT = "U_USER_MSG Hello END_U"
ASSISTANT_TEXT = "A_ASST_MSG I can help END_A"
THINKING_TEXT = "REASON_PART I am thinking END_R"
CALL_IDS = ("call00001", "call00002")

_PARAMETERS = {
    "type": "object",
    "properties": {
        ARG_FIRST: {"type": "string", "description": "first"},
        ARG_SECOND: {"type": "string", "description": "second"},
    },
    "required": [ARG_FIRST],
}
_TOOLS = [
    {"type": "function", "function": {"name": name, "description": "probe", "parameters": _PARAMETERS}}
    for name in (FUN_FIRST, FUN_SECOND)
]
USER = {"role": "user", "content": USER_TEXT}


class Renderer:
    def __init__(self, source: str):
        self.source = source
        self.compiled = compile_template(source, "the chat template")
        self.as_text = False  # the template wants arguments as JSON text

    def render(self, messages: list[dict[str, Any]], *, prompt: bool = False, **variables: Any) -> str | None:
        context = {
            "messages": messages,
            "tools": _TOOLS,
            "add_generation_prompt": prompt,
            "bos_token": "",
            "eos_token": "",
            **variables,
        }
        try:
            return render_compiled(self.compiled, context, "the chat template")
        except TemplateRenderError as err:
            if err.kind in ("refused", "limit"):
                raise
            return None
        except Exception:  # noqa: BLE001 - a probe the template rejects tells nothing, it is not an error
            return None


def _call(name: str, arguments: dict[str, Any], index: int, as_text: bool) -> dict[str, Any]:
    return {
        "id": CALL_IDS[index],
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False) if as_text else arguments},
    }


def assistant_message(calls: list[tuple[str, dict[str, Any]]], as_text: bool, content: str = "") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [_call(name, args, n, as_text) for n, (name, args) in enumerate(calls)]
    return message
