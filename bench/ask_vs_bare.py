"""Decode tok/s of `llmchat ask` against a bare loop on llama.cpp's C API, side by side in one run.

Both sides sample the same way: temperature 0 with the same repeat penalty (1.1 by default,
llmchat's own default) over the same 64-token window, from the same prompt tokens, with the same
threads and the same flash-attention setting (the one `ask`'s `--flash-attn auto` picked, read
from its --json stats). The replies are compared: the script stops with an error if they differ,
since then the two sides did not do the same work. Rounds alternate which side runs first, so
that machine noise hits both alike. Decode tok/s is (generated - 1) / (time from the first to the
last token) for both. The ratio of a round is ask / bare; the summary is the median over rounds
with the min-max spread, and every round is in the results file.

    python bench/ask_vs_bare.py [--reps 5] [--tokens 128] [--repeat-penalty 1.1] [-m MODEL]
                                [--out bench/results/ask_vs_bare_raw.md]
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
from pathlib import Path

PROMPT = "Write a detailed essay about the history of the bicycle, from its invention to today."
MIN_REPS = 5


def ask_once(model: str | None, tokens: int, threads: int, repeat_penalty: float) -> dict:
    args = [
        sys.executable,
        "-m",
        "llmchat",
        "ask",
        "--json",
        "--no-history",
        "--temperature",
        "0",
        "--repeat-penalty",
        str(repeat_penalty),
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
    return json.loads(out)


class BareModel:
    """A model and a context through llama.cpp's C API (llama-cpp-python's ctypes bindings), loaded as
    the engine loads it and nothing more: no llmchat code runs in the bare loop."""

    def __init__(self, path: str, threads: int, flash_attn: bool):
        from llmchat.engine import logs
        from llmchat.engine.bindings import llama_cpp
        from llmchat.engine.devices import cpu_has_amx

        logs.install(False)
        self.c = llama_cpp
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 0
        # Without ggml's AMX buffers where the CPU advertises AMX, as the engine loads (they die
        # with SIGILL on this project's VMs; see llmchat/engine/model_load.py).
        params.use_extra_bufts = not cpu_has_amx()
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        context = llama_cpp.llama_context_default_params()
        context.n_ctx = context.n_batch = context.n_ubatch = 2048
        context.n_threads = context.n_threads_batch = threads
        context.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        self.ctx = llama_cpp.llama_init_from_model(self.model, context)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: bytes) -> list[int]:
        ids = (self.c.llama_token * (len(text) + 2))()
        n = self.c.llama_tokenize(self.vocab, text, len(text), ids, len(text) + 2, False, True)
        return ids[:n]

    def detokenize(self, ids: list[int]) -> str:
        buffer = self.c.ctypes.create_string_buffer(256)
        pieces = []
        for token in ids:
            n = self.c.llama_token_to_piece(self.vocab, token, buffer, 256, 0, False)
            pieces.append(buffer.raw[:n])
        return b"".join(pieces).decode("utf-8", errors="replace")

    def eval(self, ids: list[int]) -> None:
        array = (self.c.llama_token * len(ids))(*ids)
        if self.c.llama_decode(self.ctx, self.c.llama_batch_get_one(array, len(ids))) != 0:
            sys.exit("llama_decode failed in the bare loop")

    def clear(self) -> None:
        self.c.llama_memory_clear(self.c.llama_get_memory(self.ctx), False)

    def close(self) -> None:
        self.c.llama_free(self.ctx)
        self.c.llama_model_free(self.model)


def bare_loop(bare: BareModel, prompt_tokens: list[int], tokens: int, repeat_penalty: float) -> tuple[float, list[int]]:
    """The minimal loop, on llama.cpp's own API: evaluate the prompt, then sample greedily through
    a sampler chain of the repeat penalty and greedy, evaluate the token, repeat. The penalty's
    window is primed with the prompt's last 64 tokens, as llama-server does and llmchat does.
    Timed first to last token, ending at an end-of-generation token or `tokens`."""
    llama_cpp = bare.c
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(
        chain, llama_cpp.llama_sampler_init_penalties(bare.n_vocab, 64, repeat_penalty, 0.0, 0.0)
    )
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    for token in prompt_tokens[-64:]:
        llama_cpp.llama_sampler_accept(chain, token)
    bare.clear()
    bare.eval(prompt_tokens)
    first = last = 0.0
    ids: list[int] = []
    try:
        while len(ids) < tokens:
            token = llama_cpp.llama_sampler_sample(chain, bare.ctx, -1)  # also accepts it
            if llama_cpp.llama_vocab_is_eog(bare.vocab, token):
                break
            now = time.perf_counter()
            first = first or now
            last = now
            ids.append(token)
            bare.eval([token])
    finally:
        llama_cpp.llama_sampler_free(chain)
    return ((len(ids) - 1) / (last - first) if len(ids) > 1 and last > first else 0.0), ids


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=MIN_REPS)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeat-penalty", type=float, default=1.1)
    parser.add_argument("-m", "--model")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "ask_vs_bare_raw.md")
    args = parser.parse_args()
    if args.reps < MIN_REPS:
        parser.error(f"--reps must be at least {MIN_REPS}: a ratio is a median of at least {MIN_REPS} rounds")

    from llmchat.engine import physical_cores
    from llmchat.models.resolve import bundled_default_model

    model_path = args.model or str(bundled_default_model())
    threads = physical_cores()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    # A first ask: warms the page cache and says which flash-attention setting `auto` picks here.
    probe = ask_once(args.model, 8, threads, args.repeat_penalty)
    flash_attn = bool(probe["stats"]["flash_attn"])
    llm = BareModel(model_path, threads, flash_attn)
    # The same rendered prompt llmchat sends (ChatML with SmolLM2's default system prompt); the
    # prompt token counts are compared below, and the replies, so another model's template shows.
    text = f"<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    prompt_tokens = llm.tokenize(text.encode())

    rounds: list[tuple[float, float, int]] = []
    raw = []
    for rep in range(args.reps):
        sides = ("ask", "bare") if rep % 2 == 0 else ("bare", "ask")
        for side in sides:
            if side == "ask":
                record = ask_once(args.model, args.tokens, threads, args.repeat_penalty)
                ask_rate, ask_n = record["stats"]["decode_tok_s"], record["stats"]["generated_tokens"]
                if record["stats"]["prompt_tokens"] != len(prompt_tokens):
                    sys.exit(
                        f"ask's prompt has {record['stats']['prompt_tokens']} tokens, the bare loop's "
                        f"{len(prompt_tokens)}: not the same prompt"
                    )
                ask_reply = record["reply"]
            else:
                bare_rate, ids = bare_loop(llm, prompt_tokens, args.tokens, args.repeat_penalty)
                bare_reply = llm.detokenize(ids)
        if ask_reply.strip() != bare_reply.strip() or ask_n != len(ids):
            sys.exit(
                f"round {rep + 1}: the replies differ (ask {ask_n} tokens, bare {len(ids)}): "
                f"{ask_reply[:80]!r} vs {bare_reply[:80]!r}"
            )
        rounds.append((ask_rate, bare_rate, ask_n))
        line = (
            f"round {rep + 1} ({' first, '.join(sides)} second): ask {ask_rate:.1f} tok/s, bare {bare_rate:.1f} tok/s, "
            f"ratio {ask_rate / bare_rate:.3f}, {ask_n} tokens, replies equal"
        )
        raw.append(line)
        print(line, file=sys.stderr, flush=True)
    llm.close()

    ratios = [a / b for a, b, _ in rounds]
    ask_rates, bare_rates = [a for a, _, _ in rounds], [b for _, b, _ in rounds]
    summary = [
        f"machine: {platform.machine()} {os.cpu_count()} CPUs, {threads} threads; flash attention "
        f"{'on' if flash_attn else 'off'} (ask's auto); repeat penalty {args.repeat_penalty} on both sides",
        f"llmchat ask: median {statistics.median(ask_rates):.1f} tok/s ({min(ask_rates):.1f}-{max(ask_rates):.1f})",
        f"bare loop:   median {statistics.median(bare_rates):.1f} tok/s ({min(bare_rates):.1f}-{max(bare_rates):.1f})",
        f"ratio ask/bare: median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) over "
        f"{len(ratios)} alternating rounds (target >= 0.95)",
    ]
    print("\n".join(summary))
    lines = [
        "# ask vs a bare loop on llama.cpp's C API (bench/ask_vs_bare.py)",
        "",
        f"Run {started}, one process; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after. "
        f"Model: {model_path}. {args.tokens} tokens, greedy, the same reply on both sides (checked).",
        "",
        *(f"- {line}" for line in summary),
        "",
        "```",
        *raw,
        "```",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
