"""Issue 25: under a grammar a loop is steered out of, never a reason for an invalid record.

The steering is tested on Gemma 3 270M (a base model), which at temperature 0 falls into a loop
when the prompt is itself a repetition: without a grammar that reply ends with finish_reason
"loop"; under `--schema` the repeating list is closed after a whole item and the model goes on.
The rest: the JSON nesting that picks what to close, the concise `max N`, a list the grammar may
not close yet (it runs to the token limit: exit 5), and the acceptance batch of the issue.
"""

from __future__ import annotations

import json

import pytest

from llmchat.engine.loop_exit import JsonNesting
from llmchat.turn.structured import concise_to_schema, validation_error

CAT_DOG = "cat, dog, cat, dog, cat, dog, cat, dog, cat, dog, cat, dog, cat, dog, cat, dog. As JSON:"
WORDS = "words list[str], note"
WORDS_SCHEMA = concise_to_schema(WORDS)


def record_of(result) -> dict:
    return json.loads(result.stdout)


def records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# --- what is closed: pure ---------------------------------------------------------------------------
def fed(*pieces: str) -> JsonNesting:
    nesting = JsonNesting()
    for piece in pieces:
        nesting.feed(piece.encode())
    return nesting


def test_a_loop_over_list_items_closes_the_list_and_a_loop_in_a_string_the_string():
    items = fed('{"genres"', ": [", '"Horror', '", "', "Sci-Fi", '", "', "Horror", '", "', "Sci-Fi")
    # Over the last 4 tokens only the object and the list stayed open: keep the object.
    assert items.enclosing_depth(4) == 2
    assert items.closing_text(1) == '"]'
    plot = fed('{"plot": "', "It is", " a film", ". It is", " a film")
    assert plot.enclosing_depth(4) == 2
    assert plot.closing_text(1) == '"'
    assert fed('{"a": [1, 2').closing_text(1) == "]"
    assert fed('{"a": [1, 2]').closing_text(1) == ""  # already closed by the model


def test_escapes_and_brackets_inside_strings_are_not_structure():
    nesting = fed('{"a": ["x]}', '\\"', "y")
    assert nesting.stack == [ord("{"), ord("["), ord('"')]
    assert nesting.closing_text(1) == '"]'
    half = fed('{"a": "\\u00')
    assert half.closing_text(1) is None  # a quote now would be inside the escape
    assert fed('{"a": "\\u00e9').closing_text(1) == '"'
    # Would the next token end the item ("dog" closed, with or without what follows)?
    assert fed('{"w": ["cat", "dog').reaches(b'", "', 2)
    assert not fed('{"w": ["cat", "dog').reaches(b"s and", 2)


def test_concise_max_items():
    schema = concise_to_schema("title, genres list[str] max 5: the main ones")
    assert schema["properties"]["genres"] == {
        "type": "array",
        "items": {"type": "string"},
        "maxItems": 5,
        "description": "the main ones",
    }
    assert "maxItems" not in concise_to_schema("tags list[int]")["properties"]["tags"]


# --- on the model -----------------------------------------------------------------------------------
def test_a_loop_under_a_schema_is_steered_out_and_without_one_it_stops(cli, gemma_path):
    common = ("ask", "-m", str(gemma_path), "--json", "--temperature", "0", "-n", "200")
    steered = cli(*common, "--schema", WORDS, CAT_DOG)
    assert steered.returncode == 0, steered.stderr
    record = record_of(steered)
    assert record["finish_reason"] == "stop" and record["error"] is None
    # At least once: on some CPU kinds the note string falls into a second loop, steered out of
    # the same way (as in the parallel test below).
    assert record["stats"]["loop_steered"] >= 1
    assert validation_error(record["parsed"], WORDS_SCHEMA) is None
    # The list was closed after a whole item, and the model went on to write the next field.
    assert len(record["parsed"]["words"]) > 8 and set(record["parsed"]["words"]) == {"cat", "dog"}
    assert "loop" not in steered.stderr  # no loop-stop notice

    free = record_of(cli(*common, CAT_DOG))
    assert free["finish_reason"] == "loop" and free["stats"]["loop_steered"] == 0

    # max N: the grammar itself ends the list, before any loop.
    bounded = record_of(cli(*common, "--schema", "words list[str] max 4, note", CAT_DOG))
    assert bounded["error"] is None and len(bounded["parsed"]["words"]) == 4


