"""The model's own call format: family detection, template variables, and a parser per family,
checked against the real upstream templates in tests/data/templates through llmchat's sandbox."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import jsonschema
import pytest
from tool_families import family_named

from llmchat.prompt.builtins import builtin_templates
from llmchat.tools import generic
from llmchat.tools.call_parsers import ParsedCall, parse_functionary_v3_2, parse_hermes, parse_qwen3_coder
from llmchat.tools.families import FAMILIES, GENERIC, HANDWRITTEN_FIRST, call_text, detect_family
from llmchat.tools.functions import function_spec
from llmchat.tools.prompt import assistant_tool_calls, render_tool_prompt, template_variables, tool_result
from llmchat.turn.reading import read_output

TEMPLATES = Path(__file__).parent / "data" / "templates"
NOW = datetime(2024, 7, 26, tzinfo=timezone.utc)


def get_weather(city: str, days: int = 1) -> str:
    """Weather forecast for a city.

    Args:
        city: the city name
        days: how many days ahead
    """
    return "sunny"


TOOLS = [function_spec(get_weather, "functions:test")]
SCHEMAS = {spec.name: spec.parameters for spec in TOOLS}
ARGUMENTS = {"city": "Paris", "days": 2}
RESULT = "sunny, 21 C"

# template file -> (family, how the template writes a tool result); "derived": the format comes from
# the template itself (llmchat.prompt.format_analysis), the other ids are hand-written rows.
FAMILY_TEMPLATES = {
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": (
        "derived",
        "<tool_response>\nsunny, 21 C\n</tool_response>",
    ),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("derived", "<tool_response>\nsunny, 21 C\n</tool_response>"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("derived", "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response>"),
    "Qwen-Qwen3-0.6B.jinja": ("derived", "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response>"),
    "Qwen-QwQ-32B.jinja": ("derived", "<tool_response>\nsunny, 21 C\n</tool_response>"),
    "Qwen3-Coder.jinja": ("derived", "<tool_response>\nsunny, 21 C\n</tool_response>"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": (
        "llama3",
        '<|start_header_id|>ipython<|end_header_id|>\n\n"sunny, 21 C"',
    ),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": (
        "llama3",
        '<|start_header_id|>ipython<|end_header_id|>\n\n"sunny, 21 C"',
    ),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": (
        "llama3",
        '<|start_header_id|>ipython<|end_header_id|>\n\n"sunny, 21 C"',
    ),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": (
        "derived",
        '[TOOL_RESULTS]{"content": sunny, 21 C, "call_id": "call00000"}',
    ),
    "meetkai-functionary-medium-v3.1.jinja": (
        "derived",
        "<|start_header_id|>ipython<|end_header_id|>\n\nsunny, 21 C",
    ),
    "meetkai-functionary-medium-v3.2.jinja": (
        "functionary_v3_2",
        "<|start_header_id|>tool<|end_header_id|>\n\nsunny, 21 C",
    ),
    "fireworks-ai-llama-3-firefunction-v2.jinja": (
        "firefunction_v2",
        "<|start_header_id|>tool<|end_header_id|>\n\nsunny, 21 C",
    ),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": ("granite", "<|start_of_role|>tool<|end_of_role|>sunny, 21 C"),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": (
        "derived",
        '"results": {\n            "0": "sunny, 21 C"',
    ),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": (
        "derived",
        "<｜tool▁output▁begin｜>sunny, 21 C<｜tool▁output▁end｜>",
    ),
    "muse-glimmer.jinja": (
        "muse_glimmer",
        '<|start|>tool get_weather<|message|><tool_output name="get_weather">\nsunny, 21 C\n</tool_output>',
    ),
    "openai-gpt-oss-120b.jinja": (
        "gpt_oss",
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny, 21 C"',
    ),
    "HuggingFaceTB-SmolLM3-3B.jinja": (
        "generic",
        '{"tool_response": {"tool": "get_weather", "content": "sunny, 21 C"}}',
    ),
}


def source_of(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8")


def render(source: str, messages, add_generation_prompt: bool) -> str:
    return render_tool_prompt(
        source, messages, TOOLS, bos_token="<s>", eos_token="</s>", add_generation_prompt=add_generation_prompt, now=NOW
    )


def generated_part(source: str, conversation: list, reply: dict) -> str:
    """What the model generated for `reply`: the render with the reply, less the render of the
    conversation and less the generation prompt (or the part of it the reply shares: QwQ and R1
    open a <think> block in the generation prompt that a tool-call reply does not have)."""
    before = render(source, conversation, False)
    with_prompt = render(source, conversation, True)
    after = render(source, [*conversation, reply], False)
    assert after.startswith(before)
    reply_text = after[len(before) :]
    prompt = with_prompt[len(before) :] if with_prompt.startswith(before) else ""
    shared = 0
    while shared < min(len(prompt), len(reply_text)) and prompt[shared] == reply_text[shared]:
        shared += 1
    if shared < len(prompt) and "<" in reply_text[:shared]:
        shared = reply_text.rindex("<", 0, shared)  # do not split the special token where they part
    return reply_text[shared:]


def test_every_upstream_template_in_the_data_folder_has_a_family_row():
    names = {path.name for path in TEMPLATES.glob("*.jinja")}
    assert names == set(FAMILY_TEMPLATES)
    for name in names:
        assert (TEMPLATES / f"{name}.source").read_text(encoding="utf-8").strip(), name
    covered = {family for family, _ in FAMILY_TEMPLATES.values()}
    # Every row checked before the analysis has a real template; so does the derived format.
    assert covered >= {"derived", "generic", *HANDWRITTEN_FIRST}
    assert covered <= {"derived", *(family.id for family in (*FAMILIES, GENERIC))}


@pytest.mark.parametrize("name", sorted(FAMILY_TEMPLATES))
def test_the_family_is_detected_from_the_template(name):
    assert detect_family(source_of(name)).id == FAMILY_TEMPLATES[name][0]


@pytest.mark.parametrize("name", sorted(FAMILY_TEMPLATES))
def test_the_tool_list_renders_through_the_sandbox(name):
    prompt = render(source_of(name), [{"role": "user", "content": "Weather in Paris?"}], True)
    assert "get_weather" in prompt
    assert "Weather forecast for a city" in prompt
    assert "Weather in Paris?" in prompt


@pytest.mark.parametrize("name", sorted(FAMILY_TEMPLATES))
def test_a_call_renders_the_family_way_and_parses_back(name):
    source = source_of(name)
    family = detect_family(source_of(name))
    conversation = [{"role": "user", "content": "Weather in Paris?"}]
    reply = assistant_tool_calls([("get_weather", ARGUMENTS)])
    generated = generated_part(source, conversation, reply)
    # The call opens with the family's trigger (Functionary v3.2's `>>>` ends its generation prompt).
    with_reply = render(source, [*conversation, reply], False)
    assert any(trigger.strip() in with_reply for trigger in family.triggers) or family is GENERIC
    # Read as a turn reads it: the reasoning split first (Qwen3 writes an empty think block before
    # the call), then the family's parser.
    read = read_output(source, generated, SCHEMAS)
    calls = [(call["name"], call["arguments"]) for call in read["tool_calls"]]
    assert calls == [("get_weather", ARGUMENTS)], generated
    assert read["content"] == ""


@pytest.mark.parametrize("name", sorted(FAMILY_TEMPLATES))
def test_a_tool_result_renders_the_family_way(name):
    source = source_of(name)
    conversation = [
        {"role": "user", "content": "Weather in Paris?"},
        assistant_tool_calls([("get_weather", ARGUMENTS)]),
        tool_result(0, "get_weather", RESULT),
    ]
    prompt = render(source, conversation, True)
    assert FAMILY_TEMPLATES[name][1] in prompt
    # ...and the conversation goes on with a final answer after the result.
    final = render(source, [*conversation, {"role": "assistant", "content": "It is sunny in Paris."}], False)
    assert "It is sunny in Paris." in final


@pytest.mark.parametrize("family", [*FAMILIES, GENERIC], ids=lambda f: f.id)
def test_each_family_parses_its_own_call_text_with_text_before_it(family):
    text = call_text(family, "get_weather", ARGUMENTS)
    parsed = family.parse(text, SCHEMAS)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", ARGUMENTS)]
    plain = family.parse("Just an answer, no call.", SCHEMAS)
    assert plain.calls == () and "Just an answer, no call." in plain.content


def test_firefunction_gets_functions_and_datetime_and_renders():
    variables = template_variables(family_named("firefunction_v2"), TOOLS, NOW)
    assert json.loads(variables["functions"])[0]["name"] == "get_weather"
    assert variables["datetime"] == "Jul 26 2024 00:00:00 GMT"
    prompt = render(source_of("fireworks-ai-llama-3-firefunction-v2.jinja"), [{"role": "user", "content": "hi"}], True)
    assert '"name": "get_weather"' in prompt and "Today is Jul 26 2024 00:00:00 GMT." in prompt
    assert "functions" not in template_variables(family_named("hermes"), TOOLS)


def test_no_tools_means_no_tool_variables():
    assert template_variables(family_named("hermes"), []) == {}


def test_hermes_parser_details():
    text = 'Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": "{\\"y\\": 2}"}'
    parsed = parse_hermes(text)
    assert parsed.content == "Let me check."
    assert parsed.calls == (ParsedCall("a", {"x": 1}), ParsedCall("b", {"y": 2}))  # the last one cut at the end
    assert parse_hermes('<tool_call>\n<function=a>{"x": 1}</function>').calls == (ParsedCall("a", {"x": 1}),)
    assert parse_hermes("<tool_call>\n{not json}\n</tool_call>").calls == ()
    assert parse_hermes("<think>hmm</think>The answer.").content == "The answer."


def test_qwen3_coder_values_follow_the_schema():
    text = "<tool_call>\n<function=f>\n<parameter=code>\n007\n</parameter>\n<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>"
    schemas = {"f": {"properties": {"code": {"type": "string"}, "n": {"type": "integer"}}}}
    assert parse_qwen3_coder(text, schemas).calls == (ParsedCall("f", {"code": "007", "n": 7}),)


def test_functionary_v3_2_text_and_several_calls():
    parsed = parse_functionary_v3_2('all\nChecking both.>>>a\n{"x": 1}>>>b\n{"y": 2}')
    assert parsed.content == "Checking both."
    assert parsed.calls == (ParsedCall("a", {"x": 1}), ParsedCall("b", {"y": 2}))
    assert parse_functionary_v3_2("all\nHello there").content == "Hello there"


def test_generic_reply_schema_holds_calls_to_the_tools_and_their_arguments():
    schema = generic.reply_schema(TOOLS)
    jsonschema.validate({"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}, schema)
    jsonschema.validate({"response": "Hello"}, schema)
    for bad in (
        {"tool_call": {"name": "rm", "arguments": {}}},
        {"tool_call": {"name": "get_weather", "arguments": {"city": 3}}},
        {"answer": "x"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    assert GENERIC.parse('{"response": "It is sunny."}').content == "It is sunny."
    assert GENERIC.triggers == ()  # not lazy: the whole reply is held to the schema


def test_templates_without_tool_support_get_the_generic_format_in_the_system_message():
    for template in builtin_templates():
        family = detect_family(template.text)
        assert family is GENERIC, template.name
    chatml = next(t for t in builtin_templates() if t.name == "chatml")
    prompt = render(chatml.text, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], True)
    assert "Be brief.\n\nYou can call tools." in prompt
    assert '{"tool_call": {"name": ..., "arguments": {...}}}' in prompt and "with `response`" in prompt


def test_a_template_that_ignores_tools_gets_them_in_the_system_message():
    # DeepSeek R1's official template never prints `tools`: they go in the system message, with
    # the family's own call syntax as the example.
    prompt = render(
        source_of("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"), [{"role": "user", "content": "hi"}], True
    )
    assert "You can call these tools" in prompt and "<｜tool▁sep｜>get_weather" in prompt
