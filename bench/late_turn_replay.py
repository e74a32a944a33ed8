"""Late turns of a chat, replayed: the engine's prefill of each late turn's shape, repeated, against
llama-bench's at the same depth.

`late_turn_prefill.py` compares one prefill per turn (a single 0.2 s sample, as the chat ran it)
with llama-bench's mean of 5 repetitions; on a noisy VM that ratio swings from 0.6 to 1.2. Here
both sides repeat the same work the same number of times. The scripted 30-turn chat (fresh
LLMCHAT_HOME, `--ctx 1024`, flash attention `auto` as a newcomer gets it) runs once to give the
late turns' shapes: NEW tokens over CACHED ones. Then, per round, for each shape:
- llmchat: the engine loaded as the chat loads it (its flash attention choice, threads, batch)
  holds CACHED tokens in its KV cache (one `generate` of one token), and a second `generate` of
  CACHED + NEW tokens prefills the NEW ones and samples the first token, through the same code
  the chat's turns use; its tok/s is NEW / (first token - start), the mean of `--reps` runs;
- llama-bench: `-p NEW -n 0 -d CACHED -r REPS`, flash attention off and on; the better is taken.
Rounds alternate which side goes first; the summary is the median ratio with its min-max spread.

    python bench/late_turn_replay.py LLAMA_BENCH [--rounds 5] [--reps 5]
           [--out bench/results/late_turn_replay.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from late_turn_prefill import BATCH, chat_run, llama_bench
from report import write_report

TEXT = " ".join(f"Turn {i}: three facts about rivers, mountains and deserts, each in one sentence." for i in range(400))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("llama_bench", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--late", type=int, default=5)
    parser.add_argument("--ctx", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "late_turn_replay.md")
    args = parser.parse_args()

    from dataclasses import replace

    from llmchat.engine import Engine, EngineSettings, physical_cores
    from llmchat.engine.interface import GenerateRequest
    from llmchat.engine.sampling import SamplingParams
    from llmchat.models.resolve import bundled_default_model

    model = str(bundled_default_model())
    threads = physical_cores()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    turns = chat_run(model, args.turns, args.ctx, threads)
    late = [t["stats"] for t in turns[-args.late :] if not t["stats"]["messages_dropped"]]
    shapes = sorted({(s["prefill_tokens"], s["cached_tokens"]) for s in late})
    flash_attn = bool(late[0]["flash_attn"])
    engine = Engine.load(
        Path(model), EngineSettings(n_ctx=args.ctx, threads=threads, batch_size=BATCH, flash_attn=flash_attn)
    )
    ids = engine.tokenize(TEXT, special=False)
    sampling = replace(SamplingParams(), temperature=0.0)

    def first_token(prompt: list[int]):
        generation = engine.generate(GenerateRequest(prompt=prompt, sampling=sampling, max_tokens=1))
        for _ in generation:
            pass
        return generation.outcome

    def ours(new: int, cached: int) -> float:
        rates = []
        for _ in range(args.reps):
            first_token(ids[:cached])
            outcome = first_token(ids[: cached + new])
            evaluated = cached + new - outcome.cached_tokens
            assert evaluated == new, f"{evaluated} tokens prefilled, {new} expected"
            rates.append(new / (outcome.t_first_token - outcome.t_start))
        return statistics.mean(rates)

    raw: list[str] = []
    ratios: list[float] = []
    try:
        for number in range(1, args.rounds + 1):
            order = ("llmchat", "llama-bench") if number % 2 else ("llama-bench", "llmchat")
            for new, cached in shapes:
                measured: dict[str, float] = {}
                theirs: dict[str, float] = {}
                for side in order:
                    if side == "llmchat":
                        measured["llmchat"] = ours(new, cached)
                    else:
                        theirs = llama_bench(args.llama_bench, model, new, cached, threads)
                best = max(theirs.values())
                ratio = measured["llmchat"] / best
                ratios.append(ratio)
                line = (
                    f"round {number} ({order[0]} first): {new} new tokens over {cached} cached: llmchat "
                    f"{measured['llmchat']:.1f} tok/s (flash attention {'on' if flash_attn else 'off'}, mean of "
                    f"{args.reps}), llama-bench off {theirs['off']:.1f} / on {theirs['on']:.1f} tok/s (mean of 5), "
                    f"ratio to the better {ratio:.3f}"
                )
                raw.append(line)
                print(line, file=sys.stderr, flush=True)
    finally:
        engine.close()

    summary = [
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {threads} threads, batch {BATCH}, --ctx {args.ctx}; "
        f"shapes from a fresh 30-turn chat, flash attention auto picked {'on' if flash_attn else 'off'}",
        f"late-turn prefill replayed, llmchat's engine / llama-bench's better setting at the same depth: median "
        f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) over {len(ratios)} shape-rounds in "
        f"{args.rounds} alternating rounds (target >= 0.95)",
    ]
    print("\n".join(summary))
    write_report(
        args.out,
        "Late-turn prefill replayed vs llama-bench at the same depth (bench/late_turn_replay.py)",
        started,
        load_before,
        f"Model: {model}. llama-bench: {args.llama_bench}.",
        summary,
        raw,
    )


if __name__ == "__main__":
    main()
