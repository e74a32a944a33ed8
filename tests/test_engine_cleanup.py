"""Everything llama.cpp allocates is freed on every path, and nothing twice: each step of a load
made to fail in turn, a close whose first free fails, a sampler chain whose grammar cannot start, a
signal landing right after a free.

The failures are injected by wrapping llama.cpp's bindings in this process (the real functions
still run); each test then checks that every model, context, batch and sampler made was freed,
by the pointers llama.cpp returned.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from llmchat.engine.bindings import llama_cpp

SMALL = {"n_ctx": 256}


class Ledger:
    """Wraps llama.cpp's allocating and freeing functions: what was made, and what was freed."""

    PAIRS = {
        "llama_model_load_from_file": "llama_model_free",
        "llama_init_from_model": "llama_free",
        "llama_batch_init": "llama_batch_free",
        "llama_sampler_chain_init": "llama_sampler_free",
        "llama_sampler_init_grammar": "llama_sampler_free",
    }

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.made: Counter[tuple[str, int]] = Counter()
        self.freed: Counter[tuple[str, int]] = Counter()
        self.fail: dict[str, int] = {}  # name -> which call fails (1: the first)
        self.signal: dict[str, int] = {}  # name -> after which call a SIGTERM "lands" (1: the first)
        self.calls: Counter[str] = Counter()
        for make, free in self.PAIRS.items():
            self._wrap(monkeypatch, make, lambda result, args, free=free: self._made(free, result))
        for free in set(self.PAIRS.values()):
            self._wrap(monkeypatch, free, lambda result, args, free=free: self._freed(free, args[0]))

    def _wrap(self, monkeypatch, name, after) -> None:
        real = getattr(llama_cpp, name)

        def wrapper(*args):
            self.calls[name] += 1
            if self.fail.get(name) == self.calls[name]:
                raise RuntimeError(f"{name} failed (injected)")
            if name in self.PAIRS.values() and self._freed_already(name, args[0]):
                self._freed(name, args[0])  # counted for assert_all_freed, not freed again: a crash
                return None
            result = real(*args)
            after(result, args)
            if self.signal.get(name) == self.calls[name]:
                # What SIGTERM's handler raises (llmchat.interrupts), where Python may run it: at
                # the first bytecode after the native call returned.
                raise SystemExit(143)
            return result

        monkeypatch.setattr(llama_cpp, name, wrapper)

    def fail_at(self, monkeypatch, name: str, call: int = 1) -> None:
        """Make the `call`th call of `name` fail (one of the bindings not already wrapped too)."""
        if name not in self.PAIRS and name not in self.PAIRS.values():
            self._wrap(monkeypatch, name, lambda result, args: None)
        self.fail[name] = call

    def signal_after(self, monkeypatch, name: str, call: int = 1) -> None:
        """Let a SIGTERM's SystemExit be raised right after the `call`th call of `name` returns."""
        if name not in self.PAIRS and name not in self.PAIRS.values():
            self._wrap(monkeypatch, name, lambda result, args: None)
        self.signal[name] = call

    def _freed_already(self, free: str, pointer) -> bool:
        key = (free, _address(pointer)) if pointer else None
        return key is not None and key in self.made and self.freed[key] >= self.made[key]

    def _made(self, free: str, pointer) -> None:
        if pointer:
            self.made[(free, _address(pointer))] += 1

    def _freed(self, free: str, pointer) -> None:
        if pointer:
            self.freed[(free, _address(pointer))] += 1

    def assert_all_freed(self) -> None:
        assert self.made, "nothing was made: the test did not reach llama.cpp"
        leaked = self.made - self.freed
        assert not leaked, f"not freed: {sorted(leaked)}"
        # (A pointer freed here but not made through a wrapped function, such as a grammar gate's
        # own sampler, is not counted: llama.cpp frees those in C, where this ledger cannot see.)
        twice = [key for key, n in self.freed.items() if key in self.made and n > self.made[key]]
        assert not twice, f"freed twice: {twice}"


