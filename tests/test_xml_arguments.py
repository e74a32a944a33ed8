"""Arguments written as nested XML elements (MiniMax M3), read as the tool's schema types them."""

from __future__ import annotations

from llmchat.prompt.xml_arguments import nested_value

SEP = "]<]minimax[>["


def test_arrays_of_arrays_and_objects_are_typed_by_the_schema():
    schema = {
        "type": "array",
        "items": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "integer"}}}},
    }
    raw = f"{SEP}<item>{SEP}<item>{SEP}<n>1{SEP}</n>{SEP}</item>{SEP}</item>{SEP}<item>{SEP}</item>"
    assert nested_value(raw, schema, SEP) == [[{"n": 1}], []]


def test_a_leaf_the_schema_calls_a_string_stays_text():
    schema = {"type": "object", "properties": {"zip": {"type": "string"}, "count": {"type": "number"}}}
    assert nested_value("<zip>01234</zip><count>2.5</count>", schema) == {"zip": "01234", "count": 2.5}


def test_text_that_is_not_only_elements_or_a_schema_that_allows_a_string_is_left_to_the_caller():
    obj = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert nested_value("<a>x</a> and more", obj) is None
    assert nested_value("<a>x</b>", obj) is None
    assert nested_value("<a>x</a>", {"anyOf": [{"type": "string"}, obj]}) is None
    assert nested_value("<a>x</a>", {"type": "integer"}) is None
