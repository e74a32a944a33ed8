"""One reading of a finished reply (llmchat.turn.reading.read_finished_reply), for the tool loop's rounds
(llmchat.turn.tool_loop.read_round) as for `template parse` and the reference cases: with tools
offered, the markers a template wraps a reply in (Command R7B's `<|START_RESPONSE|>`, Cohere2 MoE's
`<|START_TEXT|>`, Kimi K3's `<|open|>response<|sep|>`) never reach the person.

Each round is read here as the session hands it to the loop: the thinking split off as the turn
splits it while it streams (llmchat.turn.reading.split_thinking), in a TurnResult."""

from __future__ import annotations

from typing import Any

import pytest
from test_chat_cases import CASES, KNOWN, TEMPLATES, expected, normalised, schemas_of

from llmchat.tools.families import detect_family
from llmchat.turn.metrics import TurnStats
from llmchat.turn.reading import read_output, split_thinking
from llmchat.turn.record import TurnResult
from llmchat.turn.tool_loop import read_round

# A tool the model is offered in every round below, for the cases that list none of their own.
OFFERED = {
    "special_function": {
        "type": "object",
        "properties": {"arg1": {"type": "integer", "description": "The arg."}},
        "required": ["arg1"],
    }
}

CONTENT_MARKERS = {
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "<|START_RESPONSE|>",
    "Cohere2MoE.jinja": "<|START_TEXT|>",
    "Kimi-K3.jinja": "<|open|>response<|sep|>",
}


def splits_thinking(case: dict[str, Any]) -> bool:
    """llama.cpp's reasoning_format "none": a model without a reasoning format, thinking left in."""
    return case.get("reasoning_format", "none") != "none"


def read_as_a_round(case: dict[str, Any]) -> dict[str, Any]:
    """The case's output read the way the tool loop reads a round's reply, with tools offered."""
    template = (TEMPLATES / case["template"]).read_text(encoding="utf-8")
    schemas = schemas_of(case) or OFFERED
    split = splits_thinking(case)
    thinking = case.get("enable_thinking", True)
    reasoning, answer = split_thinking(template, [case["output"]], schemas, thinking=thinking, split_reasoning=split)
    result = TurnResult(
        user="q",
        reply=answer,
        finish_reason="stop",
        stats=TurnStats(),
        seed=1,
        reasoning=reasoning if split else None,  # None: nothing is split off such a model's reply
        raw_reply=case["output"],
    )
    parsed = read_round(template, detect_family(template), result, schemas)
    return normalised(
        {
            "content": parsed.content,
            "reasoning_content": result.reasoning or "",
            "tool_calls": [{"name": call.name, "arguments": call.arguments} for call in parsed.calls],
        }
    )


def marked_cases() -> list[Any]:
    return [
        pytest.param(case, id=case["id"])
        for case in CASES
        if CONTENT_MARKERS.get(case["template"], "\0") in case["output"] and case["id"] not in KNOWN
    ]


@pytest.mark.parametrize("case", marked_cases())
def test_a_tool_round_reply_comes_back_without_its_content_marker(case):
    reading = read_as_a_round(case)
    assert CONTENT_MARKERS[case["template"]] not in reading["content"]
    assert reading == expected(case)


def test_each_marked_format_has_cases():
    templates = {case.values[0]["template"] for case in marked_cases()}
    assert templates == set(CONTENT_MARKERS)


def reading_cases() -> list[Any]:
    """Every fresh-turn case a tool round could give: a reply asked for as JSON (a schema) is never
    one, tools and a schema do not go together."""
    return [pytest.param(case, id=case["id"]) for case in CASES if not case.get("json_schema")]


@pytest.mark.parametrize("case", reading_cases())
def test_a_tool_round_reads_a_reply_as_template_parse_does(case):
    """No second copy of the reading: what the loop keeps of a round is what `read_output` reads,
    muse-glimmer's `<|eot|>` at the end of its text included."""
    template = (TEMPLATES / case["template"]).read_text(encoding="utf-8")
    reading = read_output(
        template,
        case["output"],
        schemas_of(case) or OFFERED,
        thinking=case.get("enable_thinking", True),
        split_reasoning=splits_thinking(case),
    )
    assert read_as_a_round(case) == normalised(reading)
