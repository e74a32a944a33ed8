"""Each JSON Schema keyword llmchat's converter holds beyond llama.cpp's own (issue 48), checked
with llama.cpp's grammar engine on SmolLM2's vocabulary: the values the schema allows are
accepted, the ones it does not are refused (and the validator agrees on both)."""

from __future__ import annotations

import json

import pytest

from llmchat.engine.grammar import schema_to_gbnf
from llmchat.engine.grammar_probe import GrammarProbe
from llmchat.errors import UsageError
from llmchat.turn.structured import validation_error


@pytest.fixture(scope="module")
def vocab(smollm2_path):
    from llmchat.tools.token_cost import VocabTokenizer

    tokenizer = VocabTokenizer(smollm2_path)
    yield tokenizer.model.vocab
    tokenizer.model.close()


CASES = {
    "prefixItems": (
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": {"type": "boolean"}},
        [[], [1], [1, "a"], [1, "a", True, False]],
        [["a"], [1, 2], [1, "a", "b"]],
    ),
    "prefixItems with minItems and no more items": (
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "null"}], "minItems": 1, "items": False},
        [[1], [1, None]],
        [[], [1, None, 3]],
    ),
    "patternProperties": (
        {"type": "object", "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False},
        [{}, {"x-a": 1, "x-b": 2}],
        [{"x-a": "1"}, {"y": 1}],
    ),
    "propertyNames": (
        {"type": "object", "propertyNames": {"maxLength": 3}},
        [{}, {"abc": [1], "d": None}],
        [{"abcd": 1}],
    ),
    "dependentSchemas": (
        {"type": "object", "properties": {"card": {"type": "string"}, "cvc": {"type": "integer"}},
         "dependentSchemas": {"card": {"required": ["cvc"]}}},
        [{}, {"cvc": 123}, {"card": "x", "cvc": 123}],
        [{"card": "x"}],
    ),
    "dependentRequired": (
        {"type": "object", "properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}},
        [{}, {"b": 1}, {"a": 1, "b": 2}],
        [{"a": 1}],
    ),
    "contains (at least two)": (
        {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 10}, "minContains": 2},
        [[10, 11], [1, 10, 2, 12]],
        [[], [10], [1, 2, 3], [10, "a", 11]],
    ),
    "contains (at most one)": (
        {"type": "array", "contains": {"type": "string"}, "maxContains": 1},
        [["a"], [1, "a", 2]],
        [[], [1, 2], ["a", "b"]],
    ),
    "multipleOf an integer": (
        {"type": "integer", "multipleOf": 7},
        [0, 7, 14, -21, 700],
        [1, 8, 15, -22],
    ),
    "multipleOf a decimal": (
        {"type": "number", "multipleOf": 0.25},
        [0, 0.25, 1.5, -2.75, 3],
        [0.1, 1.3, 0.125],
    ),
    "multipleOf over a bounded range": (
        {"type": "number", "multipleOf": 1.5, "minimum": 0, "maximum": 6},
        [0, 1.5, 3, 4.5, 6],
        [-1.5, 1, 7.5],
    ),
    "number bounds": (
        {"type": "number", "exclusiveMinimum": -1, "maximum": 2},
        [-0.5, 0, 1.75, 2],
        [-1, -1.5, 2.01, 3],
    ),
    "if/then/else": (
        {"if": {"type": "string"}, "then": {"minLength": 2}, "else": {"type": "integer", "minimum": 0}},
        ["ab", 0, 5],
        ["a", -1, None, [1]],
    ),
    "if/then/else on a property": (
        {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
         "required": ["kind"], "if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["n"]}},
        [{"kind": "a", "n": 1}, {"kind": "b"}, {"kind": "b", "n": 2}],
        [{"kind": "a"}, {"kind": "c"}],
    ),
    "not": (
        {"type": "string", "not": {"enum": ["admin", "root"]}},
        ["user", "adm", "roots", ""],
        ["admin", "root"],
    ),
    "oneOf told apart by a const": (
        {"oneOf": [{"type": "object", "properties": {"t": {"const": 1}}, "required": ["t"]},
                   {"type": "object", "properties": {"t": {"const": 2}, "x": {"type": "string"}}, "required": ["t", "x"]}]},
        [{"t": 1}, {"t": 2, "x": "y"}],
        [{"t": 2}, {"t": 3}],
    ),
    "additionalProperties beside named ones": (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
        [{"a": 1, "b": "x"}, {"b": "x"}],
        [{"b": 1}, {"a": "x"}],
    ),
    "an untyped schema holds every type": (
        {"minLength": 2},
        ["ab", 1, None, [1], {"a": 1}],
        ["a"],
    ),
}  # fmt: skip


def accepted(probe: GrammarProbe, value: object) -> bool:
    return any(probe.accepts(json.dumps(value, separators=s)) for s in ((", ", ": "), (",", ":")))


@pytest.mark.parametrize("name", list(CASES))
def test_a_keyword_is_held_exactly(vocab, name):
    schema, good, bad = CASES[name]
    with GrammarProbe(vocab, schema_to_gbnf(schema)) as probe:
        for value in good:
            assert validation_error(value, schema) is None, value
            assert accepted(probe, value), (name, value)
        for value in bad:
            assert validation_error(value, schema) is not None, value
            assert not accepted(probe, value), (name, value)


def test_a_key_spelled_with_an_escape_cannot_stand_in_for_a_named_one(vocab):
    """Other keys are "any key but the named ones": written as escapes, "\\u0061" is "a", which
    would slip a string past `a`'s integer schema; one spelling per character closes that."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}}
    with GrammarProbe(vocab, schema_to_gbnf(schema)) as probe:
        assert probe.accepts('{"b": "x"}')
        assert not probe.accepts('{"\\u0061": "x"}')
        assert not probe.accepts('{"a": "x"}')


def test_property_names_with_quotes_and_backslashes_make_a_grammar_llama_cpp_reads(vocab):
    schema = {"type": "object", "properties": {'a"b': {"type": "integer"}, "c\\d": {"const": "e\nf"}}}
    with GrammarProbe(vocab, schema_to_gbnf(schema)) as probe:
        assert probe.accepts(json.dumps({'a"b': 1, "c\\d": "e\nf"}))
        assert not probe.accepts(json.dumps({'a"b': "1"}))


@pytest.mark.parametrize(
    "schema, keyword",
    [
        ({"oneOf": [{"minimum": 0}, {"multipleOf": 2}]}, "'oneOf'"),
        ({"type": "array", "contains": {"const": 1}, "maxItems": 3}, "'contains'"),
        ({"type": "integer", "multipleOf": 7919, "minimum": 0}, "'multipleOf'"),
        ({"type": "object", "x-except": [1]}, "'x-except'"),
        ({"$schema": "http://example.com/my-dialect", "type": "string"}, "'$schema'"),
    ],
)
def test_what_cannot_be_held_exactly_is_refused_by_name(schema, keyword):
    with pytest.raises(UsageError, match=keyword.replace("$", r"\$")):
        schema_to_gbnf(schema)


def test_properties_named_like_the_grammar_s_own_rules_keep_their_schemas(vocab):
    schema = {
        "type": "object",
        "properties": {"integer": {"type": "string"}, "root": {"type": "boolean"}, "n": {"type": "integer"}},
        "required": ["integer", "root", "n"],
    }
    with GrammarProbe(vocab, schema_to_gbnf(schema)) as probe:
        assert probe.accepts('{"integer": "a", "root": true, "n": 1}')
        assert not probe.accepts('{"integer": "a", "root": true, "n": "b"}')
        assert not probe.accepts('{"integer": 1, "root": true, "n": 1}')