def _address(pointer) -> int:
    import ctypes

    if isinstance(pointer, llama_cpp.llama_batch):  # passed by value: known by its token array
        pointer = pointer.token
    return pointer if isinstance(pointer, int) else ctypes.cast(pointer, ctypes.c_void_p).value or 0


@pytest.fixture
def ledger(monkeypatch) -> Ledger:
    return Ledger(monkeypatch)


def _open(path: Path, **overrides):
    from llmchat.engine.native import LoadedModel

    options = dict(n_ctx=256, max_ctx=256, n_batch=64, threads=1, gpu_layers=0, mmap=True, mlock=False)
    return LoadedModel(path, **(options | {"flash_attn": False} | overrides))


# --- LoadedModel: the model, its context and its batch ----------------------------------------------
@pytest.mark.parametrize(
    "step",
    ["llama_model_get_vocab", "llama_model_n_ctx_train", "llama_init_from_model", "llama_n_ctx", "llama_batch_init"],
)
def test_a_load_that_fails_after_the_model_frees_what_it_made(smollm2_path, ledger, monkeypatch, step):
    ledger.fail_at(monkeypatch, step)
    with pytest.raises(RuntimeError, match="injected"):
        _open(smollm2_path)
    ledger.assert_all_freed()
    assert ledger.freed[("llama_model_free", next(iter(ledger.made))[1])] == 1


def test_a_context_llama_cpp_refuses_frees_the_model(smollm2_path, ledger, monkeypatch):
    monkeypatch.setattr(llama_cpp, "llama_init_from_model", lambda model, params: None)
    with pytest.raises(ValueError, match="llama_context"):
        _open(smollm2_path)
    ledger.assert_all_freed()


def test_a_batch_is_freed_with_its_model(smollm2_path, ledger, monkeypatch):
    batches = []
    real_free = llama_cpp.llama_batch_free
    monkeypatch.setattr(llama_cpp, "llama_batch_free", lambda batch: (batches.append(batch), real_free(batch))[1])
    model = _open(smollm2_path)
    model.close()
    model.close()  # a second close frees nothing twice
    assert len(batches) == 1
    ledger.assert_all_freed()


@pytest.mark.parametrize("free", ["llama_batch_free", "llama_free"])
def test_a_signal_right_after_a_free_in_close_frees_nothing_twice(smollm2_path, ledger, monkeypatch, free):
    """A SIGTERM's handler runs between bytecodes: right after a free returned, before its field was
    cleared. The cleanup it starts closes again, and must not free that handle a second time."""
    model = _open(smollm2_path)
    ledger.signal_after(monkeypatch, free)
    with pytest.raises(SystemExit):
        model.close()
    model.close()
    ledger.assert_all_freed()


# --- Engine.load and close: the model, the draft model -----------------------------------------------
def _settings(**overrides):
    from llmchat.engine import EngineSettings

    return EngineSettings(**(SMALL | overrides))


def test_an_engine_that_fails_after_its_model_loaded_frees_it(smollm2_path, ledger, monkeypatch):
    from llmchat.engine import Engine, core

    def failing_notice(*args):
        raise RuntimeError("the backend notice failed (injected)")

    monkeypatch.setattr(core, "backend_notice", failing_notice)
    with pytest.raises(RuntimeError, match="injected"):
        Engine.load(smollm2_path, _settings())
    ledger.assert_all_freed()


@pytest.mark.parametrize("failing", ["the main model", "the engine"])
def test_a_draft_model_is_freed_when_a_later_step_fails(smollm2_path, ledger, monkeypatch, failing):
    from llmchat.engine import Engine
    from llmchat.engine.native import LoadedModel

    if failing == "the main model":
        ledger.fail_at(monkeypatch, "llama_model_load_from_file", call=2)
    else:
        monkeypatch.setattr(LoadedModel, "metadata", lambda self: (_ for _ in ()).throw(RuntimeError("injected")))
    # A model llama.cpp cannot load is reported as a ModelError naming the reason.
    with pytest.raises(Exception, match="injected"):
        Engine.load(smollm2_path, _settings(draft_model=smollm2_path, draft_tokens=4))
    ledger.assert_all_freed()
    assert sum(1 for free, _ in ledger.made if free == "llama_model_free") == (1 if failing == "the main model" else 2)


