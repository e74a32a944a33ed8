"""The sampler chain every local decode samples through, built in one place.

`Engine.generate` (engine.core, drafted positions included) and `batch --parallel`
(engine.parallel) must pick the same token for the same logits, or one greedy prompt would get
another reply in a batch than alone; so both take their chain from `sampler_chain`:
the repeat penalty, whose window holds the prompt's last tokens as on llama-server, then the
pickers, behind a grammar gate (engine.grammar_gate) when the request has a grammar. A grammar
that starts after some text (the end of a thinking block) starts from `grammar_start`.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Sequence

from llmchat.engine.bindings import llama_cpp
from llmchat.engine.grammar_gate import GrammarGate

if TYPE_CHECKING:
    from llmchat.engine.grammar import Grammar
    from llmchat.engine.loop_exit import LoopExit
    from llmchat.engine.native import LoadedModel
    from llmchat.engine.sampling import SamplingParams


def sampler_chain(
    vocab: Any,
    n_vocab: int,
    penalty_last_n: int,
    sampling: SamplingParams,
    seed: int,
    grammar: Grammar | None = None,
    *,
    start_after: str | None = None,
    history: Sequence[int] = (),
    loop_exit: LoopExit | None = None,
    feed_trigger: bool = False,
) -> Any:
    """The chain llama-cpp-python's `Llama` builds: repetition penalty, then greedy at temperature 0, else
    top-k / typical / top-p / min-p / temperature / dist(seed). With a grammar, the samplers after
    the penalties run inside a `GrammarGate` (engine.grammar_gate), which holds the pick to the grammar
    and steers out of loops the reply rules report through `loop_exit`.

    `history`: the tokens before the first one sampled (the prompt, and a reply so far). Their last
    `penalty_last_n` go into the repeat penalty's window, as llama-server does (it accepts every
    prompt token into its sampler), while llama-cpp-python's own chain starts empty: with the
    default penalty the same greedy prompt then gave another reply in this process than on a
    server. Only the penalty sampler sees them; a grammar's state starts at the reply."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    with ExitStack() as undo:  # a grammar that cannot start (or a Ctrl-C) frees the chain and what it holds
        undo.callback(llama_cpp.llama_sampler_free, chain)
        penalties = llama_cpp.llama_sampler_init_penalties(n_vocab, penalty_last_n, sampling.repeat_penalty, 0.0, 0.0)
        llama_cpp.llama_sampler_chain_add(chain, penalties)
        if min(history, default=0) < 0:  # image and audio positions (engine.media.marks) are no tokens
            history = [token for token in history if token >= 0]
        remember(chain, history[max(0, len(history) - penalty_last_n) :] if penalty_last_n > 0 else ())
        temperature = sampling.temperature
        rest = constrained(
            chain,
            vocab,
            grammar,
            start_after=start_after,
            greedy=temperature == 0,
            loop_exit=loop_exit,
            feed_trigger=feed_trigger and start_after is not None,
        )
        add_pickers(rest, sampling, seed)
        undo.pop_all()
    return chain


def add_pickers(chain: Any, sampling: SamplingParams, seed: int) -> None:
    """The samplers after the penalties, onto `chain`: greedy at temperature 0, else top-k /
    typical / top-p / min-p / temperature / dist(seed) (dist alone below 0)."""

    def add(sampler: Any) -> None:
        llama_cpp.llama_sampler_chain_add(chain, sampler)

    temperature = sampling.temperature
    if temperature < 0:
        add(llama_cpp.llama_sampler_init_dist(seed))
    elif temperature == 0:
        add(llama_cpp.llama_sampler_init_greedy())
    else:
        add(llama_cpp.llama_sampler_init_top_k(sampling.top_k))
        add(llama_cpp.llama_sampler_init_typical(1.0, 1))
        add(llama_cpp.llama_sampler_init_top_p(sampling.top_p, 1))
        add(llama_cpp.llama_sampler_init_min_p(sampling.min_p, 1))
        add(llama_cpp.llama_sampler_init_temp(temperature))
        add(llama_cpp.llama_sampler_init_dist(seed))


def grammar_start(model: LoadedModel, after: str | None, reply: Sequence[int]) -> str | None:
    """The text after which a grammar applies, or None once the reply so far already holds it (a
    chain made again after forced tokens closed the thinking block: the grammar applies now)."""
    if after is None or not reply:
        return after
    so_far = b"".join(model.piece(token, special=True) for token in reply).decode("utf-8", errors="replace")
    return None if after in so_far else after


def remember(chain: Any, tokens: Sequence[int]) -> None:
    """Put `tokens` into the repeat penalty's window of a `sampler_chain` (its first sampler) without
    sampling them: prompt tokens, or tokens forced into the reply."""
    penalties = llama_cpp.llama_sampler_chain_get(chain, 0)
    for token in tokens:
        llama_cpp.llama_sampler_accept(penalties, int(token))


def constrained(
    chain: Any,
    vocab: Any,
    grammar: Grammar | None,
    *,
    start_after: str | None = None,
    greedy: bool = False,
    loop_exit: LoopExit | None = None,
    feed_trigger: bool = False,
) -> Any:
    """Where a sampler chain's samplers after the penalties go: `chain` itself without a grammar,
    else a new inner chain that a `GrammarGate` in `chain` owns. Add the penalties to `chain`
    before calling this, and the rest to what it returns. `loop_exit`: the reply rules' link for
    steering out of a loop (engine.loop_exit)."""
    if grammar is None:
        return chain
    inner = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    gate = GrammarGate(  # it owns `inner` from here, and frees it if it cannot start
        vocab, grammar, inner, start_after=start_after, greedy=greedy, loop_exit=loop_exit, feed_trigger=feed_trigger
    )
    with ExitStack() as undo:  # until the chain holds the gate, freeing the gate frees `inner` and the grammar
        undo.callback(llama_cpp.llama_sampler_free, gate.sampler)
        llama_cpp.llama_sampler_chain_add(chain, gate.sampler)  # the chain owns the gate: freed with it
        undo.pop_all()
    return inner
