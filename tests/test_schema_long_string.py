"""Issue 31: a schema with a long free-text string, held by the grammar gate at full speed.

On a refusal the gate asks the grammar about one token per byte and lets llama.cpp check only the
tokens whose first byte is not refused (engine.first_bytes). These tests hold that to llama.cpp's
own grammar sampler: the table matches llama.cpp's pieces token by token, the tokens allowed after
the skip are exactly those a full pass allows in every state tried, and a greedy story under a
schema is the reply llama.cpp's grammar sampler gives, valid against the schema.
"""

from __future__ import annotations

import ctypes
import json
from dataclasses import replace

import numpy
import pytest

from llmchat.engine.interface import GenerateRequest

STORY = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 40}, "story": {"type": "string", "maxLength": 300}},
    "required": ["title", "story"],
}
# Places in a reply under STORY's grammar, each fed to the grammar before comparing: the start,
# inside a key, after `{ `, inside the long string, inside an escape, the end of a string, the end.
PREFIXES = [
    "",
    '{"ti',
    "{ ",
    '{ "title": "The Fox", "story": "Once upon',
    '{"title": "a\\',
    '{"title": "a"',
    '{"title": "a", "story": "b"}',
]


@pytest.fixture(params=["smollm2", "gemma"])
def model_path(request, smollm2_path, gemma_path):
    return smollm2_path if request.param == "smollm2" else gemma_path


def test_first_byte_table_matches_llama_cpp_pieces(model_path):
    from llmchat.engine import Engine, EngineSettings, first_bytes
    from llmchat.engine.bindings import llama_cpp

    engine = Engine.load(model_path, EngineSettings(n_ctx=256))
    try:
        vocab, n_vocab = engine.model.vocab, engine.model.n_vocab
        table = first_bytes.first_bytes(llama_cpp, vocab, n_vocab)
        assert table is not None
        buffer = ctypes.create_string_buffer(512)
        for token in range(n_vocab):
            n = llama_cpp.llama_token_to_piece(vocab, token, buffer, 512, 0, True)
            assert table.first[token] == (buffer.raw[0] if n > 0 else -1), token
        assert first_bytes.first_bytes(llama_cpp, vocab, n_vocab) is table  # built once per vocabulary
        ended = llama_cpp.llama_sampler_init_grammar(vocab, b'root ::= ""', b"root")
        everything = numpy.arange(n_vocab, dtype=numpy.int32)
        try:  # a grammar complete from the start keeps exactly the end-of-generation tokens
            ends = everything[numpy.isfinite(first_bytes.apply(llama_cpp, ended, everything))]
        finally:
            llama_cpp.llama_sampler_free(ended)
        assert len(ends) > 0 and numpy.array_equal(table.end_tokens(llama_cpp, vocab), ends)
        for token, byte in zip(table.probe_ids.tolist(), table.probe_bytes.tolist()):
            n = llama_cpp.llama_token_to_piece(vocab, token, buffer, 512, 0, True)
            assert buffer.raw[:n] == bytes([byte])
    finally:
        engine.close()


def test_skipping_by_first_byte_keeps_exactly_what_llama_cpp_allows(model_path):
    """In each state, the tokens the grammar allows among those the gate keeps are all the tokens
    a full llama.cpp pass over the vocabulary allows."""
    from llmchat.engine import Engine, EngineSettings
    from llmchat.engine.bindings import llama_cpp
    from llmchat.engine.grammar import Grammar, schema_to_gbnf
    from llmchat.engine.grammar_gate import GrammarGate

    engine = Engine.load(model_path, EngineSettings(n_ctx=256))
    try:
        model = engine.model
        grammar = Grammar(schema_to_gbnf(STORY), "test")
        everything = numpy.arange(model.n_vocab, dtype=numpy.int32)
        for prefix in PREFIXES:
            inner = llama_cpp.llama_sampler_init_greedy()
            gate = GrammarGate(model.vocab, grammar, inner, greedy=True)
            try:
                for token in model.tokenize(prefix.encode(), add_bos=False, special=False):
                    one = numpy.array([token], dtype=numpy.int32)
                    assert len(_allowed(gate.grammar, one)) == 1, f"{prefix!r}: the grammar refuses its own text"
                    llama_cpp.llama_sampler_accept(gate.grammar, token)
                full = _allowed(gate.grammar, everything)
                heads = gate._allowed_heads()
                assert heads is not None
                kept = _rows(gate, heads[0], everything)
                assert numpy.array_equal(_allowed(gate.grammar, kept), full), prefix
                assert len(full) > 0 and len(kept) < model.n_vocab  # some tokens were skipped
            finally:
                llama_cpp.llama_sampler_free(gate.sampler)
    finally:
        engine.close()


def _allowed(grammar, ids):
    from llmchat.engine.bindings import llama_cpp
    from llmchat.engine.first_bytes import apply

    return ids[numpy.isfinite(apply(llama_cpp, grammar, ids))]


def _rows(gate, heads, everything):
    """The token ids the gate keeps for `heads`, through its own row selection over the vocabulary."""
    from llmchat.engine.bindings import llama_cpp

    size = len(everything)
    data = (llama_cpp.llama_token_data * size)()
    rows = numpy.ctypeslib.as_array(ctypes.cast(data, ctypes.POINTER(ctypes.c_int32)), shape=(size, 3))
    rows[:, 0] = everything
    array = llama_cpp.llama_token_data_array(data, size, -1, False)
    return everything[gate._rows_starting_with(ctypes.pointer(array), size, heads)]


def test_greedy_story_under_a_schema_equals_llama_cpp_and_is_valid(model_path, freed_gates, llama_cpp_grammar_picks):
    from llmchat.engine import Engine, EngineSettings
    from llmchat.engine.grammar import Grammar, schema_to_gbnf
    from llmchat.engine.sampling import SamplingParams
    from llmchat.turn.structured import validation_error

    gates = freed_gates
    grammar = Grammar(schema_to_gbnf(STORY), "test")
    sampling = replace(SamplingParams(), temperature=0.0, seed=1, repeat_penalty=1.0, stop_loops=False)
    engine = Engine.load(model_path, EngineSettings(n_ctx=1024))
    try:
        text = "Write a long story about a fox, as JSON with a title and the story."
        prompt = engine.prompt_tokens([(text, True)])
        picks = llama_cpp_grammar_picks(engine, grammar.text)  # pick by pick, on the same logits
        generation = engine.generate(GenerateRequest(prompt, sampling, max_tokens=200, grammar=grammar))
        gate_text = "".join(event.text for event in generation)
    finally:
        engine.close()
    assert picks and [ours for ours, _ in picks] == [theirs for _, theirs in picks]
    assert validation_error(json.loads(gate_text), STORY) is None
    (gate,) = gates
    assert gate.rejections > 0  # the model's own first pick is not JSON: the gate had to choose
