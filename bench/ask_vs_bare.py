"""Decode tok/s of `llmchat ask` against a bare llama-cpp-python loop, side by side in one run.

Both generate the same 128-token greedy reply from the same prompt tokens on the same threads;
the runs alternate so that machine noise hits both alike. Decode tok/s is (generated - 1) / (time
from the first to the last token) for both.

    python bench/ask_vs_bare.py [--reps 5] [--tokens 128] [-m MODEL]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date

PROMPT = "Write a detailed essay about the history of the bicycle, from its invention to today."


def ask_once(model: str | None, tokens: int, threads: int) -> float:
    args = [
        sys.executable,
        "-m",
        "llmchat",
        "ask",
        "--json",
        "--no-history",
        "--temperature",
        "0",
        "--seed",
        "1",
        "--max-tokens",
        str(tokens),
        "--no-loop-stop",  # the bare loop has no loop detector: both decode the same tokens
        "--threads",
        str(threads),
        "--ctx",
        "2048",
        PROMPT,
    ]
    if model:
        args[4:4] = ["-m", model]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    stats = json.loads(out)["stats"]
    return stats["decode_tok_s"], stats["generated_tokens"]


def bare_loop(llm, prompt_tokens: list[int], tokens: int) -> tuple[float, int]:
    """The minimal loop: llama-cpp-python's own generate(), greedy, timed first to last token."""
    llm.reset()
    first = last = None
    count = 0
    for _token in llm.generate(prompt_tokens, temp=0.0, top_k=1, repeat_penalty=1.0):
        now = time.perf_counter()
        first = first or now
        last = now
        count += 1
        if count >= tokens:
            break
    return (count - 1) / (last - first), count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("-m", "--model")
    args = parser.parse_args()

    import llama_cpp

    from llmchat.engine import physical_cores
    from llmchat.engine.core import _model_params, cpu_has_amx
    from llmchat.models.resolve import bundled_default_model

    model_path = args.model or str(bundled_default_model())
    threads = physical_cores()
    # The engine settings llmchat uses by default (flash attention on), so only the layers above differ.
    # Loaded as the engine loads it: without ggml's AMX buffers where the CPU advertises AMX (they
    # die with SIGILL on this project's VMs; see llmchat/engine/core.py).
    with _model_params(use_extra_bufts=not cpu_has_amx()):
        llm = llama_cpp.Llama(
            model_path=model_path,
            n_ctx=2048,
            n_threads=threads,
            n_threads_batch=threads,
            flash_attn=True,
            verbose=False,
        )
    # The same rendered prompt llmchat sends (ChatML, as in SmolLM2's own template).
    text = f"<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    prompt_tokens = llm.tokenize(text.encode(), add_bos=False, special=True)

    ask_rates, bare_rates = [], []
    for rep in range(args.reps):
        rate, n = ask_once(args.model, args.tokens, threads)
        ask_rates.append(rate)
        rate_bare, n_bare = bare_loop(llm, prompt_tokens, args.tokens)
        bare_rates.append(rate_bare)
        print(
            f"rep {rep + 1}: ask {ask_rates[-1]:.1f} tok/s ({n} tokens)  bare {rate_bare:.1f} tok/s ({n_bare} tokens)",
            file=sys.stderr,
        )
    llm.close()

    ask_median, bare_median = statistics.median(ask_rates), statistics.median(bare_rates)
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, {threads} threads; date {date.today()}")
    print(f"llmchat ask: median {ask_median:.1f} tok/s  {[round(r, 1) for r in ask_rates]}")
    print(f"bare loop:   median {bare_median:.1f} tok/s  {[round(r, 1) for r in bare_rates]}")
    print(f"ratio ask/bare: {ask_median / bare_median:.3f} (target >= 0.95)")


if __name__ == "__main__":
    main()
