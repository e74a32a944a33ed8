"""Structured output (issue 14): schemas and grammars in ask and batch, valid by construction and checked.

The grammars are checked against llama.cpp itself: `grammar_accepts` feeds a text through
llama.cpp's grammar sampler token by token, with SmolLM2's real vocabulary (loaded vocabulary
only, no weights evaluated). The decoding tests run the real models.
"""

from __future__ import annotations

import ctypes
import json
import math
from pathlib import Path

import pytest

from llmchat.batch.items import parse_input
from llmchat.engine.grammar import Grammar, schema_to_gbnf
from llmchat.engine.interface import GenerateRequest
from llmchat.engine.schema_numbers import integer_range_rule
from llmchat.errors import UsageError
from llmchat.turn.structured import (
    StructuredOutput,
    concise_to_schema,
    multi,
    parse_schema_spec,
    structured_output,
    validation_error,
)

MOVIE = "title, year int, genres list[str]"
FILM = "title, year int, director"  # three fields that always end (a list may run on to the token limit)
FILM_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "year": {"type": "integer"}, "director": {"type": "string"}},
    "required": ["title", "year", "director"],
}
# The same fields with every length bounded, so that the grammar ends each reply within the token
# cap whatever the model writes: a greedy small model's text differs between CPU kinds, and an
# unbounded string or list runs on to the cap on some of them.
BOUNDED_FILM_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": 1800, "maximum": 2100},
        "director": {"type": "string", "maxLength": 40},
    },
    "required": ["title", "year", "director"],
}
BOUNDED_FILM = json.dumps(BOUNDED_FILM_SCHEMA)
BOUNDED_MOVIE_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": 1800, "maximum": 2100},
        "genres": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["title", "year", "genres"],
}
BOUNDED_MOVIE = json.dumps(BOUNDED_MOVIE_SCHEMA)
MOVIE_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "year": {"type": "integer"},
        "genres": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["title", "year", "genres"],
}


def records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# --- the concise syntax -------------------------------------------------------------------------------
def test_concise_syntax_types_descriptions_and_lists():
    schema = concise_to_schema("name, age int, score float, ok bool, tags list[str]: up to five tags, ids list[int]")
    assert schema["required"] == ["name", "age", "score", "ok", "tags", "ids"]
    props = schema["properties"]
    assert props["name"] == {"type": "string"}
    assert props["age"] == {"type": "integer"}
    assert props["score"] == {"type": "number"}
    assert props["ok"] == {"type": "boolean"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "description": "up to five tags"}
    assert props["ids"] == {"type": "array", "items": {"type": "integer"}}
    assert concise_to_schema(MOVIE) == MOVIE_SCHEMA


def test_concise_syntax_on_lines_allows_commas_in_descriptions():
    schema = concise_to_schema("name: the full name, as written\nage int: in years, rounded down\n")
    assert schema["properties"]["name"]["description"] == "the full name, as written"
    assert schema["properties"]["age"] == {"type": "integer", "description": "in years, rounded down"}


