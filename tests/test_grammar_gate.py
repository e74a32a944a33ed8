"""Issue 25: on a refusal the grammar gate filters the top candidates first, on Gemma 3's 262,144 tokens.

The greedy reply must stay the one llama.cpp's own grammar sampler gives (which filters the whole
vocabulary at every token), while most refusals are settled among the top candidates.
"""

from __future__ import annotations

from dataclasses import replace

from llmchat.engine.interface import GenerateRequest
from llmchat.structured import concise_to_schema

MOVIE = "title, year int, genres list[str]"


def test_top_candidates_settle_refusals_and_greedy_equals_llama_cpp(gemma_path, freed_gates, grammar_reference):
    from llmchat.engine import Engine, EngineSettings
    from llmchat.engine.grammar import Grammar, schema_to_gbnf
    from llmchat.sampling import SamplingParams

    gates = freed_gates
    schema = concise_to_schema(MOVIE)
    grammar = Grammar(schema_to_gbnf(schema), "test")
    # Penalty 1.0 and no loop stop: the reference chain is llama.cpp's grammar sampler and greedy only.
    sampling = replace(SamplingParams(), temperature=0.0, seed=1, repeat_penalty=1.0, stop_loops=False)
    engine = Engine.load(gemma_path, EngineSettings(n_ctx=512))
    try:
        turn = "<start_of_turn>user\nDescribe the film Alien as JSON.<end_of_turn>\n<start_of_turn>model\n"
        prompt = engine.prompt_tokens([(turn, True)])
        generation = engine.generate(GenerateRequest(prompt, sampling, max_tokens=60, grammar=grammar))
        gate_text = "".join(event.text for event in generation)
        reference = grammar_reference(engine, prompt, grammar.text, 60)
    finally:
        engine.close()
    assert gate_text == engine.detokenize(reference)
    # Without the penalty the reply may run past the 60 tokens: a prefix of the grammar's JSON.
    assert gate_text.lstrip().startswith("{") and len(gate_text) > 60
    (gate,) = gates
    assert gate.rejections > 0, "this reply should meet refusals (Gemma writes spaces the grammar bounds)"
    assert gate.full_passes < gate.rejections / 2  # most refusals were settled among the top 256