def test_close_frees_the_model_even_when_freeing_the_draft_fails(smollm2_path, ledger, monkeypatch):
    from llmchat.engine import Engine

    engine = Engine.load(smollm2_path, _settings(draft_model=smollm2_path, draft_tokens=4))
    draft = engine._drafter.inner.draft
    real_close = draft.close

    def failing_close():
        real_close()
        raise RuntimeError("freeing the draft failed (injected)")

    monkeypatch.setattr(draft, "close", failing_close)
    with pytest.raises(RuntimeError, match="injected"):
        engine.close()
    ledger.assert_all_freed()


# --- sampler chains: a grammar that cannot start -------------------------------------------------------
def _chain(engine, grammar):
    from llmchat.engine.sampler import sampler_chain
    from llmchat.engine.sampling import SamplingParams

    return sampler_chain(engine.model.vocab, engine.model.n_vocab, 64, SamplingParams(temperature=0.0), 1, grammar)


@pytest.fixture(scope="module")
def engine(smollm2_path):
    from llmchat.engine import Engine, EngineSettings

    loaded = Engine.load(smollm2_path, EngineSettings(n_ctx=256))
    yield loaded
    loaded.close()


def test_a_grammar_llama_cpp_refuses_frees_the_chain(engine, ledger):
    from llmchat.engine.grammar import Grammar
    from llmchat.errors import UsageError

    with pytest.raises(UsageError, match="not a usable GBNF grammar"):
        _chain(engine, Grammar('root ::= "a" undefined-rule', "--grammar test.gbnf"))
    ledger.assert_all_freed()  # the chain, and the inner chain the gate was given


@pytest.mark.parametrize("step", ["llama_sampler_init", "llama_sampler_chain_add"])
def test_a_grammar_gate_that_cannot_start_frees_the_chain_and_the_grammar(engine, ledger, monkeypatch, step):
    from llmchat.engine.grammar import Grammar

    # llama_sampler_chain_add: its 2nd call puts the gate into the chain (the 1st adds the penalties).
    ledger.fail_at(monkeypatch, step, call=2 if step == "llama_sampler_chain_add" else 1)
    with pytest.raises(RuntimeError, match="injected"):
        _chain(engine, Grammar('root ::= "yes" | "no"', "--grammar test.gbnf"))
    ledger.assert_all_freed()
    assert any(free == "llama_sampler_free" for free, _ in ledger.made)


def test_a_chain_that_started_is_freed_whole(engine, ledger):
    from llmchat.engine.grammar import Grammar

    chain = _chain(engine, Grammar('root ::= "yes" | "no"', "--grammar test.gbnf"))
    llama_cpp.llama_sampler_free(chain)  # frees the gate, which frees its inner chain and the grammar
    ledger.assert_all_freed()


# --- the parallel decoder (batch --parallel): its context and each slot's chain -----------------------
@pytest.mark.parametrize("call", [1, 2, 3])
def test_a_signal_right_after_a_slots_chain_is_freed_frees_nothing_twice(engine, ledger, monkeypatch, call):
    """CI caught `batch -P 3` ended by SIGTERM exiting -11 instead of 143: the signal landed right
    after a finished slot's chain was freed, and the decoder's cleanup freed it again."""
    from llmchat.engine.interface import GenerateRequest, QueuedRequest
    from llmchat.engine.parallel import ParallelDecoder
    from llmchat.engine.sampling import SamplingParams

    greedy = SamplingParams(temperature=0.0)
    prompts = [engine.tokenize(f"Count to {n}:", special=False) for n in (3, 4, 5, 6)]
    requests = [QueuedRequest(i, GenerateRequest(p, greedy, max_tokens=4)) for i, p in enumerate(prompts)]
    finished: list = []
    ledger.signal_after(monkeypatch, "llama_sampler_free", call)
    with pytest.raises(SystemExit):
        ParallelDecoder(engine, 2, 64).run(iter(requests), finished.append)
    assert len(finished) >= call - 1  # it landed as slots finished, not before the first reply
    ledger.assert_all_freed()  # the context and every slot's chain, each once