@pytest.mark.parametrize(
    "spec, message",
    [
        ("name, age integer", "unknown type 'integer'"),
        ("tags list[dict]", "unknown type 'list[dict]'"),
        ("name, name int", "twice"),
        (" , ", "no fields"),
        ("9lives int", "cannot read"),
    ],
)
def test_concise_syntax_errors(spec, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        concise_to_schema(spec)


def test_schema_spec_inline_json_file_and_config_name(tmp_path):
    inline, source = parse_schema_spec(json.dumps(MOVIE_SCHEMA))
    assert inline == MOVIE_SCHEMA and "inline" in source
    path = tmp_path / "movie.json"
    path.write_text(json.dumps(MOVIE_SCHEMA))
    assert parse_schema_spec(str(path))[0] == MOVIE_SCHEMA
    assert parse_schema_spec("movie", {"movie": MOVIE})[0] == MOVIE_SCHEMA
    assert parse_schema_spec("movie", {"movie": {"type": "object"}})[0] == {"type": "object"}
    with pytest.raises(UsageError, match="no such file"):
        parse_schema_spec(str(tmp_path / "missing.json"))
    with pytest.raises(UsageError, match="not a valid JSON Schema"):
        parse_schema_spec('{"type": "thing"}')


def test_schema_multi_wraps_items():
    wrapped = multi(MOVIE_SCHEMA)
    assert wrapped["required"] == ["items"]
    assert wrapped["properties"]["items"] == {"type": "array", "items": MOVIE_SCHEMA}
    assert validation_error({"items": [{"title": "A", "year": 1, "genres": []}]}, wrapped) is None
    assert validation_error({"items": [{"title": "A"}]}, wrapped) is not None


def test_flags_that_conflict_or_lack_their_partner():
    with pytest.raises(UsageError, match="choose one"):
        structured_output(schema=MOVIE, output_format="json")
    with pytest.raises(UsageError, match="needs --schema"):
        structured_output(schema_multi=True)
    with pytest.raises(UsageError, match="--format must be json"):
        structured_output(output_format="yaml")


# --- checking a reply ---------------------------------------------------------------------------------
def test_check_parses_validates_and_explains():
    out = structured_output(schema=MOVIE)
    assert out is not None
    parsed, error = out.check('{"title": "Alien", "year": 1979, "genres": ["horror"]}', "stop")
    assert error is None and parsed == {"title": "Alien", "year": 1979, "genres": ["horror"]}
    parsed, error = out.check('{"title": "Alien", "ye', "length")
    assert parsed is None and "cut off by the token limit" in error and "--max-tokens" in error
    parsed, error = out.check('{"title": "Alien", "ye', "interrupted")
    assert parsed is None and "interrupted" in error
    parsed, error = out.check('{"title": "Alien", "year": "1979", "genres": []}', "stop")
    assert parsed is None and "'1979' is not of type 'integer'" in error and "/year" in error
    raw = StructuredOutput(Grammar('root ::= "yes" | "no"', "--grammar x"), None, "--grammar x")
    assert raw.check("maybe", "stop") == (None, None)  # no schema: nothing to parse against


# --- JSON Schema -> grammar, checked with llama.cpp's own grammar engine ------------------------------
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
    tokens = (llama_cpp.llama_token * (len(text) + 8))()
    n = llama_cpp.llama_tokenize(vocab, text.encode(), len(text.encode()), tokens, len(tokens), False, False)
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


@pytest.mark.parametrize(
    "low, high, inside, outside",
    [
        (1900, 2100, [1900, 1979, 2000, 2099, 2100], [1899, 2101, 190, 0, -1900]),
        (0, 150, [0, 7, 99, 100, 150], [151, 999, -1]),
        (-5, 5, [-5, -1, 0, 5], [-6, 6, 10]),
        (-20, -3, [-20, -11, -3], [-2, 0, -21, 3]),
        (3, None, [3, 9, 10, 123456], [0, 2, -5]),
        (None, 10, [-99999, -1, 0, 10], [11, 100]),
    ],
)
def test_integer_bounds_become_exact_digit_ranges(vocab, low, high, inside, outside):
    gbnf = f"root ::= {integer_range_rule(low, high)}"
    for value in inside:
        assert grammar_accepts(vocab, gbnf, str(value)), (gbnf, value)
    for value in outside:
        assert not grammar_accepts(vocab, gbnf, str(value)), (gbnf, value)
    assert not grammar_accepts(vocab, gbnf, "0" + str(abs(inside[-1])) if inside[-1] else "00")


def test_nested_objects_arrays_enums_bounds_and_required(vocab):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "kind": {"enum": ["film", "series"]},
            "rating": {"type": "integer", "minimum": 1, "maximum": 5},
            "cast": {
                "type": "array",
                "minItems": 1,
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {"actor": {"type": "string"}, "age": {"type": "integer", "exclusiveMinimum": 0}},
                    "required": ["actor"],
                },
            },
            "note": {"type": "string"},
        },
        "required": ["name", "kind", "rating", "cast"],
    }
    gbnf = schema_to_gbnf(schema)
    good = [
        {"name": "Alien", "kind": "film", "rating": 5, "cast": [{"actor": "Weaver", "age": 30}]},
        {"name": "X", "kind": "series", "rating": 1, "cast": [{"actor": "A"}, {"actor": "B"}], "note": "ok"},
    ]
    bad = [
        {"name": "Alien", "kind": "play", "rating": 5, "cast": [{"actor": "W"}]},  # enum
        {"name": "Alien", "kind": "film", "rating": 6, "cast": [{"actor": "W"}]},  # maximum
        {"name": "Alien", "kind": "film", "rating": 3, "cast": []},  # minItems
        {"name": "Alien", "kind": "film", "rating": 3, "cast": [{"age": 3}]},  # nested required
        {"name": "Alien", "kind": "film", "cast": [{"actor": "W"}]},  # required
        {"name": "Alien", "kind": "film", "rating": 3, "cast": [{"actor": "W", "age": 0}]},  # exclusiveMinimum
        {"name": "Much too long", "kind": "film", "rating": 3, "cast": [{"actor": "W"}]},  # maxLength
    ]
    for value in good:
        assert validation_error(value, schema) is None
        assert grammar_accepts(vocab, gbnf, json.dumps(value)), value
    for value in bad:
        assert validation_error(value, schema) is not None, value  # the validator agrees it is invalid
        assert not grammar_accepts(vocab, gbnf, json.dumps(value)), value


