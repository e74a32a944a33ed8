"""Issue 25: on a refusal the grammar gate filters the top candidates first, on Gemma 3's 262,144 tokens.

At temperature 0 every pick must be the one llama.cpp's own grammar sampler and greedy make (its
grammar filters the whole vocabulary at every token), while most refusals are settled among the
top candidates.

Issue 45: the two are compared pick by pick, on the same logits (the `llama_cpp_grammar_picks`
fixture), not as two replies decoded one after the other. Those replies part on some CPU kinds: on
a Sapphire Rapids Xeon after 89 characters (`"adventure", "comedy"` against `"drama", "horror"`).
The second reply is decoded with other batch shapes (llama.cpp's run keeps the prompt but its last
token, and evaluates that one alone), whose kernels round differently. Along this very reply, on an
AVX-512 Xeon without AMX, the two schemes' logits differ by 0.6 to 1.6 at each of the 60 steps,
while the best two allowed tokens stand as little as 0.01 apart (a digit of the year) and 0.10 at
"horror" against "drama", where the other scheme's logits put "drama" first. A near-tie, decided by
rounding: the gate's and llama.cpp's picks from the same logits agree at every step, on every CPU.
"""

from __future__ import annotations

from dataclasses import replace

from llmchat.engine.interface import GenerateRequest
from llmchat.turn.structured import concise_to_schema

MOVIE = "title, year int, genres list[str]"


def test_top_candidates_settle_refusals_and_each_greedy_pick_equals_llama_cpps(
    gemma_path, freed_gates, llama_cpp_grammar_picks
):
    from llmchat.engine import Engine, EngineSettings
    from llmchat.engine.grammar import Grammar, schema_to_gbnf
    from llmchat.engine.sampling import SamplingParams

    gates = freed_gates
    schema = concise_to_schema(MOVIE)
    grammar = Grammar(schema_to_gbnf(schema), "test")
    # Penalty 1.0 and no loop stop: the reference chain is llama.cpp's grammar sampler and greedy only.
    sampling = replace(SamplingParams(), temperature=0.0, seed=1, repeat_penalty=1.0, stop_loops=False)
    engine = Engine.load(gemma_path, EngineSettings(n_ctx=512))
    try:
        turn = "<start_of_turn>user\nDescribe the film Alien as JSON.<end_of_turn>\n<start_of_turn>model\n"
        prompt = engine.prompt_tokens([(turn, True)])
        picks = llama_cpp_grammar_picks(engine, grammar.text)
        generation = engine.generate(GenerateRequest(prompt, sampling, max_tokens=60, grammar=grammar))
        gate_text = "".join(event.text for event in generation)
    finally:
        engine.close()
    assert len(picks) == 60
    assert [ours for ours, _ in picks] == [theirs for _, theirs in picks]
    # Without the penalty the reply may run past the 60 tokens: a prefix of the grammar's JSON.
    assert gate_text.lstrip().startswith("{") and len(gate_text) > 60
    (gate,) = gates
    assert gate.rejections > 0, "this reply should meet refusals (Gemma writes spaces the grammar bounds)"
    assert gate.full_passes < gate.rejections / 2  # most refusals were settled among the top 256
