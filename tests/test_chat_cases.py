"""llama.cpp's own reference cases (tests/data/chat_cases, from its tests/test-chat.cpp): the exact
text a model of each family writes, and what llama.cpp reads from it. Each fresh-turn case runs
through llmchat's reading of a turn (llmchat.turn.reading: the reasoning split, then the call
format derived from the template), fed whole and one character at a time, and through a real
llama-server streaming that exact text (tests/test_chat_cases_server.py).

Cases llmchat reads differently are listed in tests/data/chat_cases/known_differences.json with
the reason; they are expected to fail (strict: one that starts passing must leave the list).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from llmchat.turn.reading import read_output

DATA = Path(__file__).parent / "data" / "chat_cases"
TEMPLATES = DATA / "templates"


def load_cases() -> list[dict[str, Any]]:
    cases = [json.loads(line) for line in (DATA / "cases.jsonl").read_text(encoding="utf-8").splitlines() if line]
    seen: Counter[str] = Counter()
    for case in cases:
        base = f"{case['template'].removesuffix('.jinja')}:{case.get('line', case.get('case'))}"
        seen[base] += 1
        case["id"] = base if seen[base] == 1 else f"{base}#{seen[base]}"
    return cases


def is_fresh_turn(case: dict[str, Any]) -> bool:
    """A plain fresh turn: the model answers one user message, whole (not a partial stream, not a
    continued message, no custom history)."""
    return (
        not case.get("is_partial")
        and case.get("continue_final_message") in (None, False, "", "none", "NONE")
        and not case.get("messages")
        and case.get("add_generation_prompt", True)
    )


CASES = [case for case in load_cases() if is_fresh_turn(case)]
KNOWN = json.loads((DATA / "known_differences.json").read_text(encoding="utf-8"))


def schemas_of(case: dict[str, Any]) -> dict[str, Any]:
    return {
        tool["function"]["name"]: tool["function"].get("parameters", {})
        for tool in case.get("tools") or []
        if tool.get("type", "function") == "function"
    }


def expected(case: dict[str, Any]) -> dict[str, Any]:
    expect = case["expect"]
    return normalised(
        {
            "content": expect.get("content") or "",
            "reasoning_content": expect.get("reasoning_content") or "",
            "tool_calls": [
                {"name": call["name"], "arguments": json.loads(call["arguments"]) if call.get("arguments") else {}}
                for call in expect.get("tool_calls") or []
            ],
        }
    )


def normalised(reading: dict[str, Any]) -> dict[str, Any]:
    """Text compared without the whitespace around it (llmchat strips the reply it shows);
    arguments as JSON values; call ids ignored."""
    return {
        "content": reading["content"].strip(),
        "reasoning_content": reading["reasoning_content"].strip(),
        "tool_calls": [{"name": c["name"], "arguments": c["arguments"]} for c in reading["tool_calls"]],
    }


def read_case(case: dict[str, Any], pieces: Any) -> dict[str, Any]:
    template = (TEMPLATES / case["template"]).read_text(encoding="utf-8")
    thinking = case.get("enable_thinking", True)
    # llama.cpp's reasoning_format "none" leaves thinking in the content: llmchat reads such a
    # case as it reads a model with no reasoning format.
    split = case.get("reasoning_format", "none") != "none"
    reading = read_output(
        template,
        pieces,
        schemas_of(case),
        thinking=thinking,
        split_reasoning=split,
        json_reply=bool(case.get("json_schema")),
    )
    return normalised(reading)


def marks(case: dict[str, Any]) -> list[Any]:
    reason = KNOWN.get(case["id"])
    return [pytest.mark.xfail(reason=reason, strict=True)] if reason else []


@pytest.mark.parametrize("case", [pytest.param(c, id=c["id"], marks=marks(c)) for c in CASES])
def test_a_reference_case_reads_as_llama_cpp_reads_it(case):
    assert read_case(case, case["output"]) == expected(case)


@pytest.mark.parametrize("case", [pytest.param(c, id=c["id"], marks=marks(c)) for c in CASES])
def test_a_reference_case_streamed_a_character_at_a_time_reads_the_same(case):
    assert read_case(case, list(case["output"])) == expected(case)


def test_the_reference_cases_cover_every_template_of_the_suite():
    used = {case["template"] for case in CASES}
    assert len(CASES) >= 250
    assert used <= {path.name for path in TEMPLATES.glob("*.jinja")}
    assert set(KNOWN) <= {case["id"] for case in CASES}, "a known difference names no case"
