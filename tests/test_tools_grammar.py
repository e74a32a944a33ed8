"""Tool-call grammars per family, checked with llama.cpp's own grammar engine on SmolLM2's vocabulary."""

from __future__ import annotations

import ctypes
import math

import pytest
from tool_families import family_named

from llmchat.errors import UsageError
from llmchat.tools.call_parsers import strip_end_markers
from llmchat.tools.families import FAMILIES, GENERIC, call_text
from llmchat.tools.functions import function_spec
from llmchat.tools.grammar import call_grammar


def get_weather(city: str, days: int = 1) -> str:
    """Weather forecast for a city."""
    return "sunny"


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


TOOLS = [function_spec(get_weather, "t"), function_spec(add, "t")]


@pytest.fixture(scope="module")
def vocab(smollm2_path):
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(smollm2_path).encode(), params)
    assert model
    yield llama_cpp.llama_model_get_vocab(model)
    llama_cpp.llama_model_free(model)


def grammar_accepts(vocab, gbnf: str, text: str) -> bool:
    """Whether llama.cpp's grammar sampler lets the model write exactly `text` and then stop."""
    import llama_cpp

    sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    assert sampler, "llama.cpp could not parse the grammar"
    data = text.encode()
    tokens = (llama_cpp.llama_token * (len(data) + 8))()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), tokens, len(tokens), False, False)
    assert n >= 0
    ids = list(tokens[:n]) + [llama_cpp.llama_vocab_eos(vocab)]
    try:
        for token in ids:
            one = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
            array = llama_cpp.llama_token_data_array(one, 1, -1, False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
            if not math.isfinite(one[0].logit):
                return False
            if token != ids[-1]:
                llama_cpp.llama_sampler_accept(sampler, token)
        return True
    finally:
        llama_cpp.llama_sampler_free(sampler)


def written(family, name, arguments) -> str:
    """A call as the model writes it, without the end-of-turn token the stop rules handle."""
    return strip_end_markers(call_text(family, name, arguments))


@pytest.mark.parametrize("family", [*FAMILIES, GENERIC], ids=lambda f: f.id)
def test_the_grammar_takes_each_tools_call_and_refuses_bad_ones(vocab, family):
    grammar = call_grammar(family, TOOLS)
    assert grammar.triggers == family.triggers
    gbnf = grammar.grammar.text
    assert grammar_accepts(vocab, gbnf, written(family, "get_weather", {"city": "Paris", "days": 2}))
    assert grammar_accepts(vocab, gbnf, written(family, "get_weather", {"city": "Oslo"}))
    assert grammar_accepts(vocab, gbnf, written(family, "add", {"a": 1, "b": 2}))
    assert not grammar_accepts(vocab, gbnf, written(family, "rm_rf", {"city": "Paris"}))  # no such tool
    if family.id not in ("qwen3_coder", "muse_glimmer"):  # XML values are free text: names are held, values not
        assert not grammar_accepts(vocab, gbnf, written(family, "get_weather", {"city": 3}))
        assert not grammar_accepts(vocab, gbnf, written(family, "add", {"a": 1}))  # b is required
    assert not grammar_accepts(vocab, gbnf, "Sure! " + written(family, "add", {"a": 1, "b": 2}))


def test_the_generic_grammar_also_takes_a_plain_response(vocab):
    gbnf = call_grammar(GENERIC, TOOLS).grammar.text
    assert grammar_accepts(vocab, gbnf, '{"response": "It is sunny."}')
    assert not grammar_accepts(vocab, gbnf, "It is sunny.")


def tool(name: str, parameters: dict, source: str = "config:tools.odd"):
    spec = function_spec(get_weather, "functions:f.py")
    return type(spec)(name=name, description="", parameters=parameters, source=source, run=spec.run)


def test_a_keyword_the_grammar_cannot_hold_is_left_to_validation_for_that_tool_only(vocab):
    """A tool's `format: email` and a `minimum` of 1.5 on a number are dropped from its grammar (the
    rest of its schema still holds), the other tool's grammar is whole, and the notice names them."""
    from llmchat.tools.schema_hold import grammar_parameters, offered_tools

    odd = tool(
        "odd",
        {
            "type": "object",
            "properties": {"x": {"type": "string", "format": "email"}, "n": {"type": "number", "minimum": 1.5}},
            "required": ["x"],
        },
    )
    gbnf = call_grammar(family_named("hermes"), [odd, *TOOLS]).grammar.text
    hermes = family_named("hermes")
    assert grammar_accepts(vocab, gbnf, written(hermes, "odd", {"x": "not an email", "n": 0.5}))
    assert not grammar_accepts(vocab, gbnf, written(hermes, "odd", {"n": 2}))  # x is still required
    assert not grammar_accepts(vocab, gbnf, written(hermes, "add", {"a": 1.5, "b": 2}))  # add's schema is whole
    notices: list[str] = []
    assert offered_tools([odd, *TOOLS], notices.append, grammar=True) == [odd, *TOOLS]
    assert notices == [
        "tool odd (config:tools.odd): the call grammar cannot hold format at /properties/x; minimum at "
        "/properties/n; its arguments are checked against the whole schema before it runs"
    ]
    assert grammar_parameters(TOOLS[0]) == (TOOLS[0].parameters, None)


def test_a_tool_whose_schema_is_not_json_schema_is_left_out_and_the_others_stay():
    from llmchat.tools.schema_hold import offered_tools

    broken = tool("broken", {"type": "object", "properties": {"x": {"type": "strang"}}})
    notices: list[str] = []
    assert offered_tools([broken, *TOOLS], notices.append, grammar=False) == TOOLS
    assert len(notices) == 1
    assert notices[0].startswith("tool broken (config:tools.odd) is left out: its parameters schema is not valid")
    assert "/properties/x/type" in notices[0]


def test_a_users_own_schema_stays_strict():
    from llmchat.engine.grammar import schema_to_gbnf

    with pytest.raises(UsageError, match="'minimum' at /properties/n is not a whole number"):
        schema_to_gbnf({"type": "object", "properties": {"n": {"type": "number", "minimum": 1.5}}})


def derived_families():
    from pathlib import Path

    from llmchat.tools.families import detect_family

    folder = Path(__file__).parent / "data" / "chat_cases" / "templates"
    found = []
    for path in sorted(folder.glob("*.jinja")):
        family = detect_family(path.read_text(encoding="utf-8"))
        if family.derived:
            found.append(pytest.param(family, id=path.stem))
    return found


@pytest.mark.parametrize("family", derived_families())
def test_a_derived_grammar_takes_the_call_as_the_template_writes_it(vocab, family):
    """The grammar made from a derived layout holds the call to the template's own text: what
    the template writes is accepted (so a forced call re-renders exactly), another tool is not."""
    gbnf = call_grammar(family, TOOLS, forced=True).grammar.text
    assert grammar_accepts(vocab, gbnf, written(family, "get_weather", {"city": "Paris", "days": 2})), gbnf
    assert grammar_accepts(vocab, gbnf, written(family, "add", {"a": 1, "b": 2})), gbnf
    assert not grammar_accepts(vocab, gbnf, written(family, "rm_rf", {"city": "Paris"}))
    assert not grammar_accepts(vocab, gbnf, written(family, "add", {"a": "one", "b": 2}))


def _mcp_tools():
    """Tools named as MCP servers name them: SERVER_TOOL with the tool's hyphens and dots kept."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    }
    return [tool("everything_get-sum", schema, "mcp:everything"), tool("fs_read.file", schema, "mcp:fs")]


@pytest.mark.parametrize("family", [*(pytest.param(f, id=f.id) for f in (*FAMILIES, GENERIC)), *derived_families()])
def test_mcp_tool_names_that_are_not_identifiers_are_held_and_parsed_back(vocab, family):
    """A hyphen or a dot in a tool's name goes through each family's grammar and parser whole."""
    tools = _mcp_tools()
    schemas = {spec.name: spec.parameters for spec in tools}
    gbnf = call_grammar(family, tools, forced=True).grammar.text
    for name in ("everything_get-sum", "fs_read.file"):
        text = call_text(family, name, {"a": 2, "b": 3})
        assert grammar_accepts(vocab, gbnf, strip_end_markers(text)), (family.id, name, text)
        parsed = family.parse(text, schemas)
        assert [(call.name, call.arguments) for call in parsed.calls] == [(name, {"a": 2, "b": 3})], text
    assert not grammar_accepts(vocab, gbnf, written(family, "everything_get_sum", {"a": 2, "b": 3}))