def test_strings_hold_no_raw_control_characters(vocab):
    gbnf = schema_to_gbnf({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})
    assert grammar_accepts(vocab, gbnf, '{"a": "line\\nbreak"}')
    assert not grammar_accepts(vocab, gbnf, '{"a": "line\nbreak"}')  # what json.loads refuses


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "'uniqueItems' at the top level"),
        ({"type": "object", "properties": {"p": {"type": "number", "minimum": 0.5}}}, "'minimum' at /properties/p"),
        ({"type": "string", "format": "email"}, "'format' at the top level is 'email'"),
        ({"type": "string", "pattern": "^(?=a)b$"}, "'pattern'"),
        ({"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False}, "'unevaluatedProperties'"),
        ({"$ref": "https://example.com/s.json"}, "only references inside the schema"),
        ({"type": "object", "patternProperties": {"^a": {}, "b": {"type": "integer"}}}, "'patternProperties'"),
        ({"not": {"const": {"a": 1}}}, "'not'"),
        ({"type": "integer", "minimum": 5, "maximum": 4}, "no JSON value satisfies"),
    ],
)
def test_inexpressible_schemas_are_refused_not_loosened(schema, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        schema_to_gbnf(schema)


def test_schema_show_prints_the_schema_and_the_grammar(cli, isolated_home):
    result = cli("schema", "show", MOVIE)
    assert result.returncode == 0, result.stderr
    head, grammar = result.stdout.split("# GBNF grammar", 1)
    assert json.loads(head.split("\n", 1)[1]) == MOVIE_SCHEMA
    assert 'root ::= "{" space title-kv' in grammar
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text('[schemas]\nmovie = "title, year int"\n')
    named = cli("schema", "show", "movie", "--schema-multi")
    assert named.returncode == 0, named.stderr
    assert '"items"' in named.stdout and "config file" in named.stdout


def test_inexpressible_schema_exits_2_with_one_line(cli):
    result = cli("schema", "show", '{"type": "array", "uniqueItems": true}')
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("llmchat: error: ")
    assert "uniqueItems" in result.stderr


def test_ask_refuses_an_inexpressible_schema_before_loading(cli):
    result = cli("ask", "--schema", '{"type": "object", "properties": {"p": {"type": "number", "maximum": 3.5}}}', "hi")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "'maximum' at /properties/p" in result.stderr


def test_batch_items_carry_their_own_schema():
    items = parse_input(
        b'{"prompt": "a", "schema": "title, year int"}\n'
        b'{"prompt": "b", "schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}\n'
        b'{"prompt": "c", "schema": "n float: up to 3, ok int"}\n'
        b'{"prompt": "d", "schema": {"type": "string", "format": "email"}}\n'
        b'{"prompt": "e", "schema": 7}\n'
        b'{"prompt": "f"}\n'
    )
    assert items[0].structured is not None and items[0].structured.schema["required"] == ["title", "year"]
    assert items[1].structured is not None and items[1].structured.schema["properties"]["n"] == {"type": "integer"}
    assert items[2].structured is not None
    assert items[3].error is not None and "'format' at the top level is 'email'" in items[3].error
    assert items[4].error is not None and "'schema' must be" in items[4].error
    assert items[5].structured is None and items[5].error is None


# --- decoding on the real models ----------------------------------------------------------------------
def test_ask_schema_gives_a_parsed_record(cli, smollm2_path):
    result = cli("ask", "-m", str(smollm2_path), "--temp", "0", "--schema", MOVIE, "--json", "Describe the film Alien.")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["error"] is None and record["finish_reason"] == "stop"
    assert record["parsed"] == json.loads(record["reply"])
    assert validation_error(record["parsed"], MOVIE_SCHEMA) is None


def test_ask_reply_cut_by_max_tokens_exits_5(cli, smollm2_path):
    args = ("ask", "-m", str(smollm2_path), "--temp", "0", "--schema", MOVIE, "-n", "6", "Describe the film Alien.")
    plain = cli(*args)
    assert plain.returncode == 5, plain.stderr
    assert plain.stdout.startswith('{"title')  # the partial reply is still printed
    error_lines = [line for line in plain.stderr.splitlines() if line.startswith("llmchat: error: ")]
    assert len(error_lines) == 1 and "cut off by the token limit" in error_lines[0]
    as_json = cli(*args, "--json")
    assert as_json.returncode == 5
    record = json.loads(as_json.stdout)
    assert record["finish_reason"] == "length" and record["parsed"] is None
    assert "cut off by the token limit" in record["error"]


def test_scripted_chat_goes_on_after_a_cut_reply_and_exits_5_at_the_end(cli, smollm2_path):
    """The same policy as ask: the turn's record carries the error, stderr says it in one line, the
    next turn is still answered, and the exit code says a reply was not what was asked."""
    args = ("chat", "-m", str(smollm2_path), "--temp", "0", "--schema", MOVIE, "-n", "6", "--no-history", "--json")
    done = cli(*args, input="Describe the film Alien.\nDescribe the film Jaws.\n")
    assert done.returncode == 5, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [record["id"] for record in records] == [1, 2]
    assert all(record["parsed"] is None and "cut off by the token limit" in record["error"] for record in records)
    error_lines = [line for line in done.stderr.splitlines() if line.startswith("llmchat: error: turn ")]
    assert len(error_lines) == 2 and error_lines[0].startswith("llmchat: error: turn 1: ")


def test_format_json_and_a_gbnf_file(cli, smollm2_path, tmp_path):
    result = cli("ask", "-m", str(smollm2_path), "--temp", "0", "--format", "json", "--json", "Give a city as JSON.")
    assert result.returncode == 0, result.stderr
    assert isinstance(json.loads(result.stdout)["parsed"], dict)
    gbnf = tmp_path / "yesno.gbnf"
    gbnf.write_text('root ::= ("yes" | "no") "."\n')
    answer = cli("ask", "-m", str(smollm2_path), "--temp", "0", "--grammar", str(gbnf), "Is the sky blue?")
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() in ("yes.", "no.")
    broken = tmp_path / "broken.gbnf"
    broken.write_text("root ::= (\n")
    refused = cli("ask", "-m", str(smollm2_path), "--grammar", str(broken), "hi")
    assert refused.returncode == 2 and refused.stdout == ""
    assert "not a usable GBNF grammar" in refused.stderr


def test_gate_matches_llama_cpp_grammar_sampler_at_temperature_0(smollm2_path, llama_cpp_grammar_picks):
    """The gate (sample, check the pick, filter only on refusal) makes each greedy pick that
    llama.cpp's grammar sampler over the whole vocabulary makes from the same logits, with and
    without --lookup drafting; and drafting gives the same reply."""
    from dataclasses import replace

    from llmchat.engine import Engine, EngineSettings
    from llmchat.engine.sampling import SamplingParams

    grammar = Grammar(schema_to_gbnf(MOVIE_SCHEMA), "test")
    # No repeat penalty: the reference chain is grammar + greedy only; the grammar is what is
    # compared here.
    sampling = replace(SamplingParams(), temperature=0.0, seed=1, repeat_penalty=1.0, stop_loops=False)
    texts = []
    CAP = 60  # no loop stop: both runs reach the cap
    for lookup in (False, True):
        engine = Engine.load(smollm2_path, EngineSettings(n_ctx=512, lookup=lookup))
        try:
            prompt = engine.prompt_tokens(
                [("<|im_start|>user\nThe film Alien, as JSON.<|im_end|>\n<|im_start|>assistant\n", True)]
            )
            picks = llama_cpp_grammar_picks(engine, grammar.text)
            generation = engine.generate(GenerateRequest(prompt, sampling, max_tokens=CAP, grammar=grammar))
            texts.append("".join(event.text for event in generation))
        finally:
            engine.close()
        assert picks and [ours for ours, _ in picks] == [theirs for _, theirs in picks], f"lookup={lookup}"
    gate, drafted = texts
    assert gate == drafted
    # Without the penalty this greedy reply runs past the cap, so it is a prefix of the grammar's JSON
    # (complete replies are validated by the schema tests above and below).
    assert gate.startswith('{ "title": "') and len(gate) > 100


def test_batch_20_items_three_fields_all_parse_and_validate(cli, smollm2_path, tmp_path):
    # Bounded fields: an unbounded director string runs on to the cap for some films on some CPU
    # kinds (a cut reply, reported as such: see test_batch_record_of_a_cut_reply_has_the_error).
    films = [
        "Jaws", "Heat", "Fargo", "Rocky", "Psycho", "Vertigo", "Amelie", "Gravity", "Up", "Cars",
        "Frozen", "Titanic", "Avatar", "Casablanca", "Inception", "Memento", "Shrek", "Coco", "Arrival", "Jaws",
    ]  # fmt: skip
    items = tmp_path / "items.jsonl"
    items.write_text(
        "".join(json.dumps({"id": i, "prompt": f"The film {f}, as JSON."}) + "\n" for i, f in enumerate(films))
    )
    args = ("-m", str(smollm2_path), "--temp", "0", "-n", "160", "--schema", BOUNDED_FILM)
    result = cli("batch", str(items), *args, timeout=1800)
    out = records(result.stdout)
    assert [r["id"] for r in out] == list(range(20))
    for record in out:
        assert record["error"] is None, record
        assert validation_error(record["parsed"], BOUNDED_FILM_SCHEMA) is None
        assert record["parsed"] == json.loads(record["reply"])
    assert result.returncode == 0, result.stderr


def test_parallel_4_gives_the_same_valid_records_as_parallel_1(cli, smollm2_path, tmp_path):
    items = tmp_path / "items.jsonl"
    lines = [{"id": i, "prompt": f"A film from {1970 + 5 * i}, as JSON."} for i in range(6)]
    lines.append({"id": "own", "prompt": "Rate Alien.", "schema": "stars int, liked bool"})  # its own schema
    items.write_text("".join(json.dumps(line) + "\n" for line in lines))
    runs = {}
    for parallel in ("1", "4"):
        # One attention kernel on both sides: --parallel turns flash attention on (engine.calibrate).
        args = (
            "-m",
            str(smollm2_path),
            "--temp",
            "0",
            "-n",
            "160",
            "--schema",
            BOUNDED_FILM,
            "-P",
            parallel,
            "--flash-attn",
            "on",
        )
        result = cli("batch", str(items), *args, timeout=1800)
        assert result.returncode == 0, result.stderr
        runs[parallel] = records(result.stdout)
    assert [r["reply"] for r in runs["1"]] == [r["reply"] for r in runs["4"]]
    for record in runs["4"][:-1]:
        assert validation_error(record["parsed"], BOUNDED_FILM_SCHEMA) is None
    assert set(runs["4"][-1]["parsed"]) == {"stars", "liked"}


def test_batch_record_of_a_cut_reply_has_the_error(cli, smollm2_path, tmp_path):
    items = tmp_path / "items.jsonl"
    items.write_text('{"id": "short", "prompt": "The film Alien, as JSON.", "max_tokens": 5}\n')
    result = cli("batch", str(items), "-m", str(smollm2_path), "--temp", "0", "--schema", MOVIE)
    assert result.returncode == 1  # a failed item
    (record,) = records(result.stdout)
    assert record["finish_reason"] == "length" and record["parsed"] is None
    assert "cut off by the token limit" in record["error"]


def test_acceptance_gemma_batch_parallel_4(cli, gemma_path, tmp_path):
    """The issue's acceptance: every record of a --parallel 4 batch on Gemma 3 270M validates."""
    items = tmp_path / "items.jsonl"
    films = ["Alien", "Jaws", "Heat", "Fargo", "Rocky", "Psycho", "Up", "Coco"]
    items.write_text("".join(json.dumps({"prompt": f"Describe the film {f} as JSON."}) + "\n" for f in films))
    args = ("-m", str(gemma_path), "-n", "200", "--seed", "3", "--schema", BOUNDED_MOVIE, "-P", "4")
    result = cli("batch", str(items), *args, timeout=1800)
    assert result.returncode == 0, result.stderr
    out = records(result.stdout)
    assert len(out) == len(films)
    for record in out:
        assert record["error"] is None, record
        assert validation_error(record["parsed"], BOUNDED_MOVIE_SCHEMA) is None


def test_readme_documents_exit_code_5():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "Structured output" in readme and "| 5 |" in readme