def test_parallel_and_lookup_steer_out_of_the_loop_too(cli, gemma_path, tmp_path):
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"id": i, "prompt": CAT_DOG}) + "\n" for i in range(3)))
    args = ("-m", str(gemma_path), "--temperature", "0", "-n", "200", "--schema", WORDS)
    batch = cli("batch", str(items), *args, "-P", "3", timeout=1800)
    assert batch.returncode == 0, batch.stderr
    for record in records(batch.stdout):
        # Steered out at least once: on some CPU kinds the note string falls into a second loop,
        # which is steered out of the same way.
        assert record["finish_reason"] == "stop" and record["stats"]["loop_steered"] >= 1, record
        assert validation_error(record["parsed"], WORDS_SCHEMA) is None

    drafted = cli("ask", *args, "--json", "--lookup", CAT_DOG)
    assert drafted.returncode == 0, drafted.stderr
    record = record_of(drafted)
    assert record["stats"]["loop_steered"] >= 1 and validation_error(record["parsed"], WORDS_SCHEMA) is None


def test_a_list_the_grammar_may_not_close_yet_runs_to_the_token_limit(cli, gemma_path, tmp_path):
    """Steering closes only where the grammar allows it: 60 items cannot fit in 120 tokens, so the
    loop goes on (not stopped), and the reply is an honest invalid one, cut by the limit (exit 5)."""
    schema = tmp_path / "many.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {"words": {"type": "array", "items": {"type": "string"}, "minItems": 60}},
                "required": ["words"],
            }
        )
    )
    result = cli(
        "ask", "-m", str(gemma_path), "--json", "--temperature", "0", "-n", "120", "--schema", str(schema), CAT_DOG
    )
    assert result.returncode == 5, result.stderr
    record = record_of(result)
    assert record["finish_reason"] == "length" and record["stats"]["loop_steered"] == 0
    assert "cut off by the token limit" in record["error"]


def test_acceptance_12_items_at_temperature_0_5_none_cut_by_the_loop_stop(cli, gemma_path, tmp_path):
    """The issue's acceptance batch with this test's own prompts: Gemma 3 270M, T=0.5,
    --parallel 4, 160 tokens, `title, year int, genres list[str]`. Every record is valid, or cut
    only by the token limit (a list the model never closes); none is ended by the loop stop.
    Some prompts are repetitions themselves, to draw the model into a loop."""
    prompts = [f"Describe the film {film} as JSON." for film in ("Alien", "Jaws", "Heat", "Fargo", "Psycho", "Up")]
    prompts += [f"The film {film} as JSON, with every genre it belongs to:" for film in ("Rocky", "Coco", "Memento")]
    prompts += [
        "Horror, Sci-Fi, Horror, Sci-Fi, Horror, Sci-Fi, Horror, Sci-Fi, Horror, Sci-Fi. The film Alien as JSON:",
        "Drama, Drama, Drama, Drama, Drama, Drama, Drama, Drama, Drama. The film Heat as JSON:",
        "The film Jaws. Its genres: thriller, horror, thriller, horror, thriller, horror, thriller. As JSON:",
    ]
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    movie = "title, year int, genres list[str]"
    args = ("-m", str(gemma_path), "--temperature", "0.5", "--seed", "7", "-n", "160", "-P", "4", "--schema", movie)
    result = cli("batch", str(items), *args, timeout=1800)
    out = records(result.stdout)
    assert [r["id"] for r in out] == list(range(12))
    for record in out:
        assert record["finish_reason"] in ("stop", "length"), record
        if record["finish_reason"] == "stop":
            assert record["error"] is None, record
            assert validation_error(record["parsed"], concise_to_schema(movie)) is None
        else:
            assert "cut off by the token limit" in record["error"], record
    assert result.returncode == (0 if all(r["error"] is None for r in out) else 1), result.stderr


@pytest.mark.parametrize("spec", ["tags list[str] max", "tags list[str] max five", "tags list[str] min 2"])
def test_concise_max_needs_a_number(spec):
    from llmchat.errors import UsageError

    with pytest.raises(UsageError, match="max N"):
        concise_to_schema(spec)
