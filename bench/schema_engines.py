#!/usr/bin/env python3
"""The JSON Schema converters people use instead of llmchat's, on the same suite cases as
bench/schema_suite.py, side by side: coverage (schemas taken), exactness (holes, walls) and the
cost per decoded token of the allowed-token set on SmolLM2's 49,152-token vocabulary.

    python bench/schema_engines.py [--out bench/results/schema_engines.json] [--steps-reps 5]

Needs `llguidance` and `outlines-core` importable (PyPI; they are not llmchat dependencies): run
it from a virtual environment that has them and sees llmchat's (a .pth file naming llmchat's
site-packages is enough). xgrammar is left out: its PyPI wheel pulls torch, CUDA and transformers
(several GB), for a CPU tool.

- llmchat: its own converter, llama.cpp's grammar engine (llmchat.engine.grammar_probe).
- llguidance 1.9.1: `LLMatcher.grammar_from_json_schema`, validated against the vocabulary
  (refused when it reports an error), instances fed as llama.cpp tokens to an `LLMatcher`.
- outlines-core 0.2.14: `build_regex_from_schema`; instances checked with Python's `re.fullmatch`
  on the regex (outlines matches with Rust's regex-automata over its token index; the syntax the
  two share is what its regexes use, and a regex Python cannot read is counted apart).
An instance is accepted when some standard serialization of it is (tests/schema_suite.py).
Speed (indicative: the machine is shared): per token of a fixed valid film record, the time to
compute the allowed-token set over the whole vocabulary (llama.cpp: its grammar sampler applied
to all candidates, as llama.cpp's own samplers do; llguidance: `compute_bitmask`; outlines:
the index lookup, after building the index once per schema, also timed). llmchat's decode does
not pay llama.cpp's full pass at every token (engine.grammar_gate checks the sampled token
first): its measured cost is in bench/results/schema_cost.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FILM = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": 1800, "maximum": 2100},
        "director": {"type": "string", "maxLength": 40},
        "genres": {"type": "array", "items": {"enum": ["drama", "horror", "comedy", "science fiction"]}, "maxItems": 3},
    },
    "required": ["title", "year", "director", "genres"],
    "additionalProperties": False,
}
FILM_TEXT = '{"title": "Alien", "year": 1979, "director": "Ridley Scott", "genres": ["horror", "science fiction"]}'


class Tally:
    def __init__(self) -> None:
        self.taken = self.refused = self.valid = self.valid_ok = self.invalid = self.invalid_ok = 0
        self.holes: list[str] = []
        self.walls: list[str] = []
        self.narrowed = 0
        self.unmeasured = 0

    def count(self, case: Any, test: dict[str, Any], accepted: bool) -> None:
        from tests.schema_suite import narrowed_valid

        label = f"{case.file} / {case.description}: {test['description']}"
        if test["valid"]:
            self.valid += 1
            self.valid_ok += accepted
            if not accepted:
                self.walls.append(label)
                self.narrowed += not narrowed_valid(case.schema, test["data"])
        else:
            self.invalid += 1
            self.invalid_ok += not accepted
            if accepted:
                self.holes.append(label)

    def figures(self) -> dict[str, Any]:
        return {
            "taken": self.taken,
            "refused": self.refused,
            "valid_accepted": f"{self.valid_ok}/{self.valid}",
            "invalid_rejected": f"{self.invalid_ok}/{self.invalid}",
            "holes": len(self.holes),
            "walls": len(self.walls),
            "walls_narrowed_as_llmchat_documents": self.narrowed,
            "groups_unmeasured": self.unmeasured,
            "hole_cases": self.holes,
        }


def llguidance_run(cases: list[Any], tokenizer: Any) -> Tally:
    from llguidance import LLMatcher

    from tests.schema_suite import serializations

    tally = Tally()
    for case in cases:
        try:
            grammar = LLMatcher.grammar_from_json_schema(case.schema if isinstance(case.schema, dict) else {"x": 1})
        except ValueError:
            tally.refused += 1
            continue
        if not isinstance(case.schema, dict) or LLMatcher.validate_grammar(grammar, tokenizer):
            tally.refused += 1
            continue
        tally.taken += 1
        for test in case.tests:
            accepted = False
            for text in serializations(test["data"]):
                matcher = LLMatcher(tokenizer, grammar, log_level=0)
                if matcher.consume_tokens(tokenizer.tokenize_str(text)) and matcher.is_accepting():
                    accepted = True
                    break
            tally.count(case, test, accepted)
    return tally


def outlines_run(cases: list[Any]) -> Tally:
    from outlines_core.json_schema import build_regex_from_schema

    from tests.schema_suite import serializations

    tally = Tally()
    for case in cases:
        try:
            if not isinstance(case.schema, dict):
                raise ValueError("not an object")
            pattern = build_regex_from_schema(json.dumps(case.schema))
        except Exception:  # outlines raises its own error types for what it does not support
            tally.refused += 1
            continue
        tally.taken += 1
        try:
            compiled = re.compile(pattern)
        except (re.error, RecursionError, OverflowError):
            tally.unmeasured += 1
            continue
        for test in case.tests:
            accepted = any(compiled.fullmatch(text) for text in serializations(test["data"]))
            tally.count(case, test, accepted)
    return tally


def llmchat_run(cases: list[Any], vocab: Any) -> Tally:
    from tests.schema_suite import measure

    tally = Tally()
    for case in cases:
        outcome = measure(case, vocab)
        if outcome.status == "refused":
            tally.refused += 1
            continue
        tally.taken += 1
        for test in case.tests:
            label = f"{test['description']}: {json.dumps(test['data'])[:80]}"
            accepted = (label not in outcome.walls) if test["valid"] else (label in outcome.holes)
            tally.count(case, test, accepted)
    return tally


def speed(vocab: Any, tokenizer: Any, reps: int) -> dict[str, Any]:
    """Milliseconds per token to compute the allowed set over the whole vocabulary, median of reps."""
    from llguidance import LLMatcher
    from outlines_core import Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    from llmchat.engine.bindings import llama_cpp
    from llmchat.engine.grammar import schema_to_gbnf

    tokens = tokenizer.tokenize_str(FILM_TEXT)
    n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
    out: dict[str, Any] = {"tokens": len(tokens), "vocabulary": n_vocab}

    gbnf = schema_to_gbnf(FILM).encode()
    template = (llama_cpp.llama_token_data * n_vocab)()
    for i in range(n_vocab):
        template[i].id = i
    data = (llama_cpp.llama_token_data * n_vocab)()
    runs = []
    for _ in range(reps):
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf, b"root")
        spent = 0.0
        for token in tokens:
            ctypes.memmove(data, template, ctypes.sizeof(template))  # fresh candidates, not timed
            array = llama_cpp.llama_token_data_array(data, n_vocab, -1, False)
            started = time.perf_counter()
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
            spent += time.perf_counter() - started
            llama_cpp.llama_sampler_accept(sampler, token)
        runs.append(spent * 1000 / len(tokens))
        llama_cpp.llama_sampler_free(sampler)
    out["llama.cpp grammar over the whole vocabulary, ms/token"] = round(statistics.median(runs), 2)

    grammar = LLMatcher.grammar_from_json_schema(FILM)
    runs, builds = [], []
    for _ in range(reps):
        started = time.perf_counter()
        matcher = LLMatcher(tokenizer, grammar, log_level=0)
        builds.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        for token in tokens:
            matcher.compute_bitmask()
            matcher.consume_token(token)
        runs.append((time.perf_counter() - started) * 1000 / len(tokens))
    out["llguidance, ms/token"] = round(statistics.median(runs), 3)
    out["llguidance, ms to build the matcher"] = round(statistics.median(builds), 2)

    pieces: dict[str, list[int]] = {}
    buffer = ctypes.create_string_buffer(256)
    eos = int(llama_cpp.llama_vocab_eos(vocab))
    for token in range(n_vocab):
        if token == eos:
            continue
        n = llama_cpp.llama_token_to_piece(vocab, token, buffer, 256, 0, False)
        piece = buffer.raw[: max(n, 0)].decode("utf-8", errors="ignore")
        if piece:
            pieces.setdefault(piece, []).append(token)
    vocabulary = Vocabulary(eos, pieces)
    regex = build_regex_from_schema(json.dumps(FILM))
    started = time.perf_counter()
    index = Index(regex, vocabulary)
    out["outlines-core, ms to build the index (once per schema)"] = round((time.perf_counter() - started) * 1000, 1)
    runs = []
    for _ in range(reps):
        state = index.get_initial_state()
        started = time.perf_counter()
        for token in tokens:
            index.get_allowed_tokens(state)
            state = index.get_next_state(state, token)
            if state is None:
                break
        runs.append((time.perf_counter() - started) * 1000 / len(tokens))
    out["outlines-core, ms/token"] = round(statistics.median(runs), 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "schema_engines.json")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    import llguidance
    import outlines_core  # noqa: F401
    from llguidance.llamacpp import lltokenizer_from_vocab

    from llmchat.models.resolve import bundled_default_model
    from llmchat.tools.token_cost import VocabTokenizer
    from tests.schema_suite import suite_cache_root, suite_cases, suite_folder

    vocab = VocabTokenizer(bundled_default_model()).model.vocab
    tokenizer = lltokenizer_from_vocab(vocab)
    cases = suite_cases(suite_folder(suite_cache_root(Path.home())))
    results: dict[str, Any] = {"machine": platform.platform(), "date": time.strftime("%Y-%m-%d"), "groups": len(cases)}
    for name, run in (
        ("llmchat", lambda: llmchat_run(cases, vocab)),
        (
            f"llguidance {llguidance.__version__ if hasattr(llguidance, '__version__') else '1.9.1'}",
            lambda: llguidance_run(cases, tokenizer),
        ),
        ("outlines-core 0.2.14", lambda: outlines_run(cases)),
    ):
        started = time.perf_counter()
        figures = run().figures()
        figures["seconds"] = round(time.perf_counter() - started, 1)
        results[name] = figures
        shown = {k: v for k, v in figures.items() if k != "hole_cases"}
        print(f"{name}: {shown}")
    results["speed"] = speed(vocab, tokenizer, args.reps)
    print("speed:", results["speed"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"raw: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
