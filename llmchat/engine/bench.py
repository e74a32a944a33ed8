"""Throughput measurement in the style of llama.cpp's `llama-bench`, on a loaded `Engine`.

- pp (prompt processing): the KV cache is cleared, then a prompt of `n_prompt` tokens (BOS, then
  random token ids, as llama-bench does) is evaluated through the same `LoadedModel.eval` path that chat
  uses; pp t/s = n_prompt / evaluation time. TTFT = evaluation + the first (greedy) sample.
- tg (text generation): the KV cache is cleared, then `n_gen` single-token decodes, each followed
  by a greedy sample whose result is the next input. EOS is ignored, so exactly `n_gen` tokens are
  decoded; tg t/s = n_gen / time.

Like llama-bench, a warm-up run of each kind precedes its timed repetitions. The cache is
cleared before every repetition, so nothing is ever reused from a previous one.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from llmchat.engine.bindings import llama_cpp
from llmchat.engine.core import Engine

RANDOM_SEED = 1234  # fixed: every run evaluates the same "random" prompt
WARMUP_DECODE = 16  # tokens decoded before the tg repetitions (llama-bench decodes 1)


@dataclass(frozen=True)
class BenchModel:
    """What llama-bench prints about the model and how it runs."""

    desc: str  # llama.cpp's description, e.g. "llama ?B Q4_1"
    size_bytes: int
    n_params: int
    backend: str  # CPU | GPU
    threads: int
    n_vocab: int


@dataclass
class Series:
    samples: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples) if self.samples else 0.0

    @property
    def sd(self) -> float:
        return statistics.stdev(self.samples) if len(self.samples) > 1 else 0.0

    def to_dict(self, digits: int = 2) -> dict:
        return {
            "mean": round(self.mean, digits),
            "sd": round(self.sd, digits),
            "samples": [round(s, digits) for s in self.samples],
        }


@dataclass
class BenchResult:
    model: BenchModel
    n_prompt: int
    n_gen: int
    reps: int
    pp: Series  # tokens/s per repetition
    tg: Series  # tokens/s per repetition
    ttft: Series  # seconds per repetition


def describe(engine: Engine) -> BenchModel:
    model = engine.model
    offloading = bool(llama_cpp.llama_supports_gpu_offload()) and model.gpu_layers != 0
    desc, size_bytes, n_params = model.describe()
    return BenchModel(
        desc=desc,
        size_bytes=size_bytes,
        n_params=n_params,
        backend="GPU" if offloading else "CPU",
        threads=model.n_threads,
        n_vocab=model.n_vocab,
    )


class _Runner:
    def __init__(self, engine: Engine):
        self.model = engine.model
        self.engine = engine
        self.ctx = self.model.ctx
        self.n_vocab = self.model.n_vocab
        self.rng = np.random.default_rng(RANDOM_SEED)

    def clear(self) -> None:
        self.model.clear()

    def greedy(self) -> int:
        """Argmax of the last evaluated position's logits (read in place, not copied)."""
        pointer = llama_cpp.llama_get_logits_ith(self.ctx, -1)
        logits = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))
        return int(logits.argmax())

    def first_token(self) -> int:
        bos = self.engine.bos_id
        return bos if self.engine.add_bos and bos >= 0 else int(self.rng.integers(0, self.n_vocab))

    def prompt(self, n_prompt: int) -> list[int]:
        tokens = self.rng.integers(0, self.n_vocab, size=n_prompt).tolist()
        tokens[0] = self.first_token()
        return tokens

    def prefill(self, n_prompt: int) -> tuple[float, float]:
        """(prefill seconds, seconds to the first sampled token)."""
        tokens = self.prompt(n_prompt)
        self.clear()
        start = time.perf_counter()
        self.model.eval(tokens)
        llama_cpp.llama_synchronize(self.ctx)
        evaluated = time.perf_counter()
        self.greedy()
        sampled = time.perf_counter()
        return evaluated - start, sampled - start

    def decode(self, n_gen: int) -> float:
        """Seconds for n_gen single-token decodes, each input the greedy pick of the previous one."""
        self.clear()
        token = self.first_token()
        start = time.perf_counter()
        for _ in range(n_gen):
            self.model.eval([token])
            llama_cpp.llama_synchronize(self.ctx)
            token = self.greedy()
        return time.perf_counter() - start


def run(
    engine: Engine,
    *,
    n_prompt: int,
    n_gen: int,
    reps: int,
    warmup: bool = True,
    progress: Optional[Callable[[str], None]] = None,
) -> BenchResult:
    """pp and tg, `reps` times each after one warm-up, the cache cleared before every run."""
    if n_prompt < 1 or n_gen < 1 or reps < 1:
        raise ValueError("n_prompt, n_gen and reps must be at least 1")
    if max(n_prompt, n_gen) > engine.n_ctx:
        raise ValueError(f"the context ({engine.n_ctx}) is smaller than the test ({max(n_prompt, n_gen)} tokens)")
    runner = _Runner(engine)
    result = BenchResult(describe(engine), n_prompt, n_gen, reps, Series(), Series(), Series())
    try:
        # As llama-bench does, each test is warmed up right before its own repetitions.
        if warmup:
            if progress:
                progress(f"pp{n_prompt} warm-up")
            runner.prefill(n_prompt)
        for rep in range(reps):
            if progress:
                progress(f"pp{n_prompt} {rep + 1}/{reps}")
            seconds, ttft = runner.prefill(n_prompt)
            result.pp.samples.append(n_prompt / seconds)
            result.ttft.samples.append(ttft)
        if warmup:
            if progress:
                progress(f"tg{n_gen} warm-up")
            runner.decode(min(n_gen, WARMUP_DECODE))
        for rep in range(reps):
            if progress:
                progress(f"tg{n_gen} {rep + 1}/{reps}")
            result.tg.samples.append(n_gen / runner.decode(n_gen))
    finally:
        runner.clear()  # leave no half-used cache behind for a later generate()
    return result
